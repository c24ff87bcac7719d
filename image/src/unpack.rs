//! Reading an initramfs back into a [`RootFs`]: the inverse of [`crate::write_initramfs`].

use std::collections::HashMap;
use std::io::Read;

use flate2::bufread::GzDecoder;

use crate::rootfs::{check_link_target, Ctx, Node, NodeKind, RootFs};
use crate::ImageError;

/// The `layer` named in errors that path resolution raises for initramfs entries (a parent
/// going through a symlink that leaves the root, loops or dangles).
pub const INITRAMFS: &str = "(initramfs)";

const TRAILER: &str = "TRAILER!!!";
const S_IFMT: u32 = 0o170000;

/// Limits of [`read_initramfs_with`].
#[derive(Clone, Debug)]
pub struct UnpackOptions {
    /// Most bytes decompressed from gzip streams, all streams together, default 16 GiB
    /// (decompression bombs; the tree lives in memory).
    pub max_decompressed_size: u64,
    /// Most archive entries, all archives together, default 2,000,000.
    pub max_entries: u64,
}

impl Default for UnpackOptions {
    fn default() -> Self {
        UnpackOptions {
            max_decompressed_size: 16 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// Reads an initramfs with [`UnpackOptions::default`]. See [`read_initramfs_with`].
pub fn read_initramfs(bytes: &[u8]) -> Result<RootFs, ImageError> {
    read_initramfs_with(bytes, &UnpackOptions::default())
}

/// Reads an initramfs into a new tree, the way the Linux kernel unpacks one.
///
/// `bytes` is a sequence of newc archives (magic `070701`, or `070702` with checksums), each
/// uncompressed or in a gzip stream, possibly separated by NUL padding; a gzip stream may itself
/// hold several archives. Entries apply in order: later ones replace earlier ones (a directory
/// over a directory only takes the new mode and owner), parents missing from the archive are
/// created as 0755 root directories, and regular files with `nlink >= 2` and the same
/// inode/device/mode within one archive become hardlinks (data in any of them fills the shared
/// inode, as in the kernel). Kept: mode bits, uid/gid, file data, symlink targets, device
/// numbers. Dropped: mtimes, and socket entries (which have no [`NodeKind`]).
///
/// The input is untrusted. Entry names are taken relative to the root (a leading `/` or `./`
/// is dropped; `.` is the root itself), and a name with a `..` component is an
/// [`ImageError::InitramfsEntry`] naming the entry, as is a non-UTF-8 symlink target, an
/// unknown file type, or a non-directory replacing a non-empty directory. Parents are resolved
/// inside the tree like [`RootFs::add_node`] paths, so a symlinked parent that leads outside
/// the root fails (layer [`INITRAMFS`]). Malformed bytes (bad magic, truncation, corrupt gzip,
/// other compressions, limits) are an [`ImageError::InitramfsFormat`] with the offset. Input
/// with no archive at all is an error too.
pub fn read_initramfs_with(bytes: &[u8], opts: &UnpackOptions) -> Result<RootFs, ImageError> {
    let mut u = Unpacker {
        fs: RootFs::new(),
        opts,
        entries: 0,
        decompressed: 0,
        archives: 0,
    };
    let mut pos = 0;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        if rest[0] == 0 {
            pos += 1;
        } else if rest.starts_with(b"0707") {
            let base = pos;
            pos += u.archive(rest, &|off| format!("byte {}", base + off))?;
        } else if rest.starts_with(&[0x1f, 0x8b]) {
            let base = pos;
            let (data, used) = u.gunzip(rest, base)?;
            u.archives_in(&data, &|off| {
                format!("byte {off} of the gzip stream at byte {base}")
            })?;
            pos += used;
        } else {
            return Err(ImageError::InitramfsFormat {
                at: format!("byte {pos}"),
                reason: format!(
                    "neither a newc archive (magic 070701) nor gzip data (starts with {:02x?}); \
                     only uncompressed and gzip-compressed newc archives are read",
                    &rest[..rest.len().min(4)]
                ),
            });
        }
    }
    if u.archives == 0 {
        return Err(ImageError::InitramfsFormat {
            at: format!("byte {pos}"),
            reason: "no newc archive in the input".to_owned(),
        });
    }
    Ok(u.fs)
}

/// Names a position (an offset within the current buffer) for errors.
type At<'a> = dyn Fn(usize) -> String + 'a;

struct Unpacker<'o> {
    fs: RootFs,
    opts: &'o UnpackOptions,
    entries: u64,
    decompressed: u64,
    archives: u64,
}

/// The kernel's hardlink key: inode, device major/minor, mode.
type LinkKey = (u32, u32, u32, u32);

impl Unpacker<'_> {
    /// Decompresses the gzip stream at the start of `rest` (at byte `pos` of the input);
    /// returns its content and the number of compressed bytes it took.
    fn gunzip(&mut self, rest: &[u8], pos: usize) -> Result<(Vec<u8>, usize), ImageError> {
        let budget = self.opts.max_decompressed_size - self.decompressed;
        let mut dec = GzDecoder::new(rest);
        let mut data = Vec::new();
        (&mut dec)
            .take(budget.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| ImageError::InitramfsFormat {
                at: format!("gzip stream at byte {pos}"),
                reason: format!("corrupt gzip data: {e}"),
            })?;
        if data.len() as u64 > budget {
            return Err(ImageError::InitramfsFormat {
                at: format!("gzip stream at byte {pos}"),
                reason: format!(
                    "more than {} bytes decompressed in all (the limit)",
                    self.opts.max_decompressed_size
                ),
            });
        }
        self.decompressed += data.len() as u64;
        let used = rest.len() - dec.into_inner().len();
        Ok((data, used))
    }

