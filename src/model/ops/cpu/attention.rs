//! Causal attention on the CPU, forward and backward, as the CUDA kernels do it: each query block
//! computes its scores against the keys it can see and no others (causality, the sliding window,
//! and with packed rows its own dialogue), masks by position instead of reading a mask, reads
//! grouped kv heads where they lie instead of repeating them, and keeps the row log-sum-exp for
//! the backward, which recomputes the probabilities from it. Threads take (row, head, block)
//! tasks; within one a product runs on one thread. q, k, v and the gradients are read strided,
//! so a `[b, h, t, d]` view of the projections' `[b, t, h, d]` memory costs no copy, and the
//! context and dq come back as such views; dk and dv likewise.

use candle_core::{bail, Result, Tensor};
use rayon::prelude::*;

use super::gemm::{product_raw, Threads, View};
use super::{tensor, vector, Read, SharedMut};

/// Query rows per block.
const BLOCK: usize = 64;

/// Scores of a call below which it runs on the calling thread alone: a generated token's
/// attention over its cache is less work than waking the pool.
const SERIAL_SCORES: usize = 1 << 16;

/// Where each query looks: with packed rows (`spans`, t = s) only inside its own span, else at
/// keys up to its position s − t + i; with a window w, at most w − 1 keys back.
#[derive(Clone, Copy)]
pub struct Visible<'a> {
    pub spans: Option<&'a [Vec<(usize, usize)>]>,
    pub window: Option<usize>,
}

/// `[b, n, len, d]` of an f32 tensor whose last dimension is contiguous: the element offsets.
#[derive(Clone, Copy)]
struct Heads {
    offset: usize,
    stride: [usize; 3],
    d: usize,
}

impl Heads {
    fn of(read: &Read, dims: (usize, usize, usize, usize)) -> Result<Self> {
        let l = read.layout();
        if l.dims() != [dims.0, dims.1, dims.2, dims.3] {
            bail!("attention operand of shape {:?}, expected {dims:?}", l.dims());
        }
        let s = l.stride();
        if s[3] != 1 && dims.3 > 1 {
            bail!("attention operands need a contiguous head dimension");
        }
        Ok(Self { offset: l.start_offset(), stride: [s[0], s[1], s[2]], d: dims.3 })
    }

    /// Rows `from..from + rows` of head `n` in batch row `b`.
    fn rows(&self, b: usize, n: usize, from: usize, rows: usize) -> View {
        let at = self.offset + b * self.stride[0] + n * self.stride[1] + from * self.stride[2];
        View::rows(at, rows, self.d, self.stride[2])
    }
}

/// The shapes of one call: q `[b, h, t, d]`, k and v `[b, kv, s, d]`.
#[derive(Clone, Copy, Debug)]
struct Shape {
    b: usize,
    h: usize,
    kv: usize,
    t: usize,
    s: usize,
    d: usize,
}

impl Shape {
    fn of(q: &Tensor, k: &Tensor, v: &Tensor, visible: &Visible) -> Result<Self> {
        let (b, h, t, d) = q.dims4()?;
        let (kb, kv, s, kd) = k.dims4()?;
        if (kb, kd) != (b, d) || v.dims4()? != (b, kv, s, d) || kv == 0 || h % kv != 0 || t > s {
            bail!("attention of q {:?}, k {:?}, v {:?}", q.dims(), k.dims(), v.dims());
        }
        if let Some(spans) = visible.spans {
            let covered = spans.iter().all(|row| row.iter().map(|&(_, len)| len).sum::<usize>() == t);
            if t != s || spans.len() != b || !covered {
                bail!("packed rows' spans do not cover the {b} x {t} queries");
            }
        }
        Ok(Self { b, h, kv, t, s, d })
    }

    fn group(&self) -> usize {
        self.h / self.kv
    }
}

/// A block of query rows `i0..i1` of one batch row, all in the span that starts at key `first`.
#[derive(Clone, Copy, Debug)]
struct Block {
    row: usize,
    i0: usize,
    i1: usize,
    first: usize,
}

impl Block {
    /// The key position of query i.
    fn key(&self, shape: &Shape, i: usize) -> usize {
        i + shape.s - shape.t
    }

    /// The keys query i sees, `lo..=hi`.
    fn keys(&self, shape: &Shape, window: Option<usize>, i: usize) -> (usize, usize) {
        let hi = self.key(shape, i);
        let lo = window.map_or(self.first, |w| self.first.max((hi + 1).saturating_sub(w)));
        (lo, hi)
    }

