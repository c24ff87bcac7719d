//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

pub mod cluster;
pub mod coin;
pub mod counted;
pub mod images;
pub mod stale;

use std::process::{Command, Output};

/// Runs the detvisor binary and echoes what it did (shown when a test fails).
pub fn detvisor(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(args)
        .output()
        .expect("detvisor starts");
    eprintln!(
        "$ detvisor {}\n--- status: {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the detvisor binary with `input` on its stdin (then end of input).
pub fn detvisor_with_input(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("detvisor starts");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input)
        .expect("writing detvisor's stdin");
    let out = child.wait_with_output().expect("detvisor ends");
    eprintln!(
        "$ detvisor {} < {:?}\n--- status: {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        args.join(" "),
        String::from_utf8_lossy(input),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `branch SPEC --seeds 1..2 --in-place` in one worker (seed 2 runs after a
/// reset from seed 1's history); checks it succeeded and returns its report's
/// `branches`, in seed order.
pub fn branch_seeds_1_2_in_place(spec: &str) -> Vec<serde_json::Value> {
    let out = detvisor(&[
        "branch",
        spec,
        "--seeds",
        "1..2",
        "--jobs",
        "1",
        "--in-place",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // A line per seed as its branch ends (stderr is not a terminal).
    let told = stderr(&out);
    let seeds: Vec<&str> = told
        .lines()
        .filter(|l| l.starts_with("detvisor: seed "))
        .collect();
    assert_eq!(seeds.len(), 2, "{told}");
    assert!(
        seeds[0].starts_with("detvisor: seed 1 (1/2, ETA "),
        "{told}"
    );
    assert!(seeds[1].starts_with("detvisor: seed 2 (2/2): "), "{told}");
    let branches = summary(&out)["branches"]
        .as_array()
        .expect("a report with branches")
        .clone();
    assert_eq!(branches.len(), 2);
    assert_eq!(branches[0]["seed"], 1);
    assert_eq!(branches[1]["seed"], 2);
    branches
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The default guest's first second, saved in `snaps` at exit `exit`
/// (`extra`: more `run` arguments): the run's digest.
pub fn boot_saved_at_exit(snaps: &str, exit: u64, extra: &[&str]) -> String {
    let exit = exit.to_string();
    let mut args = vec![
        "run",
        "--until",
        "1s",
        "--snapshots",
        snaps,
        "--snapshot-at-exit",
        &exit,
        "--json",
    ];
    args.extend(extra);
    let run = detvisor(&args);
    // 124: stopped at the time limit.
    assert_eq!(run.status.code(), Some(124), "{}", stderr(&run));
    summary(&run)["digest"].as_str().unwrap().to_owned()
}

/// The JSON summary `run --json` prints as its last stdout line.
pub fn summary(out: &Output) -> serde_json::Value {
    let text = stdout(out);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON summary in stdout: {text}"));
    serde_json::from_str(line).expect("summary is JSON")
}

/// A fresh scratch directory for the test `name` (this process's own).
#[allow(dead_code)]
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("detvisor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Assembles the bare guest `tests/guests/NAME.S` (booted like a vmlinux,
/// text at 0x200000) into `dir/NAME.elf`.
#[allow(dead_code)]
pub fn assemble_bare_guest(name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let elf = dir.join(format!("{name}.elf"));
    let source =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/guests/{name}.S"));
    let status = std::process::Command::new("gcc")
        .args(["-nostdlib", "-static", "-no-pie"])
        .args(["-Wl,-Ttext=0x200000", "-Wl,--build-id=none", "-o"])
        .arg(&elf)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "assembling {} failed", source.display());
    elf
}
