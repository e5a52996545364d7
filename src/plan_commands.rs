//! The planning commands: `lora-ft init` (a config for a model and a card) and `lora-ft estimate`
//! (what a config's steps will take), both from config.json alone.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use lora_ft::config::{BatchSize, Config};
use lora_ft::plan::run::Run;

use crate::cli::{parse_gib, parse_size};

/// `lora-ft estimate`: the planner's parts of the peak at the config's shape (with
/// `train.checkpointing = "auto"`, the layers it keeps), the largest batch per sequence length,
/// the longest row per card, and serving's memory and sequences per context length on the card,
/// from config.json alone. `host_mem`: the training machine's memory,
/// half of which offloaded layers may take (else half of this machine's available memory).
pub fn estimate(config: &Path, gpu_mem: &str, attention: &str, host_mem: Option<&str>) -> anyhow::Result<()> {
    let cfg = Config::from_file(config)?;
    let config_json = lora_ft::hub::config_json(&cfg.model.expanded_source(), &cfg.model.revision)?;
    let model = lora_ft::arch::ModelConfig::from_file(&config_json)?;
    let budget = lora_ft::memory::VramBudget::new(parse_gib(gpu_mem)?, cfg.train.max_vram_fraction);
    let mut run = Run::resolve(&cfg, model, Some(budget));
    run.run_shape.fused_attention &= attention == "fused";
    if let (Some(host_mem), true) = (host_mem, run.run_shape.host_offload) {
        run.run_shape.host_budget = parse_size("--host-mem", host_mem)? / 2;
    }
    let shape = (run.max_seq_len, estimated_batch(&run, budget.bytes()));
    let auto = run.checkpointing == lora_ft::config::Checkpointing::Auto;
    print!("{}", lora_ft::plan::report(&run.model, &run.run_shape, shape, budget.bytes(), auto));
    let cards: Vec<(&str, u64)> = [("24 GB", 24u64), ("48 GB", 48), ("80 GB", 80)]
        .into_iter()
        .map(|(card, gib)| {
            let budget = lora_ft::memory::VramBudget::new(gib << 30, cfg.train.max_vram_fraction);
            (card, budget.bytes())
        })
        .collect();
    print!("\n{}", lora_ft::plan::longest_rows(&run.model, &run.run_shape, &cards));
    // serving the tuned model on the same card: bf16 on a GPU, the config's storage and adapter
    let serving = lora_ft::plan::serving::ServingShape {
        dtype: candle_core::DType::BF16,
        nf4: run.run_shape.nf4,
        adapters: vec![run.lora().clone()],
        gpu: true,
        max_prefill_tokens: lora_ft::plan::serving::PREFILL_TOKENS,
    };
    print!("\n{}", lora_ft::plan::serving::report(&run.model, &serving, budget.bytes()));
    Ok(())
}

/// `lora-ft init`: the model's config.json (a GGUF's metadata), the planner's shape for the card,
/// the commented TOML written to `out` (an existing file only with `force`).
pub fn init(
    model: &str,
    revision: &str,
    gpu_mem: &str,
    data: &Path,
    out: Option<std::path::PathBuf>,
    force: bool,
) -> anyhow::Result<()> {
    use lora_ft::plan::init::{model_name, write_config, DataFiles, InitRequest};
    let out = out.unwrap_or_else(|| format!("{}.toml", model_name(model).to_lowercase()).into());
    if out.exists() && !force {
        anyhow::bail!("{} exists; pass --force to overwrite it", out.display());
    }
    let source = lora_ft::hub::planning_source(model, revision)?;
    let (data_arg, data) = (data, DataFiles::of(data)?);
    let name = out.file_stem().map_or("run".into(), |s| s.to_string_lossy().into_owned());
    let revision_flag = if revision == "main" { String::new() } else { format!(" --revision {revision}") };
    let data_flag = match data.train.parent() {
        Some(dir) if dir == Path::new("datasets/customer-service") => String::new(),
        _ => format!(" --data {}", data_arg.display()),
    };
    let command =
        format!("lora-ft init {model}{revision_flag} --gpu-mem {gpu_mem}{data_flag} --out {}", out.display());
    let written = write_config(&InitRequest {
        source: model,
        revision,
        model: &source.config,
        chat_template: source.chat_template.as_deref(),
        gpu_mem: parse_gib(gpu_mem)?,
        data: &data,
        name: &name,
        command: &command,
        out: &out,
    })?;
    let file = match force {
        true => std::fs::File::create(&out),
        false => std::fs::OpenOptions::new().write(true).create_new(true).open(&out),
    };
    file.and_then(|mut f| f.write_all(written.toml.as_bytes()))
        .with_context(|| format!("writing {}", out.display()))?;
    let gib = |b: u64| b as f64 / lora_ft::memory::GIB;
    println!(
        "wrote {}: batch {} x {} tokens, grad_accum {}, predicted peak {:.2} GiB of a {:.2} GiB budget",
        out.display(),
        written.batch,
        written.seq,
        written.grad_accum,
        gib(written.peak),
        gib(written.budget)
    );
    Ok(())
}

/// The run's batch size; for "auto", the planner's largest within `budget` bytes, where training
/// starts probing (said on a line of its own).
fn estimated_batch(run: &Run, budget: u64) -> usize {
    match run.batch_size {
        BatchSize::Fixed(batch) => batch,
        BatchSize::Auto => {
            let (batch, seq) = (run.largest_batch(budget), run.max_seq_len);
            println!(
                "batch_size = \"auto\": training probes the GPU from batch {batch} x {seq}, the planner's \
                 largest within the budget{}\n",
                if batch == 0 { " (none: it tries batch 1)" } else { "" }
            );
            batch.max(1)
        }
    }
}
