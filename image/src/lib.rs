//! OCI image -> reproducible guest root filesystem.
//!
//! `detvisor image build --oci ./etcd-oci:latest --out etcd.img` goes through four steps:
//!
//! ```no_run
//! use image_builder::{flatten, parse_oci_ref, read_image, write_node_image};
//! # fn main() -> Result<(), image_builder::ImageError> {
//! let r = parse_oci_ref("./etcd-oci:latest")?;        // layout dir + tag
//! let (config, layers) = read_image(&r)?;            // verified blobs, linux/amd64
//! let root = flatten(&layers)?;                      // in-memory tree, whiteouts applied
//! let mut out = std::fs::File::create("etcd.img").unwrap();
//! write_node_image(&config, &root, &mut out)?;       // + /detvisor/image.json, newc + gzip
//! # Ok(()) }
//! ```
//!
//! A tree can also come from a host directory ([`RootFs::from_dir`]) or from an initramfs
//! ([`read_initramfs`], the inverse of [`write_initramfs`]). A *node image* ([`node`]) is an
//! initramfs whose `/detvisor/image.json` carries the image's [`ImageConfig`] (entrypoint,
//! cmd, env, working dir, user, ...); [`NodeImage::load`] reads one back. The multi-node
//! `detvisor up` loads each node image, grafts its tree under a directory of its own
//! ([`RootFs::graft`]) next to the agent, which is added once for the whole guest and never
//! put in node images, and writes the guest initramfs:
//!
//! ```no_run
//! use image_builder::{write_initramfs, NodeImage, RootFs};
//! # fn main() -> Result<(), image_builder::ImageError> {
//! let etcd = NodeImage::load(&std::fs::read("etcd.img").unwrap())?;
//! let mut guest = RootFs::new();
//! guest.add_file("/sbin/detvisor-agent", 0o755, b"...".to_vec())?;
//! guest.graft("/nodes/etcd-1", &etcd.root)?;          // symlinks kept verbatim (chroot later)
//! let argv = etcd.config.argv();                      // what to run in /nodes/etcd-1
//! # let _ = argv;
//! write_initramfs(&guest, &mut std::fs::File::create("guest.img").unwrap())?;
//! # Ok(()) }
//! ```
//!
//! # Input
//! An OCI image layout directory (`oci-layout`, `index.json`, `blobs/<alg>/<hex>`) as skopeo,
//! umoci, buildah or `docker save` (Docker 25+) write it. `index.json` entries are selected by
//! the `org.opencontainers.image.ref.name` annotation (a full reference ending in `:TAG` in
//! that annotation or in `io.containerd.image.name` matches too); without a tag the layout
//! must hold a single image. Nested indexes (multi-platform images) are followed to the
//! linux/amd64 manifest. OCI and Docker schema 2 media types are accepted. Every blob read
//! (nested indexes, manifest, config, layers) is checked against its descriptor's size and
//! digest (sha256, sha384 or sha512), and each layer's uncompressed stream against the config's
//! `diff_ids` while flattening.
//!
//! # Security
//! Layers are untrusted input. Flattening builds the tree in memory and never touches the host
//! filesystem. It rejects, with the layer digest and entry path in the error:
//! - entry paths whose `..` climb above the root (`../../etc/passwd`, `/abs/../../x`);
//!   absolute paths are taken relative to the image root (`/etc/x` is `etc/x`), as tar and
//!   Docker do ([`ImageError::PathTraversal`]);
//! - entries whose parent path goes through a symlink that leads outside the root, loops, or
//!   dangles. Symlinked parents that stay inside are *resolved inside the tree* (chroot
//!   semantics: `link -> /etc` then `link/passwd` writes the image's `etc/passwd`), which is
//!   what Docker/containerd do and what merged-`/usr` images need ([`ImageError::SymlinkEscape`],
//!   [`ImageError::SymlinkLoop`], [`ImageError::DanglingSymlink`], [`ImageError::NotADirectory`]);
//! - hardlinks whose target leaves the root, is not in the tree yet (lower layers or earlier
//!   in the same layer), or is a directory ([`ImageError::HardlinkEscape`],
//!   [`ImageError::HardlinkTargetMissing`]);
//! - absurd sizes: per file, total extracted bytes, per uncompressed layer stream (bombs),
//!   number of entries, blob and JSON sizes, path and name lengths ([`ImageError::TooLarge`],
//!   [`FlattenOptions`], [`ReadOptions`]);
//! - non-UTF-8 names (the newc writer needs UTF-8), tar entry types with no filesystem meaning.
//!
//! Device nodes are kept by default ([`DevicePolicy`]): they only exist in the guest's own
//! rootfs, where they reach the guest's virtual devices. Symlink targets are stored verbatim
//! and only ever interpreted inside the tree.
//!
//! # Output
//! [`write_initramfs`] writes a newc cpio (sorted, fixed inode numbers, mtime 0, hardlinks
//! preserved) through gzip with a fixed header and level: the same tree gives the same bytes.
//! Node images inherit this: the same image (or directory contents) and config give the same
//! bytes, whoever builds them and whenever.
//!
//! # Reading trees back
//! [`read_initramfs`] treats its input as untrusted too: any entry name with a `..` component
//! is rejected naming the entry ([`ImageError::InitramfsEntry`]), parents are resolved inside
//! the tree with the rules above, gzip output is bounded ([`UnpackOptions`]) and malformed
//! bytes are reported with their offset ([`ImageError::InitramfsFormat`]).
//! [`RootFs::from_dir`] reads a trusted host directory: symlinks are stored, never followed;
//! sockets are skipped; owners become root unless [`DirOptions::keep_owners`]; errors name
//! the host path.

mod build;
pub mod cache;
mod digest;
mod error;
mod flatten;
mod hostdir;
mod initramfs;
mod layout;
pub mod node;
mod reference;
pub mod rootfs;
mod unpack;

pub use build::{write_node_image_file, BuildProgress, NodeImageReport, NodeImageSource};
pub use cache::cache_root;
pub use digest::sha256_digest;
pub use error::ImageError;
pub use flatten::{flatten, flatten_each, flatten_with, DevicePolicy, FlattenOptions};
pub use hostdir::DirOptions;
pub use initramfs::{write_cpio, write_initramfs, NewcEntry, NewcWriter, GZIP_LEVEL};
pub use layout::{
    read_image, read_image_with, Compression, ImageConfig, LayerBlob, ReadOptions,
    CONTAINERD_NAME_ANNOTATION, REF_NAME_ANNOTATION,
};
pub use node::{
    build_node_image, write_node_image, NodeImage, NODE_IMAGE_CONFIG, NODE_IMAGE_FORMAT,
};
pub use reference::{parse_oci_ref, OciRef};
pub use rootfs::{Node, NodeKind, RootFs, CALLER};
pub use unpack::{read_initramfs, read_initramfs_with, UnpackOptions, INITRAMFS};
