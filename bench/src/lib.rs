//! `detvisor bench`: benchmarks that print ratios against baselines run side by side.
//!
//! - `bench boot` ([`boot`]): boot the default guest and run `true` with detvisor, QEMU-KVM and
//!   QEMU TCG with icount.
//! - `bench snapshot` ([`snapshot`]): snapshot and restore latency, forks/s and resets/s
//!   against guest RAM size and dirty fraction, with full-copy baselines.
//!
//! - `bench etcd` ([`etcd`]): the etcd example, `up` against QEMU TCG with icount.
//! - `bench branch-snapshots` ([`branch_snapshots`]): the same branch of an `up` moment with
//!   and without keeping its snapshots (and with a full first snapshot, as before): the ratios.
//! - `bench exits` ([`exits`]): boot, the etcd smoke run and the etcd partition under
//!   detvisor's new and old exit paths and QEMU-KVM: exits, exits by kind, wall times, ratios.
//! - Issue 30's campaign targets, each side by side in one run, results in `bench/` after a
//!   full run ([`campaign_run`] runs a campaign through the fuzzer library): `bench
//!   histories` ([`histories`]: branching from the tree against each history from boot),
//!   `bench first-finding` ([`first_finding`]), `bench cores` ([`cores`]: `--jobs 0` against
//!   `--jobs 1`) and `bench nodes` ([`nodes`]: nodes per `up` guest).
//! - `bench verify` ([`verify`]): `detvisor verify` of a finding with one worker and with a
//!   worker per core (it places its runs itself, no worker here).
//!
//! Each runs its measurements in a worker: in this process when the host's KVM runs guests,
//! else inside the helper VM (L1), where `detvisor bench serve-channel` ([`serve`]) answers the
//! worker's plan over the helper VM's typed channel ([`helper`]). Where the guests run is
//! helper-vm's [`helper_vm::placement`] (`--host-vm`). detvisor itself is measured
//! through the run library in process (`run::api::Controller`), QEMU as processes under a time
//! limit ([`process`]). Nothing here re-executes detvisor; only the helper-VM crate starts it,
//! inside L1.
//!
//! The modules:
//!
//! | module | what |
//! | --- | --- |
//! | this one | the command line and its dispatch |
//! | [`process`] | timed child processes: time limits, kill, stdout lines with arrival times |
//! | [`monitor`] | watching a process: memory sampling from /proc, per-VM KVM statistics |
//! | [`machine`] | facts about the machine (uptime, load, memory, file system types), temp dirs |
//! | [`stats`] | medians, ratios and the formatting of numbers |
//! | [`report`] | what the reports share: a worker's report, a run, run times, the helper VM session |
//! | [`qemu`] | the host's QEMU, shipped into the helper VM, and one measured run of it |
//! | [`serve`] | what answers the workers' plans inside the helper VM |
//! | [`helper`] | the helper VM session seen from the host: a plan sent, the worker's report back |
//! | [`boot`], [`boot_worker`], [`boot_report`] | `bench boot` |
//! | [`branch_snapshots`], [`branch_snapshots_worker`] | `bench branch-snapshots` |
//! | [`etcd`] (`etcd_report`), [`etcd_worker`], [`etcd_baseline`] | `bench etcd` |
//! | [`exits`] (`exits_report`), [`exits_worker`] | `bench exits` |
//! | [`snapshot`], [`snapshot_worker`], [`snapshot_cell`], [`snapshot_restore`], [`snapshot_memory`], [`snapshot_report`] | `bench snapshot` |
//! | [`campaign_run`], [`histories`], [`first_finding`], [`cores`], [`nodes`] | issue 30's campaign targets (they place their runs themselves through the fuzzer library, no worker here) |
//!
//! A bench's command ([`boot`], [`branch_snapshots`], [`etcd`], [`exits`], [`snapshot`]) is above [`helper`], which
//! is above [`serve`], which is above the workers: no module imports one above it.

mod boot;
mod boot_report;
mod boot_worker;
mod branch_snapshots;
mod branch_snapshots_worker;
mod campaign_run;
mod cores;
mod etcd;
mod etcd_baseline;
mod etcd_worker;
mod exits;
mod exits_worker;
mod first_finding;
mod helper;
mod histories;
mod machine;
mod monitor;
mod nodes;
mod process;
mod qemu;
mod report;
mod reverse_step;
mod serve;
mod snapshot;
mod snapshot_cell;
mod snapshot_memory;
mod snapshot_report;
mod snapshot_restore;
mod snapshot_worker;
mod stats;
mod step_clock;
mod verify;

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use helper_vm::HostVmMode;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::Mutex;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Boot the default guest and run `true`: detvisor vs QEMU-KVM (same helper VM) vs QEMU TCG
    /// with icount (host). Prints a table and a final JSON line.
    Boot(BootArgs),
    /// Snapshot and restore latency, forks/s and resets/s against guest RAM size and dirty
    /// fraction, with full-copy baselines. Prints a table and a final JSON line.
    Snapshot(SnapshotBenchArgs),
    /// The etcd example (3 members healthy, a put and a get): `detvisor up` vs QEMU TCG with
    /// icount running the same scenario. Prints a table and a final JSON line.
    Etcd(etcd::EtcdArgs),
    /// Issue 12's "exits are the cost": boot, the etcd smoke run and the etcd partition, each
    /// under detvisor's new exit path, its old one and QEMU -accel kvm (same place). Prints a
    /// table per scenario, the ratios and a final JSON line.
    Exits(exits::ExitsArgs),
    /// Issue 28: `detvisor verify` of a finding over N seeds with one worker and with a worker
    /// per core, side by side: wall times, the speed-up, and whether both gave the same rows.
    Verify(verify::VerifyBenchArgs),
    /// Issue 28's "a branch that keeps snapshots": the same `branch` of an `up` moment without
    /// snapshots, with them (the first incremental over the restored snapshot) and with a full
    /// first snapshot (as before), side by side. Prints the ratios and a final JSON line.
    BranchSnapshots(branch_snapshots::BranchSnapshotsArgs),
    /// Issue 30: histories per hour, branching from the tree against re-running each history
    /// from boot (same budget, workers and slice); where a branch's wall time goes.
    Histories(histories::HistoriesArgs),
    /// Issue 30: time to the first finding (median over campaign seeds) on each target.
    FirstFinding(first_finding::FirstFindingArgs),
    /// Issue 30: branches per hour with `--jobs 0` against `--jobs 1` on one campaign.
    Cores(cores::CoresArgs),
    /// Issue 30: one `up` guest of 3, 9, 27 and 64 busybox nodes: exits and wall time per
    /// virtual second, guest memory; stops at the first count that fails, saying why.
    Nodes(nodes::NodesArgs),
    /// Issue 31: reverse-stepi latency against the steps since the exit and the distance to
    /// the nearest checkpoint, and the single-step rate, in the default Linux guest.
    ReverseStep(reverse_step::ReverseStepArgs),
    /// Issue 31: instructions per second under the step clock against the exit clock, on
    /// one bare guest.
    StepClock(step_clock::StepClockArgs),
    /// Inside the helper VM: answer the benches' worker plans on its channel.
    #[command(hide = true)]
    ServeChannel,
}

