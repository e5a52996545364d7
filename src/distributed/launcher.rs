//! `lora-ft train CONFIG --gpus N`: starts N ranks of this same binary (one per GPU, or N CPU
//! workers with `--device cpu`) with the launcher variables set, passes their output on, and
//! waits. When one fails, the others get a few seconds to stop by themselves (they hear of it
//! on the liveness channel), then are killed; the launcher reports the rank that failed first,
//! how, and the last lines it wrote.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::EXIT_PEER_FAILED;

/// Exit status of a rank stopped by SIGINT/SIGTERM after checkpointing (128 + SIGINT).
pub const EXIT_STOPPED: i32 = 130;

/// How long the other ranks get to stop by themselves once one failed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Lines of a rank's stderr kept for the failure report.
const TAIL_LINES: usize = 12;

/// Set in the ranks a launcher starts: they stop when the launcher goes away (stdin closes).
pub const LAUNCHED_VAR: &str = "LORA_FT_LAUNCHED";

/// Which ranks this machine runs.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// Ranks on this machine.
    pub nproc: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    /// Where rank 0 listens.
    pub master_addr: String,
    pub master_port: u16,
}

impl LaunchPlan {
    /// One machine: rank 0 on 127.0.0.1 at a port free now (the ranks bind it a moment later).
    pub fn one_machine(nproc: usize) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| anyhow::anyhow!("finding a free port for the ranks to meet on: {e}"))?
            .port();
        Ok(Self { nproc, nnodes: 1, node_rank: 0, master_addr: "127.0.0.1".into(), master_port: port })
    }

    /// The launcher variables of local rank `local`.
    pub fn env(&self, local: usize) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", (self.node_rank * self.nproc + local).to_string()),
            ("WORLD_SIZE", (self.nnodes * self.nproc).to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            (LAUNCHED_VAR, "1".into()),
        ]
    }
}

/// How a launched run ended badly.
#[derive(Debug)]
pub enum LaunchError {
    /// The rank that failed first, how, and its last lines.
    Failed {
        rank: usize,
        pid: u32,
        how: String,
        last_lines: Vec<String>,
    },
    /// Every rank stopped on SIGINT/SIGTERM after writing a checkpoint.
    Stopped,
    Spawn(String),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Failed { rank, pid, how, last_lines } => {
                write!(f, "rank {rank} (pid {pid}) {how}; the other ranks were stopped")?;
                if !last_lines.is_empty() {
                    write!(f, ". Its last lines:")?;
                    for line in last_lines {
                        write!(f, "\n    {line}")?;
                    }
                }
                Ok(())
            }
            LaunchError::Stopped => write!(f, "stopped by a signal; every rank stopped after a checkpoint"),
            LaunchError::Spawn(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LaunchError {}

struct Rank {
    rank: usize,
    child: Child,
    /// Held open: a rank reads end-of-file from it when the launcher is gone.
    _stdin: Option<ChildStdin>,
    tail: Arc<Mutex<VecDeque<String>>>,
    forward: Option<JoinHandle<()>>,
    status: Option<ExitStatus>,
    killed_by_us: bool,
}

/// Runs `exe args...` once per rank of `plan` on this machine and waits for all of them.
pub fn launch(exe: &Path, args: &[OsString], plan: &LaunchPlan) -> Result<(), LaunchError> {
    let mut ranks = Vec::with_capacity(plan.nproc);
    for local in 0..plan.nproc {
        match spawn(exe, args, plan, local) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                kill_all(&mut ranks);
                return Err(LaunchError::Spawn(format!(
                    "starting rank {}: {e}",
                    plan.node_rank * plan.nproc + local
                )));
            }
        }
    }
    forward_signals(ranks.iter().map(|r| r.child.id()).collect());
    let order = wait(&mut ranks);
    for r in &mut ranks {
        if let Some(handle) = r.forward.take() {
            let _ = handle.join();
        }
    }
    outcome(&ranks, &order)
}

