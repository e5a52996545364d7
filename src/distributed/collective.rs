//! Collectives: what the ranks of a run compute together. `Solo` is a run of one process (every
//! operation is the identity, so one-GPU training is unchanged); `TcpCollective` is the CPU path
//! (CPU runs and the tests, where NCCL does not apply, as gloo is for PyTorch): sums through rank
//! 0 over the liveness connections, never a transport for GPUs; `nccl::NcclCollective` is the GPU
//! path.

use std::ops::Range;

use anyhow::Context;
use candle_core::{DType, Tensor};

use super::error::DistributedError;
use super::liveness::Group;
use super::wire::{bytes_f32, bytes_f64, f32_bytes, f64_bytes};

/// Gradients travel in buckets of about this many bytes, as DistributedDataParallel's default:
/// few enough calls that their latency does not count, small enough that the copy into a bucket
/// costs little memory.
pub const BUCKET_BYTES: usize = 25 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }
}

/// What the ranks of a run compute together. Every rank calls the same operations in the same
/// order; each returns the same values on every rank, or the run's failure.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// The sum over the ranks of a flat f32 tensor (one bucket of gradients).
    fn all_reduce_bucket(&self, bucket: &Tensor) -> anyhow::Result<Tensor>;
    /// Reduces a few numbers (a loss sum, token counts, flags) over the ranks, in place.
    fn all_reduce_scalars(&self, values: &mut [f64], op: ReduceOp) -> anyhow::Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> anyhow::Result<()> {
        self.all_reduce_scalars(&mut [0.0], ReduceOp::Sum)
    }
    /// This rank failed with `message`: the other ranks stop with it instead of waiting.
    fn abort(&self, message: &str);
    /// This rank's part of the run ended well (after its last collective).
    fn finish(&self) -> anyhow::Result<()>;
}

/// A run of one process.
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_bucket(&self, bucket: &Tensor) -> anyhow::Result<Tensor> {
        Ok(bucket.clone())
    }
    fn all_reduce_scalars(&self, _values: &mut [f64], _op: ReduceOp) -> anyhow::Result<()> {
        Ok(())
    }
    fn abort(&self, _message: &str) {}
    fn finish(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Consecutive tensors grouped into buckets of at most `cap` elements; a tensor larger than
/// `cap` is a bucket of its own. Ranges index `sizes`.
pub fn buckets(sizes: &[usize], cap: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut filled) = (0, 0);
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && filled + n > cap {
            out.push(start..i);
            (start, filled) = (i, 0);
        }
        filled += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// The sum over the ranks of every gradient (f32), bucket by bucket: each bucket's tensors
/// flattened into one buffer, all-reduced, and cut back into tensors of the same shapes. One rank:
/// the gradients as they are.
pub fn all_reduce_grads(
    c: &dyn Collective,
    grads: Vec<Tensor>,
    bucket_bytes: usize,
) -> anyhow::Result<Vec<Tensor>> {
    if c.world_size() == 1 {
        return Ok(grads);
    }
    // summed in f32 whatever the backward's dtype: an f16 sum over ranks would round each add
    let grads = grads.iter().map(|g| g.to_dtype(DType::F32)).collect::<candle_core::Result<Vec<_>>>()?;
    let sizes: Vec<usize> = grads.iter().map(|g| g.elem_count()).collect();
    let mut out = Vec::with_capacity(grads.len());
    let mut grads = grads.into_iter();
    for range in buckets(&sizes, (bucket_bytes / 4).max(1)) {
        let members: Vec<Tensor> = grads.by_ref().take(range.len()).collect();
        let flat = members.iter().map(|g| g.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
        let bucket = Tensor::cat(&flat, 0)?;
        drop(flat);
        let summed = c.all_reduce_bucket(&bucket).context("all-reducing the gradients")?;
        let mut offset = 0;
        for g in &members {
            out.push(summed.narrow(0, offset, g.elem_count())?.reshape(g.shape())?);
            offset += g.elem_count();
        }
    }
    Ok(out)
}

/// The CPU collective: every rank sends its values to rank 0, which reduces them in rank order
/// (so the result does not depend on who arrives first) and sends the result back to each.
pub struct TcpCollective {
    group: Group,
}

/// What a message holds, so that ranks that got out of step are an error, not a wrong sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u8,
    op: u8,
    count: u64,
}

const F32_SUM: u8 = 1;
const F64: u8 = 2;

impl TcpCollective {
    pub fn new(group: Group) -> Self {
        Self { group }
    }

    pub fn group(&self) -> &Group {
        &self.group
    }

    /// One round through rank 0: `reduce(acc, theirs)` folds the other ranks' payloads in.
    fn round(
        &self,
        header: Header,
        payload: Vec<u8>,
        reduce: impl Fn(&mut [u8], &[u8]),
    ) -> Result<Vec<u8>, DistributedError> {
        let message = with_header(header, &payload);
        if self.group.rank() != 0 {
            self.group.send(0, message)?;
            let answer = self.group.recv(0)?;
            return self.payload_of(&answer, header, 0).map(<[u8]>::to_vec);
        }
        let mut acc = payload;
        for (index, peer) in self.group.peers().into_iter().enumerate() {
            let theirs = self.group.recv(index)?;
            reduce(&mut acc, self.payload_of(&theirs, header, peer)?);
        }
        let answer = with_header(header, &acc);
        for index in 0..self.group.peers().len() {
            self.group.send(index, answer.clone())?;
        }
        Ok(acc)
    }

    fn payload_of<'a>(
        &self,
        message: &'a [u8],
        want: Header,
        peer: usize,
    ) -> Result<&'a [u8], DistributedError> {
        let got = (message.len() >= 10).then(|| Header {
            kind: message[0],
            op: message[1],
            count: u64::from_le_bytes(message[2..10].try_into().expect("8 bytes")),
        });
        if got != Some(want) {
            let message =
                format!("out of step: it sent {got:?} where rank {} expected {want:?}", self.group.rank());
            return Err(DistributedError::Protocol { peer, message });
        }
        Ok(&message[10..])
    }
}

