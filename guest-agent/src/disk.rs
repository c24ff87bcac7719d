//! A node's data disk in the guest: its virtio-blk device, found by
//! serial, and the ext4 file system on it, which the node's PID 1 mounts
//! inside the node's root in the node's own mount namespace (see
//! `container`), never in the agent's: no other namespace (the agent's,
//! another node's, made later) holds a copy of the mount, so the file system
//! lives exactly as long as the node's processes. When the node is gone
//! (its PID 1 reaped: every process of its PID namespace has exited, and
//! with them the mount namespace), the file system has been unmounted and
//! its page cache and the block device's dropped; the next start mounts the
//! disk again and reads it afresh (ext4 replays its journal). That is what
//! a crash needs: the VMM discards every write from the crash until the
//! agent reports the node gone, so the guest forgets every unflushed page.
//!
//! The agent reaches the mounted file system (to fill it) through the
//! node's PID 1's root: `/proc/<pid>/root/<mount point>`.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use guest_agent::protocol::NodeDisk;

use crate::sys;

/// The filler file `fill` makes, in the file system's root.
pub const FILLER: &str = ".detvisor-full";

/// A node's disk.
#[derive(Debug)]
pub struct Disk {
    /// The device node (`/dev/vdX`).
    device: PathBuf,
    /// The mount point inside the node's root (absolute).
    mount: PathBuf,
    /// False from a crash until the host says the disk takes writes again
    /// (`mount_disk`): the node must not start (and mount it) before.
    ready: bool,
}

/// The device node of the virtio-blk disk whose serial is `serial`.
fn find_device(serial: &str) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir("/sys/block").map_err(|e| format!("/sys/block: {e}"))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("vd"))
        .collect();
    names.sort();
    for name in names {
        let found =
            std::fs::read_to_string(format!("/sys/block/{name}/serial")).unwrap_or_default();
        if found.trim_end_matches(['\n', '\0']) == serial {
            return Ok(PathBuf::from(format!("/dev/{name}")));
        }
    }
    Err(format!("no virtio disk has the serial {serial:?}"))
}

/// Checks that a mount point is absolute and without `..`.
fn check_mount(mount: &str) -> Result<PathBuf, String> {
    let path = Path::new(mount);
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(format!("disk mount point {mount:?} is not absolute"));
    }
    Ok(path.to_path_buf())
}

impl Disk {
    /// The disk `spec` (its device looked up now).
    pub fn new(spec: &NodeDisk) -> Result<Self, String> {
        let mount = check_mount(&spec.mount)?;
        Ok(Disk {
            device: find_device(&spec.serial)?,
            mount,
            ready: true,
        })
    }

    /// The device and the mount point inside the node's root, for the
    /// node's plan.
    pub fn mount_spec(&self) -> (&Path, &Path) {
        (&self.device, &self.mount)
    }

    pub fn ready(&self) -> bool {
        self.ready
    }

    pub fn set_ready(&mut self, ready: bool) {
        self.ready = ready;
    }

    /// The filler file's path as the agent reaches it while the node's PID 1
    /// is `pid`.
    fn filler(&self, pid: libc::pid_t) -> PathBuf {
        let inside = self.mount.strip_prefix("/").unwrap_or(&self.mount);
        Path::new(&format!("/proc/{pid}/root"))
            .join(inside)
            .join(FILLER)
    }

    /// Allocates every free block of the file system mounted in the node
    /// whose PID 1 is `pid` to the filler file (1 MiB at a time, then 4 KiB
    /// at a time); returns its size.
    pub fn fill(&self, pid: libc::pid_t) -> Result<u64, String> {
        let path = self.filler(pid);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        let mut size = file
            .metadata()
            .map_err(|e| format!("stat {}: {e}", path.display()))?
            .len();
        for chunk in [1 << 20, 4096] {
            loop {
                match sys::fallocate(file.as_fd(), size, chunk) {
                    Ok(()) => size += chunk,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => return Err(format!("fallocate {}: {e}", path.display())),
                }
            }
        }
        Ok(size)
    }

    /// Removes the filler file (if there is one) of the node whose PID 1 is
    /// `pid`.
    pub fn free(&self, pid: libc::pid_t) -> Result<(), String> {
        let path = self.filler(pid);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("remove {}: {e}", path.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mount_points_must_be_absolute_without_parent_steps() {
        assert_eq!(
            check_mount("/var/lib/etcd"),
            Ok(PathBuf::from("/var/lib/etcd"))
        );
        for bad in ["data", "/a/../../etc"] {
            assert!(check_mount(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn test_the_filler_is_reached_through_the_nodes_root() {
        let disk = Disk {
            device: PathBuf::from("/dev/vda"),
            mount: PathBuf::from("/var/lib/n1"),
            ready: true,
        };
        assert_eq!(
            disk.filler(42),
            Path::new("/proc/42/root/var/lib/n1/.detvisor-full")
        );
        assert_eq!(
            disk.mount_spec(),
            (Path::new("/dev/vda"), Path::new("/var/lib/n1"))
        );
    }
}
