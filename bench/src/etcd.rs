//! `detvisor bench etcd [--runs N]`: the etcd example (`examples/etcd/cluster.toml`: three
//! members healthy, a put and a get by the `etcd-smoke` workload) run by detvisor and by a
//! deterministic peer, side by side in one run:
//!
//! 1. **QEMU TCG with `-icount shift=0,sleep=off`** on the host ([`baseline`]): the same kernel
//!    and the same assembled initrd, with a script doing what the agent does (namespaces, a
//!    root and a NIC per node; a bridge for the switch); its serial output is compared across
//!    runs.
//! 2. **detvisor**: `detvisor up <manifest> --host-vm never --json --quiet` per run, inside the
//!    helper VM (L1) when the host's KVM cannot run guests (else on the host), on the guest
//!    assembled once on the host (`--kernel/--initrd/--node-specs`, as `detvisor up
//!    --host-vm` does itself). Its run digest (console, with everything the agent said, memory
//!    and devices) is compared across runs.
//!
//! The node image is built here when missing or stale: `examples/etcd/build-oci.sh` (cached
//! OCI layout), then `detvisor image build --oci <layout>:latest --out
//! <cache>/examples/etcd-bench/etcd.img`, next to a copy of `cluster.toml` (whose `image =
//! "etcd.img"` is relative to the manifest). The wall time of a run is spawn to exit of the
//! process (QEMU; `detvisor up`), on the clock of the machine it runs on.

#[path = "etcd_baseline.rs"]
mod baseline;
#[path = "etcd_report.rs"]
mod report;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::helper::{self, HelperLaunch, Placement, Session, WorkerReport, HELPER_VM_ALLOWANCE};
use super::machine::{loadavg, uptime, TempDir};
use super::process::{last_lines, run_timed, ErrMode, Finished, Watch};
use super::stats::ms;
use super::{check_runs_and_timeout, BenchHostVm};

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
    /// Internal: run detvisor as this plan says (inside the helper VM).
    #[arg(long, hide = true)]
    pub worker_plan: Option<PathBuf>,
    /// Internal: start the helper VM described in this plan.
    #[arg(long, hide = true)]
    pub launch_plan: Option<PathBuf>,
}

pub fn run(args: &EtcdArgs) -> Result<u8> {
    if let Some(plan) = &args.worker_plan {
        helper::worker_main(plan, worker)
    } else if let Some(plan) = &args.launch_plan {
        helper::launch_main(plan)
    } else {
        orchestrate(args)
    }
}

// ---------------------------------------------------------------------------------------------
// Runs, plans and the worker.

/// One run of either side.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct EtcdRun {
    pub ok: bool,
    /// Process spawn to exit (ms).
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
    pub mem: String,
    pub manifest: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub specs: PathBuf,
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
}

