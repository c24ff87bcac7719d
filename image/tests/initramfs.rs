//! The reproducible newc + gzip output.

mod common;

use common::*;
use image_builder::{
    flatten, read_image, write_cpio, write_initramfs, LayerBlob, Node, OciRef, RootFs,
};
use serde_json::json;

fn sample_tree() -> RootFs {
    let l1 = Tar::new()
        .dir("./", 0o755)
        .dir("etc", 0o755)
        .file("etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file("usr/bin/busybox", 0o4755, b"\x7fELF busybox")
        .hardlink("usr/bin/ls", "usr/bin/busybox")
        .hardlink("usr/bin/cat", "usr/bin/busybox")
        .symlink("bin", "usr/bin")
        .device("dev/console", true, 5, 1)
        .file_owned("home/app/data", 0o600, 1000, 1000, b"abc")
        .finish();
    let l2 = Tar::new()
        .whiteout("etc", "passwd")
        .file("etc/hosts", 0o644, b"127.0.0.1 localhost\n")
        .finish();
    let mut root = flatten(&[
        LayerBlob::new(TAR_GZIP, gzip(&l1)).unwrap(),
        LayerBlob::new(TAR_ZSTD, zstd(&l2)).unwrap(),
    ])
    .unwrap();
    root.add_file("/sbin/detvisor-agent", 0o755, b"\x7fELF agent".to_vec())
        .unwrap();
    root.add_dir("/run/detvisor", 0o700).unwrap();
    root.add_symlink("/init", "/sbin/detvisor-agent").unwrap();
    root
}

fn build(root: &RootFs) -> Vec<u8> {
    let mut out = Vec::new();
    write_initramfs(root, &mut out).unwrap();
    out
}

#[test]
fn initramfs_is_byte_identical_and_parses_back() {
    let root = sample_tree();
    let a = build(&root);
    let b = build(&root);
    assert_eq!(a, b, "two runs, same bytes");
    // The same tree built again from scratch gives the same bytes too.
    assert_eq!(a, build(&sample_tree()));

    // gzip header: magic, deflate, no flags (no name/comment), mtime 0, OS 255.
    assert_eq!(&a[..4], &[0x1f, 0x8b, 8, 0]);
    assert_eq!(&a[4..8], &[0, 0, 0, 0]);
    assert_eq!(a[9], 255);

    let cpio = gunzip(&a);
    let mut plain = Vec::new();
    write_cpio(&root, &mut plain).unwrap();
    assert_eq!(cpio, plain, "write_initramfs = gzip(write_cpio)");

    let entries = parse_cpio(&cpio);
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bin",
            "dev",
            "dev/console",
            "etc",
            "etc/hosts",
            "home",
            "home/app",
            "home/app/data",
            "init",
            "run",
            "run/detvisor",
            "sbin",
            "sbin/detvisor-agent",
            "usr",
            "usr/bin",
            "usr/bin/busybox",
            "usr/bin/cat",
            "usr/bin/ls",
        ]
    );
    let by = |n: &str| entries.iter().find(|e| e.name == n).unwrap();
    assert!(entries.iter().all(|e| e.mtime == 0));

    let agent = by("sbin/detvisor-agent");
    assert_eq!(agent.mode, 0o100755);
    assert_eq!(agent.data, b"\x7fELF agent");
    assert_eq!(by("init").mode, 0o120777);
    assert_eq!(by("init").data, b"/sbin/detvisor-agent");
    assert_eq!(by("bin").data, b"usr/bin");
    assert_eq!(by("run/detvisor").mode, 0o040700);
    assert_eq!(by("usr").nlink, 3, "2 + one subdirectory");
    let data = by("home/app/data");
    assert_eq!((data.mode, data.uid, data.gid), (0o100600, 1000, 1000));
    assert_eq!(data.data, b"abc");
    let console = by("dev/console");
    assert_eq!(console.mode, 0o020666);
    assert_eq!(console.rdev, (5, 1));

    // Hardlinks: one inode number, nlink 3, data only on the first path.
    let (bb, cat, ls) = (by("usr/bin/busybox"), by("usr/bin/cat"), by("usr/bin/ls"));
    assert_eq!(bb.mode, 0o104755);
    assert_eq!((bb.ino, bb.nlink), (cat.ino, 3));
    assert_eq!((ls.ino, ls.nlink), (bb.ino, 3));
    assert_eq!(bb.data, b"\x7fELF busybox");
    assert!(cat.data.is_empty() && ls.data.is_empty());

    // Inode numbers follow the sorted order: 1, 2, ... with the hardlinks sharing one.
    let mut inos: Vec<u32> = entries.iter().map(|e| e.ino).collect();
    inos.dedup();
    assert_eq!(inos, (1..=inos.len() as u32).collect::<Vec<_>>());
}

