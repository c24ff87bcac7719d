//! Serialising a [`RootFs`] as a reproducible newc cpio archive (gzip-compressed for the guest).

use std::collections::HashMap;
use std::io::{self, Read, Write};

use flate2::write::GzEncoder;
use flate2::{Compression, GzBuilder};

use crate::rootfs::{InodeId, NodeKind, RootFs};
use crate::ImageError;

/// The gzip level of [`write_initramfs`]: fixed, so the output depends only on the tree (and on
/// the flate2/miniz_oxide versions that `Cargo.lock` pins).
pub const GZIP_LEVEL: u32 = 6;

/// Writes `root` as a gzip-compressed newc cpio archive, the form the Linux kernel unpacks as an
/// initramfs. See [`write_cpio`] for the archive; the gzip header carries no file name, no
/// comment, mtime 0 and OS "unknown" (255), and the level is [`GZIP_LEVEL`]. Two calls with
/// the same tree produce the same bytes.
pub fn write_initramfs<W: Write>(root: &RootFs, out: &mut W) -> Result<(), ImageError> {
    let gz: GzEncoder<&mut W> = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(out, Compression::new(GZIP_LEVEL));
    let gz = write_cpio(root, gz)?;
    let out = gz.finish().map_err(ImageError::Write)?;
    out.flush().map_err(ImageError::Write)
}

/// Writes `root` as an uncompressed newc cpio archive (with its `TRAILER!!!`) and returns the
/// writer.
///
/// Reproducible by construction:
/// - entries in bytewise order of their path (so directories precede their contents), named
///   without a leading `/` (`etc/passwd`); the root directory itself is not an entry;
/// - inode numbers 1, 2, ... in order of first appearance; the paths of a hardlinked inode
///   share its number and carry its link count, the first of them carries the data and the
///   others are empty (the kernel, GNU cpio and busybox cpio all link them up);
/// - mtime 0, device (`dev`) numbers 0; mode, uid, gid and `rdev` from the tree; directories
///   have nlink 2 + number of subdirectories.
pub fn write_cpio<W: Write>(root: &RootFs, out: W) -> Result<W, ImageError> {
    // nlink of directories: 2 + subdirectories.
    let mut subdirs: HashMap<&str, u32> = HashMap::new();
    for (path, node) in root.entries() {
        if node.is_dir() {
            let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
            *subdirs.entry(parent).or_default() += 1;
        }
    }
    let mut inos: HashMap<InodeId, u32> = HashMap::new();
    let mut next_ino: u32 = 1;
    let mut out = NewcWriter::new(out);
    for (path, id, node) in root.entries_with_ids() {
        let (ino, first) = match inos.get(&id) {
            Some(&ino) => (ino, false),
            None => {
                let ino = next_ino;
                next_ino = next_ino
                    .checked_add(1)
                    .ok_or_else(|| ImageError::CpioTooLarge {
                        path: path.to_owned(),
                        size: u64::from(u32::MAX),
                    })?;
                inos.insert(id, ino);
                (ino, true)
            }
        };
        let nlink = match node.kind {
            NodeKind::Dir => 2 + subdirs.get(path).copied().unwrap_or(0),
            _ => root.links_of(id),
        };
        let (rdev_major, rdev_minor) = match node.kind {
            NodeKind::CharDevice { major, minor } | NodeKind::BlockDevice { major, minor } => {
                (major, minor)
            }
            _ => (0, 0),
        };
        let body: &[u8] = match &node.kind {
            NodeKind::File { data } if first => data,
            NodeKind::Symlink { target } => target.as_bytes(),
            _ => &[],
        };
        let entry = NewcEntry {
            path,
            ino,
            mode: node.st_mode(),
            uid: node.uid,
            gid: node.gid,
            nlink,
            rdev_major,
            rdev_minor,
        };
        out.append(&entry, body.len() as u64, &mut &body[..])?;
    }
    out.finish()
}

/// The header of one member of a newc archive written by [`NewcWriter`]; the fields the
/// writer does not take are fixed (mtime 0, `dev` 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewcEntry<'a> {
    /// Path inside the archive, without a leading `/` (`etc/passwd`).
    pub path: &'a str,
    pub ino: u32,
    /// `st_mode`: file-type bits | permission bits (see [`crate::Node::st_mode`]).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev_major: u32,
    pub rdev_minor: u32,
}

impl<'a> NewcEntry<'a> {
    /// A directory (nlink 2) owned by root with permission bits `perm`.
    pub fn dir(path: &'a str, ino: u32, perm: u32) -> Self {
        Self::new(path, ino, 0o040000 | (perm & 0o7777), 2)
    }

    /// A regular file (nlink 1) owned by root with permission bits `perm`.
    pub fn file(path: &'a str, ino: u32, perm: u32) -> Self {
        Self::new(path, ino, 0o100000 | (perm & 0o7777), 1)
    }

