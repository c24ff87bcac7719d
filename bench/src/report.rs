//! What the benches' reports share: a worker's report and its one run, the helper VM
//! session, and where the guests ran.

use anyhow::Result;
use helper_vm::Placement;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use vmm::VirtNanos;

use crate::stats::{median_u64, stat};

/// The error of every measurement of a failed helper VM session.
pub const NOT_MEASURED: &str = "not measured: the helper VM session failed (see below)";

/// A typed value of a report as the text its flag reads back (`--until 300s` as `"300s"`), so
/// the JSON line keeps the text it had when the report held the flag's string.
pub fn as_text<T: fmt::Display, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// A worker's report: it says how long the worker took, on the clock of the machine it ran on.
pub trait WorkerReport {
    fn elapsed_ms(&self) -> f64;
}

/// The helper VM session as seen from the host.
#[derive(Serialize, Default)]
pub struct Session {
    /// Start of the helper VM to its payload serving the channel (helper VM boot, incl.
    /// assembling its initrd).
    pub boot_ms: Option<f64>,
    /// The worker's reply to the helper VM's exit (helper VM shutdown).
    pub shutdown_ms: Option<f64>,
    /// Start to exit.
    pub total_ms: f64,
    /// The worker's call, on the host's clock ...
    pub payload_host_ms: Option<f64>,
    /// ... and the worker's own duration on L1's clock (a check of L1's clock).
    pub payload_l1_ms: Option<f64>,
    /// L1's uptime when the payload started (L1 kernel boot + init, on L1's clock).
    pub l1_uptime_at_payload_s: Option<f64>,
    /// Bytes shipped as payload files (QEMU, its libraries and firmware, kernels, initrds).
    pub payload_file_bytes: u64,
    pub error: Option<String>,
}

impl Session {
    /// Runs `f` in a new session; an error of `f` becomes the session's `error`.
    pub fn record<R>(f: impl FnOnce(&mut Session) -> Result<R>) -> (Session, Option<R>) {
        let mut session = Session::default();
        match f(&mut session) {
            Ok(r) => (session, Some(r)),
            Err(e) => {
                session.error = Some(format!("{e:#}"));
                (session, None)
            }
        }
    }
}

/// Where the guests ran, as every report says it.
#[derive(Serialize, Debug, PartialEq)]
pub struct Where {
    /// "host" or "helper VM".
    pub placement: &'static str,
    pub placement_reason: Option<String>,
}

impl Where {
    pub fn in_helper_vm(&self) -> bool {
        self.placement
            == Placement::HelperVm {
                reason: String::new(),
            }
            .name()
    }
}

impl From<&Placement> for Where {
    fn from(placement: &Placement) -> Self {
        Where {
            placement: placement.name(),
            placement_reason: placement.reason().map(String::from),
        }
    }
}

/// " (because REASON)" when the guests run in the helper VM, else nothing.
pub fn because(placement: &Placement) -> String {
    placement
        .reason()
        .map(|r| format!(" (because {r})"))
        .unwrap_or_default()
}

/// One measured run of `bench boot` (detvisor or QEMU), as its report keeps it.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct RunResult {
    pub ok: bool,
    /// Process start to exit (ms).
    pub wall_ms: f64,
    pub error: Option<String>,
    /// Status the guest reported (detvisor's JSON; QEMU: the byte written to port 0x610).
    pub guest_status: Option<u8>,
    /// Exits to the VMM (detvisor's JSON `exits`).
    pub vmm_exits: Option<u64>,
    /// detvisor's own phases (its JSON): vm::run total, setup, final hashing (ms).
    pub inner_wall_ms: Option<u64>,
    pub inner_setup_ms: Option<u64>,
    pub inner_finish_ms: Option<u64>,
    /// Deltas of the KVM statistics (debugfs) over the run.
    pub kvm: Option<BTreeMap<String, u64>>,
    /// Fingerprint of the guest's output: detvisor's digest, or FNV-1a 64 of the serial bytes.
    pub output: Option<String>,
    pub output_bytes: Option<u64>,
}

