//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

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

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
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
