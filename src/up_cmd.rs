//! The `detvisor up` command: arguments, guest assembly, placement (host or
//! helper VM), the runs (one, or several compared as an audit) and the summary.

use crate::faults::{schedule, TimedFault};
use crate::manifest::{self, Manifest};
use crate::snapshots::{Driven, SnapshotArgs, Snapshotter};
use crate::up::{self, Conductor, OutputSink, UpDriver, UpOutput};
use crate::{
    compare_runs, guest, hostvm, placement, units, HostVmMode, Placement, RunSummary,
    EXIT_NO_STATUS,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use detvisor_agent::protocol::NodeSpec;
use serde::Serialize;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use vmm::record::RecordConfig;
use vmm::vm::{NetworkSpec, VmConfig};

/// Guest RAM unless the manifest or --mem says otherwise.
const DEFAULT_MEM: &str = "512M";
const DEFAULT_RTC_EPOCH: i64 = 1_704_067_200;

#[derive(Args, Debug)]
pub struct UpArgs {
    /// The manifest (TOML): nodes, workload, network, faults. See docs/manifest.md.
    manifest: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
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
    /// Kernel (uncompressed vmlinux); default: the built-in guest image's.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// A guest initrd already assembled (with --node-specs); internal.
    #[arg(long, hide = true, requires = "node_specs")]
    initrd: Option<PathBuf>,
    /// The agent's node requests as JSON, for --initrd; internal.
    #[arg(long, hide = true)]
    node_specs: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    /// Snapshots of the (first) run, to branch, seek or open a shell in later.
    #[command(flatten)]
    snapshots: SnapshotArgs,
}

#[derive(Serialize)]
struct UpSummary {
    #[serde(flatten)]
    run: RunSummary,
    /// The run's status: the workload's, or 124 at the time limit with a
    /// workload still running.
    status: u8,
    runs: u32,
    identical: bool,
    divergence: Option<String>,
    /// Wall time from the start of the (first) run to the workload's start:
    /// boot plus bringing every node up.
    boot_to_workload_wall_ms: Option<u64>,
    /// Virtual time at the workload's start.
    boot_to_workload_virtual_ns: Option<u64>,
}

/// The guest as the VMM needs it: kernel, initrd, what the agent is asked.
struct Guest {
    kernel: PathBuf,
    initrd: Vec<u8>,
    specs: Vec<NodeSpec>,
}

fn assemble_guest(manifest: &Manifest, kernel: Option<&Path>) -> Result<Guest> {
    let image = guest::default_image()?;
    let agent = guest::agent_binary()?;
    let (specs, overlay) = up::assemble(manifest, &agent)?;
    let mut initrd = std::fs::read(&image.initrd)
        .with_context(|| format!("cannot read {}", image.initrd.display()))?;
    // Archives in an initrd start on a 4-byte boundary.
    while initrd.len() % 4 != 0 {
        initrd.push(0);
    }
    image_builder::write_initramfs(&overlay, &mut initrd).context("packing the guest initramfs")?;
    Ok(Guest {
        kernel: kernel.map(Path::to_path_buf).unwrap_or(image.kernel),
        initrd,
        specs,
    })
}

pub fn cmd_up(args: UpArgs) -> Result<u8> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let manifest = manifest::load(&args.manifest)?;
    let names = manifest.node_names();
    let fault_texts: Vec<String> = manifest
        .faults
        .iter()
        .chain(&args.faults)
        .cloned()
        .collect();
    let faults = schedule(&fault_texts, &names)?;
    if let Some(manifest::WorkloadPlan::OwnNode(node)) = &manifest.workload {
        if let Some(fault) = faults
            .iter()
            .find(|f| !f.action.is_network() && f.action.nodes().contains(&node.name.as_str()))
        {
            bail!(
                "fault {}: the workload's own node can be partitioned, not paused, killed or restarted (its end is the run's end)",
                fault.action
            );
        }
    }
    let mem = args
        .mem
        .clone()
        .or(manifest.mem.clone())
        .unwrap_or_else(|| DEFAULT_MEM.into());
    let ram_bytes = units::parse_size(&mem).context("--mem")?;
    let until = args
        .until
        .as_deref()
        .map(units::parse_duration)
        .transpose()
        .context("--until")?;

    if let Placement::HelperVm { reason } = placement(args.host_vm) {
        return up_in_helper_vm(&args, &manifest, &mem, &reason);
    }
    let guest = match (&args.initrd, &args.node_specs) {
        (Some(initrd), Some(specs)) => Guest {
            kernel: match &args.kernel {
                Some(k) => k.clone(),
                None => guest::default_image()?.kernel,
            },
            initrd: std::fs::read(initrd)
                .with_context(|| format!("cannot read initrd {}", initrd.display()))?,
            specs: serde_json::from_slice(
                &std::fs::read(specs)
                    .with_context(|| format!("cannot read {}", specs.display()))?,
            )
            .with_context(|| format!("node specs {}", specs.display()))?,
        },
        _ => assemble_guest(&manifest, args.kernel.as_deref())?,
    };
    let config = VmConfig {
        kernel: guest.kernel.clone(),
        initrd: guest.initrd,
        // The node roots live in the initramfs. As ramfs rather than tmpfs it
        // has no size cap (half of RAM) and no fallocate, so preallocating
        // programs (etcd's 64 MB WAL segments) get sparse files instead of
        // pinning RAM they never write.
        cmdline: format!(
            "{} rootfstype=ramfs rdinit=/detvisor-agent",
            guest::default_cmdline()
        ),
        ram_bytes,
        seed: args.seed,
        until,
        rtc_epoch_unix_secs: manifest.rtc_epoch.unwrap_or(DEFAULT_RTC_EPOCH),
        record: RecordConfig {
            keep_records: args.runs > 1,
            ..RecordConfig::default()
        },
        perturbation: None,
        network: Some(NetworkSpec {
            nics: names.len() as u8,
            config: manifest.network,
        }),
        agent_channel: true,
    };
    let network_faults: Vec<TimedFault> = faults
        .iter()
        .filter(|f| f.action.is_network())
        .cloned()
        .collect();

    let mut reference: Option<(vmm::vm::RunOutcome, u8)> = None;
    let workload_start: std::rc::Rc<
        std::cell::RefCell<Option<(std::time::Duration, vmm::VirtNanos)>>,
    > = Default::default();
    let mut divergence = None;
    for run in 1..=args.runs {
        let first = run == 1;
        let conductor = Conductor::new(guest.specs.clone(), manifest.workload.clone(), &faults);
        let out: Box<dyn Write> = if first && !args.quiet && !args.json {
            Box::new(std::io::stdout())
        } else {
            Box::new(std::io::sink())
        };
        let sink = OutputSink::new(&names, first.then(|| args.logs.clone()), out)?;
        let started = std::time::Instant::now();
        let mut session = vmm::vm::Session::boot(&config, Box::new(std::io::sink()), None)?;
        let workload_started = std::rc::Rc::clone(&workload_start);
        let events = move |at: vmm::VirtNanos, text: &str| {
            if first {
                up::print_event(at, text);
                if text.starts_with("workload started") || text.starts_with("node workload started")
                {
                    let mut start = workload_started.borrow_mut();
                    start.get_or_insert((started.elapsed(), at));
                }
            }
        };
        let output = UpOutput {
            sink,
            events: Box::new(events),
        };
        let driver = UpDriver::start(&mut session, conductor, &network_faults, &names, output)?;
        let mut driven = Driven {
            session,
            up: Some(driver),
        };
        // Snapshots are taken in the first run (an audit's later runs check
        // that they did not perturb it).
        let stop = match Snapshotter::new(&args.snapshots, None)?.filter(|_| first) {
            Some(mut snapshotter) => {
                let stop = snapshotter.run(&mut driven)?;
                snapshotter.report();
                stop
            }
            None => driven.run_to_end()?,
        };
        let status = driven
            .exit_status(stop)
            .expect("an up run always has a status");
        let outcome = driven.outcome(stop)?;
        if args.runs > 1 {
            eprintln!(
                "detvisor up: run {run}/{}: {} exits, virtual {}, digest {}{}",
                args.runs,
                outcome.exits,
                outcome.virtual_time,
                outcome.digest,
                crate::stepped_note(&outcome)
            );
        }
        match &reference {
            None => reference = Some((outcome, status)),
            Some((first_outcome, _)) => {
                if let Some(text) = compare_runs(first_outcome, &outcome, run) {
                    divergence = Some(text);
                    break;
                }
            }
        }
    }
    let (outcome, status) = reference.expect("at least one run");
    let summary = UpSummary {
        run: RunSummary::new(args.seed, &outcome),
        status,
        runs: args.runs,
        identical: divergence.is_none(),
        divergence,
        boot_to_workload_wall_ms: workload_start
            .borrow()
            .map(|(wall, _)| wall.as_millis() as u64),
        boot_to_workload_virtual_ns: workload_start.borrow().map(|(_, at)| at.0),
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        // The run's status is the workload's, whatever way the guest ended.
        let human = summary.run.human();
        let details = human.split_once("; ").map_or(human.as_str(), |(_, d)| d);
        eprintln!("detvisor: exit {status}; {details}");
        if args.runs > 1 {
            match &summary.divergence {
                None => println!(
                    "identical: {} runs, {} exits each, digest {}",
                    args.runs, outcome.exits, outcome.digest
                ),
                Some(text) => println!("DIVERGED: {text}"),
            }
        }
    }
    if !summary.identical {
        return Ok(1);
    }
    Ok(status)
}

