//! detvisor: a deterministic hypervisor for testing distributed systems under faults.

mod campaign_cmd;
#[cfg(test)]
mod error_chains;
mod helper;
mod image_cmd;
mod print;
mod serve;
mod soak_cmd;
mod terminal;
mod trace_cmd;
mod up_cmd;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use helper_vm::{placement, HostVmMode, Placement};
use run::api::{Controller, Request, Response};
use run::plain::{GuestSpec, PlainNetwork};
use run::snapshots::SnapshotPlan;
use run::units;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use terminal::StdStreams;
use vmm::stall::StallTimeout;

#[derive(Parser, Debug)]
#[command(
    name = "detvisor",
    version,
    about = "A deterministic hypervisor: same seed, same history, bit for bit"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Boot a guest, run a command inside it, and exit with its status.
    Run(RunArgs),
    /// Run the same configuration several times and compare every exit.
    Audit(AuditArgs),
    /// A determinism soak: many runs with one seed, every exit compared with
    /// a stored reference run; resumable (see docs/determinism.md).
    Soak(soak_cmd::SoakArgs),
    /// Report what this host's KVM offers and whether guests can run on it.
    Check(CheckArgs),
    /// Benchmarks: boot time against QEMU baselines, side by side.
    Bench(detvisor_bench::BenchArgs),
    /// List and inspect snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Resume a saved moment (DIR@12.5s, DIR@exit:N, DIR/ID) and run on from it.
    Branch(BranchArgs),
    /// Replay to an exact moment (DIR@12.5s, DIR@exit:N) and report the machine state there.
    Seek(SeekArgs),
    /// An interactive shell inside the guest at a saved moment (DIR@12.5s,
    /// DIR@exit:N, DIR/ID), in a fork: the saved history is untouched
    Shell(ShellArgs),
    /// Build node images for multi-node guests.
    #[command(subcommand)]
    Image(image_cmd::ImageCommand),
    /// Boot a multi-node system under test from a manifest, run its workload
    /// (with scheduled faults), and exit with the workload's status.
    Up(up_cmd::UpArgs),
    /// Search the histories of a system under test for broken properties
    /// (see docs/campaigns.md); `--resume DIR` continues one.
    Campaign(campaign_cmd::CampaignArgs),
    /// A campaign's findings, one line per distinct failure.
    Findings(campaign_cmd::FindingsArgs),
    /// Reproduce a finding (DIR/findings/NNNN) bit for bit from a fresh process.
    Replay(campaign_cmd::ReplayArgs),
    /// Where the exits of a trace (`run`/`up`/`branch --trace FILE`) went:
    /// counts by kind and by device, in all and per virtual second.
    Trace(trace_cmd::TraceArgs),
    /// Inside the helper VM: answer run requests on its channel.
    #[command(hide = true)]
    ServeChannel,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// List the snapshots in a directory.
    Ls {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Show one snapshot (DIR/ID) in detail, as JSON.
    Info { dir: PathBuf },
}

#[derive(Args, Debug)]
struct BranchArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@latest or DIR/<id>.
    spec: String,
    /// Stop at this virtual time (absolute, as in `run --until`).
    #[arg(long)]
    until: Option<String>,
    /// Re-key every seeded stream from this seed at the branch point.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Many alternate histories, one per seed (e.g. 1..64: inclusive), run in
    /// parallel child processes; prints a table of outcomes.
    #[arg(long)]
    seeds: Option<String>,
    /// Parallel branches with --seeds (0: one per core).
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// With --seeds: each worker restores the moment once and returns to it
    /// in memory between seeds (cost proportional to the pages the previous
    /// history wrote) instead of starting a process per seed.
    #[arg(long, requires = "seeds")]
    in_place: bool,
    /// A fault added at the branch point of an `up` snapshot, e.g.
    /// 'at=+2s partition n1 | n2,n3 for=10s' (`+`: after the branch point;
    /// without it, a virtual time since boot). Repeatable.
    #[arg(long = "fault")]
    faults: Vec<String>,
    /// Take snapshots of the branch too.
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Write every exit of the branch (from the branch point on) into FILE,
    /// a JSON line each; `detvisor trace FILE` sums them up.
    #[arg(long, value_name = "FILE", conflicts_with = "seeds")]
    trace: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Wall time the guest may execute without a VM exit before the run ends
    /// as `stalled` (e.g. 60s; 0: never). Default: 60s on hardware KVM,
    /// 10m in the helper VM (where the same wall time is far less guest work).
    #[arg(long)]
    stall_timeout: Option<StallTimeout>,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
}

