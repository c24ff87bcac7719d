//! Reading a host directory tree into a [`RootFs`] ([`RootFs::from_dir`]).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::rootfs::{check_link_target, join, Ctx, Node, NodeKind, RootFs, CALLER};
use crate::{FlattenOptions, ImageError};

/// Knobs of [`RootFs::from_dir_with`].
#[derive(Clone, Debug, Default)]
pub struct DirOptions {
    /// Keep the host uid/gid of every entry. Off by default: everything becomes `root:root`,
    /// so the tree does not depend on who unpacked or copied the directory.
    pub keep_owners: bool,
    /// The limits of the OCI path, the same here: the largest file, the most file bytes in
    /// all, the most entries (`max_layer_size` and `devices` do not apply).
    pub limits: FlattenOptions,
}

impl RootFs {
    /// Reads the directory tree at `dir` with [`DirOptions::default`] (owners become root).
    ///
    /// See [`RootFs::from_dir_with`].
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<RootFs, ImageError> {
        Self::from_dir_with(dir, &DirOptions::default())
    }

    /// Reads the directory tree at `dir` (followed if it is a symlink) into a new tree.
    ///
    /// - Regular files are read whole with their permission bits (including setuid, setgid
    ///   and sticky); files that share an inode on the host (hardlinks) share one in the tree.
    /// - Directories keep their permission bits; the mode of `dir` itself is not used (the
    ///   root of an initramfs is not an archive entry).
    /// - Symlinks are kept as symlinks with their target verbatim, never followed.
    /// - FIFOs and character/block device nodes are kept, as flattening keeps them from layers
    ///   (they only ever exist inside the guest).
    /// - Sockets are skipped silently: they are runtime leftovers that cannot be recreated.
    /// - Modification times are dropped; owners are reset to `root:root` unless
    ///   [`DirOptions::keep_owners`].
    ///
    /// Errors name the host path: [`ImageError::Io`] when something cannot be read,
    /// [`ImageError::HostEntry`] for a name or symlink target that is not UTF-8 (the newc
    /// writer needs UTF-8) or when `dir` is not a directory. Entries are visited in sorted
    /// order, so the result does not depend on the order the host lists them in.
    pub fn from_dir_with(dir: impl AsRef<Path>, opts: &DirOptions) -> Result<RootFs, ImageError> {
        let dir = dir.as_ref();
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| ImageError::Io { path, source }
        };
        if !fs::metadata(dir).map_err(io(dir))?.is_dir() {
            return Err(ImageError::HostEntry {
                path: dir.to_owned(),
                reason: "not a directory".to_owned(),
            });
        }
        let mut fs = RootFs::new();
        // (st_dev, st_ino) of multiply linked files -> the tree path of their first name.
        let mut links: HashMap<(u64, u64), String> = HashMap::new();
        let mut pending: Vec<(PathBuf, String)> = vec![(dir.to_owned(), String::new())];
        let limits = &opts.limits;
        let (mut entries, mut total) = (0u64, 0u64);
        let too_large = |host: &Path, what, size, limit| ImageError::TooLarge {
            subject: host.display().to_string(),
            what,
            size,
            limit,
        };
        while let Some((host_dir, rel_dir)) = pending.pop() {
            let mut children = fs::read_dir(&host_dir)
                .map_err(io(&host_dir))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(io(&host_dir))?;
            children.sort_by_key(|c| c.file_name());
            for child in children {
                let host = child.path();
                let name = child
                    .file_name()
                    .into_string()
                    .map_err(|_| ImageError::HostEntry {
                        path: host.clone(),
                        reason: "the name is not valid UTF-8".to_owned(),
                    })?;
                let rel = join(&rel_dir, &name);
                let ctx = Ctx {
                    layer: CALLER,
                    entry: &rel,
                };
                entries += 1;
                if entries > limits.max_entries {
                    return Err(too_large(
                        &host,
                        "number of entries",
                        entries,
                        limits.max_entries,
                    ));
                }
                let md = fs::symlink_metadata(&host).map_err(io(&host))?;
                let ft = md.file_type();
                let perm = md.mode() & 0o7777;
                let kind = if ft.is_dir() {
                    pending.push((host.clone(), rel.clone()));
                    NodeKind::Dir
                } else if ft.is_file() {
                    if md.nlink() > 1 {
                        let key = (md.dev(), md.ino());
                        if let Some(first) = links.get(&key) {
                            let id = fs.lookup_id(first).expect("added before");
                            fs.put_link(rel.clone(), id, ctx)?;
                            continue;
                        }
                        links.insert(key, rel.clone());
                    }
                    if md.len() > limits.max_file_size {
                        return Err(too_large(
                            &host,
                            "file size (bytes)",
                            md.len(),
                            limits.max_file_size,
                        ));
                    }
                    // A regular file still (not swapped for a FIFO), of bounded size.
                    let data = hostfile::read_limited(&host, limits.max_file_size)
                        .map_err(ImageError::Read)?;
                    total = total.saturating_add(data.len() as u64);
                    if total > limits.max_total_size {
                        return Err(too_large(
                            &host,
                            "file content read so far (bytes)",
                            total,
                            limits.max_total_size,
                        ));
                    }
                    NodeKind::File { data }
                } else if ft.is_symlink() {
                    let target = fs::read_link(&host)
                        .map_err(io(&host))?
                        .into_os_string()
                        .into_string()
                        .map_err(|_| ImageError::HostEntry {
                            path: host.clone(),
                            reason: "the symlink target is not valid UTF-8".to_owned(),
                        })?;
                    check_link_target(&target, ctx)?;
                    NodeKind::Symlink { target }
                } else if ft.is_char_device() || ft.is_block_device() {
                    let (major, minor) = split_dev(md.rdev());
                    if ft.is_char_device() {
                        NodeKind::CharDevice { major, minor }
                    } else {
                        NodeKind::BlockDevice { major, minor }
                    }
                } else if ft.is_fifo() {
                    NodeKind::Fifo
                } else if ft.is_socket() {
                    continue;
                } else {
                    return Err(ImageError::HostEntry {
                        path: host,
                        reason: format!("unknown file type (mode {:o})", md.mode()),
                    });
                };
                let mut node = Node {
                    kind,
                    mode: perm,
                    uid: 0,
                    gid: 0,
                };
                if opts.keep_owners {
                    node = node.owned_by(md.uid(), md.gid());
                }
                fs.put(rel.clone(), node, ctx)?;
            }
        }
        Ok(fs)
    }
}

