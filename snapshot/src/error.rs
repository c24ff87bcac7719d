//! The one error type of this crate. Every variant that concerns a file names it.

use std::path::PathBuf;

/// Why a snapshot could not be written, read, listed or resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// An operating-system call failed.
    #[error("{}: {op}", .path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// A part could not be read: not a regular file, too large, or an I/O error (each names
    /// the path).
    #[error(transparent)]
    Read(hostfile::ReadError),

    /// A part to be written is larger than a snapshot part may be read back
    /// ([`crate::frame::MAX_FRAMED_BYTES`]): written, it could never be restored.
    #[error(
        "{}: {bytes} bytes, over the {max} bytes a snapshot part may hold (a disk's changed \
         blocks are kept in the state, at two bytes each: write less to disks between \
         snapshots, or give them less to change)",
        .path.display()
    )]
    PartTooLarge { path: PathBuf, bytes: u64, max: u64 },

    /// The file does not start with the expected magic: it is not a detvisor snapshot file.
    #[error("{}: not a detvisor snapshot file (expected magic \"{expected}\", found \"{found}\")", .path.display())]
    BadMagic {
        path: PathBuf,
        expected: String,
        found: String,
    },

    /// The file was written by a format version this build cannot read.
    #[error("{}: unsupported snapshot format version {found} (this build reads versions {} to {supported})", .path.display(), crate::OLDEST_READ_VERSION)]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// The header carries flag bits this build does not know.
    #[error("{}: unsupported header flags {found:#x} (this build knows {known:#x})", .path.display())]
    UnsupportedFlags {
        path: PathBuf,
        found: u32,
        known: u32,
    },

    /// The file is shorter than its header says it should be.
    #[error("{}: truncated: expected {expected} bytes, found {actual}", .path.display())]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// The file is longer than its header says it should be.
    #[error("{}: {} unexpected trailing bytes (expected {expected} bytes, found {actual})", .path.display(), .actual - .expected)]
    TrailingData {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// The payload's CRC-64/XZ does not match the one in the header.
    #[error("{}: checksum mismatch: header says CRC-64/XZ {expected:#018x}, payload has {actual:#018x}", .path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// The payload passed its checksum but is not valid JSON.
    #[error("{}: corrupt JSON payload", .path.display())]
    CorruptJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// The payload is valid JSON but does not fit the expected types: an unknown field, a
    /// missing field, a wrong type. Usually a snapshot written by a different VMM version.
    #[error("{}: payload does not match the expected state type (written by another VMM version?)", .path.display())]
    SchemaMismatch {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// The caller's state could not be serialized.
    #[error("{}: cannot serialize the state", .path.display())]
    Serialize {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A file or directory that a snapshot needs is absent.
    #[error("{}: missing snapshot part: {what}", .path.display())]
    MissingPart { path: PathBuf, what: &'static str },

    /// `memory.img` does not have the length recorded in the snapshot's metadata.
    #[error("{}: memory image is {actual} bytes, but the snapshot's ram_bytes is {expected}", .path.display())]
    MemoryLength {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// `memory.idx` passed its checksum but describes impossible pages.
    #[error("{}: corrupt page index: {reason}", .path.display())]
    CorruptIndex { path: PathBuf, reason: String },

    /// The stored memory pages do not match the checksum in `memory.idx` (see `verify_memory`).
    #[error("{}: memory contents checksum mismatch: index says CRC-64/XZ {expected:#018x}, stored pages have {actual:#018x}", .path.display())]
    MemoryChecksum {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// The parts of a snapshot disagree with each other (e.g. the header flags and the page
    /// index, or the directory name and the recorded id).
    #[error("{}: inconsistent snapshot: {reason}", .path.display())]
    Inconsistent { path: PathBuf, reason: String },

    /// An incremental snapshot's chain of parents cannot be followed.
    #[error("{}: broken incremental chain: {reason}", .path.display())]
    BrokenChain { path: PathBuf, reason: String },

    /// `memory_file` was asked for an incremental snapshot, whose `memory.img` holds only the
    /// dirty pages.
    #[error("{}: incremental snapshot (parent {parent:?}): its memory.img holds only its dirty pages; use map_memory_private or memory_chain", .path.display())]
    Incremental { path: PathBuf, parent: String },

    /// A snapshot id that cannot name a directory entry safely.
    #[error("invalid snapshot id {id:?}: {reason}")]
    InvalidId { id: String, reason: &'static str },

    /// The caller passed arguments that do not fit together.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A snapshot with that id exists already; snapshots are immutable.
    #[error("{}: snapshot already exists (snapshots are immutable; remove it first)", .path.display())]
    AlreadyExists { path: PathBuf },

    /// The snapshot is the parent of incremental snapshots and cannot be removed.
    #[error("{}: snapshot is the parent of incremental snapshot(s) {children:?}; remove those first", .path.display())]
    HasDependents {
        path: PathBuf,
        children: Vec<String>,
    },

    /// A moment that cannot name a snapshot as written (a directory of snapshots where one
    /// snapshot is meant, or an id that was meant as a time).
    #[error("bad snapshot spec {spec:?}: {reason}")]
    BadSpec { spec: String, reason: String },

    /// A time or exit target lies before the first snapshot in the root.
    #[error("{}: no snapshot at or before {target}; the earliest is {earliest}", .root.display())]
    TooEarly {
        root: PathBuf,
        target: String,
        earliest: String,
    },

    /// No snapshot matches.
    #[error("{}: {what}", .root.display())]
    NotFound { root: PathBuf, what: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = SnapshotError> = std::result::Result<T, E>;

pub(crate) fn io(
    path: impl Into<PathBuf>,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.into();
    move |source| SnapshotError::Io { path, op, source }
}
