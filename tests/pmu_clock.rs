//! The pmu clock (`--clock pmu`, vmm/src/vm/pmu_run.rs): virtual time from
//! a counter of guest events, deadlines on exact counts, on real KVM (the
//! helper VM on hosts whose KVM cannot run guests).
//!
//! With the host's counter where perf has one; where it has none (every
//! machine here) the refusal is checked and the test says
//! `skipped: no usable PMU`, the one allowed skip. The same loop (overflow
//! set short by the margin, a late overflow, the rest stepped, the
//! interrupt at the count) then runs with a counter emulated by single
//! steps, which must land everything where the step clock lands it.

mod common;

use common::counted::{check_count_guest, json_of, printed_count};
use common::*;

#[test]
fn test_the_pmu_clock_with_the_hosts_counter_or_a_clear_skip() {
    let dir = scratch_dir("pmu-clock-hardware");
    let count_elf = assemble_bare_guest("count_insns", &dir)
        .display()
        .to_string();
    let snaps = dir.join("snaps").display().to_string();
    let run_args = [
        "run",
        "--kernel",
        &count_elf,
        "--clock",
        "pmu",
        "--until",
        "1s",
        "--snapshots",
        &snaps,
        "--snapshot-at-exit",
        "1",
        "--json",
    ];
    let out = detvisor(&run_args);
    if out.status.code() != Some(0) {
        // Refused, saying why: perf's own error for both events, or the
        // CPU model's known-bad counters.
        let text = stderr(&out);
        assert!(text.contains("the pmu clock cannot run here"), "{text}");
        assert!(
            text.contains("perf_event_open: ") || text.contains("known unreliable"),
            "{text}"
        );
        // Past the harness's capture, so CI's log shows it.
        use std::io::Write;
        let why = text
            .lines()
            .find(|l| l.contains("the pmu clock cannot run here"))
            .unwrap_or_default();
        let _ = writeln!(std::io::stderr().lock(), "skipped: no usable PMU ({why})");
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    // A counter: runs repeat to the exit, and a position reached twice is
    // the same state.
    let first = summary(&out);
    let again = std::fs::remove_dir_all(&snaps).map(|()| detvisor(&run_args));
    let again = json_of(&again.unwrap(), "run --clock pmu again");
    assert_eq!(first["digest"], again["digest"], "{first}\n{again}");
    assert_eq!(first["virtual_ns"], again["virtual_ns"]);
    let at = format!("{snaps}@exit:1+insn:1000");
    let seek = json_of(&detvisor(&["seek", &at, "--json"]), "seek");
    assert_eq!(seek["regs"]["r15"], 1000, "{seek}");
    let seek_again = json_of(&detvisor(&["seek", &at, "--json"]), "seek again");
    assert_eq!(seek["memory_hash"], seek_again["memory_hash"]);
    assert_eq!(seek["virtual_ns"], seek_again["virtual_ns"]);
    let branch = json_of(&detvisor(&["branch", &at, "--json"]), "branch");
    assert_eq!(branch["digest"], first["digest"], "{branch}");

    // The timer lands on one exact instruction of a guest that never exits.
    let spin_elf = assemble_bare_guest("step_clock", &dir)
        .display()
        .to_string();
    let audit = detvisor(&[
        "audit", "--kernel", &spin_elf, "--clock", "pmu", "--until", "1s", "--runs", "2", "--json",
    ]);
    let report = json_of(&audit, "audit --clock pmu");
    assert_eq!(report["identical"], true, "{report}");
    let out = detvisor(&[
        "run", "--kernel", &spin_elf, "--clock", "pmu", "--until", "1s", "--json",
    ]);
    let run = json_of(&out, "run --clock pmu");
    assert_eq!(run["digest"], report["digests"][0], "{run}");
    assert_eq!(run["injected_interrupts"], 1, "{run}");
    assert!(printed_count(&out) > 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn test_the_pmu_loop_with_an_emulated_counter_lands_where_the_step_clock_does() {
    let dir = scratch_dir("pmu-clock-emulated");
    // One event per instruction at 1 ns: the guest's own count, and after
    // a restore the counter takes the history's count.
    let pmu = ["--clock", "pmu", "--pmu-counter", "emulated"];
    check_count_guest(
        &dir,
        &pmu,
        "pmu",
        "step",
        r#""kind":"pmu","event":"emulated_steps","counted":4"#,
    );

    // A guest that never exits: the overflow lands late by a varying skid,
    // the rest is stepped, and the timer's interrupt lands on the step
    // clock's instruction, in the step clock's history.
    let spin_elf = assemble_bare_guest("step_clock", &dir)
        .display()
        .to_string();
    let mut args = vec!["audit", "--kernel", &spin_elf, "--until", "1s"];
    args.extend(pmu);
    args.extend(["--runs", "2", "--json"]);
    let report = json_of(&detvisor(&args), "audit --clock pmu (emulated)");
    assert_eq!(report["identical"], true, "{report}");
    let step = detvisor(&[
        "run", "--kernel", &spin_elf, "--clock", "step", "--until", "1s", "--json",
    ]);
    let step_run = json_of(&step, "run --clock step");
    assert_eq!(report["digests"][0], step_run["digest"], "{step_run}");
    assert_eq!(step_run["injected_interrupts"], 1, "{step_run}");
    assert!((4990..=5000).contains(&printed_count(&step)));
    let _ = std::fs::remove_dir_all(dir);
}
