//! The shell a user opens in a fork (`detvisor shell`): every node paused,
//! `sh` on a new pseudo-terminal, typed input queued and written as the
//! terminal takes it, its output passed on.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;

use guest_agent::protocol::AgentToHost;

use super::{context_error, Agent, Shell};
use crate::container::{self, Command, NodeNamespaces, Setup};
use crate::sys;

impl Agent {
    /// Pauses every running node, then starts `sh` on a new pseudo-terminal
    /// (in the root namespaces, or inside `node`).
    pub(super) fn open_shell(
        &mut self,
        node: Option<String>,
        rows: u16,
        cols: u16,
        term: Option<String>,
    ) -> Result<(), String> {
        if self.shell.is_some() {
            return Err("a shell is already open".to_string());
        }
        let namespaces = match &node {
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                Some(NodeNamespaces::of(pid).map_err(context_error("the node's namespaces"))?)
            }
            None => None,
        };
        let (master, slave) = sys::open_pty(rows, cols).map_err(context_error("open a pty"))?;
        sys::set_nonblocking(master.as_fd()).map_err(context_error("fcntl"))?;
        let mut env = BTreeMap::new();
        env.insert("TERM".to_string(), term.unwrap_or_else(|| "vt100".into()));
        env.insert("HOME".to_string(), "/".to_string());
        let prompt = match &node {
            Some(name) => format!("(fork) {name}:\\w # "),
            None => "(fork) \\w # ".to_string(),
        };
        env.insert("PS1".to_string(), prompt);
        let command =
            Command::new(&["sh".to_string(), "-i".to_string()], &env).map_err(|e| e.to_string())?;
        // What the user looks at stays that moment: every running node is
        // stopped, and none restarts behind the shell's back.
        let running = self.freeze_nodes()?;
        let spawned = match &namespaces {
            None => container::spawn(
                &command,
                &Setup::Root,
                self.devnull.as_fd(),
                Some(slave.as_fd()),
            ),
            Some(namespaces) => {
                let setup = Setup::EnterNode {
                    namespaces,
                    own_pidns: self.own_pidns.as_fd(),
                };
                container::spawn(&command, &setup, self.devnull.as_fd(), Some(slave.as_fd()))
            }
        };
        let spawned = match spawned {
            Ok(spawned) => spawned,
            Err(message) => {
                // No shell: leave the nodes as they were.
                for name in &running {
                    let _ = self.pause(name, false);
                }
                return Err(message);
            }
        };
        drop(slave);
        self.shell = Some(Shell {
            pid: spawned.pid,
            master: Some(master),
            input: Vec::new(),
        });
        self.send(&AgentToHost::ShellOpened { pid: spawned.pid });
        Ok(())
    }

    /// Queues typed bytes for the shell's terminal and writes what it takes
    /// now; the rest goes out as the terminal drains (POLLOUT).
    pub(super) fn shell_input(&mut self, data: &[u8]) -> Result<(), String> {
        let shell = self
            .shell
            .as_mut()
            .filter(|s| s.master.is_some())
            .ok_or_else(|| "no shell is open".to_string())?;
        shell.input.extend_from_slice(data);
        self.write_shell_input()
    }

    /// Writes queued input to the shell's terminal until it would block.
    pub(super) fn write_shell_input(&mut self) -> Result<(), String> {
        let Some(shell) = self.shell.as_mut() else {
            return Ok(());
        };
        let Some(master) = shell.master.as_ref() else {
            shell.input.clear();
            return Ok(());
        };
        while !shell.input.is_empty() {
            match sys::write(master.as_fd(), &shell.input) {
                Ok(n) => {
                    shell.input.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    shell.input.clear();
                    return Err(format!("write to the shell's terminal: {e}"));
                }
            }
        }
        Ok(())
    }

    /// Reads up to `max_chunks` chunks of the shell's terminal output and
    /// sends each. Returns whether the terminal may hold more.
    pub(super) fn read_shell(&mut self, buffer: &mut [u8], max_chunks: usize) -> bool {
        for _ in 0..max_chunks {
            let Some(master) = self.shell.as_ref().and_then(|s| s.master.as_ref()) else {
                return false;
            };
            match sys::read(master.as_fd(), buffer) {
                Ok(n) if n > 0 => self.send(&AgentToHost::ShellOutput {
                    data: buffer[..n].to_vec(),
                }),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                // EOF, or EIO: no process holds the terminal any more.
                _ => {
                    if let Some(shell) = &mut self.shell {
                        shell.master = None;
                    }
                    return false;
                }
            }
        }
        true
    }
}