/// `--no-seccomp`, on every verb that runs guests.
#[derive(Args, Debug, Clone, Copy)]
pub struct SeccompArgs {
    /// Run guests without the VMM's seccomp filter (for debugging; see
    /// docs/security.md).
    #[arg(long)]
    no_seccomp: bool,
}

impl SeccompArgs {
    /// Whether the guests run under the filter.
    pub fn enabled(self) -> bool {
        !self.no_seccomp
    }
}

#[derive(Args, Debug)]
struct SeekArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@latest or DIR/<id>.
    spec: String,
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
}

#[derive(Args, Debug)]
struct ShellArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@latest or DIR/<id>.
    spec: String,
    /// For a snapshot of an `up` run: open the shell inside this node (its
    /// namespaces and root, its `/bin/sh`) instead of beside the nodes.
    #[arg(long)]
    node: Option<String>,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
}

#[derive(Args, Debug, Clone)]
struct GuestArgs {
    /// Seed of every source of nondeterminism the guest can observe.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Kernel (uncompressed vmlinux ELF); default: the built-in guest image.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// Initramfs; default: the built-in guest image's.
    #[arg(long)]
    initrd: Option<PathBuf>,
    /// Kernel command line, replacing detvisor's default.
    #[arg(long)]
    cmdline: Option<String>,
    /// Guest RAM (e.g. 256M, 1G).
    #[arg(long, default_value = "256M")]
    mem: String,
    /// Stop after this much virtual time (e.g. 30s, 500ms, 10m).
    #[arg(long)]
    until: Option<String>,
    /// Wall-clock date the guest's CMOS clock starts at, as unix seconds.
    #[arg(long, default_value_t = 1_704_067_200)]
    rtc_epoch: i64,
    /// How the guest reads the time and takes interrupts: clock-page (no
    /// exit per clock read, timer arming or interrupt) or legacy (the HPET
    /// and an EOI per interrupt, kept for comparisons).
    #[arg(long, default_value_t = vmm::ExitPath::default())]
    exit_path: vmm::ExitPath,
    /// Virtio NICs in the guest (eth0..), joined by detvisor's simulated switch.
    #[arg(long, default_value_t = 0)]
    nics: u8,
    /// One-way frame latency on the switch: a duration (5ms) or a range (1ms..10ms, uniform).
    #[arg(long, default_value = "1ms")]
    net_latency: String,
    /// Probability that the switch loses a frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    net_loss: f64,
    /// Wall time the guest may execute without a VM exit before the run ends
    /// as `stalled` (e.g. 60s; 0: never). Default: 60s on hardware KVM,
    /// 10m in the helper VM (where the same wall time is far less guest work).
    #[arg(long)]
    stall_timeout: Option<StallTimeout>,
    /// Where to run: the host's KVM, or a helper VM with real KVM inside.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
    /// The command to run inside the guest (none: an interactive shell).
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    guest: GuestArgs,
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Write every link's frames as pcapng files into this directory
    /// (DIR/eth0.to.eth1.pcapng, ...; virtual timestamps). Needs --nics.
    #[arg(long, value_name = "DIR")]
    pcap: Option<PathBuf>,
    /// Write every exit into FILE, a JSON line each (index, virtual time,
    /// kind, device, address, data, RIP, ...); `detvisor trace FILE` sums them up.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct AuditArgs {
    #[command(flatten)]
    guest: GuestArgs,
    /// How many runs to compare.
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// Hash guest memory every N exits (0: only at the end).
    #[arg(long, default_value_t = 0)]
    memory_every: u64,
    /// Hash device state every N exits (0: only at the end).
    #[arg(long, default_value_t = 4096)]
    devices_every: u64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    perturb: PerturbArgs,
}

/// Testing the audit (or soak) itself: hidden flags that perturb one run.
#[derive(Args, Debug, Clone, Copy)]
pub struct PerturbArgs {
    /// In run K (1-based) ...
    #[arg(long, hide = true)]
    perturb_run: Option<u32>,
    /// ... flip a bit of the first value the guest reads at or after exit E.
    #[arg(long, hide = true, default_value_t = 100_000)]
    perturb_exit: u64,
}

impl PerturbArgs {
    /// (run, exit), if a run is perturbed.
    pub fn perturb(self) -> Option<(u32, u64)> {
        self.perturb_run.map(|run| (run, self.perturb_exit))
    }
}

