//! An `up` run from its manifest to its summary: the guest assembled on the
//! host ([`prepare`]), then booted and conducted to its end, once or several
//! times compared as an audit ([`run`]).

use super::assemble;
use super::prepare_error::PrepareError;
use crate::audit::compare_runs;
use crate::conversation::{Conductor, DriveError, OutputError, OutputSink, UpDriver, UpOutput};
use crate::driven::{Driven, DrivenError};
use crate::event::UpEvent;
use crate::faults::{schedule, Fault, FaultAction, NodeFault, ScheduledFault};
use crate::guest;
use crate::manifest::{Manifest, WorkloadPlan};
use crate::outcome::{stepped_note, RunSummary};
use crate::pcap::PcapRecorder;
use crate::snapshots::{SnapshotPlan, SnapshotsError, Snapshotter};
use crate::streams::{say, Streams};
use guest_agent::protocol::NodeSpec;
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::{NetworkSpec, VmConfig};
use vmm::VirtNanos;

/// Why an `up` run could not boot or run ([`PreparedUp::vm_config`],
/// [`PreparedUp::boot`], [`run`]).
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("cannot read the initrd")]
    ReadInitrd(#[source] hostfile::ReadError),
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
    #[error(transparent)]
    Drive(#[from] DriveError),
    #[error(transparent)]
    Driven(#[from] DrivenError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Snapshots(#[from] SnapshotsError),
    #[error(transparent)]
    Pcap(#[from] crate::pcap::PcapError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    #[error("writing the records to {}", path.display())]
    Records {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("an up run ended without a status")]
    NoStatus,
    #[error("an up run ran no run")]
    NoRun,
}

/// Guest RAM of an `up` run unless the manifest or the caller says otherwise.
pub const DEFAULT_RAM_BYTES: u64 = 512 << 20;

/// The guest's initramfs: in memory, or in a file (to cross into the helper VM).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Initrd {
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// An `up` run ready to boot: the guest assembled (agent plus every node's
/// tree), the fault schedule checked against the nodes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PreparedUp {
    pub kernel: PathBuf,
    pub initrd: Initrd,
    /// What the agent is asked to start, in manifest order.
    pub specs: Vec<NodeSpec>,
    pub node_names: Vec<String>,
    pub workload: Option<WorkloadPlan>,
    pub network: devices::NetworkConfig,
    pub rtc_epoch_unix_secs: i64,
    pub ram_bytes: u64,
    /// Every fault, in time order.
    pub faults: Vec<ScheduledFault>,
    /// The disks of the nodes that have one, in manifest order.
    #[serde(default)]
    pub disks: Vec<vmm::vm::DiskSpec>,
}

/// Assembles `manifest`'s guest and schedules its faults plus `extra_faults`
/// (`--fault`s). `ram_bytes` overrides the manifest's `machine.mem`.
pub fn prepare(
    manifest: &Manifest,
    extra_faults: &[Fault],
    ram_bytes: Option<u64>,
    kernel: Option<&Path>,
) -> Result<PreparedUp, PrepareError> {
    let node_names = manifest.node_names();
    let all: Vec<Fault> = manifest
        .faults
        .iter()
        .chain(extra_faults)
        .cloned()
        .collect();
    let faults = schedule(&all, &node_names)?;
    if let Some(WorkloadPlan::OwnNode(node)) = &manifest.workload {
        if let Some(fault) = faults.iter().find(|f| {
            // Its clock may change; its processes are the run's end.
            matches!(&f.action, FaultAction::Node(n) if n.node() == node.name
                    && !matches!(n, NodeFault::ClockStep { .. } | NodeFault::Drift { .. }))
        }) {
            return Err(PrepareError::WorkloadNodeFault {
                action: fault.action.clone(),
            });
        }
    }
    let ram_bytes = match (ram_bytes, &manifest.mem) {
        (Some(bytes), _) => crate::units::check_ram(bytes).map_err(PrepareError::Ram)?,
        (None, Some(mem)) => crate::units::parse_ram(mem).map_err(PrepareError::Mem)?,
        (None, None) => DEFAULT_RAM_BYTES,
    };
    for fault in &faults {
        if let (
            FaultAction::Node(NodeFault::Crash { node }),
            Some(WorkloadPlan::InNode { node: inside, .. }),
        ) = (&fault.action, &manifest.workload)
        {
            if node == inside {
                return Err(PrepareError::CrashWorkloadNode {
                    action: fault.action.clone(),
                    node: node.clone(),
                });
            }
        }
        let needs_disk = match &fault.action {
            FaultAction::Disk(disk) => Some(disk.node()),
            FaultAction::Node(NodeFault::DiskFull { node } | NodeFault::DiskFree { node }) => {
                Some(node.as_str())
            }
            _ => None,
        };
        if let Some(node) = needs_disk {
            if !manifest
                .nodes
                .iter()
                .any(|n| n.name == node && n.disk.is_some())
            {
                return Err(PrepareError::NoDisk {
                    action: fault.action.clone(),
                    node: node.to_owned(),
                });
            }
        }
    }
    assemble::check_node_images(manifest)?;
    let disks = manifest
        .all_nodes()
        .into_iter()
        .filter_map(|node| Some((node, node.disk.as_ref()?)))
        .map(|(node, plan)| {
            super::disk_image(&guest::cache_root(), &node.name, plan).map_err(|source| {
                PrepareError::Disk {
                    node: node.name.clone(),
                    source,
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let image = guest::default_image()?;
    let agent = guest::agent_binary()?;
    let (specs, overlay) = assemble(manifest, &agent)?;
    let mut initrd = guest::read_initrd(&image.initrd).map_err(PrepareError::ReadInitrd)?;
    // Archives in an initrd start on a 4-byte boundary.
    while initrd.len() % 4 != 0 {
        initrd.push(0);
    }
    image_builder::write_initramfs(&overlay, &mut initrd)
        .map_err(|e| PrepareError::Pack(Box::new(e)))?;
    Ok(PreparedUp {
        kernel: kernel.map(Path::to_path_buf).unwrap_or(image.kernel),
        initrd: Initrd::Bytes(initrd),
        specs,
        node_names,
        workload: manifest.workload.clone(),
        network: manifest.network,
        rtc_epoch_unix_secs: manifest
            .rtc_epoch
            .unwrap_or(crate::plain::DEFAULT_RTC_EPOCH),
        ram_bytes,
        faults,
        disks,
    })
}

/// How an `up` run runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UpOptions {
    pub seed: u64,
    /// Stop after this much virtual time.
    pub until: Option<VirtNanos>,
    /// Run this many times and compare every exit (an audit); 0 or 1: once.
    pub runs: u32,
    /// Directory for per-node logs (`<node>.log`), written by the first run.
    pub logs: Option<PathBuf>,
    /// Stream the first run's node output to stdout.
    pub stream_output: bool,
    /// Snapshots of the first run.
    pub snapshots: Option<SnapshotPlan>,
    /// Wall time the guest may run without a VM exit before the run ends
    /// as stalled (host policy, not part of the history).
    #[serde(default)]
    pub stall_timeout: StallTimeout,
    /// Capture every link's frames of the first run into this directory
    /// (see [`crate::pcap`]; a run held by `BootUp` captures nothing).
    #[serde(default)]
    pub pcap: Option<PathBuf>,
    /// Write every exit of the first run here, a JSON line each (see
    /// [`crate::trace`]; a run held by `BootUp` writes none).
    #[serde(default)]
    pub trace: Option<PathBuf>,
    /// Write every record of the first run here (what the guest reported:
    /// events, SDK records, history lines; a [`crate::records::GuestRecord`]
    /// as a JSON line each). Collecting them changes nothing in the run.
    #[serde(default)]
    pub records: Option<PathBuf>,
    /// How the guest reads the time and takes interrupts (the clock page
    /// unless told otherwise; the legacy HPET path is for comparisons).
    #[serde(default)]
    pub exit_path: vmm::ExitPath,
}

impl UpOptions {
    /// One run seeded `seed` to its end, quiet, keeping nothing (no logs,
    /// snapshots, captures), on the default exit path and stall timeout:
    /// callers set what they want beside (`..UpOptions::new(seed)`).
    pub fn new(seed: u64) -> Self {
        UpOptions {
            seed,
            runs: 1,
            ..UpOptions::default()
        }
    }
}

/// What an `up` run reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpSummary {
    #[serde(flatten)]
    pub run: RunSummary,
    /// The run's status: the workload's, or 124 at the time limit with a
    /// workload still running.
    pub status: u8,
    pub runs: u32,
    pub identical: bool,
    pub divergence: Option<String>,
    /// Wall time from the start of the (first) run to the workload's start:
    /// boot plus bringing every node up.
    pub boot_to_workload_wall_ms: Option<u64>,
    /// Virtual time at the workload's start.
    pub boot_to_workload_virtual_ns: Option<VirtNanos>,
}

impl UpSummary {
    /// The status a process running this run exits with (1 for an audit
    /// whose runs diverged).
    pub fn process_status(&self) -> u8 {
        if self.identical {
            self.status
        } else {
            1
        }
    }
}

impl PreparedUp {
    /// The VMM's configuration for this guest.
    pub fn vm_config(&self, options: &UpOptions) -> Result<VmConfig, UpError> {
        let initrd = match &self.initrd {
            Initrd::Bytes(bytes) => bytes.clone(),
            Initrd::File(path) => guest::read_initrd(path).map_err(UpError::ReadInitrd)?,
        };
        Ok(VmConfig {
            kernel: self.kernel.clone(),
            initrd,
            // The node roots live in the initramfs. As ramfs rather than tmpfs it
            // has no size cap (half of RAM) and no fallocate, so preallocating
            // programs (etcd's 64 MB WAL segments) get sparse files instead of
            // pinning RAM they never write.
            cmdline: format!(
                "{} rootfstype=ramfs rdinit=/detvisor-agent",
                guest::default_cmdline()
            ),
            ram_bytes: self.ram_bytes,
            seed: options.seed,
            until: options.until,
            rtc_epoch_unix_secs: self.rtc_epoch_unix_secs,
            record: RecordConfig {
                keep_records: options.runs > 1,
                ..RecordConfig::default()
            },
            perturbation: None,
            network: Some(NetworkSpec {
                nics: self.node_names.len() as u8,
                config: self.network,
            }),
            control_channel: true,
            stall_timeout: options.stall_timeout,
            disks: self.disks.clone(),
            clock: devices::ClockKind::Exit,
            pmu_counter: Default::default(),
            exit_path: options.exit_path,
        })
    }

    /// Boots this guest as a [`Driven`] `up` run, its node output and events
    /// going to `output`.
    pub fn boot(&self, config: &VmConfig, output: UpOutput) -> Result<Driven, UpError> {
        let mut conductor = Conductor::new(self.specs.clone(), self.workload.clone());
        conductor.seed_sdk_random(config.seed);
        conductor.seed_composer(config.seed);
        let mut session = vmm::vm::Session::boot(config, Box::new(std::io::sink()), None)?;
        let driver = UpDriver::start(
            &mut session,
            conductor,
            &self.faults,
            &self.node_names,
            output,
        )?;
        Ok(Driven {
            session,
            up: Some(driver),
        })
    }
}

/// Creates the records file before the VM starts (a path that cannot be
/// written stops nothing running).
fn create_records_file(path: &Path) -> Result<std::fs::File, UpError> {
    std::fs::File::create(path).map_err(|source| UpError::Records {
        path: path.to_owned(),
        source,
    })
}

/// One JSON line per record.
fn write_records(
    path: &Path,
    file: std::fs::File,
    records: &[crate::records::GuestRecord],
) -> Result<(), UpError> {
    let error = |source| UpError::Records {
        path: path.to_owned(),
        source,
    };
    let mut out = std::io::BufWriter::new(file);
    for record in records {
        serde_json::to_writer(&mut out, record).map_err(|e| error(e.into()))?;
        out.write_all(b"\n").map_err(error)?;
    }
    out.flush().map_err(error)
}

/// Runs `prepared` as `options` say: node output (first run) to `streams`'
/// stdout, events and per-run lines to its stderr.
pub fn run(
    prepared: &PreparedUp,
    options: &UpOptions,
    streams: &dyn Streams,
) -> Result<UpSummary, UpError> {
    let runs = options.runs.max(1);
    let config = prepared.vm_config(options)?;
    let mut reference: Option<(vmm::vm::RunOutcome, u8)> = None;
    let workload_start: Rc<Cell<Option<(std::time::Duration, VirtNanos)>>> = Rc::default();
    let mut divergence = None;
    for run in 1..=runs {
        let first = run == 1;
        let out: Box<dyn Write> = if first && options.stream_output {
            Box::new(streams.stdout())
        } else {
            Box::new(std::io::sink())
        };
        let sink = OutputSink::new(
            &prepared.node_names,
            options.logs.clone().filter(|_| first),
            out,
        )?;
        let started = std::time::Instant::now();
        let workload_started = Rc::clone(&workload_start);
        let mut event_lines = first.then(|| streams.stderr());
        let events = move |at: VirtNanos, event: &UpEvent| {
            if let Some(w) = &mut event_lines {
                // Event lines are for people; a closed stream loses none of the run.
                let _ = writeln!(w, "{}", super::event_line(at, event));
                if event.is_workload_start() && workload_started.get().is_none() {
                    workload_started.set(Some((started.elapsed(), at)));
                }
            }
        };
        let output = UpOutput {
            sink,
            events: Box::new(events),
        };
        // Created before the VM starts: a path that cannot be written stops
        // nothing running.
        let trace = crate::trace::TraceFile::create_if(options.trace.as_deref().filter(|_| first))?;
        let records = match options.records.as_deref().filter(|_| first) {
            Some(path) => Some((path, create_records_file(path)?)),
            None => None,
        };
        let mut driven = prepared.boot(&config, output)?;
        if records.is_some() {
            if let Some(up) = &mut driven.up {
                up.collect_records();
            }
        }
        if let Some(trace) = &trace {
            trace.attach(&mut driven.session);
        }
        let capture = match options.pcap.as_deref().filter(|_| first) {
            Some(dir) => Some(PcapRecorder::attach(
                driven.session.devices_mut(),
                dir,
                &prepared.node_names,
            )?),
            None => None,
        };
        // Snapshots are taken in the first run (an audit's later runs check
        // that they did not perturb it).
        let stop = match options.snapshots.as_ref().filter(|_| first) {
            Some(plan) => {
                let mut snapshotter = Snapshotter::new(plan, None)?;
                let stop = snapshotter.run(&mut driven)?;
                say(streams, &snapshotter.report());
                stop
            }
            None => driven.run_to_end()?,
        };
        if let Some(capture) = capture {
            capture.finish()?;
        }
        if let Some(trace) = trace {
            trace.finish()?;
        }
        if let (Some((path, file)), Some(up)) = (records, &mut driven.up) {
            write_records(path, file, &up.take_records())?;
        }
        let status = driven.exit_status(stop).ok_or(UpError::NoStatus)?;
        let outcome = driven.outcome(stop)?;
        if runs > 1 {
            say(
                streams,
                &format!(
                    "detvisor up: run {run}/{runs}: {} exits, virtual {}, digest {}{}",
                    outcome.exits,
                    outcome.virtual_time,
                    outcome.digest,
                    stepped_note(&outcome)
                ),
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
    let (outcome, status) = reference.ok_or(UpError::NoRun)?;
    let start = workload_start.get();
    Ok(UpSummary {
        run: RunSummary::new(options.seed, &outcome),
        status,
        runs,
        identical: divergence.is_none(),
        divergence,
        boot_to_workload_wall_ms: start.map(|(wall, _)| wall.as_millis() as u64),
        boot_to_workload_virtual_ns: start.map(|(_, at)| at),
    })
}
