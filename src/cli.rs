//! The command line's shape: every subcommand and flag (clap derive) and the parsers of their
//! values. `main.rs` runs them.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use lora_ft::quant::Quantization;

mod chat;
mod generate;
mod loading;
mod sampling;
mod serve;
pub use chat::ChatArgs;
pub use generate::GenerateArgs;
pub use loading::LoadingArgs;
pub use sampling::SamplingArgs;
pub use serve::ServeArgs;

#[derive(Parser)]
#[command(name = "lora-ft", version, about = "QLoRA fine-tuning of Llama, Mistral, Qwen and Gemma models")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Train a LoRA adapter as a config file says.
    Train {
        /// The run's TOML config (`lora-ft init MODEL` writes one).
        config: PathBuf,
        /// Overrides the config's train.device: auto, cpu, cuda or cuda:N (with --gpus: cuda,
        /// or cpu for N CPU workers).
        #[arg(long)]
        device: Option<String>,
        /// Also write the initial adapter and every batch in training order into DIR, for
        /// replaying the run in another trainer (scripts/convergence/).
        #[arg(long, value_name = "DIR")]
        trace: Option<PathBuf>,
        /// Overrides the config's train.gpu_mem: plan for a card of this size (24GiB, 48GB, 80)
        /// instead of the one present.
        #[arg(long)]
        gpu_mem: Option<String>,
        #[command(flatten)]
        launch: LaunchArgs,
    },
    /// Copy a checkpoint's adapter into a standalone PEFT adapter folder.
    Export {
        /// A checkpoint folder, `<output.dir>/checkpoints/step-N/`.
        checkpoint: PathBuf,
        /// The PEFT adapter folder to write.
        out_dir: PathBuf,
    },
    /// Convert a GGUF file into an HF-layout model folder (f32 safetensors, tokenizer, config).
    Import {
        /// A GGUF file of a family lora-ft trains, or a vocabulary-only GGUF (tokenizer files only).
        gguf: PathBuf,
        /// The HF-layout folder to write (config.json, model.safetensors, tokenizer files).
        out_dir: PathBuf,
    },
    /// Chat with a model, with or without an adapter.
    Chat(ChatArgs),
    /// Answer a prompts file (JSON Lines of messages), n replies a prompt, into a completions file.
    Generate(GenerateArgs),
    /// Serve the model and its adapters over an OpenAI-compatible HTTP API (chat and text
    /// completions, tool calls, streaming), as vLLM and llama-server do.
    Serve(ServeArgs),
    /// Fold an adapter into its base model (W + scale·B·A) and write an HF-layout folder that
    /// transformers loads without PEFT.
    Merge {
        /// Hub repo id, local HF folder or .gguf file of the base model.
        #[arg(long)]
        model: String,
        /// The Hub revision (branch, tag or commit) of a repo id.
        #[arg(long, default_value = "main")]
        revision: String,
        /// The PEFT adapter folder (adapter_config.json, adapter_model.safetensors).
        #[arg(long)]
        adapter: PathBuf,
        /// The HF-layout folder to write.
        out_dir: PathBuf,
        /// The dtype of the merged weights.
        #[arg(long, default_value = "f16", value_parser = ["f16", "bf16", "f32"])]
        dtype: String,
    },
    /// Fold an adapter into its base model and write the result as one GGUF file that llama.cpp
    /// loads (Llama, Mistral, Qwen 2/3, Gemma 2/3; byte-level BPE and SentencePiece tokenizers),
    /// and an Ollama Modelfile beside it.
    ExportGguf {
        /// Hub repo id or local HF folder of the base model.
        #[arg(long)]
        model: String,
        /// The Hub revision (branch, tag or commit) of a repo id.
        #[arg(long, default_value = "main")]
        revision: String,
        /// The PEFT adapter folder; without it the base model is written.
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// The .gguf file to write (its folder must exist).
        out: PathBuf,
        /// The type of the 2-D weights; norms and other 1-D tensors stay f32. q4_k_m: llama.cpp's
        /// Q4_K_M mix (`llama-quantize ... Q4_K_M` without an imatrix), Q4_K/Q6_K blocks.
        #[arg(long = "type", default_value = "f16", value_parser = ["f32", "f16", "bf16", "q8_0", "q4_k_m"])]
        file_type: String,
        /// The adapter alone as a llama.cpp LoRA file (`llama-cli --lora`, Ollama's `ADAPTER`),
        /// its weights f32, for a GGUF of the base; needs --adapter.
        #[arg(long, requires = "adapter", conflicts_with = "file_type")]
        adapter_only: bool,
        /// With --adapter-only: the base model's GGUF, the `FROM` of the Ollama Modelfile written
        /// beside OUT (OUT.Modelfile); without it `FROM ./BASE.gguf` is left to fill in.
        #[arg(long, requires = "adapter_only")]
        base_gguf: Option<PathBuf>,
    },
    /// Predict peak GPU memory of a config's run before loading anything, and the largest batch
    /// that fits at each sequence length.
    Estimate {
        /// The run's TOML config; of the model, only config.json is read.
        config: PathBuf,
        /// The card's memory: 24GiB, 48GB, 80 (GiB).
        #[arg(long, default_value = "24GiB")]
        gpu_mem: String,
        /// Attention as the run computes it: on the fused kernels wherever they take a layer, or
        /// on the composed path (query chunks of scores) everywhere, as builds before cuDNN took
        /// Gemma 2's soft caps ran it.
        #[arg(long, default_value = "fused", value_parser = ["fused", "composed"])]
        attention: String,
        /// The training machine's memory (64GiB, 128GB, 256), of which offloaded layers may take
        /// half [default: half of what this machine has available now].
        #[arg(long)]
        host_mem: Option<String>,
    },
    /// Write a commented training config for a model, with the batch size and max_seq_len the
    /// memory planner fits on the card.
    Init {
        /// A Hub repo id (meta-llama/Llama-3.1-8B-Instruct; only config.json is fetched), a local
        /// HF folder, or a .gguf file (only its metadata is read).
        model: String,
        /// The Hub revision (branch, tag or commit) of a repo id.
        #[arg(long, default_value = "main")]
        revision: String,
        /// The card's memory: 24GiB, 48GB, 80 (GiB).
        #[arg(long, default_value = "24GiB")]
        gpu_mem: String,
        /// The training data: a folder with train.jsonl (and eval.jsonl), or one JSONL file.
        #[arg(long, default_value = "datasets/customer-service")]
        data: PathBuf,
        /// Where to write the config [default: MODEL-NAME.toml, lowercased]; its stem names the
        /// run's output folder and adapter.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Replace an existing output file.
        #[arg(long)]
        force: bool,
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
    /// The mean loss and perplexity over the trained tokens of a dialogue file (rows rendered,
    /// masked and cut as training does), with or without an adapter.
    Eval(EvalArgs),
    /// Inspect training data.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Write the book's generated reference pages (cli.md, config.md) into DIR.
    #[command(hide = true)]
    Reference { dir: PathBuf },
}

