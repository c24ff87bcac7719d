//! Running a child process (QEMU) with a time limit: the tail of its stderr, its wall time, and
//! what [`Watch`] asks to observe while it runs; and a function of this process the same way
//! ([`run_in_process`]: a detvisor run through the run library).

use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::monitor::{KvmGrab, MemoryPeak, Sampler, KVM_POLL, MEM_SAMPLE_INTERVAL};
use super::report::RunResult;

/// How much of a process's stderr is kept for error messages.
const TAIL_BYTES: usize = 16 * 1024;

pub struct Finished {
    pub wall: Duration,
    /// `None` when killed at the time limit (or the wait failed: see `wait_error`).
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub wait_error: Option<String>,
    pub stderr_tail: Vec<u8>,
    pub memory: Option<MemoryPeak>,
    /// The VM's final KVM statistics ([`Watch::kvm`]).
    pub kvm: Option<BTreeMap<String, u64>>,
}

impl Finished {
    /// It exited by itself with status 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr_tail)
            .trim()
            .to_string()
    }

    /// A one-paragraph description of an abnormal end.
    pub fn failure(&self, what: &str, limit: Duration) -> String {
        let how = if self.timed_out {
            format!("{what} killed after the {} s time limit", limit.as_secs())
        } else if let Some(e) = &self.wait_error {
            format!("{what}: {e}")
        } else {
            match self.status {
                Some(s) => format!("{what} exited with {s}"),
                None => format!("{what} ended without a status"),
            }
        };
        let err = last_lines(&self.stderr_text(), 12);
        if err.is_empty() {
            how
        } else {
            format!("{how}; its stderr ends with:\n{err}")
        }
    }
}

/// The last `n` lines of `text`, indented by four spaces.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kill_process(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes two integers and touches no memory of ours. `pid` is a child of
    // ours whose exit the waiter thread has not reported, so (but for the instant between its
    // reaping and this call) it still names that child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// What to watch while a process runs.
#[derive(Clone, Copy, Default)]
pub struct Watch {
    /// Sample its memory every [`MEM_SAMPLE_INTERVAL`] (the value: guest RAM bytes).
    pub ram: Option<u64>,
    /// Grab its VM's KVM statistics: look for them every [`KVM_POLL`] until found.
    pub kvm: bool,
}