    /// Every archive in a decompressed buffer (NUL padding between them allowed).
    fn archives_in(&mut self, data: &[u8], at: &At<'_>) -> Result<(), ImageError> {
        let mut pos = 0;
        while pos < data.len() {
            if data[pos] == 0 {
                pos += 1;
            } else if data[pos..].starts_with(b"0707") {
                let base = pos;
                pos += self.archive(&data[base..], &|off| at(base + off))?;
            } else {
                return Err(ImageError::InitramfsFormat {
                    at: at(pos),
                    reason: "expected a newc archive (magic 070701) or NUL padding".to_owned(),
                });
            }
        }
        Ok(())
    }

    /// One archive, up to and including its trailer, from the start of `data`; returns the
    /// number of bytes it took.
    fn archive(&mut self, data: &[u8], at: &At<'_>) -> Result<usize, ImageError> {
        self.archives += 1;
        let mut links: HashMap<LinkKey, String> = HashMap::new();
        let mut rest = data;
        loop {
            let offset = data.len() - rest.len();
            let format_err = |reason: String| ImageError::InitramfsFormat {
                at: at(offset),
                reason,
            };
            let mut r = cpio::NewcReader::new(rest)
                .map_err(|e| format_err(format!("bad newc header: {e}")))?;
            let entry = r.entry().clone();
            if entry.is_trailer() {
                rest = r
                    .finish()
                    .map_err(|e| format_err(format!("truncated trailer: {e}")))?;
                return Ok(data.len() - rest.len());
            }
            self.entries += 1;
            if self.entries > self.opts.max_entries {
                return Err(format_err(format!(
                    "more than {} entries in all (the limit)",
                    self.opts.max_entries
                )));
            }
            let mut body = Vec::new();
            r.read_to_end(&mut body)
                .map_err(|e| format_err(format!("entry {:?}: {e}", entry.name())))?;
            if body.len() != entry.file_size() as usize {
                return Err(format_err(format!(
                    "entry {:?}: truncated data ({} of {} bytes)",
                    entry.name(),
                    body.len(),
                    entry.file_size()
                )));
            }
            rest = r
                .finish()
                .map_err(|e| format_err(format!("entry {:?}: {e}", entry.name())))?;
            self.apply(&entry, body, &mut links)?;
        }
    }