/// `major(dev)`, `minor(dev)` with the Linux/glibc encoding of `dev_t`.
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn write(path: &Path, mode: u32, data: &[u8]) {
        fs::write(path, data).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn reads_files_dirs_symlinks_and_hardlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::create_dir_all(d.join("usr/bin")).unwrap();
        fs::create_dir(d.join("etc")).unwrap();
        fs::set_permissions(d.join("etc"), fs::Permissions::from_mode(0o750)).unwrap();
        write(&d.join("usr/bin/tool"), 0o4755, b"\x7fELF tool");
        write(&d.join("etc/hosts"), 0o644, b"127.0.0.1 localhost\n");
        fs::hard_link(d.join("usr/bin/tool"), d.join("usr/bin/alias")).unwrap();
        symlink("usr/bin", d.join("bin")).unwrap();
        symlink("/does/not/exist", d.join("dangling")).unwrap();
        let sock = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();

        let root = RootFs::from_dir(d).unwrap();
        drop(sock);
        let paths: Vec<&str> = root.entries().map(|(p, _)| p).collect();
        assert_eq!(
            paths,
            [
                "bin",
                "dangling",
                "etc",
                "etc/hosts",
                "usr",
                "usr/bin",
                "usr/bin/alias",
                "usr/bin/tool"
            ],
            "the socket is skipped"
        );
        let tool = root.get("usr/bin/tool").unwrap();
        assert_eq!(tool.mode, 0o4755);
        assert_eq!((tool.uid, tool.gid), (0, 0));
        assert_eq!(tool.data(), Some(&b"\x7fELF tool"[..]));
        assert_eq!(root.link_count("usr/bin/alias"), Some(2));
        assert_eq!(root.get("etc").unwrap().mode, 0o750);
        assert_eq!(root.get("bin").unwrap().symlink_target(), Some("usr/bin"));
        assert_eq!(
            root.get("dangling").unwrap().symlink_target(),
            Some("/does/not/exist")
        );
        // Symlinks are resolved inside the tree only.
        assert_eq!(root.get("bin/tool").unwrap().mode, 0o4755);
    }

    #[test]
    fn keep_owners_keeps_host_ids() {
        let tmp = tempfile::tempdir().unwrap();
        write(&tmp.path().join("f"), 0o600, b"x");
        let md = fs::metadata(tmp.path().join("f")).unwrap();
        let root = RootFs::from_dir_with(
            tmp.path(),
            &DirOptions {
                keep_owners: true,
                ..DirOptions::default()
            },
        )
        .unwrap();
        let f = root.get("f").unwrap();
        assert_eq!((f.uid, f.gid), (md.uid(), md.gid()));
        assert_eq!(f.mode, 0o600);
    }

    #[test]
    fn fifos_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let st = std::process::Command::new("mkfifo")
            .arg(tmp.path().join("pipe"))
            .status()
            .unwrap();
        assert!(st.success());
        let root = RootFs::from_dir(tmp.path()).unwrap();
        assert_eq!(root.get("pipe").unwrap().kind, NodeKind::Fifo);
    }

    #[test]
    fn errors_name_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("missing");
        let err = RootFs::from_dir(&missing).unwrap_err();
        assert!(matches!(err, ImageError::Io { ref path, .. } if *path == missing));
        assert!(err.to_string().contains("missing"), "{err}");

        write(&tmp.path().join("file"), 0o644, b"");
        let err = RootFs::from_dir(tmp.path().join("file")).unwrap_err();
        assert!(err.to_string().ends_with("file: not a directory"), "{err}");

        let bad = std::ffi::OsStr::from_bytes(b"bad\xffname");
        write(&tmp.path().join(bad), 0o644, b"");
        let err = RootFs::from_dir(tmp.path()).unwrap_err();
        assert!(
            matches!(err, ImageError::HostEntry { ref path, .. } if path.ends_with(bad)),
            "{err}"
        );
    }

    #[test]
    fn the_oci_limits_apply_to_a_host_directory() {
        let tmp = tempfile::tempdir().unwrap();
        write(&tmp.path().join("a"), 0o644, &[1; 100]);
        write(&tmp.path().join("b"), 0o644, &[2; 100]);
        let with = |max_file_size, max_total_size, max_entries| DirOptions {
            limits: FlattenOptions {
                max_file_size,
                max_total_size,
                max_entries,
                ..FlattenOptions::default()
            },
            ..DirOptions::default()
        };
        RootFs::from_dir_with(tmp.path(), &with(100, 200, 2)).unwrap();
        let err = RootFs::from_dir_with(tmp.path(), &with(99, 200, 2)).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("a: file size (bytes) of 100 exceeds the limit of 99"),
            "{err}"
        );
        let err = RootFs::from_dir_with(tmp.path(), &with(100, 199, 2)).unwrap_err();
        assert!(
            err.to_string()
                .contains("file content read so far (bytes) of 200"),
            "{err}"
        );
        let err = RootFs::from_dir_with(tmp.path(), &with(100, 200, 1)).unwrap_err();
        assert!(
            err.to_string()
                .contains("number of entries of 2 exceeds the limit of 1"),
            "{err}"
        );
        // The defaults are the OCI path's.
        assert_eq!(
            DirOptions::default().limits.max_file_size,
            FlattenOptions::default().max_file_size
        );
    }

    #[test]
    fn split_dev_matches_linux_encoding() {
        // glibc's makedev().
        fn makedev(major: u64, minor: u64) -> u64 {
            (minor & 0xff)
                | ((major & 0xfff) << 8)
                | ((minor & !0xff) << 12)
                | ((major & !0xfff) << 32)
        }
        for (major, minor) in [(5, 1), (259, 0x1_0000), (0x1234, 0x5_6789), (0, 0)] {
            assert_eq!(
                split_dev(makedev(major, minor)),
                (major as u32, minor as u32)
            );
        }
    }
}
