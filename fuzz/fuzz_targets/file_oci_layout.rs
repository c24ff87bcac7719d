//! `file_oci_layout`: OCI image layouts (`oci-layout`, `index.json`,
//! `blobs/sha256/<hex>`: index, manifest and config JSON, tar layers) as
//! `image build --oci DIR[:TAG]` reads them, and the tar layers themselves.
//!
//! Input: a tree in the encoding of `fuzz/common/files.rs`. Flag bit 1
//! clear: the tree is a layout, read with `read_image_with` (as `DIR` and,
//! with flag bit 0, as `DIR:latest`) and its layers flattened. Flag bit 1
//! set: every regular file of the tree, in path order, is a layer (so the
//! fuzzer reaches the tar reader without forging digests), flattened
//! directly. The seeds are a small layout (two layers: files, a directory,
//! a symlink, a hardlink, a whiteout) and the same layers on their own.
//!
//! Flattening builds the tree in memory (nothing is unpacked on the host);
//! the tree is then written as the guest's initramfs and read back.
//!
//! Invariants asserted:
//! - no panic, no hang, bounded memory (small `ReadOptions` and
//!   `FlattenOptions` limits); a refusal is a typed error whose message is
//!   not empty and does not repeat its cause's message;
//! - reading changes nothing: the layout's bytes are the same after, and
//!   nothing beside it changes (the canary);
//! - every path of a flattened tree is relative and clean (no empty, `.`
//!   or `..` component, no leading `/`), within the name and path length
//!   limits, and its parent is in the tree as a directory: nothing of the
//!   tree can land outside the directory it is unpacked into;
//! - sizes are within the limits: each file at most `max_file_size`, at
//!   most `max_entries` entries;
//! - a flattened tree is written as an initramfs (twice the same bytes)
//!   that reads back to the same tree, path for path and node for node;
//! - an accepted image's layers are each the manifest's, verified: a layer's
//!   digest is the digest of its bytes.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use files::{check_error, encode_tree, picture, Scratch};
use image_builder::{
    flatten_with, parse_oci_ref, read_image_with, read_initramfs, sha256_digest, write_initramfs,
    FlattenOptions, LayerBlob, NodeKind, ReadOptions, RootFs,
};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| Scratch::new("file_oci_layout"))
}

fn read_options() -> ReadOptions {
    ReadOptions {
        max_blob_size: 1 << 20,
        max_json_size: 256 << 10,
        ..ReadOptions::default()
    }
}

fn flatten_options() -> FlattenOptions {
    FlattenOptions {
        max_file_size: 1 << 20,
        max_total_size: 4 << 20,
        max_layer_size: 8 << 20,
        max_entries: 4096,
        ..FlattenOptions::default()
    }
}

fn check_tree(root: &RootFs) {
    let opts = flatten_options();
    assert!(
        root.len() as u64 <= opts.max_entries,
        "{} entries",
        root.len()
    );
    assert_eq!(root.entries().count(), root.len());
    assert!(root.root().is_dir(), "the root is not a directory");
    for (path, node) in root.entries() {
        assert!(
            path.len() <= image_builder::rootfs::MAX_PATH_LEN,
            "{path:?}"
        );
        for part in path.split('/') {
            assert!(
                !part.is_empty() && part != "." && part != "..",
                "unclean path {path:?}"
            );
            assert!(
                part.len() <= image_builder::rootfs::MAX_NAME_LEN,
                "{path:?}"
            );
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            let p = root
                .get(parent)
                .unwrap_or_else(|| panic!("{path:?} has no parent in the tree"));
            assert!(p.is_dir(), "{path:?}'s parent is not a directory");
        }
        if let NodeKind::File { data } = &node.kind {
            assert!(data.len() as u64 <= opts.max_file_size, "{path:?}");
        }
        assert_eq!(node.mode & !0o7777, 0, "{path:?}: mode {:o}", node.mode);
    }
    let mut first = Vec::new();
    write_initramfs(root, &mut first).expect("a flattened tree is written");
    let mut second = Vec::new();
    write_initramfs(root, &mut second).expect("again");
    assert!(first == second, "two writes of one tree differ");
    let back = read_initramfs(&first).unwrap_or_else(|e| panic!("written, not read: {e}"));
    assert_eq!(back.len(), root.len(), "entries lost or added");
    for ((p1, n1), (p2, n2)) in root.entries().zip(back.entries()) {
        assert_eq!(p1, p2);
        assert_eq!(n1, n2, "{p1:?} reads back differently");
    }
    assert_eq!(root.root(), back.root(), "the root reads back differently");
}

fn flatten_and_check(layers: &[LayerBlob]) {
    match flatten_with(layers, &flatten_options()) {
        Ok(root) => check_tree(&root),
        Err(e) => {
            check_error(&e);
        }
    }
}

