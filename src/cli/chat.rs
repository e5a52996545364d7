//! `lora-ft chat`'s arguments: a model (and adapter) to talk to, one prompt or stdin.

use std::path::PathBuf;

use clap::Args;

use super::LoadingArgs;

use super::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    /// Hub repo id, local HF folder or .gguf file.
    #[arg(long)]
    pub model: String,
    /// A PEFT adapter folder (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// One user message; without it, chat interactively on stdin.
    #[arg(long)]
    pub prompt: Option<String>,
    /// A system message before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// The longest reply, in tokens.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub loading: LoadingArgs,
    /// A JSON file holding a list of tool schemas (`{"type": "function", "function": {...}}`)
    /// handed to the template; tool calls in a reply are printed parsed after it.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
}
