//! `lora-ft train CONFIG --trace DIR`: what another trainer needs to replay this run exactly —
//! the initial adapter and every micro-batch in training order, plus the evaluation batches — so
//! the reference stack (transformers + PEFT) can be compared with lora-ft step for step
//! (scripts/convergence/).
//!
//! DIR/initial_adapter/   the adapter before the first step, in PEFT's layout
//! DIR/train_batches.jsonl one line per micro-batch: step (1-based), micro, batch_size, seq_len,
//!                         input_ids and labels (row-major, labels -100 where nothing is trained)
//! DIR/eval_batches.jsonl  the evaluation set's batches, in evaluation order

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::data::{Batch, BatchLoader};
use crate::model::{CausalLm, LoraSpec};
use crate::peft_adapter::save_adapter;

#[derive(Serialize)]
struct BatchLine<'a> {
    step: usize,
    micro: usize,
    batch_size: usize,
    seq_len: usize,
    input_ids: &'a [u32],
    labels: &'a [i64],
}

/// An open trace: the batch file stays open for the whole run.
pub struct Trace {
    path: PathBuf,
    train_batches: BufWriter<File>,
}

impl Trace {
    /// Writes the initial adapter and the evaluation batches, and opens the training batch file.
    pub fn start(
        dir: &Path,
        model: &CausalLm,
        spec: &LoraSpec,
        base_model: &str,
        eval: Option<&BatchLoader>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating trace folder {}", dir.display()))?;
        save_adapter(model, spec, base_model, &dir.join("initial_adapter"))?;
        if let Some(loader) = eval {
            let mut out = create(&dir.join("eval_batches.jsonl"))?;
            for (i, batch) in loader.epoch(0, 0).enumerate() {
                write_batch(&mut out, 0, i, &batch)?;
            }
            out.flush()?;
        }
        let path = dir.join("train_batches.jsonl");
        Ok(Self { train_batches: create(&path)?, path })
    }

    /// Records the micro-batches of optimizer step `step` (1-based).
    pub fn record(&mut self, step: usize, micro_batches: &[Batch]) -> anyhow::Result<()> {
        for (m, batch) in micro_batches.iter().enumerate() {
            write_batch(&mut self.train_batches, step, m, batch)
                .with_context(|| format!("writing {}", self.path.display()))?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.train_batches.flush().with_context(|| format!("writing {}", self.path.display()))
    }
}

fn create(path: &Path) -> anyhow::Result<BufWriter<File>> {
    Ok(BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?))
}

fn write_batch(out: &mut impl Write, step: usize, micro: usize, b: &Batch) -> anyhow::Result<()> {
    let line = BatchLine {
        step,
        micro,
        batch_size: b.batch_size,
        seq_len: b.seq_len,
        input_ids: &b.input_ids,
        labels: &b.labels,
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")?;
    Ok(())
}
