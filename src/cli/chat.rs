//! `lora-ft chat`'s arguments: a model (and adapter) to talk to, one prompt or stdin.

use std::path::PathBuf;

use clap::Args;

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
    /// The Hub revision (branch, tag or commit) of a repo id.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Storage of the base's projection weights; use what the adapter was trained with.
    #[arg(long, default_value = "nf4", value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    pub quantization: String,
    /// A Jinja file in place of the model's chat template (e.g. configs/templates/chatml-tools.jinja).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// A JSON file holding a list of tool schemas (`{"type": "function", "function": {...}}`)
    /// handed to the template; tool calls in a reply are printed parsed after it.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
}
