//! What a run comes to: its summary (the one representation of a run's
//! outcome, printed by the CLI and returned by the library, serializable both
//! ways) and the process exit statuses that stand for outcomes without a
//! guest status.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vmm::exit::StopReason;
use vmm::vm::{DigestParts, RunOutcome};
use vmm::VirtNanos;

/// Exit statuses of a run that did not end with a guest-reported status.
pub mod exit_status {
    /// Bad input: a missing kernel, an unparsable size, a corrupt snapshot...
    pub const BAD_INPUT: u8 = 2;
    /// The virtual-time limit stopped the run (as timeout(1)).
    pub const TIME_LIMIT: u8 = 124;
    /// The guest ended without reporting a status, or could not be set up
    /// (an `up` node that failed to start).
    pub const NO_STATUS: u8 = 125;
    /// The guest ran the stall timeout without a VM exit: a limit of
    /// detvisor on this host, neither a pass nor a failure of the system
    /// under test.
    pub const STALLED: u8 = 123;
}

/// A run's outcome as the CLI prints it (`--json`) and library callers read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run's status: the guest command's, or an `up` run's workload's.
    pub exit_status: Option<u8>,
    pub stop: StopReason,
    pub seed: u64,
    pub virtual_ns: VirtNanos,
    pub exits: u64,
    pub exits_by_kind: BTreeMap<String, u64>,
    pub injected_interrupts: u64,
    /// Interrupt-window exits found after an `STI` byte and single-stepped
    /// to the true window (a diagnostic: the helper VM loses STI shadows).
    pub irq_windows_stepped: u64,
    pub single_steps: u64,
    pub wall_ms: u64,
    pub wall_setup_ms: u64,
    pub wall_finish_ms: u64,
    pub exits_per_sec: u64,
    pub digest: String,
    pub digest_parts: DigestParts,
    pub console_bytes: u64,
    pub unhandled_accesses: u64,
    /// Peak resident memory of this process, minus the guest RAM the host
    /// backed: what the VMM itself costs.
    pub vmm_peak_rss_beyond_guest_kib: Option<u64>,
    pub cpu_model_version: u32,
    /// seccomp filters on the thread that ran the guest when the summary
    /// was made (`Seccomp_filters` in /proc/thread-self/status; 0 under
    /// `--no-seccomp`, none where /proc cannot tell). See
    /// [`vmm::seccomp`].
    #[serde(default)]
    pub seccomp_filters: Option<u32>,
}