fn with_header(h: Header, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + payload.len());
    out.extend_from_slice(&[h.kind, h.op]);
    out.extend_from_slice(&h.count.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.group.rank()
    }

    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    fn all_reduce_bucket(&self, bucket: &Tensor) -> anyhow::Result<Tensor> {
        let values = bucket.flatten_all()?.to_vec1::<f32>()?;
        let header = Header { kind: F32_SUM, op: 0, count: values.len() as u64 };
        let summed = self.round(header, f32_bytes(&values), |acc, theirs| {
            let sum: Vec<f32> = bytes_f32(acc).iter().zip(bytes_f32(theirs)).map(|(a, b)| a + b).collect();
            acc.copy_from_slice(&f32_bytes(&sum));
        })?;
        Ok(Tensor::from_vec(bytes_f32(&summed), values.len(), bucket.device())?)
    }

    fn all_reduce_scalars(&self, values: &mut [f64], op: ReduceOp) -> anyhow::Result<()> {
        let header = Header { kind: F64, op: op as u8, count: values.len() as u64 };
        let reduced = self.round(header, f64_bytes(values), |acc, theirs| {
            let r: Vec<f64> =
                bytes_f64(acc).iter().zip(bytes_f64(theirs)).map(|(a, b)| op.apply(*a, b)).collect();
            acc.copy_from_slice(&f64_bytes(&r));
        })?;
        values.copy_from_slice(&bytes_f64(&reduced));
        Ok(())
    }

    fn abort(&self, message: &str) {
        self.group.fail_self(message);
    }

    fn finish(&self) -> anyhow::Result<()> {
        Ok(self.group.finish()?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::liveness::tests::groups;
    use super::*;
    use candle_core::Device;

    #[test]
    fn buckets_hold_consecutive_tensors_up_to_the_cap() {
        assert_eq!(buckets(&[3, 3, 3, 3], 6), [0..2, 2..4]);
        assert_eq!(buckets(&[3, 3, 3, 3], 7), [0..2, 2..4]);
        assert_eq!(buckets(&[3, 3, 3, 3], 9), [0..3, 3..4]);
        // one larger than the cap is a bucket of its own, wherever it is
        assert_eq!(buckets(&[2, 10, 2, 2], 5), [0..1, 1..2, 2..4]);
        assert_eq!(buckets(&[10], 5), vec![0..1_usize]);
        assert_eq!(buckets(&[], 5), Vec::<Range<usize>>::new());
        let sizes = [5, 1, 7, 2, 2, 9, 1, 1, 4];
        let b = buckets(&sizes, 8);
        assert_eq!(b.iter().map(|r| r.len()).sum::<usize>(), sizes.len(), "{b:?}");
        assert!(b.windows(2).all(|w| w[0].end == w[1].start));
        assert!(b.iter().all(|r| r.len() == 1 || sizes[r.clone()].iter().sum::<usize>() <= 8), "{b:?}");
    }

    /// Sums of differently shaped gradients over three ranks, split over several buckets,
    /// come back in their shapes with the exact sums on every rank.
    #[test]
    fn gradients_are_summed_over_ranks_in_their_shapes() {
        const SHAPES: [&[usize]; 4] = [&[2, 3], &[5], &[3, 1, 2], &[4, 4]];
        let shapes = SHAPES;
        let grads_of = move |rank: usize| -> Vec<Tensor> {
            shapes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let n: usize = s.iter().product();
                    let v: Vec<f32> = (0..n).map(|k| (rank * 1000 + i * 100 + k) as f32 * 0.5).collect();
                    Tensor::from_vec(v, *s, &Device::Cpu).unwrap()
                })
                .collect()
        };
        let handles: Vec<_> = groups(3)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let rank = g.rank();
                    let c = TcpCollective::new(g);
                    // 10 elements (40 bytes) a bucket: [6], [5], [6], [16]
                    let out = all_reduce_grads(&c, grads_of(rank), 40).unwrap();
                    c.finish().unwrap();
                    out
                })
            })
            .collect();
        let expected: Vec<Tensor> = (0..shapes.len())
            .map(|i| ((&grads_of(0)[i] + &grads_of(1)[i]).unwrap() + &grads_of(2)[i]).unwrap())
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            for (got, want) in out.iter().zip(&expected) {
                assert_eq!(got.dims(), want.dims());
                let (a, b) = (
                    got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn scalars_reduce_with_sum_max_and_min() {
        let handles: Vec<_> = groups(3)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let r = g.rank() as f64;
                    let c = TcpCollective::new(g);
                    let mut sums = [r, 1.0, 0.25 * r];
                    c.all_reduce_scalars(&mut sums, ReduceOp::Sum).unwrap();
                    let mut max = [r, -r];
                    c.all_reduce_scalars(&mut max, ReduceOp::Max).unwrap();
                    let mut min = [r];
                    c.all_reduce_scalars(&mut min, ReduceOp::Min).unwrap();
                    c.barrier().unwrap();
                    c.finish().unwrap();
                    (sums, max, min)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), ([3.0, 3.0, 0.75], [2.0, 0.0], [0.0]));
        }
    }

    /// Ranks that call different collectives get an error naming the mismatch, not a wrong sum.
    #[test]
    fn ranks_out_of_step_are_an_error() {
        let handles: Vec<_> = groups(2)
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let rank = g.rank();
                    let c = TcpCollective::new(g);
                    let mut v = vec![1.0; rank + 1];
                    let r = c.all_reduce_scalars(&mut v, ReduceOp::Sum).map_err(|e| e.to_string());
                    if let Err(e) = &r {
                        c.abort(e);
                    }
                    r
                })
            })
            .collect();
        let root = handles.into_iter().next().unwrap().join().unwrap().unwrap_err();
        assert!(root.starts_with("talking to rank 1: out of step"), "{root}");
    }
}