#[test]
fn insertion_order_does_not_matter() {
    let mut a = RootFs::new();
    a.add_file("z/last", 0o644, b"z".to_vec()).unwrap();
    a.add_file("a/first", 0o644, b"a".to_vec()).unwrap();
    a.add_node("a/owned", Node::file(0o640, b"o".to_vec()).owned_by(7, 8))
        .unwrap();
    let mut b = RootFs::new();
    b.add_node("a/owned", Node::file(0o640, b"o".to_vec()).owned_by(7, 8))
        .unwrap();
    b.add_file("a/first", 0o644, b"a".to_vec()).unwrap();
    b.add_file("z/last", 0o644, b"z".to_vec()).unwrap();
    assert_eq!(build(&a), build(&b));
    assert_ne!(build(&a), build(&RootFs::new()));
}

#[test]
fn empty_tree_is_just_a_trailer() {
    let cpio = gunzip(&build(&RootFs::new()));
    assert!(parse_cpio(&cpio).is_empty());
    assert!(cpio.starts_with(b"070701"));
}

/// The whole pipeline on a layout, and a cross-check with GNU cpio when it is installed.
#[test]
fn layout_to_initramfs_end_to_end() {
    let layout = Layout::new();
    let m = layout.image(
        &[
            Layer::gzip(
                Tar::new()
                    .dir("usr/local/bin", 0o755)
                    .file("usr/local/bin/etcd", 0o755, b"etcd binary")
                    .hardlink("usr/local/bin/etcd2", "usr/local/bin/etcd")
                    .finish(),
            ),
            Layer::zstd(
                Tar::new()
                    .file("etc/etcd.conf", 0o644, b"name: n1\n")
                    .finish(),
            ),
        ],
        json!({"Entrypoint": ["/usr/local/bin/etcd"]}),
    );
    layout.write_index(vec![tagged(m, "latest")]);
    let (config, layers) = read_image(&OciRef {
        layout_dir: layout.dir().to_owned(),
        tag: Some("latest".into()),
    })
    .unwrap();
    assert_eq!(config.entrypoint, ["/usr/local/bin/etcd"]);
    let mut root = flatten(&layers).unwrap();
    root.add_file("sbin/detvisor-agent", 0o755, b"agent".to_vec())
        .unwrap();
    let img = build(&root);
    assert_eq!(
        img,
        build(
            &flatten(&layers)
                .map(|mut r| {
                    r.add_file("sbin/detvisor-agent", 0o755, b"agent".to_vec())
                        .unwrap();
                    r
                })
                .unwrap()
        )
    );

    let cpio = gunzip(&img);
    let names: Vec<String> = parse_cpio(&cpio).into_iter().map(|e| e.name).collect();
    assert_eq!(
        names,
        [
            "etc",
            "etc/etcd.conf",
            "sbin",
            "sbin/detvisor-agent",
            "usr",
            "usr/local",
            "usr/local/bin",
            "usr/local/bin/etcd",
            "usr/local/bin/etcd2"
        ]
    );

    // GNU cpio, if present, unpacks it with the hardlink intact.
    if std::path::Path::new("/usr/bin/cpio").exists() {
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let out = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("/usr/bin/cpio")
            .args(["-i", "-d", "--quiet", "--no-absolute-filenames"])
            .current_dir(out.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&cpio).unwrap();
        assert!(child.wait().unwrap().success());
        let etcd = out.path().join("usr/local/bin/etcd");
        assert_eq!(std::fs::read(&etcd).unwrap(), b"etcd binary");
        let m1 = std::fs::metadata(&etcd).unwrap();
        let m2 = std::fs::metadata(out.path().join("usr/local/bin/etcd2")).unwrap();
        assert_eq!(m1.ino(), m2.ino());
        assert_eq!(m1.nlink(), 2);
        assert_eq!(m1.mode() & 0o7777, 0o755);
    }
}

/// `write_node_image_file` tells its progress: the layers read, each
/// layer applied with the bytes so far, then the finished tree.
#[test]
fn node_image_build_tells_layers_bytes_and_the_tree() {
    use image_builder::{write_node_image_file, BuildProgress, NodeImageSource};
    let layout = Layout::new();
    let m = layout.image(
        &[
            Layer::gzip(Tar::new().file("a", 0o644, b"first").finish()),
            Layer::zstd(Tar::new().file("b", 0o644, b"second").finish()),
        ],
        json!({}),
    );
    layout.write_index(vec![tagged(m, "latest")]);
    let out = layout.dir().join("node.img");
    let mut told = Vec::new();
    let source = NodeImageSource::Oci(format!("{}:latest", layout.dir().display()));
    let report = write_node_image_file(&source, &out, &mut |step| {
        told.push(match step {
            BuildProgress::Read { layers, bytes } => format!("read {layers} {bytes}"),
            BuildProgress::Layer {
                done,
                total,
                digest,
                bytes_done,
                bytes_total,
            } => {
                assert!(digest.starts_with("sha256:"), "{digest}");
                assert!(bytes_done <= bytes_total && bytes_done > 0);
                format!("layer {done}/{total} {}", bytes_done == bytes_total)
            }
            BuildProgress::Tree { entries } => format!("tree {entries}"),
        })
    })
    .unwrap();
    assert_eq!(told.len(), 4, "{told:?}");
    assert!(told[0].starts_with("read 2 "), "{told:?}");
    assert_eq!(told[1..3], ["layer 1/2 false", "layer 2/2 true"]);
    assert_eq!(told[3], format!("tree {}", report.entries));
}
