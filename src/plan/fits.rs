//! What fits a budget: the largest batch and the longest rows a card holds, and the check that a
//! configured run does.

use super::estimate::estimate;
use super::shape::RunShape;
use crate::arch::ModelConfig;

/// The largest batch at `seq` whose predicted peak is at most `budget` bytes (0 if none).
pub fn largest_batch(m: &ModelConfig, run: &RunShape, seq: usize, budget: u64) -> usize {
    largest_where(1 << 20, |batch| estimate(m, run, (seq, batch)).peak() <= budget)
}

/// The largest n in [0, limit) with `fits(n)`, for `fits` true up to some n and false after (the
/// peak grows with the tokens); 0 when only 0 fits.
fn largest_where(limit: usize, fits: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, limit);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The longest sequence (a multiple of 64) whose predicted peak at `batch` is within `budget`.
pub(super) fn longest_seq(m: &ModelConfig, run: &RunShape, batch: usize, budget: u64) -> usize {
    // in units of 64 tokens, up to 2^20
    64 * largest_where(1 << 14, |units| estimate(m, run, (units * 64, batch)).peak() <= budget)
}

/// The longest row at batch 1 whose predicted peak is within each `(card, budget bytes)`, up
/// to the model's positions, as `lora-ft estimate` prints it.
pub fn longest_rows(m: &ModelConfig, run: &RunShape, cards: &[(&str, u64)]) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out =
        format!("longest row at batch 1 (the model takes {} positions):\n", m.max_position_embeddings);
    for &(card, budget) in cards {
        let by_memory = longest_seq(m, run, 1, budget);
        let seq = by_memory.min(m.max_position_embeddings);
        let mut line = match seq {
            0 => "none fits".to_string(),
            s => format!("{s:>7} tokens   (peak {:.2} GiB)", gib(estimate(m, run, (s, 1)).peak())),
        };
        if by_memory > seq {
            line += &format!(", memory alone would take {by_memory}");
        }
        out += &format!("  {card:<6} card, budget {:>5.2} GiB: {line}\n", gib(budget));
    }
    out
}

/// `Err` with settings that fit when the predicted peak at (seq, batch) is over `budget`.
pub fn check_fits(
    m: &ModelConfig,
    run: &RunShape,
    (seq, batch): (usize, usize),
    budget: u64,
) -> Result<(), String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let peak = estimate(m, run, (seq, batch)).peak();
    if peak <= budget {
        return Ok(());
    }
    let over = format!(
        "predicted peak GPU memory {:.2} GiB at batch {batch} x {seq} tokens is over the budget of {:.2} GiB \
         (train.max_vram_fraction of the card)",
        gib(peak),
        gib(budget)
    );
    let (b, s) = (largest_batch(m, run, seq, budget), longest_seq(m, run, batch, budget));
    Err(match (b, s) {
        (0, 0) => format!("{over}; not even batch 1 x 64 fits: use quantization = \"nf4\", fewer target modules, or a larger card"),
        (0, s) => format!("{over}; data.max_seq_len = {s} fits at batch 1 (`lora-ft estimate CONFIG` shows the parts)"),
        (b, s) => format!(
            "{over}; what fits: train.batch_size = {b} (and train.grad_accum for the same effective batch), or \
             data.max_seq_len = {s} at batch {batch} (`lora-ft estimate CONFIG` shows the parts)"
        ),
    })
}
