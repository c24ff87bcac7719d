//! Properties the way unmodified Antithesis SDK users write them, end to
//! end: the published Rust SDK (`examples/sdk-rust`) reporting through
//! detvisor's libvoidstar shim with no environment variable set,
//! `detvisor-assert` from a shell, history lines on stdout, and the
//! `ANTITHESIS_SDK_LOCAL_OUTPUT` fallback files, all read back from
//! `detvisor up --records FILE`.

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
    // Beside the workspace's own build (scripts/test keeps it in the cache).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("sdk-rust");
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
    install_libs(root, program);
}

/// Copies every shared library `ldd` names for `program` into `root`, each
/// at its own path.
fn install_libs(root: &Path, program: &Path) {
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
/// printing a history line; n3 writes the SDKs' fallback file (as a
/// program that cannot load libvoidstar would). The run ends when all
/// have ended.
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

[[node]]
name = "n3"
rootfs = "root"
env = { ANTITHESIS_SDK_LOCAL_OUTPUT = "/sdk-local.jsonl" }
command = ["sh", "-c", "echo '{\"local\":{\"n\":3}}' > /sdk-local.jsonl; sleep 1; echo '{\"local\":{\"n\":4}}' >> /sdk-local.jsonl"]
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

    // The fallback file, read while n3 ran and after it ended.
    let n3 = sdk_of(&a, "n3");
    assert_eq!(
        n3,
        vec![
            serde_json::json!({"local": {"n": 3}}),
            serde_json::json!({"local": {"n": 4}})
        ]
    );

    // Same seed: the same records, the same random values.
    let (_, b) = run("5", "b.jsonl", &[]);
    assert_eq!(a, b, "same seed, same records");
    // Another seed: other random values.
    let (_, d) = run("6", "d.jsonl", &[]);
    assert_ne!(drawn(&sdk_of(&a, "n1")), drawn(&sdk_of(&d, "n1")));
    assert_ne!(a_shell_random, shell_random(&cluster.log("n2")));
}

/// The SDKs' fallback file wherever the documented variable may be set,
/// each written just before its writer ends: the workload in n1 names its
/// own only in `[workload].env`, and writes n1's (named in n1's `env`, on
/// its /tmp) last of all, the host ending the run at its end; n2 writes its
/// /tmp file and ends at once.
const FALLBACK_MANIFEST: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
env = { ANTITHESIS_SDK_LOCAL_OUTPUT = "/tmp/n1.jsonl" }
command = ["sleep", "1000"]

[[node]]
name = "n2"
rootfs = "root"
env = { ANTITHESIS_SDK_LOCAL_OUTPUT = "/tmp/n2.jsonl" }
command = ["sh", "-c", "sleep 0.5; echo '{\"n2\":1}' > $ANTITHESIS_SDK_LOCAL_OUTPUT"]

[workload]
node = "n1"
env = { ANTITHESIS_SDK_LOCAL_OUTPUT = "/tmp/workload.jsonl" }
command = ["sh", "-c", "sleep 1; echo '{\"workload\":1}' > $ANTITHESIS_SDK_LOCAL_OUTPUT; echo '{\"n1\":1}' > /tmp/n1.jsonl"]
"#;

