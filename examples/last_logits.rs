//! lora-ft's own last-position logits for given token ids, the reference side of
//! scripts/gguf_llamacpp_check.py's `--logits` comparison (llama.cpp on an exported GGUF against
//! lora-ft on the HF folder it came from): the model loaded as `lora-ft chat --quantization none`
//! loads it on the CPU (f32, the adapter applied as LoRA, not merged), one forward pass per line.
//!
//!     cargo run --release --example last_logits -- MODEL_DIR [ADAPTER_DIR|-] IDS_FILE OUT_F32
//!
//! IDS_FILE: one prompt per line, its token ids separated by commas. OUT_F32: the logits of each
//! line's last position, f32 little-endian, one row of vocab-size values per line.

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use lora_ft::model::CausalLm;
use lora_ft::quant::Quantization;
use std::io::Write;
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, adapter, ids_file, out] = args.as_slice() else {
        anyhow::bail!("usage: last_logits MODEL_DIR ADAPTER_DIR|- IDS_FILE OUT_F32");
    };
    let files = lora_ft::hub::resolve(model, "main")?;
    let device = Device::Cpu;
    let mut lm = CausalLm::load(&files.config, &files.weights, DType::F32, Quantization::None, &device)?;
    if adapter != "-" {
        lora_ft::peft_adapter::load_adapter(&mut lm, Path::new(adapter))
            .with_context(|| format!("loading adapter {adapter}"))?;
    }
    let text = std::fs::read_to_string(ids_file).with_context(|| format!("reading {ids_file}"))?;
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(out).with_context(|| format!("creating {out}"))?);
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let ids = line
            .split(',')
            .map(|t| t.trim().parse::<u32>())
            .collect::<Result<Vec<u32>, _>>()
            .with_context(|| format!("{ids_file} line {}: not comma-separated token ids", n + 1))?;
        anyhow::ensure!(!ids.is_empty(), "{ids_file} line {}: no ids", n + 1);
        let input = Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
        let logits = lm.forward(&input, None)?.squeeze(0)?.get(ids.len() - 1)?;
        for v in logits.to_dtype(DType::F32)?.to_vec1::<f32>()? {
            file.write_all(&v.to_le_bytes())?;
        }
    }
    file.flush()?;
    Ok(())
}
