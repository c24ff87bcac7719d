//! Node images: a root filesystem plus the OCI config that says how to run it.
//!
//! A node image is an ordinary initramfs ([`crate::write_initramfs`] output: gzip'd newc,
//! byte-reproducible) whose tree holds, besides the image's files, one file detvisor reserves:
//! `/detvisor/image.json` (0644, in a 0755 `/detvisor`):
//!
//! ```json
//! {
//!   "format": 1,
//!   "config": {
//!     "entrypoint": ["/usr/local/bin/etcd"],
//!     "cmd": [],
//!     "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
//!     "working_dir": null,
//!     "user": null,
//!     "labels": {},
//!     "stop_signal": null,
//!     "os": "linux",
//!     "architecture": "amd64",
//!     "manifest_digest": "sha256:..."
//!   }
//! }
//! ```
//!
//! `config` is an [`ImageConfig`]; for images built from a directory it is empty. The detvisor
//! agent is *not* part of a node image: `detvisor up` assembles the guest initramfs from the
//! agent (once) and each node's tree grafted under its own directory ([`RootFs::graft`]).

use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::{read_initramfs, write_initramfs, ImageConfig, ImageError, RootFs};

/// Where a node image keeps its metadata (relative to the image root).
pub const NODE_IMAGE_CONFIG: &str = "detvisor/image.json";
/// The directory detvisor reserves in node images.
const RESERVED_DIR: &str = "detvisor";
/// The metadata format version written and read.
pub const NODE_IMAGE_FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Metadata {
    format: u32,
    config: ImageConfig,
}

/// A node image read back: its tree (including `/detvisor/image.json`) and its config.
#[derive(Clone, Debug)]
pub struct NodeImage {
    pub root: RootFs,
    pub config: ImageConfig,
}

/// `root` plus `/detvisor/image.json` describing `config`: the tree of a node image.
///
/// A `/detvisor` directory already in `root` is kept (its `image.json` replaced); anything
/// else there is an [`ImageError::ReservedPath`], so that the metadata can never be written
/// through a symlink of the image.
pub fn build_node_image(config: &ImageConfig, root: &RootFs) -> Result<RootFs, ImageError> {
    let mut root = root.clone();
    if let Some(node) = root.lookup(RESERVED_DIR).filter(|n| !n.is_dir()) {
        return Err(ImageError::ReservedPath {
            path: format!("/{RESERVED_DIR}"),
            what: format!("a non-directory (mode {:o})", node.st_mode()),
        });
    }
    let meta = Metadata {
        format: NODE_IMAGE_FORMAT,
        config: config.clone(),
    };
    let mut json = serde_json::to_vec_pretty(&meta).expect("plain data serialises");
    json.push(b'\n');
    root.add_dir(RESERVED_DIR, 0o755)?;
    root.remove(NODE_IMAGE_CONFIG)?;
    root.add_file(NODE_IMAGE_CONFIG, 0o644, json)?;
    Ok(root)
}

/// [`build_node_image`] then [`write_initramfs`]: the bytes of a node image. The same config
/// and tree give the same bytes.
pub fn write_node_image<W: Write>(
    config: &ImageConfig,
    root: &RootFs,
    out: &mut W,
) -> Result<(), ImageError> {
    write_initramfs(&build_node_image(config, root)?, out)
}

impl NodeImage {
    /// Reads a node image ([`read_initramfs`], so the same path-safety rules apply) and its
    /// `/detvisor/image.json`.
    pub fn load(bytes: &[u8]) -> Result<NodeImage, ImageError> {
        Self::from_root(read_initramfs(bytes)?)
    }

