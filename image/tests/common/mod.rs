//! Builders for tar layers and OCI image layouts, written by the tests themselves.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use image_builder::sha256_digest;
use serde_json::{json, Value};

pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// A tar archive built entry by entry; names and link names are written raw into the header,
/// so hostile paths (`../../etc/passwd`) can be expressed.
pub struct Tar {
    b: tar::Builder<Vec<u8>>,
}

impl Default for Tar {
    fn default() -> Self {
        Self::new()
    }
}

impl Tar {
    pub fn new() -> Self {
        Tar {
            b: tar::Builder::new(Vec::new()),
        }
    }

    fn entry(
        mut self,
        kind: tar::EntryType,
        name: &[u8],
        link: &[u8],
        mode: u32,
        data: &[u8],
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(data.len() as u64);
        {
            let old = h.as_old_mut();
            old.name = [0; 100];
            old.name[..name.len()].copy_from_slice(name);
            old.linkname = [0; 100];
            old.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn file(self, name: &str, mode: u32, data: &[u8]) -> Self {
        self.entry(tar::EntryType::Regular, name.as_bytes(), b"", mode, data)
    }

    pub fn file_owned(mut self, name: &str, mode: u32, uid: u64, gid: u64, data: &[u8]) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(name).unwrap();
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(gid);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn raw_file(self, name: &[u8], data: &[u8]) -> Self {
        self.entry(tar::EntryType::Regular, name, b"", 0o644, data)
    }

    pub fn dir(self, name: &str, mode: u32) -> Self {
        self.entry(tar::EntryType::Directory, name.as_bytes(), b"", mode, b"")
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(
            tar::EntryType::Symlink,
            name.as_bytes(),
            target.as_bytes(),
            0o777,
            b"",
        )
    }

    pub fn hardlink(self, name: &str, target: &str) -> Self {
        self.entry(
            tar::EntryType::Link,
            name.as_bytes(),
            target.as_bytes(),
            0o644,
            b"",
        )
    }

    pub fn whiteout(self, dir: &str, name: &str) -> Self {
        let path = if dir.is_empty() {
            format!(".wh.{name}")
        } else {
            format!("{dir}/.wh.{name}")
        };
        self.file(&path, 0o644, b"")
    }

    pub fn opaque(self, dir: &str) -> Self {
        self.file(&format!("{dir}/.wh..wh..opq"), 0o644, b"")
    }

    pub fn device(mut self, name: &str, char_dev: bool, major: u32, minor: u32) -> Self {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(if char_dev {
            tar::EntryType::Char
        } else {
            tar::EntryType::Block
        });
        h.set_path(name).unwrap();
        h.set_mode(0o666);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        h.set_cksum();
        self.b.append(&h, &b""[..]).unwrap();
        self
    }

    pub fn fifo(self, name: &str) -> Self {
        self.entry(tar::EntryType::Fifo, name.as_bytes(), b"", 0o600, b"")
    }

    /// A regular-file header declaring `size` bytes but followed by no data.
    pub fn lying_size(mut self, name: &str, size: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(name).unwrap();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_size(size);
        h.set_cksum();
        self.b.get_mut().extend_from_slice(h.as_bytes());
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.b.into_inner().unwrap()
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data), &mut out).unwrap();
    out
}

/// A layer to put in an image: media type, blob bytes, uncompressed tar (for the diff_id).
pub struct Layer {
    pub media_type: &'static str,
    pub blob: Vec<u8>,
    pub tar: Vec<u8>,
}

impl Layer {
    pub fn plain(tar: Vec<u8>) -> Self {
        Layer {
            media_type: TAR,
            blob: tar.clone(),
            tar,
        }
    }
    pub fn gzip(tar: Vec<u8>) -> Self {
        Layer {
            media_type: TAR_GZIP,
            blob: gzip(&tar),
            tar,
        }
    }
    pub fn zstd(tar: Vec<u8>) -> Self {
        Layer {
            media_type: TAR_ZSTD,
            blob: zstd(&tar),
            tar,
        }
    }
}

/// An OCI image layout in a temporary directory.
pub struct Layout {
    pub tmp: tempfile::TempDir,
}

impl Default for Layout {
    fn default() -> Self {
        Self::new()
    }
}

impl Layout {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(
            tmp.path().join("oci-layout"),
            br#"{"imageLayoutVersion": "1.0.0"}"#,
        )
        .unwrap();
        Layout { tmp }
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let (alg, hex) = digest.split_once(':').unwrap();
        self.dir().join("blobs").join(alg).join(hex)
    }

    /// Stores `data` as a blob; returns a descriptor for it.
    pub fn blob(&self, media_type: &str, data: &[u8]) -> Value {
        let digest = sha256_digest(data);
        let path = self.blob_path(&digest);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, data).unwrap();
        json!({"mediaType": media_type, "digest": digest, "size": data.len()})
    }

    pub fn json_blob(&self, media_type: &str, v: &Value) -> Value {
        self.blob(media_type, &serde_json::to_vec(v).unwrap())
    }

    /// Stores layers, a config and a manifest; returns the manifest descriptor (no annotations).
    pub fn image(&self, layers: &[Layer], config: Value) -> Value {
        self.image_for("amd64", layers, config)
    }

    pub fn image_for(&self, arch: &str, layers: &[Layer], config: Value) -> Value {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256_digest(&l.tar)).collect();
        let config = json!({
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config_desc = self.json_blob(CONFIG, &config);
        let layer_descs: Vec<Value> = layers
            .iter()
            .map(|l| self.blob(l.media_type, &l.blob))
            .collect();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config_desc,
            "layers": layer_descs,
        });
        self.json_blob(MANIFEST, &manifest)
    }

    pub fn write_index(&self, manifests: Vec<Value>) {
        let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests});
        fs::write(
            self.dir().join("index.json"),
            serde_json::to_vec_pretty(&index).unwrap(),
        )
        .unwrap();
    }
}

pub fn tagged(mut desc: Value, tag: &str) -> Value {
    desc["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    desc
}

pub fn with_platform(mut desc: Value, os: &str, arch: &str) -> Value {
    desc["platform"] = json!({"os": os, "architecture": arch});
    desc
}

/// One entry of a parsed cpio archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpioEntry {
    pub name: String,
    pub ino: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: u32,
    pub rdev: (u32, u32),
    pub data: Vec<u8>,
}

/// Parses a whole (uncompressed) newc archive with the cpio crate's reader.
pub fn parse_cpio(mut bytes: &[u8]) -> Vec<CpioEntry> {
    let mut out = Vec::new();
    loop {
        let mut r = cpio::NewcReader::new(bytes).unwrap();
        if r.entry().is_trailer() {
            break;
        }
        let e = r.entry().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut r, &mut data).unwrap();
        out.push(CpioEntry {
            name: e.name().to_owned(),
            ino: e.ino(),
            mode: e.mode(),
            uid: e.uid(),
            gid: e.gid(),
            nlink: e.nlink(),
            mtime: e.mtime(),
            rdev: (e.rdev_major(), e.rdev_minor()),
            data,
        });
        bytes = r.finish().unwrap();
    }
    out
}
