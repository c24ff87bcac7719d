//! Applying layer changesets, in order, to an in-memory tree.

use std::io::{self, Read};

use crate::digest::Hasher;
use crate::rootfs::{check_link_target, normalize_entry, Ctx, Node, NodeKind, RootFs};
use crate::{Compression, ImageError, LayerBlob};

/// Prefix of whiteout file names.
const WHITEOUT_PREFIX: &str = ".wh.";
/// Name of the opaque-directory marker.
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// What to do with character and block device nodes found in layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DevicePolicy {
    /// Keep them (type, major, minor, mode, owner) in the tree and the initramfs. The default:
    /// the tree is never materialised on the host, and in the guest the nodes only reach the
    /// guest's own (virtual) devices, which the image's root user could `mknod` anyway.
    #[default]
    Keep,
    /// Leave them out silently.
    Skip,
    /// Fail with [`ImageError::DeviceNodeRejected`].
    Reject,
}

/// Limits and policies of [`flatten_with`].
#[derive(Clone, Debug)]
pub struct FlattenOptions {
    /// Largest regular file, default 2 GiB (newc caps files at 4 GiB - 1 anyway).
    pub max_file_size: u64,
    /// Most regular-file bytes extracted over all layers (including files later deleted or
    /// replaced), default 8 GiB: the tree lives in memory.
    pub max_total_size: u64,
    /// Most bytes of one layer's uncompressed tar stream (decompression bombs, huge skipped
    /// entries), default 16 GiB. This also bounds the GNU long-name and PAX records, which the
    /// `tar` crate buffers whole before handing over the entry they describe.
    pub max_layer_size: u64,
    /// Most tar entries over all layers, default 2,000,000.
    pub max_entries: u64,
    pub devices: DevicePolicy,
}

impl Default for FlattenOptions {
    fn default() -> Self {
        FlattenOptions {
            max_file_size: 2 << 30,
            max_total_size: 8 << 30,
            max_layer_size: 16 << 30,
            max_entries: 2_000_000,
            devices: DevicePolicy::Keep,
        }
    }
}

/// Applies `layers` in order (lowest first) with [`FlattenOptions::default`].
///
/// See [`flatten_with`].
pub fn flatten(layers: &[LayerBlob]) -> Result<RootFs, ImageError> {
    flatten_with(layers, &FlattenOptions::default())
}

/// Applies `layers` in order (lowest first) to an empty [`RootFs`].
///
/// Each layer is decompressed (gzip, zstd or none, by magic number, else by media type), read
/// whole as a tar stream, and then applied as an OCI changeset: first its whiteouts against
/// the layers below (`.wh..wh..opq` empties its directory, `.wh.NAME` deletes `NAME` and
/// everything below it; whiteouts never hide entries of their own layer, whatever the order),
/// then its entries in archive order (a directory over a directory only updates attributes,
/// anything else replaces what was there). Regular files, directories, symlinks, hardlinks,
/// character/block devices (see [`DevicePolicy`]) and FIFOs are kept with their permission
/// bits (including setuid/setgid/sticky) and uid/gid; mtimes, uname/gname and xattrs are
/// dropped. When the layer carries a `diff_id`, the uncompressed stream is checked against it.
///
/// Path handling is described in the [`crate::rootfs`] docs; nothing is written to the host.
pub fn flatten_with(layers: &[LayerBlob], opts: &FlattenOptions) -> Result<RootFs, ImageError> {
    flatten_each(layers, opts, &mut |_| {})
}

/// [`flatten_with`], calling `applied` with each layer's index (0-based)
/// once it is applied: for a caller that shows how far it has come.
pub fn flatten_each(
    layers: &[LayerBlob],
    opts: &FlattenOptions,
    applied: &mut dyn FnMut(usize),
) -> Result<RootFs, ImageError> {
    let mut fs = RootFs::new();
    let mut budget = Budget {
        total: 0,
        entries: 0,
    };
    for (index, layer) in layers.iter().enumerate() {
        let staged = read_layer(layer, opts, &mut budget)?;
        apply_layer(&mut fs, &layer.digest, staged)?;
        applied(index);
    }
    Ok(fs)
}

/// Running totals across layers.
struct Budget {
    total: u64,
    entries: u64,
}

/// One tar entry, read and checked but not yet applied.
struct Staged {
    name: String,
    comps: Vec<String>,
    what: StagedKind,
}

enum StagedKind {
    Node(Node),
    Hardlink(String),
    Whiteout,
    Opaque,
}

/// Counts (and hashes) the uncompressed stream, failing past the limit.
struct Metered<R> {
    inner: R,
    read: u64,
    limit: u64,
    exceeded: bool,
    hasher: Option<Hasher>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("layer stream exceeds its size limit"));
        }
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

