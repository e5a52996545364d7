//! Rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT; every other rank connects (retrying
//! until a deadline, as rank 0 may start later) and says its rank, WORLD_SIZE, collective and
//! config; rank 0 checks that they agree and, once all have joined, sends each the payload (the
//! NCCL unique id). The connections stay open as the liveness channel (`liveness::Group`).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::durations::{env_seconds, seconds};
use super::error::DistributedError;
use super::wire::{read_frame, write_frame, Frame, Hello, Welcome, MAGIC};
use super::world::WorldInfo;

/// How long ranks wait for each other.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Rank 0 for every rank to join; the others for rank 0 to answer.
    pub rendezvous: Duration,
    /// Between heartbeats on every connection.
    pub heartbeat: Duration,
    /// Silence after which a peer is taken for dead (a frozen process, a machine gone).
    pub peer_timeout: Duration,
}

impl Timing {
    /// `LORA_FT_RENDEZVOUS_TIMEOUT` (default 300 s: other machines may start late) and
    /// `LORA_FT_PEER_TIMEOUT` (default 10 s), in seconds.
    pub fn from_env() -> Self {
        Self {
            rendezvous: env_seconds("LORA_FT_RENDEZVOUS_TIMEOUT", Duration::from_secs(300)),
            heartbeat: Duration::from_secs(1),
            peer_timeout: env_seconds("LORA_FT_PEER_TIMEOUT", Duration::from_secs(10)),
        }
    }
}

/// What a rank brings to the rendezvous.
pub struct Spec<'a> {
    pub world: &'a WorldInfo,
    /// "cpu" or "nccl".
    pub backend: &'a str,
    /// What every rank must agree on (the config).
    pub run: serde_json::Value,
    pub timing: Timing,
}

/// The connections a rank keeps (rank 0: one per other rank, in rank order; the others: one to
/// rank 0), and rank 0's payload.
pub struct Joined {
    pub links: Vec<(usize, TcpStream)>,
    pub payload: Vec<u8>,
}