fn command_words(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn detvisor_command(exe: &Path, plan: &EtcdWorkerPlan, logs: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("up")
        .arg(&plan.manifest)
        .args(["--host-vm", "never", "--kernel"])
        .arg(&plan.kernel)
        .arg("--initrd")
        .arg(&plan.initrd)
        .arg("--node-specs")
        .arg(&plan.specs)
        .args(["--seed", &plan.seed.to_string()])
        .args(["--until", &plan.until])
        .args(["--mem", &plan.mem])
        .arg("--logs")
        .arg(logs)
        .args(["--quiet", "--json"]);
    cmd
}

/// Judges a finished `detvisor up --json`.
fn detvisor_result(finished: &Finished, limit: Duration, logs: &Path) -> EtcdRun {
    let mut r = EtcdRun {
        wall_ms: ms(finished.wall),
        ..EtcdRun::default()
    };
    let summary: Option<serde_json::Value> = finished
        .lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with('{'))
        .and_then(|(_, l)| serde_json::from_str(l).ok());
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
    r.ok = finished.succeeded() && r.status == Some(0);
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
        let stderr = last_lines(&finished.stderr_text(), 20);
        let what = if finished.timed_out || summary.is_none() {
            format!(
                "{}; stdout ends with:\n{}",
                finished.failure("detvisor up", limit),
                last_lines(&finished.stdout_text(), 6)
            )
        } else {
            format!(
                "detvisor up: status {:?} (stop {}, virtual {} s, {} exits); its stderr ends \
                 with:\n{stderr}\n  the workload's output ends with:\n{}",
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

/// `bench etcd --worker-plan FILE` (or in-process on a host that runs guests): the detvisor
/// runs.
pub fn worker(plan: &EtcdWorkerPlan) -> EtcdWorkerReport {
    let started = Instant::now();
    let mut report = EtcdWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..EtcdWorkerReport::default()
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            report.error = Some(format!("cannot locate the detvisor executable: {e}"));
            return report;
        }
    };
    let scratch = match TempDir::new("detvisor-bench-etcd-") {
        Ok(t) => t,
        Err(e) => {
            report.error = Some(format!("cannot create a scratch directory: {e}"));
            return report;
        }
    };
    let limit = Duration::from_secs(plan.timeout_s);
    report.command = command_words(&detvisor_command(
        &exe,
        plan,
        &scratch.path().join("logs-N"),
    ));
    let n = plan.runs;
    for i in 1..=n {
        let logs = scratch.path().join(format!("logs-{i}"));
        let cmd = detvisor_command(&exe, plan, &logs);
        let r = match run_timed(cmd, limit, ErrMode::Capture, Watch::default()) {
            Ok(f) => detvisor_result(&f, limit, &logs),
            Err(e) => EtcdRun::failed(&e),
        };
        eprintln!(
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
fn prepare_manifest() -> Result<PathBuf> {
    let example = guest::source_dir().join("examples/etcd");
    let script = example.join("build-oci.sh");
    if !script.is_file() {
        bail!(
            "{} is missing: bench etcd needs the source tree it was built from",
            script.display()
        );
    }
    eprintln!("bench: the etcd OCI layout ({})", script.display());
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
        eprintln!("bench: building the node image {}", img.display());
        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(["image", "build", "--oci"])
            .arg(format!("{}:latest", layout.display()))
            .arg("--out")
            .arg(&img);
        cmd.stdout(Stdio::null());
        run_tool(cmd, "detvisor image build")?;
        fs::write(&source_file, &source)?;
    } else {
        eprintln!("bench: node image up to date: {}", img.display());
    }
    let manifest = dir.join("cluster.toml");
    fs::copy(example.join("cluster.toml"), &manifest)
        .with_context(|| format!("copying cluster.toml to {}", manifest.display()))?;
    Ok(manifest)
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

/// detvisor in the helper VM: the manifest, kernel, initrd and node requests shipped.
fn helper_session(
    host_plan: &EtcdWorkerPlan,
    ram_bytes: u64,
    tmp: &Path,
) -> (Session, Option<EtcdWorkerReport>) {
    Session::record(|session| {
        let assets = helper_vm::ensure_assets(None)?;
        let files: Vec<(PathBuf, String)> = vec![
            (host_plan.manifest.clone(), "bench/cluster.toml".into()),
            (host_plan.kernel.clone(), "bench/vmlinux".into()),
            (host_plan.initrd.clone(), "bench/initrd".into()),
            (host_plan.specs.clone(), "bench/specs.json".into()),
        ];
        let plan = EtcdWorkerPlan {
            manifest: helper_vm::payload_path("bench/cluster.toml").into(),
            kernel: helper_vm::payload_path("bench/vmlinux").into(),
            initrd: helper_vm::payload_path("bench/initrd").into(),
            specs: helper_vm::payload_path("bench/specs.json").into(),
            place: "helper VM".into(),
            ..host_plan.clone()
        };
        let limit =
            HELPER_VM_ALLOWANCE + Duration::from_secs(plan.timeout_s * u64::from(plan.runs));
        let launch = HelperLaunch {
            bench: "etcd",
            assets_dir: assets,
            memory_mib: ((ram_bytes >> 20) as u32).saturating_add(1536).max(2048),
            files,
            shared_dirs: Vec::new(),
            tmp,
            prefix: "",
            limit,
        };
        launch.run(&plan, session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files; time limit {} s)",
                s.payload_file_bytes >> 20,
                limit.as_secs()
            )
        })
    })
}

pub fn orchestrate(args: &EtcdArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    units::parse_duration(&args.until).context("--until")?;
    let manifest_path = prepare_manifest()?;
    let manifest = manifest::load(&manifest_path)?;
    let mem = manifest.mem.clone().unwrap_or_else(|| DEFAULT_MEM.into());
    let ram_bytes = units::parse_size(&mem)?;
    let image = guest::default_image()?;
    let bzimage = image.kernel.with_file_name("bzImage");
    let agent = guest::agent_binary()?;
    let (specs, mut overlay) = up::assemble(&manifest, &agent)?;
    let tmp = TempDir::new("detvisor-bench-etcd-")
        .context("cannot create a temporary directory for the benchmark")?;
    let base = fs::read(&image.initrd)
        .with_context(|| format!("cannot read {}", image.initrd.display()))?;
    let up_initrd = tmp.path().join("initrd-up");
    fs::write(&up_initrd, initrd_with(&base, &overlay)?)?;
    let specs_path = tmp.path().join("specs.json");
    fs::write(&specs_path, serde_json::to_vec(&specs)?)?;
    // The baseline: the same bytes plus the script the default /init runs.
    let script = baseline::script(&specs, manifest.workload.as_ref())?;
    overlay.add_file("detvisor/cmd", 0o644, script.into_bytes())?;
    let qemu_initrd = tmp.path().join("initrd-qemu");
    fs::write(&qemu_initrd, initrd_with(&base, &overlay)?)?;
    let cmdline = guest::default_cmdline();
    let rtc_epoch = manifest.rtc_epoch.unwrap_or(DEFAULT_RTC_EPOCH);

    let placement = Placement::choose(args.host_vm);
    let place = placement.place();
    eprintln!(
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
        match baseline::find_qemu() {
            Err(e) => base_sys.error = Some(format!("{e:#}")),
            Ok(_) if !bzimage.is_file() => {
                base_sys.error = Some(format!(
                    "{} is missing (QEMU boots the bzImage built with {}): rebuild the guest \
                     image",
                    bzimage.display(),
                    image.kernel.display()
                ))
            }
            Ok(qemu) => {
                let b = baseline::Baseline {
                    qemu: &qemu,
                    bzimage: &bzimage,
                    initrd: &qemu_initrd,
                    cmdline: &cmdline,
                    mem: &mem,
                    rtc_base: baseline::rtc_base(rtc_epoch),
                    scratch: tmp.path(),
                    limit: Duration::from_secs(args.timeout),
                };
                base_sys.command = command_words(&b.command(0).0);
                for i in 1..=args.runs {
                    let r = b.run(i);
                    eprintln!(
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
        mem: mem.clone(),
        manifest: manifest_path.clone(),
        kernel: image.kernel.clone(),
        initrd: up_initrd,
        specs: specs_path,
        place: "host".into(),
    };
    let mut det_sys = report::Side::default();
    let mut session = None;
    if args.no_detvisor {
        det_sys.skipped = Some("--no-detvisor".into());
    } else {
        let worker_report = if placement.helper {
            let (s, r) = helper_session(&plan, ram_bytes, tmp.path());
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