    /// Applies one entry to the tree.
    fn apply(
        &mut self,
        e: &cpio::newc::Entry,
        body: Vec<u8>,
        links: &mut HashMap<LinkKey, String>,
    ) -> Result<(), ImageError> {
        let name = e.name();
        debug_assert_ne!(name, TRAILER);
        let bad = |reason: &str| ImageError::InitramfsEntry {
            entry: name.to_owned(),
            reason: reason.to_owned(),
        };
        let ctx = Ctx {
            layer: INITRAMFS,
            entry: name,
        };
        let mut comps: Vec<String> = Vec::new();
        for c in name.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(bad(
                        "has a `..` component; entries must stay inside the root",
                    ))
                }
                _ => comps.push(c.to_owned()),
            }
        }
        // Reuse the length and NUL checks of layer entries (no `..` is left to climb).
        crate::rootfs::normalize_entry(name, ctx)?;
        let mode = e.mode();
        let kind = match mode & S_IFMT {
            0o040000 => NodeKind::Dir,
            0o100000 => NodeKind::File { data: body },
            0o120000 => {
                let target = String::from_utf8(body)
                    .map_err(|_| bad("the symlink target is not valid UTF-8"))?;
                check_link_target(&target, ctx)?;
                NodeKind::Symlink { target }
            }
            0o020000 => NodeKind::CharDevice {
                major: e.rdev_major(),
                minor: e.rdev_minor(),
            },
            0o060000 => NodeKind::BlockDevice {
                major: e.rdev_major(),
                minor: e.rdev_minor(),
            },
            0o010000 => NodeKind::Fifo,
            0o140000 => return Ok(()),
            other => {
                return Err(bad(&format!(
                    "unknown file type {other:o} in mode {mode:o}"
                )))
            }
        };
        let node = Node {
            kind,
            mode: mode & 0o7777,
            uid: e.uid(),
            gid: e.gid(),
        };
        if comps.is_empty() {
            if !node.is_dir() {
                return Err(bad("the root can only be a directory"));
            }
            return self.fs.put(String::new(), node, ctx);
        }
        let path = self.fs.entry_path(&comps, ctx)?;
        if !node.is_dir() && self.fs.lookup(&path).is_some_and(Node::is_dir) {
            if self.fs.has_children(&path) {
                return Err(bad("replaces a non-empty directory"));
            }
            self.fs.remove_subtree(&path);
        }
        let key = (e.ino(), e.dev_major(), e.dev_minor(), mode);
        let NodeKind::File { data } = &node.kind else {
            return self.fs.put(path, node, ctx);
        };
        if e.nlink() >= 2 {
            // The first name may have been replaced since; only link to a regular file.
            let first = links
                .get(&key)
                .and_then(|p| self.fs.lookup_id(p))
                .filter(|&id| self.fs.node_mut(id).data().is_some());
            if let Some(id) = first {
                if !data.is_empty() {
                    overwrite(self.fs.node_mut(id), data);
                }
                return self.fs.put_link(path, id, ctx);
            }
            links.insert(key, path.clone());
        }
        self.fs.put(path, node, ctx)
    }
}

