//! detvisor's on-disk snapshot format.
//!
//! A snapshot is a captured moment of a running guest: a state payload (vCPU registers,
//! devices, clock, ...: any `serde` type the caller chooses) plus guest RAM (one contiguous
//! region of `ram_bytes`). Snapshots live in a root directory (e.g. `./snaps`), one
//! subdirectory each, named by the snapshot id. This crate knows nothing about the VMM: it is
//! generic over the state type. It also reads the texts that name a snapshot or a moment in a
//! root (`DIR/<id>`, `DIR@12.5s`, `DIR@exit:N`, `DIR@latest`) and finds the snapshot to
//! restore and what to replay forward to.
//!
//! # Directory layout
//!
//! ```text
//! <root>/<id>/state.bin    header + JSON {"meta": SnapshotMeta, "state": S}
//! <root>/<id>/memory.img   sparse raw RAM image, exactly ram_bytes long (holes = zero pages)
//! <root>/<id>/memory.idx   header + page index: which pages are stored, and their CRC
//! <root>/.tmp-<id>-<pid>/  a snapshot being written (or left by a crash): ignored by `list`
//! <root>/.del-<id>-<pid>/  a snapshot being removed: ignored by `list`
//! ```
//!
//! # File format
//!
//! This build writes format version 6 ([`FORMAT_VERSION`], which says what each
//! version changed), reads versions 5 and 6 ([`OLDEST_READ_VERSION`]), and refuses
//! files of any other version.
//!
//! `state.bin` and `memory.idx` share one framing, all integers little-endian:
//!
//! | offset | size | field                                                     |
//! |-------:|-----:|-----------------------------------------------------------|
//! | 0      | 8    | magic: `b"DVSNAP\0\0"` (state.bin), `b"DVPAGES\0"` (memory.idx) |
//! | 8      | 4    | format version, u32 ([`FORMAT_VERSION`])                  |
//! | 12     | 4    | flags, u32: bit 0 = [`FLAG_INCREMENTAL`]; other bits must be 0 |
//! | 16     | 8    | payload length, u64                                       |
//! | 24     | 8    | CRC-64/XZ of the payload, u64                             |
//! | 32     | len  | payload                                                   |
//!
//! The checksum is CRC-64/XZ (also called CRC-64/GO-ECMA): the ECMA-182 polynomial
//! `0x42F0E1EBA9EA3693`, reflected, init and xorout `0xFFFF_FFFF_FFFF_FFFF`, as used by xz; the
//! check value of `b"123456789"` is `0x995DC9BBDF1939FA`. See [`checksum`].
//!
//! The `state.bin` payload is the JSON (serde_json) object `{"meta": ..., "state": ...}`; both
//! it and [`SnapshotMeta`] reject unknown fields. The `memory.idx` payload is u64 words: page
//! size (4096), ram_bytes, CRC-64/XZ over the bytes of every listed page in order, the number of
//! runs, then `(first_page, page_count)` per run, sorted and disjoint. For a full snapshot the
//! runs are exactly the non-zero pages; for an incremental one they are the dirty pages (zero or
//! not), and every other page comes from the parent: `meta.parent` in the same root, or, when
//! `meta.parent_link` is present ([`ParentLink`]), the snapshot at that path relative to the
//! root, checked against the checksums the link recorded (a branch's first snapshot, over the
//! moment it was restored from in another directory). The link is left out of the JSON when
//! absent, so snapshots without one are written exactly as before it existed.
//!
//! `memory.img` is always exactly `ram_bytes` long; only the non-zero pages of its runs are
//! written, the rest are file-system holes (created with `set_len` and positioned writes).
//!
//! # Guarantees
//!
//! * Atomic: everything is written into `<root>/.tmp-<id>-<pid>/`, each file fsynced, the
//!   directory fsynced, then renamed to `<root>/<id>` and the root fsynced. A crash leaves
//!   either no snapshot or a complete one, plus perhaps a `.tmp-` directory that `list`
//!   ignores and the next write of the same id removes.
//! * Checked: reading verifies magic, version, flags, length, checksum, JSON, the types, the
//!   page index, the memory image's length, and an incremental snapshot's chain of parents.
//!   The contents of RAM pages are verified only on request ([`verify_memory`]), because a
//!   restore maps them lazily and must not read them all.
//! * Immutable: a snapshot is never rewritten; writing an existing id fails.

mod error;
mod frame;
pub use frame::MAX_FRAMED_BYTES;
mod memory;
mod parent_link;
mod spec;

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use devices::{ClockKind, VirtNanos};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

pub use error::{Result, SnapshotError};
pub use memory::{data_ranges, MappedMemory, PageRun};
pub use parent_link::ParentLink;
pub use spec::{by_id, resolve_dir, select, Resolved, Target};

use error::io;
use frame::{check_flags, read_framed, write_framed, CRC64, HEADER_LEN};
use memory::{map_layers, MapLayer, PageIndex};

