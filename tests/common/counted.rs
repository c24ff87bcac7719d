//! What tests/step_clock.rs and tests/pmu_clock.rs check the counting
//! clocks with: tests/guests/count_insns.S, which knows how many
//! instructions it runs, and tests/guests/step_clock.S's printed count.

use super::{assemble_bare_guest, detvisor, stderr, stdout, summary};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// Instructions count_insns.S runs: CLI, LEA, XOR and the OUT of exit 1;
/// its interval of 2046 steps (tests/positions.rs); then the OUT of exit 2,
/// the MOV and the OUT that ends it.
pub const COUNT_GUEST_INSTRUCTIONS: u64 = 4 + 2046 + 3;
/// The instructions before exit 1's.
pub const BEFORE_EXIT_1: u64 = 4;

/// The summary of a command that must have succeeded.
pub fn json_of(out: &Output, what: &str) -> Value {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(out));
    summary(out)
}

/// The count step_clock.S's handler printed (`count=` and hex).
pub fn printed_count(out: &Output) -> u64 {
    let text = stdout(out);
    text.lines()
        .find_map(|l| l.strip_prefix("count="))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap_or_else(|| panic!("no count printed: {text}"))
}

/// count_insns.S under the clock `clock_args` choose, which counts one
/// event per instruction at 1 ns: the run ends at the guest's own count;
/// `exit:1+insn:1000` after a restore reads R15 = 1000 at 1004 ns; the run
/// on from there has the free run's digest and time; the history's
/// snapshot names `made_with` (`state_marker` is in its state.bin), and a
/// branch of it with the `other` clock is refused, naming both.
pub fn check_count_guest(
    dir: &Path,
    clock_args: &[&str],
    made_with: &str,
    other: &str,
    state_marker: &str,
) {
    let elf = assemble_bare_guest("count_insns", dir)
        .display()
        .to_string();
    let snaps = dir.join("snaps").display().to_string();
    let mut args = vec!["run", "--kernel", &elf, "--until", "1s"];
    args.extend(clock_args);
    args.extend(["--snapshots", &snaps, "--snapshot-at-exit", "1", "--json"]);
    let run = json_of(&detvisor(&args), &format!("run {}", clock_args.join(" ")));
    assert_eq!(run["virtual_ns"], COUNT_GUEST_INSTRUCTIONS, "{run}");
    assert_eq!(run["stop"]["kind"], "guest_exit", "{run}");

    // A position's time is its instruction count too: 1000 `inc %r15`
    // after exit 1, reached from the snapshot there.
    let k = 1000;
    let at = format!("{snaps}@exit:1+insn:{k}");
    let seek = json_of(&detvisor(&["seek", &at, "--json"]), "seek");
    assert_eq!(seek["regs"]["r15"], k, "{seek}");
    assert_eq!(seek["virtual_ns"], BEFORE_EXIT_1 + k, "{seek}");

    // Run on from there: the same history as the free run.
    let branch = json_of(&detvisor(&["branch", &at, "--json"]), "branch");
    assert_eq!(branch["digest"], run["digest"], "{branch}");
    assert_eq!(branch["virtual_ns"], COUNT_GUEST_INSTRUCTIONS, "{branch}");

    // One history keeps one clock: another is refused here.
    let out = detvisor(&["branch", &format!("{snaps}@exit:1"), "--clock", other]);
    assert_ne!(out.status.code(), Some(0));
    let text = stderr(&out);
    let refusal = format!(
        "cannot resume this snapshot with the {other} clock: its history was made with the \
         {made_with} clock"
    );
    assert!(text.contains(&refusal), "{text}");
    let state = std::fs::read(dir.join("snaps/exit-000000000001/state.bin")).unwrap();
    assert!(
        String::from_utf8_lossy(&state).contains(state_marker),
        "the snapshot does not hold {state_marker}"
    );
}