fn spawn(exe: &Path, args: &[OsString], plan: &LaunchPlan, local: usize) -> std::io::Result<Rank> {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .envs(plan.env(local))
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    // a group of its own: Ctrl-C in the terminal reaches the launcher only, which passes one
    // signal on to each rank (two would kill them before their checkpoint)
    cmd.process_group(0);
    let mut child = cmd.spawn()?;
    let rank = plan.node_rank * plan.nproc + local;
    tracing::info!("rank {rank}: pid {}", child.id());
    let stderr = child.stderr.take().expect("piped");
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    let keep = Arc::clone(&tail);
    let forward = std::thread::Builder::new()
        .name(format!("rank-{rank}-stderr"))
        .spawn(move || pass_on(stderr, &keep))?;
    Ok(Rank {
        rank,
        _stdin: child.stdin.take(),
        child,
        tail,
        forward: Some(forward),
        status: None,
        killed_by_us: false,
    })
}

/// Copies a rank's stderr to ours line by line (lines of several ranks do not interleave
/// mid-line), keeping the last few for a failure report.
fn pass_on(stderr: impl Read, tail: &Mutex<VecDeque<String>>) {
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { return };
        let text = String::from_utf8_lossy(&line).trim_end_matches('\r').to_string();
        let _ = writeln!(std::io::stderr().lock(), "{text}");
        if is_backtrace_line(&text) {
            continue;
        }
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() == TAIL_LINES {
            t.pop_front();
        }
        t.push_back(text);
    }
}

/// SIGINT/SIGTERM to the launcher: the same signal to every rank, so they checkpoint and stop
/// together (a second one stops them at once, as for one process).
fn forward_signals(pids: Vec<u32>) {
    static RANK_PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    *RANK_PIDS.lock().unwrap_or_else(|e| e.into_inner()) = pids;
    // one handler per process (it fails harmlessly the second time)
    let _ = ctrlc::set_handler(|| {
        for &pid in RANK_PIDS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: kill(2) on our own children's pids.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        }
    });
}