/// The format version this build writes. 6: the metadata names the clock
/// backend that made the history (`clock`, absent for the exit clock, so a
/// version 5 file, which has none, reads as the exit clock's, which it is).
/// 5: a branch re-keys
/// the guest kernel's CRNG in guest memory at the branch exit (the session
/// state holds where: `guest_crng`); every branch's history changed with
/// it, so older snapshots are refused. 4: the machine may
/// have the clock page (`exit_path` in the session state; every digest
/// changed with it, so older snapshots are refused). 3: an `up` run's host
/// side keeps no network faults of its own (the switch's state holds them)
/// and saves faults as their text. 2: detvisor's state payload became
/// `{"session": ..., "up": ...}` (an `up` run's host side beside the
/// machine); version 1 files hold the machine's state alone.
pub const FORMAT_VERSION: u32 = 6;
/// The oldest format version this build reads (see [`FORMAT_VERSION`]).
pub const OLDEST_READ_VERSION: u32 = 5;
/// Guest page size: the granularity of sparseness and of incremental snapshots.
pub const PAGE_SIZE: u64 = 4096;
/// Magic of `state.bin`.
pub const STATE_MAGIC: &[u8; 8] = b"DVSNAP\0\0";
/// Magic of `memory.idx`.
pub const INDEX_MAGIC: &[u8; 8] = b"DVPAGES\0";
/// Header flag: the memory holds only the dirty pages; the rest come from `meta.parent`.
pub const FLAG_INCREMENTAL: u32 = 1;
/// File names inside a snapshot directory.
pub const STATE_FILE: &str = "state.bin";
/// See [`STATE_FILE`].
pub const MEMORY_FILE: &str = "memory.img";
/// See [`STATE_FILE`].
pub const INDEX_FILE: &str = "memory.idx";

const KNOWN_FLAGS: u32 = FLAG_INCREMENTAL;
/// How deep an incremental chain may be.
const MAX_CHAIN: usize = 10_000;
/// How many MAP_FIXED overlay mappings `map_memory_private` makes before it copies instead
/// (the default `vm.max_map_count` is 65530 for the whole process).
const MAX_OVERLAY_MAPS: usize = 8192;

/// What a snapshot is: recorded in `state.bin` beside the caller's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotMeta {
    /// The snapshot's name, also its directory's name: 1..=128 of `[A-Za-z0-9._-]`, not
    /// starting with `.` (see [`validate_id`]).
    pub id: String,
    /// The snapshot this one continues from (the one the run was restored from, if any).
    /// Required for, and the memory base of, an incremental snapshot; lineage only otherwise.
    /// In this snapshot's root, unless `parent_link` says where else.
    pub parent: Option<String>,
    /// Where the parent of an incremental snapshot lives when it is in another root, and
    /// the checksums it had when this one was written over it (a branch's first snapshot,
    /// over the moment the branch was restored from). Absent from the JSON when `None`, so
    /// snapshots over a parent in their own root read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_link: Option<ParentLink>,
    /// Guest virtual time at the capture, in nanoseconds.
    pub virtual_ns: VirtNanos,
    /// Index of the VM exit at which the capture happened.
    pub exit_index: u64,
    /// Size of guest RAM; a positive multiple of [`PAGE_SIZE`].
    pub ram_bytes: u64,
    /// The run's seed.
    pub seed: u64,
    /// The clock backend that moved the history's virtual time (absent:
    /// the exit clock's).
    #[serde(default, skip_serializing_if = "ClockKind::is_exit")]
    pub clock: ClockKind,
    /// Always [`FORMAT_VERSION`] once written (writing overrides whatever the caller put).
    pub format_version: u32,
}

impl SnapshotMeta {
    /// A meta with no parent and the current format version.
    pub fn new(
        id: impl Into<String>,
        virtual_ns: VirtNanos,
        exit_index: u64,
        ram_bytes: u64,
        seed: u64,
    ) -> Self {
        SnapshotMeta {
            id: id.into(),
            parent: None,
            parent_link: None,
            virtual_ns,
            exit_index,
            ram_bytes,
            seed,
            clock: ClockKind::Exit,
            format_version: FORMAT_VERSION,
        }
    }
}

/// A snapshot found on disk, checked (except the RAM page contents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub meta: SnapshotMeta,
    /// `<root>/<id>`.
    pub dir: PathBuf,
    /// Whether `memory.img` holds only dirty pages over `meta.parent`.
    pub incremental: bool,
    /// Size of `state.bin` in bytes.
    pub state_bytes: u64,
    /// Pages listed in `memory.idx`: the non-zero pages (full) or the dirty pages (incremental).
    pub memory_pages_stored: u64,
    /// Disk space actually allocated to the snapshot's files (st_blocks * 512).
    pub disk_bytes: u64,
}

#[derive(Serialize)]
struct EnvelopeOut<'a, S: ?Sized> {
    meta: &'a SnapshotMeta,
    state: &'a S,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeIn<S> {
    meta: SnapshotMeta,
    state: S,
}

