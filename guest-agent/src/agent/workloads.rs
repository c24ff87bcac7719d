//! The workload and the test-composer's template commands: processes
//! started in the root namespaces or inside a node, reported like a node's.

use std::collections::BTreeMap;
use std::os::fd::AsFd;

use guest_agent::protocol::AgentToHost;

use super::{Agent, Running, Workload};
use crate::composer;
use crate::container::{self, Command, NodeNamespaces, Setup};
use crate::history::HistoryLines;
use crate::sys;

impl Agent {
    pub(super) fn start_workload(
        &mut self,
        node: Option<String>,
        command: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if self.workload.is_some() {
            return Err("a workload is already running".to_string());
        }
        let command = Command::new(command, env).map_err(|e| e.to_string())?;
        self.add_local_outputs(node.as_deref(), env)?;
        let spawned = match &node {
            None => container::spawn(&command, &Setup::Root, self.devnull.as_fd(), None)?,
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                let namespaces = NodeNamespaces::of(pid).map_err(|e| e.to_string())?;
                let setup = Setup::EnterNode {
                    namespaces: &namespaces,
                    own_pidns: self.own_pidns.as_fd(),
                };
                container::spawn(&command, &setup, self.devnull.as_fd(), None)?
            }
        };
        let pid = spawned.pid;
        self.workload = Some(Workload {
            running: Running {
                pid,
                stdout: Some(spawned.stdout),
                stderr: Some(spawned.stderr),
                history: HistoryLines::default(),
            },
        });
        self.workload_status = None;
        self.send(&AgentToHost::WorkloadStarted { node, pid });
        Ok(())
    }

    /// Lists template `template` as node `node` sees its root.
    pub(super) fn list_template(&mut self, node: &str, template: &str) -> Result<(), String> {
        let (_, pid) = self.running_node(node)?;
        let commands = composer::list_for_process(pid, template)?;
        self.send(&AgentToHost::TemplateCommands {
            template: template.to_string(),
            commands,
        });
        Ok(())
    }

    /// Starts a template's command inside `node`, as a workload is started
    /// (its own session and process group, output on pipes).
    pub(super) fn start_command(
        &mut self,
        id: u32,
        node: &str,
        template: &str,
        command: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if self.commands.contains_key(&id) {
            return Err(format!("command run {id} is already running"));
        }
        let path = composer::command_path(template, command)?;
        let command = Command::new(&[path], env).map_err(|e| e.to_string())?;
        let (_, pid) = self.running_node(node)?;
        self.add_local_outputs(Some(node), env)?;
        let namespaces = NodeNamespaces::of(pid).map_err(|e| e.to_string())?;
        let setup = Setup::EnterNode {
            namespaces: &namespaces,
            own_pidns: self.own_pidns.as_fd(),
        };
        let spawned = container::spawn(&command, &setup, self.devnull.as_fd(), None)?;
        self.commands.insert(
            id,
            Running {
                pid: spawned.pid,
                stdout: Some(spawned.stdout),
                stderr: Some(spawned.stderr),
                history: HistoryLines::default(),
            },
        );
        self.send(&AgentToHost::CommandStarted {
            id,
            pid: spawned.pid,
        });
        Ok(())
    }

    /// SIGKILL a command run's process group (it leads its own session),
    /// then itself. One that has ended already is no error: the host may
    /// ask before it hears of the end.
    pub(super) fn kill_command(&mut self, id: u32) -> Result<(), String> {
        if let Some(running) = self.commands.get(&id) {
            let _ = sys::kill(-running.pid, libc::SIGKILL);
            let _ = sys::kill(running.pid, libc::SIGKILL);
        }
        Ok(())
    }
}