#[test]
fn test_fallback_files_of_nodes_and_of_the_workload_arrive_up_to_their_ends() {
    let cluster = Cluster::new("sdk-fallback", FALLBACK_MANIFEST);
    let file = cluster.dir.join("records.jsonl");
    let path = file.display().to_string();
    let out = cluster.up(&["--seed", "1", "--until", "60s", "--records", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let records = records(&file);
    // The workload's records are its node's, as through libvoidstar; all
    // come before the workload's end, which ended the run.
    let mut n1 = sdk_of(&records, "n1");
    n1.sort_by_key(Value::to_string);
    assert_eq!(
        n1,
        vec![
            serde_json::json!({"n1": 1}),
            serde_json::json!({"workload": 1})
        ]
    );
    assert_eq!(sdk_of(&records, "n2"), vec![serde_json::json!({"n2": 1})]);
    let end = records
        .iter()
        .position(|r| r["body"]["event"]["event"] == "workload_exited")
        .expect("the workload's end");
    let last_sdk = records
        .iter()
        .rposition(|r| r["body"]["kind"] == "sdk")
        .expect("SDK records");
    assert!(last_sdk < end, "{records:?}");
}

/// A program on the Python SDK from PyPI (`antithesis`), unmodified.
const PYTHON_PROGRAM: &str = r#"
import sys
sys.path.insert(0, "/app/site")
from antithesis.assertions import always, sometimes, unreachable
from antithesis.lifecycle import setup_complete, send_event
from antithesis.random import get_random
always(True, "py always", {"k": 1})
sometimes(False, "py sometimes", None)
if len(sys.argv) > 100:
    unreachable("py never", None)
setup_complete({"from": "python"})
send_event("py_drew", {"value": get_random()})
"#;

/// The Python files and extension modules `program` imports on this host
/// (run with the SDK's local output going nowhere), for a minimal root.
fn python_closure(program: &Path, site: &Path) -> Vec<PathBuf> {
    let script = "import runpy, sys\n\
        runpy.run_path(sys.argv[1], run_name='__main__')\n\
        import encodings.utf_8, encodings.latin_1, encodings.ascii\n\
        for m in list(sys.modules.values()):\n\
        \x20   f = getattr(m, '__file__', None)\n\
        \x20   if f: print(f)\n";
    let out = std::process::Command::new("/usr/bin/python3.11")
        .args(["-S", "-c", script])
        .arg(program)
        .env("ANTITHESIS_SDK_LOCAL_OUTPUT", "/dev/null")
        .env("PYTHONPATH", site)
        .output()
        .expect("Debian's python3.11 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && !p.starts_with(site))
        .collect()
}

#[test]
fn test_python_sdk_from_pypi_reports_through_the_shim() {
    let cluster = Cluster::new(
        "sdk-python",
        "[[node]]\nname = \"py\"\nrootfs = \"root\"\ncommand = [\"/usr/bin/python3.11\", \"-S\", \"/app/prog.py\"]\n",
    );
    let root = cluster.dir.join("root");
    let wheels = cluster.dir.join("wheels");
    let status = std::process::Command::new("/usr/bin/python3.11")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        .args(["antithesis==0.4.0", "-d"])
        .arg(&wheels)
        .status()
        .expect("pip runs");
    assert!(status.success(), "pip download antithesis");
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel");
    let site = root.join("app/site");
    let status = std::process::Command::new("/usr/bin/python3.11")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&site)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(root.join("app/prog.py"), PYTHON_PROGRAM).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::copy("/usr/bin/python3.11", root.join("usr/bin/python3.11")).unwrap();
    install_libs(&root, Path::new("/usr/bin/python3.11"));
    for file in python_closure(&root.join("app/prog.py"), &site) {
        let target = root.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&file, &target).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        if file.extension().is_some_and(|e| e == "so") {
            install_libs(&root, &file);
        }
    }
    let file = cluster.dir.join("records.jsonl");
    let path = file.display().to_string();
    let out = cluster.up(&["--seed", "3", "--until", "60s", "--records", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let py = sdk_of(&records(&file), "py");
    assert!(
        py.iter()
            .any(|r| r["antithesis_sdk"]["language"]["name"] == "Python"),
        "{py:?}"
    );
    let always = asserts(&py, "py always", true);
    assert_eq!(always.len(), 1, "{py:?}");
    assert_eq!(always[0]["condition"], true);
    assert_eq!(always[0]["display_type"], "Always");
    assert_eq!(asserts(&py, "py sometimes", true)[0]["condition"], false);
    assert!(py
        .iter()
        .any(|r| r["antithesis_setup"]["details"]["from"] == "python"));
    assert!(py.iter().any(|r| r["py_drew"]["value"].is_u64()), "{py:?}");
}
