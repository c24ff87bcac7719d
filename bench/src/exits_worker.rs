//! The `bench exits` worker: every scenario under every system, runs interleaved (detvisor new
//! 1, detvisor old 1, QEMU-KVM 1, detvisor new 2, ...), inside the helper VM or on the host; what
//! one run of each gives; and the one place that selects detvisor's exit path
//! ([`set_exit_path`]).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::etcd_baseline::{rtc_base, CLOCKSOURCE_FILE, DONE_MARK};
use super::etcd_worker::{detvisor_result, up_summary, EtcdRun};
use super::machine::{uptime, TempDir};
use super::monitor::kvm_stats_available;
use super::process::{command_words, last_lines, run_in_process, run_timed, Watch};
use super::qemu::{qemu_command, qemu_failure, Accel, QemuFiles, QemuPlan};
use super::report::WorkerReport;
use super::stats::{fnv1a, ms};
use crate::say;
use run::client::{Calls, Local, RunnerError};
use run::outcome::RunSummary;
use run::plain::GuestSpec;
use run::up::{PreparedUp, UpOptions};
use vmm::VirtNanos;

/// The marker of the line the boot scenario's command prints (then the clocksource, `uptime`
/// and the guest's uptime in seconds).
pub const BOOT_MARK: &str = "exits-bench: clocksource ";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Boot the default guest and run a trivial command.
    Boot,
    /// The etcd smoke run (`bench etcd`'s).
    Smoke,
    /// The etcd partition scenario (examples/etcd/partition.toml).
    Partition,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Boot => "boot",
            Scenario::Smoke => "smoke",
            Scenario::Partition => "partition",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Scenario::Boot => "boot the default guest, print its clocksource, end",
            Scenario::Smoke => "examples/etcd/cluster.toml: 3 members healthy, a put and a get",
            Scenario::Partition => {
                "examples/etcd/partition.toml: 3 members, n1 cut off at 20 s for 10 s"
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    DetvisorNew,
    DetvisorOld,
    QemuKvm,
}

impl System {
    pub const ALL: [System; 3] = [System::DetvisorNew, System::DetvisorOld, System::QemuKvm];

    pub fn name(self) -> &'static str {
        match self {
            System::DetvisorNew => "detvisor new (clock page)",
            System::DetvisorOld => "detvisor old (legacy)",
            System::QemuKvm => "QEMU -accel kvm",
        }
    }
}

/// The boot scenario's command: `bench boot`'s (`true`: boot, run a trivial command, end) made
/// to print the clocksource the kernel chose and the guest's uptime, one line.
pub fn boot_command() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "echo \"{BOOT_MARK}$(cat {CLOCKSOURCE_FILE}) uptime $(cut -d' ' -f1 /proc/uptime)\""
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// detvisor's exit path.

/// detvisor's exit path: the library's one type.
pub use vmm::ExitPath;

/// Whether the run library can select the exit path (`exit_path: vmm::ExitPath` in
/// `run::plain::GuestSpec` and `run::up::UpOptions`); the report says so when it cannot.
pub const EXIT_PATH_SELECTABLE: bool = true;

