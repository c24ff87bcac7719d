//! `detvisor bench`: benchmarks that print ratios against baselines run side by side.
//!
//! - `bench boot` ([`boot`]): boot the default guest and run `true` with detvisor, QEMU-KVM and
//!   QEMU TCG with icount.
//! - `bench snapshot` ([`snapshot`]): snapshot and restore latency, forks/s and resets/s
//!   against guest RAM size and dirty fraction, with full-copy baselines.
//!
//! Both run their measurements in a worker process, inside the helper VM (L1) when the host's
//! KVM cannot run guests ([`helper`]), and every process under a time limit ([`process`]).
//!
//! The modules:
//!
//! | module | what |
//! | --- | --- |
//! | this one | the command line and its dispatch |
//! | [`process`] | timed child processes: time limits, kill, stdout lines with arrival times |
//! | [`monitor`] | watching a process: memory sampling from /proc, per-VM KVM statistics |
//! | [`machine`] | facts about the machine (uptime, load, memory, file system types), temp dirs |
//! | [`helper`] | the helper VM session and the worker plumbing both benches share |
//! | [`stats`] | medians, ratios and the formatting of numbers |
//! | [`boot`], [`boot_worker`], [`boot_report`], [`qemu`] | `bench boot` |
//! | [`snapshot`], [`snapshot_cell`], [`snapshot_restore`], [`snapshot_memory`], [`snapshot_report`] | `bench snapshot` |

mod boot;
mod boot_report;
mod boot_worker;
mod etcd;
mod helper;
mod machine;
mod monitor;
mod process;
mod qemu;
mod snapshot;
mod snapshot_cell;
mod snapshot_memory;
mod snapshot_report;
mod snapshot_restore;
mod stats;

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchHostVm {
    /// Use the helper VM only when the host's KVM cannot run the guest.
    Auto,
    /// Always measure detvisor and QEMU-KVM inside the helper VM.
    Always,
    /// Never: measure them on the host's KVM.
    Never,
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
    #[arg(long, value_enum, default_value_t = BenchHostVm::Auto)]
    pub host_vm: BenchHostVm,
    /// Skip the end-to-end detvisor runs on the host (one helper VM boot each).
    #[arg(long)]
    pub no_end_to_end: bool,
    /// Internal: run the measurements described in this plan (inside the helper VM).
    #[arg(long, hide = true)]
    pub worker_plan: Option<PathBuf>,
    /// Internal: start the helper VM described in this plan.
    #[arg(long, hide = true)]
    pub launch_plan: Option<PathBuf>,
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
    #[arg(long, value_enum, default_value_t = BenchHostVm::Auto)]
    pub host_vm: BenchHostVm,
    /// Internal: run the cells described in this plan (inside the helper VM).
    #[arg(long, hide = true)]
    pub worker_plan: Option<PathBuf>,
    /// Internal: start the helper VM described in this plan.
    #[arg(long, hide = true)]
    pub launch_plan: Option<PathBuf>,
    /// Internal: measure one cell.
    #[arg(long, hide = true)]
    pub cell_plan: Option<PathBuf>,
    /// Internal: restore this snapshot directory, run to the first exit, report, exit.
    #[arg(long, hide = true)]
    pub restore_child: Option<PathBuf>,
}

pub fn run(args: BenchArgs) -> Result<u8> {
    match args.command {
        BenchCommand::Boot(args) => {
            if let Some(plan) = &args.worker_plan {
                helper::worker_main(plan, boot_worker::worker)
            } else if let Some(plan) = &args.launch_plan {
                helper::launch_main(plan)
            } else {
                boot::orchestrate(&args)
            }
        }
        BenchCommand::Snapshot(args) => {
            if let Some(plan) = &args.worker_plan {
                helper::worker_main(plan, snapshot::worker)
            } else if let Some(plan) = &args.launch_plan {
                helper::launch_main(plan)
            } else if let Some(plan) = &args.cell_plan {
                snapshot_cell::cell_main(plan)
            } else if let Some(dir) = &args.restore_child {
                snapshot_restore::restore_child_main(dir)
            } else {
                snapshot::orchestrate(&args)
            }
        }
        BenchCommand::Etcd(args) => etcd::run(&args),
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
