//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

/// What went wrong while reading an OCI layout, flattening its layers or writing the initramfs.
///
/// Every variant names the offending thing: the file (JSON, blob), the layer digest and the tar
/// entry path, the expected and actual digest, the limit that was exceeded. For changes made
/// through the [`crate::RootFs`] API (not from a layer), `layer` is [`crate::CALLER`].
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The `DIR[:TAG]` string could not be parsed.
    #[error("invalid OCI image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },

    /// The directory is not an OCI image layout (`oci-layout` missing or of an unknown version).
    #[error("{}: not an OCI image layout: {reason}", path.display())]
    NotAnOciLayout { path: PathBuf, reason: String },

    /// A file is not a regular one, too large, or could not be opened or read (the error
    /// names the path and, for a size, the limit).
    #[error(transparent)]
    Read(hostfile::ReadError),

    /// The output could not be written (or is not a regular file).
    #[error(transparent)]
    Output(#[from] hostfile::WriteError),
    /// Another process builds the same output now.
    #[error(transparent)]
    OutputBusy(#[from] hostfile::LockError),

    /// A file of the layout could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// `index.json`, a manifest, an index or a config blob is not valid JSON of its schema.
    #[error("bad JSON in {}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A descriptor points at a blob that is not in `blobs/`.
    #[error("blob {digest} is missing: {} does not exist", path.display())]
    MissingBlob { digest: String, path: PathBuf },

    /// A blob's size differs from the size its descriptor declares.
    #[error("blob {}: size mismatch: the descriptor says {expected} bytes, the file has {actual}", path.display())]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// A blob's content does not hash to the digest its descriptor (and file name) declares.
    #[error("blob {}: digest mismatch: expected {expected}, actual {actual}", path.display())]
    DigestMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    /// The uncompressed layer stream does not hash to the config's `rootfs.diff_ids` entry.
    #[error("layer {layer}: uncompressed content digest mismatch: the config's diff_id is {expected}, actual {actual}")]
    DiffIdMismatch {
        layer: String,
        expected: String,
        actual: String,
    },

    /// A digest with an algorithm other than sha256/sha384/sha512, or malformed.
    #[error(
        "unsupported or malformed digest {digest:?} (sha256, sha384 and sha512 are supported)"
    )]
    UnsupportedDigest { digest: String },

    /// A manifest, index, config or layer descriptor has a media type this crate does not handle.
    #[error("unknown media type {media_type:?} for {what}")]
    UnknownMediaType { media_type: String, what: String },

    /// No manifest in `index.json` carries the requested tag.
    #[error("no image tagged {tag:?} in {}; available tags: {}", layout.display(), list(available))]
    TagNotFound {
        layout: PathBuf,
        tag: String,
        available: Vec<String>,
    },

    /// No tag was given but `index.json` lists several images (not just platform variants).
    #[error("{} holds {count} images; choose one with DIR:TAG (available tags: {})", layout.display(), list(available))]
    AmbiguousImage {
        layout: PathBuf,
        count: usize,
        available: Vec<String>,
    },

    /// An index lists several manifests but none for the wanted platform.
    #[error(
        "no manifest for platform {wanted} in {what}; available platforms: {}",
        list(available)
    )]
    PlatformNotFound {
        wanted: String,
        what: String,
        available: Vec<String>,
    },

    /// The selected image's config declares another platform.
    #[error("the image is built for {actual}, but {wanted} is needed")]
    WrongPlatform { wanted: String, actual: String },

    /// Indexes nested deeper than the crate follows.
    #[error("image indexes nested more than {0} levels deep")]
    IndexTooDeep(usize),

    /// A blob, JSON file, layer stream, file, the extracted total or the entry count exceeds a
    /// configured limit. `subject` says which: `layer sha256:..., entry "x"`, `blob sha256:...`,
    /// a JSON file's path.
    #[error("{subject}: {what} of {size} exceeds the limit of {limit}")]
    TooLarge {
        subject: String,
        what: &'static str,
        size: u64,
        limit: u64,
    },

    /// A tar entry's path leaves the image root (`../../etc/passwd`, `/a/../../x`).
    #[error("layer {layer}: entry {entry:?} escapes the image root")]
    PathTraversal { layer: String, entry: String },

    /// Following a symlink on an entry's parent path would leave the image root.
    #[error("layer {layer}: entry {entry:?}: its parent path goes through symlink {symlink:?} -> {target:?}, which leads outside the image root")]
    SymlinkEscape {
        layer: String,
        entry: String,
        symlink: String,
        target: String,
    },

    /// More than 40 symlinks on an entry's parent path (a loop).
    #[error("layer {layer}: entry {entry:?}: too many levels of symbolic links (at {symlink:?})")]
    SymlinkLoop {
        layer: String,
        entry: String,
        symlink: String,
    },

    /// An entry's parent path goes through a symlink whose target does not exist in the tree.
    #[error("layer {layer}: entry {entry:?}: its parent path goes through a dangling symlink ({path:?} does not exist)")]
    DanglingSymlink {
        layer: String,
        entry: String,
        path: String,
    },

    /// An entry's parent path goes through something that is not a directory.
    #[error("layer {layer}: entry {entry:?}: {path:?} is not a directory")]
    NotADirectory {
        layer: String,
        entry: String,
        path: String,
    },

    /// A hardlink's target leaves the image root.
    #[error("layer {layer}: hardlink {entry:?} -> {target:?} points outside the image root")]
    HardlinkEscape {
        layer: String,
        entry: String,
        target: String,
    },

    /// A hardlink's target is not (yet) in the tree.
    #[error("layer {layer}: hardlink {entry:?} -> {target:?}: the target does not exist in the tree (yet)")]
    HardlinkTargetMissing {
        layer: String,
        entry: String,
        target: String,
    },

    /// A character or block device while [`crate::DevicePolicy::Reject`] is in force.
    #[error("layer {layer}: entry {entry:?} is a device node, and device nodes are rejected")]
    DeviceNodeRejected { layer: String, entry: String },

    /// A tar entry type that has no meaning in a root filesystem.
    #[error("layer {layer}: entry {entry:?}: unsupported tar entry type {kind}")]
    UnsupportedEntryType {
        layer: String,
        entry: String,
        kind: String,
    },

    /// Any other malformed entry (non-UTF-8 name, over-long name, bad whiteout, ...).
    #[error("layer {layer}: entry {entry:?}: {reason}")]
    InvalidEntry {
        layer: String,
        entry: String,
        reason: String,
    },

    /// The layer could not be decompressed or is not a valid tar stream.
    #[error("layer {layer}: corrupt or unreadable layer stream")]
    LayerRead {
        layer: String,
        #[source]
        source: io::Error,
    },

    /// A file too big for the newc format (sizes are 32-bit there).
    #[error(
        "{path:?}: a file of {size} bytes does not fit in a newc cpio archive (4 GiB - 1 at most)"
    )]
    CpioTooLarge { path: String, size: u64 },

    /// The data of an archive member could not be read, or ended before its declared size
    /// ([`crate::NewcWriter::append`]).
    #[error("cannot read the data of {path:?} for the archive")]
    CpioBody {
        path: String,
        #[source]
        source: io::Error,
    },

    /// Writing the archive failed.
    #[error("cannot write the initramfs")]
    Write(#[source] io::Error),

    /// An entry of a host directory read by [`crate::RootFs::from_dir`] that cannot go into a
    /// tree (non-UTF-8 name or symlink target, not a directory, unknown file type).
    #[error("{}: {reason}", path.display())]
    HostEntry { path: PathBuf, reason: String },

    /// Initramfs bytes that are not a sequence of uncompressed or gzip-compressed newc archives
    /// (bad magic, truncated header or data, corrupt gzip stream, a limit exceeded). `at` says
    /// where: `byte 1234`, or `byte 56 of the gzip stream at byte 1234`.
    #[error("initramfs, {at}: {reason}")]
    InitramfsFormat { at: String, reason: String },

    /// An initramfs entry that is malformed or unsafe: a `..` component, a non-UTF-8 symlink
    /// target, an unknown file type, a file replacing a non-empty directory.
    #[error("initramfs entry {entry:?}: {reason}")]
    InitramfsEntry { entry: String, reason: String },

    /// The node image metadata file is missing or unreadable.
    #[error("not a node image: {path}: {reason}")]
    NotANodeImage { path: String, reason: String },

    /// The tree already holds something else at a path detvisor reserves (`/detvisor`).
    #[error("{path} is reserved for detvisor, but the tree holds {what} there")]
    ReservedPath { path: String, what: String },
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "(none)".to_owned()
    } else {
        v.join(", ")
    }
}
