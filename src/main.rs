//! `lora-ft`: the command line.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use lora_ft::config::{BatchSize, Config};
use lora_ft::data::{ChatTokenizer, Message};
use lora_ft::generate::{reply, stop_ids, GenerationSettings};
use lora_ft::model::CausalLm;
use lora_ft::quant::Quantization;
use lora_ft::train::{parse_device, select_device};

#[derive(Parser)]
#[command(name = "lora-ft", version, about = "QLoRA fine-tuning of Llama/Mistral models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a LoRA adapter as a config file says.
    Train {
        config: PathBuf,
        /// Overrides the config's train.device: auto, cpu, cuda or cuda:N.
        #[arg(long)]
        device: Option<String>,
        /// Also write the initial adapter and every batch in training order into DIR, for
        /// replaying the run in another trainer (scripts/convergence/).
        #[arg(long, value_name = "DIR")]
        trace: Option<PathBuf>,
    },
    /// Copy a checkpoint's adapter into a standalone PEFT adapter folder.
    Export { checkpoint: PathBuf, out_dir: PathBuf },
    /// Convert a GGUF file into an HF-layout model folder (f32 safetensors, tokenizer, config).
    Import { gguf: PathBuf, out_dir: PathBuf },
    /// Chat with a model, with or without an adapter.
    Chat(ChatArgs),
    /// Fold an adapter into its base model (W + scale·B·A) and write an HF-layout folder that
    /// transformers loads without PEFT.
    Merge {
        /// Hub repo id, local HF folder or .gguf file of the base model.
        #[arg(long)]
        model: String,
        #[arg(long, default_value = "main")]
        revision: String,
        /// The PEFT adapter folder (adapter_config.json, adapter_model.safetensors).
        #[arg(long)]
        adapter: PathBuf,
        out_dir: PathBuf,
        #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
        dtype: String,
    },
    /// Predict peak GPU memory of a config's run before loading anything, and the largest batch
    /// that fits at each sequence length.
    Estimate {
        config: PathBuf,
        /// The card's memory: 24GiB, 48GB, 80 (GiB).
        #[arg(long, default_value = "24GiB")]
        gpu_mem: String,
    },
    /// Draw a run's metrics.jsonl as a PNG: loss and eval loss, learning rate and GPU memory over
    /// steps (`lora-ft train` writes RUN_DIR/metrics.png itself at the end).
    Plot {
        /// The run's output.dir, holding metrics.jsonl.
        run_dir: PathBuf,
        /// Where to write the PNG [default: RUN_DIR/metrics.png].
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Measurements (JSON lines) to compare with the reference stack.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Inspect training data.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
}

