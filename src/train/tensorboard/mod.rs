//! `train.report_to = ["tensorboard"]`: TensorBoard event files in `<output.dir>/tb/`, beside
//! metrics.jsonl, with the same numbers: per logged step `train/loss`, `train/learning_rate`,
//! `train/grad_norm`, `train/loss_scale`, `train/epoch`, `train/tokens_per_s` and on a GPU
//! `gpu/memory_allocated_gib` and `gpu/memory_peak_gib`; per evaluation `eval/loss` and
//! `eval/perplexity`; at the start the run's config as the text `config` (TOML).
//!
//! Each run, a resumed one too, writes a new file (TensorBoard reads a folder's files as one
//! run, in name order: time order, to the second); earlier files are never opened for writing. A
//! resumed run starts its file with a restart marker at its first step, so TensorBoard drops
//! what the earlier run logged after its checkpoint, as metrics.jsonl's later line for a step
//! wins. Every record is written with one `write` and nothing is buffered.
//!
//! - `record.rs`: TFRecord framing and its masked CRC32C.
//! - `event.rs`: the `tensorflow.Event` protobuf, encoded by hand (README: Dependencies).
//! - `read.rs`: reading the files back, for the tests.

mod event;
pub mod read;
pub mod record;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::records::{EvalRecord, StepRecord};
use crate::config::Config;
use crate::durable::Writing;
use event::What;

/// The file-version string of the first event: the Event format TensorBoard reads today.
const FILE_VERSION: &str = "brain.Event:2";

pub struct TensorBoard {
    file: File,
    path: PathBuf,
}

impl TensorBoard {
    /// A new event file in `dir` (created if needed) for a run that starts at step `start`: the
    /// file version, a restart marker if `start` > 0, and `config` as the text `config`.
    pub fn create(dir: &Path, start: usize, config: &Config) -> anyhow::Result<Self> {
        let toml = toml::to_string(config).context("the config as TOML for TensorBoard")?;
        let mut tb = Self::create_file(dir)?;
        tb.write(start, &What::FileVersion(FILE_VERSION))?;
        if start > 0 {
            // the earlier run may have logged steps after its checkpoint: this run logs them again
            tb.write(start + 1, &What::SessionStart)?;
        }
        tb.write(start, &What::Text { tag: "config", text: &format!("```toml\n{toml}```\n") })?;
        Ok(tb)
    }

    /// `events.out.tfevents.<unix seconds>.<host>.<pid>.<n>`, the first `n` whose file does not
    /// exist (`create_new`: an earlier run's file is never truncated).
    fn create_file(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let seconds =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let stem = format!("events.out.tfevents.{seconds}.{}.{}", hostname(), std::process::id());
        let mut n = 0;
        loop {
            let path = dir.join(format!("{stem}.{n}"));
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => return Ok(Self { file, path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn step(&mut self, r: &StepRecord) -> anyhow::Result<()> {
        let mut scalars = vec![
            ("train/loss", r.loss as f32),
            ("train/learning_rate", r.lr as f32),
            ("train/grad_norm", r.grad_norm as f32),
            ("train/loss_scale", r.loss_scale as f32),
            ("train/epoch", r.epoch as f32),
            ("train/tokens_per_s", r.tokens_per_s as f32),
        ];
        if let Some(gib) = r.gpu_allocated_gib {
            scalars.push(("gpu/memory_allocated_gib", gib as f32));
        }
        if let Some(gib) = r.gpu_peak_gib {
            scalars.push(("gpu/memory_peak_gib", gib as f32));
        }
        self.write(r.step, &What::Scalars(&scalars))
    }

    pub fn eval(&mut self, r: &EvalRecord) -> anyhow::Result<()> {
        let scalars = [("eval/loss", r.eval_loss as f32), ("eval/perplexity", r.eval_ppl as f32)];
        self.write(r.step, &What::Scalars(&scalars))
    }

    fn write(&mut self, step: usize, what: &What) -> anyhow::Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let record = record::frame(&event::encode(now, step as i64, what));
        self.file.write_all(&record).with_context(|| Writing(self.path.clone()))
    }
}

/// This machine's name, for the file name as TensorBoard's writers put it there; "localhost"
/// where the system does not say.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let name = buf.iter().position(|&b| b == 0).map(|end| String::from_utf8_lossy(&buf[..end]).into_owned());
    match name.filter(|n| ok && !n.is_empty()) {
        Some(n) => n.replace(['/', '\\'], "_"),
        None => "localhost".into(),
    }
}
