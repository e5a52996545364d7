//! The decoding engine: requests (a prompt, its sampling settings, n samples, an adapter by
//! name) go to one thread that owns the batch and runs the scheduler (continuous batching over
//! KV caches that each sequence holds, `scheduler.rs`); each request's tokens, text and end come
//! back on its own channel as they are made. Several adapters are served over one base: an
//! adapter is a copy of the model's layers sharing their base weights, loaded or dropped while
//! the engine runs.

mod constraint;
#[cfg(test)]
mod constraint_tests;
#[cfg(all(test, feature = "cuda"))]
mod cuda_tests;
mod request;
pub mod scheduler;
mod sequence;
mod step_graphs;
#[cfg(test)]
mod tests;
pub mod text;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use anyhow::Context;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::generate::sampling::Sampler;
use crate::model::{CausalLm, DecoderLayer};
pub use request::{Event, Request, SubmitError};
use scheduler::{validate, Scheduler};
use sequence::Job;
use text::ReplyText;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sequences decoded together at most (the KV cache's slots).
    pub max_batch: usize,
    /// Positions a sequence may reach, prompt and reply (the KV cache's slot length); the
    /// model's context at most.
    pub max_seq_len: usize,
    /// Every decode step launched kernel by kernel, none replayed from a recorded CUDA graph
    /// (vLLM's `--enforce-eager`): slower at small batches, for checking the graphs.
    pub enforce_eager: bool,
    /// Prompt tokens one prefill forward takes at most (`Scheduler::limit_prefill`); `None`:
    /// `plan::serving::PREFILL_TOKENS`.
    pub max_prefill_tokens: Option<usize>,
}

/// A handle to the engine's thread; clones share it. The thread ends when the last handle goes.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    model: Arc<CausalLm>,
    jobs: std::sync::mpsc::Sender<(Job, Vec<Sampler>)>,
    adapters: RwLock<BTreeMap<String, Arc<Vec<DecoderLayer>>>>,
    max_seq_len: usize,
}

impl Engine {
    /// Starts the engine's thread over `model` (with any adapter it carries as its own), the
    /// text decoded with `tokenizer`, replies ended by `stop_ids`.
    pub fn start(
        model: CausalLm,
        tokenizer: Tokenizer,
        stop_ids: Vec<u32>,
        config: EngineConfig,
    ) -> anyhow::Result<Self> {
        let model = Arc::new(model);
        let max_seq_len = config.max_seq_len.clamp(1, model.config().max_position_embeddings);
        let (jobs, queue) = std::sync::mpsc::channel::<(Job, Vec<Sampler>)>();
        let (ready, started) = std::sync::mpsc::channel::<anyhow::Result<()>>();
        let own = model.clone();
        std::thread::Builder::new()
            .name("lora-ft-engine".into())
            .spawn(move || run(&own, &tokenizer, stop_ids, (config, max_seq_len), &queue, ready))
            .context("starting the engine's thread")?;
        started.recv().context("the engine's thread ended while starting")??;
        let inner = Inner { model, jobs, adapters: RwLock::new(BTreeMap::new()), max_seq_len };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Queues a request; its events come on the returned channel, and dropping the channel
    /// cancels it (its place in the batch goes to the next request).
    pub fn submit(&self, request: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let layers = match &request.adapter {
            None => None,
            Some(name) => Some(
                self.inner
                    .adapters
                    .read()
                    .map_err(|_| SubmitError::Stopped)?
                    .get(name)
                    .cloned()
                    .ok_or_else(|| SubmitError::UnknownAdapter(name.clone()))?,
            ),
        };
        let samplers = validate(&request, self.max_context(), true)?;
        let (sink, events) = unbounded_channel();
        self.inner.jobs.send((Job::of(request, layers, sink), samplers)).map_err(|_| SubmitError::Stopped)?;
        Ok(events)
    }

    /// Loads the PEFT adapter in `dir` as `name` (checked against the model as `--adapter` is);
    /// an error where the name is taken.
    pub fn add_adapter(&self, name: &str, dir: &Path) -> anyhow::Result<()> {
        anyhow::ensure!(!name.is_empty(), "an adapter needs a name");
        anyhow::ensure!(
            !self.adapters().iter().any(|a| a == name),
            "an adapter named {name:?} is loaded already (unload it first)"
        );
        let (_, layers) = crate::peft_adapter::adapter_layers(&self.inner.model, dir)
            .with_context(|| format!("loading adapter {name:?} from {}", dir.display()))?;
        let mut adapters =
            self.inner.adapters.write().map_err(|_| anyhow::anyhow!("the adapter table is poisoned"))?;
        anyhow::ensure!(
            !adapters.contains_key(name),
            "an adapter named {name:?} is loaded already (unload it first)"
        );
        adapters.insert(name.to_string(), Arc::new(layers));
        Ok(())
    }

    /// Drops adapter `name`; requests already running on it finish on it.
    pub fn remove_adapter(&self, name: &str) -> anyhow::Result<()> {
        let mut adapters =
            self.inner.adapters.write().map_err(|_| anyhow::anyhow!("the adapter table is poisoned"))?;
        adapters.remove(name).map(|_| ()).with_context(|| format!("no adapter named {name:?} is loaded"))
    }

    /// The loaded adapters' names, sorted.
    pub fn adapters(&self) -> Vec<String> {
        self.inner.adapters.read().map(|a| a.keys().cloned().collect()).unwrap_or_default()
    }

    /// Positions a prompt and its reply reach together at most (`EngineConfig::max_seq_len`).
    pub fn max_context(&self) -> usize {
        self.inner.max_seq_len
    }
}

/// The engine's thread: allocates the KV cache (`ready` says whether it could), then waits for
/// work when there is none, else takes what came and steps.
fn run(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    stop_ids: Vec<u32>,
    (config, max_seq_len): (EngineConfig, usize),
    queue: &std::sync::mpsc::Receiver<(Job, Vec<Sampler>)>,
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
) {
    let text = ReplyText::new(tokenizer);
    let shape = (config.max_batch, max_seq_len);
    let scheduler = bind_device(model).and_then(|()| Scheduler::new(model, Some(&text), stop_ids, shape));
    let mut scheduler = match scheduler {
        Ok(mut s) => {
            if config.enforce_eager {
                s.enforce_eager();
            }
            if let Some(tokens) = config.max_prefill_tokens {
                s.limit_prefill(tokens);
            }
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    loop {
        if scheduler.is_idle() {
            match queue.recv() {
                Ok((job, samplers)) => scheduler.enqueue(job, samplers),
                Err(_) => return,
            }
        }
        while let Ok((job, samplers)) = queue.try_recv() {
            scheduler.enqueue(job, samplers);
        }
        if let Err(e) = scheduler.step() {
            tracing::error!("the engine's step failed: {e:#}");
            scheduler.fail_all(&format!("{e:#}"));
        }
    }
}

/// Makes the model's GPU current on this thread (nothing on the CPU).
fn bind_device(model: &CausalLm) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(d) = model.device() {
        d.cuda_stream().context().bind_to_thread().context("making the GPU current for the engine")?;
    }
    let _ = model;
    Ok(())
}
