//! A node's data disk in the guest: finding its virtio-blk device by
//! serial, mounting its ext4 file system inside the node's root (in the
//! agent's mount namespace, before the node starts, so each start of the
//! node sees it), unmounting it after a crash and mounting it again, and
//! filling its free space.
//!
//! After a crash the node's processes are gone (their mount namespace
//! with them), so unmounting in the agent's namespace drops the last
//! reference to the file system: its page cache and the block device's
//! are dropped, and the next mount reads the disk again (the VMM
//! discarded every write in between) and replays the journal.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use detvisor_agent::protocol::NodeDisk;

use crate::sys;

/// The filler file `fill` makes, in the file system's root.
pub const FILLER: &str = ".detvisor-full";

/// A node's disk and where it goes.
#[derive(Debug)]
pub struct Disk {
    serial: String,
    /// The mount point as the agent sees it (the node's root joined with
    /// the mount point inside it).
    target: PathBuf,
    mounted: bool,
}

impl Disk {
    /// The disk `spec` of the node whose root is `rootfs`.
    pub fn new(rootfs: &Path, spec: &NodeDisk) -> Result<Self, String> {
        let inside = Path::new(&spec.mount);
        if !inside.is_absolute()
            || inside
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(format!("disk mount point {:?} is not absolute", spec.mount));
        }
        let relative = inside.strip_prefix("/").unwrap_or(inside);
        Ok(Disk {
            serial: spec.serial.clone(),
            target: rootfs.join(relative),
            mounted: false,
        })
    }

    pub fn mounted(&self) -> bool {
        self.mounted
    }

    /// The device node of the virtio-blk disk whose serial is ours.
    fn device(&self) -> Result<PathBuf, String> {
        let entries = std::fs::read_dir("/sys/block").map_err(|e| format!("/sys/block: {e}"))?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("vd"))
            .collect();
        names.sort();
        for name in names {
            let serial =
                std::fs::read_to_string(format!("/sys/block/{name}/serial")).unwrap_or_default();
            if serial.trim_end_matches(['\n', '\0']) == self.serial {
                return Ok(PathBuf::from(format!("/dev/{name}")));
            }
        }
        Err(format!("no virtio disk has the serial {:?}", self.serial))
    }

    /// Mounts the file system (creating the mount point).
    pub fn mount(&mut self) -> Result<(), String> {
        if self.mounted {
            return Ok(());
        }
        let device = self.device()?;
        std::fs::create_dir_all(&self.target)
            .map_err(|e| format!("mkdir {}: {e}", self.target.display()))?;
        let source = device.to_string_lossy();
        sys::mount(Some(&source), &self.target, Some("ext4"), 0, None)
            .map_err(|e| format!("mount {source} on {}: {e}", self.target.display()))?;
        self.mounted = true;
        Ok(())
    }

    /// Unmounts the file system.
    pub fn unmount(&mut self) -> Result<(), String> {
        if !self.mounted {
            return Ok(());
        }
        sys::umount(&self.target).map_err(|e| format!("umount {}: {e}", self.target.display()))?;
        self.mounted = false;
        Ok(())
    }

    /// Allocates every free block to the filler file (1 MiB at a time,
    /// then 4 KiB at a time); returns its size.
    pub fn fill(&self) -> Result<u64, String> {
        if !self.mounted {
            return Err("the disk is not mounted".to_string());
        }
        let path = self.target.join(FILLER);
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

    /// Removes the filler file (if there is one).
    pub fn free(&self) -> Result<(), String> {
        let path = self.target.join(FILLER);
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
    fn test_mount_point_is_inside_the_node_root() {
        let disk = Disk::new(
            Path::new("/nodes/n1"),
            &NodeDisk {
                serial: "detvisor-n1".into(),
                mount: "/var/lib/etcd".into(),
            },
        )
        .unwrap();
        assert_eq!(disk.target, Path::new("/nodes/n1/var/lib/etcd"));
        assert!(!disk.mounted());
        for bad in ["data", "/a/../../etc"] {
            let spec = NodeDisk {
                serial: "s".into(),
                mount: bad.into(),
            };
            assert!(Disk::new(Path::new("/nodes/n1"), &spec).is_err(), "{bad}");
        }
    }
}
