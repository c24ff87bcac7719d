//! The agent's side of the SDKs' fallback files (see
//! `crate::local_output`): which files a node and the root are read for,
//! and passing their new lines on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use guest_agent::protocol::AgentToHost;

use super::{context_error, Agent};
use crate::sys;

impl Agent {
    /// Passes on the lines added to node `name`'s local output files
    /// (looked up again through its PID 1's root while it runs).
    pub(super) fn read_local_output(&mut self, name: &str) {
        let Some(node) = self
            .nodes
            .get_mut(name)
            .filter(|n| !n.local_outputs.is_empty())
        else {
            return;
        };
        if let Some(running) = &node.running {
            node.local_outputs.look_up(&proc_root(running.pid));
        }
        let lines = node.local_outputs.read_new();
        for json in lines {
            self.send(&AgentToHost::Sdk {
                node: Some(name.to_string()),
                json,
            });
        }
    }

    /// Passes on the lines added to every local output file: the nodes'
    /// (by name), then the root workload's.
    pub(super) fn read_local_outputs(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            self.read_local_output(&name);
        }
        for json in self.root_outputs.read_new() {
            self.send(&AgentToHost::Sdk { node: None, json });
        }
    }

    /// Arms the timer of the local output files (once).
    pub(super) fn watch_local_outputs(&mut self) -> Result<(), String> {
        if self.local_output_timer.is_none() {
            self.local_output_timer = Some(
                sys::interval_timerfd(crate::local_output::POLL_INTERVAL_NS)
                    .map_err(context_error("timerfd for the local output files"))?,
            );
        }
        Ok(())
    }

    /// Reads the file `env` names, if any, as the files of `node` (running),
    /// or of the root: the processes started with `env` run there.
    pub(super) fn add_local_outputs(
        &mut self,
        node: Option<&str>,
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let added = match node {
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                let outputs = &mut self.node_mut(name)?.local_outputs;
                let added = outputs.add_from_env(env);
                outputs.look_up(&proc_root(pid));
                added
            }
            None => {
                let added = self.root_outputs.add_from_env(env);
                self.root_outputs.look_up(Path::new("/"));
                added
            }
        };
        if added {
            self.watch_local_outputs()?;
        }
        Ok(())
    }
}

/// The root directory of process `pid`, as the agent reaches it.
pub(super) fn proc_root(pid: libc::pid_t) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root"))
}
