//! `lora-ft data check`: what training would see in a data file, before spending GPU time on it.

use std::fmt::Write;
use std::path::Path;

use std::sync::Arc;

use super::masking::EncodedConversation;
use super::{
    read_conversations, row_name, BatchLoader, ChatTokenizer, Example, PadTo, TokenizedDataset, IGNORE_INDEX,
};
use crate::config::{BatchSize, Config, TruncationSide};

const OPEN: &str = "[[";
const CLOSE: &str = "]]";

/// Reads `file` with the tokenizer in `tokenizer_dir` and the `[data]` settings of `cfg`, and
/// returns a report: counts, token-length percentiles, truncated and dropped rows, the batch
/// lengths and padding of an epoch (unpacked, a fixed batch size), and the first kept
/// conversation rendered with its trained tokens marked.
pub fn data_check(file: &Path, cfg: &Config, tokenizer_dir: &Path) -> anyhow::Result<String> {
    let tokenizer = ChatTokenizer::load(tokenizer_dir, cfg.model.chat_template.as_deref())?
        .with_system_message(cfg.data.system_message);
    let conversations = read_conversations(file, cfg.data.format)?;
    let (max_len, side) = (cfg.data.max_seq_len, cfg.data.truncation_side);
    let mut dataset = TokenizedDataset::from_conversations(file, &conversations, &tokenizer, max_len, side)?;
    // shared with the batch order below rather than copied
    let examples = Arc::new(std::mem::take(&mut dataset.examples));
    let s = &dataset.stats;
    let mut out = String::new();
    let side_name = match side {
        TruncationSide::Right => "right",
        TruncationSide::Left => "left",
    };
    let _ = writeln!(out, "data check: {}", file.display());
    let _ = writeln!(out, "conversations: {}", s.rows);
    let mut roles = [("system", 0), ("user", 0), ("assistant", 0)];
    for m in conversations.iter().flat_map(|c| &c.messages) {
        roles.iter_mut().filter(|(r, _)| *r == m.role).for_each(|(_, n)| *n += 1);
    }
    let roles: Vec<String> = roles.iter().map(|(r, n)| format!("{r} {n}")).collect();
    let _ = writeln!(out, "messages: {}", roles.join(", "));
    let _ = writeln!(out, "tokens per conversation (before truncation): {}", percentiles(&s.lengths));
    let _ = writeln!(out, "max_seq_len: {max_len}, truncation_side: {side_name}");
    let _ = writeln!(out, "truncated: {} of {} rows longer than max_seq_len", s.truncated, s.rows);
    let _ = writeln!(out, "dropped: {} rows with no trained token left after truncation", s.dropped);
    let share = 100.0 * s.trained_tokens as f64 / s.tokens.max(1) as f64;
    let _ = writeln!(
        out,
        "kept: {} rows, {} tokens, {} trained ({share:.1}%)",
        examples.len(),
        s.tokens,
        s.trained_tokens
    );
    if let (BatchSize::Fixed(batch), false) = (cfg.train.batch_size, cfg.data.packing) {
        let epoch = |multiple| {
            let to = PadTo { multiple, most: max_len };
            padding(&examples, batch, (cfg.train.seed, cfg.data.group_by_length), to)
        };
        let multiple = cfg.data.pad_to_multiple_of;
        let (lengths, share) = epoch(multiple);
        let _ = write!(
            out,
            "batches of {batch} (one epoch, one GPU): {lengths} lengths, padding {:.1}% of the tokens computed \
             (pad_to_multiple_of = {multiple})",
            100.0 * share
        );
        if multiple > 1 {
            let (lengths, share) = epoch(1);
            let _ = write!(out, "; to the longest row only: {lengths} lengths, {:.1}%", 100.0 * share);
        }
        let _ = writeln!(out, " (on a GPU each new length builds attention graphs, ~0.1 s)");
    }
    if let Some(&line) = dataset.lines.first() {
        let conv = conversations.iter().find(|c| c.line == line).expect("kept rows come from conversations");
        let encoded = tokenizer.encode_with_offsets(&conv.messages, conv.tools.as_deref())?;
        let _ = writeln!(
            out,
            "\nexample ({}); trained tokens (assistant replies and their end-of-turn token) \
             are between {OPEN} and {CLOSE}:",
            row_name(file, line)
        );
        out.push_str(&mark_trained(&encoded, max_len, side));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// One epoch's batches of `batch` rows in training's order (`seed`, `group_by_length`), padded
/// as `to` says: how many lengths they have, and the padding's share of the tokens computed.
fn padding(
    examples: &Arc<Vec<Example>>,
    batch: usize,
    (seed, grouped): (u64, bool),
    to: PadTo,
) -> (usize, f64) {
    let loader = BatchLoader::new(Arc::clone(examples), batch, 0, Some(seed)).grouped_by_length(grouped);
    let (mut lengths, mut computed, mut real) = (std::collections::BTreeSet::new(), 0usize, 0usize);
    for rows in loader.epoch_order(0).chunks(batch) {
        let len = to.len(rows.iter().map(|&i| examples[i].len()).max().unwrap_or(0));
        lengths.insert(len);
        computed += len * rows.len();
        real += rows.iter().map(|&i| examples[i].len()).sum::<usize>();
    }
    (lengths.len(), if computed == 0 { 0.0 } else { 1.0 - real as f64 / computed as f64 })
}

/// `lora-ft data tokenize`: every kept row of `file` exactly as training reads it (rendered,
/// masked, truncated; rows left with nothing to train dropped), one JSON line each:
/// `{"line": N, "input_ids": [...], "labels": [...]}` with -100 for untrained positions. Other
/// stacks can train on the same tokens (scripts/bench/trl_sft_ref.py), and users can see them.
/// Returns how many rows were written.
pub fn data_tokenize(
    file: &Path,
    cfg: &Config,
    tokenizer_dir: &Path,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<usize> {
    let tokenizer = ChatTokenizer::from_dir(tokenizer_dir)?.with_system_message(cfg.data.system_message);
    let (max_len, side) = (cfg.data.max_seq_len, cfg.data.truncation_side);
    let dataset = TokenizedDataset::from_file(file, cfg.data.format, &tokenizer, max_len, side)?;
    for (example, line) in dataset.examples.iter().zip(&dataset.lines) {
        let row = serde_json::json!({"line": line, "input_ids": example.input_ids, "labels": example.labels});
        writeln!(out, "{row}")?;
    }
    Ok(dataset.examples.len())
}

/// Nearest-rank percentiles of the token lengths.
fn percentiles(lengths: &[usize]) -> String {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let Some(&max) = sorted.last() else {
        return "none".into();
    };
    let rank =
        |p: f64| sorted[((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    format!(
        "min {}, p50 {}, p90 {}, p95 {}, p99 {}, max {max}",
        sorted[0],
        rank(50.0),
        rank(90.0),
        rank(95.0),
        rank(99.0)
    )
}

/// The rendered text with trained tokens wrapped in markers; text that truncation cuts off is
/// replaced by a note saying how many tokens were cut.
fn mark_trained(encoded: &EncodedConversation, max_len: usize, side: TruncationSide) -> String {
    let EncodedConversation { text, offsets, example } = encoded;
    let n = offsets.len();
    let kept = match side {
        _ if n <= max_len => 0..n,
        TruncationSide::Right => 0..max_len,
        TruncationSide::Left => n - max_len..n,
    };
    let mut out = String::new();
    if kept.start > 0 {
        let _ = write!(out, "[... {} tokens cut by truncation ...]", kept.start);
    }
    let Some(&(first, _)) = offsets.get(kept.start) else {
        return out;
    };
    let (mut written, mut end, mut inside) = (char_floor(text, first), first, false);
    for t in kept.clone() {
        let (a, b) = offsets[t];
        let trained = example.labels[t] != IGNORE_INDEX;
        if trained != inside {
            // Byte-level BPE may split a character over tokens that share its offsets.
            let at = char_floor(text, a.max(written));
            out.push_str(&text[written..at]);
            out.push_str(if trained { OPEN } else { CLOSE });
            (written, inside) = (at, trained);
        }
        end = end.max(b);
    }
    out.push_str(&text[written..char_floor(text, end).max(written)]);
    if inside {
        out.push_str(CLOSE);
    }
    if kept.end < n {
        let _ = write!(out, "[... {} tokens cut by truncation ...]", n - kept.end);
    }
    out
}

fn char_floor(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of 5..=10 tokens one a batch: six lengths unpadded; to a multiple of 4, 8 and 12
    /// (never past 11, the longest allowed, but not below a row either).
    #[test]
    fn padding_counts_an_epochs_lengths_and_padded_share() {
        let rows: Arc<Vec<Example>> = Arc::new(
            (5..=10)
                .map(|n| Example { input_ids: vec![1; n], labels: vec![1; n], ..Default::default() })
                .collect(),
        );
        let (lengths, share) = padding(&rows, 1, (7, false), PadTo { multiple: 1, most: 11 });
        assert_eq!((lengths, share), (6, 0.0));
        let (lengths, share) = padding(&rows, 1, (7, false), PadTo { multiple: 4, most: 11 });
        // 5..=8 -> 8, 9 and 10 -> 11: 4 x 8 + 2 x 11 = 54 computed for 45 real
        assert_eq!(lengths, 2);
        assert!((share - 9.0 / 54.0).abs() < 1e-12, "{share}");
        // the whole set in one batch: one length, the longest row
        let (lengths, share) = padding(&rows, 6, (7, false), PadTo { multiple: 1, most: 11 });
        assert_eq!(lengths, 1);
        assert!((share - 15.0 / 60.0).abs() < 1e-12, "{share}");
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let lengths: Vec<usize> = (1..=100).rev().collect();
        assert_eq!(percentiles(&lengths), "min 1, p50 50, p90 90, p95 95, p99 99, max 100");
        assert_eq!(percentiles(&[7]), "min 7, p50 7, p90 7, p95 7, p99 7, max 7");
        assert_eq!(percentiles(&[]), "none");
    }

    fn encoded() -> EncodedConversation {
        // "U:hi A:yo." tokenized as "U:", "hi", " A:", "yo", "." with "yo." trained.
        EncodedConversation {
            text: "U:hi A:yo.".into(),
            offsets: vec![(0, 2), (2, 4), (4, 7), (7, 9), (9, 10)],
            example: Example {
                input_ids: vec![1, 2, 3, 4, 5],
                labels: vec![-100, -100, -100, 4, 5],
                ..Default::default()
            },
        }
    }

    #[test]
    fn marks_trained_tokens_and_truncation() {
        assert_eq!(mark_trained(&encoded(), 8, TruncationSide::Right), "U:hi A:[[yo.]]");
        assert_eq!(
            mark_trained(&encoded(), 4, TruncationSide::Right),
            "U:hi A:[[yo]][... 1 tokens cut by truncation ...]"
        );
        assert_eq!(
            mark_trained(&encoded(), 3, TruncationSide::Left),
            "[... 2 tokens cut by truncation ...] A:[[yo.]]"
        );
    }
}
