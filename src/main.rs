//! detvisor: a deterministic hypervisor for testing distributed systems under faults.

mod bench;
mod fan_out;
mod faults;
mod guest;
mod hostvm;
mod image_cmd;
mod manifest;
mod shell_cmd;
mod snapshots;
mod tempdir;
mod terminal;
mod units;
mod up;
mod up_cmd;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use helper_vm::{placement, HostVmMode, Placement};
use serde::Serialize;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use vmm::exit::{Perturbation, StopReason};
use vmm::record::{first_divergence, Divergence, RecordConfig};
use vmm::vm::{RunOutcome, VmConfig};

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
    /// Report what this host's KVM offers and whether guests can run on it.
    Check(CheckArgs),
    /// Benchmarks: boot time against QEMU baselines, side by side.
    Bench(bench::BenchArgs),
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
    /// Take snapshots of the branch too.
    #[command(flatten)]
    snapshots: snapshots::SnapshotArgs,
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
}

#[derive(Args, Debug)]
struct SeekArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@latest or DIR/<id>.
    spec: String,
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
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
    /// Virtio NICs in the guest (eth0..), joined by detvisor's simulated switch.
    #[arg(long, default_value_t = 0)]
    nics: u8,
    /// One-way frame latency on the switch: a duration (5ms) or a range (1ms..10ms, uniform).
    #[arg(long, default_value = "1ms")]
    net_latency: String,
    /// Probability that the switch loses a frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    net_loss: f64,
    /// Where to run: the host's KVM, or a helper VM with real KVM inside.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    /// The command to run inside the guest (none: an interactive shell).
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    guest: GuestArgs,
    #[command(flatten)]
    snapshots: snapshots::SnapshotArgs,
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
    /// Testing the audit itself: in run K (1-based) ...
    #[arg(long, hide = true)]
    perturb_run: Option<u32>,
    /// ... flip a bit of the first value the guest reads at or after exit E.
    #[arg(long, hide = true, default_value_t = 100_000)]
    perturb_exit: u64,
}

#[derive(Args, Debug)]
struct CheckArgs {
    #[arg(long)]
    json: bool,
    /// `always`: check the KVM inside the helper VM instead of the host's.
    #[arg(long, value_enum, default_value_t = HostVmMode::Never)]
    host_vm: HostVmMode,
}

/// Exit status for a run stopped by its virtual-time limit (as timeout(1)).
const EXIT_TIME_LIMIT: u8 = 124;
/// Exit status for a guest that ended without reporting one.
const EXIT_NO_STATUS: u8 = 125;

#[derive(Serialize)]
struct RunSummary {
    exit_status: Option<u8>,
    stop: StopReason,
    seed: u64,
    virtual_ns: u64,
    exits: u64,
    exits_by_kind: std::collections::BTreeMap<String, u64>,
    injected_interrupts: u64,
    /// Interrupt-window exits found after an `STI` byte and single-stepped
    /// to the true window (a diagnostic: the helper VM loses STI shadows).
    irq_windows_stepped: u64,
    single_steps: u64,
    wall_ms: u64,
    wall_setup_ms: u64,
    wall_finish_ms: u64,
    exits_per_sec: u64,
    digest: String,
    digest_parts: vmm::vm::DigestParts,
    console_bytes: u64,
    unhandled_accesses: u64,
    /// Peak resident memory of this process, minus the guest RAM the host
    /// backed: what the VMM itself costs.
    vmm_peak_rss_beyond_guest_kib: Option<u64>,
    cpu_model_version: u32,
}

/// For the audit's per-run line: the interrupt windows that were stepped past
/// a possible STI shadow (differs between runs on hosts that lose shadows;
/// the histories must not).
fn stepped_note(outcome: &RunOutcome) -> String {
    match outcome.irq_windows_stepped {
        0 => String::new(),
        n => format!(
            " ({n} interrupt windows stepped, {} steps)",
            outcome.single_steps
        ),
    }
}

