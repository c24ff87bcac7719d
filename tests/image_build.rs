//! `detvisor image build`, end to end: OCI image layouts written by the test itself (gzip'd tar
//! layers with a whiteout, correct digests) -> node image files, read back with the library.

mod common;
#[path = "../image/tests/common/mod.rs"]
mod oci;

use std::fs;
use std::path::{Path, PathBuf};

use common::{detvisor, stderr};
use image_builder::{read_initramfs, sha256_digest, NodeImage};
use oci::{tagged, Layer, Layout, Tar};
use serde_json::json;

/// An etcd-like image: a base layer and a second one that deletes a file (whiteout).
fn etcd_layout() -> Layout {
    let base = Tar::new()
        .dir("usr", 0o755)
        .dir("usr/local", 0o755)
        .dir("usr/local/bin", 0o755)
        .file("usr/local/bin/etcd", 0o755, b"\x7fELF etcd")
        .hardlink("usr/local/bin/etcdctl", "usr/local/bin/etcd")
        .symlink("bin", "usr/local/bin")
        .dir("etc", 0o755)
        .file("etc/secret", 0o600, b"to be deleted")
        .file("etc/hosts", 0o644, b"127.0.0.1 localhost\n")
        .finish();
    let top = Tar::new()
        .whiteout("etc", "secret")
        .dir("var/lib/etcd", 0o700)
        .finish();
    let layout = Layout::new();
    let manifest = layout.image(
        &[Layer::gzip(base), Layer::gzip(top)],
        json!({
            "Entrypoint": ["/usr/local/bin/etcd"],
            "Cmd": ["--data-dir", "/var/lib/etcd"],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "WorkingDir": "/var/lib/etcd",
        }),
    );
    layout.write_index(vec![tagged(manifest, "latest")]);
    layout
}

fn build(source: &[&str], out: &Path) -> std::process::Output {
    let mut args = vec!["image", "build"];
    args.extend_from_slice(source);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    detvisor(&args)
}

fn oci_ref(layout: &Layout, tag: &str) -> String {
    format!("{}:{tag}", layout.dir().display())
}

fn partial(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.partial", out.display()))
}

#[test]
fn oci_build_is_reproducible_and_reads_back() {
    let layout = etcd_layout();
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
    let r = oci_ref(&layout, "latest");

    let out = build(&["--oci", &r], &a);
    assert_eq!(out.status.code(), Some(0));
    // Quiet: nothing on stderr.
    let quiet = build(&["--oci", &r, "--quiet"], &b);
    assert_eq!(quiet.status.code(), Some(0));
    assert_eq!(stderr(&quiet), "");
    let bytes = fs::read(&a).unwrap();
    assert_eq!(bytes, fs::read(&b).unwrap(), "two builds, same bytes");
    assert!(!partial(&a).exists());

    // Away from a terminal: a line per step (the layers read, each
    // unpacked, the tree), then the closing line.
    let text = stderr(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("detvisor: read the image: 2 layers, "),
        "{text}"
    );
    assert!(
        lines[1].starts_with("detvisor: layer 1/2 unpacked (sha256:"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("detvisor: layer 2/2 unpacked (sha256:"),
        "{text}"
    );
    assert!(
        lines[3].ends_with(" entries: writing the node image"),
        "{text}"
    );
    let summary = lines[4];
    assert!(summary.starts_with("detvisor: wrote "), "{text}");
    assert!(summary.contains(&sha256_digest(&bytes)), "{summary}");
    assert!(
        summary.contains(&format!("{} bytes", bytes.len())),
        "{summary}"
    );

    let root = read_initramfs(&bytes).unwrap();
    let etcd = root.get("usr/local/bin/etcd").unwrap();
    assert_eq!(
        (etcd.data(), etcd.mode),
        (Some(&b"\x7fELF etcd"[..]), 0o755)
    );
    assert_eq!(root.link_count("usr/local/bin/etcdctl"), Some(2));
    assert_eq!(
        root.get("bin").unwrap().symlink_target(),
        Some("usr/local/bin")
    );
    assert!(root.get("etc/hosts").is_some());
    assert!(root.get("etc/secret").is_none(), "whiteout applied");
    assert_eq!(root.get("var/lib/etcd").unwrap().mode, 0o700);
    assert!(root.get("detvisor/image.json").is_some());
    assert!(
        root.entries().all(|(p, _)| !p.contains("agent")),
        "node images carry no agent"
    );

    let image = NodeImage::load(&bytes).unwrap();
    assert_eq!(
        image.config.argv(),
        ["/usr/local/bin/etcd", "--data-dir", "/var/lib/etcd"]
    );
    assert_eq!(image.config.env, ["PATH=/usr/local/bin:/usr/bin:/bin"]);
    assert_eq!(image.config.working_dir.as_deref(), Some("/var/lib/etcd"));
    assert_eq!(
        (image.config.os.as_str(), image.config.architecture.as_str()),
        ("linux", "amd64")
    );
    assert!(image.config.manifest_digest.starts_with("sha256:"));
}

#[test]
fn rootfs_build_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(dir.join("bin/app"), b"app").unwrap();
    std::os::unix::fs::symlink("/bin/app", dir.join("entry")).unwrap();
    let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
    let d = dir.to_str().unwrap();
    assert_eq!(build(&["--rootfs", d], &a).status.code(), Some(0));
    assert_eq!(build(&["--rootfs", d], &b).status.code(), Some(0));
    let bytes = fs::read(&a).unwrap();
    assert_eq!(bytes, fs::read(&b).unwrap());
    let image = NodeImage::load(&bytes).unwrap();
    assert_eq!(image.root.get("bin/app").unwrap().data(), Some(&b"app"[..]));
    assert_eq!(
        image.root.get("entry").unwrap().symlink_target(),
        Some("/bin/app")
    );
    assert!(image.config.argv().is_empty());
}

