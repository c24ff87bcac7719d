//! Serialising a [`RootFs`] as a reproducible newc cpio archive (gzip-compressed for the guest).

use std::collections::HashMap;
use std::io::Write;

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
pub fn write_cpio<W: Write>(root: &RootFs, mut out: W) -> Result<W, ImageError> {
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
        let size = u32::try_from(body.len()).map_err(|_| ImageError::CpioTooLarge {
            path: path.to_owned(),
            size: body.len() as u64,
        })?;
        let mut w = cpio::NewcBuilder::new(path)
            .ino(ino)
            .mode(node.st_mode())
            .uid(node.uid)
            .gid(node.gid)
            .nlink(nlink)
            .mtime(0)
            .rdev_major(rdev_major)
            .rdev_minor(rdev_minor)
            .write(&mut out, size);
        w.write_all(body).map_err(ImageError::Write)?;
        w.finish().map_err(ImageError::Write)?;
    }
    cpio::newc::trailer(&mut out).map_err(ImageError::Write)?;
    Ok(out)
}
