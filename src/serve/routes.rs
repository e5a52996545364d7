//! The server's routes: each handler reads its body (`body`), checks it into engine requests
//! (`chat`, `completions`, `models`) and answers whole or streamed (`sse`), under the key check
//! (`auth`) and the body limit (`limits`).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::time::Instant;

use super::body::json_object;
use super::errors::ApiError;
use super::params::Generation;
use super::sse::{Api, StreamJob};
use super::state::{now, response_id, AppState};
use super::{auth, chat, completions, events, limits, models, sse};

/// Every route, with the state, the key check on /v1/* and the body limit.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(text_completions))
        .route("/v1/load_lora_adapter", post(load_adapter))
        .route("/v1/unload_lora_adapter", post(unload_adapter))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::require_key));
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .merge(v1)
        .fallback(|| async {
            ApiError::status(StatusCode::NOT_FOUND, "invalid_request_error", "No such route.")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::status(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "This route takes another method (GET /v1/models, POST /v1/chat/completions, ...).",
            )
        })
        .layer(DefaultBodyLimit::max(state.options.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(state.clone(), limits::refuse_large_bodies))
        .with_state(state)
}

async fn list_models(State(state): State<AppState>) -> Response {
    Json(models::list(&state)).into_response()
}

/// When a request must be done by, and its limit in seconds.
fn deadline(state: &AppState) -> (Instant, u64) {
    let limit: Duration = state.options.request_timeout;
    (Instant::now() + limit, limit.as_secs())
}

/// What a streamed answer of `choices` replies needs: the endpoint's shape, the response's id,
/// the model and prompt length, what the request asked (usage, log-probs), and its deadline.
fn stream_job(
    api: Api,
    id: String,
    (model, prompt_tokens): (&str, usize),
    generation: &Generation,
    choices: usize,
    (deadline, timeout_s): (Instant, u64),
) -> StreamJob {
    StreamJob {
        api,
        id,
        model: model.to_string(),
        created: now(),
        choices,
        prompt_tokens,
        include_usage: generation.include_usage,
        logprobs: generation.params.logprobs.is_some(),
        deadline,
        timeout_s,
    }
}

async fn chat_completions(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer_chat(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn answer_chat(state: AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = json_object(body)?;
    let (request, job) = chat::prepare(&state, &body)?;
    let choices = request.seeds.len();
    let (deadline, timeout_s) = deadline(&state);
    let id = response_id("chatcmpl");
    let rx = events::submit(&state.engine, vec![request], choices, "messages")?;
    if job.generation.stream {
        let stream = stream_job(
            Api::Chat { tools: job.tools },
            id,
            (&job.model, job.prompt_tokens),
            &job.generation,
            choices,
            (deadline, timeout_s),
        );
        return Ok(sse::respond(stream, rx, state.tokenizer.clone()));
    }
    let gathered = events::collect(rx, choices, deadline, timeout_s).await?;
    log_done(&id, &job.model, job.prompt_tokens, &gathered, deadline, timeout_s);
    Ok(Json(chat::response(&state, &job, &id, &gathered)).into_response())
}

async fn text_completions(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    answer_completions(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn answer_completions(
    state: AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = json_object(body)?;
    let mut job = completions::prepare(&state, &body)?;
    let per_prompt = job.generation.seeds.len();
    let choices = per_prompt * job.requests.len();
    let (deadline, timeout_s) = deadline(&state);
    let id = response_id("cmpl");
    let rx = events::submit(&state.engine, std::mem::take(&mut job.requests), per_prompt, "prompt")?;
    if job.generation.stream {
        let stream = stream_job(
            Api::Completion,
            id,
            (&job.model, job.prompt_tokens),
            &job.generation,
            choices,
            (deadline, timeout_s),
        );
        return Ok(sse::respond(stream, rx, state.tokenizer.clone()));
    }
    let gathered = events::collect(rx, choices, deadline, timeout_s).await?;
    log_done(&id, &job.model, job.prompt_tokens, &gathered, deadline, timeout_s);
    Ok(Json(completions::response(&state, &job, &id, &gathered)).into_response())
}

async fn load_adapter(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = async { models::load(&state, &json_object(body)?).await }.await;
    match result {
        Ok(message) => message.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn unload_adapter(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    match json_object(body).and_then(|b| models::unload(&state, &b)) {
        Ok(message) => message.into_response(),
        Err(e) => e.into_response(),
    }
}

/// One line a finished request: its tokens and time.
fn log_done(
    id: &str,
    model: &str,
    prompt: usize,
    choices: &[events::Choice],
    deadline: Instant,
    timeout_s: u64,
) {
    let completion: usize = choices.iter().map(|c| c.completion_tokens).sum();
    let took =
        Duration::from_secs(timeout_s).saturating_sub(deadline.saturating_duration_since(Instant::now()));
    tracing::info!(
        "{id} ({model}): {prompt} prompt + {completion} completion tokens in {:.2} s",
        took.as_secs_f64()
    );
}
