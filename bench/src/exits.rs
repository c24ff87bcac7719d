//! `detvisor bench exits [--runs N] [--scenarios boot,smoke,partition]`: issue 12's benchmark,
//! "exits are the cost". Three scenarios, side by side in one run:
//!
//! - **boot**: `bench boot`'s plain boot of the default guest, its command printing the
//!   clocksource the kernel chose and its uptime ([`exits_worker::boot_command`]);
//! - **smoke**: what `bench etcd` runs (`examples/etcd/cluster.toml`: 3 members healthy, a put
//!   and a get);
//! - **partition**: `examples/etcd/partition.toml` (3 members, n1 cut off at 20 s for 10 s,
//!   writes through every member for 40 s);
//!
//! each under three systems, all in the same place (the helper VM when the host's KVM cannot
//! run guests, else the host), runs interleaved:
//!
//! 1. **detvisor, new exit path** (the library's default, the clock page);
//! 2. **detvisor, old exit path** (HPET clocksource, an EOI per interrupt), selected through
//!    [`exits_worker::set_exit_path`], the one place that knows the library's option;
//! 3. **QEMU `-accel kvm`** (the physical limit): the same kernel (the bzImage), initrd and
//!    scenario script as `bench etcd`'s TCG icount baseline (boot: the same command), QEMU and
//!    its libraries and firmware shipped into the helper VM as `bench boot` does. The script
//!    prints the guest's clocksource (`current_clocksource`), reported in the table; the
//!    partition is a bridge port down for its 10 s (`etcd_baseline::fault_job`). `-cpu host`
//!    (`--qemu-cpu`); in nested KVM its kernel cannot calibrate the TSC and would read the HPET
//!    (an exit per clock read), so by default its command line gets the TSC's rate
//!    (`--qemu-clock tsc`, [`exits_worker::tsc_words`]).
//!
//! The report ([`exits_report`]): per scenario and system the wall time per run (QEMU: process
//! spawn to exit; detvisor: the request's call to its return, in process), virtual seconds,
//! exits, exits per virtual second, exits by kind, whether the runs were identical (digest, or
//! the serial bytes), the clocksource; the ratios exits old/new (goal >= 3x on partition),
//! wall old/new and detvisor-new / QEMU-KVM wall (goal <= 1.2x); a final JSON line.

#[path = "exits_report.rs"]
mod report;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::fs;
use std::path::PathBuf;

use super::check_runs_and_timeout;
use super::etcd::{self, Assembled};
use super::exits_worker::{
    boot_command, worker, ExitsPlan, ExitsWorkerReport, Scenario, ScenarioGuest, ScenarioPlan,
    System,
};
use super::helper::HelperLaunch;
use super::machine::{loadavg, TempDir};
use super::qemu::{discover_qemu, QemuInstall};
use super::report::{because, Session};
use super::serve::BenchCall;
use crate::say;
use helper_vm::HostVmMode;
use run::up::Initrd;
use run::{guest, units};
use vmm::VirtNanos;

/// Guest RAM of the boot scenario (`bench boot`'s).
const BOOT_MEM: &str = "256M";
const RTC_EPOCH: i64 = 1_704_067_200;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QemuClock {
    Tsc,
    Kernel,
}

#[derive(Args, Debug, Clone)]
pub struct ExitsArgs {
    /// Repetitions per scenario and system.
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// The scenarios, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "boot,smoke,partition"
    )]
    pub scenarios: Vec<Scenario>,
    /// Time limit of each run, in seconds; a run over it is abandoned and counted as failed.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// detvisor's seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// detvisor's virtual-time limit of the etcd scenarios (`detvisor up --until`).
    #[arg(long, default_value = "300s")]
    pub until: VirtNanos,
    /// QEMU-KVM's `-cpu` (what the KVM it runs on supports: `host`, `qemu64`, ...).
    #[arg(long, default_value = "host")]
    pub qemu_cpu: String,
    /// Words appended to QEMU-KVM's kernel command line only (e.g. `clocksource=tsc
    /// tsc=reliable`); the report shows the clocksource the guest used.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub qemu_append: String,
    /// QEMU-KVM's guest clock: `tsc` gives it the TSC at the rate of the machine QEMU runs on
    /// (`tsc_early_khz=<cpu MHz> tsc=reliable clocksource=tsc`: in nested KVM the guest kernel
    /// cannot calibrate the TSC and falls back to the HPET, an exit per clock read); `kernel`
    /// leaves the choice to the guest kernel.
    #[arg(long, value_enum, default_value_t = QemuClock::Tsc)]
    pub qemu_clock: QemuClock,
    /// Where detvisor and QEMU-KVM run.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    /// Do not read the KVM statistics of the runs' VMs (debugfs, in the helper VM mounted if
    /// needed: each run's VM counted from its creation, its stat files opened by a 5 ms poll
    /// until it exists and held past its end, which defers the VM's teardown past QEMU's exit).
    #[arg(long)]
    pub no_kvm_stats: bool,
}

