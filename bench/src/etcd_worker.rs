//! The detvisor side of `bench etcd` (and of `bench exits`' etcd scenarios): the etcd
//! example's `up` run through the run library, in the worker's process on a thread of its own
//! (inside the helper VM when the host's KVM cannot run guests), each run judged into an
//! [`EtcdRun`] that the QEMU TCG baseline ([`crate::etcd_baseline`]) fills in too.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::machine::{uptime, TempDir};
use crate::process::{last_lines, run_in_process, Watch};
use crate::report::WorkerReport;
use crate::say;
use crate::stats::ms;
use run::client::{Calls, Local, RunnerError};
use run::up::{PreparedUp, UpOptions};
use vmm::VirtNanos;

/// One run of either side.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct EtcdRun {
    pub ok: bool,
    /// Process spawn to exit (QEMU), the request's call to its return (detvisor) (ms).
    pub wall_ms: f64,
    pub error: Option<String>,
    /// The run's status (detvisor's JSON `status`; QEMU: the byte written to port 0x610).
    pub status: Option<u8>,
    /// Guest time at the end (detvisor: virtual time; QEMU: the guest's uptime when the
    /// workload ended, which icount ties to instructions).
    pub virtual_ns: Option<VirtNanos>,
    /// detvisor's exits (its JSON); QEMU TCG has none.
    pub exits: Option<u64>,
    /// detvisor's `vm::run` (its JSON `wall_ms`).
    pub inner_wall_ms: Option<u64>,
    /// detvisor's run digest, or FNV-1a 64 of QEMU's serial bytes.
    pub output: Option<String>,
    pub output_bytes: Option<u64>,
    /// The end of the workload's output.
    pub workload_tail: Option<String>,
}

impl EtcdRun {
    pub fn failed(e: &anyhow::Error) -> Self {
        EtcdRun {
            error: Some(format!("{e:#}")),
            ..EtcdRun::default()
        }
    }
}

/// What the worker runs; paths as seen where it runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct EtcdWorkerPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub seed: u64,
    pub until: VirtNanos,
    /// The guest, assembled on the host (its initrd a file).
    pub prepared: PreparedUp,
    pub place: String,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct EtcdWorkerReport {
    pub place: String,
    pub uptime_at_start_s: Option<f64>,
    pub elapsed_ms: f64,
    pub runs: Vec<EtcdRun>,
    pub error: Option<String>,
    pub command: Vec<String>,
}

impl WorkerReport for EtcdWorkerReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
}

/// The options `detvisor up --seed S --until T --logs LOGS --quiet` runs with.
fn up_options(plan: &EtcdWorkerPlan, logs: &Path) -> Result<UpOptions> {
    Ok(UpOptions {
        until: Some(plan.until),
        logs: Some(logs.to_path_buf()),
        ..UpOptions::new(plan.seed)
    })
}

/// One `up` run through the run library: its summary as `detvisor up --json` prints it (or why
/// there is none), and the end of its events (what `detvisor up` writes to stderr).
pub fn up_summary(
    prepared: PreparedUp,
    options: UpOptions,
) -> (Result<serde_json::Value, String>, String) {
    let mut here = Local::new(run::streams::Captured::default());
    let summary = Calls::new(&mut here)
        .up(prepared, options)
        .map_err(RunnerError::into_cause)
        .and_then(|summary| serde_json::to_value(summary).map_err(|e| e.to_string()));
    (summary, last_lines(&here.streams().stderr_text(), 20))
}

