//! End-to-end tests: real guests on real KVM (inside the helper VM where the
//! host's KVM cannot run Linux). Each test boots the default guest image.

mod common;

use common::*;
use std::process::Output;

/// Console output without the JSON summary line.
fn console(out: &Output) -> String {
    stdout(out)
        .lines()
        .filter(|l| !l.starts_with("{\"exit_status\""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn test_run_uname_boots_linux_and_reports_summary() {
    let out = detvisor(&["run", "--json", "--", "uname", "-a"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        console(&out).contains("Linux detvisor 6.1"),
        "uname output missing"
    );
    let s = summary(&out);
    assert_eq!(s["exit_status"], 0);
    assert_eq!(s["seed"], 0);
    assert!(s["exits"].as_u64().unwrap() > 100);
    assert!(s["virtual_ns"].as_u64().unwrap() > 0);
    assert!(s["wall_ms"].as_u64().is_some());
    assert_eq!(s["digest"].as_str().unwrap().len(), 32);
}

/// The guest runs under the VMM's seccomp filter (the summary reads the
/// filters on the thread that ran it from /proc/thread-self/status), and
/// `--no-seccomp` runs it without; the history is the same either way.
#[test]
fn test_guests_run_under_seccomp_unless_no_seccomp() {
    let on = detvisor(&["run", "--json", "--", "true"]);
    assert_eq!(on.status.code(), Some(0), "{}", stderr(&on));
    let on = summary(&on);
    assert!(
        on["seccomp_filters"].as_u64().unwrap() >= 1,
        "filtered: {on}"
    );
    let off = detvisor(&["run", "--json", "--no-seccomp", "--", "true"]);
    assert_eq!(off.status.code(), Some(0), "{}", stderr(&off));
    let off = summary(&off);
    assert_eq!(off["seccomp_filters"], 0, "not filtered: {off}");
    assert_eq!(
        on["digest"], off["digest"],
        "seccomp changes nothing the guest sees"
    );
}

#[test]
fn test_run_exit_status_propagates() {
    let out = detvisor(&["run", "--", "sh", "-c", "echo bye; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert!(stdout(&out).contains("bye"));
    assert!(stderr(&out).contains("exit 7"), "human summary on stderr");
}

#[test]
fn test_same_seed_same_console_and_digest_other_seed_other_randomness() {
    let cmd = "head -c16 /dev/urandom | od -An -tx1; date; cat /proc/uptime";
    let a = detvisor(&["run", "--json", "--seed", "7", "--", "sh", "-c", cmd]);
    let b = detvisor(&["run", "--json", "--seed", "7", "--", "sh", "-c", cmd]);
    let c = detvisor(&["run", "--json", "--seed", "8", "--", "sh", "-c", cmd]);
    for out in [&a, &b, &c] {
        assert_eq!(out.status.code(), Some(0));
    }
    assert_eq!(
        console(&a),
        console(&b),
        "same seed must give the same console"
    );
    assert_eq!(summary(&a)["digest"], summary(&b)["digest"]);
    assert_eq!(summary(&a)["exits"], summary(&b)["exits"]);
    let random_line = |o: &Output| {
        console(o)
            .lines()
            .find(|l| l.split_whitespace().count() == 16)
            .unwrap_or_else(|| panic!("no line of 16 random bytes"))
            .to_string()
    };
    assert_ne!(
        random_line(&a),
        random_line(&c),
        "another seed must give other bytes"
    );
    assert_ne!(summary(&a)["digest"], summary(&c)["digest"]);
    // The CMOS clock starts at the configured epoch (2024-01-01 by default).
    assert!(
        console(&a).contains("2024"),
        "date must follow the virtual RTC"
    );
}

#[test]
fn test_sleep_600_skips_idle_time() {
    let out = detvisor(&["run", "--json", "--", "sleep", "600"]);
    assert_eq!(out.status.code(), Some(0));
    let s = summary(&out);
    assert!(s["virtual_ns"].as_u64().unwrap() >= 600_000_000_000);
}

#[test]
fn test_until_stops_at_virtual_time_limit() {
    let out = detvisor(&["run", "--json", "--until", "5s", "--", "sleep", "600"]);
    assert_eq!(out.status.code(), Some(124));
    let s = summary(&out);
    assert_eq!(s["stop"]["kind"], "time_limit");
    // At the first exit at or after 5 s, the moment `DIR@5s` and a
    // campaign name: a guest asleep across 5 s wakes first (its next timer),
    // long before `sleep 600` would end.
    let v = s["virtual_ns"].as_u64().unwrap();
    assert!(
        (5_000_000_000..60_000_000_000).contains(&v),
        "stopped at {v}"
    );
}

#[test]
fn test_audit_three_runs_identical() {
    let out = detvisor(&[
        "audit",
        "--runs",
        "3",
        "--seed",
        "3",
        "--",
        "sh",
        "-c",
        "ls / && head -c8 /dev/urandom | od -An -tx1",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("identical: 3 runs"));
}

#[test]
fn test_audit_detects_injected_divergence() {
    let out = detvisor(&[
        "audit",
        "--runs",
        "2",
        "--perturb-run",
        "2",
        "--perturb-exit",
        "200",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.starts_with("DIVERGED: runs 1 and 2 diverge"), "{text}");
    assert!(text.contains("run 1:") && text.contains("run 2:"));
}

/// The soak (one helper VM, two short runs): a perturbed run is named, a
/// finished soak is read back without running, another soak's directory is
/// refused. Resuming and torn results lines: run::soak's unit tests.
#[test]
fn test_soak_names_a_perturbed_run_keeps_its_results_and_refuses_another_soak() {
    let dir = std::env::temp_dir().join(format!("detvisor-soak-{}", std::process::id()));
    let out_dir = dir.to_str().unwrap();
    let soak = |seed: &str| {
        detvisor(&[
            "soak",
            "boot",
            "--runs",
            "2",
            "--seed",
            seed,
            "--out",
            out_dir,
            "--perturb-run",
            "2",
            "--perturb-exit",
            "200",
            "--",
            "true",
        ])
    };
    let out = soak("0");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("DIVERGED: boot 2 of 2 runs done, 1 identical, 1 diverged"),
        "{text}"
    );
    assert!(
        text.contains("first divergence: run 2: runs 1 and 2 diverge at exit"),
        "{text}"
    );
    let again = soak("0");
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(stdout(&again), text, "the same verdict, from the directory");
    assert!(stderr(&again).contains("all 2 runs done already"));
    let other = soak("1");
    assert_eq!(other.status.code(), Some(2));
    assert!(
        stderr(&other).contains("holds another soak"),
        "{}",
        stderr(&other)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn test_missing_kernel_is_a_clear_error() {
    let out = detvisor(&["run", "--kernel", "/nonexistent/vmlinux", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("kernel /nonexistent/vmlinux does not exist"));
}

#[test]
fn test_unparsable_sizes_and_durations_are_clear_errors() {
    let out = detvisor(&["run", "--mem", "12X", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unparsable size \"12X\""));
    let out = detvisor(&["run", "--until", "5 parsecs", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unparsable duration"));
}

#[test]
fn test_non_kernel_file_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("detvisor-nk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("notakernel");
    std::fs::write(&fake, b"#!/bin/sh\necho hi\n").unwrap();
    let initrd = dir.join("initrd");
    std::fs::write(&initrd, b"").unwrap();
    let out = detvisor(&[
        "run",
        "--host-vm",
        "never",
        "--kernel",
        fake.to_str().unwrap(),
        "--initrd",
        initrd.to_str().unwrap(),
        "--",
        "true",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a loadable x86-64 vmlinux ELF kernel"));
}

#[test]
fn test_initrd_too_large_for_memory_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("detvisor-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big-initrd");
    std::fs::write(&big, vec![0u8; 80 << 20]).unwrap();
    let out = detvisor(&[
        "run",
        "--host-vm",
        "never",
        "--mem",
        "64M",
        "--initrd",
        big.to_str().unwrap(),
        "--",
        "true",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("does not fit in 67108864 bytes of guest RAM"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn test_check_reports_host_capabilities() {
    let out = detvisor(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    for key in [
        "kvm_device",
        "kvm_modules",
        "hardware_pmu",
        "can_run_guests",
        "helper_vm_qemu",
        "clocks",
        "instruction_probes",
    ] {
        assert!(report.get(key).is_some(), "missing {key}");
    }
    assert_eq!(report["checked_on"], "host");
    assert_eq!(report["clocks"]["exit"]["available"], true, "{report}");
    // A host that cannot run guests must say why.
    if report["can_run_guests"] == false {
        assert!(report["reason"].as_str().unwrap().len() > 10);
    }
}

#[test]
fn test_check_inside_helper_vm_finds_a_kvm_that_honours_the_cpu_model() {
    let out = detvisor(&["check", "--host-vm", "always", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["can_run_guests"], true, "{report}");
    let probe = &report["cpuid_probe"];
    assert_eq!(probe["seen_ecx"], probe["expected_ecx"]);
    assert_eq!(probe["seen_edx"], probe["expected_edx"]);
    assert_eq!(report["hardware_virtualization"], "svm");

    // The instruction probes ran on the helper VM's KVM: single steps count
    // the guest's own instructions exactly, a REP one step per iteration,
    // at CPL 0 and CPL 3; this machine has no PMU.
    assert_eq!(report["checked_on"], "helper_vm");
    let probes = &report["instruction_probes"];
    for level in ["step", "user_step"] {
        let step = &probes[level]["measured"];
        assert_eq!(step["guest_count"], 900, "{level}: {probes}");
        assert_eq!(step["stepped"], step["expected"], "{level}: {probes}");
        assert_eq!(step["rep_count"], "per_iteration", "{level}: {probes}");
    }
    let clocks = &report["clocks"];
    assert_eq!(clocks["exit"]["available"], true, "{clocks}");
    assert_eq!(clocks["step"]["available"], true, "{clocks}");
    assert!(clocks["step"]["steps_per_second"].as_u64().unwrap() > 0);
    assert_eq!(clocks["pmu"]["available"], false, "{clocks}");
    let why = clocks["pmu"]["reason"].as_str().unwrap();
    assert!(why.starts_with("no usable PMU"), "{why}");
    assert!(why.contains("perf_event_open"), "{why}");
    // Breakpoints and INT3 were measured (what they do is environment's).
    assert_eq!(
        probes["hardware_breakpoints"]["measured"]["expected_hits"], 11,
        "{probes}"
    );
    assert!(probes["int3"].get("measured").is_some(), "{probes}");

    let text = detvisor(&["check", "--host-vm", "always"]);
    assert_eq!(text.status.code(), Some(0));
    let text = stdout(&text);
    for line in [
        "clock exit:",
        "clock step:               available, ",
        "clock pmu:                no: no usable PMU",
        "hardware breakpoints:",
        "INT3 reported to VMM:",
        "user-level stepping:      exact (CPL 3)",
        "clocks probed on:         the helper VM's KVM",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// A guest that never makes a VM exit never reaches `--until` (virtual time
/// moves only at exits): the stall guard ends the run, as its own outcome,
/// at the same last exit and digest every time.
#[test]
fn test_a_guest_spinning_without_exits_ends_as_stalled_identically() {
    let spin = [
        "run",
        "--json",
        "--until",
        "5s",
        "--stall-timeout",
        "20s",
        "--",
        "sh",
        "-c",
        "while :; do :; done",
    ];
    let first = detvisor(&spin);
    assert_eq!(first.status.code(), Some(123), "{}", stderr(&first));
    let summary_1 = summary(&first);
    assert_eq!(summary_1["stop"]["kind"], "stalled", "{summary_1}");
    assert_eq!(summary_1["stop"]["timeout_ms"], 20000);
    // After boot (~450 exits with the clock page, ~700 before), in the
    // spinning shell.
    assert!(summary_1["stop"]["last_exit"].as_u64().unwrap() > 300);
    assert!(summary_1["stop"]["rip"].as_u64().unwrap() != 0);
    let text = stderr(&first);
    assert!(
        text.contains("detvisor: stalled: the guest ran 20s without a VM exit after exit")
            && text.contains("without an instruction counter such code cannot be preempted"),
        "{text}"
    );
    let second = summary(&detvisor(&spin));
    for key in ["exits", "virtual_ns", "digest"] {
        assert_eq!(summary_1[key], second[key], "{key}");
    }
    assert_eq!(summary_1["stop"], second["stop"]);
}