/// The boot scenario: the default guest, its initrd with the boot command for QEMU.
fn boot_scenario(tmp: &TempDir) -> Result<ScenarioPlan> {
    let image = guest::default_image()?;
    let qemu_initrd = tmp.path().join("initrd-qemu-boot");
    fs::write(
        &qemu_initrd,
        guest::initrd_with_command(&image.initrd, &boot_command())?,
    )
    .with_context(|| format!("cannot write {}", qemu_initrd.display()))?;
    Ok(ScenarioPlan {
        scenario: Scenario::Boot,
        mem: BOOT_MEM.into(),
        ram_bytes: units::parse_size(BOOT_MEM)?,
        bzimage: image.kernel.with_file_name("bzImage"),
        guest: ScenarioGuest::Plain {
            kernel: image.kernel,
            initrd: image.initrd,
        },
        qemu_initrd,
        rtc_epoch: RTC_EPOCH,
        error: None,
        qemu_error: None,
    })
}

/// An etcd scenario, from `bench etcd`'s assembly.
fn etcd_scenario(scenario: Scenario, tmp: &TempDir) -> Result<ScenarioPlan> {
    let file = match scenario {
        Scenario::Partition => "partition.toml",
        _ => "cluster.toml",
    };
    let a: Assembled = etcd::assemble(file, tmp.path(), &format!("-{}", scenario.name()))?;
    Ok(ScenarioPlan {
        scenario,
        mem: a.mem,
        ram_bytes: a.ram_bytes,
        guest: ScenarioGuest::Up(Box::new(a.prepared)),
        bzimage: a.bzimage,
        qemu_initrd: a.qemu_initrd.clone().unwrap_or_default(),
        rtc_epoch: a.rtc_epoch,
        error: None,
        qemu_error: a.qemu_initrd.err(),
    })
}

/// A scenario that could not be assembled: every system reports why.
fn failed_scenario(scenario: Scenario, e: &anyhow::Error) -> ScenarioPlan {
    ScenarioPlan {
        scenario,
        mem: String::new(),
        ram_bytes: 0,
        guest: ScenarioGuest::Plain {
            kernel: PathBuf::new(),
            initrd: PathBuf::new(),
        },
        bzimage: PathBuf::new(),
        qemu_initrd: PathBuf::new(),
        rtc_epoch: RTC_EPOCH,
        error: Some(format!("cannot assemble the scenario: {e:#}")),
        qemu_error: None,
    }
}

/// The helper VM's plan: every file the plan names shipped as a payload file (QEMU too), the
/// paths rewritten to theirs; and the files to ship.
fn ship(
    host_plan: &ExitsPlan,
    qemu: &Result<QemuInstall>,
) -> Result<(ExitsPlan, Vec<(PathBuf, String)>)> {
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    let mut put = |path: &PathBuf, name: String| -> PathBuf {
        if path.as_os_str().is_empty() {
            return PathBuf::new();
        }
        if let Some((_, n)) = files.iter().find(|(p, _)| p == path) {
            return helper_vm::payload_path(n).into();
        }
        files.push((path.clone(), name.clone()));
        helper_vm::payload_path(&name).into()
    };
    let mut plan = ExitsPlan {
        place: "helper VM".into(),
        ..host_plan.clone()
    };
    for s in &mut plan.scenarios {
        let tag = s.scenario.name();
        s.bzimage = put(&s.bzimage, "bench/bzImage".into());
        s.qemu_initrd = put(&s.qemu_initrd, format!("bench/initrd-qemu-{tag}"));
        match &mut s.guest {
            ScenarioGuest::Plain { kernel, initrd } => {
                *kernel = put(kernel, "bench/vmlinux".into());
                *initrd = put(initrd, format!("bench/initrd-{tag}"));
            }
            ScenarioGuest::Up(prepared) => {
                prepared.kernel = put(&prepared.kernel, "bench/vmlinux".into());
                let Initrd::File(initrd) = &prepared.initrd else {
                    anyhow::bail!("the assembled initrd of {tag} is not in a file");
                };
                prepared.initrd = Initrd::File(put(initrd, format!("bench/initrd-up-{tag}")));
            }
        }
    }
    if let Ok(q) = qemu {
        plan.qemu = Some(q.ship(&mut files)?);
    }
    Ok((plan, files))
}

