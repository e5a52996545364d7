//! `lora-ft serve`'s arguments: the model and its adapters, where to listen, and the limits
//! that keep one client from taking the server (docs/src/guides/serving.md).

use std::path::PathBuf;

use clap::Args;

use super::LoadingArgs;

#[derive(Args)]
pub struct ServeArgs {
    /// Hub repo id, local HF folder or .gguf file of the base model.
    pub model: String,
    /// The base model's name in requests' `model` and in /v1/models [default: MODEL].
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// An adapter served as model NAME: a PEFT adapter folder of the base (repeatable).
    #[arg(long, value_name = "NAME=DIR")]
    pub adapter: Vec<String>,
    /// Let clients load and unload adapters while serving (POST /v1/load_lora_adapter,
    /// /v1/unload_lora_adapter), from folders inside DIR only.
    #[arg(long, value_name = "DIR")]
    pub adapter_dir: Option<PathBuf>,
    /// The address to listen on; 0.0.0.0 opens the server to the network (set --api-key).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The TCP port (0: any free one; the line "listening on http://HOST:PORT" says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* requests.
    #[arg(long, env = "LORA_FT_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The largest request body, in bytes (larger: 413).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// The most new tokens a request may ask for (`max_tokens`), and a request's default; never
    /// past the model's context.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// A request still generating after this many seconds is ended (504, or an error event in a
    /// stream).
    #[arg(long, default_value_t = 600)]
    pub request_timeout_s: u64,
    /// Sequences decoded together (each holds a KV cache of --max-model-len positions) [default:
    /// on a GPU the most the planner fits in its memory, 256 at most; on the CPU 16].
    #[arg(long, value_name = "N")]
    pub max_batch: Option<usize>,
    /// Positions a prompt and its reply may reach together: the KV cache's length per sequence,
    /// allocated up front for --max-batch sequences [default: on a GPU the longest of the model's
    /// context, 32768, 16384, 8192 and 4096 at which the planner fits 16 sequences; on the CPU the
    /// model's context, at most 4096].
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<usize>,
    /// Launches every decode step kernel by kernel instead of replaying it from a recorded CUDA
    /// graph (vLLM's flag): slower at small batches; for checking the graphs.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Prompt tokens one prefill forward takes at most (SGLang's flag): prompts of one length are
    /// prefilled together up to it, a longer prompt alone. Lower it to lower the peak memory of
    /// the prefill's activations, which the planner then sizes by it [default: 16384].
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_prefill_tokens: Option<usize>,
    #[command(flatten)]
    pub loading: LoadingArgs,
}
