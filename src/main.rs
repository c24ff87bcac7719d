//! detvisor: a deterministic hypervisor for testing distributed systems under faults.

mod campaign_cmd;
mod debug_cmd;
#[cfg(test)]
mod error_chains;
mod gdb_cmd;
mod image_cmd;
mod likelihood_cmd;
mod print;
mod progress;
mod report_cmd;
mod serve;
mod serve_cmd;
mod soak_cmd;
mod terminal;
mod trace_cmd;
mod triage_cmd;
mod up_cmd;
mod verify_cmd;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use helper_vm::client::Placed;
use helper_vm::HostVmMode;
use run::client::{Calls, Local, RunnerError};
use run::moment::Moment;
use run::plain::{GuestSpec, PlainNetwork};
use run::snapshots::SnapshotPlan;
use run::units::{self, ByteSize};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use terminal::StdStreams;
use vmm::stall::StallTimeout;
use vmm::VirtNanos;

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
    /// Resume a saved moment (DIR@12.5s, DIR@exit:N[+insn:K], DIR/ID) and run on from it.
    Branch(BranchArgs),
    /// Replay to an exact moment (DIR@12.5s, DIR@exit:N, DIR@exit:N+insn:K) and report the machine state there.
    Seek(SeekArgs),
    /// A gdb remote server on a saved moment (DIR@12.5s, DIR@exit:N[+insn:K]): registers,
    /// memory, stepi, breakpoints, reverse-stepi and reverse-continue by deterministic replay
    Gdb(gdb_cmd::GdbArgs),
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
    /// A campaign's findings, one line per distinct failure; with
    /// --baseline, each new, known or ignored (exit 1 only for new ones).
    Findings(triage_cmd::FindingsArgs),
    /// Mark a finding known or ignored in a baseline file (TOML), which
    /// `findings --baseline` reads.
    Triage(triage_cmd::TriageArgs),
    /// Reproduce a finding (DIR/findings/NNNN) bit for bit from a fresh process.
    Replay(campaign_cmd::ReplayArgs),
    /// A campaign's report (one directory or its shards, merged): HTML,
    /// JSON, JUnit XML, or a summary on the terminal.
    Report(report_cmd::ReportArgs),
    /// A source's notable moments: a finding's failure, its branch points,
    /// faults, node events, failed properties; a directory's snapshots.
    Moments(debug_cmd::MomentsArgs),
    /// What a history reported up to a moment: node output, faults,
    /// property records, run events (filtered by node, text, kind,
    /// property).
    Events(debug_cmd::EventsArgs),
    /// Every property a history evaluated, with passing and failing
    /// examples, each naming its moment.
    Properties(debug_cmd::PropertiesArgs),
    /// The nodes of a history and the last event of each.
    Nodes(debug_cmd::PropertiesArgs),
    /// A command at a moment (e.g. findings/0001@-1s), inside a node or
    /// beside the nodes: in a fork with every node stopped, or with
    /// --branch while the nodes run on.
    Exec(debug_cmd::ExecArgs),
    /// A node's file at a moment, in a fork.
    Extract(debug_cmd::ExtractArgs),
    /// The processes of a node (or of the guest) at a moment, in a fork.
    Processes(debug_cmd::ProcessesArgs),
    /// The machine at a moment: registers, virtual time, exit index,
    /// devices, nodes.
    Inspect(debug_cmd::MomentArgs),
    /// Go to a moment of any history and print its id and digest.
    Rewind(debug_cmd::MomentArgs),
    /// Run a history on from a moment for a virtual duration; prints the
    /// moment it ends at.
    Wait(debug_cmd::WaitArgs),
    /// Verify a fix: replay a finding's faults with N seeds on the patched and the unpatched system side by side.
    Verify(verify_cmd::VerifyArgs),
    /// Where the exits of a trace (`run`/`up`/`branch --trace FILE`) went:
    /// counts by kind and by device, in all and per virtual second.
    Trace(trace_cmd::TraceArgs),
    Likelihood(likelihood_cmd::LikelihoodArgs),
    /// The debugger over MCP for coding agents: every debugger verb a tool,
    /// over stdio (default) or streamable HTTP, within enforced budgets.
    Serve(serve_cmd::ServeArgs),
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
    /// DIR@<time>, DIR@exit:<n>, DIR@exit:<n>+insn:<k> (k single steps after exit n), DIR@latest or DIR/<id>.
    spec: Moment,
    /// Stop at this virtual time (absolute, as in `run --until`).
    #[arg(long)]
    until: Option<VirtNanos>,
    /// Re-key every seeded stream from this seed at the branch point.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Many alternate histories, one per seed (e.g. 1..64: inclusive), run in
    /// parallel child processes; prints a table of outcomes.
    #[arg(long)]
    seeds: Option<run::seeds::SeedRange>,
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
    #[arg(long = "fault", value_parser = run::faults::parse_fault_flag)]
    faults: Vec<run::faults::Fault>,
    /// Take snapshots of the branch too.
    #[command(flatten)]
    snapshots: SnapshotArgs,
    /// Write every exit of the branch (from the branch point on) into FILE,
    /// a JSON line each; `detvisor trace FILE` sums them up.
    #[arg(long, value_name = "FILE", conflicts_with = "seeds")]
    trace: Option<PathBuf>,
    /// The clock the moment's history must have (exit, step): another is
    /// refused, as one history keeps one clock. Default: the history's own.
    #[arg(long, conflicts_with = "seeds")]
    clock: Option<vmm::ClockKind>,
    #[arg(long)]
    json: bool,
    /// With --seeds: show no progress (no line per seed on stderr; errors
    /// still). Without it, a line per seed as its branch ends.
    #[arg(long, requires = "seeds")]
    quiet: bool,
    #[command(flatten)]
    place: RunPlaceArgs,
}