#[test]
fn hostile_layer_fails_naming_the_entry_and_writes_nothing() {
    let layout = Layout::new();
    let evil = Tar::new()
        .file("ok", 0o644, b"fine")
        .file("../escape", 0o644, b"owned")
        .finish();
    let manifest = layout.image(&[Layer::gzip(evil)], json!({}));
    layout.write_index(vec![tagged(manifest, "latest")]);
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("evil.img");

    let out = build(&["--oci", &oci_ref(&layout, "latest")], &out_path);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains(r#"entry "../escape" escapes the image root"#),
        "{err}"
    );
    assert!(!out_path.exists() && !partial(&out_path).exists());
    assert!(!layout.dir().parent().unwrap().join("escape").exists());

    // An existing output survives a failed build untouched.
    fs::write(&out_path, b"previous").unwrap();
    let out = build(&["--oci", &oci_ref(&layout, "latest")], &out_path);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(fs::read(&out_path).unwrap(), b"previous");
    assert!(!partial(&out_path).exists());
}

#[test]
fn an_out_that_is_not_a_regular_file_is_refused_before_building() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("f"), b"x").unwrap();
    let out = build(&["--rootfs", dir.to_str().unwrap()], Path::new("/dev/null"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/dev/null: exists and is not a regular file (a character device)"),
        "{}",
        stderr(&out)
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn bad_sources_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("x.img");
    let missing = tmp.path().join("no-such-layout");

    let out = build(
        &["--oci", &format!("{}:latest", missing.display())],
        &out_path,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(
        err.contains("not an OCI image layout: no such directory"),
        "{err}"
    );
    assert!(!out_path.exists());

    let layout = etcd_layout();
    let out = build(&["--oci", &oci_ref(&layout, "v9")], &out_path);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(r#"no image tagged "v9""#),
        "{}",
        stderr(&out)
    );

    let out = build(&["--rootfs", missing.to_str().unwrap()], &out_path);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no-such-layout"), "{}", stderr(&out));

    // Exactly one source.
    let d = tmp.path().to_str().unwrap();
    let r = oci_ref(&layout, "latest");
    assert_ne!(
        build(&["--oci", &r, "--rootfs", d], &out_path)
            .status
            .code(),
        Some(0)
    );
    assert_ne!(build(&[], &out_path).status.code(), Some(0));
    assert!(!out_path.exists());
}
