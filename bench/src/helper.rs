//! The plumbing both benches share: where the guests run, the helper VM session seen from the
//! host, and the worker that runs inside it.
//!
//! Inside the helper VM this same binary is the payload (`bench boot|snapshot --worker-plan
//! FILE`, [`worker_main`]); on the host an intermediate `bench boot|snapshot --launch-plan FILE`
//! process ([`launch_main`]) calls [`helper_vm::run`], so that the payload's stdout (result lines)
//! reaches the orchestrating process through a pipe and each line can be time-stamped on
//! arrival: the first line gives the helper VM's boot overhead ([`HelperLaunch::run`]).

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::machine::uptime;
use super::process::{run_timed, ErrMode, Watch};
use super::stats::ms;
use super::BenchHostVm;

/// First stdout line of the worker (its argument: L1 uptime in seconds).
const MARK_READY: &str = "detvisor-bench-ready ";
/// Last stdout line of the worker (its argument: the worker's report as JSON).
const MARK_REPORT: &str = "detvisor-bench-report ";
/// Extra time allowed for a helper VM to boot and shut down.
pub const HELPER_VM_ALLOWANCE: Duration = Duration::from_secs(300);
/// The error of every measurement of a failed helper VM session.
pub const NOT_MEASURED: &str = "not measured: the helper VM session failed (see below)";

/// Where the guests run.
pub struct Placement {
    /// In the helper VM (else on the host).
    pub helper: bool,
    /// Why the helper VM is used.
    pub reason: Option<String>,
}

impl Placement {
    pub fn choose(host_vm: BenchHostVm) -> Self {
        let (helper, reason) = match host_vm {
            BenchHostVm::Always => (true, Some("--host-vm always".to_string())),
            BenchHostVm::Never => (false, None),
            BenchHostVm::Auto => {
                let report = vmm::probe::host_report();
                if report.can_run_guests {
                    (false, None)
                } else {
                    (true, report.reason)
                }
            }
        };
        Placement { helper, reason }
    }

    /// "helper VM" or "host".
    pub fn place(&self) -> &'static str {
        if self.helper {
            "helper VM"
        } else {
            "host"
        }
    }

    /// " (because REASON)", or nothing.
    pub fn because(&self) -> String {
        self.reason
            .as_deref()
            .map(|r| format!(" (because {r})"))
            .unwrap_or_default()
    }
}

/// Reads a JSON plan (`what`: "worker", "launch", "cell").
pub fn read_plan<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    serde_json::from_slice(
        &fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
    )
    .with_context(|| format!("bad {what} plan"))
}

// ---------------------------------------------------------------------------------------------
// The worker side.

/// A worker's report: it says how long the worker took, on the clock of the machine it ran on.
pub trait WorkerReport: Serialize + DeserializeOwned {
    fn elapsed_ms(&self) -> f64;
}

