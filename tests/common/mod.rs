//! What the end-to-end tests that run the `lora-ft` binary share.

use std::path::{Path, PathBuf};

/// Writes `<root>/train.toml`: SmolLM2-135M (dense f32) on the CPU over the shipped dialogues at
/// 96 tokens, with `lora`, `train` and `checkpoint` as the lines of those sections (the device,
/// dtype and lengths are fixed here), its run in `<root>/run` and its adapter in
/// `<root>/adapters/a`.
pub fn smollm2_cpu_config(root: &Path, lora: &str, train: &str, checkpoint: &str) -> PathBuf {
    let toml = format!(
        r#"
[model]
source = "{model}"
quantization = "none"
[lora]
{lora}
[data]
train = "datasets/customer-service/train.jsonl"
max_seq_len = 96
[train]
compute_dtype = "f32"
device = "cpu"
{train}
[checkpoint]
{checkpoint}
[output]
dir = "{root}/run"
adapter_name = "a"
adapters_dir = "{root}/adapters"
"#,
        model = lora_ft::fixtures::smollm2_dir().display(),
        root = root.display()
    );
    std::fs::create_dir_all(root).unwrap();
    let file = root.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    file
}