/// Runs `cmd` (stdin and stdout /dev/null, stderr piped) to its end or until `limit`, when it is
/// killed. Unless `watch` asks for something, the calling thread just blocks until it ends.
pub fn run_timed(mut cmd: Command, limit: Duration, watch: Watch) -> Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let program = cmd.get_program().to_string_lossy().into_owned();
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            anyhow!("{program} not found")
        } else {
            anyhow!("cannot start {program}: {e}")
        }
    })?;
    let pid = child.id();
    let stderr = child.stderr.take().context("child stderr")?;

    let (err_tx, err_rx) = mpsc::channel();
    thread::spawn(move || {
        let mut stderr = stderr;
        let mut tail = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * TAIL_BYTES {
                        tail.drain(..tail.len() - TAIL_BYTES);
                    }
                }
            }
        }
        let _ = err_tx.send(tail);
    });
    let (wait_tx, wait_rx) = mpsc::channel();
    thread::spawn(move || {
        let status = child.wait();
        let _ = wait_tx.send((status, Instant::now()));
    });
    let watched = watch_until(pid, started + limit, watch, &wait_rx, || {
        kill_process(pid);
        wait_rx.recv_timeout(Duration::from_secs(30)).ok()
    });
    let timed_out = watched.timed_out;
    let (status, ended) = match watched.ended {
        Some(ended) => ended,
        None if timed_out => (
            Err(io::Error::other("did not end after SIGKILL")),
            Instant::now(),
        ),
        None => (
            Err(io::Error::other("waiter thread vanished")),
            Instant::now(),
        ),
    };
    // A grandchild holding the pipe open must not hang us: wait a bounded time for the reader.
    let stderr_tail = err_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    let (status, wait_error) = match status {
        Ok(s) if !timed_out => (Some(s), None),
        Ok(_) => (None, None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(Finished {
        wall: ended.duration_since(started),
        status,
        timed_out,
        wait_error,
        stderr_tail: tail_of(&stderr_tail, TAIL_BYTES).to_vec(),
        memory: watched.memory,
        kvm: watched.kvm,
    })
}

/// What [`watch_until`] saw.
struct Watched<R> {
    /// What the waiter sent, and when (`None`: it never did).
    ended: Option<R>,
    timed_out: bool,
    memory: Option<MemoryPeak>,
    kvm: Option<BTreeMap<String, u64>>,
}

/// Waits for what `ended` brings (process `pid`'s end, or an in-process run's), observing `pid`
/// as `watch` asks meanwhile; at `deadline` it calls `on_deadline` (which kills, and may wait
/// a little more) instead.
fn watch_until<R>(
    pid: u32,
    deadline: Instant,
    watch: Watch,
    ended: &mpsc::Receiver<R>,
    on_deadline: impl FnOnce() -> Option<R>,
) -> Watched<R> {
    let mut sampler = watch.ram.map(|ram| Sampler::new(pid, ram));
    let mut grab = watch.kvm.then(|| KvmGrab::new(pid));
    let mut timed_out = false;
    let result = loop {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            break on_deadline();
        }
        let wait = if sampler.is_some() {
            MEM_SAMPLE_INTERVAL
        } else if grab.as_ref().is_some_and(|g| !g.grabbed()) {
            KVM_POLL
        } else {
            deadline - now
        }
        .min(deadline - now);
        match ended.recv_timeout(wait) {
            Ok(r) => break Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(s) = &mut sampler {
                    s.sample();
                }
                if let Some(g) = &mut grab {
                    g.try_grab();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break None,
        }
    };
    Watched {
        ended: result,
        timed_out,
        memory: sampler.map(Sampler::into_peak),
        kvm: grab.and_then(|g| g.read()),
    }
}

/// A function run by [`run_in_process`].
pub struct InProcess<T> {
    /// What it returned (`None` when it was abandoned at the time limit, or panicked).
    pub result: Option<T>,
    /// From just before its thread started to its return.
    pub wall: Duration,
    pub timed_out: bool,
    /// This process's memory while it ran ([`Watch::ram`]; the high-water mark is reset first).
    pub memory: Option<MemoryPeak>,
    /// The KVM statistics of the VM it created ([`Watch::kvm`]).
    pub kvm: Option<BTreeMap<String, u64>>,
}

/// Runs `f` on a thread of its own to its return or until `limit`, observing this process as
/// `watch` asks meanwhile. A thread cannot be killed: at the limit it is abandoned (it runs on,
/// its result is dropped), and the run counts as timed out.
pub fn run_in_process<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
    limit: Duration,
    watch: Watch,
) -> InProcess<T> {
    if watch.ram.is_some() {
        // 5: reset the peak RSS (VmHWM) to the present RSS.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    thread::spawn(move || {
        let result = f();
        let _ = tx.send((result, Instant::now()));
    });
    let watched = watch_until(std::process::id(), started + limit, watch, &rx, || None);
    let (result, ended) = match watched.ended {
        Some((result, at)) => (Some(result), at),
        None => (None, Instant::now()),
    };
    InProcess {
        result,
        wall: ended.duration_since(started),
        timed_out: watched.timed_out,
        memory: watched.memory,
        kvm: watched.kvm,
    }
}

fn tail_of(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(max)..]
}

/// A command's program and arguments, as words (for a report).
pub fn command_words(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Runs one measured process, watching what `watch` asks for, and judges its end with `judge`;
/// a process that cannot be started is a failed run.
pub fn run_measured(
    cmd: Command,
    limit: Duration,
    watch: Watch,
    judge: impl FnOnce(&Finished) -> RunResult,
) -> (RunResult, Option<MemoryPeak>) {
    match run_timed(cmd, limit, watch) {
        Ok(finished) => (judge(&finished), finished.memory),
        Err(e) => (RunResult::failed(&e), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_process_is_killed_at_its_limit() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let f = run_timed(cmd, Duration::from_millis(200), Watch::default()).unwrap();
        assert!(f.timed_out);
        assert!(f.wall < Duration::from_secs(10));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; echo two >&2; exit 3"]);
        let f = run_timed(
            cmd,
            Duration::from_secs(30),
            Watch {
                ram: Some(1 << 20),
                kvm: true,
            },
        )
        .unwrap();
        assert!(!f.timed_out);
        assert_eq!(f.status.and_then(|s| s.code()), Some(3));
        assert_eq!(f.stderr_text(), "two");
    }

    #[test]
    fn an_in_process_run_is_timed_and_abandoned_at_its_limit() {
        let done = run_in_process(|| 7, Duration::from_secs(30), Watch::default());
        assert_eq!(done.result, Some(7));
        assert!(!done.timed_out);
        let done = run_in_process(
            || std::thread::sleep(Duration::from_secs(5)),
            Duration::from_millis(100),
            Watch {
                ram: Some(1 << 20),
                kvm: false,
            },
        );
        assert!(done.result.is_none());
        assert!(done.timed_out);
        assert!(done.wall < Duration::from_secs(4));
        assert!(done
            .memory
            .is_some_and(|m| m.samples > 0 && m.vm_hwm_kib > 0));
    }
}
