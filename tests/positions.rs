//! Instruction positions (`DIR@exit:N+insn:K`: K single steps after exit N,
//! vmm/src/vm/insn_steps.rs) on real KVM (the helper VM on hosts whose KVM
//! cannot run guests).
//!
//! A bare guest that counts its own instructions
//! (tests/guests/count_insns.S) says where every position is, and that the
//! trap flag stepping runs with never shows in what it saves. In the
//! default Linux guest, stepping is observation: a branch from the last
//! position of an interval ends exactly as the free run does, for an
//! interval that starts with a queued interrupt's delivery, one whose
//! interrupt waits for a window, and one after an idle HLT.

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Assembles the bare guest into `dir`; its path and the address of its
/// counted run.
fn build_guest(dir: &Path) -> (PathBuf, u64) {
    let elf = assemble_bare_guest("count_insns", dir);
    let nm = std::process::Command::new("nm")
        .arg(&elf)
        .output()
        .expect("nm runs");
    let symbols = String::from_utf8_lossy(&nm.stdout).into_owned();
    let counted = symbols
        .lines()
        .find_map(|l| l.strip_suffix(" T counted"))
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .unwrap_or_else(|| panic!("no `counted` in {symbols}"));
    (elf, counted)
}

/// `seek SPEC --json`'s report.
fn seek(spec: &str) -> Value {
    let out = detvisor(&["seek", spec, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{spec}: {}", stderr(&out));
    summary(&out)
}

/// The digest of a branch from `spec` run to its end (or `until`).
fn branch_digest(spec: &str, until: Option<&str>) -> String {
    let mut args = vec!["branch", spec, "--json"];
    args.extend(until.iter().flat_map(|u| ["--until", *u]));
    let out = detvisor(&args);
    // 124: stopped at the time limit.
    let expected = if until.is_some() { 124 } else { 0 };
    assert_eq!(
        out.status.code(),
        Some(expected),
        "{spec}: {}",
        stderr(&out)
    );
    summary(&out)["digest"].as_str().unwrap().to_owned()
}

/// The interval length `seek` names when asked for a position past it.
fn interval_after(spec_dir: &str, exit: u64) -> u64 {
    let spec = format!("{spec_dir}@exit:{exit}+insn:9999999");
    let out = detvisor(&["seek", &spec]);
    assert_ne!(out.status.code(), Some(0), "{spec} reached");
    let text = stderr(&out);
    let prefix = "the guest's next exit comes ";
    let rest = &text[text.find(prefix).unwrap_or_else(|| panic!("{text}")) + prefix.len()..];
    let steps: u64 = rest.split(' ').next().unwrap().parse().unwrap();
    assert!(
        text.contains(&format!(
            "single step(s) after exit {exit}: the positions between them are \
             exit:{exit}+insn:0 to exit:{exit}+insn:{steps}"
        )),
        "{text}"
    );
    steps
}

#[test]
fn test_positions_land_where_the_guest_counts_and_leave_no_trace() {
    let dir = scratch_dir("positions");
    let (elf, counted) = build_guest(&dir);
    let elf = elf.display().to_string();
    let snaps = dir.join("snaps").display().to_string();
    let run = detvisor(&[
        "run",
        "--kernel",
        &elf,
        "--until",
        "1s",
        "--snapshots",
        &snaps,
        "--snapshot-at-exit",
        "1",
        "--json",
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let free = summary(&run)["digest"].as_str().unwrap().to_owned();

    let regs = |report: &Value| report["regs"].clone();
    let reg = |report: &Value, name: &str| report["regs"][name].as_u64().unwrap();
    // Inside the counted run, each step one `inc %r15` (3 bytes).
    let k = 1000;
    let at = seek(&format!("{snaps}@exit:1+insn:{k}"));
    assert_eq!(at["exit_index"], 1, "{at}");
    assert_eq!(at["insn_steps"], k, "{at}");
    assert_eq!(reg(&at, "r15"), k, "{at}");
    assert_eq!(reg(&at, "rip"), counted + 3 * k, "{at}");
    assert_eq!(at["cpl"], 0, "{at}");
    // In the REP STOSB: 2000 incs, LEA and MOV, then 28 of its 40
    // iterations, one step each.
    let rep = seek(&format!("{snaps}@exit:1+insn:2030"));
    assert_eq!(reg(&rep, "r15"), 2000, "{rep}");
    assert_eq!(reg(&rep, "rcx"), 12, "{rep}");
    // After PUSHF and POP: the word PUSHF saved holds no trap flag, and the
    // position is the same machine every time it is reached.
    let popped = format!("{snaps}@exit:1+insn:2044");
    let (first, again) = (seek(&popped), seek(&popped));
    assert_eq!(reg(&first, "rax") & 0x100, 0, "{first}");
    assert_eq!(reg(&first, "rcx"), 0, "{first}");
    assert_eq!(regs(&first), regs(&again));
    assert_eq!(first["memory_hash"], again["memory_hash"]);
    assert!(first["memory_hash"].as_str().is_some_and(|h| !h.is_empty()));
    // The interval ends at the guest's next exit, 2046 steps on; a
    // position past it is refused, naming the interval.
    assert_eq!(interval_after(&snaps, 1), 2046);
    // Stepped to the interval's end and run on: the free run's history,
    // the guest's own status (the trap flag it read) included.
    assert_eq!(
        branch_digest(&format!("{snaps}@exit:1+insn:2046"), None),
        free
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn test_stepping_a_linux_guest_is_observation() {
    let dir = scratch_dir("positions-linux");
    let snaps = dir.join("snaps").display().to_string();
    let trace = dir.join("trace.jsonl");
    let trace_arg = trace.display().to_string();
    let free = boot_saved_at_exit(&snaps, 200, &["--trace", &trace_arg]);
    let exits: Vec<Value> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let index = |e: &Value| e["index"].as_u64().unwrap();
    let after = |pick: &dyn Fn(&Value) -> bool, what: &str| {
        exits
            .iter()
            .filter(|e| index(e) >= 200)
            .find(|e| pick(e))
            .map(|e| index(e) + 1)
            .unwrap_or_else(|| panic!("no exit {what} after exit 200"))
    };
    // The first exit that injected an interrupt (delivered at the next
    // entry), the first window-open exit's predecessor (its interrupt
    // waits for the guest), the first HLT that injected one (idle).
    let queued = after(
        &|e| !e["injected"].is_null() && e["kind"] != "Hlt",
        "injecting",
    );
    let window = after(&|e| e["kind"] == "IrqWindowOpen", "opening a window") - 1;
    let idle = after(&|e| !e["injected"].is_null() && e["kind"] == "Hlt", "idle");
    for exit in [queued, window, idle] {
        let steps = interval_after(&snaps, exit);
        assert!(steps > 0, "exit {exit}");
        let spec = format!("{snaps}@exit:{exit}+insn:{steps}");
        assert_eq!(branch_digest(&spec, Some("1s")), free, "{spec}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
