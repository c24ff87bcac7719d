//! `detvisor bench etcd [--runs N]`: the etcd example (`examples/etcd/cluster.toml`: three
//! members healthy, a put and a get by the `etcd-smoke` workload) run by detvisor and by a
//! deterministic peer, side by side in one run:
//!
//! 1. **QEMU TCG with `-icount shift=0,sleep=off`** on the host ([`baseline`]): the same kernel
//!    and the same assembled initrd, with a script doing what the agent does (namespaces, a
//!    root and a NIC per node; a bridge for the switch); its serial output is compared across
//!    runs.
//! 2. **detvisor**: the run `detvisor up <manifest> --quiet` makes (`run::api::Request::Up`,
//!    the guest assembled once on the host by `run::up::prepare`, as `detvisor up` does),
//!    carried out by the run library in the worker's process on a thread of its own, inside the
//!    helper VM (L1) when the host's KVM cannot run guests (else on the host). Its run digest
//!    (console, with everything the agent said, memory and devices) is compared across runs.
//!
//! The node image is built here when missing or stale: `examples/etcd/build-oci.sh` (cached
//! OCI layout), then the node image of `<layout>:latest` (what `detvisor image build` writes)
//! at `<cache>/examples/etcd-bench/etcd.img`, next to a copy of `cluster.toml` (whose `image =
//! "etcd.img"` is relative to the manifest). The wall time of a run is spawn to exit of the
//! process for QEMU, the request's call to its return for detvisor (VM creation to teardown),
//! on the clock of the machine it runs on.

#[path = "etcd_baseline.rs"]
pub mod baseline;
#[path = "etcd_report.rs"]
mod report;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::helper::{self, HelperLaunch, Placement, Session, WorkerReport};
use super::machine::{loadavg, uptime, TempDir};
use super::process::{last_lines, run_in_process, Watch};
use super::serve::{BenchCall, BenchReply};
use super::stats::ms;
use super::{check_runs_and_timeout, BenchHostVm};
use crate::say;
use run::api::{Controller, Request, Response};
use run::up::{Initrd, PreparedUp, UpOptions};

use run::{guest, manifest, units, up};

/// Guest RAM when the manifest says nothing.
const DEFAULT_MEM: &str = "1G";
const DEFAULT_RTC_EPOCH: i64 = 1_704_067_200;

#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// Repetitions per side.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Time limit of each run, in seconds (the helper VM gets 300 s more in all); a run over
    /// it is killed and counted as failed.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// detvisor's seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// detvisor's virtual-time limit (`detvisor up --until`).
    #[arg(long, default_value = "300s")]
    pub until: String,
    /// Where detvisor runs.
    #[arg(long, value_enum, default_value_t = BenchHostVm::Auto)]
    pub host_vm: BenchHostVm,
    /// Do not run the QEMU TCG baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Do not run detvisor.
    #[arg(long)]
    pub no_detvisor: bool,
}

// ---------------------------------------------------------------------------------------------
// Runs, plans and the worker.

/// One run of either side.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct EtcdRun {
    pub ok: bool,
    /// Process spawn to exit (QEMU), the request's call to its return (detvisor) (ms).
    pub wall_ms: f64,
    pub error: Option<String>,
    /// The run's status (detvisor's JSON `status`; QEMU: the byte written to port 0x610).
    pub status: Option<u8>,
    /// Guest time at the end (detvisor: virtual time; QEMU: the guest's uptime when the
    /// workload ended, which icount ties to instructions).
    pub virtual_ns: Option<u64>,
    /// detvisor's exits (its JSON); QEMU TCG has none.
    pub exits: Option<u64>,
    /// detvisor's `vm::run` (its JSON `wall_ms`).
    pub inner_wall_ms: Option<u64>,
    /// detvisor's run digest, or FNV-1a 64 of QEMU's serial bytes.
    pub output: Option<String>,
    pub output_bytes: Option<u64>,
    /// The end of the workload's output.
    pub workload_tail: Option<String>,
}

impl EtcdRun {
    pub fn failed(e: &anyhow::Error) -> Self {
        EtcdRun {
            error: Some(format!("{e:#}")),
            ..EtcdRun::default()
        }
    }
}