/// The worker in the helper VM.
fn helper_session(
    host_plan: &ExitsPlan,
    qemu: &Result<QemuInstall>,
) -> (Session, Option<ExitsWorkerReport>) {
    Session::record(|session| {
        let (plan, files) = ship(host_plan, qemu)?;
        let max_ram_mib = plan
            .scenarios
            .iter()
            .map(|s| (s.ram_bytes >> 20) as u32)
            .max()
            .unwrap_or(0);
        let mut launch = HelperLaunch {
            memory_mib: 0,
            files,
            shared_dirs: Vec::new(),
        };
        // The payload files live in L1's RAM; a run reads its initrd into the VMM once more.
        let payload_mib = (launch.payload_file_bytes() >> 20) as u32;
        launch.memory_mib = max_ram_mib
            .saturating_add(1536)
            .saturating_add(payload_mib.saturating_mul(2))
            .max(2048);
        launch.run(&BenchCall::Exits(Box::new(plan)), session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files)",
                s.payload_file_bytes >> 20
            )
        })
    })
}

pub fn orchestrate(args: &ExitsArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    let mut scenarios = args.scenarios.clone();
    scenarios.sort();
    scenarios.dedup();
    if scenarios.is_empty() {
        anyhow::bail!("--scenarios names none");
    }
    let tmp = TempDir::new("detvisor-bench-exits-")
        .context("cannot create a temporary directory for the benchmark")?;
    let plans: Vec<ScenarioPlan> = scenarios
        .iter()
        .map(|&s| {
            let plan = match s {
                Scenario::Boot => boot_scenario(&tmp),
                _ => etcd_scenario(s, &tmp),
            };
            plan.unwrap_or_else(|e| {
                say!("bench: {}: {e:#}", s.name());
                failed_scenario(s, &e)
            })
        })
        .collect();
    let qemu = discover_qemu();
    let cmdline = guest::default_cmdline();
    let host_plan = ExitsPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        seed: args.seed,
        until: args.until,
        cmdline: cmdline.clone(),
        qemu_cmdline: [cmdline.as_str(), args.qemu_append.trim()]
            .join(" ")
            .trim_end()
            .to_string(),
        qemu: qemu.as_ref().ok().map(QemuInstall::on_host),
        qemu_error: qemu.as_ref().err().map(|e| format!("{e:#}")),
        qemu_cpu: args.qemu_cpu.clone(),
        kvm_stats: !args.no_kvm_stats,
        qemu_tsc: args.qemu_clock == QemuClock::Tsc,
        scenarios: plans,
        place: "host".into(),
    };
    let placement = helper_vm::placement(args.host_vm);
    say!(
        "bench: exits, scenarios {}, {} run(s) per system; detvisor and QEMU-KVM on the {}{}",
        scenarios
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(","),
        args.runs,
        placement.name(),
        because(&placement)
    );
    let (session, worker_report) = if placement.in_helper_vm() {
        let (s, r) = helper_session(&host_plan, &qemu);
        (Some(s), r)
    } else {
        (None, Some(worker(&host_plan)))
    };
    let r = report::build(report::Inputs {
        args,
        cmdline: &host_plan.cmdline,
        qemu_cmdline: &host_plan.qemu_cmdline,
        placement: &placement,
        scenarios: &host_plan.scenarios,
        worker: worker_report,
        session,
        loadavg_before,
    });
    report::print(&r)?;
    Ok(if r.all_ok { 0 } else { 1 })
}