/// VmHWM (peak resident set) of this process, in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl RunSummary {
    fn new(seed: u64, outcome: &RunOutcome) -> Self {
        let wall_ms = outcome.wall.as_millis() as u64;
        RunSummary {
            exit_status: match outcome.stop {
                StopReason::GuestExit { status } => Some(status),
                _ => None,
            },
            stop: outcome.stop,
            seed,
            virtual_ns: outcome.virtual_time.0,
            exits: outcome.exits,
            exits_by_kind: outcome.exits_by_kind.clone(),
            injected_interrupts: outcome.injected_interrupts,
            irq_windows_stepped: outcome.irq_windows_stepped,
            single_steps: outcome.single_steps,
            wall_ms,
            wall_setup_ms: outcome.wall_setup.as_millis() as u64,
            wall_finish_ms: outcome.wall_finish.as_millis() as u64,
            exits_per_sec: (outcome.exits as f64 / outcome.wall.as_secs_f64().max(1e-9)) as u64,
            digest: outcome.digest.clone(),
            digest_parts: outcome.digest_parts.clone(),
            console_bytes: outcome.console_bytes,
            unhandled_accesses: outcome.unhandled_accesses,
            vmm_peak_rss_beyond_guest_kib: peak_rss_kib()
                .map(|peak| peak.saturating_sub(outcome.guest_resident_bytes / 1024)),
            cpu_model_version: vmm::cpu_model::CPU_MODEL_VERSION,
        }
    }

    /// The run's status where the guest's own is not it (an `up` run's is
    /// its workload's).
    fn with_exit_status(mut self, status: Option<u8>) -> Self {
        self.exit_status = status;
        self
    }

    fn process_status(&self) -> u8 {
        self.exit_status.unwrap_or(match self.stop {
            StopReason::TimeLimit => EXIT_TIME_LIMIT,
            _ => EXIT_NO_STATUS,
        })
    }

    /// Prints the summary (JSON on stdout, or a line on stderr) and returns
    /// the process's exit status.
    fn print(&self, json: bool) -> Result<u8> {
        if json {
            let mut out = std::io::stdout().lock();
            writeln!(out)?;
            writeln!(out, "{}", serde_json::to_string(self)?)?;
        } else {
            eprintln!("{}", self.human());
        }
        Ok(self.process_status())
    }

    fn human(&self) -> String {
        let status = match self.stop {
            StopReason::GuestExit { status } => format!("exit {status}"),
            StopReason::TimeLimit => "virtual-time limit reached".into(),
            StopReason::GuestReset => "guest reset without reporting a status".into(),
            StopReason::HaltedForever => "guest halted with nothing left to wake it".into(),
            StopReason::Failure { failure } => format!("KVM failure: {failure:?}"),
        };
        format!(
            "detvisor: {status}; virtual {}, {} exits, wall {:.2}s, {} exits/s, digest {}",
            vmm::VirtNanos(self.virtual_ns),
            self.exits,
            self.wall_ms as f64 / 1000.0,
            self.exits_per_sec,
            self.digest
        )
    }
}

struct ResolvedGuest {
    kernel: PathBuf,
    initrd: PathBuf,
}

fn resolve_image(guest: &GuestArgs) -> Result<ResolvedGuest> {
    let (kernel, initrd) = match (&guest.kernel, &guest.initrd) {
        (Some(k), Some(i)) => (k.clone(), i.clone()),
        (k, i) => {
            let image = guest::default_image()?;
            (
                k.clone().unwrap_or(image.kernel),
                i.clone().unwrap_or(image.initrd),
            )
        }
    };
    for (what, path) in [("kernel", &kernel), ("initrd", &initrd)] {
        if !path.is_file() {
            bail!("{what} {} does not exist or is not a file", path.display());
        }
    }
    Ok(ResolvedGuest { kernel, initrd })
}

