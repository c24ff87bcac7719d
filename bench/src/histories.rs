//! `detvisor bench histories`: issue 30's "histories per hour". The same campaign two ways,
//! with the same wall budget, workers and slice: branching from the tree (a normal campaign,
//! each history one slice from a kept moment), and re-running every history from boot (each
//! history the branching side made, in its order: boot fresh, run to the root moment by the
//! campaign's rule, take the path's steps, judge it). Prints both rates, the ratio, and where
//! a branch's wall time goes (restore, run, keep, judge, commit: the engine's stats).

use crate::campaign_run::{is_full, per_hour, CampaignRun, Common, Lines, Ran};
use crate::say;
use anyhow::{bail, Context, Result};
use clap::Args;
use fuzzer::campaign::Place;
use fuzzer::session::{apply_steps, boot_options, reach};
use fuzzer::store::{NodeRow, Store};
use run::api::Request;
use run::client::Calls;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vmm::VirtNanos;

/// The budget, a side.
const FULL_BUDGET: &str = "20m";

#[derive(Args, Debug, Clone)]
pub struct HistoriesArgs {
    /// The campaign file.
    #[arg(long, default_value = "examples/etcd/campaign-serializable.toml")]
    pub campaign: PathBuf,
    /// Wall time of each side (the issue's: 20m; a shorter one is a smoke run, whose results
    /// are not written to bench/ unless --results says where).
    #[arg(long, short = 'b', default_value = FULL_BUDGET)]
    pub budget: VirtNanos,
    /// Workers of each side (the campaign's --jobs; that many boots at once on the other).
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    #[command(flatten)]
    pub common: Common,
}

/// What re-running histories from boot did.
#[derive(Default)]
struct Baseline {
    histories: u64,
    /// Of them, those that reached the digest the branching side's moment has.
    same_digest: u64,
    boot_ms: u64,
    steps_ms: u64,
    judge_ms: u64,
    /// Steps taken (slices run) in all.
    steps: u64,
    /// The budget's seconds.
    seconds: f64,
    /// The branching side's histories were all re-run before the budget ended.
    ran_out: bool,
}

/// Where a history re-run from boot ended: its digest, exits and virtual time.
struct Reached {
    digest: String,
    exits: u64,
    virtual_ns: VirtNanos,
}

impl Reached {
    /// Whether the re-run reached `node`'s moment; if not, how the two differ.
    fn against(&self, node: &NodeRow) -> String {
        if self.digest == node.digest {
            "the same".into()
        } else {
            format!(
                "DIFFERENT: from boot {} at exit {}, {}; the tree's {} at exit {}, {}",
                self.digest, self.exits, self.virtual_ns, node.digest, node.end_exits, node.end_ns
            )
        }
    }
}

/// One history re-run from boot on `calls`: (where it ended, boot ms, steps ms, judge ms).
fn from_boot(
    calls: &mut Calls<'_>,
    prepared: &run::up::PreparedUp,
    spec: &fuzzer::spec::CampaignSpec,
    node: &NodeRow,
) -> Result<(Reached, u64, u64, u64)> {
    let ms = |since: Instant| since.elapsed().as_millis() as u64;
    let booting = Instant::now();
    let (run, _) = calls.start(Request::BootUp {
        prepared: prepared.clone(),
        options: boot_options(spec, None),
    })?;
    calls.collect_records(run)?;
    let (_, mut records) = reach(calls, run, &spec.root)?;
    let boot_ms = ms(booting);
    let stepping = Instant::now();
    let position = apply_steps(calls, run, &node.path.steps, node.path.end_ns)?;
    records.extend(calls.take_records(run)?);
    let reached = Reached {
        digest: calls.outcome(run)?.digest,
        exits: position.exits,
        virtual_ns: position.virtual_ns,
    };
    calls.close(run)?;
    let steps_ms = ms(stepping);
    let judging = Instant::now();
    let judge = fuzzer::judges::campaign_judge(spec)?;
    drop(judge.check(&[&records]));
    Ok((reached, boot_ms, steps_ms, ms(judging)))
}