fn decompressor<'a>(layer: &'a LayerBlob) -> Result<Box<dyn Read + 'a>, ImageError> {
    let data = &layer.data[..];
    let compression = if data.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    };
    Ok(match compression {
        Compression::None => Box::new(data),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(data).map_err(
            |source| ImageError::LayerRead {
                layer: layer.digest.clone(),
                source,
            },
        )?),
    })
}

fn read_layer(
    layer: &LayerBlob,
    opts: &FlattenOptions,
    budget: &mut Budget,
) -> Result<Vec<Staged>, ImageError> {
    let lname = layer.digest.as_str();
    let hasher = layer
        .diff_id
        .as_deref()
        .map(Hasher::for_digest)
        .transpose()?;
    let mut stream = Metered {
        inner: decompressor(layer)?,
        read: 0,
        limit: opts.max_layer_size,
        exceeded: false,
        hasher,
    };
    let mut staged = Vec::new();
    let result = read_entries(&mut stream, lname, opts, budget, &mut staged).and_then(|()| {
        // Drain whatever follows the end-of-archive blocks so the diff_id covers it all.
        io::copy(&mut stream, &mut io::sink())
            .map(drop)
            .map_err(|source| ImageError::LayerRead {
                layer: lname.to_owned(),
                source,
            })
    });
    if stream.exceeded {
        return Err(ImageError::TooLarge {
            subject: format!("layer {lname}"),
            what: "uncompressed layer stream (bytes)",
            size: stream.read,
            limit: opts.max_layer_size,
        });
    }
    result?;
    if let (Some(expected), Some(h)) = (&layer.diff_id, stream.hasher.take()) {
        let actual = h.finish();
        if &actual != expected {
            return Err(ImageError::DiffIdMismatch {
                layer: lname.to_owned(),
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(staged)
}

fn read_entries<R: Read>(
    stream: &mut R,
    lname: &str,
    opts: &FlattenOptions,
    budget: &mut Budget,
    staged: &mut Vec<Staged>,
) -> Result<(), ImageError> {
    let tar_err = |source: io::Error| ImageError::LayerRead {
        layer: lname.to_owned(),
        source,
    };
    let mut archive = tar::Archive::new(stream);
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let raw = entry.path_bytes().into_owned();
        let name = match String::from_utf8(raw) {
            Ok(n) => n,
            Err(e) => {
                return Err(ImageError::InvalidEntry {
                    layer: lname.to_owned(),
                    entry: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    reason: "the path is not UTF-8 (newc names must be)".to_owned(),
                })
            }
        };
        let ctx = Ctx {
            layer: lname,
            entry: &name,
        };
        let etype = entry.header().entry_type();
        if etype.is_pax_global_extensions() {
            continue;
        }
        budget.entries += 1;
        if budget.entries > opts.max_entries {
            return Err(ImageError::TooLarge {
                subject: format!("layer {lname}"),
                what: "number of tar entries (all layers)",
                size: budget.entries,
                limit: opts.max_entries,
            });
        }
        let comps = normalize_entry(&name, ctx)?;

        // Whiteouts, whatever their entry type.
        if let Some(base) = comps.last() {
            if base == OPAQUE_MARKER {
                let mut comps = comps;
                comps.pop();
                staged.push(Staged {
                    name,
                    comps,
                    what: StagedKind::Opaque,
                });
                continue;
            }
            if let Some(target) = base.strip_prefix(WHITEOUT_PREFIX) {
                if target.starts_with(WHITEOUT_PREFIX) {
                    // Other `.wh..wh.*` names are reserved (AUFS metadata): ignore them.
                    continue;
                }
                if target.is_empty() || target == "." || target == ".." {
                    return Err(ctx.invalid("whiteout without a valid name to delete"));
                }
                let target = target.to_owned();
                let mut comps = comps;
                *comps.last_mut().expect("non-empty") = target;
                staged.push(Staged {
                    name,
                    comps,
                    what: StagedKind::Whiteout,
                });
                continue;
            }
        }

        let header = entry.header();
        let mode = header.mode().map_err(tar_err)? & 0o7777;
        let id = |v: io::Result<u64>, what: &str| -> Result<u32, ImageError> {
            let v = v.map_err(tar_err)?;
            u32::try_from(v).map_err(|_| ctx.invalid(format!("{what} {v} does not fit in 32 bits")))
        };
        let uid = id(header.uid(), "uid")?;
        let gid = id(header.gid(), "gid")?;
        let link_name = || -> Result<String, ImageError> {
            let raw = entry
                .link_name_bytes()
                .ok_or_else(|| ctx.invalid("link without a target"))?;
            let target = String::from_utf8(raw.into_owned())
                .map_err(|_| ctx.invalid("the link target is not UTF-8"))?;
            check_link_target(&target, ctx)?;
            Ok(target)
        };
        let device = |what: &str| -> Result<(u32, u32), ImageError> {
            let major = header.device_major().map_err(tar_err)?;
            let minor = header.device_minor().map_err(tar_err)?;
            match (major, minor) {
                (Some(major), Some(minor)) => Ok((major, minor)),
                _ => Err(ctx.invalid(format!("{what} without device numbers"))),
            }
        };

        use tar::EntryType as E;
        let kind = match etype {
            E::Regular | E::Continuous | E::GNUSparse => {
                let size = entry.size();
                if size > opts.max_file_size {
                    return Err(ImageError::TooLarge {
                        subject: format!("layer {lname}, entry {name:?}"),
                        what: "file size (bytes)",
                        size,
                        limit: opts.max_file_size,
                    });
                }
                budget.total = budget.total.saturating_add(size);
                if budget.total > opts.max_total_size {
                    return Err(ImageError::TooLarge {
                        subject: format!("layer {lname}, entry {name:?}"),
                        what: "file content extracted so far (bytes)",
                        size: budget.total,
                        limit: opts.max_total_size,
                    });
                }
                let mut data = Vec::with_capacity(size.min(64 << 20) as usize);
                (&mut entry)
                    .take(size)
                    .read_to_end(&mut data)
                    .map_err(tar_err)?;
                if data.len() as u64 != size {
                    return Err(tar_err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("entry {name:?} is truncated"),
                    )));
                }
                NodeKind::File { data }
            }
            E::Directory => NodeKind::Dir,
            E::Symlink => NodeKind::Symlink {
                target: link_name()?,
            },
            E::Link => {
                let target = link_name()?;
                staged.push(Staged {
                    name,
                    comps,
                    what: StagedKind::Hardlink(target),
                });
                continue;
            }
            E::Char | E::Block => {
                match opts.devices {
                    DevicePolicy::Keep => {}
                    DevicePolicy::Skip => continue,
                    DevicePolicy::Reject => {
                        return Err(ImageError::DeviceNodeRejected {
                            layer: lname.to_owned(),
                            entry: name,
                        })
                    }
                }
                let (major, minor) = device("device node")?;
                if etype == E::Char {
                    NodeKind::CharDevice { major, minor }
                } else {
                    NodeKind::BlockDevice { major, minor }
                }
            }
            E::Fifo => NodeKind::Fifo,
            other => {
                return Err(ImageError::UnsupportedEntryType {
                    layer: lname.to_owned(),
                    entry: name,
                    kind: format!("{other:?} ({:?})", char::from(other.as_byte())),
                })
            }
        };
        staged.push(Staged {
            name,
            comps,
            what: StagedKind::Node(Node {
                kind,
                mode,
                uid,
                gid,
            }),
        });
    }
    Ok(())
}

fn apply_layer(fs: &mut RootFs, lname: &str, staged: Vec<Staged>) -> Result<(), ImageError> {
    // Whiteouts first, against the lower layers only (opaque markers before single ones,
    // though the result is the same either way).
    for pass_opaque in [true, false] {
        for s in &staged {
            let ctx = Ctx {
                layer: lname,
                entry: &s.name,
            };
            match (&s.what, pass_opaque) {
                (StagedKind::Opaque, true) => {
                    if let Some(dir) = fs.lookup_dir(&s.comps, ctx)? {
                        fs.remove_children(&dir);
                    }
                }
                (StagedKind::Whiteout, false) => {
                    let (name, parent) = s.comps.split_last().expect("whiteouts name something");
                    if let Some(dir) = fs.lookup_dir(parent, ctx)? {
                        let path = if dir.is_empty() {
                            name.clone()
                        } else {
                            format!("{dir}/{name}")
                        };
                        fs.remove_subtree(&path);
                    }
                }
                _ => {}
            }
        }
    }
    for s in staged {
        let ctx = Ctx {
            layer: lname,
            entry: &s.name,
        };
        match s.what {
            StagedKind::Node(node) => {
                let path = fs.entry_path(&s.comps, ctx)?;
                if path.is_empty() && !node.is_dir() {
                    return Err(ctx.invalid("the image root can only be a directory"));
                }
                fs.put(path, node, ctx)?;
            }
            StagedKind::Hardlink(target) => {
                let id = fs.hardlink_target(&target, ctx)?;
                let path = fs.entry_path(&s.comps, ctx)?;
                fs.put_link(path, id, ctx)?;
            }
            StagedKind::Whiteout | StagedKind::Opaque => {}
        }
    }
    Ok(())
}