/// Judges an `up` run that took `wall`: its summary (as `detvisor up --json` prints it), or why
/// there is none.
pub fn detvisor_result(
    (summary, events): (Result<serde_json::Value, String>, String),
    wall: Duration,
    logs: &Path,
) -> EtcdRun {
    let mut r = EtcdRun {
        wall_ms: ms(wall),
        ..EtcdRun::default()
    };
    let (summary, failure) = match summary {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e)),
    };
    if let Some(s) = &summary {
        let u = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
        r.status = u("status").and_then(|v| u8::try_from(v).ok());
        r.virtual_ns = u("virtual_ns").map(VirtNanos);
        r.exits = u("exits");
        r.inner_wall_ms = u("wall_ms");
        r.output = s.get("digest").and_then(|d| d.as_str()).map(String::from);
        r.output_bytes = u("console_bytes");
    }
    let workload = fs::read(logs.join("workload.log")).unwrap_or_default();
    r.workload_tail = Some(last_lines(&String::from_utf8_lossy(&workload), 14));
    r.ok = summary.is_some() && r.status == Some(0);
    if !r.ok {
        // What each node said (`<logs>/<node>.log`): why it ended, when it did.
        let mut nodes: Vec<PathBuf> = fs::read_dir(logs)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        nodes.retain(|p| p.extension().is_some_and(|e| e == "log") && !p.ends_with("workload.log"));
        nodes.sort();
        let node_tails: String = nodes
            .iter()
            .map(|p| {
                let text = fs::read(p).unwrap_or_default();
                format!(
                    "\n  {} ends with:\n{}",
                    p.file_name().unwrap_or_default().to_string_lossy(),
                    last_lines(&String::from_utf8_lossy(&text), 4)
                )
            })
            .collect();
        let what = if let Some(failure) = &failure {
            format!("detvisor up: {failure}")
        } else {
            format!(
                "detvisor up: status {:?} (stop {}, virtual {} s, {} exits); its events end \
                 with:\n{events}\n  the workload's output ends with:\n{}",
                r.status,
                summary
                    .as_ref()
                    .and_then(|s| s.get("stop"))
                    .map_or("?".into(), |v| v.to_string()),
                r.virtual_ns
                    .map_or("?".into(), |v| format!("{:.3}", v.0 as f64 / 1e9)),
                r.exits.map_or("?".into(), |e| e.to_string()),
                r.workload_tail.as_deref().unwrap_or("")
            )
        };
        r.error = Some(what + &node_tails);
    }
    r
}

/// The detvisor runs (inside the helper VM, or in this process on a host that runs guests).
pub fn worker(plan: &EtcdWorkerPlan) -> EtcdWorkerReport {
    let started = Instant::now();
    let mut report = EtcdWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..EtcdWorkerReport::default()
    };
    let scratch = match TempDir::new("detvisor-bench-etcd-") {
        Ok(t) => t,
        Err(e) => {
            report.error = Some(format!("cannot create a scratch directory: {e}"));
            return report;
        }
    };
    let limit = Duration::from_secs(plan.timeout_s);
    report.command = vec![
        "run::api::Request::Up, in process:".into(),
        format!(
            "{} node(s), kernel {}, seed {}, until {}, logs in {}",
            plan.prepared.node_names.len(),
            plan.prepared.kernel.display(),
            plan.seed,
            plan.until,
            scratch.path().join("logs-N").display()
        ),
    ];
    let n = plan.runs;
    for i in 1..=n {
        let logs = scratch.path().join(format!("logs-{i}"));
        let options = match up_options(plan, &logs) {
            Ok(o) => o,
            Err(e) => {
                report.runs.push(EtcdRun::failed(&e));
                continue;
            }
        };
        let prepared = plan.prepared.clone();
        let done = run_in_process(
            move || up_summary(prepared, options),
            limit,
            Watch::default(),
        );
        let outcome = done.result.unwrap_or_else(|| {
            let why = if done.timed_out {
                format!("abandoned at the {} s time limit", limit.as_secs())
            } else {
                "the run's thread panicked".into()
            };
            (Err(why), String::new())
        });
        let r = detvisor_result(outcome, done.wall, &logs);
        say!(
            "bench [{}]: detvisor run {i}/{n}: {}",
            plan.place,
            describe(&r)
        );
        report.runs.push(r);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

pub fn describe(r: &EtcdRun) -> String {
    if r.ok {
        let mut s = format!("{:.1} s", r.wall_ms / 1000.0);
        if let Some(v) = r.virtual_ns {
            s.push_str(&format!(", virtual {:.3} s", v.0 as f64 / 1e9));
        }
        if let Some(e) = r.exits {
            s.push_str(&format!(", {e} exits"));
        }
        if let Some(o) = &r.output {
            s.push_str(&format!(", output {o}"));
        }
        s
    } else {
        format!("FAILED: {}", r.error.as_deref().unwrap_or("unknown error"))
    }
}