/// Checks that `id` can name a snapshot directory: 1..=128 characters of `[A-Za-z0-9._-]`,
/// not starting with `.` (so never `.`, `..`, or a `.tmp-`/`.del-` work directory).
pub fn validate_id(id: &str) -> Result<()> {
    let reason = if id.is_empty() {
        Some("empty")
    } else if id.len() > 128 {
        Some("longer than 128 characters")
    } else if id.starts_with('.') {
        Some("starts with '.'")
    } else if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        Some("only A-Z a-z 0-9 . _ - are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SnapshotError::InvalidId {
            id: id.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// CRC-64/XZ of `bytes`: the checksum used in headers and in `memory.idx`.
pub fn checksum(bytes: &[u8]) -> u64 {
    CRC64.checksum(bytes)
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Writes a full snapshot to `<root>/<meta.id>/` atomically (see the crate docs) and returns
/// what was written. `memory` is all of guest RAM (`memory.len() == meta.ram_bytes`); only its
/// non-zero pages take disk space. `meta.format_version` is set to [`FORMAT_VERSION`]. Fails
/// with `AlreadyExists` if that id exists.
pub fn write_snapshot<S: Serialize + ?Sized>(
    root: &Path,
    meta: &SnapshotMeta,
    state: &S,
    memory: &[u8],
) -> Result<SnapshotInfo> {
    write_impl(root, meta, state, memory, None)
}

/// Writes an incremental snapshot: like [`write_snapshot`], but stores only the pages listed in
/// `dirty_pages` (page numbers = byte offset / 4096, any order, duplicates allowed) and takes
/// every other page from `meta.parent`, which must be a snapshot with the same `ram_bytes`, in
/// the same root or where `meta.parent_link` says (whose checksums must match). `memory` is
/// still all of guest RAM. A dirty page that is now zero is recorded (and stored as a hole), so
/// it correctly shadows a non-zero parent page.
///
/// Correctness rests on the caller: every page written since the parent's state must be in
/// `dirty_pages` (e.g. from KVM's dirty log, plus pages the VMM itself wrote).
pub fn write_incremental_snapshot<S: Serialize + ?Sized>(
    root: &Path,
    meta: &SnapshotMeta,
    state: &S,
    memory: &[u8],
    dirty_pages: &[u64],
) -> Result<SnapshotInfo> {
    write_impl(root, meta, state, memory, Some(dirty_pages))
}

/// Writes an incremental snapshot over the snapshot in `parent_dir`, in `root` or in any
/// other directory (a branch's first snapshot, over the moment it was restored from): as
/// [`write_incremental_snapshot`], with `meta.parent` set to that snapshot's id and, when it
/// is not in `root`, `meta.parent_link` to its path relative to `root` and the checksums of
/// its `state.bin` and `memory.idx`, which every read of the new snapshot checks.
pub fn write_incremental_snapshot_over<S: Serialize + ?Sized>(
    root: &Path,
    meta: &SnapshotMeta,
    state: &S,
    memory: &[u8],
    dirty_pages: &[u64],
    parent_dir: &Path,
) -> Result<SnapshotInfo> {
    std::fs::create_dir_all(root).map_err(io(root, "create directory"))?;
    let parent = load_layer(parent_dir)?;
    let mut meta = meta.clone();
    meta.parent = Some(parent.meta.id.clone());
    meta.parent_link =
        parent_link::link_from(root, parent_dir, parent.state_crc, parent.index_crc)?;
    write_impl(root, &meta, state, memory, Some(dirty_pages))
}

fn write_impl<S: Serialize + ?Sized>(
    root: &Path,
    meta: &SnapshotMeta,
    state: &S,
    memory: &[u8],
    dirty_pages: Option<&[u64]>,
) -> Result<SnapshotInfo> {
    validate_id(&meta.id)?;
    if let Some(p) = &meta.parent {
        validate_id(p)?;
    }
    match (&meta.parent_link, &meta.parent, dirty_pages) {
        (None, _, _) => {}
        (Some(link), Some(parent), Some(_)) => link
            .check_form(parent)
            .map_err(SnapshotError::InvalidArgument)?,
        (Some(_), _, _) => {
            return Err(SnapshotError::InvalidArgument(
                "meta.parent_link is for an incremental snapshot's parent".into(),
            ))
        }
    }
    if meta.ram_bytes == 0 || !meta.ram_bytes.is_multiple_of(PAGE_SIZE) {
        return Err(SnapshotError::InvalidArgument(format!(
            "ram_bytes {} is not a positive multiple of {PAGE_SIZE}",
            meta.ram_bytes
        )));
    }
    if memory.len() as u64 != meta.ram_bytes {
        return Err(SnapshotError::InvalidArgument(format!(
            "memory is {} bytes but meta.ram_bytes is {}",
            memory.len(),
            meta.ram_bytes
        )));
    }
    let mut meta = meta.clone();
    meta.format_version = FORMAT_VERSION;

    std::fs::create_dir_all(root).map_err(io(root, "create directory"))?;
    let final_dir = root.join(&meta.id);
    if final_dir.symlink_metadata().is_ok() {
        return Err(SnapshotError::AlreadyExists { path: final_dir });
    }

    let (flags, runs) = match dirty_pages {
        None => (0, memory::nonzero_runs(memory)),
        Some(dirty) => {
            let parent_dir = parent_link::parent_dir(root, &meta).ok_or_else(|| {
                SnapshotError::InvalidArgument("an incremental snapshot needs meta.parent".into())
            })?;
            let parent = load_layer(&parent_dir)?;
            check_parent(&meta, &parent_dir, &parent).map_err(SnapshotError::InvalidArgument)?;
            (
                FLAG_INCREMENTAL,
                memory::dirty_runs(dirty, meta.ram_bytes / PAGE_SIZE)?,
            )
        }
    };

    remove_work_dirs(root, &meta.id)?;
    let tmp = root.join(format!(".tmp-{}-{}", meta.id, std::process::id()));
    std::fs::create_dir(&tmp).map_err(io(&tmp, "create directory"))?;
    let written = (|| -> Result<()> {
        let mem_path = tmp.join(MEMORY_FILE);
        let data_crc = memory::write_image(&mem_path, memory, &runs)?;
        let index = PageIndex {
            ram_bytes: meta.ram_bytes,
            data_crc,
            runs,
        };
        write_framed(&tmp.join(INDEX_FILE), INDEX_MAGIC, flags, &index.encode())?;
        let state_path = tmp.join(STATE_FILE);
        let payload =
            serde_json::to_vec(&EnvelopeOut { meta: &meta, state }).map_err(|source| {
                SnapshotError::Serialize {
                    path: state_path.clone(),
                    source,
                }
            })?;
        write_framed(&state_path, STATE_MAGIC, flags, &payload)?;
        sync_dir(&tmp)?;
        match std::fs::rename(&tmp, &final_dir) {
            Ok(()) => Ok(()),
            Err(e) if final_dir.symlink_metadata().is_ok() => {
                drop(e);
                Err(SnapshotError::AlreadyExists {
                    path: final_dir.clone(),
                })
            }
            Err(e) => Err(io(&final_dir, "rename into place")(e)),
        }
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    sync_dir(root)?;
    info(&final_dir)
}

/// Removes leftovers of earlier writes or removals of `id`: `.tmp-<id>-<pid>` and
/// `.del-<id>-<pid>`.
fn remove_work_dirs(root: &Path, id: &str) -> Result<()> {
    let tmp = format!(".tmp-{id}-");
    let del = format!(".del-{id}-");
    for entry in std::fs::read_dir(root).map_err(io(root, "read directory"))? {
        let entry = entry.map_err(io(root, "read directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let rest = name.strip_prefix(&tmp).or_else(|| name.strip_prefix(&del));
        if rest.is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())) {
            match std::fs::remove_dir_all(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(entry.path(), "remove stale directory")(e))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync directory"))
}

// ---------------------------------------------------------------------------------------------
// Reading

/// One checked snapshot directory.
struct Layer {
    dir: PathBuf,
    meta: SnapshotMeta,
    incremental: bool,
    index: PageIndex,
    state_bytes: u64,
    /// The checksums in the headers of `state.bin` and `memory.idx` (a [`ParentLink`]'s).
    state_crc: u64,
    index_crc: u64,
}

/// What `load_head` read of `state.bin` besides the state: its flags, metadata, size and
/// checksum.
struct Head {
    flags: u32,
    meta: SnapshotMeta,
    bytes: u64,
    crc: u64,
}

/// Reads and checks `state.bin`: header, checksum, JSON, types.
fn load_head<S: DeserializeOwned>(dir: &Path) -> Result<(Head, S)> {
    if !dir.is_dir() {
        return Err(SnapshotError::MissingPart {
            path: dir.to_owned(),
            what: "snapshot directory",
        });
    }
    let path = dir.join(STATE_FILE);
    let (flags, payload, crc) = read_framed(&path, STATE_MAGIC, "state.bin (state and metadata)")?;
    check_flags(&path, flags, KNOWN_FLAGS)?;
    let env: EnvelopeIn<S> = serde_json::from_slice(&payload).map_err(|source| {
        use serde_json::error::Category;
        match source.classify() {
            Category::Data => SnapshotError::SchemaMismatch {
                path: path.clone(),
                source,
            },
            _ => SnapshotError::CorruptJson {
                path: path.clone(),
                source,
            },
        }
    })?;
    let head = Head {
        flags,
        meta: env.meta,
        bytes: (HEADER_LEN + payload.len()) as u64,
        crc,
    };
    Ok((head, env.state))
}

/// Checks the parts of a snapshot other than `state.bin` against its metadata.
fn check_layer(dir: &Path, head: Head) -> Result<Layer> {
    let Head {
        flags,
        meta,
        bytes: state_bytes,
        crc: state_crc,
    } = head;
    let state_path = dir.join(STATE_FILE);
    let inconsistent = |reason: String| SnapshotError::Inconsistent {
        path: state_path.clone(),
        reason,
    };
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&meta.format_version) {
        return Err(inconsistent(format!(
            "meta.format_version is {}, the header's is {OLDEST_READ_VERSION} to {FORMAT_VERSION}",
            meta.format_version
        )));
    }
    if meta.ram_bytes == 0 || !meta.ram_bytes.is_multiple_of(PAGE_SIZE) {
        return Err(inconsistent(format!(
            "ram_bytes {} is not a positive multiple of {PAGE_SIZE}",
            meta.ram_bytes
        )));
    }
    validate_id(&meta.id).map_err(|e| inconsistent(format!("meta.id: {e}")))?;
    if let Some(parent) = &meta.parent {
        validate_id(parent).map_err(|e| inconsistent(format!("meta.parent: {e}")))?;
        if *parent == meta.id && meta.parent_link.is_none() {
            return Err(inconsistent(format!(
                "snapshot {parent:?} is its own parent"
            )));
        }
    }
    let incremental = flags & FLAG_INCREMENTAL != 0;
    if incremental && meta.parent.is_none() {
        return Err(inconsistent("incremental snapshot without a parent".into()));
    }
    if let Some(link) = &meta.parent_link {
        match &meta.parent {
            Some(parent) if incremental => link.check_form(parent).map_err(inconsistent)?,
            _ => {
                return Err(inconsistent(
                    "a parent_link on a snapshot that is not incremental".into(),
                ))
            }
        }
    }
    let idx_path = dir.join(INDEX_FILE);
    let (iflags, payload, index_crc) =
        read_framed(&idx_path, INDEX_MAGIC, "memory.idx (page index)")?;
    check_flags(&idx_path, iflags, KNOWN_FLAGS)?;
    if iflags != flags {
        return Err(SnapshotError::Inconsistent {
            path: idx_path,
            reason: format!("flags {iflags:#x} differ from state.bin's {flags:#x}"),
        });
    }
    let index = PageIndex::decode(&idx_path, &payload)?;
    if index.ram_bytes != meta.ram_bytes {
        return Err(SnapshotError::Inconsistent {
            path: idx_path,
            reason: format!(
                "indexes {} bytes of RAM, state.bin says {}",
                index.ram_bytes, meta.ram_bytes
            ),
        });
    }
    let mem_path = dir.join(MEMORY_FILE);
    let len = match std::fs::metadata(&mem_path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SnapshotError::MissingPart {
                path: mem_path,
                what: "memory.img (guest RAM image)",
            })
        }
        Err(e) => return Err(io(&mem_path, "stat")(e)),
    };
    if len != meta.ram_bytes {
        return Err(SnapshotError::MemoryLength {
            path: mem_path,
            expected: meta.ram_bytes,
            actual: len,
        });
    }
    Ok(Layer {
        dir: dir.to_owned(),
        meta,
        incremental,
        index,
        state_bytes,
        state_crc,
        index_crc,
    })
}

fn load_layer(dir: &Path) -> Result<Layer> {
    let (head, IgnoredAny) = load_head::<IgnoredAny>(dir)?;
    check_layer(dir, head)
}

/// Whether `parent`, read from `parent_dir`, is the parent `child` names: its id, the same
/// `ram_bytes`, and for a parent in another root the checksums the link recorded. The reason
/// if not.
fn check_parent(
    child: &SnapshotMeta,
    parent_dir: &Path,
    parent: &Layer,
) -> std::result::Result<(), String> {
    let id = child.parent.as_deref().unwrap_or_default();
    if parent.meta.id != id {
        return Err(format!(
            "directory {} holds snapshot {:?}, not the parent {id:?}",
            parent_dir.display(),
            parent.meta.id
        ));
    }
    if parent.meta.ram_bytes != child.ram_bytes {
        return Err(format!(
            "parent {id:?} has ram_bytes {}, child {}",
            parent.meta.ram_bytes, child.ram_bytes
        ));
    }
    if let Some(link) = &child.parent_link {
        if (parent.state_crc, parent.index_crc) != (link.state_crc, link.index_crc) {
            return Err(format!(
                "parent snapshot {id:?} at {} is not the one this snapshot was written over \
                 (rewritten or replaced since?): its state.bin and memory.idx have CRC-64/XZ \
                 {:#018x} and {:#018x}, the link recorded {:#018x} and {:#018x}",
                parent_dir.display(),
                parent.state_crc,
                parent.index_crc,
                link.state_crc,
                link.index_crc
            ));
        }
    }
    Ok(())
}

/// Why the parent of `meta` (a snapshot held in `root`), expected in `parent_dir`, is missing.
fn missing_parent(meta: &SnapshotMeta, parent_dir: &Path) -> String {
    let id = meta.parent.as_deref().unwrap_or_default();
    match &meta.parent_link {
        Some(link) => format!(
            "parent snapshot {id:?} not found at {} (linked as {:?} from this snapshot's \
             directory of snapshots: moved or removed?)",
            parent_dir.display(),
            link.path
        ),
        None => format!(
            "parent snapshot {id:?} not found at {}",
            parent_dir.display()
        ),
    }
}

/// What tells two snapshot directories apart: the real path, else the path as given.
fn dir_key(dir: &Path) -> PathBuf {
    dir.canonicalize().unwrap_or_else(|_| dir.to_owned())
}

/// The directory holding `dir`'s sibling snapshots.
fn root_of(dir: &Path) -> Result<PathBuf> {
    if dir.file_name().is_some() {
        Ok(dir.parent().map(Path::to_owned).unwrap_or_default())
    } else {
        let abs = dir.canonicalize().map_err(io(dir, "canonicalize"))?;
        Ok(abs.parent().map(Path::to_owned).unwrap_or(abs))
    }
}

/// Follows `head`'s parents down to a full snapshot; returns the chain base first.
fn resolve_chain(head: Layer) -> Result<Vec<Layer>> {
    let mut seen = HashSet::from([dir_key(&head.dir)]);
    let mut chain = vec![head];
    loop {
        let last = chain.last().expect("non-empty");
        if !last.incremental {
            break;
        }
        let broken = |reason: String| SnapshotError::BrokenChain {
            path: last.dir.clone(),
            reason,
        };
        let parent = last.meta.parent.clone().expect("checked by check_layer");
        validate_id(&parent).map_err(|e| broken(e.to_string()))?;
        let pdir = parent_link::parent_dir(&root_of(&last.dir)?, &last.meta)
            .expect("checked by check_layer");
        if !pdir.is_dir() {
            return Err(broken(missing_parent(&last.meta, &pdir)));
        }
        if !seen.insert(dir_key(&pdir)) || chain.len() >= MAX_CHAIN {
            return Err(broken(format!(
                "cycle or chain longer than {MAX_CHAIN} at parent {parent:?}"
            )));
        }
        let layer = load_layer(&pdir)?;
        check_parent(&last.meta, &pdir, &layer).map_err(broken)?;
        chain.push(layer);
    }
    chain.reverse();
    Ok(chain)
}

/// Reads a snapshot's metadata and state, checking `state.bin` (magic, version, flags, length,
/// checksum, JSON, types), `memory.idx`, `memory.img`'s presence and length, and, for an
/// incremental snapshot, the same for every parent down to a full snapshot.
pub fn read_snapshot<S: DeserializeOwned>(dir: &Path) -> Result<(SnapshotMeta, S)> {
    let (head, state) = load_head::<S>(dir)?;
    let meta = head.meta.clone();
    resolve_chain(check_layer(dir, head)?)?;
    Ok((meta, state))
}

/// Reads only a snapshot's metadata (the state is checked as JSON but not decoded).
pub fn read_meta(dir: &Path) -> Result<SnapshotMeta> {
    Ok(load_layer(dir)?.meta)
}

fn info_of(layer: &Layer) -> Result<SnapshotInfo> {
    let mut disk_bytes = 0;
    for name in [STATE_FILE, MEMORY_FILE, INDEX_FILE] {
        let p = layer.dir.join(name);
        disk_bytes += std::fs::metadata(&p).map_err(io(&p, "stat"))?.blocks() * 512;
    }
    Ok(SnapshotInfo {
        meta: layer.meta.clone(),
        dir: layer.dir.clone(),
        incremental: layer.incremental,
        state_bytes: layer.state_bytes,
        memory_pages_stored: layer.index.pages(),
        disk_bytes,
    })
}

/// Checks one snapshot directory (not its parents) and describes it.
pub fn info(dir: &Path) -> Result<SnapshotInfo> {
    info_of(&load_layer(dir)?)
}

/// All snapshots under `root`, sorted by (virtual_ns, exit_index, id). Skips entries whose names
/// start with `.` (work directories of unfinished writes and removals) and plain files; every
/// other directory must be a valid snapshot whose id is its name, and every incremental
/// snapshot's parent must be present, or this fails naming the culprit.
pub fn list(root: &Path) -> Result<Vec<SnapshotInfo>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SnapshotError::NotFound {
                root: root.to_owned(),
                what: "no such snapshot directory".into(),
            })
        }
        Err(e) => return Err(io(root, "read directory")(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(root, "read directory"))?;
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") || !entry.path().is_dir() {
            continue;
        }
        let dir = entry.path();
        let info = info(&dir)?;
        if name.to_str() != Some(info.meta.id.as_str()) {
            return Err(SnapshotError::Inconsistent {
                path: dir.join(STATE_FILE),
                reason: format!(
                    "records id {:?} but its directory is named {:?}",
                    info.meta.id, name
                ),
            });
        }
        out.push(info);
    }
    let ids: HashSet<&str> = out.iter().map(|i| i.meta.id.as_str()).collect();
    for i in out.iter().filter(|i| i.incremental) {
        let Some(p) = &i.meta.parent else { continue };
        let missing = match &i.meta.parent_link {
            // In another root: only whether it is there (reading it is a restore's work).
            Some(link) => {
                let pdir = root.join(&link.path);
                (!pdir.is_dir()).then(|| missing_parent(&i.meta, &pdir))
            }
            None => (!ids.contains(p.as_str()))
                .then(|| format!("parent snapshot {p:?} not found in {}", root.display())),
        };
        if let Some(reason) = missing {
            return Err(SnapshotError::BrokenChain {
                path: i.dir.clone(),
                reason,
            });
        }
    }
    check_no_cycle(&out)?;
    out.sort_by(|a, b| {
        (a.meta.virtual_ns, a.meta.exit_index, &a.meta.id).cmp(&(
            b.meta.virtual_ns,
            b.meta.exit_index,
            &b.meta.id,
        ))
    });
    Ok(out)
}

