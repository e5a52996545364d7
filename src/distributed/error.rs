//! How a distributed run fails: the errors a rank reports, and a peer's failure as the others
//! hear of it.

/// Exit status of a rank that stopped because another rank failed (the launcher looks past it
/// for the rank that failed first).
pub const EXIT_PEER_FAILED: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    #[error("{name}={value:?}: {expected}")]
    BadVariable { name: &'static str, value: String, expected: String },
    #[error("WORLD_SIZE={world_size} is set but {name} is not (launchers set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")]
    MissingVariable { name: &'static str, world_size: usize },
    #[error("rank 0 cannot listen on {addr}: {source}; set MASTER_PORT to a free port")]
    Listen { addr: String, source: std::io::Error },
    #[error(
        "could not reach rank 0 at MASTER_ADDR:MASTER_PORT = {addr} within {waited_s} s: {source}; \
         is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?"
    )]
    Unreachable { addr: String, waited_s: u64, source: std::io::Error },
    #[error("rendezvous at {addr}: {message}")]
    Rendezvous { addr: String, message: String },
    /// Another rank failed or went away: this rank stops too.
    #[error("stopping: {0}")]
    PeerFailed(Failure),
    #[error("talking to rank {peer}: {message}")]
    Protocol { peer: usize, message: String },
}

/// Which rank failed and what happened to it, as every rank reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub rank: usize,
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} {}", self.rank, self.what)
    }
}
