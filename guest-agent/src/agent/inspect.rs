//! Looking into the guest for the host's debugger: `exec` (a command run
//! to its end, its output kept up to a limit, killed at its timeout),
//! `read_file` (a file as a node sees it) and `processes` (from /proc).
//! Each answer carries the request's id.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use guest_agent::protocol::{
    AgentToHost, ExecSpec, ExitStatus, ProcessRow, Stream, MAX_OUTPUT_CHUNK,
    PROCESS_ROWS_PER_MESSAGE,
};

use super::{context_error, Agent, MAX_DRAIN_CHUNKS};
use crate::capture::Capture;
use crate::container::{self, Command, NodeNamespaces, Setup};
use crate::procfs;
use crate::sys;

/// An `exec` whose command runs.
#[derive(Debug)]
pub(super) struct ExecRun {
    pub(super) pid: libc::pid_t,
    pub(super) stdout: Option<OwnedFd>,
    pub(super) stderr: Option<OwnedFd>,
    /// Fires at the timeout (`None` once it fired).
    pub(super) timer: Option<OwnedFd>,
    captures: [Capture; 2],
    timed_out: bool,
}

impl ExecRun {
    fn pipe(&mut self, stream: Stream) -> &mut Option<OwnedFd> {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }

    fn capture(&mut self, stream: Stream) -> &mut Capture {
        &mut self.captures[stream as usize]
    }
}

/// How many bytes of a file whose size says nothing (a /proc file says 0)
/// are read at most to learn its size.
const MAX_COUNTED_BYTES: u64 = 64 << 20;

impl Agent {
    /// Stops every running node, and keeps them stopped: no restart may
    /// begin behind the caller's back (as for a shell in a fork).
    pub(super) fn freeze_nodes(&mut self) -> Result<Vec<String>, String> {
        let running: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.running.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        for node in self.nodes.values_mut() {
            node.restart_pending = false;
        }
        for name in &running {
            self.pause(name, true)?;
        }
        Ok(running)
    }

