//! The agent's side of node disks (see `crate::disk`): crashing a node,
//! releasing and readying its disk, filling and freeing its file system.

use guest_agent::protocol::AgentToHost;

use super::{context_error, Agent};
use crate::disk::Disk;
use crate::sys;

impl Agent {
    fn disk_mut(&mut self, name: &str) -> Result<&mut Disk, String> {
        self.node_mut(name)?
            .disk
            .as_mut()
            .ok_or_else(|| format!("node {name:?} has no disk"))
    }

    /// SIGKILL to the node; once it is gone (its file system with it) the
    /// host is told, and the node waits for `mount_disk` to start again.
    pub(super) fn crash(&mut self, name: &str) -> Result<(), String> {
        let node = self.node_mut(name)?;
        node.restart_pending = false;
        node.start_when_mounted = false;
        match &node.running {
            Some(running) => {
                node.crash_pending = true;
                // The disk is released when reaped (see reap_children).
                sys::kill(running.pid, libc::SIGKILL).map_err(context_error("kill"))
            }
            None => {
                self.release_disk(name);
                Ok(())
            }
        }
    }

    /// A crashed node is gone, so is its file system (mounted in its mount
    /// namespace only): says so, if it has a disk, which stays unused until
    /// `mount_disk`.
    pub(super) fn release_disk(&mut self, name: &str) {
        let Some(disk) = self.nodes.get_mut(name).and_then(|n| n.disk.as_mut()) else {
            return;
        };
        disk.set_ready(false);
        self.send(&AgentToHost::DiskReleased {
            node: name.to_string(),
        });
    }

    /// The host no longer discards the disk's writes: the node may mount it
    /// again (it does when it starts).
    pub(super) fn mount_disk(&mut self, name: &str) -> Result<(), String> {
        self.disk_mut(name)?.set_ready(true);
        self.send(&AgentToHost::DiskMounted {
            node: name.to_string(),
        });
        let node = self.node_mut(name)?;
        if std::mem::take(&mut node.start_when_mounted) && node.running.is_none() {
            self.start_node(name)?;
        }
        Ok(())
    }

    pub(super) fn fill_disk(&mut self, name: &str) -> Result<(), String> {
        let (node, pid) = self.running_node(name)?;
        let disk = node
            .disk
            .as_ref()
            .ok_or_else(|| format!("node {name:?} has no disk"))?;
        let bytes = disk.fill(pid)?;
        self.send(&AgentToHost::DiskFilled {
            node: name.to_string(),
            bytes,
        });
        Ok(())
    }

    pub(super) fn free_disk(&mut self, name: &str) -> Result<(), String> {
        let (node, pid) = self.running_node(name)?;
        node.disk
            .as_ref()
            .ok_or_else(|| format!("node {name:?} has no disk"))?
            .free(pid)?;
        self.send(&AgentToHost::DiskFreed {
            node: name.to_string(),
        });
        Ok(())
    }
}
