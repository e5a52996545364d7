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
    /// The prompts: JSON Lines, each a chat prompt `{"messages": [...], "tools"?: [...]}` ending
    /// in the turn the model answers (the format of `data.eval_prompts`), or a text prompt
    /// `{"prompt": "..."}` continued as it is, without the chat template.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// Where the completions go, one JSON line per reply: line, sample, text, tool_calls (chat
    /// prompts only), finish_reason, prompt_tokens, completion_tokens.
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Replies per prompt (each drawn with its own seed; with --temperature 0 they are the same).
    #[arg(long, default_value_t = 1)]
    pub n: usize,
    /// Replies generated together [default: on a GPU the most the planner fits in its memory at
    /// the longest prompt plus --max-new-tokens, 256 at most; on the CPU 16].
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
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
