//! The `bench boot` worker: detvisor and QEMU-KVM side by side, runs interleaved, inside the
//! helper VM or on the host; and what one run of each system gives.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::boot::GUEST_COMMAND;
use super::helper::WorkerReport;
use super::machine::{uptime, TempDir};
use super::monitor::{kvm_stats_available, MemoryPeak};
use super::process::{last_lines, run_timed, ErrMode, Finished, Watch};
use super::qemu::{Accel, QemuFiles, QemuPlan, QemuRun};
use super::stats::ms;

// ---------------------------------------------------------------------------------------------
// Plans and results exchanged between the host and the helper VM.

/// What the worker measures (detvisor and QEMU-KVM); paths as seen where it runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct WorkerPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub mem: String,
    pub ram_bytes: u64,
    pub cmdline: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub bzimage: PathBuf,
    /// `initrd` with the command archive appended (exactly what detvisor builds).
    pub qemu_initrd: PathBuf,
    pub qemu: Option<QemuPlan>,
    /// Why QEMU-KVM cannot be measured, when `qemu` is `None`.
    pub qemu_error: Option<String>,
    /// Inside the helper VM: may mount debugfs for KVM statistics.
    pub in_helper_vm: bool,
    pub place: String,
}

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

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct SystemResult {
    /// The timed runs.
    pub runs: Vec<RunResult>,
    /// One more run, with memory sampling and KVM statistics (not in the wall statistics).
    pub instrumented: Option<RunResult>,
    pub memory: Option<MemoryPeak>,
    pub memory_error: Option<String>,
    /// Set when the system could not be measured at all.
    pub error: Option<String>,
    /// Set when the system was deliberately not measured.
    pub skipped: Option<String>,
    pub command: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct BootWorkerReport {
    place: String,
    uptime_at_start_s: Option<f64>,
    elapsed_ms: f64,
    /// "L1 debugfs" when KVM statistics were recorded, else why not.
    pub kvm_stats: String,
    pub detvisor: SystemResult,
    pub qemu_kvm: SystemResult,
}

impl WorkerReport for BootWorkerReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
}

// ---------------------------------------------------------------------------------------------
// One run of detvisor.

/// Runs one measured process, watching what `watch` asks for, and judges its end with `judge`;
/// a process that cannot be started is a failed run.
pub fn run_measured(
    cmd: Command,
    limit: Duration,
    watch: Watch,
    judge: impl FnOnce(&Finished) -> RunResult,
) -> (RunResult, Option<MemoryPeak>) {
    match run_timed(cmd, limit, ErrMode::Capture, watch) {
        Ok(finished) => (judge(&finished), finished.memory),
        Err(e) => (RunResult::failed(&e), None),
    }
}

fn detvisor_command(detvisor: &Path, plan: &WorkerPlan) -> Command {
    let mut cmd = Command::new(detvisor);
    cmd.arg("run")
        .args(["--host-vm", "never", "--kernel"])
        .arg(&plan.kernel)
        .arg("--initrd")
        .arg(&plan.initrd)
        .args([
            "--mem",
            &plan.mem,
            "--cmdline",
            &plan.cmdline,
            "--json",
            "--",
        ])
        .arg(GUEST_COMMAND);
    cmd
}

pub fn command_words(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The JSON summary `detvisor run --json` prints as its last stdout line.
fn detvisor_summary(finished: &Finished) -> Option<serde_json::Value> {
    finished
        .lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with('{'))
        .and_then(|(_, l)| serde_json::from_str(l).ok())
}

/// Judges a finished `detvisor run --json -- true`.
pub fn detvisor_result(finished: &Finished, limit: Duration, what: &str) -> RunResult {
    let mut r = RunResult {
        wall_ms: ms(finished.wall),
        ..RunResult::default()
    };
    let summary = detvisor_summary(finished);
    if let Some(s) = &summary {
        let u = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
        r.guest_status = u("exit_status").and_then(|v| u8::try_from(v).ok());
        r.vmm_exits = u("exits");
        r.inner_wall_ms = u("wall_ms");
        r.inner_setup_ms = u("wall_setup_ms");
        r.inner_finish_ms = u("wall_finish_ms");
        r.output = s.get("digest").and_then(|d| d.as_str()).map(String::from);
        r.output_bytes = u("console_bytes");
    }
    let exited_ok = finished.succeeded();
    r.ok = exited_ok && r.guest_status == Some(0);
    if !r.ok {
        r.error = Some(if !exited_ok {
            finished.failure(what, limit)
        } else if summary.is_none() {
            format!(
                "{what} printed no JSON summary; stdout ends with:\n{}",
                last_lines(&finished.stdout_text(), 8)
            )
        } else {
            format!("the guest reported status {:?}, not 0", r.guest_status)
        });
    }
    r
}