/// Assembles the guest here (the images are on this host), then runs
/// `detvisor up` inside the helper VM on the assembled files.
fn up_in_helper_vm(args: &UpArgs, manifest: &Manifest, mem: &str, reason: &str) -> Result<u8> {
    let guest = assemble_guest(manifest, args.kernel.as_deref())?;
    // Removed with its files when this function returns.
    let staging_dir = crate::tempdir::TempDir::new("detvisor-up-")
        .context("creating a staging directory for the helper VM's files")?;
    let staging = staging_dir.path();
    let initrd = staging.join("initrd");
    std::fs::write(&initrd, &guest.initrd)
        .with_context(|| format!("writing {}", initrd.display()))?;
    let specs = staging.join("specs.json");
    std::fs::write(&specs, serde_json::to_vec(&guest.specs)?)
        .with_context(|| format!("writing {}", specs.display()))?;
    std::fs::create_dir_all(&args.logs)
        .with_context(|| format!("creating the log directory {}", args.logs.display()))?;
    let logs = args
        .logs
        .canonicalize()
        .with_context(|| format!("logs directory {}", args.logs.display()))?;
    eprintln!("detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}");
    let assets = hostvm::ensure_assets(None)?;
    let file = |host_path: &Path, name: &str| hostvm::PayloadFile {
        host_path: host_path.to_path_buf(),
        payload_name: name.into(),
    };
    let files = vec![
        file(&guest.kernel, "vmlinux"),
        file(&initrd, "initrd"),
        file(&specs, "specs.json"),
        file(&args.manifest, "manifest.toml"),
    ];
    let mut inner: Vec<OsString> = vec![
        "up".into(),
        hostvm::payload_path("manifest.toml").into(),
        "--host-vm".into(),
        "never".into(),
        "--kernel".into(),
        hostvm::payload_path("vmlinux").into(),
        "--initrd".into(),
        hostvm::payload_path("initrd").into(),
        "--node-specs".into(),
        hostvm::payload_path("specs.json").into(),
        "--seed".into(),
        args.seed.to_string().into(),
        "--mem".into(),
        mem.into(),
        "--logs".into(),
        logs.clone().into(),
        "--runs".into(),
        args.runs.to_string().into(),
    ];
    if let Some(until) = &args.until {
        inner.extend(["--until".into(), until.into()]);
    }
    for fault in &args.faults {
        inner.extend(["--fault".into(), fault.into()]);
    }
    if args.quiet {
        inner.push("--quiet".into());
    }
    if args.json {
        inner.push("--json".into());
    }
    let mut shared_dirs = vec![logs];
    if let Some((options, dir)) = args.snapshots.forwarded()? {
        inner.extend(options.into_iter().map(OsString::from));
        shared_dirs.push(dir);
    }
    let ram = units::parse_size(mem)?;
    let config = hostvm::HelperVmConfig {
        assets_dir: assets,
        // The initrd is shipped in the helper's own initramfs and then read
        // into the VMM: count it about three times over.
        memory_mib: ((ram >> 20) as u32)
            .saturating_add(1536)
            .saturating_add(((3 * guest.initrd.len()) >> 20) as u32)
            .max(2048),
        shared_dirs,
        ..hostvm::HelperVmConfig::default()
    };
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = hostvm::run(&config, &exe, &inner, &files)?;
    Ok(u8::try_from(status).unwrap_or(EXIT_NO_STATUS))
}