#[derive(Args, Debug, Clone)]
pub struct BootArgs {
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Time limit of each process, in seconds (a helper VM boot gets 300 s more); a process
    /// over it is killed and its run counted as failed.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Where detvisor and QEMU-KVM run.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    /// Skip the end-to-end detvisor runs on the host (one helper VM boot each).
    #[arg(long)]
    pub no_end_to_end: bool,
}

/// Where `bench snapshot` writes its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapStore {
    /// The helper VM's own tmpfs (/tmp in L1); without a helper VM, the host's temp directory.
    Tmpfs,
    /// A host temporary directory shared into the helper VM over virtio-9p.
    Share,
    /// Both, side by side.
    Both,
}

#[derive(Args, Debug, Clone)]
pub struct SnapshotBenchArgs {
    /// Repetitions of each snapshot, baseline and restore measurement.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Guest RAM sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "256M,1G")]
    pub mem: Vec<String>,
    /// Percentages of guest RAM the guest fills with non-zero data before the snapshot
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0.1,1,10")]
    pub dirty: Vec<f64>,
    /// Where snapshots are written (and restored from).
    #[arg(long, value_enum, default_value_t = SnapStore::Both)]
    pub store: SnapStore,
    /// Restores (+ first exit) per cell for the in-process forks-per-second loop.
    #[arg(long, default_value_t = 10)]
    pub forks: u32,
    /// Iterations of the reset loop per cell.
    #[arg(long, default_value_t = 20)]
    pub resets: u32,
    /// Pages the reset loop's burst should dirty (it runs the fewest exits that dirty this many).
    #[arg(long, default_value_t = 100)]
    pub burst_pages: u64,
    /// Time limit of each cell's process, in seconds (the helper VM gets 300 s more in all).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Where the guests run.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
}

pub fn run(args: BenchArgs) -> Result<u8> {
    match args.command {
        BenchCommand::Boot(args) => boot::orchestrate(&args),
        BenchCommand::Snapshot(args) => snapshot::orchestrate(&args),
        BenchCommand::Etcd(args) => etcd::orchestrate(&args),
        BenchCommand::Exits(args) => exits::orchestrate(&args),
        BenchCommand::Verify(args) => verify::orchestrate(&args),
        BenchCommand::ReverseStep(args) => reverse_step::orchestrate(&args),
        BenchCommand::StepClock(args) => step_clock::orchestrate(&args),
        BenchCommand::BranchSnapshots(args) => branch_snapshots::orchestrate(&args),
        BenchCommand::Histories(args) => histories::orchestrate(&args),
        BenchCommand::FirstFinding(args) => first_finding::orchestrate(&args),
        BenchCommand::Cores(args) => cores::orchestrate(&args),
        BenchCommand::Nodes(args) => nodes::orchestrate(&args),
        BenchCommand::ServeChannel => serve::serve(),
    }
}

/// The checks of `--runs` and `--timeout` both benches make before anything else.
fn check_runs_and_timeout(runs: u32, timeout: u64) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    if timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    Ok(())
}

/// Where progress lines go: this process's stderr, or (inside the helper VM) the stderr
/// frames of the call being answered.
static PROGRESS: Mutex<Option<Box<dyn Write + Send>>> = Mutex::new(None);

/// Writes one progress line (see [`say!`]).
pub(crate) fn progress(line: &str) {
    let mut sink = PROGRESS.lock().unwrap_or_else(|e| e.into_inner());
    match sink.as_mut() {
        Some(w) => {
            let _ = writeln!(w, "{line}").and_then(|()| w.flush());
        }
        None => eprintln!("{line}"),
    }
}

/// Sends progress lines to `sink` until the next call (`None`: back to stderr).
pub(crate) fn progress_to(sink: Option<Box<dyn Write + Send>>) {
    *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = sink;
}

/// `eprintln!` for progress: to stderr, or inside the helper VM back to the host's.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::progress(&format!($($arg)*))
    };
}
pub(crate) use say;
