//! Nodes: made (namespaces, network, root), started and restarted,
//! paused, signaled, and their realtime clocks changed.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use guest_agent::protocol::{AgentToHost, NodeSpec};

use super::local_outputs::proc_root;
use super::{context_error, Agent, Node, Running};
use crate::clock::{self, ClockChange};
use crate::container::{self, Command, NodePlan, SdkMounts, Setup};
use crate::disk::Disk;
use crate::history::HistoryLines;
use crate::local_output::LocalOutputs;
use crate::netlink::{link_index, Netlink};
use crate::sys;

impl Agent {
    pub(super) fn create_node(&mut self, spec: NodeSpec) -> Result<(), String> {
        if spec.name.is_empty() {
            return Err("empty node name".to_string());
        }
        if self.nodes.contains_key(&spec.name) {
            return Err(format!("node {:?} exists", spec.name));
        }
        let address = match (&spec.nic, &spec.address) {
            (None, Some(_)) => return Err("an address needs a nic".to_string()),
            (_, Some(address)) => Some(parse_ipv4_cidr(address)?),
            (_, None) => None,
        };
        let command = Command::new(&spec.command, &spec.env).map_err(|e| e.to_string())?;
        let hostname = spec.hostname.as_deref().unwrap_or(&spec.name);
        let disk = spec.disk.as_ref().map(Disk::new).transpose()?;
        let mut plan = NodePlan::new(
            Path::new(&spec.rootfs),
            hostname,
            disk.as_ref().map(Disk::mount_spec),
        )
        .map_err(|e| e.to_string())?;
        if let Some(sdk) = &mut self.sdk {
            sdk.add_node(&spec.name)
                .map_err(context_error("the node's SDK socket"))?;
            plan.add_sdk(&SdkMounts {
                shim: sdk.shim_path(),
                assert_command: self.own_executable.clone(),
                socket_dir: sdk.node_dir(&spec.name),
            })
            .map_err(|e| e.to_string())?;
        }
        let netns = self.new_netns()?;
        self.configure_network(netns.as_fd(), spec.nic.as_deref(), address)?;
        let timens = clock::new_timens(self.own_timens.as_ref().map(AsFd::as_fd))
            .map_err(|e| e.to_string())?;
        let mut local_outputs = LocalOutputs::default();
        if local_outputs.add_from_env(&spec.env) {
            self.watch_local_outputs()?;
        }
        self.nodes.insert(
            spec.name.clone(),
            Node {
                command,
                plan,
                netns,
                timens,
                running: None,
                pidns: None,
                restart_pending: false,
                disk,
                crash_pending: false,
                start_when_mounted: false,
                local_outputs,
            },
        );
        if let Err(message) = self.start_node(&spec.name) {
            // The node never ran: forget it (and its network namespace).
            self.nodes.remove(&spec.name);
            return Err(message);
        }
        Ok(())
    }

    /// A new network namespace, held by a descriptor. The agent enters it
    /// only for the duration of `unshare` + `open` and returns at once.
    fn new_netns(&self) -> Result<OwnedFd, String> {
        sys::unshare(libc::CLONE_NEWNET).map_err(context_error("unshare(CLONE_NEWNET)"))?;
        let netns = sys::open(Path::new("/proc/self/ns/net"), libc::O_RDONLY);
        self.return_to_root_netns();
        netns.map_err(context_error("open the new network namespace"))
    }

    fn return_to_root_netns(&self) {
        // Always possible for root; if it failed, the agent would keep
        // working in a node's namespace, so stop right here.
        sys::setns(self.root_netns.as_fd(), libc::CLONE_NEWNET)
            .expect("return to the agent's network namespace");
    }

    fn configure_network(
        &self,
        netns: BorrowedFd<'_>,
        nic: Option<&str>,
        address: Option<(Ipv4Addr, u8)>,
    ) -> Result<(), String> {
        if let Some(nic) = nic {
            let index = link_index(nic).map_err(|e| e.to_string())?;
            Netlink::open()
                .and_then(|mut netlink| netlink.move_link_to_netns(index, netns))
                .map_err(context_error(&format!("move {nic} into the node")))?;
        }
        sys::setns(netns, libc::CLONE_NEWNET).map_err(context_error("enter the node's netns"))?;
        let result = (|| -> Result<(), String> {
            let mut netlink = Netlink::open().map_err(context_error("netlink socket"))?;
            let lo = link_index("lo").map_err(|e| e.to_string())?;
            netlink
                .set_link_up(lo)
                .map_err(context_error("set lo up"))?;
            if let Some(nic) = nic {
                let index = link_index(nic).map_err(|e| e.to_string())?;
                if let Some((ip, prefix_len)) = address {
                    netlink
                        .add_ipv4_address(index, ip, prefix_len)
                        .map_err(context_error(&format!("add {ip}/{prefix_len} to {nic}")))?;
                }
                netlink
                    .set_link_up(index)
                    .map_err(context_error(&format!("set {nic} up")))?;
            }
            Ok(())
        })();
        self.return_to_root_netns();
        result
    }

