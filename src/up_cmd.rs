//! The `detvisor up` command: arguments, guest assembly, placement (host or
//! helper VM), the runs (one, or several compared as an audit) and the summary.

use crate::helper::Needs;
use crate::{HostVmMode, SeccompArgs, SnapshotArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use helper_vm::TempDir;
use run::api::{Request, Response};
use run::manifest;
use run::units;
use run::up::{Initrd, PreparedUp, UpOptions};
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
    until: Option<String>,
    /// A fault, e.g. 'at=10s partition n1 | n2,n3 for=15s' or 'at=30s pause n2 for=5s'
    /// (repeatable; added to the manifest's `faults`).
    #[arg(long = "fault")]
    faults: Vec<String>,
    /// Guest RAM (e.g. 1G), overriding the manifest's machine.mem.
    #[arg(long)]
    mem: Option<String>,
    /// Kernel (uncompressed vmlinux); default: the built-in guest image's.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// How the guest reads the time and takes interrupts: clock-page (no
    /// exit per clock read, timer arming or interrupt) or legacy (the HPET
    /// and an EOI per interrupt, kept for comparisons).
    #[arg(long, default_value_t = vmm::ExitPath::default())]
    pub exit_path: vmm::ExitPath,
    /// Wall time the guest may execute without a VM exit before the run ends
    /// as `stalled` (e.g. 60s; 0: never). Default: 60s on hardware KVM,
    /// 10m in the helper VM (where the same wall time is far less guest work).
    #[arg(long)]
    pub stall_timeout: Option<vmm::stall::StallTimeout>,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    #[command(flatten)]
    pub seccomp: SeccompArgs,
}

impl UpRunArgs {
    /// --until, if given.
    pub fn until(&self) -> Result<Option<vmm::VirtNanos>> {
        self.until
            .as_deref()
            .map(units::parse_duration)
            .transpose()
            .context("--until")
    }

    /// The manifest read and its guest assembled (with --fault, --mem and
    /// --kernel), checked before any VM starts.
    pub fn prepare(&self) -> Result<PreparedUp> {
        let ram_bytes = self
            .mem
            .as_deref()
            .map(units::parse_ram)
            .transpose()
            .context("--mem")?;
        let manifest = manifest::load(&self.manifest)?;
        let faults = run::faults::parse_faults(&self.faults)?;
        if let Some(until) = self.until()? {
            // A --fault past the end was typed for this run: refused. The
            // manifest's are the scenario's, and a shorter run looks at its
            // beginning: each one it will not reach is said, once.
            run::faults::check_until(&faults, until)?;
            for fault in &manifest.faults {
                match run::faults::check_until(std::slice::from_ref(fault), until) {
                    Err(never @ run::faults::FaultError::NeverFires { .. }) => {
                        eprintln!("detvisor: note: the manifest's {never}");
                    }
                    other => other?,
                }
            }
        }
        Ok(run::up::prepare(
            &manifest,
            &faults,
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
            until: self.run.until()?,
            runs: self.runs,
            logs: Some(self.logs.clone()),
            stream_output: !self.quiet && !self.json,
            snapshots: self.snapshots.plan()?,
            // Set for where the request runs (`dispatch`).
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
    let request = Request::Up { prepared, options };
    let response = crate::dispatch(
        args.run.host_vm,
        args.run.seccomp.enabled(),
        args.run.stall_timeout,
        request,
        crate::Stdin::None,
        |request| match request {
            Request::Up { prepared, options } => helper_needs(prepared, options),
            _ => unreachable!("an up request"),
        },
    )?;
    match response {
        Response::Up(summary) => crate::print::up(&summary, args.json),
        other => crate::print::unexpected(&other),
    }
}

/// An `up` run in the helper VM: the assembled initrd (staged in a file)
/// and the kernel shipped along, the log and snapshot directories shared.
pub(crate) fn helper_needs(prepared: &mut PreparedUp, options: &mut UpOptions) -> Result<Needs> {
    let mut needs = Needs::default();
    // Removed with its files when the helper VM is done with them.
    let staging = TempDir::new("detvisor-up-")
        .context("creating a staging directory for the helper VM's files")?;
    let path = match &prepared.initrd {
        Initrd::Bytes(bytes) => {
            let path = staging.path().join("initrd");
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            path
        }
        Initrd::File(path) => path.clone(),
    };
    let initrd_len = std::fs::metadata(&path)
        .with_context(|| format!("initrd {}", path.display()))?
        .len() as usize;
    prepared.initrd = Initrd::File(needs.file(&path, "initrd"));
    prepared.kernel = needs.file(&prepared.kernel.clone(), "vmlinux");
    // Node disks' base images stay in their shared directory (the disk
    // cache), at the same paths inside: snapshots name them, and a later
    // branch finds them there (see `crate::share_disk_cache`).
    let mut disk_len = 0usize;
    for disk in &mut prepared.disks {
        disk_len += std::fs::metadata(&disk.image)
            .with_context(|| format!("disk image {}", disk.image.display()))?
            .len() as usize;
        let dir = disk.image.parent().unwrap_or(std::path::Path::new("/"));
        let name = disk.image.file_name().unwrap_or_default().to_owned();
        disk.image = needs.share(dir)?.join(name);
    }
    if let Some(logs) = &options.logs {
        options.logs = Some(needs.share(logs)?);
    }
    if let Some(plan) = &mut options.snapshots {
        plan.dir = needs.share(&plan.dir)?;
    }
    if let Some(dir) = &options.pcap {
        options.pcap = Some(needs.share(dir)?);
    }
    if let Some(file) = &options.trace {
        options.trace = Some(needs.trace_file(file)?);
    }
    if let Some(file) = &options.records {
        options.records = Some(needs.output_file(file, "records")?);
    }
    // The initrd is shipped in the helper's own initramfs and then read
    // into the VMM: count it about three times over.
    needs.staging = Some(staging);
    needs.memory_mib = ((prepared.ram_bytes >> 20) as u32)
        .saturating_add(1536)
        .saturating_add(((3 * initrd_len) >> 20) as u32)
        .saturating_add((disk_len >> 20) as u32)
        .max(2048);
    Ok(needs)
}