/// Refuses parent links among `snapshots` that go round in a cycle.
fn check_no_cycle(snapshots: &[SnapshotInfo]) -> Result<()> {
    let parents: std::collections::HashMap<&str, &str> = snapshots
        .iter()
        .filter(|i| i.meta.parent_link.is_none())
        .filter_map(|i| Some((i.meta.id.as_str(), i.meta.parent.as_deref()?)))
        .collect();
    for info in snapshots {
        let mut seen = HashSet::new();
        let mut id = info.meta.id.as_str();
        while let Some(&parent) = parents.get(id) {
            if !seen.insert(id) {
                return Err(SnapshotError::BrokenChain {
                    path: info.dir.clone(),
                    reason: format!("its parents go round in a cycle through {id:?}"),
                });
            }
            id = parent;
        }
    }
    Ok(())
}

/// Removes snapshot `id` from `root` atomically (rename to `.del-<id>-<pid>`, then delete).
/// Refuses if an incremental snapshot in `root` has it as its parent.
pub fn remove_snapshot(root: &Path, id: &str) -> Result<()> {
    validate_id(id)?;
    let dir = root.join(id);
    if !dir.is_dir() {
        return Err(SnapshotError::NotFound {
            root: root.to_owned(),
            what: format!("no snapshot {id:?}"),
        });
    }
    let children: Vec<String> = list(root)?
        .into_iter()
        .filter(|i| {
            i.incremental && i.meta.parent_link.is_none() && i.meta.parent.as_deref() == Some(id)
        })
        .map(|i| i.meta.id)
        .collect();
    if !children.is_empty() {
        return Err(SnapshotError::HasDependents {
            path: dir,
            children,
        });
    }
    let del = root.join(format!(".del-{id}-{}", std::process::id()));
    std::fs::rename(&dir, &del).map_err(io(&dir, "rename for removal"))?;
    sync_dir(root)?;
    std::fs::remove_dir_all(&del).map_err(io(&del, "remove"))
}