/// What the worker runs; paths as seen where it runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct EtcdWorkerPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub seed: u64,
    pub until: String,
    /// The guest, assembled on the host (its initrd a file).
    pub prepared: PreparedUp,
    pub place: String,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct EtcdWorkerReport {
    pub place: String,
    pub uptime_at_start_s: Option<f64>,
    pub elapsed_ms: f64,
    pub runs: Vec<EtcdRun>,
    pub error: Option<String>,
    pub command: Vec<String>,
}

impl WorkerReport for EtcdWorkerReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
    fn from_reply(reply: BenchReply) -> Option<Self> {
        match reply {
            BenchReply::Etcd(report) => Some(*report),
            _ => None,
        }
    }
}

fn command_words(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The options `detvisor up --seed S --until T --logs LOGS --quiet` runs with.
fn up_options(plan: &EtcdWorkerPlan, logs: &Path) -> Result<UpOptions> {
    Ok(UpOptions {
        until: Some(units::parse_duration(&plan.until).context("--until")?),
        logs: Some(logs.to_path_buf()),
        ..UpOptions::new(plan.seed)
    })
}

/// One `up` run through the run library: its summary as `detvisor up --json` prints it (or why
/// there is none), and the end of its events (what `detvisor up` writes to stderr).
pub fn up_summary(
    prepared: PreparedUp,
    options: UpOptions,
) -> (Result<serde_json::Value, String>, String) {
    let streams = run::streams::Captured::default();
    let summary = match Controller::new().handle(Request::Up { prepared, options }, &streams) {
        Ok(Response::Up(summary)) => serde_json::to_value(summary).map_err(|e| e.to_string()),
        Ok(other) => Err(format!("an up run answered {other:?}")),
        Err(e) => Err(format!("{:#}", anyhow::Error::from(e))),
    };
    (summary, last_lines(&streams.stderr_text(), 20))
}

/// Judges an `up` run that took `wall`: its summary (as `detvisor up --json` prints it), or why
/// there is none.
pub fn detvisor_result(
    (summary, events): (Result<serde_json::Value, String>, String),
    wall: Duration,
    logs: &Path,
) -> EtcdRun {
    let mut r = EtcdRun {
        wall_ms: ms(wall),
        ..EtcdRun::default()
    };
    let (summary, failure) = match summary {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e)),
    };
    if let Some(s) = &summary {
        let u = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
        r.status = u("status").and_then(|v| u8::try_from(v).ok());
        r.virtual_ns = u("virtual_ns");
        r.exits = u("exits");
        r.inner_wall_ms = u("wall_ms");
        r.output = s.get("digest").and_then(|d| d.as_str()).map(String::from);
        r.output_bytes = u("console_bytes");
    }
    let workload = fs::read(logs.join("workload.log")).unwrap_or_default();
    r.workload_tail = Some(last_lines(&String::from_utf8_lossy(&workload), 14));
    r.ok = summary.is_some() && r.status == Some(0);
    if !r.ok {
        // What each node said (`<logs>/<node>.log`): why it ended, when it did.
        let mut nodes: Vec<PathBuf> = fs::read_dir(logs)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        nodes.retain(|p| p.extension().is_some_and(|e| e == "log") && !p.ends_with("workload.log"));
        nodes.sort();
        let node_tails: String = nodes
            .iter()
            .map(|p| {
                let text = fs::read(p).unwrap_or_default();
                format!(
                    "\n  {} ends with:\n{}",
                    p.file_name().unwrap_or_default().to_string_lossy(),
                    last_lines(&String::from_utf8_lossy(&text), 4)
                )
            })
            .collect();
        let what = if let Some(failure) = &failure {
            format!("detvisor up: {failure}")
        } else {
            format!(
                "detvisor up: status {:?} (stop {}, virtual {} s, {} exits); its events end \
                 with:\n{events}\n  the workload's output ends with:\n{}",
                r.status,
                summary
                    .as_ref()
                    .and_then(|s| s.get("stop"))
                    .map_or("?".into(), |v| v.to_string()),
                r.virtual_ns
                    .map_or("?".into(), |v| format!("{:.3}", v as f64 / 1e9)),
                r.exits.map_or("?".into(), |e| e.to_string()),
                r.workload_tail.as_deref().unwrap_or("")
            )
        };
        r.error = Some(what + &node_tails);
    }
    r
}