#[derive(Subcommand)]
enum DataCommand {
    /// Counts, token-length percentiles, truncation and one rendered example with the trained spans.
    Check {
        file: PathBuf,
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Train on random tokens at each shape (the anchor script's recipe) and report tokens/s,
    /// step time and peak GPU memory, one JSON line per shape.
    Train {
        #[command(flatten)]
        model: BenchModel,
        /// SEQxBATCH,... as in ../shared/anchors/peft_qlora_baseline.py.
        #[arg(long, default_value = "512x2,512x4,512x8,2048x2,2048x4,2048x8")]
        shapes: String,
        #[arg(long, default_value_t = 6)]
        steps: usize,
        /// LoRA dropout (the anchor recipe has none).
        #[arg(long, default_value_t = 0.0)]
        lora_dropout: f64,
    },
    /// Causal attention alone (the FlashAttention-style kernels on CUDA), forward and backward,
    /// on random inputs: milliseconds and TFLOP/s per shape, one JSON line each.
    Attention {
        /// SEQxBATCH,...
        #[arg(long, default_value = "512x8,2048x8")]
        shapes: String,
        /// Query heads, kv heads and head_dim (Mistral-7B's by default).
        #[arg(long, default_value_t = 32)]
        heads: usize,
        #[arg(long, default_value_t = 8)]
        kv_heads: usize,
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
        #[arg(long, default_value_t = 20)]
        iters: usize,
        #[arg(long, default_value = "f16", value_parser = ["f32", "f16", "bf16"])]
        dtype: String,
        /// auto, cpu, cuda or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Load a model and report load time and memory.
    Load {
        #[command(flatten)]
        model: BenchModel,
    },
}

/// The model a benchmark loads and how.
#[derive(Args)]
struct BenchModel {
    /// Hub repo id, local HF folder or .gguf file.
    #[arg(long)]
    model: String,
    #[arg(long, default_value = "nf4", value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    quantization: String,
    #[arg(long, default_value = "f16", value_parser = ["f32", "f16", "bf16"])]
    dtype: String,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
}

fn parse_quantization(name: &str) -> Quantization {
    match name {
        "nf4" => Quantization::Nf4 { double_quant: true },
        "nf4-no-double-quant" => Quantization::Nf4 { double_quant: false },
        _ => Quantization::None,
    }
}

/// "24GiB", "24GB" (read as GiB, as cards are sold) or "24" → bytes.
fn parse_gib(text: &str) -> anyhow::Result<u64> {
    let number =
        text.trim().trim_end_matches(['B', 'b']).trim_end_matches(['i', 'I']).trim_end_matches(['G', 'g']);
    let gib: f64 =
        number.trim().parse().with_context(|| format!("--gpu-mem {text:?}: expected e.g. 24GiB"))?;
    anyhow::ensure!(gib > 0.0 && gib < 1e6, "--gpu-mem {text:?}: expected a positive size in GiB");
    Ok((gib * (1u64 << 30) as f64) as u64)
}

fn parse_shapes(text: &str) -> anyhow::Result<Vec<(usize, usize)>> {
    text.split(',')
        .map(|s| {
            let (seq, bs) =
                s.trim().split_once('x').with_context(|| format!("shape {s:?}: expected SEQxBATCH"))?;
            let (seq, bs): (usize, usize) =
                (seq.parse().context("sequence length")?, bs.parse().context("batch size")?);
            anyhow::ensure!(
                seq >= 2 && bs >= 1,
                "shape {s:?}: needs a sequence of at least 2 and a batch of at least 1"
            );
            Ok((seq, bs))
        })
        .collect()
}

fn parse_dtype(name: &str) -> candle_core::DType {
    match name {
        "f32" => candle_core::DType::F32,
        "bf16" => candle_core::DType::BF16,
        _ => candle_core::DType::F16,
    }
}

#[derive(Args)]
struct ChatArgs {
    /// Hub repo id, local HF folder or .gguf file.
    #[arg(long)]
    model: String,
    /// A PEFT adapter folder (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// One user message; without it, chat interactively on stdin.
    #[arg(long)]
    prompt: Option<String>,
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// 0 decodes greedily.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long)]
    top_p: Option<f64>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value = "main")]
    revision: String,
    /// Storage of the base's projection weights; use what the adapter was trained with.
    #[arg(long, default_value = "nf4", value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    quantization: String,
}

fn main() {
    lora_ft::bench::mark_process_start();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "lora_ft=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Train { config, device, trace } => train(&config, device, trace.as_deref()),
        Command::Export { checkpoint, out_dir } => {
            lora_ft::export::export_checkpoint(&checkpoint, &out_dir)?;
            println!("exported {} to {}", checkpoint.display(), out_dir.display());
            Ok(())
        }
        Command::Import { gguf, out_dir } => {
            let summary = lora_ft::gguf::import_gguf(&gguf, &out_dir)?;
            println!("imported {} into {}: {summary:?}", gguf.display(), out_dir.display());
            Ok(())
        }
        Command::Chat(args) => chat(&args),
        Command::Bench { command: BenchCommand::Train { model: m, shapes, steps, lora_dropout } } => {
            let (device, shapes) = (parse_device(&m.device)?, parse_shapes(&shapes)?);
            let (q, dtype) = (parse_quantization(&m.quantization), parse_dtype(&m.dtype));
            lora_ft::bench::train(&m.model, q, dtype, &device, &shapes, steps, lora_dropout, |row| {
                println!("{}", serde_json::to_string(row).unwrap_or_default())
            })?;
            Ok(())
        }
        Command::Bench {
            command: BenchCommand::Attention { shapes, heads, kv_heads, head_dim, iters, dtype, device },
        } => {
            let (device, dtype) = (parse_device(&device)?, parse_dtype(&dtype));
            for shape in parse_shapes(&shapes)? {
                let row =
                    lora_ft::bench::attention(&device, dtype, shape, (heads, kv_heads, head_dim), iters)?;
                println!("{}", serde_json::to_string(&row)?);
            }
            Ok(())
        }
        Command::Bench { command: BenchCommand::Load { model: m } } => {
            let device = parse_device(&m.device)?;
            let (q, dtype) = (parse_quantization(&m.quantization), parse_dtype(&m.dtype));
            let report = lora_ft::bench::load(&m.model, q, dtype, &device)?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::Merge { model, revision, adapter, out_dir, dtype } => {
            let summary = lora_ft::merge::merge(&model, &revision, &adapter, &out_dir, parse_dtype(&dtype))?;
            println!(
                "merged {} projections into {} ({} tensors in {} shard(s))",
                summary.merged_projections,
                out_dir.display(),
                summary.tensors,
                summary.shards
            );
            Ok(())
        }
        Command::Estimate { config, gpu_mem } => {
            let cfg = Config::from_file(&config)?;
            let config_json = lora_ft::hub::config_json(&cfg.model.expanded_source(), &cfg.model.revision)?;
            let model = lora_ft::model::ModelConfig::from_file(&config_json)?;
            let total = parse_gib(&gpu_mem)?;
            let budget = lora_ft::memory::VramBudget::new(total, cfg.train.max_vram_fraction).bytes();
            let run = lora_ft::plan::run_shape(&cfg);
            let shape = (cfg.data.max_seq_len, estimated_batch(&cfg, &model, &run, budget));
            print!("{}", lora_ft::plan::report(&model, &run, shape, budget));
            Ok(())
        }
        Command::Plot { run_dir, out } => {
            let png = lora_ft::train::plot::plot_run(&run_dir, out.as_deref())?;
            println!("wrote {}", png.display());
            Ok(())
        }
        Command::Data { command: DataCommand::Check { file, config } } => {
            let cfg = Config::from_file(&config)?;
            let files = lora_ft::hub::resolve(&cfg.model.expanded_source(), &cfg.model.revision)?;
            print!("{}", lora_ft::data::data_check(&file, &cfg, &files.dir)?);
            Ok(())
        }
    }
}

/// The config's batch size; for "auto", the planner's largest within `budget`, where training
/// starts probing (said on a line of its own).
fn estimated_batch(
    cfg: &Config,
    model: &lora_ft::model::ModelConfig,
    run: &lora_ft::plan::RunShape,
    budget: u64,
) -> usize {
    match cfg.train.batch_size {
        BatchSize::Fixed(batch) => batch,
        BatchSize::Auto => {
            let seq = cfg.data.max_seq_len;
            let batch = lora_ft::plan::largest_batch(model, run, seq, budget);
            println!(
                "batch_size = \"auto\": training probes the GPU from batch {batch} x {seq}, the planner's \
                 largest within the budget{}\n",
                if batch == 0 { " (none: it tries batch 1)" } else { "" }
            );
            batch.max(1)
        }
    }
}

fn train(config: &Path, device: Option<String>, trace: Option<&Path>) -> anyhow::Result<()> {
    let mut cfg = Config::from_file(config)?;
    if let Some(device) = device {
        cfg.train.device = device;
    }
    let s = lora_ft::train::run(&cfg, trace)?;
    println!(
        "trained {} steps: loss {:.4} → {:.4}, {:.0} tokens/s",
        s.steps, s.first_loss, s.last_loss, s.tokens_per_s
    );
    if let (Some(a), Some(b)) = (&s.first_eval, &s.last_eval) {
        println!(
            "eval loss {:.4} → {:.4}, perplexity {:.2} → {:.2}",
            a.eval_loss, b.eval_loss, a.eval_ppl, b.eval_ppl
        );
    }
    println!("adapter: {}", s.adapter_dir.display());
    Ok(())
}

fn chat(args: &ChatArgs) -> anyhow::Result<()> {
    let device = select_device()?;
    let files = lora_ft::hub::resolve(&args.model, &args.revision)?;
    let dtype = if device.is_cpu() { candle_core::DType::F32 } else { candle_core::DType::BF16 };
    let quantization = parse_quantization(&args.quantization);
    let mut model = CausalLm::load(&files.config, &files.weights, dtype, quantization, &device)?;
    if let Some(adapter) = &args.adapter {
        lora_ft::export::load_adapter(&mut model, adapter)
            .with_context(|| format!("loading adapter {}", adapter.display()))?;
    }
    let tokenizer = ChatTokenizer::from_dir(&files.dir)?;
    let stop = stop_ids(&files.dir, &tokenizer);
    let settings = GenerationSettings {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut messages: Vec<Message> = args.system.iter().map(|s| Message::new("system", s)).collect();
    if let Some(prompt) = &args.prompt {
        messages.push(Message::new("user", prompt));
        println!("{}", reply(&model, &tokenizer, &messages, &stop, &settings)?);
        return Ok(());
    }
    let stdin = std::io::stdin();
    loop {
        print!("> ");
        std::io::stdout().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        messages.push(Message::new("user", line.trim_end()));
        let answer = reply(&model, &tokenizer, &messages, &stop, &settings)?;
        println!("{answer}");
        messages.push(Message::new("assistant", &answer));
    }
}