/// Data-parallel training: one rank per GPU of this machine, and of several machines.
#[derive(Args)]
pub struct LaunchArgs {
    /// Start one rank per GPU (cuda:0..N-1), each training its shard of every batch of
    /// train.batch_size rows per GPU; with --device cpu, N CPU workers.
    #[arg(long, value_name = "N", visible_alias = "workers", value_parser = at_least_one)]
    pub gpus: Option<usize>,
    /// Machines in the run (each runs this command with its --node-rank; MASTER_ADDR and
    /// MASTER_PORT name where rank 0 listens).
    #[arg(long, default_value_t = 1, requires = "gpus", value_parser = at_least_one)]
    pub nnodes: usize,
    /// This machine's index among --nnodes (0 runs rank 0).
    #[arg(long, default_value_t = 0, requires = "gpus")]
    pub node_rank: usize,
}

pub fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a number, at least 1".into()),
    }
}

#[derive(Subcommand)]
pub enum DataCommand {
    /// Counts, token-length percentiles, truncation and one rendered example with the trained spans.
    Check {
        /// The data file, read in the config's data.format.
        file: PathBuf,
        /// The run's TOML config: model (its tokenizer and template), data settings.
        #[arg(long)]
        config: PathBuf,
    },
    /// Every kept row as training reads it (rendered, masked, truncated), one JSON line each:
    /// {"line", "input_ids", "labels"} with -100 where a token is not trained.
    Tokenize {
        /// The data file, read in the config's data.format.
        file: PathBuf,
        /// The run's TOML config: model (its tokenizer and template), data settings.
        #[arg(long)]
        config: PathBuf,
        /// The JSON Lines file to write [default: stdout].
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Train on random tokens at each shape (the anchor script's recipe) and report tokens/s,
    /// step time and peak GPU memory, one JSON line per shape.
    Train {
        #[command(flatten)]
        model: BenchModel,
        /// SEQxBATCH,... as in ../shared/anchors/peft_qlora_baseline.py.
        #[arg(long, default_value = "512x2,512x4,512x8,2048x2,2048x4,2048x8")]
        shapes: String,
        /// Timed optimizer steps per shape (after two warm-up steps).
        #[arg(long, default_value_t = 6)]
        steps: usize,
        /// LoRA dropout (the anchor recipe has none).
        #[arg(long, default_value_t = 0.0)]
        lora_dropout: f64,
        /// Keep the checkpoints and lm_head on the GPU (train.host_offload = false).
        #[arg(long)]
        no_host_offload: bool,
        /// Run each layer's MLP over all rows at once (train.mlp_tiles = false).
        #[arg(long)]
        no_mlp_tiles: bool,
        /// train.checkpointing: auto (the planner keeps as many layers' activations as the
        /// budget holds), full (recompute every layer) or none.
        #[arg(long, default_value = "auto", value_parser = ["auto", "full", "none"])]
        checkpointing: String,
        /// Plan for a card of this size (24GiB, 48GB, 80) instead of the one present.
        #[arg(long)]
        gpu_mem: Option<String>,
        /// With --gpu-mem: hold the GPU's memory beyond that card for the whole run, so that the
        /// memory pool has what the card would have (its fragmentation included), not only the
        /// plan's budget. Rows say `card_gib`.
        #[arg(long)]
        hold_card: bool,
        /// Before the shapes, time the first step from process start three times, each in a
        /// child process at the first shape: with the driver's JIT cache off
        /// (CUDA_CACHE_DISABLE=1: cold), with a new empty cache (a fresh machine), and with that
        /// cache as the fresh run left it (warm); the first row reports them.
        #[arg(long)]
        first_step_cold_warm: bool,
    },
    /// How long the device takes to load each kernel module: ours (fatbins) and candle's (PTX
    /// the driver compiles), one JSON line each, then the totals. Run it with
    /// CUDA_CACHE_DISABLE=1 to see a fresh machine's compile times.
    Kernels {
        /// cuda or cuda:N.
        #[arg(long, default_value = "cuda")]
        device: String,
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
        /// Key/value heads (grouped-query attention when fewer than --heads).
        #[arg(long, default_value_t = 8)]
        kv_heads: usize,
        /// The width of one head.
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
        /// Timed iterations per shape.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// The dtype of q, k and v.
        #[arg(long, default_value = "f16", value_parser = ["f32", "f16", "bf16"])]
        dtype: String,
        /// auto, cpu, cuda or cuda:N.
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Decode random prompts with the engine at each batch size (a random rank-16 adapter on all
    /// projections, applied unmerged) and time the first token of one long prompt: tokens/s,
    /// step time and the bytes a step reads, one JSON line per batch size.
    Generate {
        #[command(flatten)]
        model: BenchModel,
        /// Sequences decoded together, comma-separated.
        #[arg(long, default_value = "1,8,64,256")]
        batches: String,
        /// Tokens of each random prompt.
        #[arg(long, default_value_t = 512)]
        prompt_len: usize,
        /// Tokens generated for each prompt (no stop token).
        #[arg(long, default_value_t = 256)]
        new_tokens: usize,
        /// The random adapter's rank (0: the base model alone).
        #[arg(long, default_value_t = 16)]
        lora_rank: usize,
        /// The prompt length of the time-to-first-token row (0: none).
        #[arg(long, default_value_t = 2048)]
        ttft_prompt: usize,
        /// Every decode step launched kernel by kernel, none replayed from a CUDA graph.
        #[arg(long)]
        enforce_eager: bool,
        /// Prompt tokens one prefill forward takes at most (as `serve --max-prefill-tokens`):
        /// lower, the peak memory is lower and a batch's prompts take more forwards.
        #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        max_prefill_tokens: Option<usize>,
    },
    /// Load a model and report load time and memory.
    Load {
        #[command(flatten)]
        model: BenchModel,
    },
}

/// The model a benchmark loads and how.
#[derive(Args)]
pub struct BenchModel {
    /// Hub repo id, local HF folder or .gguf file.
    #[arg(long)]
    pub model: String,
    /// Storage of the frozen projection weights (nf4: with double quantization).
    #[arg(long, default_value = "nf4", value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    pub quantization: String,
    /// The compute dtype.
    #[arg(long, default_value = "f16", value_parser = ["f32", "f16", "bf16"])]
    pub dtype: String,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn parse_quantization(name: &str) -> Quantization {
    match name {
        "nf4" => Quantization::Nf4 { double_quant: true },
        "nf4-no-double-quant" => Quantization::Nf4 { double_quant: false },
        _ => Quantization::None,
    }
}

/// "24GiB", "24GB" (read as GiB, as cards are sold) or "24" → bytes.
pub fn parse_gib(text: &str) -> anyhow::Result<u64> {
    parse_size("--gpu-mem", text)
}

/// A size in GiB given to `flag` (24GiB, 48GB, 80), in bytes.
pub fn parse_size(flag: &str, text: &str) -> anyhow::Result<u64> {
    let number =
        text.trim().trim_end_matches(['B', 'b']).trim_end_matches(['i', 'I']).trim_end_matches(['G', 'g']);
    let gib: f64 = number.trim().parse().with_context(|| format!("{flag} {text:?}: expected e.g. 24GiB"))?;
    anyhow::ensure!(gib > 0.0 && gib < 1e6, "{flag} {text:?}: expected a positive size in GiB");
    Ok((gib * (1u64 << 30) as f64) as u64)
}

pub fn parse_shapes(text: &str) -> anyhow::Result<Vec<(usize, usize)>> {
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

pub fn parse_checkpointing(name: &str) -> lora_ft::config::Checkpointing {
    use lora_ft::config::Checkpointing;
    match name {
        "full" => Checkpointing::Full,
        "none" => Checkpointing::None,
        _ => Checkpointing::Auto,
    }
}

pub fn parse_dtype(name: &str) -> candle_core::DType {
    match name {
        "f32" => candle_core::DType::F32,
        "bf16" => candle_core::DType::BF16,
        _ => candle_core::DType::F16,
    }
}

#[derive(Args)]
pub struct EvalArgs {
    /// Hub repo id, local HF folder or .gguf file [default: the config's model.source].
    #[arg(long)]
    pub model: Option<String>,
    /// The Hub revision of a repo id [default: the config's model.revision, else main].
    #[arg(long)]
    pub revision: Option<String>,
    /// A PEFT adapter folder (adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// The dialogues: a JSON Lines file, or Parquet when it ends in .parquet.
    #[arg(long)]
    pub data: PathBuf,
    /// How a row reads: messages, sharegpt, alpaca, prompt_completion or auto (the first row's
    /// keys tell) [default: the config's data.format, else messages].
    #[arg(long)]
    pub format: Option<lora_ft::config::DataFormat>,
    /// A training config: the model, quantization, max_seq_len, truncation side, compute dtype
    /// and device come from it (the flags below override it); without it, `lora-ft train`'s
    /// defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also write one JSON line per dialogue (index, line, loss, ppl, tokens, ...) to FILE.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// auto, cpu, cuda or cuda:N [default: the config's train.device, else auto].
    #[arg(long)]
    pub device: Option<String>,
    /// The compute dtype [default: the config's train.compute_dtype; without a config f32 on the
    /// CPU, f16 on a GPU].
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    pub dtype: Option<String>,
    /// Storage of the base's projection weights [default: the config's, else nf4 as training].
    #[arg(long, value_parser = ["nf4", "nf4-no-double-quant", "none"])]
    pub quantization: Option<String>,
    /// Rows longer than this are cut as training cuts them [default: the config's data.max_seq_len].
    #[arg(long, value_parser = at_least_two)]
    pub max_seq_len: Option<usize>,
    /// A Jinja file in place of the model's chat template [default: the config's
    /// model.chat_template, else the model's own].
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Longest reply generated per assistant turn when scoring tool calls.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Skip tool-call scoring (dialogues with `tools` are otherwise answered turn by turn).
    #[arg(long)]
    pub no_tool_calls: bool,
}

pub fn at_least_two(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(n) if n >= 2 => Ok(n),
        _ => Err("expected a number, at least 2".into()),
    }
}

/// This `lora-ft bench train` command line for a child that times one step at the first shape:
/// `--shapes` cut to its first, one timed step, `--first-step-cold-warm` left out.
pub fn first_step_child_args(shapes: &str) -> Vec<String> {
    let first = shapes.split(',').next().unwrap_or(shapes).to_string();
    let mut out = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--first-step-cold-warm" => {}
            "--shapes" | "--steps" => {
                args.next();
            }
            a if a.starts_with("--shapes=") || a.starts_with("--steps=") => {}
            _ => out.push(arg),
        }
    }
    out.extend(["--shapes".into(), first, "--steps".into(), "1".into()]);
    out
}