    pub(super) fn start_node(&mut self, name: &str) -> Result<(), String> {
        let node = self.nodes.get_mut(name).expect("node exists");
        let setup = Setup::NewNode {
            plan: &node.plan,
            netns: node.netns.as_fd(),
            timens: node.timens.as_ref().map(AsFd::as_fd),
        };
        let spawned = if node.local_outputs.is_empty() {
            container::spawn(&node.command, &setup, self.devnull.as_fd(), None)?
        } else {
            // Its files' directories, held before it runs: a node may end
            // (and its /tmp with it) before any read.
            let outputs = &mut node.local_outputs;
            outputs.forget();
            container::spawn_then(&node.command, &setup, self.devnull.as_fd(), &mut |pid| {
                outputs.look_up(&proc_root(pid))
            })?
        };
        node.pidns = sys::ns_id(Path::new(&format!("/proc/{}/ns/pid", spawned.pid))).ok();
        node.running = Some(Running {
            pid: spawned.pid,
            stdout: Some(spawned.stdout),
            stderr: Some(spawned.stderr),
            history: HistoryLines::default(),
        });
        self.send(&AgentToHost::NodeStarted {
            name: name.to_string(),
            pid: spawned.pid,
        });
        Ok(())
    }

    pub(super) fn running_node(&self, name: &str) -> Result<(&Node, libc::pid_t), String> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| format!("no node {name:?}"))?;
        let pid = node
            .running
            .as_ref()
            .ok_or_else(|| format!("node {name:?} is not running"))?
            .pid;
        Ok((node, pid))
    }

    /// SIGSTOP (`stop`) or SIGCONT every process in the node's PID
    /// namespace, found by scanning /proc; scans again until a scan finds
    /// no process not yet signaled (one forked between scan and signal).
    pub(super) fn pause(&mut self, name: &str, stop: bool) -> Result<(), String> {
        let (node, _) = self.running_node(name)?;
        let pidns = node
            .pidns
            .ok_or_else(|| format!("node {name:?} has no PID namespace"))?;
        let signal = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        let mut signaled = BTreeSet::new();
        for _ in 0..64 {
            let pids = sys::pids_in_pid_ns(pidns).map_err(context_error("scan /proc"))?;
            let new: Vec<_> = pids.into_iter().filter(|p| !signaled.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            for pid in new {
                // A process may exit in between: ESRCH is fine.
                let _ = sys::kill(pid, signal);
                signaled.insert(pid);
            }
        }
        let node = name.to_string();
        self.send(&if stop {
            AgentToHost::Paused { node }
        } else {
            AgentToHost::Resumed { node }
        });
        Ok(())
    }

    pub(super) fn kill(&mut self, name: &str, signal: i32) -> Result<(), String> {
        if !(1..=64).contains(&signal) {
            return Err(format!("invalid signal {signal}"));
        }
        let (_, pid) = self.running_node(name)?;
        sys::kill(pid, signal).map_err(context_error(&format!("kill {pid}")))
    }

    /// Steps or re-rates the node's realtime clock (running or not: its
    /// time namespace outlives its processes) and reports the result.
    pub(super) fn change_clock(&mut self, name: &str, change: ClockChange) -> Result<(), String> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| format!("no node {name:?}"))?;
        let (Some(timens), Some(own)) = (&node.timens, &self.own_timens) else {
            return Err(
                "the guest kernel has no time namespaces (CONFIG_TIME_NS and the \
                 0003-timens patch): nodes share the guest's clock"
                    .to_string(),
            );
        };
        let state =
            clock::change(timens.as_fd(), own.as_fd(), change).map_err(|e| e.to_string())?;
        self.send(&AgentToHost::ClockSet {
            node: name.to_string(),
            offset_ns: state.offset_ns,
            rate_ppm: state.rate_ppm,
        });
        Ok(())
    }

    pub(super) fn restart(&mut self, name: &str) -> Result<(), String> {
        let node = self.node_mut(name)?;
        match &node.running {
            Some(running) => {
                node.restart_pending = true;
                // Started again when reaped (see reap_children).
                sys::kill(running.pid, libc::SIGKILL).map_err(context_error("kill"))
            }
            None if node.disk.as_ref().is_some_and(|d| !d.ready()) => {
                // After a crash: started once the disk takes writes (mount_disk).
                node.start_when_mounted = true;
                Ok(())
            }
            None => self.start_node(name),
        }
    }

    pub(super) fn node_mut(&mut self, name: &str) -> Result<&mut Node, String> {
        self.nodes
            .get_mut(name)
            .ok_or_else(|| format!("no node {name:?}"))
    }
}

/// `a.b.c.d/len`.
fn parse_ipv4_cidr(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let invalid = || format!("invalid address {text:?} (expected a.b.c.d/len)");
    let (ip, len) = text.split_once('/').ok_or_else(invalid)?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| invalid())?;
    let len: u8 = len.parse().map_err(|_| invalid())?;
    if len > 32 {
        return Err(invalid());
    }
    Ok((ip, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_ipv4_cidr() {
        assert_eq!(
            parse_ipv4_cidr("192.0.2.1/24"),
            Ok((Ipv4Addr::new(192, 0, 2, 1), 24))
        );
        for bad in ["192.0.2.1", "192.0.2.1/33", "192.0.2/24", "x/1", "1.2.3.4/"] {
            assert!(parse_ipv4_cidr(bad).is_err(), "{bad}");
        }
    }
}