/// The simulated network from `--nics`, `--net-latency` and `--net-loss`.
fn network_spec(guest: &GuestArgs) -> Result<Option<vmm::vm::NetworkSpec>> {
    if guest.nics == 0 {
        return Ok(None);
    }
    if usize::from(guest.nics) > devices::layout::VIRTIO_MMIO_IRQS.len() - 1 {
        bail!(
            "--nics {} is more than this machine has interrupt lines for ({})",
            guest.nics,
            devices::layout::VIRTIO_MMIO_IRQS.len() - 1
        );
    }
    let latency = units::parse_latency(&guest.net_latency).context("--net-latency")?;
    let mut config = devices::NetworkConfig::reliable(latency);
    config.loss = guest.net_loss;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("network settings: {e}"))?;
    Ok(Some(vmm::vm::NetworkSpec {
        nics: guest.nics,
        config,
    }))
}

fn vm_config(guest: &GuestArgs, record: RecordConfig) -> Result<VmConfig> {
    let ram_bytes = units::parse_size(&guest.mem).context("--mem")?;
    let until = guest
        .until
        .as_deref()
        .map(units::parse_duration)
        .transpose()
        .context("--until")?;
    let image = resolve_image(guest)?;
    let initrd = guest::initrd_with_command(&image.initrd, &guest.command)?;
    Ok(VmConfig {
        kernel: image.kernel,
        initrd,
        cmdline: guest.cmdline.clone().unwrap_or_else(guest::default_cmdline),
        ram_bytes,
        seed: guest.seed,
        until,
        rtc_epoch_unix_secs: guest.rtc_epoch,
        record,
        perturbation: None,
        network: network_spec(guest)?,
        // The fork-shell channel (see `guest::FORK_SHELL_LISTENER`).
        agent_channel: true,
    })
}

/// Re-runs this invocation inside the helper VM, with the guest's files shipped along.
fn run_in_helper_vm(
    subcommand: &str,
    guest: &GuestArgs,
    extra: &[String],
    shared_dirs: Vec<PathBuf>,
    reason: &str,
) -> Result<u8> {
    // Validate what can be validated before paying for the helper VM.
    units::parse_size(&guest.mem).context("--mem")?;
    network_spec(guest)?;
    if let Some(u) = &guest.until {
        units::parse_duration(u).context("--until")?;
    }
    let image = resolve_image(guest)?;
    eprintln!("detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}");
    let assets = hostvm::ensure_assets(None)?;
    let files = vec![
        hostvm::PayloadFile {
            host_path: image.kernel.clone(),
            payload_name: "vmlinux".into(),
        },
        hostvm::PayloadFile {
            host_path: image.initrd.clone(),
            payload_name: "initrd".into(),
        },
    ];
    let mut args: Vec<OsString> = vec![
        subcommand.into(),
        "--host-vm".into(),
        "never".into(),
        "--kernel".into(),
        hostvm::payload_path("vmlinux").into(),
        "--initrd".into(),
        hostvm::payload_path("initrd").into(),
        "--seed".into(),
        guest.seed.to_string().into(),
        "--mem".into(),
        guest.mem.clone().into(),
        "--rtc-epoch".into(),
        guest.rtc_epoch.to_string().into(),
        "--nics".into(),
        guest.nics.to_string().into(),
        "--net-latency".into(),
        guest.net_latency.clone().into(),
        "--net-loss".into(),
        guest.net_loss.to_string().into(),
    ];
    if let Some(c) = &guest.cmdline {
        args.push("--cmdline".into());
        args.push(c.into());
    }
    if let Some(u) = &guest.until {
        args.push("--until".into());
        args.push(u.into());
    }
    args.extend(extra.iter().map(OsString::from));
    args.push("--".into());
    args.extend(guest.command.iter().map(OsString::from));
    let ram = units::parse_size(&guest.mem)?;
    let config = hostvm::HelperVmConfig {
        assets_dir: assets,
        memory_mib: ((ram >> 20) as u32).saturating_add(1024).max(2048),
        shared_dirs,
        ..hostvm::HelperVmConfig::default()
    };
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = hostvm::run(&config, &exe, &args, &files)?;
    Ok(u8::try_from(status).unwrap_or(EXIT_NO_STATUS))
}