// ---------------------------------------------------------------------------------------------
// Memory for restore

/// One snapshot's memory image within a chain (see [`memory_chain`]).
#[derive(Debug)]
pub struct MemoryLayer {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Its id.
    pub id: String,
    /// `memory.img`, opened read-only; exactly `ram_bytes` long.
    pub file: File,
    /// Whether this layer overrides only `runs` (true) or is the full base image (false).
    pub incremental: bool,
    /// The pages this layer stores: all non-zero pages (base) or the dirty pages (overlay).
    pub runs: Vec<PageRun>,
}

/// The memory images that make up `dir`'s guest RAM, base (a full snapshot) first, `dir` last.
/// Guest RAM = the base image, with each later layer's `runs` copied over it in order. A full
/// snapshot gives one layer.
pub fn memory_chain(dir: &Path) -> Result<Vec<MemoryLayer>> {
    resolve_chain(load_layer(dir)?)?
        .into_iter()
        .map(|l| {
            let path = l.dir.join(MEMORY_FILE);
            let file = hostfile::open_regular(&path).map_err(SnapshotError::Read)?;
            Ok(MemoryLayer {
                dir: l.dir,
                id: l.meta.id,
                file,
                incremental: l.incremental,
                runs: l.index.runs,
            })
        })
        .collect()
}

