//! The step clock (`--clock step`, vmm/src/vm/step_clock.rs): every
//! instruction single-stepped and counted at 1 ns, on real KVM (the helper
//! VM on hosts whose KVM cannot run guests).
//!
//! Two bare guests say what the clock must read. tests/guests/count_insns.S
//! knows how many instructions it runs, so the clock's time and a position's
//! time are its own counts. tests/guests/step_clock.S never exits while it
//! works: only a clock that counts its instructions reaches its timer's
//! deadline, and the interrupt lands on one exact instruction, every run.

mod common;

use common::*;
use serde_json::Value;

fn json_of(out: &std::process::Output, what: &str) -> Value {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(out));
    summary(out)
}

/// Instructions count_insns.S runs: CLI, LEA, XOR and the OUT of exit 1;
/// its interval of 2046 steps (tests/positions.rs); then the OUT of exit 2,
/// the MOV and the OUT that ends it.
const COUNT_GUEST_INSTRUCTIONS: u64 = 4 + 2046 + 3;
/// The instructions before exit 1's.
const BEFORE_EXIT_1: u64 = 4;

#[test]
fn test_the_step_clock_reads_the_guests_own_instruction_count() {
    let dir = scratch_dir("step-clock-count");
    let elf = assemble_bare_guest("count_insns", &dir)
        .display()
        .to_string();
    let snaps = dir.join("snaps").display().to_string();
    let run = json_of(
        &detvisor(&[
            "run",
            "--kernel",
            &elf,
            "--clock",
            "step",
            "--until",
            "1s",
            "--snapshots",
            &snaps,
            "--snapshot-at-exit",
            "1",
            "--json",
        ]),
        "run --clock step",
    );
    assert_eq!(run["virtual_ns"], COUNT_GUEST_INSTRUCTIONS, "{run}");
    assert_eq!(run["stop"]["kind"], "guest_exit", "{run}");

    // A position's time is its instruction count too: 1000 `inc %r15`
    // after exit 1.
    let k = 1000;
    let out = detvisor(&["seek", &format!("{snaps}@exit:1+insn:{k}"), "--json"]);
    let at = json_of(&out, "seek");
    assert_eq!(at["regs"]["r15"], k, "{at}");
    assert_eq!(at["virtual_ns"], BEFORE_EXIT_1 + k, "{at}");

    // Run on from there: the same history as the free run.
    let out = detvisor(&["branch", &format!("{snaps}@exit:1+insn:{k}"), "--json"]);
    let branch = json_of(&out, "branch");
    assert_eq!(branch["digest"], run["digest"], "{branch}");
    assert_eq!(branch["virtual_ns"], COUNT_GUEST_INSTRUCTIONS, "{branch}");

    // One history keeps one clock: the exit clock is refused here.
    let out = detvisor(&["branch", &format!("{snaps}@exit:1"), "--clock", "exit"]);
    assert_ne!(out.status.code(), Some(0));
    let text = stderr(&out);
    assert!(
        text.contains("cannot resume this snapshot with the exit clock: its history was made with the step clock"),
        "{text}"
    );
    let meta = std::fs::read(dir.join("snaps/exit-000000000001/state.bin")).unwrap();
    assert!(
        String::from_utf8_lossy(&meta).contains(r#""clock":"step""#),
        "the snapshot does not name its clock"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn test_a_guest_that_never_exits_is_preempted_on_an_exact_instruction() {
    let dir = scratch_dir("step-clock-preempt");
    let elf = assemble_bare_guest("step_clock", &dir)
        .display()
        .to_string();
    // Every exit of two runs compared: the same history each time.
    let audit = detvisor(&[
        "audit", "--kernel", &elf, "--clock", "step", "--until", "1s", "--runs", "2", "--json",
    ]);
    let report = json_of(&audit, "audit --clock step");
    assert_eq!(report["identical"], true, "{report}");
    // A third run, the same history, and the count its handler printed:
    // the timer was armed 1000 HPET ticks (10 us) ahead, and each loop
    // iteration is 2 instructions (2 ns).
    let out = detvisor(&[
        "run", "--kernel", &elf, "--clock", "step", "--until", "1s", "--json",
    ]);
    let run = json_of(&out, "run --clock step");
    assert_eq!(run["digest"], report["digests"][0], "{run}");
    assert_eq!(run["injected_interrupts"], 1, "{run}");
    let text = stdout(&out);
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix("count="))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap_or_else(|| panic!("no count printed: {text}"));
    assert!((4990..=5000).contains(&count), "{count}");

    // The exit clock cannot move while the guest computes: only the stall
    // guard ends the run.
    let out = detvisor(&[
        "run",
        "--kernel",
        &elf,
        "--until",
        "1s",
        "--stall-timeout",
        "2s",
    ]);
    assert_eq!(out.status.code(), Some(123), "{}", stderr(&out));
    assert!(!stdout(&out).contains("count="));
    let _ = std::fs::remove_dir_all(dir);
}
