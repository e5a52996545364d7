//! The liveness channel: the rendezvous connections, kept open for the whole run. Every rank sends
//! a heartbeat each second; a reader thread per connection takes in the peer's frames. A peer
//! whose connection closes without a goodbye (killed, crashed), that says it failed, or that is
//! silent for the peer timeout (frozen, its machine gone) fails the run on every rank: rank 0
//! forwards what it heard to the others, collectives waiting on the sockets return the failure,
//! and the failure hooks run (the NCCL communicator is aborted, so no rank waits in a collective
//! forever). The CPU collective's data travels on the same connections.

use std::collections::HashSet;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::error::{DistributedError, Failure};
use super::rendezvous::Timing;
use super::wire::{read_frame, write_frame, FailedMsg, Frame};

type Hook = Box<dyn Fn(&Failure) + Send>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // a thread that panicked while holding one of these left nothing half-done worth refusing
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Shared {
    rank: usize,
    failure: Mutex<Option<Failure>>,
    /// This rank is done (finished, or failed and said so): a connection closing is no news.
    done: AtomicBool,
    writers: Vec<(usize, Arc<Mutex<TcpStream>>)>,
    /// Peers that said goodbye.
    byes: Mutex<HashSet<usize>>,
    hooks: Mutex<Vec<Hook>>,
}

impl Shared {
    /// Records the run's first failure, passes it on (rank 0 to every other rank) and runs the
    /// hooks; later ones are the same failure seen again.
    fn fail(&self, failure: Failure) {
        {
            let mut slot = lock(&self.failure);
            if slot.is_some() || self.done.load(Ordering::SeqCst) {
                return;
            }
            *slot = Some(failure.clone());
        }
        if self.rank == 0 {
            let frame = Frame::Failed(FailedMsg { rank: failure.rank, what: failure.what.clone() });
            for (peer, writer) in &self.writers {
                if *peer != failure.rank {
                    let _ = write_frame(&mut *lock(writer), &frame);
                }
            }
        }
        for hook in lock(&self.hooks).iter() {
            hook(&failure);
        }
    }

    fn failure(&self) -> Option<Failure> {
        lock(&self.failure).clone()
    }

    fn done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
}

struct Link {
    peer: usize,
    data: Mutex<Receiver<Vec<u8>>>,
}

/// One rank's end of the liveness channel.
pub struct Group {
    shared: Arc<Shared>,
    links: Vec<Link>,
    world_size: usize,
}