/// A request's options that carry the exit path.
pub enum ExitPathTarget<'a> {
    Plain(&'a mut GuestSpec),
    Up(&'a mut UpOptions),
}

/// Selects `path` for a run: the one place that knows the library's option.
pub fn set_exit_path(target: ExitPathTarget<'_>, path: ExitPath) {
    match target {
        ExitPathTarget::Plain(guest) => guest.exit_path = path,
        ExitPathTarget::Up(options) => options.exit_path = path,
    }
}

// ---------------------------------------------------------------------------------------------
// Plans and results.

/// A scenario's guests; paths as seen where the worker runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub enum ScenarioGuest {
    /// A plain run of the boot command.
    Plain { kernel: PathBuf, initrd: PathBuf },
    /// An `up` run.
    Up(Box<PreparedUp>),
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ScenarioPlan {
    pub scenario: Scenario,
    pub mem: String,
    pub ram_bytes: u64,
    pub guest: ScenarioGuest,
    /// What QEMU boots: the bzImage and the initrd with the scenario's script (boot: the
    /// command).
    pub bzimage: PathBuf,
    pub qemu_initrd: PathBuf,
    pub rtc_epoch: i64,
    /// Why this scenario cannot be run (it could not be assembled).
    pub error: Option<String>,
    /// Why QEMU-KVM cannot run it (e.g. a fault its script does not model).
    pub qemu_error: Option<String>,
}

/// What the worker runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ExitsPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub seed: u64,
    /// detvisor's virtual-time limit (`up --until`).
    pub until: VirtNanos,
    pub cmdline: String,
    /// QEMU-KVM's kernel command line: `cmdline` and `--qemu-append` (and the TSC words the
    /// worker adds for `qemu_tsc`).
    pub qemu_cmdline: String,
    /// Give QEMU-KVM's guest the TSC as its clocksource ([`tsc_words`]).
    pub qemu_tsc: bool,
    pub qemu: Option<QemuPlan>,
    /// Why QEMU-KVM cannot be measured, when `qemu` is `None`.
    pub qemu_error: Option<String>,
    /// QEMU-KVM's `-cpu`.
    pub qemu_cpu: String,
    /// Read the KVM statistics of every run's VM (debugfs of the kernel the runs are on).
    pub kvm_stats: bool,
    pub scenarios: Vec<ScenarioPlan>,
    pub place: String,
}

/// One run of one system.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ExitsRun {
    pub ok: bool,
    /// QEMU: process spawn to exit; detvisor: the request's call to its return (ms).
    pub wall_ms: f64,
    pub error: Option<String>,
    pub status: Option<u8>,
    /// detvisor: virtual time; QEMU: the guest's uptime when the workload ended.
    pub virtual_ns: Option<VirtNanos>,
    pub exits: Option<u64>,
    pub exits_by_kind: BTreeMap<String, u64>,
    /// detvisor's `vm::run` (its summary's `wall_ms`).
    pub inner_wall_ms: Option<u64>,
    /// detvisor's run digest, or FNV-1a 64 of QEMU's serial bytes.
    pub output: Option<String>,
    /// The clocksource the guest said it used (`current_clocksource`), when it said.
    pub clocksource: Option<String>,
    /// QEMU: the kernel's messages about clocks in its serial output (`tsc`, `clocksource`,
    /// `hpet`, `kvm-clock`; printed only with `--qemu-append loglevel=8`), at most 30.
    #[serde(default)]
    pub clock_log: Vec<String>,
    /// The KVM statistics of the run's VM (debugfs: `exits`, `io_exits`, ...), when read.
    pub kvm: Option<BTreeMap<String, u64>>,
    pub workload_tail: Option<String>,
}

impl ExitsRun {
    fn failed(error: String) -> Self {
        ExitsRun {
            error: Some(error),
            ..ExitsRun::default()
        }
    }
}

impl From<EtcdRun> for ExitsRun {
    fn from(r: EtcdRun) -> Self {
        ExitsRun {
            ok: r.ok,
            wall_ms: r.wall_ms,
            error: r.error,
            status: r.status,
            virtual_ns: r.virtual_ns,
            exits: r.exits,
            inner_wall_ms: r.inner_wall_ms,
            output: r.output,
            workload_tail: r.workload_tail,
            ..ExitsRun::default()
        }
    }
}

/// One scenario under one system.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Cell {
    pub scenario: Scenario,
    pub system: System,
    pub runs: Vec<ExitsRun>,
    pub command: Vec<String>,
    /// Set when the system could not run the scenario at all.
    pub error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct ExitsWorkerReport {
    pub place: String,
    /// QEMU-KVM's kernel command line as run.
    pub qemu_cmdline: String,
    /// "debugfs" when the runs' KVM statistics were read, else why not.
    pub kvm_stats: String,
    pub uptime_at_start_s: Option<f64>,
    pub elapsed_ms: f64,
    pub cells: Vec<Cell>,
    pub error: Option<String>,
}

impl WorkerReport for ExitsWorkerReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
}

// ---------------------------------------------------------------------------------------------
// QEMU-KVM.