/// Where a verb's guests run: `--host-vm` and `--no-seccomp`.
#[derive(Args, Debug, Clone, Copy)]
pub struct PlaceArgs {
    /// Where to run: the host's KVM, or a helper VM with real KVM inside.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    /// Run guests without the VMM's seccomp filter (for debugging; see
    /// docs/security.md).
    #[arg(long)]
    pub no_seccomp: bool,
}

/// Where a verb's runs happen, and how long a guest may go without an
/// exit: `--stall-timeout`, `--host-vm`, `--no-seccomp`.
#[derive(Args, Debug, Clone, Copy)]
pub struct RunPlaceArgs {
    /// Wall time the guest may execute without a VM exit before the run ends
    /// as `stalled` (e.g. 60s; 0: never). Default: 60s on hardware KVM,
    /// 10m in the helper VM (where the same wall time is far less guest work).
    #[arg(long)]
    pub stall_timeout: Option<StallTimeout>,
    #[command(flatten)]
    pub place: PlaceArgs,
}

/// The CLI's runner: the run library in this process (its stdio the
/// request's streams), or a helper VM.
pub type CliRunner = Placed<Local<StdStreams>>;

impl PlaceArgs {
    /// A runner for this verb's requests (`stall`: every run's stall
    /// timeout; default: for where it runs); `stdin` says what the
    /// requests read of this process's stdin.
    pub fn runner(self, stall: Option<StallTimeout>, stdin: Stdin) -> CliRunner {
        let input = match stdin {
            Stdin::None => None,
            Stdin::Raw => Some(terminal::StdinEnd::Never),
            Stdin::UntilEot => Some(terminal::StdinEnd::AtEot),
        };
        Placed::new(
            helper_vm::placement(self.host_vm),
            || Local::process_wide(StdStreams::with_input(input)),
            stall,
            !self.no_seccomp,
            stdin != Stdin::None,
        )
    }

    /// Where a campaign's runs happen.
    pub fn campaign(self) -> fuzzer::campaign::Place {
        fuzzer::campaign::Place {
            host_vm: self.host_vm,
            seccomp: !self.no_seccomp,
        }
    }
}

impl RunPlaceArgs {
    pub fn runner(self, stdin: Stdin) -> CliRunner {
        self.place.runner(self.stall_timeout, stdin)
    }
}