#[derive(Args, Debug)]
struct CheckArgs {
    #[arg(long)]
    json: bool,
    /// `always`: check the KVM inside the helper VM instead of the host's.
    #[arg(long, value_enum, default_value_t = HostVmMode::Never)]
    host_vm: HostVmMode,
}

/// When a run takes snapshots.
#[derive(Args, Debug, Clone, Default)]
pub struct SnapshotArgs {
    /// Directory to write snapshots into (created if missing).
    #[arg(long)]
    pub snapshots: Option<PathBuf>,
    /// Take a snapshot every this much virtual time (e.g. 500ms).
    #[arg(long, requires = "snapshots")]
    pub snapshot_every: Option<String>,
    /// Take a snapshot once this many exits have been handled (repeatable).
    #[arg(long, requires = "snapshots")]
    pub snapshot_at_exit: Vec<u64>,
}

impl SnapshotArgs {
    /// The plan these options describe (`None` without `--snapshots`).
    pub fn plan(&self) -> Result<Option<SnapshotPlan>> {
        let Some(dir) = &self.snapshots else {
            return Ok(None);
        };
        let every = self
            .snapshot_every
            .as_deref()
            .map(units::parse_duration)
            .transpose()
            .context("--snapshot-every")?;
        let plan = SnapshotPlan {
            dir: dir.clone(),
            every,
            at_exits: self.snapshot_at_exit.clone(),
        };
        // Checked here too, before any VM starts.
        plan.validate().context("--snapshot-every")?;
        Ok(Some(plan))
    }
}

/// Carries out one request here, with this process's stdio as its streams.
fn handle(request: Request, streams: StdStreams) -> Result<Response> {
    Ok(Controller::new().handle(request, &streams)?)
}

/// Carries out a request that runs guests here: this process is detvisor's
/// own, so once a guest is set up the seccomp filter covers all of its
/// threads (the stdin pump and the terminal's among them), unless
/// `seccomp` is off.
fn handle_guests(request: Request, streams: StdStreams, seccomp: bool) -> Result<Response> {
    vmm::seccomp::set_scope(vmm::seccomp::Scope::Process);
    let mut controller = Controller::new();
    controller.handle(Request::Seccomp { enabled: seccomp }, &streams)?;
    Ok(controller.handle(request, &streams)?)
}

/// What a request reads from this process's stdin.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stdin {
    /// Nothing.
    None,
    /// Every byte (an interactive console).
    Raw,
    /// Bytes up to Ctrl-D (a fork's shell).
    UntilEot,
}

/// Carries out `request` where this invocation's guests run: here, or in a
/// helper VM holding what `needs` says (which also rewrites the request's
/// host paths to where they are inside it).
///
/// A request that runs a guest gets `stall` as its stall timeout, or where
/// none was given the default for where it runs; its guests run under the
/// VMM's seccomp filter unless `seccomp` is false (`--no-seccomp`).
fn dispatch(
    mode: HostVmMode,
    seccomp: bool,
    stall: Option<StallTimeout>,
    mut request: Request,
    stdin: Stdin,
    needs: impl FnOnce(&mut Request) -> Result<helper::Needs>,
) -> Result<Response> {
    let placement = placement(mode);
    if let Some(timeout) = request.stall_timeout_mut() {
        *timeout = stall.unwrap_or(match placement {
            Placement::Host => StallTimeout::HARDWARE,
            Placement::HelperVm { .. } => StallTimeout::HELPER_VM,
        });
    }
    match placement {
        Placement::Host => {
            let input = match stdin {
                Stdin::None => None,
                Stdin::Raw => Some(terminal::StdinEnd::Never),
                Stdin::UntilEot => Some(terminal::StdinEnd::AtEot),
            };
            handle_guests(request, StdStreams::with_input(input), seccomp)
        }
        Placement::HelperVm { reason } => {
            let needs = needs(&mut request)?;
            let mut remote = helper::Remote::start(&reason, needs)?;
            // On by default there; turned off before the request if asked.
            if !seccomp {
                remote.call(&Request::Seccomp { enabled: false }, false)?;
            }
            remote.call(&request, stdin != Stdin::None)
        }
    }
}