/// The detvisor runs (inside the helper VM, or in this process on a host that runs guests).
pub fn worker(plan: &EtcdWorkerPlan) -> EtcdWorkerReport {
    let started = Instant::now();
    let mut report = EtcdWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..EtcdWorkerReport::default()
    };
    let scratch = match TempDir::new("detvisor-bench-etcd-") {
        Ok(t) => t,
        Err(e) => {
            report.error = Some(format!("cannot create a scratch directory: {e}"));
            return report;
        }
    };
    let limit = Duration::from_secs(plan.timeout_s);
    report.command = vec![
        "run::api::Request::Up, in process:".into(),
        format!(
            "{} node(s), kernel {}, seed {}, until {}, logs in {}",
            plan.prepared.node_names.len(),
            plan.prepared.kernel.display(),
            plan.seed,
            plan.until,
            scratch.path().join("logs-N").display()
        ),
    ];
    let n = plan.runs;
    for i in 1..=n {
        let logs = scratch.path().join(format!("logs-{i}"));
        let options = match up_options(plan, &logs) {
            Ok(o) => o,
            Err(e) => {
                report.runs.push(EtcdRun::failed(&e));
                continue;
            }
        };
        let prepared = plan.prepared.clone();
        let done = run_in_process(
            move || up_summary(prepared, options),
            limit,
            Watch::default(),
        );
        let outcome = done.result.unwrap_or_else(|| {
            let why = if done.timed_out {
                format!("abandoned at the {} s time limit", limit.as_secs())
            } else {
                "the run's thread panicked".into()
            };
            (Err(why), String::new())
        });
        let r = detvisor_result(outcome, done.wall, &logs);
        say!(
            "bench [{}]: detvisor run {i}/{n}: {}",
            plan.place,
            describe(&r)
        );
        report.runs.push(r);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

pub fn describe(r: &EtcdRun) -> String {
    if r.ok {
        let mut s = format!("{:.1} s", r.wall_ms / 1000.0);
        if let Some(v) = r.virtual_ns {
            s.push_str(&format!(", virtual {:.3} s", v as f64 / 1e9));
        }
        if let Some(e) = r.exits {
            s.push_str(&format!(", {e} exits"));
        }
        if let Some(o) = &r.output {
            s.push_str(&format!(", output {o}"));
        }
        s
    } else {
        format!("FAILED: {}", r.error.as_deref().unwrap_or("unknown error"))
    }
}

// ---------------------------------------------------------------------------------------------
// The host side.

/// Runs a command to its end, its stderr passed through; returns its stdout.
fn run_tool(mut cmd: Command, what: &str) -> Result<String> {
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node image and the manifest beside it: builds (or reuses) the OCI layout with
/// `examples/etcd/build-oci.sh`, then `etcd.img` from it unless it was built from the same
/// layout (`etcd.img.source` holds the layout's `index.json` and `stamp`).
fn prepare_manifest(file: &str) -> Result<PathBuf> {
    let example = guest::source_dir().join("examples/etcd");
    let script = example.join("build-oci.sh");
    if !script.is_file() {
        bail!(
            "{} is missing: bench etcd needs the source tree it was built from",
            script.display()
        );
    }
    say!("bench: the etcd OCI layout ({})", script.display());
    let out = run_tool(Command::new(&script), "examples/etcd/build-oci.sh")?;
    let layout = PathBuf::from(
        out.lines()
            .last()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .context("build-oci.sh printed no layout directory")?,
    );
    let dir = guest::cache_root().join("examples/etcd-bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let img = dir.join("etcd.img");
    let source_file = dir.join("etcd.img.source");
    let mut source = fs::read(layout.join("index.json"))
        .with_context(|| format!("reading {}/index.json", layout.display()))?;
    source.extend(fs::read(layout.join("stamp")).unwrap_or_default());
    if !img.is_file() || fs::read(&source_file).ok().as_ref() != Some(&source) {
        say!("bench: building the node image {}", img.display());
        build_node_image(&format!("{}:latest", layout.display()), &img)?;
        fs::write(&source_file, &source)?;
    } else {
        say!("bench: node image up to date: {}", img.display());
    }
    let manifest = dir.join(file);
    fs::copy(example.join(file), &manifest)
        .with_context(|| format!("copying {file} to {}", manifest.display()))?;
    Ok(manifest)
}

/// Writes the node image of the OCI image `oci` (`LAYOUT:TAG`) to `out`, as `detvisor image
/// build --oci` does.
fn build_node_image(oci: &str, out: &Path) -> Result<()> {
    let flat = |e: image_builder::ImageError| anyhow::anyhow!("{e}");
    let r = image_builder::parse_oci_ref(oci).map_err(flat)?;
    let (config, layers) = image_builder::read_image(&r)
        .map_err(flat)
        .with_context(|| format!("cannot read OCI image {oci}"))?;
    let root = image_builder::flatten(&layers).map_err(flat)?;
    let mut bytes = Vec::new();
    image_builder::write_node_image(&config, &root, &mut bytes).map_err(flat)?;
    let partial = out.with_extension("img.partial");
    fs::write(&partial, &bytes).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, out).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

/// The default initrd with `overlay` appended (what `detvisor up` boots).
fn initrd_with(base: &[u8], overlay: &image_builder::RootFs) -> Result<Vec<u8>> {
    let mut initrd = base.to_vec();
    while !initrd.len().is_multiple_of(4) {
        initrd.push(0);
    }
    image_builder::write_initramfs(overlay, &mut initrd).context("packing the guest initramfs")?;
    Ok(initrd)
}

/// detvisor in the helper VM: the kernel and the assembled initrd shipped.
fn helper_session(host_plan: &EtcdWorkerPlan) -> (Session, Option<EtcdWorkerReport>) {
    Session::record(|session| {
        let Initrd::File(initrd) = &host_plan.prepared.initrd else {
            bail!("the assembled initrd is not in a file");
        };
        let files: Vec<(PathBuf, String)> = vec![
            (host_plan.prepared.kernel.clone(), "bench/vmlinux".into()),
            (initrd.clone(), "bench/initrd".into()),
        ];
        let initrd_len = fs::metadata(initrd).map_or(0, |m| m.len());
        let mut plan = EtcdWorkerPlan {
            place: "helper VM".into(),
            ..host_plan.clone()
        };
        plan.prepared.kernel = helper_vm::payload_path("bench/vmlinux").into();
        plan.prepared.initrd = Initrd::File(helper_vm::payload_path("bench/initrd").into());
        let launch = HelperLaunch {
            // As `detvisor up` sizes it: the initrd is shipped, then read into the VMM.
            memory_mib: ((plan.prepared.ram_bytes >> 20) as u32)
                .saturating_add(1536)
                .saturating_add(((3 * initrd_len) >> 20) as u32)
                .max(2048),
            files,
            shared_dirs: Vec::new(),
        };
        launch.run(&BenchCall::Etcd(plan), session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files)",
                s.payload_file_bytes >> 20
            )
        })
    })
}