/// Joins the run: rank 0 serves, and once every rank has joined sends each `make_payload()` (an
/// error from it fails the rendezvous on every rank); the others connect.
pub fn join(
    spec: &Spec,
    make_payload: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Joined, DistributedError> {
    let hello = Hello {
        magic: MAGIC.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        rank: spec.world.rank,
        world_size: spec.world.world_size,
        backend: spec.backend.into(),
        run: spec.run.clone(),
    };
    if spec.world.rank == 0 {
        serve(spec, &hello, make_payload)
    } else {
        connect(spec, &hello)
    }
}

fn rendezvous_error(spec: &Spec, message: impl Into<String>) -> DistributedError {
    DistributedError::Rendezvous { addr: spec.world.master.clone(), message: message.into() }
}

/// The address rank 0 binds: MASTER_ADDR itself when it is a loopback address (a one-machine
/// run stays off the network), else every interface on MASTER_PORT (MASTER_ADDR is how the
/// other machines reach this one, which may not be an address of its own).
fn bind_addr(master: SocketAddr) -> SocketAddr {
    if master.ip().is_loopback() {
        return master;
    }
    let any = match master.ip() {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(any, master.port())
}

fn resolve(master: &str) -> io::Result<SocketAddr> {
    master.to_socket_addrs()?.next().ok_or_else(|| io::Error::other("the name resolves to no address"))
}

fn serve(
    spec: &Spec,
    hello: &Hello,
    make_payload: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Joined, DistributedError> {
    let listen_error = |source| DistributedError::Listen { addr: spec.world.master.clone(), source };
    let addr = resolve(&spec.world.master).map_err(listen_error)?;
    let listener = TcpListener::bind(bind_addr(addr)).map_err(listen_error)?;
    listener.set_nonblocking(true).map_err(listen_error)?;
    let deadline = Instant::now() + spec.timing.rendezvous;
    let mut joined: BTreeMap<usize, TcpStream> = BTreeMap::new();
    let mut last_beat = Instant::now();
    while joined.len() + 1 < spec.world.world_size {
        match listener.accept() {
            Ok((stream, from)) => match admit(stream, from, hello, &joined, spec) {
                Admit::Joined(rank, stream) => {
                    tracing::info!("rank {rank} joined from {from}");
                    joined.insert(rank, stream);
                }
                Admit::Stray(why) => tracing::warn!("ignoring a connection from {from}: {why}"),
                Admit::Refused(message, stream) => {
                    let mut all: Vec<TcpStream> = joined.into_values().collect();
                    all.push(stream);
                    return Err(refuse(spec, all, message));
                }
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(rendezvous_error(spec, format!("accepting connections: {e}"))),
        }
        if Instant::now() > deadline {
            let missing: Vec<String> = (1..spec.world.world_size)
                .filter(|r| !joined.contains_key(r))
                .map(|r| r.to_string())
                .collect();
            let message = format!(
                "rank(s) {} of WORLD_SIZE={} did not join within {} s",
                missing.join(", "),
                spec.world.world_size,
                seconds(spec.timing.rendezvous)
            );
            return Err(refuse(spec, joined.into_values().collect(), message));
        }
        if last_beat.elapsed() >= spec.timing.heartbeat {
            // joined ranks wait for the welcome with the peer timeout: keep them from giving up
            for stream in joined.values_mut() {
                let _ = write_frame(stream, &Frame::Heartbeat);
            }
            last_beat = Instant::now();
        }
    }
    let payload = match make_payload() {
        Ok(p) => p,
        Err(message) => return Err(refuse(spec, joined.into_values().collect(), message)),
    };
    let welcome = Frame::Welcome(Welcome { error: None, payload: payload.clone() });
    for (rank, stream) in joined.iter_mut() {
        write_frame(stream, &welcome)
            .map_err(|e| rendezvous_error(spec, format!("rank {rank} left before the run started: {e}")))?;
    }
    Ok(Joined { links: joined.into_iter().collect(), payload })
}

enum Admit {
    Joined(usize, TcpStream),
    /// Not a rank of lora-ft: ignored.
    Stray(String),
    /// A rank that cannot be in this run: the rendezvous fails, on every rank, with this.
    Refused(String, TcpStream),
}

fn admit(
    mut stream: TcpStream,
    from: SocketAddr,
    ours: &Hello,
    joined: &BTreeMap<usize, TcpStream>,
    spec: &Spec,
) -> Admit {
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(spec.timing.peer_timeout)))
        .and_then(|()| stream.set_write_timeout(Some(spec.timing.peer_timeout)))
        .and_then(|()| stream.set_nodelay(true));
    if let Err(e) = setup {
        return Admit::Stray(e.to_string());
    }
    let theirs = match read_frame(&mut stream) {
        Ok(Frame::Hello(h)) if h.magic == MAGIC => h,
        Ok(_) => return Admit::Stray("not a lora-ft rank".into()),
        Err(e) => return Admit::Stray(format!("not a lora-ft rank ({e})")),
    };
    match disagreement(ours, &theirs, joined, from) {
        Some(message) => Admit::Refused(message, stream),
        None => Admit::Joined(theirs.rank, stream),
    }
}

/// Why a rank that said `theirs` cannot join rank 0's run, if it cannot.
fn disagreement(
    ours: &Hello,
    theirs: &Hello,
    joined: &BTreeMap<usize, TcpStream>,
    from: SocketAddr,
) -> Option<String> {
    let r = theirs.rank;
    if theirs.world_size != ours.world_size {
        return Some(format!(
            "rank {r} (from {from}) has WORLD_SIZE={}, rank 0 has WORLD_SIZE={}: start every rank with the same WORLD_SIZE",
            theirs.world_size, ours.world_size
        ));
    }
    if r == 0 || r >= ours.world_size {
        return Some(format!(
            "a process from {from} says it is rank {r}; WORLD_SIZE={} has ranks 1-{} besides rank 0",
            ours.world_size,
            ours.world_size - 1
        ));
    }
    if joined.contains_key(&r) {
        return Some(format!("two processes say they are rank {r} (the second from {from})"));
    }
    if theirs.version != ours.version {
        return Some(format!("rank {r} runs lora-ft {}, rank 0 runs {}", theirs.version, ours.version));
    }
    if theirs.backend != ours.backend {
        return Some(format!(
            "rank {r} trains on {}, rank 0 on {}: every rank must use the same kind of device",
            device_kind(&theirs.backend),
            device_kind(&ours.backend)
        ));
    }
    first_difference(&ours.run, &theirs.run, "")
        .map(|(key, a, b)| format!("rank {r}'s config differs from rank 0's at {key}: {b} (rank 0: {a})"))
}

fn device_kind(backend: &str) -> &str {
    if backend == "nccl" {
        "GPUs (NCCL)"
    } else {
        "the CPU"
    }
}

/// The first key path where two JSON values differ, with both values.
fn first_difference(
    a: &serde_json::Value,
    b: &serde_json::Value,
    path: &str,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                first_difference(x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), &sub)
            })
        }
        _ if a == b => None,
        _ => {
            Some((if path.is_empty() { "the top".into() } else { path.into() }, a.to_string(), b.to_string()))
        }
    }
}

