//! End-to-end tests of the clock page (`devices::clock_page`, guest patch
//! 0004): the guest kernel reads the time and arms its timer through a page
//! of memory instead of HPET registers, and takes interrupts without PIC
//! port writes. `--exit-path legacy` keeps the old path for comparisons.

mod common;

use common::cluster::Cluster;
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

/// Polls CLOCK_MONOTONIC without doing anything else until 2 ms of it have
/// passed, then prints how many reads that took.
const POLL_C: &str = r#"
#include <stdio.h>
#include <time.h>
static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(void) {
    long long start = now(), end = start, reads = 1;
    while (end - start < 2000000) {
        end = now();
        reads++;
    }
    printf("poll reads %lld elapsed %lld\n", reads, end - start);
    return 0;
}
"#;

/// A node that polls the clock: with the clock page its reads do not exit,
/// so only the forced-exit rule (an exit after 64 reads that saw no new
/// exit) moves time; the loop must still end, after at most 64 reads per
/// 200 ns exit. Under the legacy path every read is an exit.
#[test]
fn test_a_loop_polling_the_clock_progresses_by_the_forced_exit_rule() {
    let cluster = Cluster::new(
        "clockpoll",
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\ncommand = [\"sleep\", \"1000\"]\n\
         [workload]\nnode = \"n1\"\ncommand = [\"/bin/poll\"]\n",
    );
    let source = cluster.dir.join("poll.c");
    std::fs::write(&source, POLL_C).unwrap();
    let status = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(cluster.dir.join("root/bin/poll"))
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let poll = |out: &Output| -> (u64, u64) {
        let text = stdout(out);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("workload | poll reads "))
            .unwrap_or_else(|| panic!("no poll line in {text}"));
        let mut words = line.split_whitespace();
        let reads = words.next().unwrap().parse().unwrap();
        assert_eq!(words.next(), Some("elapsed"));
        (reads, words.next().unwrap().parse().unwrap())
    };
    let page = cluster.up(&["--seed", "4", "--until", "30s"]);
    let again = cluster.up(&["--seed", "4", "--until", "30s"]);
    let legacy = cluster.up(&["--seed", "4", "--until", "30s", "--exit-path", "legacy"]);
    for out in [&page, &again, &legacy] {
        assert_eq!(out.status.code(), Some(0));
    }
    let (reads, elapsed) = poll(&page);
    assert_eq!(poll(&again), (reads, elapsed), "one seed, one history");
    // Each exit moves time by 200 ns, and nothing but exits moves it in a
    // busy loop: at most elapsed / 200 exits, each after at most 64 reads.
    let exits = elapsed / 200;
    eprintln!("clock page: {reads} reads in {elapsed} ns ({exits} exits at most)");
    assert!(elapsed >= 2_000_000);
    assert!(reads <= 64 * (exits + 1), "more than 64 reads per exit");
    assert!(reads >= 16 * exits, "the reads must not exit each time");
    let (legacy_reads, legacy_elapsed) = poll(&legacy);
    eprintln!("legacy: {legacy_reads} reads in {legacy_elapsed} ns");
    assert!(
        legacy_reads <= legacy_elapsed / 200 + 1,
        "an HPET read is an exit"
    );
}
