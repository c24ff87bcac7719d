//! `detvisor campaign`, `detvisor findings` and `detvisor replay`:
//! arguments, the interrupt, and printing. The campaign itself, and where
//! its runs happen, is the `fuzzer` library's (`fuzzer::campaign`).

use crate::progress::{human, Mode, Reporter};
use crate::PlaceArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use fuzzer::budget::WallBudget;
use fuzzer::campaign::{BudgetOverride, Campaign, NewCampaign};
use fuzzer::engine::{BranchReport, Budget, Progress};
use fuzzer::replay::ReplayProgress;
use fuzzer::shard::{Shard, COMPLETION_INDEX_VAR, MAX_SHARDS};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    budget: Option<WallBudget>,
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
    /// Run shard INDEX of COUNT of the campaign's search (0-based: 0/4 to
    /// 3/4): the same root in every shard, each branching only its own part
    /// of the tree (docs/campaigns.md, "Shards"). Kept for the campaign's
    /// life; with --resume, checked against the campaign's.
    #[arg(long, value_name = "INDEX/COUNT", conflicts_with = "shard_count")]
    shard: Option<Shard>,
    /// Run one shard of COUNT, its index (0-based) read from
    /// JOB_COMPLETION_INDEX, as a Kubernetes Indexed Job sets it in each pod.
    #[arg(long, value_name = "COUNT", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    shard_count: Option<u32>,
    /// Show no progress (no display, no lines on stderr; errors still);
    /// the findings on stdout are printed as always. Without it, a terminal
    /// gets a live display (branches, moments, findings, budget left, ETA)
    /// and anything else plain lines.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    place: PlaceArgs,
}

impl CampaignArgs {
    /// The shard given by `--shard`, or by `--shard-count` and the
    /// completion index in the environment.
    fn shard(&self) -> Result<Option<Shard>> {
        if let Some(count) = self.shard_count {
            let index = std::env::var_os(COMPLETION_INDEX_VAR);
            let index = index.as_ref().map(|i| i.to_string_lossy());
            let shard = Shard::from_completion_index(index.as_deref(), count)
                .with_context(|| format!("--shard-count {count}"))?;
            return Ok(Some(shard));
        }
        Ok(self.shard)
    }
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
    /// Show no progress (no display, no lines on stderr; errors still).
    /// Without it, a terminal gets a live display (slices of the path run,
    /// virtual time reached, ETA) and anything else a line per step.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    place: PlaceArgs,
}

/// Set by SIGINT: the campaign stops after the branches in flight.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// A campaign's counts, for its display.
#[derive(Clone, Copy, Debug)]
struct Counts {
    /// Branches in all (a resumed campaign's earlier ones included).
    branches: u64,
    /// Of those, this run's.
    this_run: u64,
    findings: usize,
    /// Wall time of this run so far.
    elapsed: Duration,
    budget: Budget,
}