/// QEMU-KVM's command line: `bench boot`'s (`-accel kvm -M pc`, serial and status in files,
/// `-no-reboot`) with `-cpu CPU` and `-rtc base=` the scenario's epoch.
pub fn qemu_kvm_command(
    q: &QemuPlan,
    files: &QemuFiles,
    cpu: &str,
    rtc_epoch: i64,
    serial: &Path,
    status: &Path,
) -> Command {
    let mut cmd = qemu_command(q, Accel::Kvm, files, serial, status);
    cmd.args(["-cpu", cpu, "-rtc"])
        .arg(format!("base={}", rtc_base(rtc_epoch)));
    cmd
}

/// The clocksource in a guest's output: the word after `bench: clocksource ` (the boot
/// command's line or the etcd script's).
pub fn clocksource_in(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("bench: clocksource ")?;
        rest.split_whitespace().next().map(String::from)
    })
}

/// The kernel command-line words that give QEMU-KVM's guest the TSC as its clocksource, its
/// rate `cpu MHz` of this machine's `/proc/cpuinfo`. In nested KVM the guest kernel cannot
/// calibrate the TSC (against neither PIT nor HPET/PM timer: "Marking TSC unstable due to could
/// not calculate TSC khz") and falls back to the HPET, every clock read an exit to QEMU.
pub fn tsc_words(cpuinfo: &str) -> Option<String> {
    let mhz: f64 = cpuinfo.lines().find_map(|l| {
        l.strip_prefix("cpu MHz")?
            .split(':')
            .nth(1)?
            .trim()
            .parse()
            .ok()
    })?;
    let khz = (mhz * 1000.0).round() as u64;
    (khz > 0).then(|| format!("tsc_early_khz={khz} tsc=reliable clocksource=tsc"))
}

/// The kernel's messages about clocks in a serial output (at most 30).
pub fn clock_log(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            !l.contains("bench: clocksource ")
                && ["tsc", "clocksource", "hpet", "kvm-clock"]
                    .iter()
                    .any(|w| l.contains(w))
        })
        .take(30)
        .map(|l| l.trim_end().to_string())
        .collect()
}

/// The guest's uptime (s) the boot command's line or the etcd script's last line gives.
pub fn uptime_in(text: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.contains(BOOT_MARK) || l.starts_with(DONE_MARK))
        .find_map(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "uptime")
                .nth(1)
                .and_then(|u| u.parse::<f64>().ok())
        })
}

fn qemu_kvm_run(
    plan: &ExitsPlan,
    s: &ScenarioPlan,
    q: &QemuPlan,
    (dir, i, stats): (&Path, u32, bool),
) -> ExitsRun {
    let serial_path = dir.join(format!("qemu-kvm-{:?}-{i}.serial", s.scenario));
    let status_path = dir.join(format!("qemu-kvm-{:?}-{i}.status", s.scenario));
    let _ = fs::remove_file(&serial_path);
    let _ = fs::remove_file(&status_path);
    let files = QemuFiles {
        bzimage: &s.bzimage,
        initrd: &s.qemu_initrd,
        cmdline: &plan.qemu_cmdline,
        mem: &s.mem,
    };
    let cmd = qemu_kvm_command(
        q,
        &files,
        &plan.qemu_cpu,
        s.rtc_epoch,
        &serial_path,
        &status_path,
    );
    let limit = Duration::from_secs(plan.timeout_s);
    let watch = Watch {
        ram: None,
        kvm: stats,
    };
    let finished = match run_timed(cmd, limit, watch) {
        Ok(f) => f,
        Err(e) => return ExitsRun::failed(format!("{e:#}")),
    };
    let serial = fs::read(&serial_path).unwrap_or_default();
    let status = fs::read(&status_path).unwrap_or_default();
    let text = String::from_utf8_lossy(&serial);
    let upto: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with(DONE_MARK))
        .collect();
    let error = qemu_failure(&finished, &status, &serial, 20, limit).map(|e| {
        if finished.succeeded() {
            e // it has the serial output's end already
        } else {
            format!("{e}; serial ends with:\n{}", last_lines(&text, 20))
        }
    });
    ExitsRun {
        ok: error.is_none(),
        wall_ms: ms(finished.wall),
        error,
        status: (status.len() == 1).then(|| status[0]),
        virtual_ns: uptime_in(&text).map(|u| VirtNanos((u * 1e9).round() as u64)),
        output: Some(fnv1a(&serial)),
        clocksource: clocksource_in(&text),
        clock_log: clock_log(&text),
        kvm: finished.kvm,
        workload_tail: Some(last_lines(&upto.join("\n"), 14)),
        ..ExitsRun::default()
    }
}