/// A failed call, said as the run library said it (the verb is the
/// process's one).
pub fn failed(error: RunnerError) -> anyhow::Error {
    anyhow::Error::msg(error.into_cause())
}

#[derive(Args, Debug)]
struct SeekArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@exit:<n>+insn:<k> (k single steps after exit n), DIR@latest or DIR/<id>.
    spec: Moment,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    place: PlaceArgs,
}

#[derive(Args, Debug)]
struct ShellArgs {
    /// DIR@<time>, DIR@exit:<n>, DIR@exit:<n>+insn:<k> (k single steps after exit n), DIR@latest or DIR/<id>.
    spec: Moment,
    /// For a snapshot of an `up` run: open the shell inside this node (its
    /// namespaces and root, its `/bin/sh`) instead of beside the nodes.
    #[arg(long)]
    node: Option<String>,
    #[command(flatten)]
    place: PlaceArgs,
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
    mem: ByteSize,
    /// Stop after this much virtual time (e.g. 30s, 500ms, 10m).
    #[arg(long)]
    until: Option<VirtNanos>,
    /// Wall-clock date the guest's CMOS clock starts at, as unix seconds.
    #[arg(long, default_value_t = 1_704_067_200)]
    rtc_epoch: i64,
    /// How the guest reads the time and takes interrupts: clock-page (no
    /// exit per clock read, timer arming or interrupt) or legacy (the HPET
    /// and an EOI per interrupt, kept for comparisons).
    #[arg(long, default_value_t = vmm::ExitPath::default())]
    exit_path: vmm::ExitPath,
    /// What moves virtual time: exit (a fixed cost per exit, jumps when
    /// idle), step (every instruction single-stepped and counted, 1 ns
    /// each: slow, for bare guests and short windows) or pmu (a hardware
    /// counter; `detvisor check` says whether this host has one).
    #[arg(long, default_value_t = vmm::ClockKind::Exit)]
    clock: vmm::ClockKind,
    /// What `--clock pmu` counts with: hardware (the host's PMU) or
    /// emulated (single steps with an emulated skid: the pmu clock's loop
    /// on a host without a PMU, for tests; as slow as the step clock).
    #[arg(long, default_value_t = vmm::pmu_clock::PmuCounterChoice::Hardware, hide = true)]
    pmu_counter: vmm::pmu_clock::PmuCounterChoice,
    /// Virtio NICs in the guest (eth0..), joined by detvisor's simulated switch.
    #[arg(long, default_value_t = 0)]
    nics: u8,
    /// One-way frame latency on the switch: a duration (5ms) or a range (1ms..10ms, uniform).
    #[arg(long, default_value = "1ms", value_parser = units::parse_latency)]
    net_latency: devices::LatencyDist,
    /// Probability that the switch loses a frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    net_loss: f64,
    #[command(flatten)]
    place: RunPlaceArgs,
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
    pub snapshot_every: Option<VirtNanos>,
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
        let plan = SnapshotPlan {
            dir: dir.clone(),
            every: self.snapshot_every,
            at_exits: self.snapshot_at_exit.clone(),
        };
        // Checked here too, before any VM starts.
        plan.validate().context("--snapshot-every")?;
        Ok(Some(plan))
    }
}

/// What a request reads from this process's stdin.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stdin {
    /// Nothing.
    None,
    /// Every byte (an interactive console).
    Raw,
    /// Bytes up to Ctrl-D (a fork's shell).
    UntilEot,
}