    /// The scores the block computes for one head.
    fn scores(&self, shape: &Shape, window: Option<usize>) -> usize {
        let (lo, hi) = self.key_range(shape, window);
        (self.i1 - self.i0) * (hi - lo)
    }

    /// The keys the block's queries see together, `lo..hi` (the first query's first to past the
    /// last query's own).
    fn key_range(&self, shape: &Shape, window: Option<usize>) -> (usize, usize) {
        (self.keys(shape, window, self.i0).0, self.key(shape, self.i1 - 1) + 1)
    }
}

/// The spans of each row: the packed rows', or one span of all t queries.
fn spans(shape: &Shape, visible: &Visible) -> Vec<Vec<(usize, usize)>> {
    match visible.spans {
        Some(spans) => {
            spans.iter().map(|row| row.iter().copied().filter(|&(_, len)| len > 0).collect()).collect()
        }
        None => vec![vec![(0, shape.t)]; shape.b],
    }
}

/// The query blocks of one span of row `row`.
fn span_blocks(row: usize, (start, len): (usize, usize), first: usize) -> impl Iterator<Item = Block> {
    (start..start + len).step_by(BLOCK).map(move |i0| Block {
        row,
        i0,
        i1: (i0 + BLOCK).min(start + len),
        first,
    })
}

/// The key a span's first query may see first: the span's start with packed rows, else 0.
fn first_key(visible: &Visible, start: usize) -> usize {
    if visible.spans.is_some() {
        start
    } else {
        0
    }
}

/// Scores of the block's queries (rows of `scores`, `key_range` wide) against its keys times
/// `scale`, into `scores`.
///
/// # Safety
/// `q` and `k` are the buffers `qh` and `kh` describe; `scores` holds the block's rows.
unsafe fn scores(
    scores: &mut [f32],
    (q, qh): (&[f32], Heads),
    (k, kh): (&[f32], Heads),
    (block, head, group): (&Block, usize, usize),
    (lo, hi): (usize, usize),
    scale: f32,
) {
    let rows = block.i1 - block.i0;
    let qv = qh.rows(block.row, head, block.i0, rows);
    if rows == 1 {
        // one query (a generated token): dot products, which cost less than gemm's set-up
        let q_row = &q[qv.offset..][..qh.d];
        for (j, s) in scores[..hi - lo].iter_mut().enumerate() {
            let key = kh.rows(block.row, head / group, lo + j, 1);
            *s = scale * vector::dot(q_row, &k[key.offset..][..kh.d]);
        }
        return;
    }
    let kv = kh.rows(block.row, head / group, lo, hi - lo).t();
    let dst = View::rows(0, rows, hi - lo, hi - lo);
    product_raw(scores.as_mut_ptr(), dst, (q.as_ptr(), qv), (k.as_ptr(), kv), scale, false, Threads::One);
}

