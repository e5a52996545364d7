//! Batches: rows padded on the right to the longest row of the batch (rounded up to a multiple of
//! `data.pad_to_multiple_of`), in an order shuffled per epoch from the seed, assembled ahead of
//! time on a background thread.
//!
//! Right padding keeps every real token at the same position as unpadded, so a causal mask
//! alone keeps real tokens from attending to padding; pad positions carry label -100. So the
//! loss and gradients do not depend on how far a batch is padded; its shape does, and each new
//! shape costs the GPU path one-time work (cuDNN's attention graphs, a checkpointing plan).

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{Example, IGNORE_INDEX};

/// How many assembled batches the prefetch thread may hold ahead of the consumer.
const PREFETCH: usize = 4;

/// Row-major `[batch_size, seq_len]` token ids and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub input_ids: Vec<u32>,
    pub labels: Vec<i64>,
    pub batch_size: usize,
    pub seq_len: usize,
    /// With packed rows (`data.packing`): per row, the lengths of its dialogues (a row of one
    /// dialogue lists its length; the padding after them is not listed). Empty otherwise.
    pub seq_lens: Vec<Vec<usize>>,
    /// The length `seq_len` was rounded up to a multiple of (1: none), which a rank's shard keeps.
    pub pad_multiple: usize,
}

/// How far a batch is padded: its longest row rounded up to a multiple of `multiple`, but not
/// past `most` (`data.max_seq_len`: the length the memory plan is for) nor below the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PadTo {
    pub multiple: usize,
    pub most: usize,
}

impl PadTo {
    /// The longest row only (no rounding).
    pub const LONGEST: PadTo = PadTo { multiple: 1, most: usize::MAX };

    /// The padded length of a batch whose longest row has `longest` tokens.
    pub fn len(&self, longest: usize) -> usize {
        longest.next_multiple_of(self.multiple.max(1)).min(self.most).max(longest)
    }
}

impl Batch {
    /// `bs` rows of `seq` uniformly random token ids below `vocab`, every position trained: the
    /// batches of `lora-ft bench train` and of the `batch_size = "auto"` probe, where the values
    /// do not matter but the shape does.
    pub fn random(vocab: u32, (seq, bs): (usize, usize), seed: u64) -> Self {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let input_ids: Vec<u32> = (0..seq * bs).map(|_| rng.random_range(0..vocab)).collect();
        let labels = input_ids.iter().map(|&i| i as i64).collect();
        Self { input_ids, labels, batch_size: bs, seq_len: seq, seq_lens: Vec::new(), pad_multiple: 1 }
    }
}

impl Batch {
    /// The rows padded to the longest of them.
    pub fn from_examples(rows: &[&Example], pad_id: u32) -> Self {
        Self::padded(rows, pad_id, PadTo::LONGEST)
    }

    /// The rows padded to `to.len(longest row)`.
    pub fn padded(rows: &[&Example], pad_id: u32, to: PadTo) -> Self {
        let seq_len = to.len(rows.iter().map(|r| r.len()).max().unwrap_or(0));
        let mut input_ids = Vec::with_capacity(rows.len() * seq_len);
        let mut labels = Vec::with_capacity(rows.len() * seq_len);
        for row in rows {
            input_ids.extend_from_slice(&row.input_ids);
            input_ids.resize(input_ids.len() + seq_len - row.len(), pad_id);
            labels.extend_from_slice(&row.labels);
            labels.resize(labels.len() + seq_len - row.len(), IGNORE_INDEX);
        }
        let packed = rows.iter().any(|r| !r.seq_lens.is_empty());
        let seq_lens = if packed {
            rows.iter()
                .map(|r| if r.seq_lens.is_empty() { vec![r.len()] } else { r.seq_lens.clone() })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            input_ids,
            labels,
            batch_size: rows.len(),
            seq_len,
            seq_lens,
            pad_multiple: to.multiple.max(1),
        }
    }

    /// Rows `rows` of the batch (one rank's shard of a global batch), cut after the last column
    /// any of them trains on, rounded up to the batch's `pad_multiple` (within its length). The
    /// columns cut are inputs only to later positions, which train nothing (causal attention),
    /// so the loss and the gradients are those of the uncut rows; the cut drops the padding the
    /// other ranks' longer rows brought.
    pub fn shard(&self, rows: std::ops::Range<usize>) -> Batch {
        let t = self.seq_len;
        let row = |r: usize| r * t..(r + 1) * t;
        let keep = rows
            .clone()
            .filter_map(|r| self.labels[row(r)].iter().rposition(|&l| l != IGNORE_INDEX))
            .max()
            .map_or(0, |last| PadTo { multiple: self.pad_multiple, most: t }.len(last + 1));
        let cut = |r: usize| r * t..r * t + keep;
        // a packed row's dialogues up to the cut (the last one cut short where the cut falls in it)
        let seq_lens = |r: usize| {
            let mut at = 0;
            let lens: &Vec<usize> = &self.seq_lens[r];
            lens.iter()
                .map_while(|&l| {
                    let kept = l.min(keep.saturating_sub(at));
                    at += l;
                    (kept > 0).then_some(kept)
                })
                .collect()
        };
        Batch {
            input_ids: rows.clone().flat_map(|r| self.input_ids[cut(r)].iter().copied()).collect(),
            labels: rows.clone().flat_map(|r| self.labels[cut(r)].iter().copied()).collect(),
            batch_size: rows.len(),
            seq_len: keep,
            seq_lens: if self.seq_lens.is_empty() {
                Vec::new()
            } else {
                rows.clone().map(seq_lens).collect()
            },
            pad_multiple: self.pad_multiple,
        }
    }