/// Opens a full snapshot's `memory.img` (read-only) for the caller to map `MAP_PRIVATE`
/// itself; returns it and its length (= ram_bytes). Fails with `Incremental` for an
/// incremental snapshot: use [`map_memory_private`] or [`memory_chain`] there.
pub fn memory_file(dir: &Path) -> Result<(File, u64)> {
    let layer = load_layer(dir)?;
    if layer.incremental {
        return Err(SnapshotError::Incremental {
            path: dir.join(MEMORY_FILE),
            parent: layer.meta.parent.unwrap_or_default(),
        });
    }
    let path = dir.join(MEMORY_FILE);
    let file = hostfile::open_regular(&path).map_err(SnapshotError::Read)?;
    Ok((file, layer.meta.ram_bytes))
}

/// Maps `dir`'s guest RAM privately (MAP_PRIVATE | MAP_NORESERVE, PROT_READ | PROT_WRITE):
/// pages are read lazily from the snapshot files on first touch and copied on write; the files
/// never change. For an incremental snapshot the base image is mapped whole and each layer's
/// dirty runs are mapped over it with MAP_FIXED (or, past 8192 overlay mappings, copied in).
pub fn map_memory_private(dir: &Path) -> Result<MappedMemory> {
    map_memory_private_with(dir, MAX_OVERLAY_MAPS)
}