/// A plain run's files in the helper VM: kernel and initrd shipped along,
/// the snapshot directory shared.
fn guest_needs(
    guest: &mut GuestSpec,
    snapshots: Option<&mut SnapshotPlan>,
) -> Result<helper::Needs> {
    let mut needs = helper::Needs::default();
    let image = guest.image_files()?;
    guest.kernel = Some(needs.file(&image.kernel, "vmlinux"));
    guest.initrd = Some(needs.file(&image.initrd, "initrd"));
    if let Some(plan) = snapshots {
        plan.dir = needs.share(&plan.dir)?;
    }
    needs.memory_mib = ((guest.ram_bytes >> 20) as u32)
        .saturating_add(1024)
        .max(2048);
    Ok(needs)
}

/// Shares the node disks' image cache (if there is one) at its own path: an
/// `up` run's snapshots name their disks' base images there.
fn share_disk_cache(needs: &mut helper::Needs) -> Result<()> {
    let disks = run::guest::cache_root().join("disks");
    if disks.is_dir() {
        needs.share(&disks)?;
    }
    Ok(())
}

/// A saved moment in the helper VM: its snapshot directory shared (and the
/// directory new snapshots go to), the disk image cache, the spec made
/// absolute.
fn snapshot_needs(spec: &mut String, taking: Option<&mut SnapshotPlan>) -> Result<helper::Needs> {
    // A spec that names no snapshot is refused before the helper VM starts.
    run::snapshots::resolve(spec)?;
    let mut needs = helper::Needs::default();
    let absolute = spec.parse::<snapshot::SnapshotSpec>()?.absolute()?;
    needs.share(&absolute.root())?;
    share_disk_cache(&mut needs)?;
    *spec = absolute.to_string();
    if let Some(plan) = taking {
        plan.dir = needs.share(&plan.dir)?;
    }
    Ok(needs)
}

/// The guest `run` and `audit` boot, from their flags.
fn guest_spec(guest: &GuestArgs) -> Result<GuestSpec> {
    // Every flag is checked, whether or not it is used (`--net-*` without
    // `--nics`), before anything starts.
    let latency = units::parse_latency(&guest.net_latency).context("--net-latency")?;
    let mut config = devices::NetworkConfig::reliable(latency);
    config.latency.validate().context("--net-latency")?;
    config.loss = guest.net_loss;
    config.validate().context("--net-loss")?;
    units::check_rtc_epoch(guest.rtc_epoch).context("--rtc-epoch")?;
    let network = (guest.nics != 0).then_some(PlainNetwork {
        nics: guest.nics,
        config,
    });
    let spec = GuestSpec {
        seed: guest.seed,
        kernel: guest.kernel.clone(),
        initrd: guest.initrd.clone(),
        cmdline: guest.cmdline.clone(),
        ram_bytes: units::parse_ram(&guest.mem).context("--mem")?,
        until: guest
            .until
            .as_deref()
            .map(units::parse_duration)
            .transpose()
            .context("--until")?,
        rtc_epoch_unix_secs: guest.rtc_epoch,
        network,
        command: guest.command.clone(),
        // Set for where the request runs (`dispatch`).
        stall_timeout: StallTimeout::default(),
        exit_path: guest.exit_path,
    };
    spec.validate().context("--nics")?;
    Ok(spec)
}

fn cmd_run(args: RunArgs) -> Result<u8> {
    // Keystrokes pass through to the guest's shell unchanged.
    let interactive = args.guest.command.is_empty() && std::io::stdin().is_terminal();
    if args.pcap.is_some() && args.guest.nics == 0 {
        bail!("--pcap captures the network's frames: it needs --nics N");
    }
    let request = Request::Run {
        guest: guest_spec(&args.guest)?,
        snapshots: args.snapshots.plan()?,
        pcap: args.pcap.clone(),
        trace: args.trace.clone(),
    };
    let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
    let stdin = if interactive { Stdin::Raw } else { Stdin::None };
    let response = dispatch(
        args.guest.host_vm,
        args.guest.seccomp.enabled(),
        args.guest.stall_timeout,
        request,
        stdin,
        |request| match request {
            Request::Run {
                guest,
                snapshots,
                pcap,
                trace,
            } => {
                let mut needs = guest_needs(guest, snapshots.as_mut())?;
                // Written inside the helper VM, read here.
                if let Some(dir) = pcap {
                    *dir = needs.share(dir)?;
                }
                if let Some(file) = trace {
                    *file = needs.trace_file(file)?;
                }
                Ok(needs)
            }
            _ => unreachable!("a run request"),
        },
    )?;
    match response {
        Response::Summary(summary) => print::summary(&summary, args.json),
        other => print::unexpected(&other),
    }
}

