//! `data.packing`: whole dialogues put into rows of `max_seq_len` tokens, best-fit decreasing (as
//! TRL's `packing_strategy = "bfd"`): the longest dialogue first, each into the fullest row that
//! still has room for it, a new row where none has. A dialogue is never split.
//!
//! A packed row keeps the length of each of its dialogues (`Example::seq_lens`): the model
//! restarts positions at each dialogue and keeps attention inside it (model/packing.rs), so a
//! packed row trains exactly as its dialogues would one per row. The label of each dialogue's
//! first token is dropped: after the model's shift it would be predicted from the previous
//! dialogue's last token.
//!
//! `data.group_by_length` is the lighter alternative: rows stay one dialogue each, and each
//! epoch's shuffled order is sorted by length within windows of `GROUP_WINDOW` batches (as
//! transformers' `LengthGroupedSampler` does with its megabatches), so a batch pads less.

use std::collections::BTreeMap;

use super::{Example, IGNORE_INDEX};

/// Batches whose rows `group_by_length` sorts together (transformers' megabatch factor).
pub const GROUP_WINDOW: usize = 50;

/// What packing made of a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackingStats {
    pub dialogues: usize,
    pub rows: usize,
    pub tokens: usize,
    /// Tokens the rows could hold (`rows × max_len`).
    pub capacity: usize,
}

impl PackingStats {
    /// The share of the rows' tokens that are dialogue, not padding.
    pub fn fill(&self) -> f64 {
        self.tokens as f64 / self.capacity.max(1) as f64
    }
}

/// The dialogues of `examples` (each at most `max_len` tokens, as truncation leaves them) packed
/// into rows of at most `max_len` tokens. Deterministic: the same dataset packs the same way
/// (resuming a run relies on it).
pub fn pack(examples: Vec<Example>, max_len: usize) -> (Vec<Example>, PackingStats) {
    let mut order: Vec<usize> = (0..examples.len()).collect();
    // longest first; equal lengths in file order
    order.sort_by_key(|&i| std::cmp::Reverse(examples[i].len()));
    // rows by their free room, each room's rows in creation order
    let mut by_room: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut rows: Vec<(usize, Vec<usize>)> = Vec::new(); // (used, dialogues)
    for i in order {
        let len = examples[i].len().min(max_len);
        let fit = by_room.range(len..).next().map(|(&room, _)| room);
        let r = match fit {
            Some(room) => {
                let waiting = by_room.get_mut(&room).expect("found above");
                let r = waiting.remove(0);
                if waiting.is_empty() {
                    by_room.remove(&room);
                }
                r
            }
            None => {
                rows.push((0, Vec::new()));
                rows.len() - 1
            }
        };
        rows[r].0 += len;
        rows[r].1.push(i);
        by_room.entry(max_len - rows[r].0).or_default().push(r);
    }
    let stats = PackingStats {
        dialogues: examples.len(),
        rows: rows.len(),
        tokens: examples.iter().map(|e| e.len().min(max_len)).sum(),
        capacity: rows.len() * max_len,
    };
    let mut slots: Vec<Option<Example>> = examples.into_iter().map(Some).collect();
    let packed = rows
        .into_iter()
        .map(|(_, members)| {
            let mut row = Example::default();
            for i in members {
                let e = slots[i].take().expect("each dialogue packed once");
                let len = e.len().min(max_len);
                row.input_ids.extend_from_slice(&e.input_ids[..len]);
                let start = row.labels.len();
                row.labels.extend_from_slice(&e.labels[..len]);
                row.labels[start] = IGNORE_INDEX;
                row.seq_lens.push(len);
            }
            row
        })
        .collect();
    (packed, stats)
}

/// `order` (an epoch's shuffled row order) with the rows of each window of `GROUP_WINDOW`
/// batches sorted longest first (stable), so that each batch holds rows of similar length.
pub fn group_by_length(order: &mut [usize], lengths: impl Fn(usize) -> usize, batch_size: usize) {
    for window in order.chunks_mut(batch_size * GROUP_WINDOW) {
        window.sort_by_key(|&i| std::cmp::Reverse(lengths(i)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dialogue(len: usize, first: u32) -> Example {
        let ids: Vec<u32> = (first..first + len as u32).collect();
        Example { labels: ids.iter().map(|&i| i64::from(i)).collect(), input_ids: ids, seq_lens: vec![] }
    }

    /// Best-fit decreasing by hand: lengths 7, 6, 5, 4, 3, 2 into rows of 10: 7 opens row 0
    /// (room 3), 6 opens row 1 (room 4), 5 opens row 2 (room 5), 4 fits row 1 exactly (the
    /// fullest with room), 3 fits row 0 exactly, 2 goes to row 2 (room 5, the only one left).
    #[test]
    fn best_fit_decreasing_fills_the_fullest_row_that_has_room() {
        let lens = [3, 7, 2, 6, 4, 5];
        let examples: Vec<Example> =
            lens.iter().enumerate().map(|(i, &l)| dialogue(l, 100 * i as u32)).collect();
        let (rows, stats) = pack(examples, 10);
        let shapes: Vec<Vec<usize>> = rows.iter().map(|r| r.seq_lens.clone()).collect();
        assert_eq!(shapes, vec![vec![7, 3], vec![6, 4], vec![5, 2]]);
        assert_eq!((stats.dialogues, stats.rows, stats.tokens, stats.capacity), (6, 3, 27, 30));
        // row 1: the 6-token dialogue (index 3: ids 300..306) then the 4-token one (index 4)
        assert_eq!(rows[1].input_ids, [300, 301, 302, 303, 304, 305, 400, 401, 402, 403]);
        // each dialogue's first label dropped, the rest kept
        assert_eq!(rows[1].labels, [-100, 301, 302, 303, 304, 305, -100, 401, 402, 403]);
        for r in &rows {
            assert_eq!(r.seq_lens.iter().sum::<usize>(), r.len());
            assert!(r.len() <= 10);
        }
    }

    #[test]
    fn every_dialogue_lands_in_exactly_one_row() {
        let lens: Vec<usize> = (0..200).map(|i| 1 + (i * 37) % 61).collect();
        let examples: Vec<Example> =
            lens.iter().enumerate().map(|(i, &l)| dialogue(l, 1000 * i as u32)).collect();
        let (rows, stats) = pack(examples, 64);
        let mut firsts: Vec<u32> = Vec::new();
        for r in &rows {
            let mut at = 0;
            for &l in &r.seq_lens {
                firsts.push(r.input_ids[at]);
                at += l;
            }
        }
        firsts.sort_unstable();
        assert_eq!(firsts, (0..200).map(|i| 1000 * i as u32).collect::<Vec<_>>());
        assert_eq!(stats.tokens, lens.iter().sum::<usize>());
        // at least as full as the trivial bound: no two rows could be merged into one
        assert!(stats.rows * 64 < 2 * stats.tokens + 64, "{stats:?}");
    }

    #[test]
    fn group_by_length_sorts_within_windows_only() {
        let lengths = [5, 1, 9, 3, 7, 2];
        let mut order: Vec<usize> = (0..6).collect();
        // windows of GROUP_WINDOW batches of size 1 hold all six
        group_by_length(&mut order, |i| lengths[i], 1);
        assert_eq!(order, [2, 4, 0, 3, 5, 1]);
    }
}