    /// The config of a tree that holds `/detvisor/image.json`. A missing file, one that is not
    /// a regular file (or is reached through a symlink), bad JSON or an unknown format
    /// version is an [`ImageError::NotANodeImage`] naming the file.
    pub fn from_root(root: RootFs) -> Result<NodeImage, ImageError> {
        let err = |reason: String| ImageError::NotANodeImage {
            path: format!("/{NODE_IMAGE_CONFIG}"),
            reason,
        };
        let data = match root.lookup(NODE_IMAGE_CONFIG) {
            None => return Err(err("the file is missing".to_owned())),
            Some(node) => node
                .data()
                .ok_or_else(|| err("not a regular file".to_owned()))?,
        };
        let meta: Metadata =
            serde_json::from_slice(data).map_err(|e| err(format!("bad JSON: {e}")))?;
        if meta.format != NODE_IMAGE_FORMAT {
            return Err(err(format!(
                "format {} is not supported (this detvisor reads format {NODE_IMAGE_FORMAT})",
                meta.format
            )));
        }
        Ok(NodeImage {
            config: meta.config,
            root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ImageConfig {
        ImageConfig {
            entrypoint: vec!["/usr/local/bin/etcd".to_owned()],
            cmd: vec!["--name".to_owned(), "n1".to_owned()],
            env: vec!["PATH=/usr/bin:/bin".to_owned()],
            working_dir: Some("/var/lib/etcd".to_owned()),
            user: Some("1000:1000".to_owned()),
            labels: [("k".to_owned(), "v".to_owned())].into(),
            stop_signal: Some("SIGTERM".to_owned()),
            os: "linux".to_owned(),
            architecture: "amd64".to_owned(),
            manifest_digest: "sha256:00".to_owned(),
        }
    }

    fn tree() -> RootFs {
        let mut fs = RootFs::new();
        fs.add_file("usr/local/bin/etcd", 0o755, b"etcd".to_vec())
            .unwrap();
        fs.add_symlink("bin", "usr/bin").unwrap();
        fs
    }

    fn bytes(config: &ImageConfig, root: &RootFs) -> Vec<u8> {
        let mut out = Vec::new();
        write_node_image(config, root, &mut out).unwrap();
        out
    }

    #[test]
    fn node_images_round_trip_reproducibly() {
        let a = bytes(&config(), &tree());
        assert_eq!(a, bytes(&config(), &tree()), "same input, same bytes");
        let img = NodeImage::load(&a).unwrap();
        assert_eq!(img.config, config());
        assert_eq!(img.config.argv(), ["/usr/local/bin/etcd", "--name", "n1"]);
        assert_eq!(
            img.root.get("usr/local/bin/etcd").unwrap().data(),
            Some(&b"etcd"[..])
        );
        let meta = img.root.get("/detvisor/image.json").unwrap();
        assert_eq!(meta.mode, 0o644);
        let json: serde_json::Value = serde_json::from_slice(meta.data().unwrap()).unwrap();
        assert_eq!(json["format"], 1);
        assert_eq!(json["config"]["working_dir"], "/var/lib/etcd");
        // Building again from the loaded tree replaces the metadata, same bytes.
        assert_eq!(bytes(&config(), &img.root), a);
        // Another config, other bytes.
        assert_ne!(bytes(&ImageConfig::default(), &tree()), a);
    }

    #[test]
    fn missing_or_bad_metadata_is_named() {
        let mut plain = Vec::new();
        crate::write_initramfs(&tree(), &mut plain).unwrap();
        let err = NodeImage::load(&plain).unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a node image: /detvisor/image.json: the file is missing"
        );

        let mut fs = tree();
        fs.add_file(
            NODE_IMAGE_CONFIG,
            0o644,
            br#"{"format": 2, "config": {}}"#.to_vec(),
        )
        .unwrap();
        let err = NodeImage::from_root(fs.clone()).unwrap_err();
        assert!(err.to_string().contains("format 2"), "{err}");
        fs.add_file(NODE_IMAGE_CONFIG, 0o644, b"{".to_vec())
            .unwrap();
        let err = NodeImage::from_root(fs).unwrap_err();
        assert!(err.to_string().contains("bad JSON"), "{err}");

        // Older or partial metadata: missing config fields take defaults.
        let mut fs = tree();
        fs.add_file(
            NODE_IMAGE_CONFIG,
            0o644,
            br#"{"format": 1, "config": {"cmd": ["sh"]}}"#.to_vec(),
        )
        .unwrap();
        assert_eq!(NodeImage::from_root(fs).unwrap().config.argv(), ["sh"]);

        // The metadata is never read through a symlink.
        let mut fs = tree();
        fs.add_file("elsewhere/image.json", 0o644, b"{}".to_vec())
            .unwrap();
        fs.add_symlink("detvisor", "elsewhere").unwrap();
        assert!(NodeImage::from_root(fs).is_err());
    }

    #[test]
    fn the_reserved_directory_is_not_written_through() {
        let mut fs = tree();
        fs.add_symlink("detvisor", "/etc").unwrap();
        let err = build_node_image(&config(), &fs).unwrap_err();
        assert!(matches!(err, ImageError::ReservedPath { .. }), "{err}");
        assert!(
            err.to_string().starts_with("/detvisor is reserved"),
            "{err}"
        );
    }
}