impl Group {
    /// Starts the reader and heartbeat threads on the rendezvous connections.
    pub fn start(
        rank: usize,
        world_size: usize,
        links: Vec<(usize, TcpStream)>,
        timing: Timing,
    ) -> io::Result<Self> {
        let mut writers = Vec::new();
        let mut readers = Vec::new();
        for (peer, stream) in links {
            stream.set_read_timeout(Some(timing.peer_timeout))?;
            stream.set_write_timeout(Some(timing.peer_timeout))?;
            readers.push((peer, stream.try_clone()?));
            writers.push((peer, Arc::new(Mutex::new(stream))));
        }
        let shared = Arc::new(Shared {
            rank,
            failure: Mutex::new(None),
            done: AtomicBool::new(false),
            writers,
            byes: Mutex::new(HashSet::new()),
            hooks: Mutex::new(Vec::new()),
        });
        let mut group_links = Vec::new();
        for (peer, stream) in readers {
            let (tx, rx) = channel();
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("rank-{peer}-reader"))
                .spawn(move || read_loop(peer, stream, tx, &shared, timing.peer_timeout))?;
            group_links.push(Link { peer, data: Mutex::new(rx) });
        }
        let beat = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || heartbeat_loop(&beat, timing.heartbeat))?;
        Ok(Self { shared, links: group_links, world_size })
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The peers this rank talks to: every other rank on rank 0, rank 0 on the others.
    pub fn peers(&self) -> Vec<usize> {
        self.links.iter().map(|l| l.peer).collect()
    }

    /// The run's first failure, if any.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.failure()
    }

    /// Runs `hook` when the run fails (at once if it already has).
    pub fn on_failure(&self, hook: impl Fn(&Failure) + Send + 'static) {
        if let Some(f) = self.failure() {
            hook(&f);
        }
        lock(&self.shared.hooks).push(Box::new(hook));
    }

    fn stopped(&self) -> DistributedError {
        let failure = self.failure().unwrap_or_else(|| Failure {
            rank: self.rank(),
            what: "already ended its part of the run".into(),
        });
        DistributedError::PeerFailed(failure)
    }

    /// Sends a data frame to the peer at `index` of `peers()`.
    pub fn send(&self, index: usize, bytes: Vec<u8>) -> Result<(), DistributedError> {
        if self.failure().is_some() || self.shared.done() {
            return Err(self.stopped());
        }
        let (peer, writer) = &self.shared.writers[index];
        let written = write_frame(&mut *lock(writer), &Frame::Data(bytes));
        written.map_err(|e| {
            self.shared.fail(Failure { rank: *peer, what: format!("stopped taking data ({e})") });
            self.stopped()
        })
    }

    /// The next data frame from the peer at `index`, or the run's failure.
    pub fn recv(&self, index: usize) -> Result<Vec<u8>, DistributedError> {
        let rx = lock(&self.links[index].data);
        loop {
            if self.failure().is_some() {
                return Err(self.stopped());
            }
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(bytes) => return Ok(bytes),
                Err(RecvTimeoutError::Timeout) => continue,
                // the reader ended: it recorded why, unless the peer said goodbye
                Err(RecvTimeoutError::Disconnected) => {
                    let peer = self.links[index].peer;
                    self.shared.fail(Failure { rank: peer, what: "ended its part of the run early".into() });
                    return Err(self.stopped());
                }
            }
        }
    }

    /// Tells the other ranks that this one failed, and why; they stop with this message.
    pub fn fail_self(&self, what: &str) {
        if self.shared.done.swap(true, Ordering::SeqCst) {
            return;
        }
        let frame = Frame::Failed(FailedMsg { rank: self.rank(), what: what.to_string() });
        for (_, writer) in &self.shared.writers {
            let _ = write_frame(&mut *lock(writer), &frame);
        }
    }

    /// Ends this rank's part of a run that went well: its connections closing next are not
    /// failures. Rank 0 first waits for every rank's goodbye, so that no rank is still listening
    /// when rank 0's connections close.
    pub fn finish(&self) -> Result<(), DistributedError> {
        if self.rank() == 0 {
            while lock(&self.shared.byes).len() < self.links.len() {
                if self.failure().is_some() {
                    return Err(self.stopped());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.shared.done.store(true, Ordering::SeqCst);
        for (_, writer) in &self.shared.writers {
            let _ = write_frame(&mut *lock(writer), &Frame::Bye);
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::SeqCst);
        // wakes the reader threads (end of stream)
        for (_, writer) in &self.shared.writers {
            let _ = lock(writer).shutdown(Shutdown::Both);
        }
    }
}

fn read_loop(peer: usize, mut stream: TcpStream, data: Sender<Vec<u8>>, shared: &Shared, timeout: Duration) {
    let mut said_bye = false;
    loop {
        let frame = read_frame(&mut stream);
        match frame {
            Ok(Frame::Data(bytes)) => {
                let _ = data.send(bytes);
            }
            Ok(Frame::Heartbeat) => {}
            Ok(Frame::Bye) => {
                said_bye = true;
                lock(&shared.byes).insert(peer);
            }
            Ok(Frame::Failed(f)) => shared.fail(Failure { rank: f.rank, what: f.what }),
            Ok(other) => {
                shared.fail(Failure { rank: peer, what: format!("sent {other:?} in the middle of the run") })
            }
            Err(_) if said_bye || shared.done() => return,
            Err(e) => return shared.fail(Failure { rank: peer, what: lost_peer(&e, timeout) }),
        }
    }
}

/// What a connection error says about the peer.
fn lost_peer(e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "sent nothing for {} s (the process is frozen, or its machine or the network is down)",
            super::durations::seconds(timeout)
        ),
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            "exited without a word (killed, or crashed; its own output says which)".into()
        }
        _ => format!("cannot be reached any more ({e})"),
    }
}

fn heartbeat_loop(shared: &Shared, every: Duration) {
    loop {
        std::thread::sleep(every);
        if shared.done() || shared.failure().is_some() {
            return;
        }
        for (peer, writer) in &shared.writers {
            if let Err(e) = write_frame(&mut *lock(writer), &Frame::Heartbeat) {
                if !shared.done() {
                    shared.fail(Failure { rank: *peer, what: format!("stopped taking data ({e})") });
                }
            }
        }
    }
}

/// Set by whichever of the main thread and the failure timer reports the failure first: the
/// other says nothing, so a stopping rank prints one message.
static MESSAGE_SAID: AtomicBool = AtomicBool::new(false);

/// Whether the caller may print the message a rank ends with (true once per process).
pub fn claim_exit_message() -> bool {
    !MESSAGE_SAID.swap(true, Ordering::SeqCst)
}

