//! `detvisor campaign`, `detvisor findings` and `detvisor replay`:
//! arguments, placement (runs here or in a helper VM, for the campaign's
//! whole life) and printing. The campaign itself is the `fuzzer` library.

use crate::helper::Remote;
use crate::{HostVmMode, SeccompArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use fuzzer::engine::{BranchReport, Budget, Engine, Progress};
use fuzzer::findings;
use fuzzer::runner::{InProcess, Runner};
use fuzzer::spec::MAX_BATCH_WIDTH;
use fuzzer::spec::{CampaignFile, CampaignSpec};
use helper_vm::Placement;
use run::api::{Request, Response};
use run::up::{PreparedUp, UpOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use vmm::stall::StallTimeout;

/// The exit status of `detvisor campaign`, said in its help.
const CAMPAIGN_EXIT_STATUS: &str = "Exit status: 0 when the campaign stopped holding no finding, 1 when it holds one or more (a resumed campaign's earlier ones included; `detvisor findings DIR` lists them), 2 on an error (bad input, a run that failed).";

#[derive(Args, Debug)]
#[command(after_help = CAMPAIGN_EXIT_STATUS)]
pub struct CampaignArgs {
    /// The campaign file (TOML; see docs/campaigns.md). Not with --resume.
    campaign: Option<PathBuf>,
    /// Print the default fault profile, the [faults] table every campaign
    /// file starts from (annotated TOML), and exit.
    #[arg(long, conflicts_with_all = ["campaign", "out", "resume"])]
    print_defaults: bool,
    /// Where the campaign keeps its database, findings and files.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Continue the campaign in DIR (killed, interrupted or out of budget).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["campaign", "out"])]
    resume: Option<PathBuf>,
    /// Wall time this run of the campaign may take (e.g. 30m; exact, 0: no
    /// limit), overriding the file's budget.wall.
    #[arg(long)]
    budget: Option<String>,
    /// Stop after this many branches in all (0: no limit), overriding the
    /// file's budget.branches.
    #[arg(long)]
    branches: Option<u64>,
    /// Workers: branches run at once (0: one per core, at most 64). Through
    /// the helper VM each worker has a helper VM of its own, kept for the
    /// campaign's whole run. A new campaign chooses its branches in batches
    /// of this many (the search is the same whatever --jobs a resume gives).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=64))]
    jobs: u32,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
}

#[derive(Args, Debug)]
pub struct FindingsArgs {
    /// A campaign directory.
    dir: PathBuf,
    /// One JSON object per finding, a line each.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A finding's directory (DIR/findings/NNNN), wherever it was copied.
    finding: PathBuf,
    /// Write the nodes' logs here (<node>.log).
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    #[command(flatten)]
    seccomp: SeccompArgs,
}

/// Set by SIGINT: the campaign stops after the branches in flight.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Where a campaign's runs happen.
enum Place {
    Here(InProcess),
    HelperVm(Box<Remote>),
}

/// The runner for a place: stall policy set for it on every request.
struct PlacedRunner {
    place: Place,
    stall: StallTimeout,
}

impl Runner for PlacedRunner {
    fn call(&mut self, mut request: Request) -> Result<Response, String> {
        if let Some(timeout) = request.stall_timeout_mut() {
            *timeout = self.stall;
        }
        match &mut self.place {
            Place::Here(runner) => runner.call(request),
            Place::HelperVm(remote) => remote.call(&request, false).map_err(|e| format!("{e:#}")),
        }
    }
}

/// Where the runs of `prepared` will happen, decided and checked (the
/// helper VMs' memory against the host's) before anything is written or
/// started: a refusal leaves nothing behind.
struct Plan {
    workers: u32,
    seccomp: bool,
    place: PlannedPlace,
}

enum PlannedPlace {
    Here(PreparedUp),
    /// `needs` per worker; `there` is the run as the helper VMs see it.
    HelperVm {
        reason: String,
        needs: Vec<crate::helper::Needs>,
        there: PreparedUp,
    },
}

/// A plan for `workers` runners of `prepared`: here, a run library each; in
/// the helper VM, a helper VM each (one vCPU: measured faster than one
/// helper VM with a vCPU per worker, whose multi-threaded TCG also changed
/// the guest's digest; see docs/campaigns.md).
fn plan(mode: HostVmMode, seccomp: bool, prepared: &PreparedUp, workers: u32) -> Result<Plan> {
    let place = match helper_vm::placement(mode) {
        Placement::Host => PlannedPlace::Here(prepared.clone()),
        Placement::HelperVm { reason } => {
            let mut needs = Vec::new();
            let mut there = prepared.clone();
            for _ in 0..workers {
                there = prepared.clone();
                let mut options = UpOptions {
                    stall_timeout: StallTimeout::HELPER_VM,
                    ..UpOptions::new(0)
                };
                needs.push(crate::up_cmd::helper_needs(&mut there, &mut options)?);
            }
            check_host_memory(workers, needs[0].memory_mib)?;
            PlannedPlace::HelperVm {
                reason,
                needs,
                there,
            }
        }
    };
    Ok(Plan {
        workers,
        seccomp,
        place,
    })
}

/// Starts the planned runners, sharing `shared` (directories that exist)
/// with the helper VMs; the run as the runners see it.
fn start(plan: Plan, shared: &[&Path]) -> Result<(Vec<PlacedRunner>, PreparedUp)> {
    let (mut runners, there) = match plan.place {
        PlannedPlace::Here(prepared) => (
            (0..plan.workers)
                .map(|_| PlacedRunner {
                    place: Place::Here(InProcess::new()),
                    stall: StallTimeout::HARDWARE,
                })
                .collect(),
            prepared,
        ),
        PlannedPlace::HelperVm {
            reason,
            needs,
            there,
        } => {
            if plan.workers > 1 {
                eprintln!("detvisor: {} workers, a helper VM each", plan.workers);
            }
            // One after the other, on this thread: QEMU is tied to the
            // thread that starts it (it is killed when that thread ends).
            let runners = needs
                .into_iter()
                .map(|mut needs| {
                    for dir in shared {
                        needs.share(dir)?;
                    }
                    Ok(PlacedRunner {
                        place: Place::HelperVm(Box::new(Remote::start(&reason, needs)?)),
                        stall: StallTimeout::HELPER_VM,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            (runners, there)
        }
    };
    // The filter is on by default wherever the runs are (a worker's
    // thread here, the whole serving process in a helper VM).
    if !plan.seccomp {
        for runner in &mut runners {
            runner
                .call(Request::Seccomp { enabled: false })
                .map_err(anyhow::Error::msg)
                .context("turning seccomp off (--no-seccomp)")?;
        }
    }
    Ok((runners, there))
}

/// Refuses `workers` helper VMs of `memory_mib` each that the host's
/// available memory cannot hold (QEMU would be killed half-way instead).
fn check_host_memory(workers: u32, memory_mib: u32) -> Result<()> {
    let Some(available_mib) = available_memory_mib() else {
        return Ok(());
    };
    let needed = u64::from(workers) * u64::from(memory_mib);
    if needed > available_mib {
        bail!(
            "--jobs {workers}: {workers} helper VMs of {memory_mib} MiB need {needed} MiB, and this host has {available_mib} MiB available"
        );
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, in MiB.
fn available_memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Workers for `--jobs`: 0 is one per core of this host.
fn workers(jobs: u32) -> u32 {
    if jobs > 0 {
        return jobs;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .min(MAX_BATCH_WIDTH)
}

/// Boxes runners for the engine's workers.
fn boxed<'a>(runners: &'a mut [PlacedRunner]) -> Vec<Box<dyn Runner + Send + 'a>> {
    runners
        .iter_mut()
        .map(|r| Box::new(r) as Box<dyn Runner + Send + 'a>)
        .collect()
}

struct Printer;

impl Progress for Printer {
    fn root(&mut self, position: &run::api::Position, digest: &str) {
        eprintln!(
            "detvisor: root moment at {} (exit {}), digest {digest}",
            position.virtual_ns, position.exits
        );
    }

    fn branch(&mut self, r: &BranchReport) {
        eprintln!(
            "detvisor: branch {} from moment {} (depth {}), seed {}, {} fault{}: to {}, {} failure{}, novelty {:.2} ({:.1} s, worker {})",
            r.number,
            r.parent,
            r.depth,
            r.seed,
            r.faults,
            if r.faults == 1 { "" } else { "s" },
            vmm::VirtNanos(r.end_ns),
            r.failures,
            if r.failures == 1 { "" } else { "s" },
            r.novelty,
            r.wall_ms as f64 / 1000.0,
            r.worker
        );
    }

    fn finding(&mut self, number: u32, key: &str, summary: &str, dir: &Path) {
        eprintln!(
            "detvisor: FINDING {number:04} {key}: {summary} -> {}",
            dir.display()
        );
    }

    fn warning(&mut self, text: &str) {
        eprintln!("detvisor: WARNING: {text}");
    }
}

fn budget(args: &CampaignArgs, spec: &CampaignSpec) -> Result<Budget> {
    let wall = match &args.budget {
        Some(text) => fuzzer::budget::parse_wall(text).context("--budget")?,
        None => spec.wall_budget(),
    };
    Ok(Budget {
        wall: fuzzer::budget::wall_duration(wall),
        branches: args.branches.unwrap_or(spec.max_branches),
    })
}

pub fn cmd_campaign(args: CampaignArgs) -> Result<u8> {
    if args.print_defaults {
        print!("{}", fuzzer::profile::DEFAULT_PROFILE_TOML);
        return Ok(0);
    }
    // --jobs was checked by clap (0..=64) before anything started.
    let workers = workers(args.jobs);
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let stop = || INTERRUPTED.load(Ordering::SeqCst);
    let summary = if let Some(dir) = &args.resume {
        let dir = absolute(dir)?;
        // The spec and run are the campaign's own; checked before any VM starts.
        let store = fuzzer::store::Store::open(&dir)?;
        let spec: CampaignSpec = store
            .meta_json("spec")?
            .context("the campaign database holds no spec")?;
        let saved: PreparedUp = store
            .meta_json("run")?
            .context("the campaign database holds no run")?;
        let host_run = findings::resolve(&dir, &saved)?;
        store.check_paths(&host_run.node_names)?;
        let budget = budget(&args, &spec)?;
        let judge = fuzzer::judges::campaign_judge(&spec)?;
        let faults = fuzzer::judges::fault_source(&spec, &host_run)?;
        let plan = plan(args.host_vm, args.seccomp.enabled(), &host_run, workers)?;
        let (mut runners, there) = start(plan, &[&dir])?;
        // The store stays open (and locked) from here to the campaign's end.
        let mut engine = Engine::resume_store(
            boxed(&mut runners),
            &dir,
            store,
            judge,
            |_| faults,
            |_, _| Ok(there.clone()),
        )?;
        engine.run(budget, &mut Printer, &stop)?
    } else {
        let (Some(file), Some(out)) = (&args.campaign, &args.out) else {
            bail!("give a campaign file and --out DIR, or --resume DIR");
        };
        fuzzer::store::NewCampaignDir::check(out)?;
        let campaign = CampaignFile::load(file)?;
        for warning in &campaign.warnings {
            eprintln!("detvisor: WARNING: {warning}");
        }
        let budget = budget(&args, &campaign.spec)?;
        let manifest = run::manifest::load(&campaign.spec.manifest)?;
        campaign.check_manifest(&manifest)?;
        let spec = campaign.spec;
        let prepared = run::up::prepare(&manifest, &[], None, None)?;
        let judge = fuzzer::judges::campaign_judge(&spec)?;
        let faults = fuzzer::judges::fault_source(&spec, &prepared)?;
        let plan = plan(args.host_vm, args.seccomp.enabled(), &prepared, workers)?;
        // Claimed (created and locked) before any helper VM starts or any
        // file is written there.
        let claimed = fuzzer::store::NewCampaignDir::claim(out)?;
        let (mut runners, there) = start(plan, &[claimed.path()])?;
        let mut engine = Engine::create(
            boxed(&mut runners),
            spec,
            &prepared,
            there,
            claimed,
            judge,
            faults,
        )?;
        engine.run(budget, &mut Printer, &stop)?
    };
    eprintln!(
        "detvisor: campaign stopped ({}): {} branches ({} in this run, {} worker{}, batches of {}), {} finding{}, {:.1} min of wall time",
        summary.stopped_by,
        summary.branches,
        summary.branches_this_run,
        summary.workers,
        if summary.workers == 1 { "" } else { "s" },
        summary.batch_width,
        summary.findings.len(),
        if summary.findings.len() == 1 { "" } else { "s" },
        summary.wall_ms as f64 / 60_000.0
    );
    let spill = summary.spill;
    if spill.written > 0 {
        eprintln!(
            "detvisor: {} checkpoint(s) spilled to disk ({} ms), {} loaded back in place ({} ms)",
            spill.written, spill.write_ms, spill.loaded, spill.load_ms
        );
    }
    for finding in &summary.findings {
        println!(
            "{:04}  {}  {}",
            finding.number, finding.key, finding.summary
        );
    }
    for failure in &summary.end_failures {
        println!("end   {}  {}", failure.key, failure.summary);
    }
    // Said on stderr as it was found; here again, where a passing campaign
    // would show nothing.
    for warning in &summary.warnings {
        println!("WARNING  {warning}");
    }
    Ok(if summary.findings.is_empty() { 0 } else { 1 })
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    dir.canonicalize()
        .with_context(|| format!("directory {}", dir.display()))
}

pub fn cmd_findings(args: FindingsArgs) -> Result<u8> {
    let listed = fuzzer::listing::list(&args.dir)?;
    for fuzzer::listing::Listed { dir, file } in &listed {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "number": file.number, "key": file.key, "summary": file.summary,
                    "faults": file.path.fault_count(), "found_faults": file.found_path.fault_count(),
                    "virtual_ns": file.virtual_ns, "digest": file.digest,
                    "dir": dir,
                })
            );
        } else {
            let faults = file.path.fault_count();
            println!(
                "{:04}  {}  {}  ({} fault{} after shrinking from {}; ends at {})",
                file.number,
                file.key,
                file.summary,
                faults,
                if faults == 1 { "" } else { "s" },
                file.found_path.fault_count(),
                file.virtual_ns
            );
        }
    }
    if listed.is_empty() && !args.json {
        println!("no findings");
    }
    Ok(0)
}

pub fn cmd_replay(args: ReplayArgs) -> Result<u8> {
    let dir = absolute(&args.finding)?;
    let finding = findings::load(&dir)?;
    let judge = fuzzer::judges::campaign_judge(&finding.file.spec)?;
    let mut shared: Vec<&Path> = Vec::new();
    let logs = match &args.logs {
        Some(logs) => {
            std::fs::create_dir_all(logs)
                .with_context(|| format!("creating {}", logs.display()))?;
            Some(absolute(logs)?)
        }
        None => None,
    };
    if let Some(logs) = &logs {
        shared.push(logs);
    }
    let plan = plan(args.host_vm, args.seccomp.enabled(), &finding.run, 1)?;
    let (mut runners, there) = start(plan, &shared)?;
    let runner = &mut runners[0];
    let loaded = findings::LoadedFinding {
        file: finding.file.clone(),
        run: there,
    };
    let report = fuzzer::replay::replay_loaded(runner, &loaded, judge.as_ref(), logs.as_deref())?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "finding {:04} {}: {} (digest {} {} recorded {}; failure {})",
            report.number,
            report.key,
            if report.reproduced {
                "reproduced"
            } else {
                "NOT reproduced"
            },
            report.digest,
            if report.digest == report.expected_digest {
                "="
            } else {
                "!="
            },
            report.expected_digest,
            if report.failed_again {
                "seen again"
            } else {
                "not seen"
            }
        );
    }
    Ok(if report.reproduced { 0 } else { 1 })
}