/// Waits until every rank exited; once one failed, kills those still running after
/// `STOP_GRACE`. Returns the ranks' indices in the order they were seen to exit.
fn wait(ranks: &mut [Rank]) -> Vec<usize> {
    let mut order = Vec::new();
    let mut failed_at: Option<Instant> = None;
    while order.len() < ranks.len() {
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.status.is_some() {
                continue;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                r.status = Some(status);
                order.push(i);
                if !status.success() && failed_at.is_none() {
                    failed_at = Some(Instant::now());
                }
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > STOP_GRACE) {
            kill_all(ranks);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    order
}

fn kill_all(ranks: &mut [Rank]) {
    for r in ranks.iter_mut().filter(|r| r.status.is_none() && !r.killed_by_us) {
        r.killed_by_us = r.child.kill().is_ok();
    }
}

/// Success, a stop every rank agreed on, or the rank that failed first: the first seen to exit
/// badly that did not just follow another rank's failure (or that the launcher did not kill).
fn outcome(ranks: &[Rank], order: &[usize]) -> Result<(), LaunchError> {
    let status = |i: usize| ranks[i].status.expect("waited");
    if order.iter().all(|&i| status(i).success()) {
        return Ok(());
    }
    if order.iter().all(|&i| status(i).code() == Some(EXIT_STOPPED)) {
        return Err(LaunchError::Stopped);
    }
    let bad: Vec<usize> = order.iter().copied().filter(|&i| !status(i).success()).collect();
    let first_cause = bad
        .iter()
        .copied()
        .find(|&i| status(i).code() != Some(EXIT_PEER_FAILED) && !ranks[i].killed_by_us)
        .unwrap_or(bad[0]);
    let r = &ranks[first_cause];
    let last_lines = r.tail.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
    Err(LaunchError::Failed {
        rank: r.rank,
        pid: r.child.id(),
        how: describe(status(first_cause)),
        last_lines,
    })
}

/// A frame of a Rust backtrace (`  12: name`, `      at file:line`) or a blank line: shown as the
/// rank printed it, but not kept for the failure report, whose few lines are for the error
/// itself (with RUST_BACKTRACE set, candle's errors end in a backtrace).
fn is_backtrace_line(text: &str) -> bool {
    let t = text.trim_start();
    let frame =
        t.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    t.is_empty() || frame || (t.starts_with("at ") && t.len() < text.len())
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
pub fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    let signal = status.signal().unwrap_or(0);
    let name = match signal {
        libc::SIGKILL => " (SIGKILL: killed from outside, or by the kernel's out-of-memory killer)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGSEGV => " (SIGSEGV: a crash)",
        libc::SIGABRT => " (SIGABRT: an abort)",
        libc::SIGBUS => " (SIGBUS)",
        _ => "",
    };
    format!("was killed by signal {signal}{name}")
}

/// In a rank a launcher started: when the launcher goes away (its end of our stdin closes),
/// stop rather than train on as an orphan.
pub fn stop_when_launcher_exits(prefix: String) {
    if std::env::var_os(LAUNCHED_VAR).is_none() {
        return;
    }
    let _ = std::thread::Builder::new().name("launcher-watch".into()).spawn(move || {
        let mut buf = [0u8; 64];
        // the launcher never writes; read returns 0 (or fails) when it exits
        while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
        if super::liveness::claim_exit_message() {
            eprintln!("{prefix}error: the launcher (lora-ft train --gpus) exited; stopping");
        }
        // SAFETY: ends the process; nothing after it runs.
        unsafe { libc::_exit(EXIT_PEER_FAILED) }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_the_launcher_variables() {
        let plan = LaunchPlan {
            nproc: 2,
            nnodes: 2,
            node_rank: 1,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
        };
        let env = plan.env(1);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RANK"), Some("3"));
        assert_eq!(get("WORLD_SIZE"), Some("4"));
        assert_eq!(get("LOCAL_RANK"), Some("1"));
        assert_eq!((get("MASTER_ADDR"), get("MASTER_PORT")), (Some("10.0.0.1"), Some("29500")));
    }

    #[test]
    fn exit_statuses_are_described() {
        assert_eq!(describe(ExitStatus::from_raw(1 << 8)), "exited with status 1");
        assert!(describe(ExitStatus::from_raw(9)).starts_with("was killed by signal 9 (SIGKILL"));
    }

    /// Three "ranks" (shells): one fails at once, one would run for a minute, one exits as a
    /// rank does after a peer failed. The report names the failed one with its last lines, and
    /// the long one is killed after the grace period, not waited for.
    #[test]
    fn the_first_failure_is_reported_and_the_rest_are_stopped() {
        let script = r#"case $RANK in
            0) exec sleep 60 ;;
            1) echo "loading"; printf 'out of memory at step 3\n   0: <unknown>\n  13: __libc_start_main\n      at src/main.rs:3\n\n' >&2; exit 1 ;;
            2) sleep 0.5; echo "stopping: rank 1 failed" >&2; exit 3 ;;
        esac"#;
        let plan = LaunchPlan::one_machine(3).unwrap();
        let args: Vec<OsString> = vec!["-c".into(), script.into()];
        let started = Instant::now();
        let err = launch(Path::new("/bin/sh"), &args, &plan).unwrap_err();
        let waited = started.elapsed();
        assert!(waited >= STOP_GRACE && waited < STOP_GRACE + Duration::from_secs(3), "{waited:?}");
        match err {
            LaunchError::Failed { rank, how, last_lines, .. } => {
                assert_eq!((rank, how.as_str()), (1, "exited with status 1"));
                assert_eq!(last_lines, ["out of memory at step 3"]);
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn ranks_that_all_stopped_on_a_signal_are_a_stop_not_a_failure() {
        let plan = LaunchPlan::one_machine(2).unwrap();
        let args: Vec<OsString> = vec!["-c".into(), "exit 130".into()];
        assert!(matches!(launch(Path::new("/bin/sh"), &args, &plan), Err(LaunchError::Stopped)));
        let args: Vec<OsString> = vec!["-c".into(), "exit 0".into()];
        assert!(launch(Path::new("/bin/sh"), &args, &plan).is_ok());
    }
}
