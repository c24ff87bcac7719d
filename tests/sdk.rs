//! Properties the way unmodified Antithesis SDK users write them, end to
//! end: the published Rust SDK (`examples/sdk-rust`) reporting through
//! detvisor's libvoidstar shim with no environment variable set,
//! `detvisor-assert` from a shell, and history lines on stdout, all read
//! back from `detvisor up --records FILE`.

mod common;

use common::cluster::Cluster;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Builds examples/sdk-rust (the published `antithesis_sdk` crate) and
/// returns the binary. Dynamically linked: the SDK loads the shim with
/// `dlopen`, which a static glibc program cannot do.
fn build_rust_example() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("target/sdk-rust");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(root.join("examples/sdk-rust/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building examples/sdk-rust");
    target.join("release/sdk-rust-example")
}

/// Copies `program` into `root` as /bin/`name` with every shared library
/// `ldd` names, each at its own path.
fn install_dynamic(root: &Path, program: &Path, name: &str) {
    std::fs::copy(program, root.join("bin").join(name)).unwrap();
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split_whitespace()
            .find(|word| word.starts_with('/'))
            .map(Path::new);
        if let Some(path) = path {
            let target = root.join(path.strip_prefix("/").unwrap());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::copy(path, &target).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        }
    }
}

/// n1 runs the Rust SDK program; n2 a shell using detvisor-assert and
/// printing a history line. The run ends when both have ended.
const MANIFEST: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sdk-rust-example"]

[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", """
detvisor-assert always 'shell always' --details '{"k":1}'
detvisor-assert sometimes 'shell sometimes' --condition false
detvisor-assert event shell_event '{"x":2}'
echo "random $(detvisor-assert random)"
echo '{"detvisor_history":{"process":1,"op":1,"type":"invoke","f":"put","key":"k","value":"v","time_ns":1}}'
detvisor-assert bogus; echo "bogus status $?"
"""]
"#;

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// The SDK records (`body.json`) of `node`.
fn sdk_of(records: &[Value], node: &str) -> Vec<Value> {
    records
        .iter()
        .filter(|r| r["node"] == node && r["body"]["kind"] == "sdk")
        .map(|r| r["body"]["json"].clone())
        .collect()
}

/// The `antithesis_assert` records with `id` and `hit`.
fn asserts<'a>(sdk: &'a [Value], id: &str, hit: bool) -> Vec<&'a Value> {
    sdk.iter()
        .map(|r| &r["antithesis_assert"])
        .filter(|a| a["id"] == id && a["hit"] == hit)
        .collect()
}

/// The value of the Rust program's `drew` event.
fn drawn(sdk: &[Value]) -> u64 {
    let drew: Vec<u64> = sdk
        .iter()
        .filter_map(|r| r["drew"]["value"].as_u64())
        .collect();
    assert_eq!(drew.len(), 1, "{sdk:?}");
    drew[0]
}

#[test]
fn test_sdk_records_arrive_through_the_shim_and_follow_the_seed() {
    let example = build_rust_example();
    let cluster = Cluster::new("sdk", MANIFEST);
    install_dynamic(&cluster.dir.join("root"), &example, "sdk-rust-example");
    let run = |seed: &str, name: &str, extra: &[&str]| {
        let file = cluster.dir.join(name);
        let path = file.display().to_string();
        let mut args = vec!["--seed", seed, "--until", "60s", "--records", &path];
        args.extend_from_slice(extra);
        let out = cluster.up(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        (out, records(&file))
    };
    // Two runs of seed 5, the second not collecting records: identical
    // digests, so collecting changes nothing in the run.
    let (out, a) = run("5", "a.jsonl", &["--runs", "2"]);
    assert!(
        stderr(&out).contains("setup complete"),
        "the Rust SDK's setup_complete is an event: {}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("identical: 2 runs"),
        "run 2 (not collecting) has run 1's digest: {}",
        stdout(&out)
    );

    // The Rust SDK, through the shim (no ANTITHESIS_SDK_LOCAL_OUTPUT).
    let n1 = sdk_of(&a, "n1");
    assert!(
        n1.iter()
            .any(|r| r["antithesis_sdk"]["language"]["name"] == "Rust"),
        "{n1:?}"
    );
    // The catalog: every assertion of the program, not hit.
    for id in [
        "always true",
        "always false",
        "sometimes true",
        "never reached",
    ] {
        assert_eq!(
            asserts(&n1, id, false).len(),
            1,
            "catalog entry {id}: {n1:?}"
        );
    }
    let never = asserts(&n1, "never reached", false)[0];
    assert_eq!(never["display_type"], "Unreachable");
    assert_eq!(never["assert_type"], "reachability");
    assert_eq!(never["must_hit"], false);
    assert!(asserts(&n1, "never reached", true).is_empty());
    for (id, display, kind, condition) in [
        ("always true", "Always", "always", true),
        ("always false", "Always", "always", false),
        ("sometimes true", "Sometimes", "sometimes", true),
    ] {
        let hit = asserts(&n1, id, true);
        assert_eq!(hit.len(), 1, "{id}: {n1:?}");
        assert_eq!(hit[0]["display_type"], display, "{id}");
        assert_eq!(hit[0]["assert_type"], kind, "{id}");
        assert_eq!(hit[0]["condition"], condition, "{id}");
        assert_eq!(hit[0]["must_hit"], true, "{id}");
        assert_eq!(hit[0]["message"], id);
    }
    assert!(
        n1.iter()
            .any(|r| r["antithesis_setup"]["status"] == "complete"
                && r["antithesis_setup"]["details"]["ready"] == true),
        "{n1:?}"
    );
    assert!(a
        .iter()
        .any(|r| r["body"]["kind"] == "event" && r["body"]["event"]["event"] == "setup_complete"));

    // detvisor-assert, from n2's shell.
    let n2 = sdk_of(&a, "n2");
    let shell = asserts(&n2, "shell always", true);
    assert_eq!(shell.len(), 1, "{n2:?}");
    assert_eq!(shell[0]["details"]["k"], 1);
    assert_eq!(shell[0]["display_type"], "Always");
    let sometimes = asserts(&n2, "shell sometimes", true);
    assert_eq!(sometimes[0]["condition"], false);
    assert!(n2.iter().any(|r| r["shell_event"]["x"] == 2), "{n2:?}");
    let log = cluster.log("n2");
    assert!(log.contains("bogus status 2"), "{log}");
    let shell_random = |log: &str| -> u64 {
        log.lines()
            .find_map(|l| l.strip_prefix("random "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no random line: {log}"))
    };
    let a_shell_random = shell_random(&log);

    // The history line, as a record of n2 (and still in its output).
    let history: Vec<&Value> = a
        .iter()
        .filter(|r| r["body"]["kind"] == "history")
        .collect();
    assert_eq!(history.len(), 1, "{a:?}");
    assert_eq!(history[0]["node"], "n2");
    assert_eq!(history[0]["body"]["json"]["f"], "put");
    assert!(log.contains("{\"detvisor_history\""), "{log}");

    // Same seed: the same records, the same random values.
    let (_, b) = run("5", "b.jsonl", &[]);
    assert_eq!(a, b, "same seed, same records");
    // Another seed: other random values.
    let (_, d) = run("6", "d.jsonl", &[]);
    assert_ne!(drawn(&sdk_of(&a, "n1")), drawn(&sdk_of(&d, "n1")));
    assert_ne!(a_shell_random, shell_random(&cluster.log("n2")));
}