/// Re-runs the histories of the campaign in `dir` from boot, in its branches' order, on
/// `jobs` runners at once, until `budget` ends (a history that ends after it is not counted).
fn baseline(dir: &Path, jobs: u32, place: Place, budget: Duration) -> Result<Baseline> {
    let store = Store::open_read_only(dir)?;
    let meta = store.campaign_meta()?;
    let nodes: Vec<NodeRow> = store.nodes()?.into_iter().filter(|n| n.id > 0).collect();
    drop(store);
    if nodes.is_empty() {
        bail!("the branching side made no history to re-run");
    }
    let host_run = fuzzer::findings::resolve(dir, &meta.run)?;
    let (runners, there) = fuzzer::campaign::start_runners(place, &host_run, jobs, &[dir])?;
    let next = AtomicUsize::new(0);
    let total = Mutex::new(Baseline::default());
    let started = Instant::now();
    let deadline = started + budget;
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = runners
            .into_iter()
            .enumerate()
            .map(|(w, mut runner)| {
                let (next, total, nodes, there, spec) = (&next, &total, &nodes, &there, &meta.spec);
                s.spawn(move || -> Result<()> {
                    let mut calls = Calls::new(&mut runner);
                    loop {
                        if Instant::now() >= deadline {
                            return Ok(());
                        }
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(node) = nodes.get(i) else {
                            total.lock().unwrap_or_else(|e| e.into_inner()).ran_out = true;
                            return Ok(());
                        };
                        let (reached, boot_ms, steps_ms, judge_ms) =
                            from_boot(&mut calls, there, spec, node)
                                .with_context(|| format!("history {} from boot", node.id))?;
                        if Instant::now() > deadline {
                            return Ok(());
                        }
                        let same = reached.digest == node.digest;
                        let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                        t.histories += 1;
                        t.same_digest += u64::from(same);
                        t.boot_ms += boot_ms;
                        t.steps_ms += steps_ms;
                        t.judge_ms += judge_ms;
                        t.steps += node.path.steps.len() as u64;
                        say!(
                            "bench: from boot: history {} (depth {}) on worker {w}: boot to root {:.1} s, {} step(s) {:.1} s, judge {} ms, digest {} ({:.0} s)",
                            node.id,
                            node.path.steps.len(),
                            boot_ms as f64 / 1000.0,
                            node.path.steps.len(),
                            steps_ms as f64 / 1000.0,
                            judge_ms,
                            reached.against(node),
                            started.elapsed().as_secs_f64()
                        );
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a baseline thread panicked"))
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let mut total = total.into_inner().unwrap_or_else(|e| e.into_inner());
    total.seconds = if total.ran_out {
        started.elapsed().as_secs_f64().min(budget.as_secs_f64())
    } else {
        budget.as_secs_f64()
    };
    Ok(total)
}

/// Per branch, in ms, and as a share of `whole` ms.
fn part(ms: u64, branches: u64, whole: u64) -> String {
    let per = if branches == 0 {
        0.0
    } else {
        ms as f64 / branches as f64
    };
    let share = if whole == 0 {
        0.0
    } else {
        100.0 * ms as f64 / whole as f64
    };
    format!("{per:>9.0} ms  {share:>5.1}%")
}

fn report(args: &HistoriesArgs, ran: &Ran, base: &Baseline, machine: &str) -> Lines {
    let s = &ran.stats;
    let branches = ran.summary.branches_this_run;
    let tree_rate = ran.branches_per_hour();
    let tree_searching = ran.branches_per_hour_searching();
    let boot_rate = per_hour(base.histories, base.seconds);
    let ratio = |a: f64| {
        if boot_rate > 0.0 {
            a / boot_rate
        } else {
            f64::NAN
        }
    };
    let engine_ms = s.branch_ms + s.judge_ms + s.commit_ms;
    let mut out = Lines::default();
    let mut line = |l: String| out.line(l);
    line(format!(
        "detvisor bench histories: {}, {} a side, --jobs {}, both systems",
        args.campaign.display(),
        args.budget,
        args.jobs
    ));
    line(format!("machine: {machine}"));
    line(format!(
        "{:<34} {:>10} {:>12} {:>14}",
        "side", "histories", "wall (s)", "histories/h"
    ));
    line(format!(
        "{:<34} {:>10} {:>12.0} {:>14.1}",
        "branching from the tree", branches, ran.campaign_s, tree_rate
    ));
    line(format!(
        "{:<34} {:>10} {:>12.0} {:>14.1}",
        "  the same, less shrinking",
        branches,
        ran.campaign_s - s.shrink_ms as f64 / 1000.0,
        tree_searching
    ));
    line(format!(
        "{:<34} {:>10} {:>12.0} {:>14.1}",
        "re-running each history from boot", base.histories, base.seconds, boot_rate
    ));
    line(format!(
        "ratio (branching / from boot): {:.2}x ({:.2}x less shrinking); goal: at least 10x",
        ratio(tree_rate),
        ratio(tree_searching)
    ));
    line(format!(
        "branching side: boot to root {:.1} s, {} finding(s), shrinking {:.1} s, stopped by {}",
        s.root_ms as f64 / 1000.0,
        ran.summary.findings.len(),
        s.shrink_ms as f64 / 1000.0,
        ran.summary.stopped_by
    ));
    line(format!(
        "a branch's wall time, per branch and share ({} branches, {:.1} s of workers' and engine's time):",
        branches,
        engine_ms as f64 / 1000.0
    ));
    let mut part_line =
        |name: &str, ms: u64| line(format!("  {name:<58} {}", part(ms, branches, engine_ms)));
    part_line("restore (reset, load from spill/, replay)", s.restore_ms);
    part_line(
        &format!(
            "  of it {} load(s) from spill/ ({:.1} s), {} step(s) replayed ({:.1} s)",
            s.loaded,
            s.load_ms as f64 / 1000.0,
            s.replayed_steps,
            s.replay_ms as f64 / 1000.0
        ),
        s.load_ms + s.replay_ms,
    );
    part_line("run (re-key, faults, the slice, records, digest)", s.run_ms);
    part_line(
        &format!(
            "keep (checkpoint the moment; {} spilled, {:.1} s)",
            s.spilled,
            s.spill_write_ms as f64 / 1000.0
        ),
        s.keep_ms,
    );
    part_line("judge (the whole path's history)", s.judge_ms);
    part_line("commit (the database transaction)", s.commit_ms);
    let per = |ms: u64| {
        if base.histories == 0 {
            0.0
        } else {
            ms as f64 / base.histories as f64 / 1000.0
        }
    };
    line(format!(
        "from-boot side, per history: boot to root {:.1} s, its {} step(s) on average {:.1} s, judge {:.3} s; {} of {} reached the branching side's digest{}",
        per(base.boot_ms),
        if base.histories == 0 { 0.0 } else { base.steps as f64 / base.histories as f64 },
        per(base.steps_ms),
        per(base.judge_ms),
        base.same_digest,
        base.histories,
        if base.ran_out { "; it re-ran every history the branching side made before its budget ended" } else { "" }
    ));
    line(
        serde_json::json!({
            "bench": "histories",
            "campaign": args.campaign,
            "budget_s": args.budget.0 as f64 / 1e9,
            "jobs": args.jobs,
            "tree": {
                "histories": branches,
                "wall_s": ran.campaign_s,
                "per_hour": tree_rate,
                "per_hour_less_shrinking": tree_searching,
                "root_ms": s.root_ms,
                "shrink_ms": s.shrink_ms,
                "restore_ms": s.restore_ms,
                "run_ms": s.run_ms,
                "keep_ms": s.keep_ms,
                "judge_ms": s.judge_ms,
                "commit_ms": s.commit_ms,
                "loaded": s.loaded,
                "load_ms": s.load_ms,
                "replayed_steps": s.replayed_steps,
                "replay_ms": s.replay_ms,
                "spilled": s.spilled,
                "findings": ran.summary.findings.len(),
            },
            "from_boot": {
                "histories": base.histories,
                "wall_s": base.seconds,
                "per_hour": boot_rate,
                "boot_ms": base.boot_ms,
                "steps_ms": base.steps_ms,
                "judge_ms": base.judge_ms,
                "same_digest": base.same_digest,
                "ran_out": base.ran_out,
            },
            "ratio": ratio(tree_rate),
            "ratio_less_shrinking": ratio(tree_searching),
        })
        .to_string(),
    );
    out
}

pub fn orchestrate(args: &HistoriesArgs) -> Result<u8> {
    if args.jobs == 0 {
        bail!("--jobs must be at least 1 (the same workers on both sides)");
    }
    let setup = args.common.setup("histories", args.budget)?;
    let (place, machine, dir) = (setup.place, &setup.machine, &setup.dir);
    say!(
        "bench: histories: {}, {} a side, --jobs {}: branching from the tree, then each of its histories from boot ({})",
        args.campaign.display(),
        args.budget,
        args.jobs,
        dir.display()
    );
    let out = dir.join("tree");
    let ran = CampaignRun {
        label: "tree".into(),
        file: &args.campaign,
        out: out.clone(),
        wall: args.budget,
        jobs: args.jobs,
        place,
        seed: None,
        stop_at_first_finding: false,
    }
    .run()?;
    let base = baseline(&out, args.jobs, place, Duration::from_nanos(args.budget.0))?;
    let text = report(args, &ran, &base, machine);
    args.common.finish(
        &setup,
        "histories",
        &text,
        is_full(args.budget, FULL_BUDGET),
    )
}