fn check_layout(dir: &Path, tagged: bool) {
    let text = if tagged {
        format!("{}:latest", dir.display())
    } else {
        dir.display().to_string()
    };
    let r = match parse_oci_ref(&text) {
        Ok(r) => r,
        Err(e) => panic!("{text:?} is a reference: {e}"),
    };
    match read_image_with(&r, &read_options()) {
        Ok((_config, layers)) => {
            for layer in &layers {
                if layer.digest.starts_with("sha256:") {
                    assert_eq!(sha256_digest(&layer.data), layer.digest, "unverified layer");
                }
            }
            flatten_and_check(&layers);
        }
        Err(e) => {
            check_error(&e);
        }
    }
}

fn check_layers(dir: &Path, gzip: bool) {
    let mut files: Vec<_> = picture(dir)
        .into_iter()
        .filter(|(path, (kind, _))| *kind == 0 && path.is_file())
        .collect();
    files.truncate(8);
    let media_type = if gzip { TAR_GZIP } else { TAR };
    let layers: Vec<LayerBlob> = files
        .into_iter()
        .map(|(_, (_, data))| LayerBlob::new(media_type, data).expect("a known media type"))
        .collect();
    flatten_and_check(&layers);
}

/// A tar layer of `entries`: (path, kind, data) with kind `f` file, `d`
/// directory, `l` symlink (data = target), `h` hardlink (data = target).
fn tar_layer(entries: &[(&str, char, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for &(path, kind, data) in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mode(if kind == 'd' { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_size(0);
        match kind {
            'd' => {
                header.set_entry_type(tar::EntryType::Directory);
                builder
                    .append_data(&mut header, path, &[][..])
                    .expect("dir");
            }
            'l' | 'h' => {
                let t = if kind == 'l' {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                };
                header.set_entry_type(t);
                builder.append_link(&mut header, path, data).expect("link");
            }
            _ => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(data.len() as u64);
                builder
                    .append_data(&mut header, path, data.as_bytes())
                    .expect("file");
            }
        }
    }
    builder.into_inner().expect("tar")
}

fn seeds() -> Vec<Vec<u8>> {
    let scratch = Scratch::new("file_oci_layout-seeds");
    let dir = scratch.reset();
    let lower = tar_layer(&[
        ("etc", 'd', ""),
        ("etc/passwd", 'f', "root:x:0:0::/root:/bin/sh\n"),
        ("usr/bin", 'd', ""),
        ("usr/bin/app", 'f', "#!/bin/sh\necho hi\n"),
        ("bin", 'l', "usr/bin"),
        ("etc/old", 'f', "gone soon"),
    ]);
    let upper = tar_layer(&[
        ("etc/.wh.old", 'f', ""),
        ("bin/tool", 'f', "tool"),
        ("usr/bin/app2", 'h', "usr/bin/app"),
    ]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &upper).expect("gzip");
    let upper_gz = gz.finish().expect("gzip");
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs");
    let put = |bytes: &[u8]| -> String {
        let digest = sha256_digest(bytes);
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        std::fs::write(blobs.join(hex), bytes).expect("blob");
        digest
    };
    let desc = |media_type: &str, bytes: &[u8], digest: &str| serde_json::json!({"mediaType": media_type, "digest": digest, "size": bytes.len()});
    let lower_d = put(&lower);
    let upper_d = put(&upper_gz);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/usr/bin/app"], "Env": ["A=1"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [sha256_digest(&lower), sha256_digest(&upper)]}
    }))
    .expect("config");
    let config_d = put(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", &config, &config_d),
        "layers": [desc(TAR, &lower, &lower_d), desc(TAR_GZIP, &upper_gz, &upper_d)]
    }))
    .expect("manifest");
    let manifest_d = put(&manifest);
    let mut index_desc = desc(
        "application/vnd.oci.image.manifest.v1+json",
        &manifest,
        &manifest_d,
    );
    index_desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": "latest"});
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [index_desc]});
    std::fs::write(dir.join("index.json"), index.to_string()).expect("index");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("hdr");
    let mut out = vec![encode_tree(&dir, 0), encode_tree(&dir, 1)];
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("layers dir");
    std::fs::write(dir.join("0"), &lower).expect("layer 0");
    std::fs::write(dir.join("1"), &upper).expect("layer 1");
    out.push(encode_tree(&dir, 2));
    std::fs::write(dir.join("1"), &upper_gz).expect("layer 1");
    out.push(encode_tree(&dir, 6));
    let _ = std::fs::remove_dir_all(&scratch.base);
    out
}

fuzz_target!(
    init: {
        files::maybe_write_seeds(seeds);
    },
    |data: &[u8]| {
    let s = scratch();
    let (dir, flags) = s.decode(data);
    s.check_read_only(&dir, "reading the layout", || {
        if flags & 2 == 0 {
            check_layout(&dir, flags & 1 != 0);
        } else {
            check_layers(&dir, flags & 4 != 0);
        }
    });
});
