//! This process's place in a run, from the launcher's variables.

use super::error::DistributedError;

/// This process's place in a run, from the launcher's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldInfo {
    pub rank: usize,
    pub world_size: usize,
    /// The GPU of this rank on its machine (`cuda:LOCAL_RANK`).
    pub local_rank: usize,
    /// `MASTER_ADDR:MASTER_PORT`, where rank 0 listens.
    pub master: String,
}

impl WorldInfo {
    /// From RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `None` when WORLD_SIZE is
    /// unset or 1 (one process: nothing to agree with).
    pub fn from_env() -> Result<Option<Self>, DistributedError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, DistributedError> {
        let Some(world_size) = var("WORLD_SIZE") else { return Ok(None) };
        let world_size = parse_var("WORLD_SIZE", &world_size, "a number of ranks, at least 1")?;
        if world_size == 0 {
            return Err(bad("WORLD_SIZE", "0", "a number of ranks, at least 1"));
        }
        if world_size == 1 {
            return Ok(None);
        }
        let required =
            |name: &'static str| var(name).ok_or(DistributedError::MissingVariable { name, world_size });
        let rank_text = required("RANK")?;
        let rank = parse_var("RANK", &rank_text, "this process's rank")?;
        if rank >= world_size {
            let expected = format!("a rank below WORLD_SIZE={world_size} (ranks count from 0)");
            return Err(DistributedError::BadVariable { name: "RANK", value: rank_text, expected });
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => parse_var("LOCAL_RANK", &v, "the GPU index of this rank on its machine")?,
            None => rank,
        };
        let addr = required("MASTER_ADDR")?;
        let port_text = required("MASTER_PORT")?;
        let port: u16 = match port_text.parse() {
            Ok(p) if p > 0 => p,
            _ => return Err(bad("MASTER_PORT", &port_text, "a TCP port, 1-65535")),
        };
        // an IPv6 address needs brackets before the port
        let host = if addr.contains(':') && !addr.starts_with('[') { format!("[{addr}]") } else { addr };
        Ok(Some(Self { rank, world_size, local_rank, master: format!("{host}:{port}") }))
    }
}

fn parse_var(name: &'static str, value: &str, expected: &str) -> Result<usize, DistributedError> {
    value.trim().parse().map_err(|_| bad(name, value, expected))
}

fn bad(name: &'static str, value: &str, expected: &str) -> DistributedError {
    DistributedError::BadVariable { name, value: value.to_string(), expected: expected.to_string() }
}
