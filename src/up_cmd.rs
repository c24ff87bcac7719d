//! The `detvisor up` command: arguments, the guest's assembly from them, the
//! runs (one, or several compared as an audit; here or in a helper VM) and
//! the summary.

use crate::{RunPlaceArgs, SnapshotArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use run::client::Calls;
use run::manifest;
use run::units;
use run::up::{PreparedUp, UpOptions};
use std::path::PathBuf;

/// What shapes an `up` run's history, and where it runs: `up`'s flags
/// that `soak up` takes too.
#[derive(Args, Debug)]
pub struct UpRunArgs {
    /// The manifest (TOML): nodes, workload, network, faults. See docs/manifest.md.
    pub manifest: PathBuf,
    /// Seed of every source of nondeterminism the guest can observe.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop after this much virtual time (e.g. 60s).
    #[arg(long)]
    pub until: Option<vmm::VirtNanos>,
    /// A fault, e.g. 'at=10s partition n1 | n2,n3 for=15s' or 'at=30s pause n2 for=5s'
    /// (repeatable; added to the manifest's `faults`).
    #[arg(long = "fault", value_parser = run::faults::parse_fault_flag)]
    faults: Vec<run::faults::Fault>,
    /// Guest RAM (e.g. 1G), overriding the manifest's machine.mem.
    #[arg(long)]
    mem: Option<units::ByteSize>,
    /// Kernel (uncompressed vmlinux); default: the built-in guest image's.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// How the guest reads the time and takes interrupts: clock-page (no
    /// exit per clock read, timer arming or interrupt) or legacy (the HPET
    /// and an EOI per interrupt, kept for comparisons).
    #[arg(long, default_value_t = vmm::ExitPath::default())]
    pub exit_path: vmm::ExitPath,
    #[command(flatten)]
    pub place: RunPlaceArgs,
}

impl UpRunArgs {
    /// The manifest read and its guest assembled (with --fault, --mem and
    /// --kernel), checked before any VM starts.
    pub fn prepare(&self) -> Result<PreparedUp> {
        let ram_bytes = self
            .mem
            .map(|mem| units::check_ram(mem.0))
            .transpose()
            .context("--mem")?;
        let manifest = manifest::load(&self.manifest)?;
        if let Some(until) = self.until {
            for unreached in run::faults::check_run_end(&self.faults, &manifest.faults, until)? {
                eprintln!("detvisor: note: the manifest's {unreached}");
            }
        }
        Ok(run::up::prepare(
            &manifest,
            &self.faults,
            ram_bytes,
            self.kernel.as_deref(),
        )?)
    }
}

#[derive(Args, Debug)]
pub struct UpArgs {
    #[command(flatten)]
    run: UpRunArgs,
    /// Directory for per-node logs (<node>.log, raw output of each node).
    #[arg(long, default_value = "detvisor-logs")]
    logs: PathBuf,
    /// Do not stream node output to stdout (the logs still get it).
    #[arg(long)]
    quiet: bool,
    /// Run this many times and compare every exit (an audit); 1: just run.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Snapshots of the (first) run, to branch, seek or open a shell in later.
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Write every link's frames of the (first) run as pcapng files into
    /// this directory (DIR/n1.to.n2.pcapng, ...; virtual timestamps).
    #[arg(long, value_name = "DIR")]
    pcap: Option<PathBuf>,
    /// Write every exit of the (first) run into FILE, a JSON line each;
    /// `detvisor trace FILE` sums them up.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Write what the guest reported in the (first) run into FILE, a JSON
    /// line each: events, Antithesis SDK records (assertions, guidance,
    /// setup, events) and history lines, each with its exit and virtual time.
    #[arg(long, value_name = "FILE")]
    records: Option<PathBuf>,
}

impl UpArgs {
    fn options(&self) -> Result<UpOptions> {
        Ok(UpOptions {
            seed: self.run.seed,
            until: self.run.until,
            runs: self.runs,
            logs: Some(self.logs.clone()),
            stream_output: !self.quiet && !self.json,
            snapshots: self.snapshots.plan()?,
            // Set for where the request runs (`PlaceArgs::runner`).
            stall_timeout: vmm::stall::StallTimeout::default(),
            pcap: self.pcap.clone(),
            trace: self.trace.clone(),
            records: self.records.clone(),
            exit_path: self.run.exit_path,
        })
    }
}

pub fn cmd_up(args: UpArgs) -> Result<u8> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    // Every flag is checked before the manifest's images are read.
    let options = args.options()?;
    // The guest is assembled here, where the images are.
    let prepared = args.run.prepare()?;
    let mut runner = args.run.place.runner(crate::Stdin::None);
    let summary = Calls::new(&mut runner)
        .up(prepared, options)
        .map_err(crate::failed)?;
    crate::print::up(&summary, args.json)
}
