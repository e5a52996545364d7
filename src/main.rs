//! `lora-ft`: the command line (its shape in `cli.rs`).

mod cli;
mod generation_commands;
mod plan_commands;
mod reference;
mod serve_command;

use std::path::Path;

use anyhow::Context;
use clap::Parser;
use cli::*;
use lora_ft::config::Config;
use lora_ft::distributed::launcher::{LaunchError, LaunchPlan};
use lora_ft::distributed::{rank_prefix, WorldInfo};
use lora_ft::train::parse_device;

fn main() {
    lora_ft::bench::mark_process_start();
    // a rank of a data-parallel run says which in every line it writes
    let prefix = rank_from_env().map(rank_prefix).unwrap_or_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "lora_ft=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .event_format(Prefixed { prefix: prefix.clone(), inner: tracing_subscriber::fmt::format() })
        .init();
    if let Err(e) = run(Cli::parse()) {
        if lora_ft::distributed::liveness::claim_exit_message() {
            // another rank's failure is the whole story, not what this rank was doing then
            match lora_ft::train::peer_failure(&e) {
                Some(failure) => eprintln!("{prefix}error: {failure}"),
                None => eprintln!("{prefix}error: {e:#}"),
            }
        }
        std::process::exit(exit_code(&e));
    }
}

/// RANK, when WORLD_SIZE says this process is one rank of several.
fn rank_from_env() -> Option<usize> {
    let world: usize = std::env::var("WORLD_SIZE").ok()?.trim().parse().ok()?;
    (world > 1).then(|| std::env::var("RANK").ok()?.trim().parse().ok()).flatten()
}

/// 130 for a run stopped by a signal after its checkpoint, 3 for a rank stopped because another
/// failed (the launcher looks past those for the rank that failed first), else 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<lora_ft::train::Stopped>().is_some()
        || matches!(e.downcast_ref::<LaunchError>(), Some(LaunchError::Stopped))
    {
        lora_ft::distributed::launcher::EXIT_STOPPED
    } else if lora_ft::train::is_peer_failure(e) {
        lora_ft::distributed::EXIT_PEER_FAILED
    } else {
        1
    }
}