    /// Positions that contribute to the loss after the model's shift: labels[:, 1:] != -100.
    pub fn trained_tokens(&self) -> usize {
        if self.seq_len == 0 {
            return 0;
        }
        self.labels
            .chunks(self.seq_len)
            .map(|row| row[1..].iter().filter(|&&l| l != IGNORE_INDEX).count())
            .sum()
    }
}

/// Yields the batches of an epoch. The last batch of an epoch may be smaller.
pub struct BatchLoader {
    examples: Arc<Vec<Example>>,
    batch_size: usize,
    pad_id: u32,
    /// `None`: file order (evaluation); `Some(seed)`: a fresh permutation per epoch.
    shuffle_seed: Option<u64>,
    /// `data.group_by_length`: each epoch's order sorted by length within windows of batches.
    group_by_length: bool,
    /// `data.pad_to_multiple_of` up to `data.max_seq_len`.
    pad_to: PadTo,
}

impl BatchLoader {
    pub fn new(
        examples: Arc<Vec<Example>>,
        batch_size: usize,
        pad_id: u32,
        shuffle_seed: Option<u64>,
    ) -> Self {
        assert!(batch_size > 0, "batch_size must be at least 1 (config validation guarantees it)");
        Self { examples, batch_size, pad_id, shuffle_seed, group_by_length: false, pad_to: PadTo::LONGEST }
    }

    /// Pads each batch as `to` says (`data.pad_to_multiple_of`, `data.max_seq_len`).
    pub fn padded_to(mut self, to: PadTo) -> Self {
        self.pad_to = to;
        self
    }

    /// Sorts each epoch's rows by length within windows of batches (`data.group_by_length`).
    pub fn grouped_by_length(mut self, on: bool) -> Self {
        self.group_by_length = on;
        self
    }

    pub fn num_batches(&self) -> usize {
        self.examples.len().div_ceil(self.batch_size)
    }