/// The guest `run` and `audit` boot, from their flags.
fn guest_spec(guest: &GuestArgs) -> Result<GuestSpec> {
    // Every flag is checked, whether or not it is used (`--net-*` without
    // `--nics`), before anything starts.
    let mut config = devices::NetworkConfig::reliable(guest.net_latency);
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
        ram_bytes: units::check_ram(guest.mem.0).context("--mem")?,
        until: guest.until,
        rtc_epoch_unix_secs: guest.rtc_epoch,
        network,
        command: guest.command.clone(),
        // Set for where the request runs (`PlaceArgs::runner`).
        stall_timeout: StallTimeout::default(),
        exit_path: guest.exit_path,
        clock: guest.clock,
        pmu_counter: guest.pmu_counter,
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
    let guest = guest_spec(&args.guest)?;
    let snapshots = args.snapshots.plan()?;
    let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
    let stdin = if interactive { Stdin::Raw } else { Stdin::None };
    let mut runner = args.guest.place.runner(stdin);
    let summary = Calls::new(&mut runner)
        .run(guest, snapshots, args.pcap.clone(), args.trace.clone())
        .map_err(failed)?;
    print::summary(&summary, args.json)
}

fn cmd_audit(args: AuditArgs) -> Result<u8> {
    if args.runs < 2 {
        bail!("--runs must be at least 2 to compare anything");
    }
    let guest = guest_spec(&args.guest)?;
    let options = run::audit::AuditOptions {
        runs: args.runs,
        memory_every: args.memory_every,
        devices_every: args.devices_every,
        perturb: args.perturb.perturb(),
    };
    let mut runner = args.guest.place.runner(Stdin::None);
    let summary = Calls::new(&mut runner)
        .audit(guest, options)
        .map_err(failed)?;
    print::audit(&summary, args.json)
}

fn cmd_branch(args: BranchArgs) -> Result<u8> {
    // A moment of a finding's history: a branch the debugger makes.
    if let Some(moment) = debug_cmd::finding_moment(&args.spec) {
        if args.seeds.is_some() || args.trace.is_some() || args.snapshots.snapshots.is_some() {
            bail!("a branch of a finding's history takes --seed, --fault and --until (see `detvisor likelihood` for many seeds)");
        }
        return debug_cmd::cmd_branch(
            moment,
            args.seed,
            &args.faults,
            args.until,
            args.json,
            args.place.place,
        );
    }
    // Checked against the snapshot's files before anything starts: the
    // grammar, the nodes, the branch point and the lanes.
    run::branch::check_faults(&args.spec, &args.faults)?;
    let faults = args.faults;
    let until = args.until;
    if let Some(range) = &args.seeds {
        let request = run::seeds::SeedsRequest {
            moment: args.spec.clone(),
            seeds: *range,
            jobs: args.jobs,
            until,
            in_place: args.in_place,
            faults: faults.clone(),
            stall_timeout: StallTimeout::default(),
            progress: !args.quiet,
        };
        let mut runner = args.place.runner(Stdin::None);
        let report = Calls::new(&mut runner)
            .branch_seeds(request)
            .map_err(failed)?;
        return print::seeds(&report, args.json);
    }
    let request = run::branch::BranchRequest {
        moment: args.spec.clone(),
        until,
        seed: args.seed,
        snapshots: args.snapshots.plan()?,
        // An `up` snapshot's node output goes to stdout as under `up`
        // (events to stderr); a `run` snapshot's guest console to stdout.
        events: !args.json,
        faults,
        stall_timeout: StallTimeout::default(),
        trace: args.trace.clone(),
        clock: args.clock,
    };
    let mut runner = args.place.runner(Stdin::None);
    let summary = Calls::new(&mut runner).branch(request).map_err(failed)?;
    print::summary(&summary, args.json)
}

fn cmd_shell(args: ShellArgs) -> Result<u8> {
    // A moment of a finding's history: the debugger reaches it.
    if let Some(moment) = debug_cmd::finding_moment(&args.spec) {
        let (rows, cols) = terminal::size();
        let _raw = std::io::stdin()
            .is_terminal()
            .then(terminal::RawMode::enter)
            .transpose()?;
        let terminal = run::shell::Terminal {
            node: args.node.clone(),
            rows,
            cols,
            term: std::env::var("TERM").ok().filter(|t| !t.is_empty()),
        };
        return debug_cmd::cmd_shell(moment, terminal, args.place);
    }
    // An `up` fork's shell is on a pseudo-terminal in the guest, which
    // echoes and edits lines: keystrokes pass through unchanged.
    let interactive = std::io::stdin().is_terminal() && run::snapshots::is_up(&args.spec)?;
    let _raw = interactive.then(terminal::RawMode::enter).transpose()?;
    let (rows, cols) = terminal::size();
    let request = run::shell::ShellRequest {
        moment: args.spec.clone(),
        node: args.node.clone(),
        rows,
        cols,
        term: std::env::var("TERM").ok().filter(|t| !t.is_empty()),
    };
    let mut runner = args.place.runner(None, Stdin::UntilEot);
    Calls::new(&mut runner).shell(request).map_err(failed)
}

