//! End-to-end tests of the clock page (`devices::clock_page`, guest patch
//! 0004): the guest kernel reads the time and arms its timer through a page
//! of memory instead of HPET registers, and takes interrupts without PIC
//! port writes. `--exit-path legacy` keeps the old path for comparisons.

mod common;

use common::*;
use std::process::Output;

/// A workload that reads the clock and arms the timer a few hundred times:
/// 200 sleeps of 1 ms (each arms the clockevent, takes a timer interrupt
/// and reads the time), then the kernel's view of its clock and timer.
const CLOCK_HEAVY: &str = "cat /sys/devices/system/clocksource/clocksource0/current_clocksource; \
     i=0; while [ $i -lt 200 ]; do usleep 1000; i=$((i+1)); done; \
     grep ' 0:' /proc/interrupts; cat /proc/uptime";

fn run(exit_path: &str, seed: &str) -> Output {
    let out = detvisor(&[
        "run",
        "--json",
        "--seed",
        seed,
        "--exit-path",
        exit_path,
        "--",
        "sh",
        "-c",
        CLOCK_HEAVY,
    ]);
    assert_eq!(out.status.code(), Some(0), "{exit_path} run failed");
    out
}

/// The number of timer interrupts the guest counted (`/proc/interrupts`).
fn timer_interrupts(out: &Output) -> u64 {
    let text = stdout(out);
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("0:"))
        .unwrap_or_else(|| panic!("no IRQ 0 line in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn test_clock_page_is_the_guest_clocksource_and_cuts_exits_against_legacy() {
    let page = run("clock-page", "3");
    let legacy = run("legacy", "3");
    assert!(
        stdout(&page).lines().any(|l| l == "detvisor"),
        "the clock page must be the guest's clocksource"
    );
    assert!(
        stdout(&legacy).lines().any(|l| l == "hpet"),
        "--exit-path legacy must keep the HPET clocksource"
    );
    // Both kept time: 200 sleeps of 1 ms, each woken by the timer.
    for out in [&page, &legacy] {
        assert!(timer_interrupts(out) >= 200, "too few timer interrupts");
        assert!(summary(out)["virtual_ns"].as_u64().unwrap() >= 200_000_000);
    }
    let exits = |out: &Output| summary(out)["exits"].as_u64().unwrap();
    let kinds = |out: &Output, kind: &str| {
        summary(out)["exits_by_kind"][kind]
            .as_u64()
            .unwrap_or_default()
    };
    eprintln!(
        "exits: clock page {} (MmioRead {}, IoOut {}), legacy {} (MmioRead {}, IoOut {})",
        exits(&page),
        kinds(&page, "MmioRead"),
        kinds(&page, "IoOut"),
        exits(&legacy),
        kinds(&legacy, "MmioRead"),
        kinds(&legacy, "IoOut")
    );
    // Legacy: three HPET accesses to arm the timer, its counter read at
    // every clock read, four PIC accesses per interrupt. The page: none.
    assert!(
        exits(&page) * 2 < exits(&legacy),
        "the clock page must at least halve the exits of a clock-heavy run"
    );
    assert!(kinds(&page, "MmioRead") * 4 < kinds(&legacy, "MmioRead"));
    assert!(kinds(&page, "IoOut") < kinds(&legacy, "IoOut"));
}

#[test]
fn test_clock_page_runs_are_identical_for_one_seed() {
    let a = run("clock-page", "11");
    let b = run("clock-page", "11");
    assert_eq!(summary(&a)["digest"], summary(&b)["digest"]);
    assert_eq!(summary(&a)["exits"], summary(&b)["exits"]);
    // The console (the summary line holds wall times).
    let console = |out: &Output| {
        stdout(out)
            .lines()
            .filter(|l| !l.starts_with("{\"exit_status\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(console(&a), console(&b));
}

#[test]
fn test_bad_exit_path_is_refused_before_any_vm_starts() {
    let out = detvisor(&["run", "--exit-path", "hpet", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown exit path \"hpet\": expected clock-page or legacy"),
        "the error must name the value and the choices"
    );
}