fn cmd_audit(args: AuditArgs) -> Result<u8> {
    if args.runs < 2 {
        bail!("--runs must be at least 2 to compare anything");
    }
    let request = Request::Audit {
        guest: guest_spec(&args.guest)?,
        options: run::audit::AuditOptions {
            runs: args.runs,
            memory_every: args.memory_every,
            devices_every: args.devices_every,
            perturb: args.perturb.perturb(),
        },
    };
    let response = dispatch(
        args.guest.host_vm,
        args.guest.seccomp.enabled(),
        args.guest.stall_timeout,
        request,
        Stdin::None,
        |request| match request {
            Request::Audit { guest, .. } => guest_needs(guest, None),
            _ => unreachable!("an audit request"),
        },
    )?;
    match response {
        Response::Audit(summary) => print::audit(&summary, args.json),
        other => print::unexpected(&other),
    }
}

fn cmd_branch(args: BranchArgs) -> Result<u8> {
    // Checked against the snapshot's files before anything starts: the
    // grammar, the nodes, the branch point and the lanes.
    let faults = run::branch::check_faults(&args.spec, &args.faults)?;
    let until = args
        .until
        .as_deref()
        .map(units::parse_duration)
        .transpose()
        .context("--until")?;
    if let Some(range) = &args.seeds {
        let request = Request::BranchSeeds(run::seeds::SeedsRequest {
            spec: args.spec.clone(),
            seeds: range.parse()?,
            jobs: args.jobs,
            until,
            in_place: args.in_place,
            faults: faults.clone(),
            stall_timeout: StallTimeout::default(),
        });
        let response = dispatch(
            args.host_vm,
            args.seccomp.enabled(),
            args.stall_timeout,
            request,
            Stdin::None,
            |request| match request {
                Request::BranchSeeds(seeds) => snapshot_needs(&mut seeds.spec, None),
                _ => unreachable!("a seeds request"),
            },
        )?;
        return match response {
            Response::Seeds(report) => print::seeds(&report, args.json),
            other => print::unexpected(&other),
        };
    }
    let request = Request::Branch(run::branch::BranchRequest {
        spec: args.spec.clone(),
        until,
        seed: args.seed,
        snapshots: args.snapshots.plan()?,
        // An `up` snapshot's node output goes to stdout as under `up`
        // (events to stderr); a `run` snapshot's guest console to stdout.
        events: !args.json,
        faults,
        stall_timeout: StallTimeout::default(),
        trace: args.trace.clone(),
    });
    let response = dispatch(
        args.host_vm,
        args.seccomp.enabled(),
        args.stall_timeout,
        request,
        Stdin::None,
        |request| match request {
            Request::Branch(branch) => {
                let mut needs = snapshot_needs(&mut branch.spec, branch.snapshots.as_mut())?;
                if let Some(file) = &mut branch.trace {
                    *file = needs.trace_file(file)?;
                }
                Ok(needs)
            }
            _ => unreachable!("a branch request"),
        },
    )?;
    match response {
        Response::Summary(summary) => print::summary(&summary, args.json),
        other => print::unexpected(&other),
    }
}

fn cmd_shell(args: ShellArgs) -> Result<u8> {
    // An `up` fork's shell is on a pseudo-terminal in the guest, which
    // echoes and edits lines: keystrokes pass through unchanged.
    let interactive = std::io::stdin().is_terminal() && run::snapshots::is_up(&args.spec)?;
    let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
    let (rows, cols) = terminal::size();
    let request = Request::Shell(run::shell::ShellRequest {
        spec: args.spec.clone(),
        node: args.node.clone(),
        rows,
        cols,
        term: std::env::var("TERM").ok().filter(|t| !t.is_empty()),
    });
    let response = dispatch(
        args.host_vm,
        args.seccomp.enabled(),
        None,
        request,
        Stdin::UntilEot,
        |request| match request {
            Request::Shell(shell) => snapshot_needs(&mut shell.spec, None),
            _ => unreachable!("a shell request"),
        },
    )?;
    match response {
        Response::Shell { status } => Ok(status),
        other => print::unexpected(&other),
    }
}

fn cmd_seek(args: SeekArgs) -> Result<u8> {
    let request = Request::Seek { spec: args.spec };
    let response = dispatch(
        args.host_vm,
        args.seccomp.enabled(),
        None,
        request,
        Stdin::None,
        |request| match request {
            Request::Seek { spec } => snapshot_needs(spec, None),
            _ => unreachable!("a seek request"),
        },
    )?;
    match response {
        Response::Seek(report) => print::seek(&report, args.json),
        other => print::unexpected(&other),
    }
}