/// An etcd scenario, assembled on the host: detvisor's guest and the baseline's.
pub struct Assembled {
    /// The manifest (copied beside the node image).
    pub manifest_path: PathBuf,
    /// Guest RAM, as the manifest says (or [`DEFAULT_MEM`]).
    pub mem: String,
    pub ram_bytes: u64,
    /// detvisor's guest, as `detvisor up` assembles it, its initrd in a file.
    pub prepared: PreparedUp,
    /// The same initrd bytes plus the baseline's script ([`baseline::script`]), or why the
    /// baseline cannot run the scenario (a fault its script does not model).
    pub qemu_initrd: Result<PathBuf, String>,
    /// The kernel QEMU boots (built with the `vmlinux` detvisor boots).
    pub bzimage: PathBuf,
    pub image: guest::GuestImage,
    pub rtc_epoch: i64,
}

/// Assembles the scenario of `examples/etcd/<manifest_file>` (building the node image if
/// needed), its initrds written in `tmp` as `initrd-up<tag>` and `initrd-qemu<tag>`.
pub fn assemble(manifest_file: &str, tmp: &Path, tag: &str) -> Result<Assembled> {
    let manifest_path = prepare_manifest(manifest_file)?;
    let manifest = manifest::load(&manifest_path)?;
    let mem = manifest.mem.clone().unwrap_or_else(|| DEFAULT_MEM.into());
    let ram_bytes = units::parse_size(&mem)?;
    let image = guest::default_image()?;
    let bzimage = image.kernel.with_file_name("bzImage");
    let agent = guest::agent_binary()?;
    let (specs, mut overlay) = up::assemble(&manifest, &agent)?;
    let base = fs::read(&image.initrd)
        .with_context(|| format!("cannot read {}", image.initrd.display()))?;
    // detvisor's guest, as `detvisor up` assembles it (its initrd staged in a file).
    let mut prepared = up::prepare(&manifest, &[], Some(ram_bytes), Some(&image.kernel))?;
    if let Initrd::Bytes(bytes) = &prepared.initrd {
        let up_initrd = tmp.join(format!("initrd-up{tag}"));
        fs::write(&up_initrd, bytes)?;
        prepared.initrd = Initrd::File(up_initrd);
    }
    // The baseline: the same bytes plus the script the default /init runs.
    let qemu_initrd = match baseline::script(&specs, manifest.workload.as_ref(), &prepared.faults) {
        Ok(script) => {
            overlay.add_file("detvisor/cmd", 0o644, script.into_bytes())?;
            let path = tmp.join(format!("initrd-qemu{tag}"));
            fs::write(&path, initrd_with(&base, &overlay)?)?;
            Ok(path)
        }
        Err(e) => Err(format!("{e:#}")),
    };
    Ok(Assembled {
        manifest_path,
        mem,
        ram_bytes,
        prepared,
        qemu_initrd,
        bzimage,
        image,
        rtc_epoch: manifest.rtc_epoch.unwrap_or(DEFAULT_RTC_EPOCH),
    })
}