/// Tells every connected rank why the run cannot start; the same error on rank 0.
fn refuse(spec: &Spec, streams: Vec<TcpStream>, message: String) -> DistributedError {
    let frame = Frame::Welcome(Welcome { error: Some(message.clone()), payload: Vec::new() });
    for mut stream in streams {
        let _ = write_frame(&mut stream, &frame);
    }
    rendezvous_error(spec, message)
}

fn connect(spec: &Spec, hello: &Hello) -> Result<Joined, DistributedError> {
    let mut stream = connect_with_retries(spec)?;
    let io_error = |e: io::Error| rendezvous_error(spec, format!("talking to rank 0: {e}"));
    stream.set_nodelay(true).map_err(io_error)?;
    stream.set_read_timeout(Some(spec.timing.peer_timeout)).map_err(io_error)?;
    stream.set_write_timeout(Some(spec.timing.peer_timeout)).map_err(io_error)?;
    write_frame(&mut stream, &Frame::Hello(hello.clone())).map_err(io_error)?;
    // rank 0 answers once every rank has joined; until then it sends heartbeats
    loop {
        match read_frame(&mut stream) {
            Ok(Frame::Heartbeat) => continue,
            Ok(Frame::Welcome(Welcome { error: Some(message), .. })) => {
                return Err(rendezvous_error(spec, message))
            }
            Ok(Frame::Welcome(Welcome { error: None, payload })) => {
                return Ok(Joined { links: vec![(0, stream)], payload })
            }
            Ok(other) => {
                return Err(rendezvous_error(spec, format!("rank 0 sent {other:?} before the welcome")))
            }
            Err(e) => {
                return Err(rendezvous_error(
                    spec,
                    format!(
                        "rank 0 accepted this rank, then went silent or away before the run started: {e}"
                    ),
                ))
            }
        }
    }
}