fn map_memory_private_with(dir: &Path, max_overlay_maps: usize) -> Result<MappedMemory> {
    let chain = memory_chain(dir)?;
    let paths: Vec<PathBuf> = chain.iter().map(|l| l.dir.join(MEMORY_FILE)).collect();
    let layers: Vec<MapLayer<'_>> = chain
        .iter()
        .zip(&paths)
        .map(|(l, p)| MapLayer {
            path: p,
            file: &l.file,
            runs: &l.runs,
        })
        .collect();
    let len = chain[0]
        .file
        .metadata()
        .map_err(io(&paths[0], "stat"))?
        .len();
    map_layers(&layers[0], &layers[1..], len, max_overlay_maps)
}

/// The byte ranges `[start, end)` of `dir`'s guest RAM that may be non-zero, page-aligned and
/// merged, resolving incremental chains: found with SEEK_DATA/SEEK_HOLE without reading data.
/// Every byte outside them is zero. Use it to scan or prefault only what matters.
pub fn memory_data_ranges(dir: &Path) -> Result<Vec<(u64, u64)>> {
    let chain = memory_chain(dir)?;
    let len = chain[0]
        .file
        .metadata()
        .map_err(io(chain[0].dir.join(MEMORY_FILE), "stat"))?
        .len();
    let mut ranges = memory::page_align(&data_ranges(&chain[0].file), len);
    for layer in &chain[1..] {
        let dirty: Vec<(u64, u64)> = layer.runs.iter().map(PageRun::byte_range).collect();
        let data = memory::page_align(&data_ranges(&layer.file), len);
        ranges = memory::union(
            &memory::subtract(&ranges, &dirty),
            &memory::intersect(&data, &dirty),
        );
    }
    Ok(ranges)
}