/// VmHWM (peak resident set) of this process, in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl RunSummary {
    /// The summary of `outcome`, whose status is the guest's own.
    pub fn new(seed: u64, outcome: &RunOutcome) -> Self {
        let wall_ms = outcome.wall.as_millis() as u64;
        RunSummary {
            exit_status: match outcome.stop {
                StopReason::GuestExit { status } => Some(status),
                _ => None,
            },
            stop: outcome.stop,
            seed,
            virtual_ns: outcome.virtual_time,
            exits: outcome.exits,
            exits_by_kind: outcome.exits_by_kind.clone(),
            injected_interrupts: outcome.injected_interrupts,
            irq_windows_stepped: outcome.irq_windows_stepped,
            single_steps: outcome.single_steps,
            wall_ms,
            wall_setup_ms: outcome.wall_setup.as_millis() as u64,
            wall_finish_ms: outcome.wall_finish.as_millis() as u64,
            exits_per_sec: (outcome.exits as f64 / outcome.wall.as_secs_f64().max(1e-9)) as u64,
            digest: outcome.digest.clone(),
            digest_parts: outcome.digest_parts.clone(),
            console_bytes: outcome.console_bytes,
            unhandled_accesses: outcome.unhandled_accesses,
            vmm_peak_rss_beyond_guest_kib: peak_rss_kib()
                .map(|peak| peak.saturating_sub(outcome.guest_resident_bytes / 1024)),
            cpu_model_version: vmm::cpu_model::CPU_MODEL_VERSION,
            seccomp_filters: vmm::seccomp::thread_filters(),
        }
    }

    /// The run's status where the guest's own is not it (an `up` run's is
    /// its workload's).
    pub fn with_exit_status(mut self, status: Option<u8>) -> Self {
        self.exit_status = status;
        self
    }

    /// The status a process running this run exits with.
    pub fn process_status(&self) -> u8 {
        if matches!(self.stop, StopReason::Stalled { .. }) {
            return exit_status::STALLED;
        }
        self.exit_status.unwrap_or(match self.stop {
            StopReason::TimeLimit => exit_status::TIME_LIMIT,
            _ => exit_status::NO_STATUS,
        })
    }

    /// The stop's `kind` as the JSON summary spells it (`guest_exit`, ...).
    pub fn stop_kind(&self) -> &'static str {
        stop_kind(&self.stop)
    }

    /// One line for people: how the run ended, its times, exits and digest.
    pub fn human(&self) -> String {
        let status = match self.stop {
            StopReason::GuestExit { status } => format!("exit {status}"),
            StopReason::TimeLimit => "virtual-time limit reached".into(),
            StopReason::GuestReset => "guest reset without reporting a status".into(),
            StopReason::HaltedForever => "guest halted with nothing left to wake it".into(),
            StopReason::Failure { failure } => format!("KVM failure: {failure:?}"),
            StopReason::Stalled { .. } => format!("stalled: {}", stall_message(&self.stop)),
            StopReason::SeccompViolation { violation } => format!("stopped: {violation}"),
        };
        format!("detvisor: {status}; {}", self.details())
    }

    /// The part of [`RunSummary::human`] after how the run ended.
    pub fn details(&self) -> String {
        format!(
            "virtual {}, {} exits, wall {:.2}s, {} exits/s, digest {}",
            self.virtual_ns,
            self.exits,
            self.wall_ms as f64 / 1000.0,
            self.exits_per_sec,
            self.digest
        )
    }
}

/// The `kind` tag `StopReason` serializes with.
pub fn stop_kind(stop: &StopReason) -> &'static str {
    match stop {
        StopReason::GuestExit { .. } => "guest_exit",
        StopReason::TimeLimit => "time_limit",
        StopReason::GuestReset => "guest_reset",
        StopReason::HaltedForever => "halted_forever",
        StopReason::Failure { .. } => "failure",
        StopReason::Stalled { .. } => "stalled",
        StopReason::SeccompViolation { .. } => "seccomp_violation",
    }
}

/// What a stall means, in words (empty for any other stop).
pub fn stall_message(stop: &StopReason) -> String {
    let StopReason::Stalled {
        last_exit,
        rip,
        timeout_ms,
    } = *stop
    else {
        return String::new();
    };
    let seconds = VirtNanos(timeout_ms.saturating_mul(1_000_000));
    let after = match last_exit {
        Some(exit) => format!("after exit {exit} at RIP {rip:#x}"),
        None => "before its first exit".into(),
    };
    format!(
        "the guest ran {seconds} without a VM exit {after}; without an instruction counter \
         such code cannot be preempted"
    )
}