fn cmd_run(args: RunArgs) -> Result<u8> {
    if let Placement::HelperVm { reason } = placement(args.guest.host_vm) {
        let mut extra: Vec<String> = if args.json {
            vec!["--json".into()]
        } else {
            vec![]
        };
        let mut shared = Vec::new();
        if let Some((options, dir)) = args.snapshots.forwarded()? {
            extra.extend(options);
            shared.push(dir);
        }
        // Keystrokes pass through to the guest's shell unchanged.
        let interactive = args.guest.command.is_empty() && std::io::stdin().is_terminal();
        let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
        return run_in_helper_vm("run", &args.guest, &extra, shared, &reason);
    }
    let config = vm_config(&args.guest, RecordConfig::default())?;
    let interactive = args.guest.command.is_empty() && std::io::stdin().is_terminal();
    let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
    let input = interactive.then(terminal::spawn_stdin_reader);
    let outcome = match snapshots::Snapshotter::new(&args.snapshots, None)? {
        None => vmm::vm::run(&config, Box::new(std::io::stdout()), input)?,
        Some(mut snapshotter) => {
            let session = vmm::vm::Session::boot(&config, Box::new(std::io::stdout()), input)?;
            let mut driven = snapshots::Driven::plain(session);
            let stop = snapshotter.run(&mut driven)?;
            let session = driven.session;
            snapshotter.report();
            session.finish(stop)
        }
    };
    print_summary(args.guest.seed, &outcome, args.json)
}

fn print_summary(seed: u64, outcome: &RunOutcome, json: bool) -> Result<u8> {
    RunSummary::new(seed, outcome).print(json)
}

#[derive(Serialize)]
struct AuditSummary {
    identical: bool,
    runs: u32,
    exits: Vec<u64>,
    digests: Vec<String>,
    divergence: Option<String>,
}