fn cmd_snapshot(command: SnapshotCommand) -> Result<u8> {
    match command {
        SnapshotCommand::Ls { dir, json } => {
            match handle(Request::ListSnapshots { dir }, StdStreams::default())? {
                Response::Snapshots { rows } => print::snapshot_rows(&rows, json),
                other => print::unexpected(&other),
            }
        }
        SnapshotCommand::Info { dir } => {
            match handle(Request::SnapshotInfo { dir }, StdStreams::default())? {
                Response::SnapshotDetails(details) => print::snapshot_details(&details),
                other => print::unexpected(&other),
            }
        }
    }
}

/// Whether the helper VM's QEMU is on PATH.
fn qemu_available() -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join("qemu-system-x86_64").is_file()))
        .unwrap_or(false)
}

fn cmd_check(args: CheckArgs) -> Result<u8> {
    let report = if args.host_vm == HostVmMode::Always {
        let reason = "`check --host-vm always` checks the KVM inside it";
        match helper::call_once(
            reason,
            helper::Needs::default(),
            &Request::HostReport,
            false,
        )? {
            Response::HostReport(report) => report,
            other => return print::unexpected(&other),
        }
    } else {
        vmm::probe::host_report()
    };
    let qemu = qemu_available();
    if args.json {
        #[derive(Serialize)]
        struct Check<'a> {
            #[serde(flatten)]
            host: &'a vmm::probe::HostReport,
            helper_vm_qemu: bool,
        }
        println!(
            "{}",
            serde_json::to_string(&Check {
                host: &report,
                helper_vm_qemu: qemu
            })?
        );
    } else {
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!("/dev/kvm:                 {}", yes(report.kvm_device));
        println!(
            "KVM modules:              {}",
            report.kvm_modules.join(", ")
        );
        println!(
            "hardware virtualization:  {}",
            report
                .hardware_virtualization
                .as_deref()
                .unwrap_or("none (no vmx/svm flag)")
        );
        println!("hardware PMU:             {}", yes(report.hardware_pmu));
        println!(
            "KVM API version:          {}",
            report
                .kvm_api_version
                .map(|v| v.to_string())
                .unwrap_or("-".into())
        );
        println!("user-space MSR exits:     {}", yes(report.user_space_msr));
        println!("MSR filter:               {}", yes(report.msr_filter));
        println!("sync regs:                {}", yes(report.sync_regs));
        println!("dirty log ring:           {}", yes(report.dirty_log_ring));
        println!("immediate exit:           {}", yes(report.immediate_exit));
        if let Some(p) = &report.cpuid_probe {
            println!(
                "CPU model honoured:       {} (CPUID.1 ecx={:#010x} edx={:#010x})",
                yes(p.honoured()),
                p.seen_ecx,
                p.seen_edx
            );
        }
        if let Some(e) = &report.probe_error {
            println!("probe guest:              failed: {e}");
        }
        println!("can run guests here:      {}", yes(report.can_run_guests));
        if let Some(r) = &report.reason {
            println!("  because:                {r}");
        }
        println!(
            "helper VM available:      {}",
            if qemu {
                "yes (qemu-system-x86_64 found)"
            } else {
                "no (install qemu-system-x86)"
            }
        );
    }
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Audit(args) => cmd_audit(args),
        Command::Soak(args) => soak_cmd::cmd_soak(args),
        Command::Check(args) => cmd_check(args),
        Command::Bench(args) => detvisor_bench::run(args),
        Command::Snapshot(command) => cmd_snapshot(command),
        Command::Branch(args) => cmd_branch(args),
        Command::Seek(args) => cmd_seek(args),
        Command::Shell(args) => cmd_shell(args),
        Command::Up(args) => up_cmd::cmd_up(args),
        Command::Trace(args) => trace_cmd::cmd_trace(args),
        Command::Campaign(args) => campaign_cmd::cmd_campaign(args),
        Command::Findings(args) => campaign_cmd::cmd_findings(args),
        Command::Replay(args) => campaign_cmd::cmd_replay(args),
        Command::Image(cmd) => image_cmd::run(cmd),
        Command::ServeChannel => serve::serve(),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("detvisor: error: {e:#}");
            ExitCode::from(run::exit_status::BAD_INPUT)
        }
    }
}