fn cmd_seek(args: SeekArgs) -> Result<u8> {
    let mut runner = args.place.runner(None, Stdin::None);
    let report = Calls::new(&mut runner).seek(args.spec).map_err(failed)?;
    print::seek(&report, args.json)
}

fn cmd_snapshot(command: SnapshotCommand) -> Result<u8> {
    let mut here = Local::new(StdStreams::default());
    let mut calls = Calls::new(&mut here);
    match command {
        SnapshotCommand::Ls { dir, json } => {
            print::snapshot_rows(&calls.list_snapshots(dir).map_err(failed)?, json)
        }
        SnapshotCommand::Info { dir } => {
            print::snapshot_details(&calls.snapshot_info(dir).map_err(failed)?)
        }
    }
}

fn cmd_check(args: CheckArgs) -> Result<u8> {
    let report = if args.host_vm == HostVmMode::Always {
        let reason = "`check --host-vm always` checks the KVM inside it".to_string();
        let placement = helper_vm::Placement::HelperVm { reason };
        let mut runner = CliRunner::new(
            placement,
            || Local::new(StdStreams::default()),
            None,
            true,
            false,
        );
        Calls::new(&mut runner).host_report().map_err(failed)?
    } else {
        vmm::probe::host_report_with_clocks()
    };
    let probed_on = if args.host_vm == HostVmMode::Always {
        vmm::insn_probe::ProbedOn::HelperVm
    } else {
        vmm::insn_probe::ProbedOn::ThisHost
    };
    let qemu = helper_vm::qemu_available();
    if args.json {
        #[derive(Serialize)]
        struct Check<'a> {
            #[serde(flatten)]
            host: &'a vmm::probe::HostReport,
            helper_vm_qemu: bool,
            /// `host` or `helper_vm`: whose KVM the report is about.
            checked_on: &'static str,
        }
        println!(
            "{}",
            serde_json::to_string(&Check {
                host: &report,
                helper_vm_qemu: qemu,
                checked_on: match probed_on {
                    vmm::insn_probe::ProbedOn::ThisHost => "host",
                    vmm::insn_probe::ProbedOn::HelperVm => "helper_vm",
                },
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
        if let (Some(probes), Some(clocks)) = (&report.instruction_probes, &report.clocks) {
            for line in vmm::insn_probe::report_lines(probes, clocks, probed_on) {
                println!("{line}");
            }
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

/// The command line, or the exit of a process given a bad one: a value that
/// does not parse is one line naming the flag (`--until: ...`), as every
/// other bad input; clap's own usage errors and help as clap prints them.
fn parse_cli() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        if e.kind() != clap::error::ErrorKind::ValueValidation {
            e.exit();
        }
        let reason =
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
        match e.get(clap::error::ContextKind::InvalidArg) {
            Some(clap::error::ContextValue::String(arg)) if arg.starts_with("--") => {
                let flag = arg.split_whitespace().next().unwrap_or(arg);
                eprintln!("detvisor: error: {flag}: {reason}");
            }
            _ => eprintln!("detvisor: error: {reason}"),
        }
        ExitCode::from(run::exit_status::BAD_INPUT)
    })
}

/// A reader that closed its end of stdout (`detvisor snapshot ls | head`)
/// ends the process as a shell's pipeline expects (status 128 + SIGPIPE),
/// not with `println!`'s panic. SIGPIPE itself stays ignored: a closed
/// helper-VM channel must be an error that names it, not a silent death.
fn end_quietly_when_stdout_is_closed() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(128 + libc::SIGPIPE);
        }
        default(info);
    }));
}