/// Connects to rank 0, retrying until the rendezvous deadline (rank 0 may not listen yet).
fn connect_with_retries(spec: &Spec) -> Result<TcpStream, DistributedError> {
    let started = Instant::now();
    let deadline = started + spec.timing.rendezvous;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = resolve(&spec.world.master).and_then(|addr| {
            TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(10), Duration::from_secs(2)))
        });
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(source) if Instant::now() + Duration::from_millis(200) >= deadline => {
                return Err(DistributedError::Unreachable {
                    addr: spec.world.master.clone(),
                    waited_s: started.elapsed().as_secs_f64().round() as u64,
                    source,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn timing(rendezvous_s: f64) -> Timing {
        Timing {
            rendezvous: Duration::from_secs_f64(rendezvous_s),
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(2),
        }
    }

    fn world(rank: usize, world_size: usize, port: u16) -> WorldInfo {
        WorldInfo { rank, world_size, local_rank: rank, master: format!("127.0.0.1:{port}") }
    }

    /// Joins as `rank` on a thread; `run` is the config every rank must agree on.
    fn spawn_rank(
        w: WorldInfo,
        run: serde_json::Value,
        payload: Vec<u8>,
    ) -> std::thread::JoinHandle<Result<Joined, DistributedError>> {
        std::thread::spawn(move || {
            let spec = Spec { world: &w, backend: "cpu", run, timing: timing(10.0) };
            join(&spec, || Ok(payload))
        })
    }

    #[test]
    fn every_rank_joins_and_gets_rank_0s_payload() {
        let port = free_port();
        let run = serde_json::json!({"train": {"lr": 1e-3}});
        let ranks: Vec<_> =
            (0..3).rev().map(|r| spawn_rank(world(r, 3, port), run.clone(), vec![r as u8, 7])).collect();
        let mut joined: Vec<Joined> = ranks.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        joined.reverse();
        assert_eq!(joined[0].links.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [1, 2]);
        for j in &joined[1..] {
            assert_eq!(j.links.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [0]);
        }
        assert!(joined.iter().all(|j| j.payload == [0, 7]), "every rank holds rank 0's payload");
    }

    /// A rank started with another WORLD_SIZE fails the rendezvous on both sides with one message
    /// naming both values, well before the deadline.
    #[test]
    fn a_different_world_size_is_refused_on_both_sides() {
        let port = free_port();
        let run = serde_json::json!({});
        let started = Instant::now();
        let root = spawn_rank(world(0, 2, port), run.clone(), vec![]);
        let other = spawn_rank(world(1, 3, port), run, vec![]);
        let (a, b) = (root.join().unwrap(), other.join().unwrap());
        assert!(started.elapsed() < Duration::from_secs(5));
        for err in [a.err().unwrap().to_string(), b.err().unwrap().to_string()] {
            assert!(
                err.contains("rank 1 (from 127.0.0.1:")
                    && err.contains("has WORLD_SIZE=3, rank 0 has WORLD_SIZE=2"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_different_config_is_refused_naming_the_key() {
        let port = free_port();
        let root =
            spawn_rank(world(0, 2, port), serde_json::json!({"train": {"lr": 0.001, "seed": 1}}), vec![]);
        let other =
            spawn_rank(world(1, 2, port), serde_json::json!({"train": {"lr": 0.002, "seed": 1}}), vec![]);
        let err = other.join().unwrap().err().unwrap().to_string();
        assert!(
            err.contains("rank 1's config differs from rank 0's at train.lr: 0.002 (rank 0: 0.001)"),
            "{err}"
        );
        assert!(root.join().unwrap().is_err());
    }

    /// A port of 127.0.0.1 bound by a socket that never listens: connections to it are refused,
    /// and no other test can take it while the guard lives (a port from `free_port` is released
    /// at once, and a test running beside this one may listen on it).
    struct RefusingPort {
        fd: libc::c_int,
        port: u16,
    }

    impl RefusingPort {
        fn new() -> Self {
            // SAFETY: plain socket calls on a sockaddr_in owned here; the fd is closed in Drop.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
                let mut addr: libc::sockaddr_in = std::mem::zeroed();
                addr.sin_family = libc::AF_INET as libc::sa_family_t;
                addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
                let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                let bound = libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len);
                assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
                let mut out_len = len;
                libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut out_len);
                Self { fd, port: u16::from_be(addr.sin_port) }
            }
        }
    }

    impl Drop for RefusingPort {
        fn drop(&mut self) {
            // SAFETY: the fd was opened by `new` and is closed once.
            unsafe { libc::close(self.fd) };
        }
    }

    /// Nobody listening: a clear error naming the address after the deadline, not a hang.
    #[test]
    fn an_unreachable_rank_0_is_a_clear_error_after_the_deadline() {
        let refusing = RefusingPort::new();
        let port = refusing.port;
        let w = world(1, 2, port);
        let spec = Spec { world: &w, backend: "cpu", run: serde_json::json!({}), timing: timing(1.0) };
        let started = Instant::now();
        let err = join(&spec, || Ok(vec![])).err().unwrap().to_string();
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(4), "{waited:?}");
        assert!(
            err.starts_with(&format!(
                "could not reach rank 0 at MASTER_ADDR:MASTER_PORT = 127.0.0.1:{port} within 1 s"
            )),
            "{err}"
        );
    }

    /// Rank 0 alone: the ranks that never came are named when its deadline passes.
    #[test]
    fn missing_ranks_are_named_at_rank_0s_deadline() {
        let port = free_port();
        let w = world(0, 3, port);
        let spec = Spec { world: &w, backend: "cpu", run: serde_json::json!({}), timing: timing(0.5) };
        let err = join(&spec, || Ok(vec![])).err().unwrap().to_string();
        assert!(err.ends_with("rank(s) 1, 2 of WORLD_SIZE=3 did not join within 0.5 s"), "{err}");
    }

    /// Something else connecting to MASTER_PORT is ignored, and the run still forms.
    #[test]
    fn a_stray_connection_is_ignored() {
        let port = free_port();
        let root = spawn_rank(world(0, 2, port), serde_json::json!({}), vec![9]);
        let mut stray = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        io::Write::write_all(&mut stray, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let other = spawn_rank(world(1, 2, port), serde_json::json!({}), vec![]);
        assert_eq!(other.join().unwrap().unwrap().payload, [9]);
        assert_eq!(root.join().unwrap().unwrap().links.len(), 1);
    }
}
