//! Reading OCI layouts: selection by tag and platform, blob verification, error reporting.

mod common;

use std::fs;

use common::*;
use image_builder::{
    flatten, parse_oci_ref, read_image, read_image_with, Compression, ImageError, OciRef,
    ReadOptions, REF_NAME_ANNOTATION,
};
use serde_json::json;

fn oci_ref(layout: &Layout, tag: Option<&str>) -> OciRef {
    OciRef {
        layout_dir: layout.dir().to_owned(),
        tag: tag.map(str::to_owned),
    }
}

fn single_image(layout: &Layout) -> serde_json::Value {
    let l1 = Tar::new()
        .dir("etc", 0o755)
        .file("etc/hostname", 0o644, b"etcd\n")
        .finish();
    layout.image(
        &[Layer::gzip(l1)],
        json!({
            "Entrypoint": ["/usr/local/bin/etcd"],
            "Cmd": ["--name", "n1"],
            "Env": ["PATH=/usr/local/bin:/usr/bin", "ETCD_DATA_DIR=/var/lib/etcd"],
            "WorkingDir": "/var/lib/etcd",
            "User": "1000:1000",
            "Labels": {"org.opencontainers.image.version": "3.5.9"},
        }),
    )
}

#[test]
fn reads_config_and_verified_layers() {
    let layout = Layout::new();
    let m = single_image(&layout);
    layout.write_index(vec![tagged(m.clone(), "latest")]);

    // Parsed from the CLI form, with and without the tag (a single image needs none).
    let with_tag = parse_oci_ref(&format!("{}:latest", layout.dir().display())).unwrap();
    let without = parse_oci_ref(&layout.dir().display().to_string()).unwrap();
    assert_eq!(without.tag, None);
    for r in [with_tag, without] {
        let (config, layers) = read_image(&r).unwrap();
        assert_eq!(config.entrypoint, ["/usr/local/bin/etcd"]);
        assert_eq!(config.cmd, ["--name", "n1"]);
        assert_eq!(config.argv(), ["/usr/local/bin/etcd", "--name", "n1"]);
        assert_eq!(config.env.len(), 2);
        assert_eq!(config.working_dir.as_deref(), Some("/var/lib/etcd"));
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.labels["org.opencontainers.image.version"], "3.5.9");
        assert_eq!(
            (config.os.as_str(), config.architecture.as_str()),
            ("linux", "amd64")
        );
        assert_eq!(config.manifest_digest, m["digest"].as_str().unwrap());
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0].compression, Compression::Gzip);
        assert!(layers[0].diff_id.is_some());
        let root = flatten(&layers).unwrap();
        assert_eq!(
            root.get("/etc/hostname").unwrap().data(),
            Some(&b"etcd\n"[..])
        );
    }
}

#[test]
fn tag_selects_the_right_manifest() {
    let layout = Layout::new();
    let v1 = layout.image(
        &[Layer::plain(
            Tar::new().file("version", 0o644, b"1").finish(),
        )],
        json!({"Cmd": ["v1"]}),
    );
    let v2 = layout.image(
        &[Layer::zstd(
            Tar::new().file("version", 0o644, b"2").finish(),
        )],
        json!({"Cmd": ["v2"]}),
    );
    // A full reference in the containerd annotation also matches by its tag.
    let mut v3 = layout.image(
        &[Layer::plain(
            Tar::new().file("version", 0o644, b"3").finish(),
        )],
        json!({"Cmd": ["v3"]}),
    );
    v3["annotations"] = json!({"io.containerd.image.name": "docker.io/library/etcd:3.5"});
    layout.write_index(vec![tagged(v1, "v1"), tagged(v2, "v2"), v3]);

    for (tag, want) in [("v1", "1"), ("v2", "2"), ("3.5", "3")] {
        let (config, layers) = read_image(&oci_ref(&layout, Some(tag))).unwrap();
        assert_eq!(config.cmd, [format!("v{want}")]);
        let root = flatten(&layers).unwrap();
        assert_eq!(root.get("version").unwrap().data(), Some(want.as_bytes()));
    }

    match read_image(&oci_ref(&layout, Some("v9"))) {
        Err(e @ ImageError::TagNotFound { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("\"v9\"") && msg.contains("v1, v2"), "{msg}");
        }
        other => panic!("expected TagNotFound, got {other:?}"),
    }
    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::AmbiguousImage { .. }) => {
            assert!(e.to_string().contains("DIR:TAG"), "{e}");
        }
        other => panic!("expected AmbiguousImage, got {other:?}"),
    }
}