fn run_detvisor(
    detvisor: &Path,
    plan: &WorkerPlan,
    sample: bool,
    stats: bool,
) -> (RunResult, Option<MemoryPeak>) {
    let limit = Duration::from_secs(plan.timeout_s);
    let watch = Watch {
        ram: sample.then_some(plan.ram_bytes),
        kvm: stats,
    };
    run_measured(detvisor_command(detvisor, plan), limit, watch, |finished| {
        let mut r = detvisor_result(finished, limit, "detvisor");
        r.kvm = finished.kvm.clone();
        r
    })
}

/// A run in one line of progress.
pub fn describe(r: &RunResult) -> String {
    if r.ok {
        let mut s = format!("{:.0} ms", r.wall_ms);
        if let Some(e) = r.vmm_exits {
            s.push_str(&format!(", {e} exits"));
        }
        if let Some(k) = r.kvm.as_ref().and_then(|k| k.get("exits")) {
            s.push_str(&format!(", {k} KVM exits"));
        }
        s
    } else {
        format!("FAILED: {}", r.error.as_deref().unwrap_or("unknown error"))
    }
}

// ---------------------------------------------------------------------------------------------
// The worker: detvisor and QEMU-KVM side by side (inside the helper VM, or on the host).

pub fn worker(plan: &WorkerPlan) -> BootWorkerReport {
    let started = Instant::now();
    let tag = format!("bench [{}]", plan.place);
    let mut report = BootWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..BootWorkerReport::default()
    };
    report.kvm_stats = kvm_stats_available(plan.in_helper_vm);
    let stats = report.kvm_stats == "debugfs";
    let detvisor = match std::env::current_exe() {
        Ok(p) => Some(p),
        Err(e) => {
            report.detvisor.error = Some(format!("cannot locate the detvisor executable: {e}"));
            None
        }
    };
    if let Some(d) = &detvisor {
        report.detvisor.command = command_words(&detvisor_command(d, plan));
    }
    let scratch = match TempDir::new("detvisor-bench-") {
        Ok(t) => Some(t),
        Err(e) => {
            report.qemu_kvm.error = Some(format!("cannot create a scratch directory: {e}"));
            None
        }
    };
    let qemu = match (&plan.qemu, &scratch) {
        (Some(q), Some(dir)) => Some(QemuRun {
            q,
            accel: Accel::Kvm,
            files: QemuFiles {
                bzimage: &plan.bzimage,
                initrd: &plan.qemu_initrd,
                cmdline: &plan.cmdline,
                mem: &plan.mem,
            },
            scratch: dir.path(),
            label: "qemu-kvm",
            limit: Duration::from_secs(plan.timeout_s),
            ram_bytes: plan.ram_bytes,
        }),
        (None, _) => {
            report.qemu_kvm.error = plan
                .qemu_error
                .clone()
                .or_else(|| Some("QEMU unavailable".into()));
            None
        }
        _ => None,
    };
    if let Some(q) = &qemu {
        report.qemu_kvm.command = command_words(&q.command(0).0);
    }
    let n = plan.runs;
    for i in 1..=n {
        if let Some(d) = &detvisor {
            let (r, _) = run_detvisor(d, plan, false, false);
            eprintln!("{tag}: detvisor run {i}/{n}: {}", describe(&r));
            report.detvisor.runs.push(r);
        }
        if let Some(q) = &qemu {
            let (r, _) = q.run(i, false, false);
            eprintln!("{tag}: QEMU-KVM run {i}/{n}: {}", describe(&r));
            report.qemu_kvm.runs.push(r);
        }
    }
    // The instrumented runs: memory sampling and KVM statistics, kept out of the timed runs
    // (holding a VM's stat files open also defers its teardown past the process's exit).
    if let Some(d) = &detvisor {
        let (r, mem) = run_detvisor(d, plan, true, stats);
        record_instrumented(&mut report.detvisor, &tag, "detvisor", r, mem);
    }
    if let Some(q) = &qemu {
        let (r, mem) = q.run(n + 1, true, stats);
        record_instrumented(&mut report.qemu_kvm, &tag, "QEMU-KVM", r, mem);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

pub fn record_instrumented(
    sys: &mut SystemResult,
    tag: &str,
    name: &str,
    r: RunResult,
    mem: Option<MemoryPeak>,
) {
    sys.instrumented = Some(r.clone());
    match (r.ok, mem) {
        (true, Some(m)) if m.samples > 0 => {
            eprintln!(
                "{tag}: {name} instrumented run: {}; VmHWM {} MiB, {} MiB beyond guest RAM \
                 ({} samples)",
                describe(&r),
                m.vm_hwm_kib >> 10,
                m.beyond_guest_ram_kib >> 10,
                m.samples
            );
            sys.memory = Some(m);
        }
        (true, _) => {
            sys.memory_error = Some("the process ended before the first sample".into());
        }
        (false, _) => {
            sys.memory_error = Some(format!(
                "the instrumented run failed: {}",
                r.error.unwrap_or_default()
            ));
        }
    }
}
