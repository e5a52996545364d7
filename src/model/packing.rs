//! Packed rows (`data.packing`) on the model side: each row holds several dialogues back to back,
//! then padding. Positions restart at every dialogue (RoPE reads them per token) and attention
//! stays inside each: token i sees token j only when both are in the same span, j ≤ i and, with
//! a window w, i − j < w. The padding after the last dialogue is one more span (it sees only
//! padding, so no row of scores is empty; its labels are −100). So a packed row computes, token
//! for token, what its dialogues compute one per row.

use std::sync::{Arc, Mutex};

use candle_core::{Device, Result, Tensor};

/// The spans of a batch of packed rows and their per-token positions.
#[derive(Debug)]
pub struct PackedRows {
    /// Per row, (start, length) of each dialogue, then of the padding if any.
    spans: Vec<Vec<(usize, usize)>>,
    seq_len: usize,
    /// `[b · t]` u32: each token's position within its span.
    pub positions: Tensor,
    /// The ragged columns cuDNN reads, per (q, kv) width in elements of a token.
    columns: Mutex<Vec<ColumnsOfWidth>>,
    /// Each token's span for the flash kernels, made on first use.
    token_spans: Mutex<Option<Tensor>>,
}

/// Ragged columns and the (q, kv) widths they were made for.
type ColumnsOfWidth = ((usize, usize), Arc<RaggedColumns>);

/// Every span of the batch as one sequence for cuDNN's ragged layout: where each starts in the
/// `[b · t, heads, d]` memory of q (`q_offsets`) and of k/v (`kv_offsets`), `[n + 1]` i32
/// elements, and its length (`seq_lens`, `[n]` i32). `n` is the number of spans rounded up to a
/// multiple of `SEQUENCE_BUCKET` with empty ones, so that batches share cuDNN graphs.
#[derive(Debug)]
pub struct RaggedColumns {
    pub sequences: usize,
    pub longest: usize,
    pub q_offsets: Tensor,
    pub kv_offsets: Tensor,
    pub seq_lens: Tensor,
}

/// Packed batches with up to this many more spans share a cuDNN graph.
const SEQUENCE_BUCKET: usize = 16;

impl PackedRows {
    /// `seq_lens[r]`: the lengths of row r's dialogues (summing to at most `seq_len`).
    pub fn new(seq_lens: &[Vec<usize>], seq_len: usize, device: &Device) -> Result<Self> {
        let mut spans = Vec::with_capacity(seq_lens.len());
        let mut positions: Vec<u32> = Vec::with_capacity(seq_lens.len() * seq_len);
        for (r, lens) in seq_lens.iter().enumerate() {
            let mut row = Vec::with_capacity(lens.len() + 1);
            let mut at = 0;
            let padding = seq_len.saturating_sub(lens.iter().sum());
            for &l in lens.iter().filter(|&&l| l > 0).chain((padding > 0).then_some(&padding)) {
                if at + l > seq_len {
                    candle_core::bail!("packed row {r}: dialogues of {lens:?} tokens overrun its {seq_len}");
                }
                row.push((at, l));
                positions.extend(0..l as u32);
                at += l;
            }
            spans.push(row);
        }
        let positions = Tensor::from_vec(positions, seq_lens.len() * seq_len, device)?;
        Ok(Self { spans, seq_len, positions, columns: Mutex::new(Vec::new()), token_spans: Mutex::new(None) })
    }

    /// Per row, (start, length) of each dialogue, then of the padding if any: they cover the row.
    pub fn spans(&self) -> &[Vec<(usize, usize)>] {
        &self.spans
    }

    /// `[b · t, 2]` i32: the (start, end) within its row of each token's span (end exclusive),
    /// as the flash kernels read them (varlen attention: token i sees keys start(i) ..= i).
    /// Made once per batch on `device`.
    pub fn token_spans(&self, device: &Device) -> Result<Tensor> {
        let mut cached =
            self.token_spans.lock().map_err(|_| candle_core::Error::Msg("span cache poisoned".into()))?;
        if let Some(t) = cached.as_ref().filter(|t| t.device().same_device(device)) {
            return Ok(t.clone());
        }
        if self.seq_len > i32::MAX as usize {
            candle_core::bail!(
                "packed rows of {} tokens are past the flash kernels' 32-bit spans",
                self.seq_len
            );
        }
        let mut bounds: Vec<i32> = Vec::with_capacity(self.spans.len() * self.seq_len * 2);
        for row in &self.spans {
            for &(start, len) in row {
                let (s, e) = (start as i32, (start + len) as i32);
                bounds.extend(std::iter::repeat_n([s, e], len).flatten());
            }
        }
        let t = Tensor::from_vec(bounds, (self.spans.len() * self.seq_len, 2), device)?;
        *cached = Some(t.clone());
        Ok(t)
    }

