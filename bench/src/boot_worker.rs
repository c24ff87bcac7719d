//! The `bench boot` worker: detvisor and QEMU-KVM side by side, runs interleaved, inside the
//! helper VM or on the host; and what one run of each system gives. detvisor runs in this
//! process through the run library (`Request::Run`, what `detvisor run` sends), QEMU as a
//! process.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::machine::{uptime, TempDir};
use super::monitor::{kvm_stats_available, MemoryPeak};
use super::process::{command_words, run_in_process, InProcess, Watch};
use super::qemu::{Accel, QemuFiles, QemuPlan, QemuRun};
use super::report::{RunResult, WorkerReport};
use super::stats::ms;
use crate::say;
use run::client::{Calls, Local};
use run::outcome::RunSummary;
use run::plain::GuestSpec;

/// The command the guest runs.
pub const GUEST_COMMAND: &str = "true";

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

/// A plain run to its end through the run library (its console thrown away).
pub fn run_plain(guest: GuestSpec) -> anyhow::Result<RunSummary> {
    let mut here = Local::new(run::streams::Discard);
    Calls::new(&mut here)
        .run(guest, None, None, None)
        .map_err(|e| anyhow::Error::msg(e.into_cause()))
}

/// The guest `detvisor run --mem MEM --cmdline CMDLINE -- true` boots, with the plan's kernel
/// and initrd (the CLI's defaults otherwise).
pub fn detvisor_guest(plan: &WorkerPlan) -> GuestSpec {
    GuestSpec {
        exit_path: vmm::ExitPath::default(),
        seed: 0,
        kernel: Some(plan.kernel.clone()),
        initrd: Some(plan.initrd.clone()),
        cmdline: Some(plan.cmdline.clone()),
        ram_bytes: plan.ram_bytes,
        until: None,
        rtc_epoch_unix_secs: 1_704_067_200,
        network: None,
        command: vec![GUEST_COMMAND.into()],
        stall_timeout: Default::default(),
        clock: vmm::ClockKind::Exit,
        pmu_counter: Default::default(),
    }
}

/// How a detvisor run is described in the report's `command`.
pub fn request_words(what: &str, guest: &GuestSpec) -> Vec<String> {
    vec![
        what.into(),
        serde_json::to_string(guest).unwrap_or_else(|e| e.to_string()),
    ]
}

/// Judges a finished detvisor run (its summary, or why there is none), timed by `wall`.
pub fn detvisor_result(
    summary: Result<RunSummary, String>,
    wall: Duration,
    timed_out: Option<Duration>,
) -> RunResult {
    let mut r = RunResult {
        wall_ms: ms(wall),
        ..RunResult::default()
    };
    let summary = match (summary, timed_out) {
        (_, Some(limit)) => {
            r.error = Some(format!(
                "the run was abandoned at the {} s time limit",
                limit.as_secs()
            ));
            return r;
        }
        (Err(e), None) => {
            r.error = Some(e);
            return r;
        }
        (Ok(s), None) => s,
    };
    r.guest_status = summary.exit_status;
    r.vmm_exits = Some(summary.exits);
    r.inner_wall_ms = Some(summary.wall_ms);
    r.inner_setup_ms = Some(summary.wall_setup_ms);
    r.inner_finish_ms = Some(summary.wall_finish_ms);
    r.output = Some(summary.digest.clone());
    r.output_bytes = Some(summary.console_bytes);
    r.ok = r.guest_status == Some(0);
    if !r.ok {
        r.error = Some(format!(
            "the guest reported status {:?}, not 0",
            r.guest_status
        ));
    }
    r
}

/// One detvisor run in this process, on a thread of its own, watched as `sample` and `stats`
/// ask.
fn run_detvisor(plan: &WorkerPlan, sample: bool, stats: bool) -> (RunResult, Option<MemoryPeak>) {
    let limit = Duration::from_secs(plan.timeout_s);
    let watch = Watch {
        ram: sample.then_some(plan.ram_bytes),
        kvm: stats,
    };
    let guest = detvisor_guest(plan);
    let done: InProcess<Result<RunSummary, String>> = run_in_process(
        move || run_plain(guest).map_err(|e| format!("{e:#}")),
        limit,
        watch,
    );
    let summary = done
        .result
        .unwrap_or_else(|| Err("the run's thread panicked".into()));
    let mut r = detvisor_result(summary, done.wall, done.timed_out.then_some(limit));
    r.kvm = done.kvm;
    (r, done.memory)
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
    report.detvisor.command =
        request_words("run::api::Request::Run, in process:", &detvisor_guest(plan));
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
        let (r, _) = run_detvisor(plan, false, false);
        say!("{tag}: detvisor run {i}/{n}: {}", describe(&r));
        report.detvisor.runs.push(r);
        if let Some(q) = &qemu {
            let (r, _) = q.run(i, false, false);
            say!("{tag}: QEMU-KVM run {i}/{n}: {}", describe(&r));
            report.qemu_kvm.runs.push(r);
        }
    }
    // The instrumented runs: memory sampling and KVM statistics, kept out of the timed runs
    // (holding a VM's stat files open also defers its teardown past the process's exit).
    let (r, mem) = run_detvisor(plan, true, stats);
    record_instrumented(&mut report.detvisor, &tag, "detvisor", r, mem);
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
            say!(
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