pub fn orchestrate(args: &EtcdArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    units::parse_duration(&args.until).context("--until")?;
    let tmp = TempDir::new("detvisor-bench-etcd-")
        .context("cannot create a temporary directory for the benchmark")?;
    let Assembled {
        manifest_path,
        mem,
        prepared,
        qemu_initrd,
        bzimage,
        image,
        rtc_epoch,
        ..
    } = assemble("cluster.toml", tmp.path(), "")?;
    let cmdline = guest::default_cmdline();

    let placement = Placement::choose(args.host_vm);
    let place = placement.place();
    say!(
        "bench: etcd scenario ({}), {mem} RAM, {} run(s) per side; detvisor on the {place}{}, \
         QEMU TCG icount on the host",
        manifest_path.display(),
        args.runs,
        placement.because()
    );

    // 1. The baseline on the host, alone on the machine.
    let mut base_sys = report::Side::default();
    if args.no_baseline {
        base_sys.skipped = Some("--no-baseline".into());
    } else {
        match (baseline::find_qemu(), &qemu_initrd) {
            (Err(e), _) => base_sys.error = Some(format!("{e:#}")),
            (_, Err(e)) => base_sys.error = Some(e.clone()),
            (Ok(_), _) if !bzimage.is_file() => {
                base_sys.error = Some(format!(
                    "{} is missing (QEMU boots the bzImage built with {}): rebuild the guest \
                     image",
                    bzimage.display(),
                    image.kernel.display()
                ))
            }
            (Ok(qemu), Ok(qemu_initrd)) => {
                let b = baseline::Baseline {
                    qemu: &qemu,
                    bzimage: &bzimage,
                    initrd: qemu_initrd,
                    cmdline: &cmdline,
                    mem: &mem,
                    rtc_base: baseline::rtc_base(rtc_epoch),
                    scratch: tmp.path(),
                    limit: Duration::from_secs(args.timeout),
                };
                base_sys.command = command_words(&b.command(0).0);
                for i in 1..=args.runs {
                    let r = b.run(i);
                    say!(
                        "bench [host]: QEMU TCG icount run {i}/{}: {}",
                        args.runs,
                        describe(&r)
                    );
                    base_sys.runs.push(r);
                }
            }
        }
    }

    // 2. detvisor.
    let plan = EtcdWorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        seed: args.seed,
        until: args.until.clone(),
        prepared,
        place: "host".into(),
    };
    let mut det_sys = report::Side::default();
    let mut session = None;
    if args.no_detvisor {
        det_sys.skipped = Some("--no-detvisor".into());
    } else {
        let worker_report = if placement.helper {
            let (s, r) = helper_session(&plan);
            session = Some(s);
            r
        } else {
            Some(worker(&plan))
        };
        match worker_report {
            Some(r) => {
                det_sys.runs = r.runs;
                det_sys.error = r.error;
                det_sys.command = r.command;
            }
            None => det_sys.error = Some(helper::NOT_MEASURED.into()),
        }
    }

    let r = report::build(report::Inputs {
        args,
        manifest: &manifest_path,
        mem: &mem,
        cmdline: &cmdline,
        placement: &placement,
        detvisor: &det_sys,
        baseline: &base_sys,
        session,
        loadavg_before,
    });
    report::print(&r)?;
    Ok(if r.all_ok { 0 } else { 1 })
}