    pub fn num_examples(&self) -> usize {
        self.examples.len()
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The row order of an epoch: a Fisher–Yates shuffle driven by SplitMix64 seeded with
    /// `seed + epoch`. Written out here rather than taken from `rand` so that the order — and
    /// so resuming from a checkpoint — never changes with a dependency upgrade.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.examples.len()).collect();
        if let Some(seed) = self.shuffle_seed {
            let mut rng = SplitMix64(seed.wrapping_add(epoch));
            for i in (1..order.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        if self.group_by_length {
            super::packing::group_by_length(&mut order, |i| self.examples[i].len(), self.batch_size);
        }
        order
    }

    /// The batches of `epoch` from batch index `start` on, assembled by a background thread.
    pub fn epoch(&self, epoch: u64, start: usize) -> EpochBatches {
        self.epoch_from_row(epoch, start * self.batch_size)
    }

    /// The batches of `epoch` from row `start_row` of its order on: where a run resumes whose
    /// batches had another size (a different number of ranks).
    pub fn epoch_from_row(&self, epoch: u64, start_row: usize) -> EpochBatches {
        let mut order = self.epoch_order(epoch);
        order.drain(..start_row.min(order.len()));
        let (examples, batch_size, pad_id, pad_to) =
            (Arc::clone(&self.examples), self.batch_size, self.pad_id, self.pad_to);
        let (tx, rx) = sync_channel(PREFETCH);
        let worker = std::thread::Builder::new()
            .name(format!("batches-epoch-{epoch}"))
            .spawn(move || {
                for chunk in order.chunks(batch_size) {
                    let rows: Vec<&Example> = chunk.iter().map(|&i| &examples[i]).collect();
                    // The consumer hung up (stopped early): nothing left to do.
                    if tx.send(Batch::padded(&rows, pad_id, pad_to)).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the batch prefetch thread");
        EpochBatches { rx: Some(rx), worker: Some(worker) }
    }
}

/// An iterator over prefetched batches; dropping it early stops the thread.
pub struct EpochBatches {
    rx: Option<Receiver<Batch>>,
    worker: Option<JoinHandle<()>>,
}

impl Iterator for EpochBatches {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        self.rx.as_ref()?.recv().ok()
    }
}

impl Drop for EpochBatches {
    fn drop(&mut self) {
        // Hang up first so a worker blocked on a full channel wakes up and exits.
        self.rx.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(ids: &[u32], labels: &[i64]) -> Example {
        Example { input_ids: ids.to_vec(), labels: labels.to_vec(), ..Default::default() }
    }

    #[test]
    fn pads_right_to_the_longest_row() {
        let a = row(&[5, 6, 7], &[-100, 6, 7]);
        let b = row(&[8], &[8]);
        let batch = Batch::from_examples(&[&a, &b], 0);
        assert_eq!((batch.batch_size, batch.seq_len), (2, 3));
        assert_eq!(batch.input_ids, [5, 6, 7, 8, 0, 0]);
        assert_eq!(batch.labels, [-100, 6, 7, 8, -100, -100]);
        // Row b's only label sits at position 0, which the shift never uses.
        assert_eq!(batch.trained_tokens(), 2);
    }

    /// `data.pad_to_multiple_of`: the longest row rounded up, never past `max_seq_len` nor below
    /// the row; the padding is the pad id with label -100, so the trained tokens do not change.
    #[test]
    fn pads_to_a_multiple_within_the_longest_allowed() {
        let to = PadTo { multiple: 4, most: 10 };
        assert_eq!([1, 4, 5, 8, 9, 10].map(|n| to.len(n)), [4, 4, 8, 8, 10, 10]);
        assert_eq!(PadTo { multiple: 64, most: 2048 }.len(2047), 2048);
        assert_eq!(PadTo::LONGEST.len(2047), 2047);
        // a row longer than `most` (never made by the data pipeline) is not cut
        assert_eq!(PadTo { multiple: 4, most: 10 }.len(11), 11);
        let a = row(&[5, 6, 7], &[-100, 6, 7]);
        let b = row(&[8], &[8]);
        let batch = Batch::padded(&[&a, &b], 0, to);
        assert_eq!((batch.batch_size, batch.seq_len, batch.pad_multiple), (2, 4, 4));
        assert_eq!(batch.input_ids, [5, 6, 7, 0, 8, 0, 0, 0]);
        assert_eq!(batch.labels, [-100, 6, 7, -100, 8, -100, -100, -100]);
        assert_eq!(batch.trained_tokens(), Batch::from_examples(&[&a, &b], 0).trained_tokens());
    }

    /// A shard's cut is rounded up to the batch's multiple, within the batch's length.
    #[test]
    fn a_padded_batchs_shard_is_cut_at_a_multiple() {
        let long = row(&[1, 2, 3, 4, 5, 6, 7], &[-100, 2, 3, 4, 5, 6, 7]);
        let short = row(&[7, 8, 9], &[-100, 8, -100]);
        let batch = Batch::padded(&[&long, &short], 0, PadTo { multiple: 4, most: 16 });
        assert_eq!(batch.seq_len, 8);
        // short's last trained column is 1: cut at 2, rounded up to 4
        let tail = batch.shard(1..2);
        assert_eq!((tail.seq_len, tail.input_ids.as_slice()), (4, &[7, 8, 9, 0][..]));
        assert_eq!(tail.pad_multiple, 4);
        // long trains up to column 6: 7 rounds to 8, the batch's own length
        assert_eq!(batch.shard(0..1).seq_len, 8);
        assert_eq!(batch.shard(0..1).trained_tokens() + tail.trained_tokens(), batch.trained_tokens());
    }

    /// A shard keeps its rows, cut after the last trained column of those rows.
    #[test]
    fn a_shard_is_its_rows_cut_after_their_last_trained_column() {
        let long = row(&[1, 2, 3, 4, 5, 6], &[-100, 2, 3, 4, 5, -100]);
        let short = row(&[7, 8, 9], &[-100, 8, -100]);
        let shorter = row(&[10, 11], &[-100, 11]);
        let batch = Batch::from_examples(&[&long, &short, &shorter], 0);
        let tail = batch.shard(1..3);
        assert_eq!((tail.batch_size, tail.seq_len), (2, 2));
        assert_eq!(tail.input_ids, [7, 8, 10, 11]);
        assert_eq!(tail.labels, [-100, 8, -100, 11]);
        assert_eq!(tail.trained_tokens(), 2);
        let head = batch.shard(0..1);
        assert_eq!((head.seq_len, head.input_ids.as_slice()), (5, &[1, 2, 3, 4, 5][..]));
        assert_eq!(head.trained_tokens() + tail.trained_tokens(), batch.trained_tokens());
        let none = batch.shard(2..2);
        assert_eq!((none.batch_size, none.seq_len, none.input_ids.len()), (0, 0, 0));
    }

    #[test]
    fn splitmix64_matches_reference_values() {
        // Reference: Vigna's splitmix64.c seeded with 1234567.
        let mut rng = SplitMix64(1_234_567);
        assert_eq!(rng.next(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next(), 3_203_168_211_198_807_973);
    }
}
