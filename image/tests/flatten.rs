//! Applying layers: whiteouts, opaque directories, hardlinks, metadata, and hostile archives.

mod common;

use common::*;
use image_builder::{
    flatten, flatten_with, DevicePolicy, FlattenOptions, ImageError, LayerBlob, NodeKind, RootFs,
};

fn layer(media_type: &str, blob: Vec<u8>) -> LayerBlob {
    LayerBlob::new(media_type, blob).unwrap()
}

fn paths(root: &RootFs) -> Vec<&str> {
    root.entries().map(|(p, _)| p).collect()
}

#[test]
fn two_layers_with_whiteout_and_opaque_dir() {
    let lower = Tar::new()
        .dir("./", 0o755)
        .dir("./etc/", 0o755)
        .file("./etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .file("./etc/motd", 0o644, b"old motd")
        .dir("./opt/", 0o755)
        .dir("./opt/app/", 0o750)
        .file("./opt/app/one", 0o644, b"1")
        .dir("./opt/app/sub/", 0o755)
        .file("./opt/app/sub/deep", 0o644, b"deep")
        .dir("./var/", 0o755)
        .dir("./var/cache/", 0o755)
        .file("./var/cache/big", 0o644, b"cache")
        .file("./tmpfile", 0o600, b"tmp")
        .finish();
    let upper = Tar::new()
        // Whiteouts may come after the entries of their directory: still applied first.
        .dir("opt/app", 0o755)
        .file("opt/app/two", 0o644, b"2")
        .opaque("opt/app")
        .whiteout("etc", "motd")
        .whiteout("var", "cache")
        .whiteout("", "tmpfile")
        .file("etc/passwd", 0o600, b"root:x:0:0::/root:/bin/ash\n")
        // A whiteout of a name created in the same layer does not hide it.
        .file("etc/new", 0o644, b"new")
        .whiteout("etc", "new")
        // A whiteout of something that never existed is harmless.
        .whiteout("nowhere", "nothing")
        .finish();
    let layers = [layer(TAR_GZIP, gzip(&lower)), layer(TAR_ZSTD, zstd(&upper))];
    let root = flatten(&layers).unwrap();
    assert_eq!(
        paths(&root),
        [
            "etc",
            "etc/new",
            "etc/passwd",
            "opt",
            "opt/app",
            "opt/app/two",
            "var"
        ]
    );
    let passwd = root.get("/etc/passwd").unwrap();
    assert_eq!(passwd.data(), Some(&b"root:x:0:0::/root:/bin/ash\n"[..]));
    assert_eq!(passwd.mode, 0o600);
    assert_eq!(
        root.get("opt/app").unwrap().mode,
        0o755,
        "dir attributes replaced"
    );
    assert!(root.get("etc/.wh.motd").is_none(), "whiteouts are hidden");

    // A third, uncompressed layer deletes a whole directory and recreates a file in it.
    let third = Tar::new()
        .whiteout("", "opt")
        .file("opt/fresh", 0o644, b"f")
        .finish();
    let mut all = layers.to_vec();
    all.push(layer(TAR, third));
    let root = flatten(&all).unwrap();
    assert_eq!(
        paths(&root),
        ["etc", "etc/new", "etc/passwd", "opt", "opt/fresh", "var"]
    );
    assert_eq!(root.get("opt").unwrap().mode, 0o755, "implicit parent");
}

#[test]
fn metadata_links_devices_and_replacement() {
    let l1 = Tar::new()
        .dir("usr", 0o755)
        .dir("usr/bin", 0o755)
        .file_owned("usr/bin/su", 0o4755, 0, 0, b"su")
        .file_owned("home/user/.profile", 0o640, 1000, 100, b"profile")
        .hardlink("usr/bin/su-link", "usr/bin/su")
        .symlink("bin", "usr/bin")
        .device("dev/null", true, 1, 3)
        .device("dev/sda", false, 8, 0)
        .fifo("run/fifo")
        .file("replace-me", 0o644, b"file")
        .finish();
    let l2 = Tar::new()
        // Entries through the merged-/usr symlink land in usr/bin.
        .file("bin/sh", 0o755, b"#!sh")
        // A hardlink to a file of the layer below, through the symlink.
        .hardlink("sh-link", "/bin/sh")
        // A directory replaces a file; a symlink replaces ... a symlink target is not written.
        .dir("replace-me", 0o700)
        .finish();
    let root = flatten(&[layer(TAR, l1), layer(TAR_GZIP, gzip(&l2))]).unwrap();

    let su = root.get("usr/bin/su").unwrap();
    assert_eq!((su.mode, su.uid, su.gid), (0o4755, 0, 0));
    assert_eq!(root.link_count("usr/bin/su"), Some(2));
    assert_eq!(
        root.get("usr/bin/su-link").unwrap().data(),
        Some(&b"su"[..])
    );
    let profile = root.get("home/user/.profile").unwrap();
    assert_eq!((profile.mode, profile.uid, profile.gid), (0o640, 1000, 100));
    assert_eq!(root.get("bin").unwrap().symlink_target(), Some("usr/bin"));
    assert_eq!(root.get("usr/bin/sh").unwrap().data(), Some(&b"#!sh"[..]));
    assert_eq!(root.get("bin/sh").unwrap().data(), Some(&b"#!sh"[..]));
    assert_eq!(root.link_count("sh-link"), Some(2));
    assert_eq!(
        root.get("dev/null").unwrap().kind,
        NodeKind::CharDevice { major: 1, minor: 3 }
    );
    assert_eq!(
        root.get("dev/sda").unwrap().kind,
        NodeKind::BlockDevice { major: 8, minor: 0 }
    );
    assert_eq!(root.get("run/fifo").unwrap().kind, NodeKind::Fifo);
    assert!(root.get("replace-me").unwrap().is_dir());

    // Device policies.
    let devs = Tar::new().device("dev/kmsg", true, 1, 11).finish();
    let skip = FlattenOptions {
        devices: DevicePolicy::Skip,
        ..Default::default()
    };
    let root = flatten_with(&[layer(TAR, devs.clone())], &skip).unwrap();
    assert!(root.get("dev/kmsg").is_none());
    let reject = FlattenOptions {
        devices: DevicePolicy::Reject,
        ..Default::default()
    };
    match flatten_with(&[layer(TAR, devs)], &reject) {
        Err(e @ ImageError::DeviceNodeRejected { .. }) => {
            assert!(e.to_string().contains("dev/kmsg"), "{e}")
        }
        other => panic!("expected DeviceNodeRejected, got {other:?}"),
    }
}

#[test]
fn mislabelled_compression_is_sniffed() {
    let tar = Tar::new().file("x", 0o644, b"x").finish();
    // gzip data under the uncompressed media type, and plain tar under +gzip.
    let a = layer(TAR, gzip(&tar));
    let b = layer(TAR_GZIP, tar.clone());
    for l in [a, b] {
        assert_eq!(
            flatten(&[l]).unwrap().get("x").unwrap().data(),
            Some(&b"x"[..])
        );
    }
}

/// Flattens a single hostile layer, checking nothing appears in a sentinel host directory.
fn hostile(tar: Vec<u8>) -> (Result<RootFs, ImageError>, String) {
    let l = layer(TAR_GZIP, gzip(&tar));
    let digest = l.digest.clone();
    (flatten(&[l]), digest)
}

fn expect_err(res: (Result<RootFs, ImageError>, String), entry: &str) -> ImageError {
    let (res, digest) = res;
    let err = res.expect_err("hostile layer must be rejected");
    let msg = err.to_string();
    assert!(msg.contains(&digest), "error must name the layer: {msg}");
    assert!(
        msg.contains(entry),
        "error must name the entry {entry:?}: {msg}"
    );
    err
}

#[test]
fn hostile_paths_are_rejected() {
    let host = tempfile::tempdir().unwrap();
    let host_path = host.path().display().to_string();
    let depth = "../".repeat(host.path().components().count() + 2);

    // Plain traversal.
    let e = expect_err(
        hostile(Tar::new().raw_file(b"../../etc/passwd", b"pwned").finish()),
        "../../etc/passwd",
    );
    assert!(matches!(e, ImageError::PathTraversal { .. }), "{e:?}");
    // Absolute path that normalises outside.
    let e = expect_err(
        hostile(Tar::new().raw_file(b"/abs/../../x", b"pwned").finish()),
        "/abs/../../x",
    );
    assert!(matches!(e, ImageError::PathTraversal { .. }), "{e:?}");
    // Climbing to the real sentinel directory of the host.
    let sneaky = format!("a/{depth}{}/pwned", host_path.trim_start_matches('/'));
    let e = expect_err(
        hostile(Tar::new().raw_file(sneaky.as_bytes(), b"pwned").finish()),
        &sneaky,
    );
    assert!(matches!(e, ImageError::PathTraversal { .. }), "{e:?}");

    // Absolute paths and `..` that stay inside are fine, relative to the image root.
    let (root, _) = hostile(
        Tar::new()
            .raw_file(b"/abs/../inside", b"ok")
            .raw_file(format!("{host_path}/pwned").as_bytes(), b"inside the tree")
            .finish(),
    );
    let root = root.unwrap();
    assert_eq!(root.get("inside").unwrap().data(), Some(&b"ok"[..]));
    assert!(root.get(&format!("{host_path}/pwned")).is_some());

    // Symlink parents leading out of the root.
    for (link, target) in [("up", "../../.."), ("up", "/../.."), ("up", "./../../x")] {
        let e = expect_err(
            hostile(
                Tar::new()
                    .symlink(link, target)
                    .file("up/evil", 0o644, b"x")
                    .finish(),
            ),
            "up/evil",
        );
        assert!(
            matches!(e, ImageError::SymlinkEscape { .. }),
            "{target}: {e:?}"
        );
        assert!(e.to_string().contains(target), "{e}");
    }
    // A symlink to the host's sentinel directory: resolved inside the tree, where it dangles.
    let e = expect_err(
        hostile(
            Tar::new()
                .symlink("link", &host_path)
                .file("link/pwned", 0o644, b"x")
                .finish(),
        ),
        "link/pwned",
    );
    assert!(matches!(e, ImageError::DanglingSymlink { .. }), "{e:?}");
    // Chains of links that go round.
    let e = expect_err(
        hostile(
            Tar::new()
                .symlink("a", "b")
                .symlink("b", "a")
                .file("a/x", 0o644, b"x")
                .finish(),
        ),
        "a/x",
    );
    assert!(matches!(e, ImageError::SymlinkLoop { .. }), "{e:?}");
    // A file as a parent.
    let e = expect_err(
        hostile(
            Tar::new()
                .file("f", 0o644, b"")
                .file("f/x", 0o644, b"")
                .finish(),
        ),
        "f/x",
    );
    assert!(matches!(e, ImageError::NotADirectory { .. }), "{e:?}");

    // Hardlinks out of the root, through an escaping symlink, or to nothing.
    let e = expect_err(
        hostile(Tar::new().hardlink("h", "../../etc/shadow").finish()),
        "../../etc/shadow",
    );
    assert!(matches!(e, ImageError::HardlinkEscape { .. }), "{e:?}");
    let e = expect_err(
        hostile(
            Tar::new()
                .symlink("up", "../..")
                .hardlink("h", "up/etc/shadow")
                .finish(),
        ),
        "up/etc/shadow",
    );
    assert!(matches!(e, ImageError::HardlinkEscape { .. }), "{e:?}");
    let e = expect_err(
        hostile(Tar::new().hardlink("h", "/etc/passwd").finish()),
        "/etc/passwd",
    );
    assert!(
        matches!(e, ImageError::HardlinkTargetMissing { .. }),
        "{e:?}"
    );
    let e = expect_err(
        hostile(
            Tar::new()
                .hardlink("h", "later")
                .file("later", 0o644, b"")
                .finish(),
        ),
        "later",
    );
    assert!(
        matches!(e, ImageError::HardlinkTargetMissing { .. }),
        "{e:?}"
    );

    // Names that are not UTF-8.
    let e = hostile(Tar::new().raw_file(b"bad\xffname", b"").finish())
        .0
        .unwrap_err();
    assert!(matches!(e, ImageError::InvalidEntry { .. }), "{e:?}");

    // Nothing at all reached the host.
    assert_eq!(std::fs::read_dir(host.path()).unwrap().count(), 0);
}

#[test]
fn symlink_to_etc_resolves_inside_the_tree() {
    let before = std::fs::read("/etc/passwd").ok();
    let tar = Tar::new()
        .dir("etc", 0o755)
        .file("etc/passwd", 0o644, b"image passwd")
        .symlink("link", "/etc")
        .file("link/passwd", 0o644, b"written through link")
        .finish();
    let root = flatten(&[layer(TAR, tar)]).unwrap();
    assert_eq!(
        root.get("etc/passwd").unwrap().data(),
        Some(&b"written through link"[..])
    );
    assert_eq!(root.get("link").unwrap().symlink_target(), Some("/etc"));
    assert_eq!(paths(&root), ["etc", "etc/passwd", "link"]);
    assert_eq!(std::fs::read("/etc/passwd").ok(), before, "host untouched");
}

#[test]
fn absurd_sizes_are_rejected() {
    // A header claiming a huge file (with no data behind it).
    let tar = Tar::new().lying_size("huge", 1 << 40).finish();
    let e = flatten(&[layer(TAR, tar)]).unwrap_err();
    assert!(
        matches!(e, ImageError::TooLarge { what: "file size (bytes)", size, .. } if size == 1 << 40),
        "{e:?}"
    );

    // A decompression bomb: 8 MiB of zeros in a small gzip, under a 1 MiB stream limit.
    let tar = Tar::new()
        .file("zeros", 0o644, &vec![0u8; 8 << 20])
        .finish();
    let blob = gzip(&tar);
    assert!(blob.len() < 64 << 10);
    let small = FlattenOptions {
        max_layer_size: 1 << 20,
        ..Default::default()
    };
    let e = flatten_with(&[layer(TAR_GZIP, blob.clone())], &small).unwrap_err();
    assert!(
        matches!(
            e,
            ImageError::TooLarge {
                what: "uncompressed layer stream (bytes)",
                ..
            }
        ),
        "{e:?}"
    );
    // ... and under a per-file and a total limit.
    let small = FlattenOptions {
        max_file_size: 1 << 20,
        ..Default::default()
    };
    assert!(matches!(
        flatten_with(&[layer(TAR_GZIP, blob.clone())], &small),
        Err(ImageError::TooLarge {
            what: "file size (bytes)",
            ..
        })
    ));
    let small = FlattenOptions {
        max_total_size: 12 << 20,
        ..Default::default()
    };
    let l = layer(TAR_GZIP, blob);
    assert!(flatten_with(std::slice::from_ref(&l), &small).is_ok());
    assert!(matches!(
        flatten_with(&[l.clone(), l], &small),
        Err(ImageError::TooLarge { .. })
    ));

    // Too many entries.
    let mut t = Tar::new();
    for i in 0..20 {
        t = t.file(&format!("f{i}"), 0o644, b"");
    }
    let few = FlattenOptions {
        max_entries: 10,
        ..Default::default()
    };
    assert!(matches!(
        flatten_with(&[layer(TAR, t.finish())], &few),
        Err(ImageError::TooLarge { .. })
    ));
}

#[test]
fn corrupt_streams_are_reported() {
    let tar = Tar::new().file("x", 0o644, b"hello").finish();
    let mut gz = gzip(&tar);
    gz.truncate(gz.len() / 2);
    assert!(matches!(
        flatten(&[layer(TAR_GZIP, gz)]),
        Err(ImageError::LayerRead { .. })
    ));
    let mut zs = zstd(&tar);
    let n = zs.len();
    zs[n / 2..].fill(0xAA);
    assert!(matches!(
        flatten(&[layer(TAR_ZSTD, zs)]),
        Err(ImageError::LayerRead { .. })
    ));
    assert!(matches!(
        LayerBlob::new("application/octet-stream", vec![]),
        Err(ImageError::UnknownMediaType { .. })
    ));
}