// ---------------------------------------------------------------------------------------------
// detvisor.

/// The guest of the boot scenario: `detvisor run --cmdline CMDLINE -- <boot command>`.
pub fn boot_guest(plan: &ExitsPlan, s: &ScenarioPlan, kernel: &Path, initrd: &Path) -> GuestSpec {
    GuestSpec {
        seed: plan.seed,
        kernel: Some(kernel.to_path_buf()),
        initrd: Some(initrd.to_path_buf()),
        cmdline: Some(plan.cmdline.clone()),
        ram_bytes: s.ram_bytes,
        rtc_epoch_unix_secs: s.rtc_epoch,
        command: boot_command(),
        ..GuestSpec::default()
    }
}

/// A plain run's summary and console.
fn plain_run(guest: GuestSpec) -> (Result<RunSummary, String>, String) {
    let mut here = Local::new(run::streams::Captured::default());
    let summary = Calls::new(&mut here)
        .run(guest, None, None, None)
        .map_err(RunnerError::into_cause);
    (summary, here.streams().stdout_text())
}

fn plain_result(
    (summary, console): (Result<RunSummary, String>, String),
    wall: Duration,
) -> ExitsRun {
    let mut r = match summary {
        Err(e) => return ExitsRun::failed(e),
        Ok(s) => ExitsRun {
            ok: s.exit_status == Some(0),
            status: s.exit_status,
            virtual_ns: Some(s.virtual_ns),
            exits: Some(s.exits),
            exits_by_kind: s.exits_by_kind,
            inner_wall_ms: Some(s.wall_ms),
            output: Some(s.digest),
            ..ExitsRun::default()
        },
    };
    r.wall_ms = ms(wall);
    r.clocksource = clocksource_in(&console);
    r.workload_tail = Some(last_lines(&console, 4));
    if !r.ok {
        r.error = Some(format!(
            "the guest reported status {:?}, not 0; its console ends with:\n{}",
            r.status,
            last_lines(&console, 10)
        ));
    }
    r
}