/// Whether the verb was asked for `--quiet` (no progress, no diagnostics:
/// nothing on stderr but errors).
fn quiet(command: &Command) -> bool {
    match command {
        Command::Campaign(args) => args.quiet,
        Command::Replay(args) => args.quiet,
        Command::Image(image_cmd::ImageCommand::Build(args)) => args.quiet,
        Command::Branch(args) => args.quiet,
        Command::Verify(args) => args.quiet,
        Command::Report(args) => args.quiet,
        _ => false,
    }
}

fn main() -> ExitCode {
    end_quietly_when_stdout_is_closed();
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // The helper VM's end of the channel writes nothing of its own.
    if !matches!(cli.command, Command::ServeChannel) {
        progress::init_tracing(quiet(&cli.command));
    }
    let result = match cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Audit(args) => cmd_audit(args),
        Command::Soak(args) => soak_cmd::cmd_soak(args),
        Command::Check(args) => cmd_check(args),
        Command::Bench(args) => detvisor_bench::run(args),
        Command::Snapshot(command) => cmd_snapshot(command),
        Command::Branch(args) => cmd_branch(args),
        Command::Seek(args) => cmd_seek(args),
        Command::Gdb(args) => gdb_cmd::cmd_gdb(args),
        Command::Shell(args) => cmd_shell(args),
        Command::Up(args) => up_cmd::cmd_up(args),
        Command::Trace(args) => trace_cmd::cmd_trace(args),
        Command::Campaign(args) => campaign_cmd::cmd_campaign(args),
        Command::Findings(args) => triage_cmd::cmd_findings(args),
        Command::Triage(args) => triage_cmd::cmd_triage(args),
        Command::Replay(args) => campaign_cmd::cmd_replay(args),
        Command::Report(args) => report_cmd::cmd_report(args),
        Command::Moments(args) => debug_cmd::cmd_moments(args),
        Command::Events(args) => debug_cmd::cmd_events(args),
        Command::Properties(args) => debug_cmd::cmd_properties(args),
        Command::Nodes(args) => debug_cmd::cmd_nodes(args),
        Command::Exec(args) => debug_cmd::cmd_exec(args),
        Command::Extract(args) => debug_cmd::cmd_extract(args),
        Command::Processes(args) => debug_cmd::cmd_processes(args),
        Command::Inspect(args) => debug_cmd::cmd_inspect(args),
        Command::Rewind(args) => debug_cmd::cmd_rewind(args),
        Command::Wait(args) => debug_cmd::cmd_wait(args),
        Command::Likelihood(args) => likelihood_cmd::cmd_likelihood(args),
        Command::Verify(args) => verify_cmd::cmd_verify(args),
        Command::Image(cmd) => image_cmd::run(cmd),
        Command::Serve(args) => serve_cmd::cmd_serve(args),
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

#[cfg(test)]
mod quiet_tests {
    use super::*;

    /// `--quiet` silences the diagnostics (`tracing`) of every verb that
    /// takes it, not only its progress.
    #[test]
    fn test_each_verb_s_quiet_silences_its_diagnostics() {
        let quiet_of = |argv: &[&str]| quiet(&Cli::try_parse_from(argv).unwrap().command);
        for argv in [
            &["detvisor", "campaign", "c.toml", "--out", "o", "--quiet"][..],
            &["detvisor", "replay", "f", "--quiet"],
            &[
                "detvisor", "image", "build", "--rootfs", "r", "--out", "o", "--quiet",
            ],
            &[
                "detvisor", "branch", "s@latest", "--seeds", "1..4", "--quiet",
            ],
            &["detvisor", "verify", "f", "--image", "p.img", "--quiet"],
            &["detvisor", "report", "d", "--quiet"],
        ] {
            assert!(quiet_of(argv), "{argv:?}");
            assert!(!quiet_of(&argv[..argv.len() - 1]), "{argv:?}");
        }
        // Without --seeds there is no progress to silence.
        assert!(Cli::try_parse_from(["detvisor", "branch", "s@latest", "--quiet"]).is_err());
    }
}
