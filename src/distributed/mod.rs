//! Data-parallel training: one process per GPU (a *rank*), each training its shard of every
//! global batch; the LoRA gradients are summed over the ranks before the optimizer step, so every
//! rank takes the same step and holds the same adapter.
//!
//! ```text
//! launcher (lora-ft train CONFIG --gpus N)          or an external one (torchrun): RANK, WORLD_SIZE,
//!   └─ N × lora-ft train CONFIG  (RANK=r ...)           LOCAL_RANK, MASTER_ADDR, MASTER_PORT
//!        rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect and say who they
//!                    are; rank 0 checks WORLD_SIZE and the config, and sends the NCCL unique id
//!        liveness:   those sockets stay open; heartbeats, and a rank that fails says so, so every
//!                    rank stops with one message instead of waiting in a collective forever
//!        collective: NCCL on GPUs (gradients in ~25 MB buckets, a few scalars), or, for CPU runs
//!                    and the tests, sums through rank 0 over the same sockets
//! ```
//!
//! Rank r trains rows `shard_rows(len, r, world_size)` of each global micro-batch, the batch one
//! process with `batch_size × world_size` rows would train; the loss is normalised by the trained
//! tokens of the global batch, so the summed gradients are the one-process gradients.

pub mod collective;
mod durations;
mod error;
pub mod launcher;
pub mod liveness;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod rendezvous;
mod wire;
mod world;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use candle_core::Device;

pub use collective::{all_reduce_grads, Collective, ReduceOp, Solo, TcpCollective, BUCKET_BYTES};
pub use durations::{env_seconds, seconds};
pub use error::{DistributedError, Failure, EXIT_PEER_FAILED};
pub use world::WorldInfo;

/// The rows of a global micro-batch of `rows` rows that `rank` trains: contiguous, and as even as
/// the count allows (a full batch of `batch_size × world_size` rows gives each rank
/// `batch_size`; a short last batch of an epoch may leave a rank none).
pub fn shard_rows(rows: usize, rank: usize, world_size: usize) -> Range<usize> {
    assert!(rank < world_size, "rank {rank} of {world_size}");
    rows * rank / world_size..rows * (rank + 1) / world_size
}

/// A rank that joined its run: connected to the others, not yet on its device.
pub struct Member {
    group: liveness::Group,
    /// Rank 0's payload: NCCL's unique id for a GPU run.
    payload: Vec<u8>,
}

/// Joins the run `world` describes, on GPUs (`gpu`: NCCL) or the CPU; `run` is what every rank
/// must agree on (the config). From here on, a failure of another rank ends this process within
/// a few seconds even if its main thread is stuck in a device call (`liveness::exit_after`).
/// The rendezvous comes before the device opens, so that a rank whose GPU will not open tells
/// the others at once.
pub fn join(world: &WorldInfo, gpu: bool, run: serde_json::Value) -> anyhow::Result<Member> {
    let timing = rendezvous::Timing::from_env();
    let backend = if gpu { "nccl" } else { "cpu" };
    let spec = rendezvous::Spec { world, backend, run, timing };
    tracing::info!("rank {} of {}: joining the run at {}", world.rank, world.world_size, world.master);
    let joined = rendezvous::join(&spec, || root_payload(gpu))?;
    let group = liveness::Group::start(world.rank, world.world_size, joined.links, timing)
        .context("starting the liveness channel")?;
    group.on_failure(liveness::exit_after(EXIT_GRACE, rank_prefix(world.rank)));
    Ok(Member { group, payload: joined.payload })
}

impl Member {
    /// The run's collective on `device`: NCCL for a GPU, the CPU collective for the CPU. A
    /// failure to build it is told to the other ranks.
    pub fn collective(self, device: &Device) -> anyhow::Result<Arc<dyn Collective>> {
        if device.is_cpu() {
            return Ok(Arc::new(TcpCollective::new(self.group)));
        }
        gpu_collective(self.group, device, &self.payload)
    }

    /// This rank failed before it trained: the others stop with `e`.
    pub fn fail(&self, e: &anyhow::Error) {
        self.group.fail_self(&format!("failed: {e:#}"));
    }
}

/// How long a rank whose peer failed waits for its main thread to stop by itself.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// What a rank's log lines and messages start with.
pub fn rank_prefix(rank: usize) -> String {
    format!("[rank {rank}] ")
}