/// Writes `data` at the start of the file `node` without truncating it (the kernel opens
/// later names of a hardlinked file without `O_TRUNC`).
fn overwrite(node: &mut Node, new: &[u8]) {
    if let NodeKind::File { data } = &mut node.kind {
        if data.len() < new.len() {
            data.resize(new.len(), 0);
        }
        data[..new.len()].copy_from_slice(new);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::{write_cpio, write_initramfs};

    /// A newc archive of (name, st_mode, ino, nlink, body) entries, with its trailer.
    fn cpio(entries: &[(&str, u32, u32, u32, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(name, mode, ino, nlink, body) in entries {
            let mut w = cpio::NewcBuilder::new(name)
                .mode(mode)
                .ino(ino)
                .nlink(nlink)
                .uid(7)
                .gid(8)
                .write(&mut out, body.len() as u32);
            w.write_all(body).unwrap();
            w.finish().unwrap();
        }
        cpio::newc::trailer(&mut out).unwrap();
        out
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn sample() -> RootFs {
        let mut fs = RootFs::new();
        fs.add_dir("usr/bin", 0o755).unwrap();
        fs.add_file("usr/bin/busybox", 0o4755, b"\x7fELF".to_vec())
            .unwrap();
        fs.add_hardlink("usr/bin/ls", "usr/bin/busybox").unwrap();
        fs.add_hardlink("usr/bin/cat", "usr/bin/busybox").unwrap();
        fs.add_symlink("bin", "usr/bin").unwrap();
        fs.add_symlink("etc/mtab", "/proc/self/mounts").unwrap();
        fs.add_node("home/app", Node::dir(0o700).owned_by(1000, 1000))
            .unwrap();
        fs.add_node(
            "home/app/f",
            Node::file(0o600, vec![1; 5000]).owned_by(1000, 100),
        )
        .unwrap();
        fs.add_node(
            "dev/console",
            Node {
                kind: NodeKind::CharDevice { major: 5, minor: 1 },
                mode: 0o600,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        fs.add_node(
            "dev/vda",
            Node {
                kind: NodeKind::BlockDevice {
                    major: 254,
                    minor: 0,
                },
                mode: 0o660,
                uid: 0,
                gid: 6,
            },
        )
        .unwrap();
        fs.add_node(
            "run/fifo",
            Node {
                kind: NodeKind::Fifo,
                mode: 0o600,
                uid: 0,
                gid: 0,
            },
        )
        .unwrap();
        fs.add_file("empty", 0o644, Vec::new()).unwrap();
        fs
    }

    fn listing(fs: &RootFs) -> Vec<(String, Node, u32)> {
        fs.entries()
            .map(|(p, n)| (p.to_owned(), n.clone(), fs.link_count(p).unwrap()))
            .collect()
    }

    fn bytes(fs: &RootFs) -> Vec<u8> {
        let mut out = Vec::new();
        write_initramfs(fs, &mut out).unwrap();
        out
    }

    #[test]
    fn round_trips_write_initramfs_and_write_cpio() {
        let fs = sample();
        let gz = bytes(&fs);
        let back = read_initramfs(&gz).unwrap();
        assert_eq!(listing(&back), listing(&fs));
        assert_eq!(back.link_count("usr/bin/cat"), Some(3));
        assert_eq!(bytes(&back), gz, "read then written again: the same bytes");

        let plain = write_cpio(&fs, Vec::new()).unwrap();
        assert_eq!(listing(&read_initramfs(&plain).unwrap()), listing(&fs));
    }

    #[test]
    fn concatenated_archives_apply_in_order() {
        let first = cpio(&[
            ("etc", 0o040755, 1, 2, b""),
            ("etc/a", 0o100644, 2, 1, b"old"),
        ]);
        let second = cpio(&[("etc/a", 0o100600, 1, 1, b"new")]);
        let third = cpio(&[
            ("./etc/b", 0o100644, 1, 1, b"b"),
            (".", 0o040700, 2, 2, b""),
        ]);
        let mut input = gzip(&first);
        input.extend_from_slice(&[0; 7]);
        input.extend_from_slice(&second);
        input.extend_from_slice(&[0; 4]);
        // One gzip stream holding two archives with padding between them.
        let mut both = third.clone();
        both.extend_from_slice(&[0; 3]);
        both.extend_from_slice(&cpio(&[("/etc/c", 0o120777, 1, 1, b"a")]));
        input.extend_from_slice(&gzip(&both));
        let fs = read_initramfs(&input).unwrap();
        let a = fs.get("etc/a").unwrap();
        assert_eq!(
            (a.data(), a.mode, a.uid, a.gid),
            (Some(&b"new"[..]), 0o600, 7, 8)
        );
        assert_eq!(fs.get("etc/b").unwrap().data(), Some(&b"b"[..]));
        assert_eq!(fs.get("etc/c").unwrap().symlink_target(), Some("a"));
        assert_eq!(fs.root().mode, 0o700);
    }

    #[test]
    fn hardlinks_follow_the_kernel_rules() {
        // GNU cpio puts the data in the last name; the kernel fills the shared inode from it.
        let a = cpio(&[
            ("x", 0o100755, 9, 2, b""),
            ("y", 0o100755, 9, 2, b"data"),
            // Same inode number but another mode: not a link.
            ("z", 0o100644, 9, 2, b"other"),
        ]);
        // The link table is per archive: inode 9 here is a new file.
        let b = cpio(&[("w", 0o100755, 9, 2, b"fresh")]);
        let fs = read_initramfs(&[a, b].concat()).unwrap();
        assert_eq!(fs.link_count("x"), Some(2));
        assert_eq!(fs.get("x").unwrap().data(), Some(&b"data"[..]));
        assert_eq!(fs.get("z").unwrap().data(), Some(&b"other"[..]));
        assert_eq!(fs.link_count("w"), Some(1));
    }

    fn entry_err(name: &str) -> ImageError {
        read_initramfs(&cpio(&[(name, 0o100644, 1, 1, b"x")])).unwrap_err()
    }

    #[test]
    fn dot_dot_entries_are_rejected_by_name() {
        for name in ["../escape", "a/../../b", "/../x", "a/.."] {
            let err = entry_err(name);
            assert!(
                matches!(&err, ImageError::InitramfsEntry { entry, .. } if entry == name),
                "{name}: {err}"
            );
            assert!(err.to_string().contains(&format!("{name:?}")), "{err}");
            assert!(err.to_string().contains("`..`"), "{err}");
        }
        // A leading `/` is just the root.
        let fs = read_initramfs(&cpio(&[("/etc/x", 0o100644, 1, 1, b"x")])).unwrap();
        assert!(fs.get("etc/x").is_some());
    }

    #[test]
    fn unsafe_or_malformed_entries_are_rejected() {
        let up = cpio(&[
            ("up", 0o120777, 1, 1, b"../.."),
            ("up/x", 0o100644, 2, 1, b""),
        ]);
        assert!(matches!(
            read_initramfs(&up),
            Err(ImageError::SymlinkEscape { layer, entry, .. }) if layer == INITRAMFS && entry == "up/x"
        ));
        let non_empty = cpio(&[("d/f", 0o100644, 1, 1, b""), ("d", 0o100644, 2, 1, b"")]);
        let err = read_initramfs(&non_empty).unwrap_err();
        assert!(err.to_string().contains("non-empty directory"), "{err}");
        let empty_dir = cpio(&[("d", 0o040755, 1, 2, b""), ("d", 0o100644, 2, 1, b"f")]);
        let fs = read_initramfs(&empty_dir).unwrap();
        assert_eq!(fs.get("d").unwrap().data(), Some(&b"f"[..]));
        let bad_link = cpio(&[("l", 0o120777, 1, 1, b"\xff")]);
        assert!(matches!(
            read_initramfs(&bad_link),
            Err(ImageError::InitramfsEntry { entry, .. }) if entry == "l"
        ));
        let bad_type = cpio(&[("t", 0o170644, 1, 1, b"")]);
        assert!(read_initramfs(&bad_type)
            .unwrap_err()
            .to_string()
            .contains("unknown file type"));
        let root_file = cpio(&[(".", 0o100644, 1, 1, b"")]);
        assert!(read_initramfs(&root_file).is_err());
        let socket = cpio(&[("s", 0o140755, 1, 1, b"")]);
        assert!(read_initramfs(&socket).unwrap().is_empty());
    }

    #[test]
    fn malformed_bytes_are_reported_with_their_offset() {
        let err = read_initramfs(b"").unwrap_err();
        assert!(err.to_string().contains("no newc archive"), "{err}");
        let err = read_initramfs(b"\0\0\0\0hello").unwrap_err();
        assert!(err.to_string().starts_with("initramfs, byte 4:"), "{err}");
        let zstd = [0x28, 0xb5, 0x2f, 0xfd, 0, 0];
        assert!(read_initramfs(&zstd).is_err());

        let good = cpio(&[("a", 0o100644, 1, 1, b"0123456789")]);
        let truncated = &good[..good.len() - 130];
        let err = read_initramfs(truncated).unwrap_err();
        assert!(matches!(err, ImageError::InitramfsFormat { .. }), "{err}");
        assert!(err.to_string().contains("byte 0"), "{err}");
        let no_trailer = &good[..good.len() - 124];
        assert!(read_initramfs(no_trailer).is_err());

        let mut gz = gzip(&good);
        gz.truncate(gz.len() - 3);
        let err = read_initramfs(&gz).unwrap_err();
        assert!(err.to_string().contains("gzip stream at byte 0"), "{err}");

        let mut junk_inside = good.clone();
        junk_inside.extend_from_slice(b"junk");
        let err = read_initramfs(&gzip(&junk_inside)).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("byte {} of the gzip stream at byte 0", good.len())),
            "{err}"
        );
    }

    #[test]
    fn limits_hold() {
        let big = cpio(&[("a", 0o100644, 1, 1, &[0; 4096])]);
        let opts = UnpackOptions {
            max_decompressed_size: 1000,
            ..UnpackOptions::default()
        };
        let err = read_initramfs_with(&gzip(&big), &opts).unwrap_err();
        assert!(err.to_string().contains("the limit"), "{err}");
        let opts = UnpackOptions {
            max_entries: 1,
            ..UnpackOptions::default()
        };
        let two = cpio(&[("a", 0o100644, 1, 1, b""), ("b", 0o100644, 2, 1, b"")]);
        let err = read_initramfs_with(&two, &opts).unwrap_err();
        assert!(err.to_string().contains("entries"), "{err}");
    }
}
