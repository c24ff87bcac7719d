//! What the agent's children say and how they end: their output pipes
//! (passed on as `output`, history lines picked out of stdout) and their
//! exits (reaped, drained, reported; a node restarted or its disk released).

use std::io;
use std::os::fd::AsFd;

use guest_agent::protocol::{AgentToHost, ErrorContext, Stream};

use super::{Agent, Owner, MAX_DRAIN_CHUNKS};
use crate::sys;

impl Agent {
    /// Reads up to `max_chunks` chunks from one output pipe and sends each
    /// as an `output` message. Returns whether the pipe is still open and
    /// may hold more.
    pub(super) fn read_output(
        &mut self,
        owner: &Owner,
        stream: Stream,
        buffer: &mut [u8],
        max_chunks: usize,
    ) -> bool {
        for _ in 0..max_chunks {
            let Some(running) = self.running_mut(owner) else {
                return false;
            };
            let slot = running.pipe(stream);
            let Some(fd) = slot.as_ref() else {
                return false;
            };
            match sys::read(fd.as_fd(), buffer) {
                Ok(0) => {
                    *slot = None;
                    return false;
                }
                Ok(n) => {
                    // History lines of a template command count as the
                    // workload's.
                    let node = match owner {
                        Owner::Node(name) => Some(name.clone()),
                        Owner::Workload | Owner::Command(_) => None,
                    };
                    let history = match (stream, self.running_mut(owner)) {
                        (Stream::Stdout, Some(running)) => running.history.push(&buffer[..n]),
                        _ => Vec::new(),
                    };
                    let data = buffer[..n].to_vec();
                    self.send(&match owner {
                        Owner::Node(name) => AgentToHost::Output {
                            node: Some(name.clone()),
                            stream,
                            data,
                        },
                        Owner::Workload => AgentToHost::Output {
                            node: None,
                            stream,
                            data,
                        },
                        Owner::Command(id) => AgentToHost::CommandOutput {
                            id: *id,
                            stream,
                            data,
                        },
                    });
                    for json in history {
                        self.send(&AgentToHost::History {
                            node: node.clone(),
                            json,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    *slot = None;
                    self.send_error(
                        ErrorContext::Output,
                        format!("read from {owner:?} {stream:?}: {e}"),
                    );
                    return false;
                }
            }
        }
        true
    }

    /// Sends what is left in a finished process's pipes, then closes them.
    /// Bounded: a process outside the node's PID namespace (only possible
    /// for the root workload's background children) may keep a pipe open
    /// and writing; what it writes after this is lost (EPIPE).
    fn drain_and_close(&mut self, owner: &Owner, buffer: &mut [u8]) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            self.read_output(owner, stream, buffer, MAX_DRAIN_CHUNKS);
            if let Some(running) = self.running_mut(owner) {
                *running.pipe(stream) = None;
            }
        }
    }

    pub(super) fn reap_children(&mut self, buffer: &mut [u8]) -> io::Result<()> {
        while let Some((pid, status)) = sys::reap_any()? {
            if self.shell.as_ref().is_some_and(|s| s.pid == pid) {
                self.read_shell(buffer, MAX_DRAIN_CHUNKS);
                self.shell = None;
                self.send(&AgentToHost::ShellExited { status });
                continue;
            }
            if self.workload.as_ref().is_some_and(|w| w.running.pid == pid) {
                self.drain_and_close(&Owner::Workload, buffer);
                // What it wrote last, before its end (the host ends the
                // run there).
                self.read_local_outputs();
                self.workload = None;
                self.workload_status = Some(status);
                self.send(&AgentToHost::WorkloadExited { status });
                continue;
            }
            let exec = self
                .execs
                .iter()
                .find(|(_, run)| run.pid == pid)
                .map(|(id, _)| *id);
            if let Some(id) = exec {
                self.exec_ended(id, status, buffer);
                continue;
            }
            let command = self
                .commands
                .iter()
                .find(|(_, running)| running.pid == pid)
                .map(|(id, _)| *id);
            if let Some(id) = command {
                self.drain_and_close(&Owner::Command(id), buffer);
                self.read_local_outputs();
                self.commands.remove(&id);
                self.send(&AgentToHost::CommandExited { id, status });
                continue;
            }
            let name = self
                .nodes
                .iter()
                .find(|(_, node)| node.running.as_ref().is_some_and(|r| r.pid == pid))
                .map(|(name, _)| name.clone());
            let Some(name) = name else {
                // An orphan reparented to us (PID 1 / subreaper): just reaped.
                continue;
            };
            let owner = Owner::Node(name.clone());
            self.drain_and_close(&owner, buffer);
            // What it wrote last, through the directories held (its /tmp
            // ended with it).
            self.nodes.get_mut(&name).expect("node exists").running = None;
            self.read_local_output(&name);
            let node = self.nodes.get_mut(&name).expect("node exists");
            node.running = None;
            node.pidns = None;
            let restart = std::mem::take(&mut node.restart_pending) && !self.shutting_down;
            let crashed = std::mem::take(&mut node.crash_pending);
            self.send(&AgentToHost::Exited {
                node: name.clone(),
                status,
            });
            if crashed {
                self.release_disk(&name);
            } else if restart {
                if let Err(message) = self.start_node(&name) {
                    self.send_error(ErrorContext::Restart { node: name }, message);
                }
            }
        }
        Ok(())
    }
}