/// `bench boot|snapshot --worker-plan FILE`: the payload inside the helper VM. Prints the ready
/// line (L1's uptime), runs `work` on the plan, prints the report line.
pub fn worker_main<P: DeserializeOwned, R: WorkerReport>(
    plan_path: &Path,
    work: fn(&P) -> R,
) -> Result<u8> {
    let plan: P = read_plan(plan_path, "worker")?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{MARK_READY}{}",
        uptime().map_or("null".into(), |u| u.to_string())
    )?;
    out.flush()?;
    drop(out);
    let report = work(&plan);
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_REPORT}{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// The host side.

/// What the launcher process hands to [`helper_vm::run`].
#[derive(Serialize, Deserialize, Debug)]
struct LaunchPlan {
    assets_dir: PathBuf,
    memory_mib: u32,
    args: Vec<String>,
    /// (host path, payload name)
    files: Vec<(PathBuf, String)>,
    /// Host directories shared read-write (9p), mounted at the same path in L1.
    #[serde(default)]
    shared_dirs: Vec<PathBuf>,
}

/// `bench boot|snapshot --launch-plan FILE`: runs the helper VM; its payload's stdout is ours.
pub fn launch_main(plan_path: &Path) -> Result<u8> {
    let plan: LaunchPlan = read_plan(plan_path, "launch")?;
    let config = helper_vm::HelperVmConfig {
        assets_dir: plan.assets_dir,
        memory_mib: plan.memory_mib,
        shared_dirs: plan.shared_dirs,
        ..helper_vm::HelperVmConfig::default()
    };
    let files: Vec<helper_vm::PayloadFile> = plan
        .files
        .into_iter()
        .map(|(host_path, payload_name)| helper_vm::PayloadFile {
            host_path,
            payload_name,
        })
        .collect();
    let args: Vec<OsString> = plan.args.into_iter().map(OsString::from).collect();
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = helper_vm::run(&config, &exe, &args, &files)?;
    Ok(u8::try_from(status).unwrap_or(125))
}

/// The helper VM session as seen from the host.
#[derive(Serialize, Default)]
pub struct Session {
    /// Launcher start to the payload's first line (helper VM boot, incl. assembling its initrd).
    pub boot_ms: Option<f64>,
    /// The payload's last line to the launcher's exit (helper VM shutdown).
    pub shutdown_ms: Option<f64>,
    /// Launcher start to exit.
    pub total_ms: f64,
    /// First to last payload line, on the host's clock ...
    pub payload_host_ms: Option<f64>,
    /// ... and the worker's own duration on L1's clock (a check of L1's clock).
    pub payload_l1_ms: Option<f64>,
    /// L1's uptime when the payload started (L1 kernel boot + init, on L1's clock).
    pub l1_uptime_at_payload_s: Option<f64>,
    /// Bytes shipped as payload files (QEMU, its libraries and firmware, kernels, initrds).
    pub payload_file_bytes: u64,
    pub error: Option<String>,
}

impl Session {
    /// Runs `f` in a new session; an error of `f` becomes the session's `error`.
    pub fn record<R>(f: impl FnOnce(&mut Session) -> Result<R>) -> (Session, Option<R>) {
        let mut session = Session::default();
        match f(&mut session) {
            Ok(r) => (session, Some(r)),
            Err(e) => {
                session.error = Some(format!("{e:#}"));
                (session, None)
            }
        }
    }
}

/// A helper VM whose payload is `bench <bench> --worker-plan` with a plan of its own.
pub struct HelperLaunch<'a> {
    /// The subcommand: "boot" or "snapshot".
    pub bench: &'static str,
    /// [`helper_vm::ensure_assets`].
    pub assets_dir: PathBuf,
    pub memory_mib: u32,
    /// Payload files besides the plan: (host path, payload name).
    pub files: Vec<(PathBuf, String)>,
    /// Host directories shared read-write (9p), mounted at the same path in L1.
    pub shared_dirs: Vec<PathBuf>,
    /// Where the plans are written on the host: `{tmp}/{prefix}worker-plan.json` (shipped as
    /// `bench/plan.json`) and `{tmp}/{prefix}launch-plan.json`.
    pub tmp: &'a Path,
    pub prefix: &'a str,
    /// Time limit of the whole session.
    pub limit: Duration,
}

impl HelperLaunch<'_> {
    /// Ships `plan` (paths as seen in L1) and runs the helper VM through a launcher process,
    /// printing `announce(session)` to stderr just before it starts; fills in `session` and
    /// returns the worker's report.
    pub fn run<R: WorkerReport>(
        self,
        plan: &impl Serialize,
        session: &mut Session,
        announce: impl FnOnce(&Session) -> String,
    ) -> Result<R> {
        let plan_path = self.tmp.join(format!("{}worker-plan.json", self.prefix));
        fs::write(&plan_path, serde_json::to_vec(plan)?)?;
        let mut files = self.files;
        files.push((plan_path, "bench/plan.json".into()));
        session.payload_file_bytes = files
            .iter()
            .map(|(p, _)| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        let launch = LaunchPlan {
            assets_dir: self.assets_dir,
            memory_mib: self.memory_mib,
            args: vec![
                "bench".into(),
                self.bench.into(),
                "--worker-plan".into(),
                helper_vm::payload_path("bench/plan.json"),
            ],
            files,
            shared_dirs: self.shared_dirs,
        };
        let launch_path = self.tmp.join(format!("{}launch-plan.json", self.prefix));
        fs::write(&launch_path, serde_json::to_vec(&launch)?)?;

        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(["bench", self.bench, "--launch-plan"])
            .arg(&launch_path);
        let limit = self.limit;
        eprintln!("{}", announce(session));
        let finished = run_timed(cmd, limit, ErrMode::Tee, Watch::default())?;
        session.total_ms = ms(finished.wall);
        let ready = finished.first_line(MARK_READY);
        if let Some((at, line)) = ready {
            session.boot_ms = Some(ms(at.duration_since(finished.started)));
            session.l1_uptime_at_payload_s = line.trim().parse().ok();
        }
        let Some((report_at, report_text)) = finished.last_line(MARK_REPORT) else {
            bail!(
                "no result came back: {}",
                finished.failure("the helper VM launcher", limit)
            );
        };
        let report: R = serde_json::from_str(report_text)
            .context("unparsable result line from the helper VM")?;
        let end = finished.started + finished.wall;
        session.shutdown_ms = Some(ms(end.saturating_duration_since(report_at)));
        if let Some((ready_at, _)) = ready {
            session.payload_host_ms = Some(ms(report_at.duration_since(ready_at)));
        }
        session.payload_l1_ms = Some(report.elapsed_ms());
        if !finished.succeeded() {
            session.error = Some(finished.failure("the helper VM launcher", limit));
        }
        Ok(report)
    }
}