/// The context `[b, h, t, d]` (a view of `[b, t, h, d]` memory) and the row log-sum-exp
/// `[b, h, t]` of softmax(scale · q·kᵀ) over each query's visible keys.
pub fn forward(q: &Tensor, k: &Tensor, v: &Tensor, visible: Visible, scale: f64) -> Result<(Tensor, Tensor)> {
    let shape = Shape::of(q, k, v, &visible)?;
    let Shape { b, h, t, d, .. } = shape;
    let (rq, rk, rv) = (Read::new(q)?, Read::new(k)?, Read::new(v)?);
    let dims_kv = (b, shape.kv, shape.s, d);
    let (qh, kh, vh) = (Heads::of(&rq, (b, h, t, d))?, Heads::of(&rk, dims_kv)?, Heads::of(&rv, dims_kv)?);
    let (qb, kb, vb) = (rq.buffer(), rk.buffer(), rv.buffer());
    let mut context = vec![0f32; b * t * h * d];
    let mut lse = vec![0f32; b * h * t];
    let (out, out_lse) = (SharedMut::new(&mut context), SharedMut::new(&mut lse));
    let mut tasks = Vec::new();
    for (row, row_spans) in spans(&shape, &visible).iter().enumerate() {
        for &span in row_spans {
            for block in span_blocks(row, span, first_key(&visible, span.0)) {
                tasks.extend((0..h).map(|head| (block, head)));
            }
        }
    }
    let group = shape.group();
    let score_values: usize = tasks.iter().map(|(block, _)| block.scores(&shape, visible.window)).sum();
    let task = |p: &mut Vec<f32>, (block, head): (Block, usize)| {
        let (lo, hi) = block.key_range(&shape, visible.window);
        let (rows, width) = (block.i1 - block.i0, hi - lo);
        p.clear();
        p.resize(rows * width, 0.0);
        // SAFETY: the views are inside q and k (their shapes were checked against the layouts)
        unsafe { scores(p, (qb, qh), (kb, kh), (&block, head, group), (lo, hi), scale as f32) };
        for r in 0..rows {
            let i = block.i0 + r;
            let (a, e) = block.keys(&shape, visible.window, i);
            let line = &mut p[r * width..(r + 1) * width];
            let l = softmax_in_place(line, a - lo, e - lo);
            // SAFETY: (row, head, i) belongs to this task alone
            unsafe { *out_lse.at((block.row * h + head) * t + i) = l };
        }
        let pv = View::rows(0, rows, width, width);
        let vv = vh.rows(block.row, head / group, lo, width);
        let dst = View::rows(((block.row * t + block.i0) * h + head) * d, rows, d, h * d);
        if rows == 1 {
            // SAFETY: this query's row of this head is written by this task alone, inside context
            let row = unsafe { out.slice(dst.offset, d) };
            row.fill(0.0);
            for (j, &pj) in p.iter().enumerate() {
                vector::axpy(row, pj, &vb[vv.offset + j * vv.rs..][..d]);
            }
            return;
        }
        // SAFETY: the block's rows of this head are written by this task alone; the views are
        // inside their buffers
        unsafe { product_raw(out.at(0), dst, (p.as_ptr(), pv), (vb.as_ptr(), vv), 1.0, false, Threads::One) };
    };
    if score_values < SERIAL_SCORES {
        let mut p = Vec::new();
        tasks.into_iter().for_each(|t| task(&mut p, t));
    } else {
        tasks.into_par_iter().for_each_init(Vec::new, task);
    }
    let context = tensor(context, (b, t, h, d))?.transpose(1, 2)?;
    Ok((context, tensor(lse, (b, h, t))?))
}

/// Softmax of `line[a..=e]` in place (the rest set to 0); returns the log-sum-exp.
fn softmax_in_place(line: &mut [f32], a: usize, e: usize) -> f32 {
    let seen = &mut line[a..=e];
    let max = vector::max(seen);
    let sum = vector::exp_shifted(seen, max);
    vector::scale(seen, 1.0 / sum);
    line[..a].fill(0.0);
    line[e + 1..].fill(0.0);
    max + sum.ln()
}