fn cmd_audit(args: AuditArgs) -> Result<u8> {
    if args.runs < 2 {
        bail!("--runs must be at least 2 to compare anything");
    }
    if let Placement::HelperVm { reason } = placement(args.guest.host_vm) {
        let mut extra = vec![
            "--runs".to_string(),
            args.runs.to_string(),
            "--memory-every".into(),
            args.memory_every.to_string(),
            "--devices-every".into(),
            args.devices_every.to_string(),
        ];
        if args.json {
            extra.push("--json".into());
        }
        if let Some(k) = args.perturb_run {
            extra.extend([
                "--perturb-run".into(),
                k.to_string(),
                "--perturb-exit".into(),
                args.perturb_exit.to_string(),
            ]);
        }
        return run_in_helper_vm("audit", &args.guest, &extra, Vec::new(), &reason);
    }
    let record = RecordConfig {
        keep_records: true,
        device_state_every: args.devices_every,
        memory_every: args.memory_every,
    };
    let base = vm_config(&args.guest, record)?;
    let mut first: Option<RunOutcome> = None;
    let mut summary = AuditSummary {
        identical: true,
        runs: args.runs,
        exits: Vec::new(),
        digests: Vec::new(),
        divergence: None,
    };
    for run in 1..=args.runs {
        let mut config = base.clone();
        if args.perturb_run == Some(run) {
            config.perturbation = Some(Perturbation {
                at_exit: args.perturb_exit,
            });
        }
        let outcome = vmm::vm::run(&config, Box::new(std::io::sink()), None)?;
        eprintln!(
            "detvisor audit: run {run}/{}: {} exits, virtual {}, digest {}{}",
            args.runs,
            outcome.exits,
            outcome.virtual_time,
            outcome.digest,
            stepped_note(&outcome)
        );
        summary.exits.push(outcome.exits);
        summary.digests.push(outcome.digest.clone());
        match &first {
            None => first = Some(outcome),
            Some(reference) => {
                let text = compare_runs(reference, &outcome, run);
                if let Some(text) = text {
                    summary.identical = false;
                    summary.divergence = Some(text);
                    break;
                }
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else if summary.identical {
        println!(
            "identical: {} runs, {} exits each, digest {}",
            args.runs, summary.exits[0], summary.digests[0]
        );
    } else {
        println!("DIVERGED: {}", summary.divergence.as_deref().unwrap_or(""));
    }
    Ok(if summary.identical { 0 } else { 1 })
}

/// How run `run` differs from the reference run 1, if it does: the first
/// differing exit, or else which part of the final state differs.
fn compare_runs(reference: &RunOutcome, outcome: &RunOutcome, run: u32) -> Option<String> {
    match first_divergence(&reference.records, &outcome.records) {
        Some(Divergence::Record {
            position,
            left,
            right,
        }) => Some(format!(
            "runs 1 and {run} diverge at exit {position}:\n  run 1: {left}\n  run {run}: {right}"
        )),
        Some(Divergence::Length { left, right, next }) => Some(format!(
            "runs 1 and {run} diverge in length: {left} vs {right} exits; first extra: {}",
            next.map(|r| r.to_string()).unwrap_or_default()
        )),
        None if reference.digest != outcome.digest => {
            let (a, b) = (&reference.digest_parts, &outcome.digest_parts);
            let differing: Vec<&str> = [
                ("memory", a.memory != b.memory),
                ("devices", a.devices != b.devices),
                ("console", a.console != b.console),
            ]
            .iter()
            .filter(|(_, differs)| *differs)
            .map(|(name, _)| *name)
            .collect();
            Some(format!(
                "runs 1 and {run} have equal exits but different final state (digest {} vs {}): {} differ",
                reference.digest,
                outcome.digest,
                differing.join(", ")
            ))
        }
        None => None,
    }
}

fn cmd_branch(args: BranchArgs) -> Result<u8> {
    if let Placement::HelperVm { reason } = placement(args.host_vm) {
        return reexec_with_snapshot_dirs(&reason, &args.spec, &args.snapshots, false);
    }
    if let Some(range) = &args.seeds {
        return fan_out::branch_seeds(
            &args.spec,
            range,
            args.jobs,
            args.until.as_deref(),
            args.in_place,
            args.json,
        );
    }
    let until = args
        .until
        .as_deref()
        .map(units::parse_duration)
        .transpose()
        .context("--until")?;
    let resume = vmm::vm::ResumeConfig {
        until,
        record: RecordConfig::default(),
    };
    // An `up` snapshot's node output goes to stdout as under `up` (events
    // to stderr); a `run` snapshot's guest console to stdout.
    let node_output = snapshots::NodeOutput {
        out: Box::new(std::io::stdout()),
        events: !args.json,
    };
    let mut restored = snapshots::restore(
        &args.spec,
        &resume,
        Box::new(std::io::stdout()),
        None,
        node_output,
    )?;
    let driven = &mut restored.driven;
    if let Some(seed) = args.seed {
        // Every seeded stream is re-keyed from here on: an alternate history.
        driven.session.set_seed(seed);
    }
    let stop = match restored.stopped_early {
        Some(stop) => stop,
        None => match snapshots::Snapshotter::new(
            &args.snapshots,
            Some(restored.snapshot.meta.id.clone()),
        )? {
            Some(mut snapshotter) => snapshotter.run(driven)?,
            None => driven.run_to_end()?,
        },
    };
    let seed = driven.session.seed();
    let exit_status = driven.exit_status(stop);
    let outcome = driven.outcome(stop)?;
    let summary = RunSummary::new(seed, &outcome).with_exit_status(exit_status);
    summary.print(args.json)
}

fn cmd_shell(args: ShellArgs) -> Result<u8> {
    if let Placement::HelperVm { reason } = placement(args.host_vm) {
        // An `up` fork's shell is on a pseudo-terminal in the guest, which
        // echoes and edits lines: keystrokes pass through unchanged.
        let interactive = std::io::stdin().is_terminal() && snapshots::is_up(&args.spec)?;
        let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
        return reexec_with_snapshot_dirs(&reason, &args.spec, &Default::default(), true);
    }
    shell_cmd::run(&args.spec, args.node.as_deref())
}

fn cmd_seek(args: SeekArgs) -> Result<u8> {
    if let Placement::HelperVm { reason } = placement(args.host_vm) {
        return reexec_with_snapshot_dirs(&reason, &args.spec, &Default::default(), false);
    }
    snapshots::seek(&args.spec, args.json)
}

/// Makes a snapshot spec (DIR@..., DIR/ID) absolute, creating nothing.
fn absolute_spec(spec: &str) -> Result<String> {
    let absolute = |p: &Path| -> Result<PathBuf> {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        p.canonicalize()
            .with_context(|| format!("snapshot directory {} does not exist", p.display()))
    };
    Ok(match spec.rsplit_once('@') {
        Some((dir, rest)) => format!("{}@{rest}", absolute(Path::new(dir))?.display()),
        None => absolute(Path::new(spec))?.display().to_string(),
    })
}

/// The snapshot root of an absolute spec.
fn spec_root(spec: &str) -> PathBuf {
    match spec.rsplit_once('@') {
        Some((dir, _)) => PathBuf::from(dir),
        None => Path::new(spec)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    }
}

/// Re-runs this command line inside the helper VM with `spec` and any
/// `--snapshots DIR` made absolute, sharing those directories read-write.
fn reexec_with_snapshot_dirs(
    reason: &str,
    spec: &str,
    taking: &snapshots::SnapshotArgs,
    forward_stdin: bool,
) -> Result<u8> {
    let absolute = absolute_spec(spec)?;
    let mut shared = vec![spec_root(&absolute)];
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    for arg in args.iter_mut() {
        if arg.as_os_str() == std::ffi::OsStr::new(spec) {
            *arg = absolute.clone().into();
            break;
        }
    }
    if let Some(dir) = &taking.snapshots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir_abs = dir.canonicalize()?;
        if let Some(i) = args.iter().position(|a| a == "--snapshots") {
            if let Some(value) = args.get_mut(i + 1) {
                *value = dir_abs.clone().into();
            }
        }
        shared.push(dir_abs);
    }
    shared.sort();
    shared.dedup();
    eprintln!("detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}");
    let position = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args.splice(position..position, ["--host-vm".into(), "never".into()]);
    let config = hostvm::HelperVmConfig {
        assets_dir: hostvm::ensure_assets(None)?,
        shared_dirs: shared,
        forward_stdin_always: forward_stdin,
        ..hostvm::HelperVmConfig::default()
    };
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = hostvm::run(&config, &exe, &args, &[])?;
    Ok(u8::try_from(status).unwrap_or(EXIT_NO_STATUS))
}

/// Whether the helper VM's QEMU is on PATH.
fn qemu_available() -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join("qemu-system-x86_64").is_file()))
        .unwrap_or(false)
}