    pub(super) fn exec(&mut self, spec: ExecSpec) -> Result<(), String> {
        spec.check()?;
        if self.execs.contains_key(&spec.id) {
            return Err(format!("exec {} is already running", spec.id));
        }
        let command = Command::new(&spec.command, &spec.env).map_err(|e| e.to_string())?;
        let namespaces = match &spec.node {
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                Some(NodeNamespaces::of(pid).map_err(context_error("the node's namespaces"))?)
            }
            None => None,
        };
        if spec.freeze {
            self.freeze_nodes()?;
        }
        let timeout = i64::try_from(spec.timeout_ns).unwrap_or(i64::MAX);
        let timer = sys::oneshot_timerfd(timeout).map_err(context_error("timerfd"))?;
        let spawned = match &namespaces {
            None => container::spawn(&command, &Setup::Root, self.devnull.as_fd(), None)?,
            Some(namespaces) => {
                let setup = Setup::EnterNode {
                    namespaces,
                    own_pidns: self.own_pidns.as_fd(),
                };
                container::spawn(&command, &setup, self.devnull.as_fd(), None)?
            }
        };
        self.execs.insert(
            spec.id,
            ExecRun {
                pid: spawned.pid,
                stdout: Some(spawned.stdout),
                stderr: Some(spawned.stderr),
                timer: Some(timer),
                captures: [Capture::new(spec.output_limit); 2],
                timed_out: false,
            },
        );
        Ok(())
    }

    /// Reads up to `max_chunks` chunks of an exec's stream, sending what is
    /// within its limit. Returns whether the pipe may hold more.
    pub(super) fn read_exec_output(
        &mut self,
        id: u64,
        stream: Stream,
        buffer: &mut [u8],
        max_chunks: usize,
    ) -> bool {
        for _ in 0..max_chunks {
            let Some(run) = self.execs.get_mut(&id) else {
                return false;
            };
            let Some(fd) = run.pipe(stream).as_ref() else {
                return false;
            };
            match sys::read(fd.as_fd(), buffer) {
                Ok(0) => {
                    *run.pipe(stream) = None;
                    return false;
                }
                Ok(n) => {
                    let kept = run.capture(stream).keep(&buffer[..n]);
                    if !kept.is_empty() {
                        let data = kept.to_vec();
                        self.send(&AgentToHost::ExecOutput { id, stream, data });
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(_) => {
                    *run.pipe(stream) = None;
                    return false;
                }
            }
        }
        true
    }

    /// The timeout passed: SIGKILL the command's process group (it leads
    /// its own session), then itself; its end is reported when reaped.
    pub(super) fn exec_timed_out(&mut self, id: u64) {
        if let Some(run) = self.execs.get_mut(&id) {
            run.timer = None;
            // Ended on its own in the same round, not reaped yet: no timeout.
            if sys::has_ended(run.pid) {
                return;
            }
            run.timed_out = true;
            let _ = sys::kill(-run.pid, libc::SIGKILL);
            let _ = sys::kill(run.pid, libc::SIGKILL);
        }
    }

    /// An exec's command was reaped: what is left in its pipes (bounded: a
    /// background child may hold them open), then its end.
    pub(super) fn exec_ended(&mut self, id: u64, status: ExitStatus, buffer: &mut [u8]) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            self.read_exec_output(id, stream, buffer, MAX_DRAIN_CHUNKS);
        }
        let Some(run) = self.execs.remove(&id) else {
            return;
        };
        self.send(&AgentToHost::ExecExited {
            id,
            status,
            stdout_bytes: run.captures[Stream::Stdout as usize].total(),
            stderr_bytes: run.captures[Stream::Stderr as usize].total(),
            timed_out: run.timed_out,
        });
    }

    /// The root a node's processes see (through its PID 1), or the guest's.
    fn root_of(&self, node: Option<&str>) -> Result<OwnedFd, String> {
        let path = match node {
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                format!("/proc/{pid}/root")
            }
            None => "/".to_string(),
        };
        sys::open(Path::new(&path), libc::O_PATH | libc::O_DIRECTORY)
            .map_err(context_error(&format!("open {path}")))
    }

    pub(super) fn read_file(
        &mut self,
        id: u64,
        node: Option<&str>,
        path: &str,
        limit: u64,
    ) -> Result<(), String> {
        if path.is_empty() {
            return Err("an empty path".to_string());
        }
        let root = self.root_of(node)?;
        self.freeze_nodes()?;
        let file = sys::open_in_root(root.as_fd(), path).map_err(|e| format!("{path:?}: {e}"))?;
        let meta = std::fs::File::from(file.try_clone().map_err(context_error("dup"))?)
            .metadata()
            .map_err(|e| format!("{path:?}: {e}"))?;
        if meta.is_dir() {
            return Err(format!("{path:?} is a directory"));
        }
        if !meta.is_file() {
            return Err(format!(
                "{path:?} is not a regular file (a device, a pipe or a socket)"
            ));
        }
        let stated = meta.len();
        let mut capture = Capture::new(limit);
        let mut buffer = vec![0u8; MAX_OUTPUT_CHUNK];
        loop {
            // A file that states its size is read no further than needed.
            let kept_all = capture.total() >= limit;
            if (stated > 0 && kept_all) || capture.total() >= MAX_COUNTED_BYTES.max(limit) {
                break;
            }
            let n = sys::read(file.as_fd(), &mut buffer).map_err(|e| format!("{path:?}: {e}"))?;
            if n == 0 {
                break;
            }
            let kept = capture.keep(&buffer[..n]);
            if !kept.is_empty() {
                let data = kept.to_vec();
                self.send(&AgentToHost::FileChunk { id, data });
            }
        }
        self.send(&AgentToHost::FileRead {
            id,
            size: stated.max(capture.total()),
        });
        Ok(())
    }

    pub(super) fn processes(&mut self, id: u64, node: Option<&str>) -> Result<(), String> {
        // The namespace whose PIDs the rows show, and how deep it is.
        let (pidns, depth) = match node {
            Some(name) => {
                let (node, pid) = self.running_node(name)?;
                let pidns = node
                    .pidns
                    .ok_or_else(|| format!("node {name:?} has no PID namespace"))?;
                let depth = read_nspids(pid)?.len() - 1;
                (Some(pidns), depth)
            }
            None => (None, 0),
        };
        self.freeze_nodes()?;
        let pids = match pidns {
            Some(ns) => sys::pids_in_pid_ns(ns).map_err(context_error("scan /proc"))?,
            None => all_pids().map_err(context_error("scan /proc"))?,
        };
        let mut nspids: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        let mut stats = Vec::new();
        for pid in pids {
            // A process may end during the scan: it is left out.
            let (Ok(stat), Ok(pids)) = (read_stat(pid), read_nspids(pid)) else {
                continue;
            };
            nspids.insert(pid, pids);
            stats.push((pid, stat));
        }
        let mut rows: Vec<ProcessRow> = Vec::new();
        for (pid, stat) in &stats {
            let parent = nspids
                .get(&stat.ppid)
                .cloned()
                .or_else(|| read_nspids(stat.ppid).ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if let Some(row) =
                procfs::process_row(stat, &nspids[pid], parent.as_deref(), depth, &cmdline)
            {
                rows.push(row);
            }
        }
        rows.sort_by_key(|row| row.pid);
        let count = rows.len() as u64;
        for batch in rows.chunks(PROCESS_ROWS_PER_MESSAGE) {
            self.send(&AgentToHost::ProcessRows {
                id,
                rows: batch.to_vec(),
            });
        }
        self.send(&AgentToHost::ProcessesListed { id, count });
        Ok(())
    }
}

fn read_stat(pid: i32) -> Result<procfs::Stat, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    procfs::parse_stat(&text)
}

fn read_nspids(pid: i32) -> Result<Vec<i32>, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    procfs::parse_nspids(&text)
}

/// Every PID in /proc (the agent's namespace), ascending.
fn all_pids() -> std::io::Result<Vec<i32>> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}