    fn new(path: &'a str, ino: u32, mode: u32, nlink: u32) -> Self {
        NewcEntry {
            path,
            ino,
            mode,
            uid: 0,
            gid: 0,
            nlink,
            rdev_major: 0,
            rdev_minor: 0,
        }
    }
}

/// Writes a newc archive member by member, streaming each body from a reader (a host file of
/// any size up to the format's 4 GiB - 1): the one newc writer of the workspace, under
/// [`write_cpio`] too. The caller chooses order and inode numbers; [`NewcWriter::finish`]
/// appends the `TRAILER!!!`.
pub struct NewcWriter<W: Write> {
    out: W,
}

impl<W: Write> NewcWriter<W> {
    pub fn new(out: W) -> Self {
        NewcWriter { out }
    }

    /// Appends `entry` with a body of exactly `size` bytes read from `body`. A body that fails
    /// to read or ends early is [`ImageError::CpioBody`]; one that has more is cut at `size`.
    pub fn append(
        &mut self,
        entry: &NewcEntry<'_>,
        size: u64,
        body: &mut dyn Read,
    ) -> Result<(), ImageError> {
        let size32 = u32::try_from(size).map_err(|_| ImageError::CpioTooLarge {
            path: entry.path.to_owned(),
            size,
        })?;
        let mut w = cpio::NewcBuilder::new(entry.path)
            .ino(entry.ino)
            .mode(entry.mode)
            .uid(entry.uid)
            .gid(entry.gid)
            .nlink(entry.nlink)
            .mtime(0)
            .rdev_major(entry.rdev_major)
            .rdev_minor(entry.rdev_minor)
            .write(&mut self.out, size32);
        let mut buf = vec![0u8; (64 << 10).min(size as usize)];
        let mut left = size;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = match body.read(&mut buf[..want]) {
                Ok(0) => {
                    return Err(ImageError::CpioBody {
                        path: entry.path.to_owned(),
                        source: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the data ended {left} bytes short of {size}"),
                        ),
                    })
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ImageError::CpioBody {
                        path: entry.path.to_owned(),
                        source,
                    })
                }
            };
            w.write_all(&buf[..n]).map_err(ImageError::Write)?;
            left -= n as u64;
        }
        w.finish().map_err(ImageError::Write)?;
        Ok(())
    }

    /// Appends the trailer and returns the writer.
    pub fn finish(mut self) -> Result<W, ImageError> {
        cpio::newc::trailer(&mut self.out).map_err(ImageError::Write)?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back a newc stream: (name, ino, mode, nlink, data) per member, until the trailer.
    fn members(mut r: &[u8]) -> Vec<(String, u32, u32, u32, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut reader = cpio::NewcReader::new(r).unwrap();
            let e = reader.entry();
            if e.is_trailer() {
                break;
            }
            let head = (e.name().to_string(), e.ino(), e.mode(), e.nlink());
            let mut data = Vec::new();
            reader.read_to_end(&mut data).unwrap();
            out.push((head.0, head.1, head.2, head.3, data));
            r = reader.finish().unwrap();
        }
        out
    }

    #[test]
    fn streamed_members_parse_back() {
        let mut w = NewcWriter::new(Vec::new());
        w.append(&NewcEntry::dir("d", 1, 0o755), 0, &mut io::empty())
            .unwrap();
        let body = vec![7u8; 100_000];
        w.append(&NewcEntry::file("d/f", 2, 0o640), 100_000, &mut &body[..])
            .unwrap();
        // A longer body is cut at the declared size.
        w.append(&NewcEntry::file("g", 3, 0o4755), 3, &mut &b"abcdef"[..])
            .unwrap();
        let got = members(&w.finish().unwrap());
        assert_eq!(
            got,
            [
                ("d".into(), 1, 0o040755, 2, vec![]),
                ("d/f".into(), 2, 0o100640, 1, body),
                ("g".into(), 3, 0o104755, 1, b"abc".to_vec()),
            ]
        );
    }

    #[test]
    fn short_or_failing_bodies_and_huge_sizes_are_named() {
        let mut w = NewcWriter::new(Vec::new());
        let err = w
            .append(&NewcEntry::file("short", 1, 0o644), 10, &mut &b"abc"[..])
            .unwrap_err();
        assert!(
            matches!(&err, ImageError::CpioBody { path, source }
                if path == "short" && source.kind() == io::ErrorKind::UnexpectedEof),
            "{err:?}"
        );
        struct Failing;
        impl Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let err = NewcWriter::new(Vec::new())
            .append(&NewcEntry::file("bad", 1, 0o644), 1, &mut Failing)
            .unwrap_err();
        assert!(matches!(err, ImageError::CpioBody { .. }), "{err:?}");
        assert!(err.to_string().contains("\"bad\""), "{err}");
        let err = NewcWriter::new(Vec::new())
            .append(&NewcEntry::file("big", 1, 0o644), 1 << 32, &mut io::empty())
            .unwrap_err();
        assert!(matches!(err, ImageError::CpioTooLarge { .. }), "{err:?}");
    }
}