/// What the display says: branches, moments, findings, budget left, ETA.
fn status(c: &Counts) -> String {
    let wall_left = c.budget.wall.map(|wall| wall.saturating_sub(c.elapsed));
    let branches_left =
        (c.budget.branches > 0).then(|| c.budget.branches.saturating_sub(c.branches));
    let mut left = Vec::new();
    if let Some(wall) = wall_left {
        left.push(human(wall));
    }
    if let Some(branches) = branches_left {
        left.push(format!(
            "{branches} branch{}",
            if branches == 1 { "" } else { "es" }
        ));
    }
    // By the branch budget at this run's pace, by the wall budget, or the
    // sooner of both.
    let by_branches = branches_left
        .filter(|_| c.this_run > 0)
        .map(|left| c.elapsed.mul_f64(left as f64 / c.this_run as f64));
    let eta = match (by_branches, wall_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    format!(
        "branches {} ({} this run) · moments {} · findings {} · budget left {} · ETA {}",
        c.branches,
        c.this_run,
        c.branches + 1,
        c.findings,
        if left.is_empty() {
            "no limit".to_string()
        } else {
            left.join(", ")
        },
        eta.map_or_else(|| "-".to_string(), human)
    )
}

/// The campaign's progress: lines for the root, findings and warnings
/// (and for each branch away from a terminal), a display of its counts on
/// one.
struct Printer {
    reporter: Reporter,
    started: Instant,
    counts: Counts,
}

impl Printer {
    fn new(mode: Mode) -> Printer {
        Printer {
            reporter: Reporter::new(mode),
            started: Instant::now(),
            counts: Counts {
                branches: 0,
                this_run: 0,
                findings: 0,
                elapsed: Duration::ZERO,
                budget: Budget::default(),
            },
        }
    }

    /// Counts from the campaign as it starts its run.
    fn begin(&mut self, campaign: &Campaign) {
        self.started = Instant::now();
        self.counts.budget = campaign.budget();
        self.counts.branches = campaign.branches();
        self.counts.findings = campaign.findings();
    }

    fn redraw(&mut self) {
        self.counts.elapsed = self.started.elapsed();
        self.reporter
            .update(self.counts.branches, status(&self.counts));
    }
}

impl Progress for Printer {
    fn root(&mut self, position: &run::api::Position, digest: &str) {
        self.reporter.line(&format!(
            "detvisor: root moment at {} (exit {}), digest {digest}",
            position.virtual_ns, position.exits
        ));
        let budget = self.counts.budget.branches;
        self.reporter
            .start((budget > 0).then_some(budget), self.counts.branches, false);
        self.redraw();
    }

    fn branch(&mut self, r: &BranchReport) {
        self.counts.branches = r.number;
        self.counts.this_run += 1;
        self.redraw();
        self.reporter.event(&format!(
            "detvisor: branch {} from moment {} (depth {}), seed {}, {} fault{}: to {}, {} failure{}, novelty {:.2} ({:.1} s, worker {})",
            r.number,
            r.parent,
            r.depth,
            r.seed,
            r.faults,
            if r.faults == 1 { "" } else { "s" },
            r.end_ns,
            r.failures,
            if r.failures == 1 { "" } else { "s" },
            r.novelty,
            r.wall_ms as f64 / 1000.0,
            r.worker
        ));
    }

    fn finding(&mut self, number: u32, key: &str, summary: &str, dir: &Path) {
        self.counts.findings += 1;
        // What shrinking made of its path, as `findings` says it.
        let shrunk = match fuzzer::campaign::FindingLine::read(dir) {
            Ok(line) => line.shrunk(),
            Err(e) => format!("{}: {}", dir.display(), run::chain(&e)),
        };
        self.reporter.line(&format!(
            "detvisor: FINDING {number:04} {key}: {summary} ({shrunk}) -> {}",
            dir.display()
        ));
        self.redraw();
    }

    fn warning(&mut self, text: &str) {
        self.reporter.line(&format!("detvisor: WARNING: {text}"));
    }
}

pub fn cmd_campaign(args: CampaignArgs) -> Result<u8> {
    if args.print_defaults {
        print!("{}", fuzzer::profile::DEFAULT_PROFILE_TOML);
        return Ok(0);
    }
    // `--budget` and `--branches`, over the campaign's own budget.
    let budget = BudgetOverride {
        wall: args.budget,
        branches: args.branches,
    };
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let stop = || INTERRUPTED.load(Ordering::SeqCst);
    let shard = args.shard()?;
    let mut printer = Printer::new(Mode::detect(args.quiet));
    // --jobs was checked by clap (0..=64) before anything started.
    let mut campaign = if let Some(dir) = &args.resume {
        Campaign::resume(dir, budget, args.jobs, args.place.campaign(), shard)?
    } else {
        let (Some(file), Some(out)) = (&args.campaign, &args.out) else {
            bail!("give a campaign file and --out DIR, or --resume DIR");
        };
        let new = NewCampaign {
            file: file.clone(),
            out: out.clone(),
            budget,
            jobs: args.jobs,
            place: args.place.campaign(),
            shard: shard.unwrap_or(Shard::WHOLE),
        };
        Campaign::start(&new, &mut printer)?
    };
    let shard = campaign.shard();
    let of_shard = if shard.is_whole() {
        String::new()
    } else {
        printer.reporter.line(&format!(
            "detvisor: shard {shard} of the campaign's search: branch seeds = {} mod {}",
            shard.index, shard.count
        ));
        format!(" of shard {shard}")
    };
    printer.begin(&campaign);
    let summary = campaign.run(&mut printer, &stop)?;
    let reporter = &mut printer.reporter;
    reporter.finish();
    reporter.line(&format!(
        "detvisor: campaign stopped ({}): {} branches{of_shard} ({} in this run, {} worker{}, batches of {}), {} finding{}, {:.1} min of wall time",
        summary.stopped_by,
        summary.branches,
        summary.branches_this_run,
        summary.workers,
        if summary.workers == 1 { "" } else { "s" },
        summary.batch_width,
        summary.findings.len(),
        if summary.findings.len() == 1 { "" } else { "s" },
        summary.wall_ms as f64 / 60_000.0
    ));
    let shrinking = summary.shrinking;
    if shrinking.findings > 0 {
        reporter.line(&format!(
            "detvisor: shrinking {} finding{}: {} replays from the root on {} worker{}, {:.1} s",
            shrinking.findings,
            if shrinking.findings == 1 { "" } else { "s" },
            shrinking.replays,
            summary.workers,
            if summary.workers == 1 { "" } else { "s" },
            shrinking.wall_ms as f64 / 1000.0
        ));
    }
    if summary.branches_this_run > 0 {
        reporter.line(&format!("detvisor: {}", summary.going_back.line()));
    }
    for finding in &summary.findings {
        println!(
            "{:04}  {}  {}",
            finding.number, finding.key, finding.summary
        );
    }
    for failure in &summary.end_failures {
        println!("end   {}  {}", failure.key.slug(), failure.summary);
    }
    // Said on stderr as it was found; here again, where a passing campaign
    // would show nothing.
    for warning in &summary.warnings {
        println!("WARNING  {warning}");
    }
    if let Some(dir) = args.resume.as_ref().or(args.out.as_ref()) {
        crate::report_cmd::print_summary(dir);
    }
    Ok(if summary.findings.is_empty() { 0 } else { 1 })
}

pub fn cmd_replay(args: ReplayArgs) -> Result<u8> {
    let mut reporter = Reporter::new(Mode::detect(args.quiet));
    reporter.start(None, 0, false);
    reporter.update(0, format!("starting to replay {}", args.finding.display()));
    let mut root = vmm::VirtNanos::ZERO;
    let report = fuzzer::campaign::replay(
        &args.finding,
        args.logs.as_deref(),
        args.place.campaign(),
        &mut |step| {
            // The path is what takes long: a bar of its virtual time from
            // the root to its end (milliseconds), moved at each slice.
            let position = match step {
                ReplayProgress::Root {
                    virtual_ns, end, ..
                } => {
                    root = virtual_ns;
                    reporter.start(Some(millis_since(root, end)), 0, true);
                    0
                }
                ReplayProgress::Slice { virtual_ns, .. } => millis_since(root, virtual_ns),
                ReplayProgress::Judging => {
                    reporter.start(None, 0, false);
                    0
                }
                ReplayProgress::Booting => 0,
            };
            reporter.update(position, replay_status(&step));
            reporter.event(&replay_line(&step));
        },
    );
    reporter.finish();
    let report = report?;
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

/// Whole milliseconds of virtual time from `from` to `to`.
fn millis_since(from: vmm::VirtNanos, to: vmm::VirtNanos) -> u64 {
    to.0.saturating_sub(from.0) / 1_000_000
}

/// What the display says at a step of a replay.
fn replay_status(step: &ReplayProgress) -> String {
    match *step {
        ReplayProgress::Booting => "booting the finding's run".into(),
        ReplayProgress::Root { virtual_ns, .. } => format!("root moment at {virtual_ns}"),
        ReplayProgress::Slice {
            done,
            total,
            virtual_ns,
            end,
        } => format!("ms of the path · slice {done}/{total} · virtual time {virtual_ns} of {end}"),
        ReplayProgress::Judging => "judging the history".into(),
    }
}

/// A step of a replay as a plain line (stderr is not a terminal).
fn replay_line(step: &ReplayProgress) -> String {
    match *step {
        ReplayProgress::Booting => "detvisor: replay: booting the finding's run".into(),
        ReplayProgress::Root {
            virtual_ns,
            slices,
            end,
        } => format!(
            "detvisor: replay: root moment at {virtual_ns}; {slices} slice{} of the path to {end}",
            if slices == 1 { "" } else { "s" }
        ),
        ReplayProgress::Slice {
            done,
            total,
            virtual_ns,
            end,
        } => format!(
            "detvisor: replay: slice {done}/{total} run, virtual time {virtual_ns} of {end}"
        ),
        ReplayProgress::Judging => "detvisor: replay: judging the history".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn test_each_replay_step_is_one_plain_line() {
        let (at, end) = (
            vmm::VirtNanos(5_000_000_000),
            vmm::VirtNanos(30_000_000_000),
        );
        let steps = [
            ReplayProgress::Booting,
            ReplayProgress::Root {
                virtual_ns: at,
                slices: 3,
                end,
            },
            ReplayProgress::Slice {
                done: 3,
                total: 3,
                virtual_ns: end,
                end,
            },
            ReplayProgress::Judging,
        ];
        let lines: Vec<String> = steps.iter().map(replay_line).collect();
        assert_eq!(
            lines,
            [
                "detvisor: replay: booting the finding's run",
                "detvisor: replay: root moment at 5s; 3 slices of the path to 30s",
                "detvisor: replay: slice 3/3 run, virtual time 30s of 30s",
                "detvisor: replay: judging the history",
            ]
        );
        assert_eq!(
            replay_status(&steps[2]),
            "ms of the path · slice 3/3 · virtual time 30s of 30s"
        );
        assert_eq!(millis_since(at, end), 25_000);
        assert_eq!(millis_since(end, at), 0);
        let argv = ["detvisor", "replay", "f", "--quiet"];
        let crate::Command::Replay(args) = crate::Cli::try_parse_from(argv).unwrap().command else {
            panic!("a replay");
        };
        assert!(args.quiet);
    }

    /// `--budget` as clap reads it, or clap's refusal.
    fn budget(text: &str) -> Result<Option<WallBudget>, clap::Error> {
        let argv = [
            "detvisor", "campaign", "c.toml", "--out", "o", "--budget", text,
        ];
        let crate::Command::Campaign(args) = crate::Cli::try_parse_from(argv)?.command else {
            panic!("{argv:?} is a campaign");
        };
        Ok(args.budget)
    }

    /// `campaign` with `more` arguments as clap reads them, or its refusal.
    fn campaign_args(more: &[&str]) -> Result<CampaignArgs, clap::Error> {
        let mut argv = vec!["detvisor", "campaign", "c.toml", "--out", "o"];
        argv.extend_from_slice(more);
        let crate::Command::Campaign(args) = crate::Cli::try_parse_from(&argv)?.command else {
            panic!("{argv:?} is a campaign");
        };
        Ok(args)
    }

    #[test]
    fn test_the_display_says_counts_budget_left_and_eta() {
        let counts = Counts {
            branches: 12,
            this_run: 4,
            findings: 1,
            elapsed: Duration::from_secs(120),
            budget: Budget {
                wall: Some(Duration::from_secs(3600)),
                branches: 20,
            },
        };
        // 8 branches left at 30 s each: 4 minutes, sooner than the wall.
        assert_eq!(
            status(&counts),
            "branches 12 (4 this run) · moments 13 · findings 1 · budget left 58m 00s, 8 branches · ETA 4m 00s"
        );
        let wall_only = Counts {
            budget: Budget {
                wall: Some(Duration::from_secs(600)),
                branches: 0,
            },
            ..counts
        };
        assert_eq!(
            status(&wall_only),
            "branches 12 (4 this run) · moments 13 · findings 1 · budget left 8m 00s · ETA 8m 00s"
        );
        let none = Counts {
            this_run: 0,
            budget: Budget::default(),
            ..counts
        };
        assert_eq!(
            status(&none),
            "branches 12 (0 this run) · moments 13 · findings 1 · budget left no limit · ETA -"
        );
    }

    #[test]
    fn test_shard_flags_are_read_and_bad_ones_refused_naming_the_flag() {
        let args = campaign_args(&["--shard", "3/20"]).unwrap();
        assert_eq!(
            args.shard().unwrap(),
            Some(Shard {
                index: 3,
                count: 20
            })
        );
        assert_eq!(campaign_args(&[]).unwrap().shard().unwrap(), None);
        let refused = campaign_args(&["--shard", "20/20"]).unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        assert_eq!(
            std::error::Error::source(&refused).unwrap().to_string(),
            "shard index 20 is out of range for 20 shards: they are numbered 0 to 19 (0-based, as JOB_COMPLETION_INDEX)"
        );
        for bad in [["--shard-count", "0"], ["--shard-count", "100001"]] {
            let refused = campaign_args(&bad).unwrap_err();
            assert_eq!(
                refused.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad:?}"
            );
        }
        let both = campaign_args(&["--shard", "1/3", "--shard-count", "3"]).unwrap_err();
        assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn test_budget_is_read_by_clap_as_the_file_s_budget_wall() {
        for text in ["30m", "500us", "0"] {
            assert_eq!(
                budget(text).unwrap(),
                Some(WallBudget(fuzzer::budget::parse_wall(text).unwrap())),
                "{text}"
            );
        }
        // Refused as a value of --budget, its reason the duration grammar's:
        // `parse_cli` prints "detvisor: error: --budget: <reason>", as the
        // command printed it when it parsed the text itself.
        let refused = budget("soon").unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        let Some(clap::error::ContextValue::String(arg)) =
            refused.get(clap::error::ContextKind::InvalidArg)
        else {
            panic!("{refused} names its flag");
        };
        assert!(arg.starts_with("--budget"), "{arg}");
        assert_eq!(
            std::error::Error::source(&refused).unwrap().to_string(),
            fuzzer::budget::parse_wall("soon").unwrap_err().to_string()
        );
    }
}
