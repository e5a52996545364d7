//! `lora-ft generate`'s arguments: a prompts file in, a completions file out.

use std::path::PathBuf;

use clap::Args;

use super::LoadingArgs;

use super::SamplingArgs;

#[derive(Args)]
pub struct GenerateArgs {
    /// Hub repo id, local HF folder or .gguf file.
    #[arg(long)]
    pub model: String,
    /// A PEFT adapter folder (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// The prompts: JSON Lines of `{"messages": [...], "tools"?: [...]}`, each ending in the turn
    /// the model answers (the format of `data.eval_prompts`).
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// Where the completions go, one JSON line per reply: line, sample, text, tool_calls,
    /// finish_reason, prompt_tokens, completion_tokens.
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Replies per prompt (each drawn with its own seed; with --temperature 0 they are the same).
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Replies generated together.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// The longest reply, in tokens.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub loading: LoadingArgs,
    /// A JSON file holding a list of tool schemas, for the prompts whose rows carry no `tools`.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
}
