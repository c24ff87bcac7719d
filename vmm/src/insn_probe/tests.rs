use super::breakpoints::{HwBreakpoints, Int3Report};
use super::pmu::{Counter, PmuProbe};
use super::step::{RepCount, StepExactness, StepRate};
use super::*;

fn exact() -> StepExactness {
    StepExactness {
        guest_count: 900,
        stepped: 904,
        expected: 904,
        rep_iterations: 40,
        rep_steps: 40,
        rep_count: RepCount::PerIteration,
    }
}

fn no_pmu() -> PmuProbe {
    let enoent = || Counter::OpenFailed {
        errno: 2,
        error: "No such file or directory (os error 2)".into(),
    };
    PmuProbe {
        cpu: None,
        hardware_pmu: false,
        instructions: enoent(),
        conditional_branches: enoent(),
    }
}

/// What the helper VM gave when this was written: exact steps, no
/// breakpoints, no INT3 exit, no PMU.
fn helper_vm() -> InsnProbes {
    InsnProbes {
        step: Probed::Measured(exact()),
        step_rate: Probed::Measured(StepRate {
            steps: 9071,
            micros: 1_000_000,
            free_instructions: 9_000_004,
            free_micros: 10_000,
        }),
        user_step: Probed::Measured(exact()),
        hardware_breakpoints: Probed::Measured(HwBreakpoints {
            expected_hits: 11,
            hits: 0,
            misplaced: None,
            guest_finished: true,
        }),
        int3: Probed::Measured(Int3Report {
            reported: false,
            pc: None,
            int3_at: 0x1025,
            resumed: false,
            instead: Some("the exit Shutdown".into()),
        }),
        pmu: no_pmu(),
    }
}

#[test]
fn exact_steps_offer_the_step_clock_with_its_rate() {
    let clocks = Clocks::from_probes(&helper_vm(), None);
    assert!(clocks.exit.available);
    assert!(clocks.step.available);
    assert_eq!(clocks.step.steps_per_second, Some(9071));
    assert!(!clocks.pmu.available);
    assert!(clocks
        .pmu
        .reason
        .as_deref()
        .unwrap()
        .starts_with("no usable PMU"));
}

#[test]
fn inexact_steps_say_how_they_miss() {
    let mut probes = helper_vm();
    probes.step = Probed::Measured(StepExactness {
        stepped: 903,
        ..exact()
    });
    let step = Clocks::from_probes(&probes, None).step;
    assert_eq!(
        step.reason.as_deref(),
        Some("single steps are not exact: 903 steps where the guest ran 904")
    );
    probes.step = Probed::Measured(StepExactness {
        rep_steps: 2,
        rep_count: RepCount::Other(2),
        ..exact()
    });
    let step = Clocks::from_probes(&probes, None).step;
    assert_eq!(
        step.reason.as_deref(),
        Some("a REP of 40 iterations took 2 single steps")
    );
    probes.step = Probed::failed("KVM_SET_GUEST_DEBUG: Invalid argument (os error 22)");
    let step = Clocks::from_probes(&probes, None).step;
    assert_eq!(
        step.reason.as_deref(),
        Some("the stepping probe failed: KVM_SET_GUEST_DEBUG: Invalid argument (os error 22)")
    );
}

#[test]
fn a_kvm_that_cannot_run_guests_offers_only_the_exit_clock() {
    let clocks = Clocks::from_probes(&helper_vm(), Some("KVM does not honour the CPU model"));
    assert!(clocks.exit.available);
    assert_eq!(clocks.step.reason.as_deref(), Some(CANNOT_RUN_GUESTS));
    // The counter's own reason holds wherever guests run.
    assert!(clocks
        .pmu
        .reason
        .as_deref()
        .unwrap()
        .starts_with("no usable PMU"));
}

#[test]
fn a_usable_counter_offers_the_pmu_clock() {
    let mut probes = helper_vm();
    probes.pmu.instructions = Counter::Counted {
        count: 30_010,
        expected: 30_004,
    };
    let clocks = Clocks::from_probes(&probes, None);
    assert!(clocks.pmu.available);
    assert_eq!(clocks.pmu.reason, None);
}

#[test]
fn the_check_lines_say_what_the_helper_vm_offers() {
    let probes = helper_vm();
    let clocks = Clocks::from_probes(&probes, None);
    let lines = report_lines(&probes, &clocks, ProbedOn::HelperVm);
    assert_eq!(
        lines,
        [
            "clock exit:               available (virtual time per exit; the default)",
            "clock step:               available, 9071 steps/s (exact; a REP counts one step \
             per iteration; unstepped 900000400 instructions/s)",
            "clock pmu:                no: no usable PMU (perf has no hardware PMU here): \
             retired instructions: perf_event_open: No such file or directory (os error 2); \
             retired conditional branches: perf_event_open: No such file or directory (os error 2)",
            "hardware breakpoints:     no: 0 of 11 hits; the guest ran past every breakpoint \
             to its end",
            "INT3 reported to VMM:     no: the guest's int3 gave the exit Shutdown",
            "user-level stepping:      exact (CPL 3)",
            "clocks probed on:         the helper VM's KVM (nested, under QEMU)",
        ]
    );
}

#[test]
fn the_check_lines_when_breakpoints_and_int3_work() {
    let mut probes = helper_vm();
    probes.hardware_breakpoints = Probed::Measured(HwBreakpoints {
        expected_hits: 11,
        hits: 11,
        misplaced: None,
        guest_finished: true,
    });
    probes.int3 = Probed::Measured(Int3Report {
        reported: true,
        pc: Some(0x1025),
        int3_at: 0x1025,
        resumed: true,
        instead: None,
    });
    probes.user_step = Probed::failed("KVM_SET_SREGS: Invalid argument (os error 22)");
    let clocks = Clocks::from_probes(&probes, None);
    let lines = report_lines(&probes, &clocks, ProbedOn::ThisHost);
    assert_eq!(
        lines[3],
        "hardware breakpoints:     fire (11 of 11 hits at the breakpoint's RIP)"
    );
    assert_eq!(
        lines[4],
        "INT3 reported to VMM:     yes (KVM_EXIT_DEBUG, exception 3, at the int3's own \
         address; the guest resumed past it)"
    );
    assert_eq!(
        lines[5],
        "user-level stepping:      no: KVM_SET_SREGS: Invalid argument (os error 22)"
    );
    assert_eq!(lines[6], "clocks probed on:         this host's KVM");
}

/// The JSON `check --json` carries: its words are what scripts read.
#[test]
fn the_clocks_json_keeps_its_form() {
    let clocks = Clocks::from_probes(&helper_vm(), None);
    let json = serde_json::to_value(&clocks).unwrap();
    assert_eq!(json["exit"], serde_json::json!({"available": true}));
    assert_eq!(
        json["step"],
        serde_json::json!({"available": true, "steps_per_second": 9071})
    );
    assert_eq!(json["pmu"]["available"], false);
    let probes = serde_json::to_value(helper_vm()).unwrap();
    assert_eq!(probes["step"]["measured"]["rep_count"], "per_iteration");
    assert_eq!(
        probes["pmu"]["instructions"]["open_failed"]["errno"],
        serde_json::json!(2)
    );
    let back: InsnProbes = serde_json::from_value(probes).unwrap();
    assert_eq!(back, helper_vm());
}