impl RunResult {
    /// A run whose process could not be started.
    pub fn failed(e: &anyhow::Error) -> Self {
        RunResult {
            error: Some(format!("{e:#}")),
            ..RunResult::default()
        }
    }
}

/// The wall and guest times of one system's runs, as the etcd and exits reports give them.
#[derive(Serialize, Default, Debug)]
pub struct RunTimes {
    pub runs: usize,
    pub ok_runs: usize,
    /// Every run's wall time (s), failed ones included.
    pub wall_s: Vec<f64>,
    pub ok: Vec<bool>,
    pub median_s: Option<f64>,
    pub min_s: Option<f64>,
    pub max_s: Option<f64>,
    /// Median guest time at the end of the successful runs (s).
    pub virtual_s: Option<f64>,
}

impl RunTimes {
    /// Of runs given as (succeeded, wall time in ms, guest time at the end in ns).
    pub fn of(runs: impl IntoIterator<Item = (bool, f64, Option<VirtNanos>)>) -> Self {
        let runs: Vec<(bool, f64, Option<VirtNanos>)> = runs.into_iter().collect();
        let ok = || runs.iter().filter(|(ok, _, _)| *ok);
        let walls = stat(ok().map(|(_, wall_ms, _)| wall_ms / 1000.0));
        RunTimes {
            runs: runs.len(),
            ok_runs: ok().count(),
            wall_s: runs
                .iter()
                .map(|(_, wall_ms, _)| wall_ms / 1000.0)
                .collect(),
            ok: runs.iter().map(|(ok, _, _)| *ok).collect(),
            median_s: walls.median,
            min_s: walls.min,
            max_s: walls.max,
            virtual_s: median_u64(ok().filter_map(|(_, _, ns)| ns.map(VirtNanos::as_nanos)))
                .map(|v| v as f64 / 1e9),
        }
    }

    /// Whether every run succeeded.
    pub fn all_ok(&self) -> bool {
        self.ok_runs == self.runs
    }

    /// "OK/RUNS".
    pub fn tally(&self) -> String {
        format!("{}/{}", self.ok_runs, self.runs)
    }

    /// Each run's wall time (s), a failed one marked `!`; `-` for none.
    pub fn per_run(&self) -> String {
        if self.wall_s.is_empty() {
            return "-".into();
        }
        self.wall_s
            .iter()
            .zip(&self.ok)
            .map(|(w, ok)| format!("{w:.1}{}", if *ok { "" } else { "!" }))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Each failed run's error, as "run N: ERROR".
pub fn run_failures<'a>(errors: impl IntoIterator<Item = Option<&'a String>>) -> Vec<String> {
    errors
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|e| format!("run {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flattened into a report, where the guests ran reads as the report's own two fields, in
    /// place, as before it was one type.
    #[test]
    fn where_reads_as_two_fields_of_the_report() {
        #[derive(Serialize)]
        struct Report {
            before: u8,
            #[serde(flatten)]
            place: Where,
            after: u8,
        }
        let json = |placement: &Placement| {
            serde_json::to_string(&Report {
                before: 1,
                place: Where::from(placement),
                after: 2,
            })
            .unwrap()
        };
        let helper = Placement::HelperVm {
            reason: "--host-vm always".into(),
        };
        assert_eq!(
            json(&helper),
            r#"{"before":1,"placement":"helper VM","placement_reason":"--host-vm always","after":2}"#
        );
        assert_eq!(
            json(&Placement::Host),
            r#"{"before":1,"placement":"host","placement_reason":null,"after":2}"#
        );
        assert!(
            Where::from(&helper).in_helper_vm() && !Where::from(&Placement::Host).in_helper_vm()
        );
    }

    #[test]
    fn run_times_of_ok_and_failed_runs() {
        let times = RunTimes::of([
            (true, 2500.0, Some(VirtNanos::from_secs(3))),
            (false, 100.0, None),
        ]);
        assert_eq!((times.tally(), times.all_ok()), ("1/2".to_string(), false));
        assert_eq!(times.per_run(), "2.5 0.1!");
        assert_eq!((times.median_s, times.virtual_s), (Some(2.5), Some(3.0)));
        assert_eq!(RunTimes::of([]).per_run(), "-");
    }
}
