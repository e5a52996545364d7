//! `lora-ft serve`: an OpenAI-compatible HTTP server over the engine (`crate::generate::engine`), as vLLM,
//! llama.cpp's llama-server and Ollama serve one, for apps written against OpenAI's API:
//! `GET /v1/models`, `POST /v1/chat/completions` (tools and tool calls, streaming),
//! `POST /v1/completions`, vLLM's `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`,
//! and `GET /health`. docs/src/guides/serving.md describes it.

mod auth;
mod body;
mod chat;
mod completions;
mod errors;
mod events;
mod limits;
mod logprobs;
mod models;
mod params;
mod routes;
mod sse;
mod state;
mod tool_calls;

use anyhow::Context;

pub use errors::ApiError;
pub use routes::router;
pub use state::{AppState, ServeOptions};

/// Serves `state` on `listener` until `shutdown` resolves; in-flight requests are finished first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await.context("serving HTTP")
}
