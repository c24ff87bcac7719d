//! Running a child process with a time limit: its stdout lines time-stamped on arrival, the
//! tail of its stderr, its wall time, and what [`Watch`] asks to observe while it runs.

use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::monitor::{KvmGrab, MemoryPeak, Sampler, KVM_POLL, MEM_SAMPLE_INTERVAL};

/// How much of a process's stderr is kept for error messages.
const TAIL_BYTES: usize = 16 * 1024;

pub enum ErrMode {
    /// Keep the tail only.
    Capture,
    /// Copy to our stderr as it arrives, and keep the tail.
    Tee,
}

pub struct Finished {
    pub wall: Duration,
    /// `None` when killed at the time limit (or the wait failed: see `wait_error`).
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub wait_error: Option<String>,
    /// Stdout lines (without `\n`) with their arrival time.
    pub lines: Vec<(Instant, String)>,
    pub stderr_tail: Vec<u8>,
    pub started: Instant,
    pub memory: Option<MemoryPeak>,
    /// The VM's final KVM statistics ([`Watch::kvm`]).
    pub kvm: Option<BTreeMap<String, u64>>,
}

impl Finished {
    /// It exited by itself with status 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The first stdout line starting with `prefix`: its arrival time and the rest of the line.
    pub fn first_line(&self, prefix: &str) -> Option<(Instant, &str)> {
        self.lines
            .iter()
            .find_map(|(at, l)| Some((*at, l.strip_prefix(prefix)?)))
    }

    /// The last stdout line starting with `prefix`: its arrival time and the rest of the line.
    pub fn last_line(&self, prefix: &str) -> Option<(Instant, &str)> {
        self.lines
            .iter()
            .rev()
            .find_map(|(at, l)| Some((*at, l.strip_prefix(prefix)?)))
    }

    pub fn stdout_text(&self) -> String {
        self.lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
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

/// Runs `cmd` (stdin /dev/null, stdout and stderr piped) to its end or until `limit`, when it is
/// killed. Unless `watch` asks for something, the calling thread just blocks until it ends.
pub fn run_timed(
    mut cmd: Command,
    limit: Duration,
    err_mode: ErrMode,
    watch: Watch,
) -> Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
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
    let stdout = child.stdout.take().context("child stdout")?;
    let stderr = child.stderr.take().context("child stderr")?;

    let (out_tx, out_rx) = mpsc::channel();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut kept = 0usize;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let at = Instant::now();
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    kept += line.len();
                    lines.push((at, line));
                    // Keep memory bounded: drop the oldest lines beyond 8 MiB.
                    while kept > 8 << 20 && lines.len() > 1 {
                        kept -= lines.remove(0).1.len();
                    }
                }
            }
        }
        let _ = out_tx.send(lines);
    });
    let (err_tx, err_rx) = mpsc::channel();
    let tee = matches!(err_mode, ErrMode::Tee);
    thread::spawn(move || {
        let mut stderr = stderr;
        let mut tail = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tee {
                        let mut e = io::stderr().lock();
                        let _ = e.write_all(&buf[..n]).and_then(|()| e.flush());
                    }
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

    let deadline = started + limit;
    let mut sampler = watch.ram.map(|ram| Sampler::new(pid, ram));
    let mut grab = watch.kvm.then(|| KvmGrab::new(pid));
    let mut timed_out = false;
    let (status, ended) = loop {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            kill_process(pid);
            match wait_rx.recv_timeout(Duration::from_secs(30)) {
                Ok((status, at)) => break (status, at),
                Err(_) => {
                    break (
                        Err(io::Error::other("did not end after SIGKILL")),
                        Instant::now(),
                    )
                }
            }
        }
        let wait = if sampler.is_some() {
            MEM_SAMPLE_INTERVAL
        } else if grab.as_ref().is_some_and(|g| !g.grabbed()) {
            KVM_POLL
        } else {
            deadline - now
        }
        .min(deadline - now);
        match wait_rx.recv_timeout(wait) {
            Ok((status, at)) => break (status, at),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(s) = &mut sampler {
                    s.sample();
                }
                if let Some(g) = &mut grab {
                    g.try_grab();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break (
                    Err(io::Error::other("waiter thread vanished")),
                    Instant::now(),
                )
            }
        }
    };
    // A grandchild holding the pipes open must not hang us: wait a bounded time for the readers.
    let lines = out_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
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
        lines,
        stderr_tail: tail_of(&stderr_tail, TAIL_BYTES).to_vec(),
        started,
        memory: sampler.map(Sampler::into_peak),
        kvm: grab.and_then(|g| g.read()),
    })
}

fn tail_of(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(max)..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_process_is_killed_at_its_limit() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let f = run_timed(
            cmd,
            Duration::from_millis(200),
            ErrMode::Capture,
            Watch::default(),
        )
        .unwrap();
        assert!(f.timed_out);
        assert!(f.wall < Duration::from_secs(10));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; echo two >&2; exit 3"]);
        let f = run_timed(
            cmd,
            Duration::from_secs(30),
            ErrMode::Capture,
            Watch {
                ram: Some(1 << 20),
                kvm: true,
            },
        )
        .unwrap();
        assert!(!f.timed_out);
        assert_eq!(f.status.and_then(|s| s.code()), Some(3));
        assert_eq!(f.stdout_text(), "one");
        assert_eq!(f.stderr_text(), "two");
    }

    #[test]
    fn marker_lines_are_found() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo a; echo mark-1; echo b; echo mark-2"]);
        let f = run_timed(
            cmd,
            Duration::from_secs(30),
            ErrMode::Capture,
            Watch::default(),
        )
        .unwrap();
        assert!(f.succeeded());
        assert_eq!(f.first_line("mark-").map(|(_, l)| l), Some("1"));
        assert_eq!(f.last_line("mark-").map(|(_, l)| l), Some("2"));
        assert!(f.first_line("none").is_none());
    }
}
