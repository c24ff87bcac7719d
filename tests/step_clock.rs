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

use common::counted::{check_count_guest, json_of, printed_count};
use common::*;

#[test]
fn test_the_step_clock_reads_the_guests_own_instruction_count() {
    let dir = scratch_dir("step-clock-count");
    check_count_guest(
        &dir,
        &["--clock", "step"],
        "step",
        "exit",
        r#""clock":"step""#,
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
    let count = printed_count(&out);
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