/// Rank 0's payload for the others: the NCCL unique id on GPUs, nothing on the CPU.
fn root_payload(gpu: bool) -> Result<Vec<u8>, String> {
    if !gpu {
        return Ok(Vec::new());
    }
    #[cfg(feature = "cuda")]
    return nccl::unique_id().map_err(|e| format!("rank 0: {e:#}"));
    #[cfg(not(feature = "cuda"))]
    Err("a GPU run needs a build with --features cuda".into())
}

#[cfg(feature = "cuda")]
fn gpu_collective(group: liveness::Group, device: &Device, id: &[u8]) -> anyhow::Result<Arc<dyn Collective>> {
    Ok(Arc::new(nccl::NcclCollective::new(group, device, id)?))
}

#[cfg(not(feature = "cuda"))]
fn gpu_collective(
    group: liveness::Group,
    _device: &Device,
    _id: &[u8],
) -> anyhow::Result<Arc<dyn Collective>> {
    let message = "a GPU run needs a build with --features cuda";
    group.fail_self(&format!("failed: {message}"));
    anyhow::bail!(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world(vars: &[(&str, &str)]) -> Result<Option<WorldInfo>, DistributedError> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WorldInfo::from_vars(|name| vars.get(name).cloned())
    }

    const LAUNCHED: [(&str, &str); 4] =
        [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];

    #[test]
    fn launcher_variables_give_rank_world_size_and_master() {
        let w = world(&LAUNCHED).unwrap().unwrap();
        assert_eq!(w, WorldInfo { rank: 1, world_size: 2, local_rank: 1, master: "10.0.0.1:29500".into() });
        let w = world(&[LAUNCHED.as_slice(), &[("LOCAL_RANK", "0")]].concat()).unwrap().unwrap();
        assert_eq!(w.local_rank, 0);
        assert_eq!(world(&[]).unwrap(), None, "no WORLD_SIZE: one process");
        assert_eq!(world(&[("WORLD_SIZE", "1")]).unwrap(), None);
    }

    #[test]
    fn bad_launcher_variables_are_named() {
        let with = |k: &str, v: &str| {
            let mut vars: Vec<(&str, &str)> = LAUNCHED.iter().copied().filter(|(n, _)| *n != k).collect();
            if !v.is_empty() {
                vars.push((k, v));
            }
            world(&vars).unwrap_err().to_string()
        };
        assert_eq!(with("RANK", "2"), "RANK=\"2\": a rank below WORLD_SIZE=2 (ranks count from 0)");
        assert!(
            with("WORLD_SIZE", "two").starts_with("WORLD_SIZE=\"two\": "),
            "{}",
            with("WORLD_SIZE", "two")
        );
        assert!(with("WORLD_SIZE", "0").starts_with("WORLD_SIZE=\"0\""));
        assert!(with("MASTER_PORT", "99999").starts_with("MASTER_PORT=\"99999\": a TCP port"));
        let err = with("MASTER_ADDR", "");
        assert!(err.starts_with("WORLD_SIZE=2 is set but MASTER_ADDR is not"), "{err}");
        assert!(with("RANK", "").contains("but RANK is not"));
    }

    /// Full batches split into equal contiguous slices in rank order; a short batch as evenly as
    /// it goes; every row is trained by exactly one rank.
    #[test]
    fn shards_cover_every_row_once_in_rank_order() {
        assert_eq!(shard_rows(8, 0, 2), 0..4);
        assert_eq!(shard_rows(8, 1, 2), 4..8);
        assert_eq!(shard_rows(12, 2, 3), 8..12);
        assert_eq!((shard_rows(3, 0, 2), shard_rows(3, 1, 2)), (0..1, 1..3));
        assert_eq!((shard_rows(1, 0, 2), shard_rows(1, 1, 2)), (0..0, 0..1));
        for rows in 0..20 {
            for world_size in 1..6 {
                let shards: Vec<Range<usize>> =
                    (0..world_size).map(|r| shard_rows(rows, r, world_size)).collect();
                assert_eq!(shards[0].start, 0);
                assert_eq!(shards[world_size - 1].end, rows);
                assert!(
                    shards.windows(2).all(|w| w[0].end == w[1].start),
                    "{rows} over {world_size}: {shards:?}"
                );
                assert!(shards.iter().all(|s| s.len() <= rows.div_ceil(world_size)));
            }
        }
    }
}