#[test]
fn nested_index_selects_linux_amd64() {
    let layout = Layout::new();
    let arm = layout.image_for(
        "arm64",
        &[Layer::gzip(
            Tar::new().file("arch", 0o644, b"arm64").finish(),
        )],
        json!({}),
    );
    let amd = layout.image(
        &[Layer::gzip(
            Tar::new().file("arch", 0o644, b"amd64").finish(),
        )],
        json!({}),
    );
    // A BuildKit attestation manifest rides along with platform unknown/unknown.
    let attestation = layout.image_for("unknown", &[], json!({}));
    let nested = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            with_platform(arm, "linux", "arm64"),
            with_platform(amd.clone(), "linux", "amd64"),
            with_platform(attestation, "unknown", "unknown"),
        ],
    });
    let index_desc = layout.json_blob(INDEX, &nested);
    layout.write_index(vec![tagged(index_desc, "latest")]);

    let (config, layers) = read_image(&oci_ref(&layout, Some("latest"))).unwrap();
    assert_eq!(config.manifest_digest, amd["digest"].as_str().unwrap());
    let root = flatten(&layers).unwrap();
    assert_eq!(root.get("arch").unwrap().data(), Some(&b"amd64"[..]));
    // Also without a tag: one image, several platforms.
    assert!(read_image(&oci_ref(&layout, None)).is_ok());
}

#[test]
fn missing_platform_and_wrong_platform() {
    let layout = Layout::new();
    let arm = layout.image_for("arm64", &[], json!({}));
    let s390 = layout.image_for("s390x", &[], json!({}));
    let nested = json!({"schemaVersion": 2, "manifests": [
        with_platform(arm.clone(), "linux", "arm64"),
        with_platform(s390, "linux", "s390x"),
    ]});
    let idx = layout.json_blob(INDEX, &nested);
    layout.write_index(vec![tagged(idx, "multi"), tagged(arm, "arm")]);
    match read_image(&oci_ref(&layout, Some("multi"))) {
        Err(e @ ImageError::PlatformNotFound { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("linux/amd64") && msg.contains("linux/arm64"),
                "{msg}"
            );
        }
        other => panic!("expected PlatformNotFound, got {other:?}"),
    }
    assert!(matches!(
        read_image(&oci_ref(&layout, Some("arm"))),
        Err(ImageError::WrongPlatform { .. })
    ));
}

#[test]
fn docker_media_types_are_accepted() {
    let layout = Layout::new();
    let tar = Tar::new().file("hello", 0o644, b"docker").finish();
    let layer = layout.blob(
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        &gzip(&tar),
    );
    let config = layout.json_blob(
        "application/vnd.docker.container.image.v1+json",
        &json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Cmd": ["/hello"], "Env": null, "ExposedPorts": {"2379/tcp": {}}},
            "container_config": {"Hostname": "x"},
            "rootfs": {"type": "layers", "diff_ids": [image_builder::sha256_digest(&tar)]},
        }),
    );
    let manifest = layout.json_blob(
        "application/vnd.docker.distribution.manifest.v2+json",
        &json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": config, "layers": [layer],
        }),
    );
    let mut desc = manifest;
    desc["annotations"] = json!({
        "io.containerd.image.name": "docker.io/library/hello:latest",
        REF_NAME_ANNOTATION: "latest",
    });
    layout.write_index(vec![desc]);
    let (config, layers) = read_image(&oci_ref(&layout, Some("latest"))).unwrap();
    assert_eq!(config.cmd, ["/hello"]);
    assert!(config.env.is_empty());
    assert_eq!(
        flatten(&layers).unwrap().get("hello").unwrap().data(),
        Some(&b"docker"[..])
    );
}

