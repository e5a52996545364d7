//! What a run reports while it trains: a JSONL metrics file (one object per logged step or
//! evaluation), TensorBoard event files where `train.report_to` asks (`tensorboard/`), and a
//! progress bar with loss, learning rate, tokens/s and ETA.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::records::{EvalRecord, StepRecord};
use super::tensorboard::TensorBoard;
use crate::durable::Writing;

/// Whether a non-empty file's last byte is not a newline.
fn ends_torn(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Ok(false);
    }
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0u8];
    file.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

pub struct MetricsLog {
    /// None on ranks other than 0, which write nothing.
    out: Option<BufWriter<File>>,
    path: PathBuf,
    bar: ProgressBar,
    /// A log line per step instead of the progress bar (a rank's stderr is a pipe).
    lines: bool,
    /// `train.report_to = ["tensorboard"]`: the same records as events (rank 0).
    tensorboard: Option<TensorBoard>,
}

impl MetricsLog {
    /// Appends to `path` (a resumed run continues the same file).
    pub fn open(path: &Path, total_steps: usize, start_step: usize) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let bar = ProgressBar::new(total_steps as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} steps [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .expect("static template"),
        );
        bar.set_position(start_step as u64);
        let mut out = BufWriter::new(file);
        // a run killed mid-write leaves a torn last line: end it, so the resumed run's first
        // record starts a line of its own instead of being lost with the torn one
        if ends_torn(path).with_context(|| format!("reading {}", path.display()))? {
            out.write_all(b"\n").with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(Self { out: Some(out), path: path.to_path_buf(), bar, lines: false, tensorboard: None })
    }

    /// Rank 0 of several: the same file, and a log line per logged step (the launcher passes
    /// the ranks' stderr on, where a progress bar cannot draw).
    pub fn with_log_lines(mut self) -> Self {
        self.bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        self.lines = true;
        self
    }

    /// The other ranks: nothing written, nothing shown.
    pub fn silent() -> Self {
        Self { out: None, path: PathBuf::new(), bar: ProgressBar::hidden(), lines: false, tensorboard: None }
    }

    /// Every record also written to `tensorboard`.
    pub fn with_tensorboard(mut self, tensorboard: TensorBoard) -> Self {
        self.tensorboard = Some(tensorboard);
        self
    }

    pub fn step(&mut self, r: &StepRecord) -> anyhow::Result<()> {
        let message =
            format!("loss {:.4} lr {:.2e} |g| {:.3} {:.0} tok/s", r.loss, r.lr, r.grad_norm, r.tokens_per_s);
        if self.lines {
            tracing::info!("step {}/{}: {message}", r.step, self.bar.length().unwrap_or(0));
        }
        self.bar.set_position(r.step as u64);
        self.bar.set_message(message);
        self.write(r)?;
        self.tensorboard.as_mut().map_or(Ok(()), |tb| tb.step(r))
    }

    pub fn eval(&mut self, r: &EvalRecord) -> anyhow::Result<()> {
        self.println(format!("step {}: eval loss {:.4}, perplexity {:.2}", r.step, r.eval_loss, r.eval_ppl));
        self.write(r)?;
        self.tensorboard.as_mut().map_or(Ok(()), |tb| tb.eval(r))
    }

    /// A line above the progress bar; a log line instead where the bar is not drawn (ranks of
    /// several, stderr not a terminal).
    pub fn println(&self, line: impl AsRef<str>) {
        if self.lines || (self.out.is_some() && self.bar.is_hidden()) {
            tracing::info!("{}", line.as_ref());
        }
        self.bar.println(line.as_ref());
    }

    fn write(&mut self, record: &impl Serialize) -> anyhow::Result<()> {
        let Some(out) = self.out.as_mut() else { return Ok(()) };
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        out.write_all(&line).and_then(|()| out.flush()).with_context(|| Writing(self.path.clone()))
    }

    pub fn finish(&self) {
        self.bar.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(step: usize) -> EvalRecord {
        EvalRecord { step, eval_loss: 1.0, eval_ppl: 1.0_f64.exp(), eval_tokens: 10 }
    }

    /// A resumed run appends after a torn last line on a line of its own; a whole file and an
    /// empty one get nothing extra.
    #[test]
    fn a_resumed_log_starts_its_first_record_on_a_new_line() {
        let dir = std::env::temp_dir().join(format!("lora-ft-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (before, want_prefix) in
            [("{\"step\":3,\"lo", "{\"step\":3,\"lo\n"), ("{\"step\":3}\n", "{\"step\":3}\n"), ("", "")]
        {
            let path = dir.join("metrics.jsonl");
            std::fs::write(&path, before).unwrap();
            let mut log = MetricsLog::open(&path, 10, 3).unwrap();
            log.eval(&eval(4)).unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let rest = text.strip_prefix(want_prefix).unwrap_or_else(|| panic!("{text:?}"));
            assert!(
                rest.starts_with("{\"step\":4,") && rest.ends_with("}\n") && rest.lines().count() == 1,
                "{text:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