/// A failure hook for a rank's process: after `grace` (time for the main thread to stop by
/// itself with the error, which it normally does at once), print the failure and end the process
/// without running exit handlers, which could wait on a CUDA call blocked by the failed peer.
pub fn exit_after(grace: Duration, prefix: String) -> impl Fn(&Failure) + Send + 'static {
    move |failure: &Failure| {
        let (failure, prefix) = (failure.clone(), prefix.clone());
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            if claim_exit_message() {
                eprintln!("{prefix}error: stopping: {failure}");
            }
            // SAFETY: ends the process; nothing after it runs.
            unsafe { libc::_exit(super::error::EXIT_PEER_FAILED) }
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::rendezvous::{join, Spec};
    use super::super::WorldInfo;
    use super::*;
    use std::time::Instant;

    pub(crate) fn timing() -> Timing {
        Timing {
            rendezvous: Duration::from_secs(10),
            heartbeat: Duration::from_millis(100),
            peer_timeout: Duration::from_millis(800),
        }
    }

    /// `world_size` ranks of one run on threads of this process, in rank order.
    pub(crate) fn groups(world_size: usize) -> Vec<Group> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let handles: Vec<_> = (0..world_size)
            .map(|rank| {
                std::thread::spawn(move || {
                    let w =
                        WorldInfo { rank, world_size, local_rank: rank, master: format!("127.0.0.1:{port}") };
                    let spec =
                        Spec { world: &w, backend: "cpu", run: serde_json::json!({}), timing: timing() };
                    let joined = join(&spec, || Ok(vec![])).unwrap();
                    Group::start(rank, world_size, joined.links, timing()).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn wait_for_failure(g: &Group) -> Failure {
        let started = Instant::now();
        loop {
            if let Some(f) = g.failure() {
                return f;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "no failure noticed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A rank that goes away without a goodbye (its sockets closed, as the kernel does for a
    /// killed process) fails the run on every rank, naming it; rank 0 passes the word on.
    #[test]
    fn a_rank_that_vanishes_fails_every_rank_naming_it() {
        let mut g = groups(3);
        let gone = g.remove(2);
        let hooked = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&hooked);
        g[1].on_failure(move |f| flag.store(f.rank == 2, Ordering::SeqCst));
        drop(gone);
        for group in &g {
            let f = wait_for_failure(group);
            assert_eq!(f.rank, 2);
            assert!(f.what.starts_with("exited without a word"), "{f}");
        }
        assert!(hooked.load(Ordering::SeqCst), "rank 1's failure hook ran");
        let err = g[1].recv(0).unwrap_err().to_string();
        assert!(err.starts_with("stopping: rank 2 exited without a word"), "{err}");
    }

    /// A rank that fails says why, and the others stop with its words.
    #[test]
    fn a_rank_that_fails_says_why() {
        let g = groups(3);
        g[1].fail_self("out of GPU memory at step 7");
        for group in [&g[0], &g[2]] {
            assert_eq!(
                wait_for_failure(group),
                Failure { rank: 1, what: "out of GPU memory at step 7".into() }
            );
        }
    }

    /// A frozen rank (its threads stopped, its sockets open) is noticed after the peer timeout.
    #[test]
    fn a_silent_rank_is_noticed_after_the_peer_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let frozen = std::thread::spawn(move || {
            let w = WorldInfo { rank: 1, world_size: 2, local_rank: 1, master: format!("127.0.0.1:{port}") };
            let spec = Spec { world: &w, backend: "cpu", run: serde_json::json!({}), timing: timing() };
            join(&spec, || Ok(vec![])).unwrap() // joined, then never a heartbeat
        });
        let w = WorldInfo { rank: 0, world_size: 2, local_rank: 0, master: format!("127.0.0.1:{port}") };
        let spec = Spec { world: &w, backend: "cpu", run: serde_json::json!({}), timing: timing() };
        let root = Group::start(0, 2, join(&spec, || Ok(vec![])).unwrap().links, timing()).unwrap();
        let _keep_open = frozen.join().unwrap();
        let started = Instant::now();
        let f = wait_for_failure(&root);
        assert!(started.elapsed() >= Duration::from_millis(500), "{:?}", started.elapsed());
        assert_eq!(f.rank, 1);
        assert!(f.what.starts_with("sent nothing for 0.8 s"), "{f}");
    }

    /// Ranks that finish one after another in any order report no failure.
    #[test]
    fn a_finished_run_is_not_a_failure() {
        let mut g = groups(3);
        let root = g.remove(0);
        for group in g {
            group.finish().unwrap();
            drop(group);
        }
        root.finish().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(root.failure(), None);
    }
}