#[test]
fn corrupted_blob_gives_digest_error() {
    let layout = Layout::new();
    let m = single_image(&layout);
    layout.write_index(vec![m.clone()]);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.blob_path(m["digest"].as_str().unwrap())).unwrap())
            .unwrap();
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap().to_owned();
    let path = layout.blob_path(&layer_digest);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // same size, other content
    fs::write(&path, &bytes).unwrap();

    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::DigestMismatch { .. }) => {
            let ImageError::DigestMismatch {
                expected, actual, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(expected, &layer_digest);
            assert_eq!(actual, &image_builder::sha256_digest(&bytes));
            let msg = e.to_string();
            assert!(
                msg.contains(&layer_digest) && msg.contains(actual.as_str()),
                "{msg}"
            );
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }

    // Truncated: a size error naming both sizes.
    fs::write(&path, &bytes[..10]).unwrap();
    match read_image(&oci_ref(&layout, None)) {
        Err(ImageError::SizeMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(actual, 10);
            assert_eq!(expected, bytes.len() as u64);
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }

    // Missing: the error names the path.
    fs::remove_file(&path).unwrap();
    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::MissingBlob { .. }) => {
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        other => panic!("expected MissingBlob, got {other:?}"),
    }

    // A FIFO in its place is refused at once (reading it would hang the build).
    let status = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let reference = oci_ref(&layout, None);
    std::thread::spawn(move || tx.send(read_image(&reference).map(|_| ())).unwrap());
    match rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the read hung")
    {
        Err(e @ ImageError::Read(_)) => {
            assert!(
                e.to_string().ends_with("not a regular file (a FIFO)"),
                "{e}"
            );
        }
        other => panic!("expected Read, got {other:?}"),
    }
}

#[test]
fn bad_json_unknown_media_type_and_bad_layouts() {
    // Bad JSON in index.json names the file.
    let layout = Layout::new();
    fs::write(
        layout.dir().join("index.json"),
        b"{\"schemaVersion\": 2, \"manifests\": [",
    )
    .unwrap();
    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::Json { .. }) => assert!(e.to_string().contains("index.json"), "{e}"),
        other => panic!("expected Json, got {other:?}"),
    }

    // A manifest blob with the right digest but not a manifest.
    let not_json = layout.blob(MANIFEST, b"this is not json");
    layout.write_index(vec![not_json.clone()]);
    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::Json { .. }) => {
            let hex = not_json["digest"]
                .as_str()
                .unwrap()
                .split_once(':')
                .unwrap()
                .1;
            assert!(e.to_string().contains(hex), "{e}");
        }
        other => panic!("expected Json, got {other:?}"),
    }

    // A layer of an unknown media type.
    let layout = Layout::new();
    let config = layout.json_blob(
        CONFIG,
        &json!({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}),
    );
    let layer = layout.blob("application/x-squashfs", b"hsqs");
    let manifest = layout.json_blob(
        MANIFEST,
        &json!({"schemaVersion": 2, "config": config, "layers": [layer]}),
    );
    layout.write_index(vec![manifest]);
    match read_image(&oci_ref(&layout, None)) {
        Err(e @ ImageError::UnknownMediaType { .. }) => {
            assert!(e.to_string().contains("application/x-squashfs"), "{e}")
        }
        other => panic!("expected UnknownMediaType, got {other:?}"),
    }

    // Not a layout at all.
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(
        read_image(&OciRef {
            layout_dir: empty.path().to_owned(),
            tag: None
        }),
        Err(ImageError::NotAnOciLayout { .. })
    ));
    // A digest that would walk out of blobs/ is refused by the schema.
    let layout = Layout::new();
    layout.write_index(vec![json!({
        "mediaType": MANIFEST, "digest": "sha256:../../../../etc/passwd", "size": 10
    })]);
    assert!(matches!(
        read_image(&oci_ref(&layout, None)),
        Err(ImageError::Json { .. })
    ));
}

#[test]
fn diff_id_mismatch_is_caught_while_flattening() {
    let layout = Layout::new();
    let m = single_image(&layout);
    layout.write_index(vec![m]);
    let (_, mut layers) = read_image(&oci_ref(&layout, None)).unwrap();
    layers[0].diff_id = Some(image_builder::sha256_digest(b"something else"));
    assert!(matches!(
        flatten(&layers),
        Err(ImageError::DiffIdMismatch { .. })
    ));
}

#[test]
fn blob_and_json_size_limits() {
    let layout = Layout::new();
    let m = single_image(&layout);
    layout.write_index(vec![m]);
    let tiny_blobs = ReadOptions {
        max_blob_size: 8,
        ..Default::default()
    };
    match read_image_with(&oci_ref(&layout, None), &tiny_blobs) {
        Err(e @ ImageError::TooLarge { .. }) => {
            assert!(e.to_string().contains("blob sha256:"), "{e}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let tiny_json = ReadOptions {
        max_json_size: 40, // oci-layout fits, index.json does not
        ..Default::default()
    };
    match read_image_with(&oci_ref(&layout, None), &tiny_json) {
        Err(e @ ImageError::TooLarge { .. }) => {
            assert!(e.to_string().contains("index.json"), "{e}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}
