//! How the generation commands (`chat`, `generate`, `serve`) load their base model: the Hub
//! revision, the storage of its projection weights and the chat template, one set of flags.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct LoadingArgs {
    /// The Hub revision (branch, tag or commit) of a repo id.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Storage of the base's projection weights; use what the adapters were trained with.
    #[arg(long, default_value = "nf4", value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    pub quantization: String,
    /// A Jinja file in place of the model's chat template (e.g. configs/templates/chatml-tools.jinja).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}