/// tracing's format with a prefix before each line.
struct Prefixed<F> {
    prefix: String,
    inner: F,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Prefixed<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        writer.write_str(&self.prefix)?;
        self.inner.format_event(ctx, writer, event)
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Train { config, device, trace, gpu_mem, launch } => {
            train(&config, (device, gpu_mem), trace.as_deref(), &launch)
        }
        Command::Export { checkpoint, out_dir } => {
            lora_ft::peft_adapter::export_checkpoint(&checkpoint, &out_dir)?;
            println!("exported {} to {}", checkpoint.display(), out_dir.display());
            Ok(())
        }
        Command::Import { gguf, out_dir } => {
            let summary = lora_ft::gguf::import_gguf(&gguf, &out_dir)?;
            println!("imported {} into {}: {summary:?}", gguf.display(), out_dir.display());
            Ok(())
        }
        Command::Chat(args) => generation_commands::chat(&args),
        Command::Generate(args) => generation_commands::generate(&args),
        Command::Serve(args) => serve_command::serve(&args),
        Command::Bench {
            command:
                BenchCommand::Train {
                    model: m,
                    shapes,
                    steps,
                    lora_dropout,
                    no_host_offload,
                    no_mlp_tiles,
                    checkpointing,
                    gpu_mem,
                    hold_card,
                    first_step_cold_warm,
                },
        } => {
            // the children first: this process's device and its background loads come after
            let first_steps = match first_step_cold_warm {
                true => Some(lora_ft::bench::first_steps(&first_step_child_args(&shapes))?),
                false => None,
            };
            let (device, shapes) = (parse_device(&m.device)?, parse_shapes(&shapes)?);
            let (q, dtype) = (parse_quantization(&m.quantization), parse_dtype(&m.dtype));
            let options = lora_ft::bench::TrainOptions {
                steps,
                lora_dropout,
                host_offload: !no_host_offload,
                mlp_tiles: !no_mlp_tiles,
                checkpointing: parse_checkpointing(&checkpointing),
                gpu_mem: gpu_mem
                    .as_deref()
                    .map(parse_gib)
                    .transpose()?
                    .map(|b| b as f64 / (1u64 << 30) as f64),
                hold_card,
                first_steps,
            };
            lora_ft::bench::train(&m.model, q, dtype, &device, &shapes, &options, |row| {
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
        Command::Bench { command: BenchCommand::Kernels { device } } => {
            for row in lora_ft::bench::kernels(&parse_device(&device)?)? {
                println!("{}", serde_json::to_string(&row)?);
            }
            Ok(())
        }
        Command::Bench {
            command:
                BenchCommand::Generate {
                    model: m,
                    batches,
                    prompt_len,
                    new_tokens,
                    lora_rank,
                    ttft_prompt,
                    enforce_eager,
                    max_prefill_tokens,
                },
        } => {
            let device = parse_device(&m.device)?;
            let (q, dtype) = (parse_quantization(&m.quantization), parse_dtype(&m.dtype));
            let batches = batches
                .split(',')
                .map(|b| {
                    b.trim().parse::<usize>().with_context(|| format!("--batches: {b:?} is not a number"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let options = lora_ft::bench::GenerateOptions {
                batches,
                prompt_len,
                new_tokens,
                lora_rank,
                ttft_prompt,
                enforce_eager,
                max_prefill_tokens,
            };
            lora_ft::bench::generate(&m.model, (q, dtype, &device), &options, |row| println!("{row}"))
        }
        Command::Bench { command: BenchCommand::Load { model: m } } => {
            let device = parse_device(&m.device)?;
            let (q, dtype) = (parse_quantization(&m.quantization), parse_dtype(&m.dtype));
            let report = lora_ft::bench::load(&m.model, q, dtype, &device)?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::ExportGguf { model, revision, adapter, out, file_type, adapter_only, base_gguf } => {
            let file_type = lora_ft::gguf::export::FileType::parse(&file_type)?;
            let summary = match (adapter_only, adapter.as_deref()) {
                (true, Some(adapter)) => lora_ft::merge::export_adapter_gguf(
                    &model,
                    &revision,
                    adapter,
                    &out,
                    base_gguf.as_deref(),
                )?,
                _ => lora_ft::merge::export_gguf(&model, &revision, adapter.as_deref(), &out, file_type)?,
            };
            println!(
                "wrote {} ({} tensors, {} merged projections, {} bytes)",
                out.display(),
                summary.tensors,
                summary.merged_projections,
                summary.bytes
            );
            println!("wrote {} (ollama create NAME -f {0})", summary.modelfile.display());
            summary.warnings.iter().for_each(|w| eprintln!("warning: {w}"));
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
        Command::Estimate { config, gpu_mem, attention, host_mem } => {
            plan_commands::estimate(&config, &gpu_mem, &attention, host_mem.as_deref())
        }
        Command::Init { model, revision, gpu_mem, data, out, force } => {
            plan_commands::init(&model, &revision, &gpu_mem, &data, out, force)
        }
        Command::Plot { run_dir, out } => {
            let png = lora_ft::train::plot::plot_run(&run_dir, out.as_deref())?;
            println!("wrote {}", png.display());
            Ok(())
        }
        Command::Eval(args) => eval(&args),
        Command::Reference { dir } => reference::write(&dir),
        Command::Data { command: DataCommand::Check { file, config } } => {
            let cfg = Config::from_file(&config)?;
            let files = lora_ft::hub::resolve(&cfg.model.expanded_source(), &cfg.model.revision)?;
            print!("{}", lora_ft::data::data_check(&file, &cfg, &files.dir)?);
            Ok(())
        }
        Command::Data { command: DataCommand::Tokenize { file, config, out } } => {
            let cfg = Config::from_file(&config)?;
            let files = lora_ft::hub::resolve(&cfg.model.expanded_source(), &cfg.model.revision)?;
            let rows = match &out {
                // in memory, then written whole: an existing file is replaced or kept, never cut
                Some(path) => {
                    let mut bytes = Vec::new();
                    let rows = lora_ft::data::data_tokenize(&file, &cfg, &files.dir, &mut bytes)?;
                    lora_ft::durable::write_atomic(path, &bytes)?;
                    rows
                }
                None => lora_ft::data::data_tokenize(&file, &cfg, &files.dir, &mut std::io::stdout().lock())?,
            };
            tracing::info!("{rows} rows written");
            Ok(())
        }
    }
}

fn train(
    config: &Path,
    (device, gpu_mem): (Option<String>, Option<String>),
    trace: Option<&Path>,
    launch: &LaunchArgs,
) -> anyhow::Result<()> {
    let mut cfg = Config::from_file(config)?;
    if let Some(device) = device {
        cfg.train.device = device;
    }
    if let Some(text) = &gpu_mem {
        cfg.train.gpu_mem = Some(parse_gib(text)? as f64 / (1u64 << 30) as f64);
    }
    let world = WorldInfo::from_env()?;
    if let Some(gpus) = launch.gpus.filter(|&n| n > 1 || launch.nnodes > 1) {
        anyhow::ensure!(
            world.is_none(),
            "--gpus starts its own ranks; under a launcher that set WORLD_SIZE (torchrun), run `lora-ft train CONFIG` \
             without it: each process is one rank"
        );
        return launch_ranks(&cfg, config, trace, launch, gpus);
    }
    let s = match &world {
        Some(world) => {
            lora_ft::distributed::launcher::stop_when_launcher_exits(rank_prefix(world.rank));
            lora_ft::train::run_rank(&cfg, trace, world)?
        }
        None => {
            if launch.gpus == Some(1) && matches!(cfg.train.device.as_str(), "auto" | "cuda") {
                cfg.train.device = "cuda:0".into();
            }
            lora_ft::train::run(&cfg, trace)?
        }
    };
    if world.is_some_and(|w| w.rank != 0) {
        return Ok(());
    }
    match s.first_step {
        // a finished run started again: its checkpoint holds the last step, nothing was trained
        first if first >= s.steps => println!(
            "nothing left to train: {} holds the checkpoint of step {} of {} (remove it, or set \
             checkpoint.resume = \"never\", to train again from the start)",
            cfg.output.dir.display(),
            first,
            s.steps
        ),
        0 => println!(
            "trained {} steps: loss {:.4} → {:.4}, {:.0} tokens/s",
            s.steps, s.first_loss, s.last_loss, s.tokens_per_s
        ),
        first => println!(
            "trained steps {}–{} (resumed from the checkpoint of step {first}): loss {:.4} → {:.4}, {:.0} tokens/s",
            first + 1,
            s.steps,
            s.first_loss,
            s.last_loss,
            s.tokens_per_s
        ),
    }
    if let (Some(a), Some(b)) = (&s.first_eval, &s.last_eval) {
        println!(
            "eval loss {:.4} → {:.4}, perplexity {:.2} → {:.2}",
            a.eval_loss, b.eval_loss, a.eval_ppl, b.eval_ppl
        );
    }
    println!("adapter: {}", s.adapter_dir.display());
    Ok(())
}

/// The ranks of this machine and where rank 0 listens: MASTER_ADDR and MASTER_PORT (needed with
/// several machines), else a free port on 127.0.0.1.
fn launch_plan(launch: &LaunchArgs, gpus: usize) -> anyhow::Result<LaunchPlan> {
    anyhow::ensure!(
        launch.node_rank < launch.nnodes,
        "--node-rank {} with --nnodes {}: node ranks count from 0",
        launch.node_rank,
        launch.nnodes
    );
    if launch.nnodes == 1 && std::env::var_os("MASTER_PORT").is_none() {
        return LaunchPlan::one_machine(gpus);
    }
    let var = |name: &str| {
        std::env::var(name).map_err(|_| {
            anyhow::anyhow!("--nnodes {}: set {name} (where rank 0 listens) on every machine", launch.nnodes)
        })
    };
    let port = var("MASTER_PORT")?;
    let master_port = port.parse().with_context(|| format!("MASTER_PORT={port:?}: a TCP port"))?;
    let master_addr = match var("MASTER_ADDR") {
        Err(_) if launch.nnodes == 1 => "127.0.0.1".into(),
        addr => addr?,
    };
    Ok(LaunchPlan {
        nproc: gpus,
        nnodes: launch.nnodes,
        node_rank: launch.node_rank,
        master_addr,
        master_port,
    })
}

/// `--gpus N`: this binary again, once per rank of this machine, with the launcher variables.
fn launch_ranks(
    cfg: &Config,
    config: &Path,
    trace: Option<&Path>,
    launch: &LaunchArgs,
    gpus: usize,
) -> anyhow::Result<()> {
    let device = match cfg.train.device.as_str() {
        "cpu" => "cpu",
        "auto" | "cuda" if cfg!(feature = "cuda") => "cuda",
        "auto" | "cuda" => anyhow::bail!(
            "--gpus {gpus} needs a build with --features cuda; --device cpu starts {gpus} CPU workers instead"
        ),
        other => anyhow::bail!(
            "--gpus {gpus} puts rank k on cuda:k; --device {other:?} names one GPU (use cuda, or cpu)"
        ),
    };
    let plan = launch_plan(launch, gpus)?;
    let mut args: Vec<std::ffi::OsString> =
        vec!["train".into(), config.into(), "--device".into(), device.into()];
    if let Some(gib) = cfg.train.gpu_mem {
        args.extend(["--gpu-mem".into(), format!("{gib}").into()]);
    }
    if let Some(dir) = trace {
        args.extend(["--trace".into(), dir.into()]);
    }
    let exe = std::env::current_exe().context("finding this program to start the ranks")?;
    let on = if device == "cpu" { "CPU workers" } else { "ranks, one per GPU" };
    match launch.nnodes {
        1 => tracing::info!("starting {gpus} {on}"),
        n => tracing::info!(
            "starting {gpus} {on} on machine {} of {n} ({} ranks in all)",
            launch.node_rank,
            gpus * n
        ),
    }
    lora_ft::distributed::launcher::launch(&exe, &args, &plan).map_err(|e| match e {
        LaunchError::Failed { .. } => anyhow::anyhow!("{e}\n{}", lora_ft::train::resume_point(cfg)),
        other => anyhow::Error::new(other),
    })
}

/// `lora-ft eval`: the settings from the flags, else the config, else training's defaults (those
/// of a config naming only the required keys).
fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    let cfg = match &args.config {
        Some(file) => Some(Config::from_file(file)?),
        None => None,
    };
    let source = match (&args.model, &cfg) {
        (Some(model), _) => model.clone(),
        (None, Some(cfg)) => cfg.model.expanded_source(),
        (None, None) => anyhow::bail!("lora-ft eval needs --model, or --config with a [model] source"),
    };
    let defaults = match cfg {
        Some(cfg) => cfg,
        None => Config::from_toml("[model]\nsource = \"\"\n[data]\ntrain = \"\"\n", Path::new("defaults"))?,
    };
    let device = parse_device(args.device.as_deref().unwrap_or(&defaults.train.device))?;
    let dtype = match (&args.dtype, &args.config) {
        (Some(d), _) => parse_dtype(d),
        (None, Some(_)) => lora_ft::train::compute_dtype(defaults.train.compute_dtype),
        (None, None) if device.is_cpu() => candle_core::DType::F32,
        (None, None) => candle_core::DType::F16,
    };
    let model = lora_ft::eval::EvalModel {
        source: &source,
        revision: args.revision.as_deref().unwrap_or(&defaults.model.revision),
        adapter: args.adapter.as_deref(),
        dtype,
        quantization: args.quantization.as_deref().map_or(defaults.model.quantization(), parse_quantization),
        chat_template: args.chat_template.as_deref().or(defaults.model.chat_template.as_deref()),
    };
    let settings = lora_ft::eval::EvalSettings {
        format: args.format.unwrap_or(defaults.data.format),
        max_seq_len: args.max_seq_len.unwrap_or(defaults.data.max_seq_len),
        truncation_side: defaults.data.truncation_side,
        system_message: defaults.data.system_message,
        tool_call_tokens: (!args.no_tool_calls).then_some(args.max_new_tokens),
    };
    let report = lora_ft::eval::run(&model, &args.data, &settings, &device)?;
    if let Some(out) = &args.out {
        report.write_jsonl(out)?;
        tracing::info!("wrote {} ({} lines)", out.display(), report.dialogues.len());
    }
    print!("{}", report.summary(&args.data, &settings));
    Ok(())
}