fn detvisor_run(
    plan: &ExitsPlan,
    s: &ScenarioPlan,
    path: ExitPath,
    (dir, i, stats): (&Path, u32, bool),
) -> ExitsRun {
    let limit = Duration::from_secs(plan.timeout_s);
    let watch = Watch {
        ram: None,
        kvm: stats,
    };
    let abandoned = |timed_out: bool| {
        if timed_out {
            format!("abandoned at the {} s time limit", limit.as_secs())
        } else {
            "the run's thread panicked".into()
        }
    };
    match &s.guest {
        ScenarioGuest::Plain { kernel, initrd } => {
            let mut guest = boot_guest(plan, s, kernel, initrd);
            set_exit_path(ExitPathTarget::Plain(&mut guest), path);
            let done = run_in_process(move || plain_run(guest), limit, watch);
            let outcome = done
                .result
                .unwrap_or_else(|| (Err(abandoned(done.timed_out)), String::new()));
            let mut r = plain_result(outcome, done.wall);
            r.kvm = done.kvm;
            r
        }
        ScenarioGuest::Up(prepared) => {
            let logs = dir.join(format!("logs-{:?}-{path:?}-{i}", s.scenario));
            let mut options = UpOptions {
                until: Some(plan.until),
                logs: Some(logs.clone()),
                ..UpOptions::new(plan.seed)
            };
            set_exit_path(ExitPathTarget::Up(&mut options), path);
            let prepared = (**prepared).clone();
            let done = run_in_process(
                move || {
                    let (summary, events) = up_summary(prepared, options);
                    let by_kind = summary.as_ref().ok().and_then(|s| {
                        serde_json::from_value::<BTreeMap<String, u64>>(
                            s.get("exits_by_kind")?.clone(),
                        )
                        .ok()
                    });
                    ((summary, events), by_kind)
                },
                limit,
                watch,
            );
            let (outcome, by_kind) = done
                .result
                .unwrap_or_else(|| ((Err(abandoned(done.timed_out)), String::new()), None));
            let mut r = ExitsRun::from(detvisor_result(outcome, done.wall, &logs));
            r.exits_by_kind = by_kind.unwrap_or_default();
            r.kvm = done.kvm;
            r
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker.

/// A run in one line of progress.
pub fn describe(r: &ExitsRun) -> String {
    if !r.ok {
        return format!("FAILED: {}", r.error.as_deref().unwrap_or("unknown error"));
    }
    let mut s = format!("{:.1} s", r.wall_ms / 1000.0);
    if let Some(v) = r.virtual_ns {
        let v = v.0 as f64 / 1e9;
        if v < 0.1 {
            s.push_str(&format!(", virtual {v:.6} s"));
        } else {
            s.push_str(&format!(", virtual {v:.3} s"));
        }
    }
    if let Some(e) = r.exits {
        s.push_str(&format!(", {e} exits"));
    }
    if let Some(k) = r.kvm.as_ref().and_then(|k| k.get("exits")) {
        s.push_str(&format!(", {k} KVM exits"));
    }
    if let Some(c) = &r.clocksource {
        s.push_str(&format!(", clocksource {c}"));
    }
    if let Some(o) = &r.output {
        s.push_str(&format!(", output {o}"));
    }
    s
}

pub fn worker(plan: &ExitsPlan) -> ExitsWorkerReport {
    let started = Instant::now();
    let tag = format!("bench [{}]", plan.place);
    let mut report = ExitsWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..ExitsWorkerReport::default()
    };
    let scratch = match TempDir::new("detvisor-bench-exits-") {
        Ok(t) => t,
        Err(e) => {
            report.error = Some(format!("cannot create a scratch directory: {e}"));
            return report;
        }
    };
    let dir = scratch.path();
    report.kvm_stats = if plan.kvm_stats {
        kvm_stats_available(plan.place == "helper VM")
    } else {
        "not asked for".into()
    };
    let stats = report.kvm_stats == "debugfs";
    let mut plan = plan.clone();
    if plan.qemu_tsc {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        match tsc_words(&cpuinfo) {
            Some(words) => plan.qemu_cmdline = format!("{} {words}", plan.qemu_cmdline),
            None => say!("{tag}: no `cpu MHz` in /proc/cpuinfo: QEMU-KVM's guest picks its clock"),
        }
    }
    report.qemu_cmdline = plan.qemu_cmdline.clone();
    let plan = &plan;
    for s in &plan.scenarios {
        let mut cells: Vec<Cell> = System::ALL
            .iter()
            .map(|&system| Cell {
                scenario: s.scenario,
                system,
                runs: Vec::new(),
                command: Vec::new(),
                error: s.error.clone(),
            })
            .collect();
        let qemu = match (&plan.qemu, &s.qemu_error, &plan.qemu_error) {
            (_, Some(e), _) | (None, None, Some(e)) => {
                cells[2].error.get_or_insert_with(|| e.clone());
                None
            }
            (None, None, None) => {
                cells[2]
                    .error
                    .get_or_insert_with(|| "QEMU unavailable".into());
                None
            }
            (Some(q), None, _) => Some(q),
        };
        if let Some(q) = qemu {
            let files = QemuFiles {
                bzimage: &s.bzimage,
                initrd: &s.qemu_initrd,
                cmdline: &plan.qemu_cmdline,
                mem: &s.mem,
            };
            let serial = dir.join("SERIAL");
            let status = dir.join("STATUS");
            cells[2].command = command_words(&qemu_kvm_command(
                q,
                &files,
                &plan.qemu_cpu,
                s.rtc_epoch,
                &serial,
                &status,
            ));
        }
        for cell in &mut cells[..2] {
            cell.command = vec![match &s.guest {
                ScenarioGuest::Plain { .. } => "run::api::Request::Run, in process".into(),
                ScenarioGuest::Up(_) => "run::api::Request::Up, in process".into(),
            }];
        }
        if s.error.is_some() {
            report.cells.extend(cells);
            continue;
        }
        let n = plan.runs;
        for i in 1..=n {
            for (cell, path) in cells[..2]
                .iter_mut()
                .zip([ExitPath::ClockPage, ExitPath::Legacy])
            {
                let r = detvisor_run(plan, s, path, (dir, i, stats));
                say!(
                    "{tag}: {} {}: run {i}/{n}: {}",
                    s.scenario.name(),
                    cell.system.name(),
                    describe(&r)
                );
                cell.runs.push(r);
            }
            if let Some(q) = qemu {
                let r = qemu_kvm_run(plan, s, q, (dir, i, stats));
                say!(
                    "{tag}: {} {}: run {i}/{n}: {}",
                    s.scenario.name(),
                    System::QemuKvm.name(),
                    describe(&r)
                );
                cells[2].runs.push(r);
            }
        }
        report.cells.extend(cells);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> QemuPlan {
        serde_json::from_value(serde_json::json!({
            "bin": "/payload/files/qemu/bin/qemu-system-x86_64",
            "lib_dir": "/payload/files/qemu/lib",
            "interp": null,
            "loader": null,
            "firmware_dir": "/payload/files/qemu/share",
        }))
        .unwrap()
    }

    #[test]
    fn qemu_kvm_command_line() {
        let files = QemuFiles {
            bzimage: Path::new("/b/bzImage"),
            initrd: Path::new("/b/initrd,x"),
            cmdline: "console=ttyS0 reboot=t",
            mem: "1G",
        };
        let cmd = qemu_kvm_command(
            &plan(),
            &files,
            "host",
            1_704_067_200,
            Path::new("/t/s"),
            Path::new("/t/st"),
        );
        let words = command_words(&cmd).join(" ");
        assert_eq!(
            words,
            "/payload/files/qemu/bin/qemu-system-x86_64 -L /payload/files/qemu/share \
             -accel kvm -M pc -m 1G -nodefaults -no-user-config -display none -no-reboot \
             -chardev file,id=ser0,path=/t/s -serial chardev:ser0 \
             -chardev file,id=status,path=/t/st -device isa-debugcon,iobase=0x610,chardev=status \
             -kernel /b/bzImage -initrd /b/initrd,x -append console=ttyS0 reboot=t \
             -cpu host -rtc base=2024-01-01T00:00:00"
        );
        let env: Vec<_> = cmd.get_envs().collect();
        assert_eq!(
            env,
            [(
                std::ffi::OsStr::new("LD_LIBRARY_PATH"),
                Some(std::ffi::OsStr::new("/payload/files/qemu/lib"))
            )]
        );
    }

    #[test]
    fn clocksource_and_uptime_from_the_output() {
        let boot = "Linux\nexits-bench: clocksource kvm-clock uptime 0.91\n";
        assert_eq!(clocksource_in(boot).as_deref(), Some("kvm-clock"));
        assert_eq!(uptime_in(boot), Some(0.91));
        let etcd = "etcd-bench: clocksource hpet\netcd-bench: all nodes started at 3.1\n\
                    etcd-bench: workload exited: status 0 uptime 43.52\n";
        assert_eq!(clocksource_in(etcd).as_deref(), Some("hpet"));
        assert_eq!(uptime_in(etcd), Some(43.52));
        assert_eq!(clocksource_in("nothing"), None);
        let log = clock_log(
            "Linux\ntsc: Unable to calibrate against PIT\nclocksource: Switched to clocksource \
             tsc-early\nexits-bench: clocksource tsc uptime 3\n",
        );
        assert_eq!(
            log,
            [
                "tsc: Unable to calibrate against PIT",
                "clocksource: Switched to clocksource tsc-early"
            ]
        );
        assert_eq!(uptime_in("etcd-bench: all nodes started at 3.1"), None);
    }

    #[test]
    fn tsc_words_from_cpuinfo() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.122\n";
        assert_eq!(
            tsc_words(cpuinfo).as_deref(),
            Some("tsc_early_khz=2596122 tsc=reliable clocksource=tsc")
        );
        assert_eq!(tsc_words("processor\t: 0\n"), None);
    }

    #[test]
    fn boot_command_prints_one_marked_line() {
        let c = boot_command();
        assert_eq!(c[..2], ["sh", "-c"]);
        assert!(c[2].contains(CLOCKSOURCE_FILE));
        assert!(c[2].starts_with("echo \"exits-bench: clocksource $(cat "));
    }
}