/// Reads every stored page of `dir`'s memory (and its parents') and checks it against the
/// CRC-64/XZ in `memory.idx`; also checks that a full image holds no data outside its indexed
/// pages. Costs a read of all non-zero RAM: for `fsck`-style tools, not for every restore.
pub fn verify_memory(dir: &Path) -> Result<()> {
    for l in resolve_chain(load_layer(dir)?)? {
        let path = l.dir.join(MEMORY_FILE);
        let file = hostfile::open_regular(&path).map_err(SnapshotError::Read)?;
        let mut digest = CRC64.digest();
        let mut buf = vec![0u8; 1 << 20];
        let mut read = |start: u64, end: u64, f: &mut dyn FnMut(&[u8]) -> bool| -> Result<bool> {
            let mut off = start;
            while off < end {
                let n = ((end - off) as usize).min(buf.len());
                file.read_exact_at(&mut buf[..n], off)
                    .map_err(io(&path, "read"))?;
                if !f(&buf[..n]) {
                    return Ok(false);
                }
                off += n as u64;
            }
            Ok(true)
        };
        for run in &l.index.runs {
            let (s, e) = run.byte_range();
            read(s, e, &mut |b| {
                digest.update(b);
                true
            })?;
        }
        let actual = digest.finalize();
        if actual != l.index.data_crc {
            return Err(SnapshotError::MemoryChecksum {
                path,
                expected: l.index.data_crc,
                actual,
            });
        }
        if !l.incremental {
            let indexed: Vec<(u64, u64)> = l.index.runs.iter().map(PageRun::byte_range).collect();
            let stray = memory::subtract(
                &memory::page_align(&data_ranges(&file), l.meta.ram_bytes),
                &indexed,
            );
            for (s, e) in stray {
                if !read(s, e, &mut memory::is_zero)? {
                    return Err(SnapshotError::Inconsistent {
                        path,
                        reason: format!("non-zero bytes in [{s:#x}, {e:#x}), outside the pages memory.idx lists"),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Snapshots on disk keep the metadata JSON they had when the time was
    /// a bare number: those written before read the same.
    #[test]
    fn meta_json_is_unchanged() {
        let mut meta = SnapshotMeta::new("exit-000000000007", VirtNanos(12_500), 7, 4096, 3);
        meta.parent = Some("exit-000000000001".into());
        let text = concat!(
            r#"{"id":"exit-000000000007","parent":"exit-000000000001","virtual_ns":12500,"#,
            r#""exit_index":7,"ram_bytes":4096,"seed":3,"format_version":"#
        );
        let json = serde_json::to_string(&meta).unwrap();
        assert_eq!(json, format!("{text}{FORMAT_VERSION}}}"));
        assert_eq!(serde_json::from_str::<SnapshotMeta>(&json).unwrap(), meta);
    }

    #[test]
    fn ids() {
        for ok in ["a", "snap-0001", "t12.5s", "A_b.c-9"] {
            validate_id(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            ".tmp-x-1",
            "a/b",
            "a@b",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(validate_id(bad), Err(SnapshotError::InvalidId { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn copy_fallback_maps_the_same_bytes() {
        let root = tempfile::tempdir().unwrap();
        let mut mem = vec![0u8; 64 * PAGE_SIZE as usize];
        mem[3 * 4096] = 3;
        mem[10 * 4096] = 10;
        let base = SnapshotMeta::new("base", VirtNanos(1), 1, mem.len() as u64, 0);
        write_snapshot(root.path(), &base, &(), &mem).unwrap();
        mem[3 * 4096] = 0;
        mem[20 * 4096 + 5] = 20;
        let mut child = SnapshotMeta::new("child", VirtNanos(2), 2, mem.len() as u64, 0);
        child.parent = Some("base".into());
        write_incremental_snapshot(root.path(), &child, &(), &mem, &[3, 20]).unwrap();
        for budget in [0, MAX_OVERLAY_MAPS] {
            let m = map_memory_private_with(&root.path().join("child"), budget).unwrap();
            assert!(m.as_slice() == mem.as_slice(), "budget {budget}");
        }
    }

    /// Rewrites the metadata in `root/dir/state.bin` (a valid frame, so only the new
    /// metadata can be wrong).
    fn edit_meta(root: &Path, dir: &str, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = root.join(dir).join(STATE_FILE);
        let (flags, payload, _) = read_framed(&path, STATE_MAGIC, "state.bin").unwrap();
        let mut env: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        edit(&mut env["meta"]);
        std::fs::remove_file(&path).unwrap();
        let payload = serde_json::to_vec(&env).unwrap();
        write_framed(&path, STATE_MAGIC, flags, &payload).unwrap();
    }

    fn full(root: &Path, id: &str, at: u64) {
        let mem = vec![0u8; 4 * PAGE_SIZE as usize];
        let meta = SnapshotMeta::new(id, VirtNanos(at), at, mem.len() as u64, 0);
        write_snapshot(root, &meta, &(), &mem).unwrap();
    }

    fn list_error(root: &Path) -> String {
        let e = list(root).unwrap_err();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    }

    #[test]
    fn test_a_fifo_state_is_refused_without_hanging() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("s1");
        std::fs::create_dir(&dir).unwrap();
        let c = std::ffi::CString::new(dir.join(STATE_FILE).into_os_string().into_encoded_bytes())
            .unwrap();
        // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let root_path = root.path().to_owned();
        std::thread::spawn(move || tx.send(list_error(&root_path)).unwrap());
        let e = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("listing hung on a FIFO");
        assert!(
            e.ends_with("s1/state.bin: not a regular file (a FIFO)"),
            "{e}"
        );
        // A symlink to a device is refused too (it would be read for ever).
        std::fs::remove_file(dir.join(STATE_FILE)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join(STATE_FILE)).unwrap();
        let e = list_error(root.path());
        assert!(
            e.ends_with("not a regular file (a character device)"),
            "{e}"
        );
        let e = info(&dir).unwrap_err();
        assert!(matches!(e, SnapshotError::Read(_)), "{e}");
    }

    #[test]
    fn test_bad_ids_self_parents_and_cycles_are_not_listed_as_valid() {
        let root = tempfile::tempdir().unwrap();
        full(root.path(), "a", 1);
        full(root.path(), "b", 2);
        list(root.path()).unwrap();
        // An id with a space, in a directory of that name.
        edit_meta(root.path(), "a", |m| m["id"] = "a b".into());
        std::fs::rename(root.path().join("a"), root.path().join("a b")).unwrap();
        let e = list_error(root.path());
        assert!(e.contains("meta.id: invalid snapshot id \"a b\""), "{e}");
        std::fs::rename(root.path().join("a b"), root.path().join("a")).unwrap();
        edit_meta(root.path(), "a", |m| m["id"] = "a".into());
        // Its own parent.
        edit_meta(root.path(), "a", |m| m["parent"] = "a".into());
        let e = list_error(root.path());
        assert!(e.contains("snapshot \"a\" is its own parent"), "{e}");
        // A parent with a bad id.
        edit_meta(root.path(), "a", |m| m["parent"] = "../b".into());
        assert!(list_error(root.path()).contains("meta.parent: invalid snapshot id"));
        // Two snapshots each other's parent.
        edit_meta(root.path(), "a", |m| m["parent"] = "b".into());
        edit_meta(root.path(), "b", |m| m["parent"] = "a".into());
        let e = list_error(root.path());
        assert!(
            e.contains("broken incremental chain: its parents go round in a cycle"),
            "{e}"
        );
    }
}