/// (dq, dk, dv) of `forward` given d(context) `[b, h, t, d]` and the forward's log-sum-exp:
/// per block P = exp(scale · q·kᵀ − lse), dV += Pᵀ·dC, dP = dC·Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)),
/// dQ = scale · dS·K, dK += scale · dSᵀ·Q. A task is one head of one span, so each query head's
/// dK and dV are its own until the group's heads are summed at the end. dq comes back as a view
/// of `[b, t, h, d]` memory, dk and dv of `[b, s, kv, d]`.
pub fn backward(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    visible: Visible,
    scale: f64,
    lse: &Tensor,
    d_context: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let shape = Shape::of(q, k, v, &visible)?;
    let Shape { b, h, t, s, d, .. } = shape;
    let (rq, rk, rv, rd) = (Read::new(q)?, Read::new(k)?, Read::new(v)?, Read::new(d_context)?);
    let dims_kv = (b, shape.kv, s, d);
    let (qh, kh, vh) = (Heads::of(&rq, (b, h, t, d))?, Heads::of(&rk, dims_kv)?, Heads::of(&rv, dims_kv)?);
    let dh = Heads::of(&rd, (b, h, t, d))?;
    let lse_values = lse.flatten_all()?.to_vec1::<f32>()?;
    if lse_values.len() != b * h * t {
        bail!("the forward's log-sum-exp has {} values, not {}", lse_values.len(), b * h * t);
    }
    let (qb, kb, vb, db) = (rq.buffer(), rk.buffer(), rv.buffer(), rd.buffer());
    let mut dq = vec![0f32; b * t * h * d];
    // each query head's own dk and dv, `[b, s, h, d]`
    let mut dk_heads = vec![0f32; b * s * h * d];
    let mut dv_heads = vec![0f32; b * s * h * d];
    let (dq_out, dk_out, dv_out) =
        (SharedMut::new(&mut dq), SharedMut::new(&mut dk_heads), SharedMut::new(&mut dv_heads));
    let mut tasks = Vec::new();
    for (row, row_spans) in spans(&shape, &visible).iter().enumerate() {
        tasks.extend(row_spans.iter().flat_map(|&span| (0..h).map(move |head| (row, span, head))));
    }
    let group = shape.group();
    let scale = scale as f32;
    tasks.into_par_iter().for_each_init(
        || (Vec::new(), Vec::new()),
        |(p, dp): &mut (Vec<f32>, Vec<f32>), (row, span, head)| {
            for block in span_blocks(row, span, first_key(&visible, span.0)) {
                let (lo, hi) = block.key_range(&shape, visible.window);
                let (rows, width) = (block.i1 - block.i0, hi - lo);
                for buf in [&mut *p, &mut *dp] {
                    buf.clear();
                    buf.resize(rows * width, 0.0);
                }
                // SAFETY: the views are inside q and k
                unsafe { scores(p, (qb, qh), (kb, kh), (&block, head, group), (lo, hi), scale) };
                for r in 0..rows {
                    let i = block.i0 + r;
                    let (a, e) = block.keys(&shape, visible.window, i);
                    let l = lse_values[(row * h + head) * t + i];
                    let line = &mut p[r * width..(r + 1) * width];
                    vector::exp_shifted(&mut line[a - lo..=e - lo], l);
                    line[..a - lo].fill(0.0);
                    line[e - lo + 1..].fill(0.0);
                }
                let pv = View::rows(0, rows, width, width);
                let dcv = dh.rows(row, head, block.i0, rows);
                let (kv_rows, v_rows) =
                    (kh.rows(row, head / group, lo, width), vh.rows(row, head / group, lo, width));
                let own = |n: usize| View::rows(((row * s + lo) * h + head) * d, n, d, h * d);
                // SAFETY (each product): the views are inside their buffers; this head's rows of
                // this span (its dk, dv and dq) are written by this task alone
                unsafe {
                    // dV += Pᵀ·dC
                    product_raw(
                        dv_out.at(0),
                        own(width),
                        (p.as_ptr(), pv.t()),
                        (db.as_ptr(), dcv),
                        1.0,
                        true,
                        Threads::One,
                    );
                    // dP = dC·Vᵀ
                    product_raw(
                        dp.as_mut_ptr(),
                        pv,
                        (db.as_ptr(), dcv),
                        (vb.as_ptr(), v_rows.t()),
                        1.0,
                        false,
                        Threads::One,
                    );
                }
                for (pl, dl) in p.chunks(width).zip(dp.chunks_mut(width)) {
                    vector::softmax_grad(pl, dl);
                }
                let dq_rows = View::rows(((row * t + block.i0) * h + head) * d, rows, d, h * d);
                let q_rows = qh.rows(row, head, block.i0, rows);
                unsafe {
                    // dQ = scale · dS·K
                    product_raw(
                        dq_out.at(0),
                        dq_rows,
                        (dp.as_ptr(), pv),
                        (kb.as_ptr(), kv_rows),
                        scale,
                        false,
                        Threads::One,
                    );
                    // dK += scale · dSᵀ·Q
                    product_raw(
                        dk_out.at(0),
                        own(width),
                        (dp.as_ptr(), pv.t()),
                        (qb.as_ptr(), q_rows),
                        scale,
                        true,
                        Threads::One,
                    );
                }
            }
        },
    );
    let dq = tensor(dq, (b, t, h, d))?.transpose(1, 2)?;
    let (dk, dv) = (sum_groups(dk_heads, &shape)?, sum_groups(dv_heads, &shape)?);
    Ok((dq, dk, dv))
}

/// `[b, s, h, d]` per query head summed over each kv head's group: `[b, kv, s, d]` (a view of
/// `[b, s, kv, d]` memory).
fn sum_groups(heads: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    let Shape { b, h, kv, s, d, .. } = *shape;
    let group = shape.group();
    let summed = if group == 1 {
        heads
    } else {
        let mut out = vec![0f32; b * s * kv * d];
        out.par_chunks_mut(kv * d).zip(heads.par_chunks(h * d)).for_each(|(dst, src)| {
            for (g, dst) in dst.chunks_mut(d).enumerate() {
                for r in 0..group {
                    let head = &src[(g * group + r) * d..][..d];
                    for (o, x) in dst.iter_mut().zip(head) {
                        *o += x;
                    }
                }
            }
        });
        out
    };
    tensor(summed, (b, s, kv, d))?.transpose(1, 2)
}
