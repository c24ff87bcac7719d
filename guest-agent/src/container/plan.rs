//! A node's plan: every mount, directory and link its PID 1 makes between
//! `clone` and `execve` (steps 3 and 4 of the module's list), built and
//! checked before the clone so the child only makes system calls.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

use crate::sys::{cstring, path_cstring};

/// Device nodes bind-mounted from the agent's /dev into a node's /dev.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// One step of a node's mount set-up, run by the child.
#[derive(Debug)]
pub(super) enum Op {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// mkdir; an existing entry is fine.
    Mkdir(CString),
    /// Create an empty file (a bind-mount target).
    Touch(CString),
    /// symlink(target, link); an existing entry is fine.
    Symlink {
        target: CString,
        link: CString,
    },
    Chdir(CString),
    Chroot(CString),
}

/// Everything a node's PID 1 does between `clone` and `execve`.
#[derive(Debug)]
pub struct NodePlan {
    pub(super) ops: Vec<(Op, String)>,
    pub(super) hostname: CString,
    /// The node's root directory (canonical), for [`NodePlan::add_sdk`].
    rootfs: PathBuf,
}

/// What every node gets for the Antithesis SDKs (see `sdk.rs`): the shim
/// at `/usr/lib/libvoidstar.so`, `detvisor-assert` at
/// `/usr/bin/detvisor-assert`, and its own socket directory at
/// `/run/detvisor`. Bind mounts in the node's mount namespace only: the
/// node's files are not changed (an empty mount point is created if the
/// root lacks one).
#[derive(Clone, Debug)]
pub struct SdkMounts {
    pub shim: PathBuf,
    /// The agent's own executable (it is `detvisor-assert` by that name).
    pub assert_command: Option<PathBuf>,
    pub socket_dir: PathBuf,
}

/// Steps before the root switch at the end of every plan (chdir, move,
/// chroot, chdir).
const ROOT_SWITCH_OPS: usize = 4;