    /// The spans as cuDNN's ragged columns for q and k/v of `q_width` and `kv_width` elements a
    /// token (heads × head_dim), made once per width.
    pub fn ragged(&self, q_width: usize, kv_width: usize, device: &Device) -> Result<Arc<RaggedColumns>> {
        let mut cache =
            self.columns.lock().map_err(|_| candle_core::Error::Msg("ragged cache poisoned".into()))?;
        if let Some((_, c)) = cache.iter().find(|(w, _)| *w == (q_width, kv_width)) {
            return Ok(Arc::clone(c));
        }
        let mut starts: Vec<usize> = Vec::new();
        let mut lens: Vec<i32> = Vec::new();
        for (r, row) in self.spans.iter().enumerate() {
            for &(start, len) in row {
                starts.push(r * self.seq_len + start);
                lens.push(len as i32);
            }
        }
        let end = self.spans.len() * self.seq_len;
        let sequences = lens.len().div_ceil(SEQUENCE_BUCKET) * SEQUENCE_BUCKET;
        starts.resize(sequences + 1, end);
        lens.resize(sequences, 0);
        let offsets = |width: usize| {
            let column: Vec<i32> = starts.iter().map(|&s| (s * width) as i32).collect();
            Tensor::from_vec(column, sequences + 1, device)
        };
        if end * q_width.max(kv_width) > i32::MAX as usize {
            candle_core::bail!("packed batch of {end} tokens is past cuDNN's 32-bit ragged offsets");
        }
        let columns = Arc::new(RaggedColumns {
            sequences,
            longest: self.seq_len,
            q_offsets: offsets(q_width)?,
            kv_offsets: offsets(kv_width)?,
            seq_lens: Tensor::from_vec(lens, sequences, device)?,
        });
        cache.push(((q_width, kv_width), Arc::clone(&columns)));
        Ok(columns)
    }

    /// Additive mask `[b, 1, t, t]` f32 (0 or −∞) for the composed attention.
    pub fn mask(&self, window: Option<usize>, device: &Device) -> Result<Tensor> {
        let t = self.seq_len;
        let mut mask = vec![f32::NEG_INFINITY; self.spans.len() * t * t];
        for (r, row) in self.spans.iter().enumerate() {
            for &(start, len) in row {
                for i in start..start + len {
                    let from = window.map_or(start, |w| start.max((i + 1).saturating_sub(w)));
                    let line = (r * t + i) * t;
                    mask[line + from..=line + i].fill(0.0);
                }
            }
        }
        Tensor::from_vec(mask, (self.spans.len(), 1, t, t), device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_restart_and_the_mask_keeps_attention_inside_each_dialogue() {
        let p = PackedRows::new(&[vec![3, 2], vec![5]], 6, &Device::Cpu).unwrap();
        assert_eq!(p.positions.to_vec1::<u32>().unwrap(), [0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 0]);
        let m = p.mask(None, &Device::Cpu).unwrap().to_vec3::<f32>().map_err(|_| ()).err();
        assert!(m.is_some(), "a [b, 1, t, t] mask is 4-d");
        let m = p.mask(Some(2), &Device::Cpu).unwrap().squeeze(1).unwrap().to_vec3::<f32>().unwrap();
        let seen = |r: usize, i: usize| -> Vec<usize> { (0..6).filter(|&j| m[r][i][j] == 0.0).collect() };
        assert_eq!(seen(0, 2), [1, 2]); // window 2 inside the first dialogue
        assert_eq!(seen(0, 3), [3]); // the second dialogue starts fresh
        assert_eq!(seen(0, 4), [3, 4]);
        assert_eq!(seen(0, 5), [5]); // padding sees padding
        assert_eq!(seen(1, 4), [3, 4]);
        let full = p.mask(None, &Device::Cpu).unwrap().squeeze(1).unwrap().to_vec3::<f32>().unwrap();
        assert_eq!((0..6).filter(|&j| full[0][2][j] == 0.0).count(), 3);
    }

    /// The flash kernels' spans: every token of a row, padding included, knows its span.
    #[test]
    fn token_spans_cover_every_token_with_its_own_span() {
        let p = PackedRows::new(&[vec![3, 2], vec![5]], 6, &Device::Cpu).unwrap();
        let spans = p.token_spans(&Device::Cpu).unwrap().to_vec2::<i32>().unwrap();
        let want =
            [[0, 3], [0, 3], [0, 3], [3, 5], [3, 5], [5, 6], [0, 5], [0, 5], [0, 5], [0, 5], [0, 5], [5, 6]];
        assert_eq!(spans, want);
        // every token sees itself and nothing before its span's start, as the mask has it
        let m = p.mask(None, &Device::Cpu).unwrap().squeeze(1).unwrap().to_vec3::<f32>().unwrap();
        for (token, &[start, end]) in want.iter().enumerate() {
            let (r, i) = (token / 6, token % 6);
            let seen: Vec<usize> = (0..6).filter(|&j| m[r][i][j] == 0.0).collect();
            assert_eq!(seen, (start as usize..=i).collect::<Vec<_>>(), "token {token}");
            assert!(i < end as usize);
        }
    }
}