/// For per-run lines of audits: the interrupt windows that were stepped past
/// a possible STI shadow (differs between runs on hosts that lose shadows;
/// the histories must not).
pub fn stepped_note(outcome: &RunOutcome) -> String {
    match outcome.irq_windows_stepped {
        0 => String::new(),
        n => format!(
            " ({n} interrupt windows stepped, {} steps)",
            outcome.single_steps
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(stop: StopReason) -> RunSummary {
        RunSummary {
            exit_status: None,
            stop,
            seed: 7,
            virtual_ns: VirtNanos(1_500_000_000),
            exits: 42,
            exits_by_kind: BTreeMap::from([("Hlt".to_string(), 2)]),
            injected_interrupts: 3,
            irq_windows_stepped: 0,
            single_steps: 0,
            wall_ms: 10,
            wall_setup_ms: 1,
            wall_finish_ms: 1,
            exits_per_sec: 4200,
            digest: "ab".repeat(32),
            digest_parts: DigestParts {
                records: "r".into(),
                memory: "m".into(),
                devices: "d".into(),
                console: "c".into(),
            },
            console_bytes: 5,
            unhandled_accesses: 0,
            vmm_peak_rss_beyond_guest_kib: Some(100),
            cpu_model_version: 1,
            seccomp_filters: None,
        }
    }

    #[test]
    fn test_summary_round_trips_through_json() {
        for stop in [
            StopReason::GuestExit { status: 3 },
            StopReason::TimeLimit,
            StopReason::GuestReset,
            StopReason::HaltedForever,
            StopReason::Stalled {
                last_exit: Some(41),
                rip: 0x401000,
                timeout_ms: 5000,
            },
            seccomp_stop(),
        ] {
            let s = summary(stop).with_exit_status(Some(3));
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<RunSummary>(&text).unwrap(), s);
            let kind = serde_json::to_value(stop).unwrap()["kind"].clone();
            assert_eq!(kind, stop_kind(&stop));
        }
    }

    /// The summary's JSON is what it was when its times were bare numbers
    /// (`--json` output, findings and the campaign database hold it).
    #[test]
    fn test_summary_json_is_unchanged() {
        let text = serde_json::to_string(&summary(StopReason::TimeLimit)).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"exit_status":null,"stop":{"kind":"time_limit"},"seed":7,"#,
                r#""virtual_ns":1500000000,"exits":42,"exits_by_kind":{"Hlt":2},"#,
                r#""injected_interrupts":3,"irq_windows_stepped":0,"single_steps":0,"#,
                r#""wall_ms":10,"wall_setup_ms":1,"wall_finish_ms":1,"exits_per_sec":4200,"#,
                r#""digest":"abababababababababababababababababababababababababababababababab","#,
                r#""digest_parts":{"records":"r","memory":"m","devices":"d","console":"c"},"#,
                r#""console_bytes":5,"unhandled_accesses":0,"#,
                r#""vmm_peak_rss_beyond_guest_kib":100,"cpu_model_version":1,"seccomp_filters":null}"#
            )
        );
    }

    #[test]
    fn test_stall_is_its_own_status_and_message() {
        let stall = StopReason::Stalled {
            last_exit: Some(41),
            rip: 0x401000,
            timeout_ms: 5000,
        };
        let s = summary(stall);
        assert_eq!(s.process_status(), exit_status::STALLED);
        assert_eq!(s.stop_kind(), "stalled");
        assert!(
            s.human().contains(
                "the guest ran 5s without a VM exit after exit 41 at RIP 0x401000; \
                 without an instruction counter such code cannot be preempted"
            ),
            "{}",
            s.human()
        );
    }

    fn seccomp_stop() -> StopReason {
        StopReason::SeccompViolation {
            violation: vmm::seccomp::Violation {
                syscall: libc::SYS_socket,
                tid: 1234,
                thread: vmm::seccomp::ThreadName::new("run-library"),
            },
        }
    }

    #[test]
    fn test_seccomp_violation_names_the_call_and_the_thread() {
        let s = summary(seccomp_stop());
        assert_eq!(s.stop_kind(), "seccomp_violation");
        assert_eq!(s.process_status(), exit_status::NO_STATUS);
        assert!(
            s.human().starts_with(
                "detvisor: stopped: seccomp refused syscall 41 (socket) on thread 1234 \
                 (run-library); virtual"
            ),
            "{}",
            s.human()
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["stop"],
            serde_json::json!({"kind": "seccomp_violation",
                "violation": {"syscall": 41, "tid": 1234, "thread": "run-library"}})
        );
    }

    #[test]
    fn test_process_status_without_guest_status() {
        assert_eq!(summary(StopReason::TimeLimit).process_status(), 124);
        assert_eq!(summary(StopReason::GuestReset).process_status(), 125);
        let exited = summary(StopReason::GuestExit { status: 9 }).with_exit_status(Some(9));
        assert_eq!(exited.process_status(), 9);
    }
}