impl NodePlan {
    /// Builds the plan for root directory `rootfs` (absolute) and creates
    /// the mount points it needs in it (`proc sys dev tmp run`, and the
    /// disk's: `disk` is the device and its mount point inside the root).
    pub fn new(rootfs: &Path, hostname: &str, disk: Option<(&Path, &Path)>) -> io::Result<Self> {
        if !rootfs.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("root directory {rootfs:?} is not absolute"),
            ));
        }
        if hostname.is_empty() || hostname.len() > 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid hostname {hostname:?}"),
            ));
        }
        let rootfs = std::fs::canonicalize(rootfs)
            .map_err(|e| io::Error::new(e.kind(), format!("root directory {rootfs:?}: {e}")))?;
        if !rootfs.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("root directory {rootfs:?} is not a directory"),
            ));
        }
        for dir in ["proc", "sys", "dev", "tmp", "run"] {
            std::fs::create_dir_all(rootfs.join(dir))
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {rootfs:?}/{dir}: {e}")))?;
        }
        let mut plan = PlanBuilder::default();
        let r = |sub: &str| -> PathBuf { rootfs.join(sub) };
        let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
        plan.mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )?;
        plan.mount(
            Some(&rootfs),
            &rootfs,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        if let Some((device, inside)) = disk {
            let target = rootfs.join(inside.strip_prefix("/").unwrap_or(inside));
            std::fs::create_dir_all(&target)
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {target:?}: {e}")))?;
            plan.mount(Some(device), &target, Some("ext4"), 0, None)?;
        }
        plan.mount(
            Some(Path::new("proc")),
            &r("proc"),
            Some("proc"),
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        )?;
        plan.mount(
            Some(Path::new("sysfs")),
            &r("sys"),
            Some("sysfs"),
            nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
            None,
        )?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("dev"),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("mode=0755"),
        )?;
        for device in DEVICES {
            let target = r("dev").join(device);
            plan.op(
                Op::Touch(path_cstring(&target)?),
                format!("create {target:?}"),
            );
            let source = Path::new("/dev").join(device);
            plan.mount(Some(&source), &target, None, libc::MS_BIND, None)?;
        }
        plan.mkdir(&r("dev/pts"))?;
        plan.mount(
            Some(Path::new("devpts")),
            &r("dev/pts"),
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )?;
        plan.symlink("pts/ptmx", &r("dev/ptmx"))?;
        plan.mkdir(&r("dev/shm"))?;
        plan.mount(
            Some(Path::new("shm")),
            &r("dev/shm"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?;
        plan.symlink("/proc/self/fd", &r("dev/fd"))?;
        plan.symlink("/proc/self/fd/0", &r("dev/stdin"))?;
        plan.symlink("/proc/self/fd/1", &r("dev/stdout"))?;
        plan.symlink("/proc/self/fd/2", &r("dev/stderr"))?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("tmp"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("run"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=0755"),
        )?;
        plan.op(
            Op::Chdir(path_cstring(&rootfs)?),
            format!("chdir {rootfs:?}"),
        );
        plan.mount(Some(&rootfs), Path::new("/"), None, libc::MS_MOVE, None)?;
        plan.op(Op::Chroot(cstring(".")?), format!("chroot {rootfs:?}"));
        plan.op(Op::Chdir(cstring("/")?), "chdir / (new root)".to_string());
        Ok(Self {
            ops: plan.ops,
            hostname: cstring(hostname)?,
            rootfs,
        })
    }

    /// Adds the SDK's bind mounts (after /run's tmpfs, before the root
    /// switch).
    pub fn add_sdk(&mut self, sdk: &SdkMounts) -> io::Result<()> {
        let r = |sub: &str| -> PathBuf { self.rootfs.join(sub) };
        let mut plan = PlanBuilder::default();
        for dir in ["usr", "usr/lib", "usr/bin"] {
            plan.mkdir(&r(dir))?;
        }
        let mut files = vec![(sdk.shim.as_path(), r("usr/lib/libvoidstar.so"))];
        if let Some(command) = &sdk.assert_command {
            files.push((command.as_path(), r("usr/bin/detvisor-assert")));
        }
        for (source, target) in files {
            plan.op(
                Op::Touch(path_cstring(&target)?),
                format!("create {target:?}"),
            );
            plan.mount(Some(source), &target, None, libc::MS_BIND, None)?;
        }
        plan.mkdir(&r("run/detvisor"))?;
        plan.mount(
            Some(&sdk.socket_dir),
            &r("run/detvisor"),
            None,
            libc::MS_BIND,
            None,
        )?;
        let at = self.ops.len() - ROOT_SWITCH_OPS;
        self.ops.splice(at..at, plan.ops);
        Ok(())
    }
}

#[derive(Default)]
struct PlanBuilder {
    ops: Vec<(Op, String)>,
}

impl PlanBuilder {
    fn op(&mut self, op: Op, what: String) {
        self.ops.push((op, what));
    }

    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> io::Result<()> {
        let what = match (
            fstype,
            flags & libc::MS_BIND != 0,
            flags & libc::MS_MOVE != 0,
        ) {
            (Some(fstype), _, _) => format!("mount {fstype} on {target:?}"),
            (None, true, _) => format!("bind-mount {source:?} on {target:?}"),
            (None, _, true) => format!("move mount {source:?} to {target:?}"),
            _ => format!("change propagation of {target:?}"),
        };
        let op = Op::Mount {
            source: source.map(path_cstring).transpose()?,
            target: path_cstring(target)?,
            fstype: fstype.map(cstring).transpose()?,
            flags,
            data: data.map(cstring).transpose()?,
        };
        self.op(op, what);
        Ok(())
    }

    fn mkdir(&mut self, path: &Path) -> io::Result<()> {
        self.op(Op::Mkdir(path_cstring(path)?), format!("mkdir {path:?}"));
        Ok(())
    }

    fn symlink(&mut self, target: &str, link: &Path) -> io::Result<()> {
        self.op(
            Op::Symlink {
                target: cstring(target)?,
                link: path_cstring(link)?,
            },
            format!("symlink {link:?} -> {target}"),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_node_plan_creates_mount_points_and_ends_with_the_root_switch() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();

        // Act
        let plan = NodePlan::new(dir.path(), "n1", None).unwrap();

        // Assert
        for sub in ["proc", "sys", "dev", "tmp", "run"] {
            assert!(dir.path().join(sub).is_dir(), "{sub}");
        }
        let whats: Vec<&str> = plan.ops.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(whats[0], "change propagation of \"/\"");
        assert!(whats[whats.len() - 3].starts_with("move mount"));
        assert!(whats[whats.len() - 2].starts_with("chroot"));
        assert_eq!(plan.hostname.to_str().unwrap(), "n1");
    }

    #[test]
    fn test_node_plan_mounts_the_disk_inside_the_root_after_binding_it() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();

        // Act
        let disk = Some((Path::new("/dev/vda"), Path::new("/var/lib/n1")));
        let plan = NodePlan::new(dir.path(), "n1", disk).unwrap();

        // Assert
        assert!(dir.path().join("var/lib/n1").is_dir());
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert!(plan.ops[1].1.starts_with("bind-mount"));
        assert_eq!(
            plan.ops[2].1,
            format!("mount ext4 on {:?}", root.join("var/lib/n1"))
        );
    }

    #[test]
    fn test_sdk_mounts_come_after_run_and_before_the_root_switch() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = NodePlan::new(dir.path(), "n1", None).unwrap();
        let before = plan.ops.len();
        plan.add_sdk(&SdkMounts {
            shim: PathBuf::from("/run/detvisor/libvoidstar.so"),
            assert_command: Some(PathBuf::from("/detvisor-agent")),
            socket_dir: PathBuf::from("/run/detvisor/nodes/n1"),
        })
        .unwrap();
        let whats: Vec<&str> = plan.ops.iter().map(|(_, w)| w.as_str()).collect();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let at = |what: &str| whats.iter().position(|w| *w == what).expect(what);
        let run_tmpfs = at(&format!("mount tmpfs on {:?}", root.join("run")));
        let sockets = at(&format!(
            "bind-mount Some({:?}) on {:?}",
            Path::new("/run/detvisor/nodes/n1"),
            root.join("run/detvisor")
        ));
        let shim = at(&format!(
            "bind-mount Some({:?}) on {:?}",
            Path::new("/run/detvisor/libvoidstar.so"),
            root.join("usr/lib/libvoidstar.so")
        ));
        assert!(run_tmpfs < shim && shim < sockets);
        assert_eq!(whats.len(), before + 9);
        assert!(whats[whats.len() - 3].starts_with("move mount"));
    }

    #[test]
    fn test_node_plan_rejects_relative_or_missing_root_and_bad_hostname() {
        let dir = tempfile::tempdir().unwrap();
        assert!(NodePlan::new(Path::new("relative"), "n", None).is_err());
        assert!(NodePlan::new(&dir.path().join("missing"), "n", None).is_err());
        assert!(NodePlan::new(dir.path(), "", None).is_err());
        assert!(NodePlan::new(dir.path(), &"x".repeat(65), None).is_err());
    }
}