fn cmd_check(args: CheckArgs) -> Result<u8> {
    if args.host_vm == HostVmMode::Always {
        eprintln!("detvisor: checking the KVM inside the helper VM (QEMU TCG with nested SVM)");
        let mut inner: Vec<OsString> = vec!["check".into(), "--host-vm".into(), "never".into()];
        if args.json {
            inner.push("--json".into());
        }
        let config = hostvm::HelperVmConfig {
            assets_dir: hostvm::ensure_assets(None)?,
            ..hostvm::HelperVmConfig::default()
        };
        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let status = hostvm::run(&config, &exe, &inner, &[])?;
        return Ok(u8::try_from(status).unwrap_or(EXIT_NO_STATUS));
    }
    let report = vmm::probe::host_report();
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
        Command::Check(args) => cmd_check(args),
        Command::Bench(args) => bench::run(args),
        Command::Snapshot(SnapshotCommand::Ls { dir, json }) => snapshots::list(&dir, json),
        Command::Snapshot(SnapshotCommand::Info { dir }) => snapshots::info(&dir),
        Command::Branch(args) => cmd_branch(args),
        Command::Seek(args) => cmd_seek(args),
        Command::Shell(args) => cmd_shell(args),
        Command::Up(args) => up_cmd::cmd_up(args),
        Command::Image(cmd) => image_cmd::run(cmd),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("detvisor: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
