//! `lora-ft serve`: the model, its tokenizer and its adapters loaded, the engine started and the
//! OpenAI-compatible server (`lora_ft::serve`) listening until Ctrl-C or SIGTERM.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use lora_ft::generate::engine::{Engine, EngineConfig};
use lora_ft::serve::{AppState, ServeOptions};

use crate::cli::ServeArgs;
use crate::generation_commands::{load_base, plan_serving};

/// `--max-model-len` where it is not given on the CPU, for a model whose context is longer: the
/// KV cache of 16 sequences of 128k positions would not fit beside the weights.
const DEFAULT_MAX_MODEL_LEN: usize = 4096;

/// `--max-batch` where it is not given on the CPU.
const DEFAULT_MAX_BATCH: usize = 16;

/// `--adapter NAME=DIR` as its name and folder.
fn parse_adapter(spec: &str) -> anyhow::Result<(String, PathBuf)> {
    match spec.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(dir)))
        }
        _ => anyhow::bail!("--adapter {spec:?}: expected NAME=DIR (the name requests give as `model`)"),
    }
}

pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    // the flags are checked before the model loads
    let adapters = args.adapter.iter().map(|s| parse_adapter(s)).collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(args.max_tokens >= 1, "--max-tokens must be at least 1");
    anyhow::ensure!(args.max_batch.is_none_or(|b| b >= 1), "--max-batch must be at least 1");
    anyhow::ensure!(args.request_timeout_s >= 1, "--request-timeout-s must be at least 1");
    let adapter_dir = args
        .adapter_dir
        .as_ref()
        .map(|d| d.canonicalize().with_context(|| format!("--adapter-dir {}: no such folder", d.display())))
        .transpose()?;
    let served_model_name = args.served_model_name.clone().unwrap_or_else(|| args.model.clone());
    anyhow::ensure!(
        adapters.iter().all(|(name, _)| *name != served_model_name),
        "--adapter {served_model_name}=...: that is the base model's name"
    );
    let options = ServeOptions {
        served_model_name,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_bytes,
        max_tokens: args.max_tokens,
        request_timeout: Duration::from_secs(args.request_timeout_s),
        adapter_dir,
    };
    let pending = adapters
        .iter()
        .map(|(name, dir)| {
            lora_ft::peft_adapter::read_adapter_spec(dir)
                .with_context(|| format!("--adapter {name}={}", dir.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (model, tokenizer, stop) = load_base(&args.model, &args.loading)?;
    let context = model.config().max_position_embeddings;
    if let Some(n) = args.max_model_len {
        anyhow::ensure!(
            (2..=context).contains(&n),
            "--max-model-len {n}: the model's context is {context} positions (and a reply needs 2 at least)"
        );
    }
    let cpu = (context.min(DEFAULT_MAX_MODEL_LEN), DEFAULT_MAX_BATCH);
    let (max_seq_len, max_batch) = plan_serving(
        &model,
        &args.loading,
        &pending,
        ((args.max_model_len, args.max_batch), cpu),
        args.max_prefill_tokens,
        "pass a shorter --max-model-len",
    )?;
    let config = EngineConfig {
        max_batch,
        max_seq_len,
        enforce_eager: args.enforce_eager,
        max_prefill_tokens: args.max_prefill_tokens,
    };
    let engine =
        Engine::start(model, tokenizer.tokenizer().clone(), stop, config).context("starting the engine")?;
    tracing::info!("{max_batch} sequences of at most {max_seq_len} positions at a time");
    for (name, dir) in &adapters {
        engine.add_adapter(name, dir).with_context(|| format!("--adapter {name}={}", dir.display()))?;
        tracing::info!("adapter {name} from {}", dir.display());
    }
    let state = AppState::new(engine, tokenizer, options);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        if args.api_key.is_none() && !addr.ip().is_loopback() {
            tracing::warn!("listening on {addr} without --api-key: anyone who reaches it may use the model");
        }
        // the line tests and scripts wait for: the server takes requests from now on
        println!("listening on http://{addr}");
        std::io::Write::flush(&mut std::io::stdout())?;
        let shutdown = async {
            stop_signal().await;
            tracing::info!("stopping: finishing the requests in flight");
        };
        lora_ft::serve::serve(listener, state, shutdown).await
    })
}

/// Ctrl-C, or (on Unix) SIGTERM as a service manager or `docker stop` sends it.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
