//! `detvisor bench first-finding`: issue 30's "time to the first stale read". Campaigns with
//! different campaign seeds on each target (the etcd serializable campaign and the Raft stale
//! read), each stopping at its first finding or its budget; the median time to it (when the
//! branch that found it was judged, and when the finding was written, shrunk), with the
//! branches it took.

use crate::campaign_run::{is_full, CampaignRun, Common, Lines, Ran};
use crate::say;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use vmm::VirtNanos;

/// The budget, a campaign.
const FULL_BUDGET: &str = "15m";

#[derive(Args, Debug, Clone)]
pub struct FirstFindingArgs {
    /// The campaign files (each run once per seed).
    #[arg(
        long = "campaign",
        value_delimiter = ',',
        default_value = "examples/etcd/campaign-serializable.toml,examples/raft/campaign-stale.toml"
    )]
    pub campaigns: Vec<PathBuf>,
    /// The campaign seeds (each replaces the file's `seed`).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub seeds: Vec<u64>,
    /// Most wall time of each campaign (the issue's: 15m; a shorter one is a smoke run, whose
    /// results are not written to bench/ unless --results says where).
    #[arg(long, short = 'b', default_value = FULL_BUDGET)]
    pub budget: VirtNanos,
    /// Workers of each campaign.
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    #[command(flatten)]
    pub common: Common,
}

/// One campaign's first finding, if any.
struct First {
    seed: u64,
    /// (key, branch that found it, found at s, written at s).
    found: Option<(String, u64, f64, f64)>,
    branches: u64,
    campaign_s: f64,
}

fn first(seed: u64, ran: &Ran) -> First {
    let found = ran.summary.findings.first().map(|f| {
        let s = |ms: Option<&u64>| ms.map_or(f64::NAN, |ms| *ms as f64 / 1000.0);
        (
            f.key.clone(),
            f.node,
            s(ran.stats.found_at_ms.get(&f.number)),
            s(ran.stats.findings_at_ms.get(&f.number)),
        )
    });
    First {
        seed,
        found,
        branches: ran.summary.branches_this_run,
        campaign_s: ran.campaign_s,
    }
}

/// The median of `values` (the lower middle one of an even count); `None` when empty.
fn median(mut values: Vec<f64>) -> Option<f64> {
    crate::stats::median(&mut values)
}

pub fn orchestrate(args: &FirstFindingArgs) -> Result<u8> {
    if args.seeds.is_empty() || args.campaigns.is_empty() {
        bail!("--seeds and --campaign need at least one value each");
    }
    let setup = args.common.setup("first-finding", args.budget)?;
    let (place, machine, dir) = (setup.place, &setup.machine, &setup.dir);
    let mut out = Lines::default();
    let mut line = |l: String| out.line(l);
    line(format!(
        "detvisor bench first-finding: seeds {:?}, at most {} a campaign, --jobs {}",
        args.seeds, args.budget, args.jobs
    ));
    line(format!("machine: {machine}"));
    let mut json = Vec::new();
    for (c, campaign) in args.campaigns.iter().enumerate() {
        let mut firsts = Vec::new();
        for &seed in &args.seeds {
            let label = format!("{} seed {seed}", campaign.display());
            say!("bench: first-finding: {label}");
            let ran = CampaignRun {
                label,
                file: campaign,
                out: dir.join(format!("c{c}-seed{seed}")),
                wall: args.budget,
                jobs: args.jobs,
                place,
                seed: Some(seed),
                stop_at_first_finding: true,
            }
            .run()?;
            firsts.push(first(seed, &ran));
        }
        line(format!("{}:", campaign.display()));
        line(format!(
            "  {:>6}  {:>9}  {:>10}  {:>11}  {:>12}  finding",
            "seed", "branches", "found (s)", "written (s)", "campaign (s)"
        ));
        for f in &firsts {
            match &f.found {
                Some((key, branch, found, written)) => line(format!(
                    "  {:>6}  {:>9}  {:>10.1}  {:>11.1}  {:>12.1}  {key} (on branch {branch})",
                    f.seed, f.branches, found, written, f.campaign_s
                )),
                None => line(format!(
                    "  {:>6}  {:>9}  {:>10}  {:>11}  {:>12.1}  none within the budget",
                    f.seed, f.branches, "-", "-", f.campaign_s
                )),
            }
        }
        let found: Vec<&First> = firsts.iter().filter(|f| f.found.is_some()).collect();
        let pick = |i: usize| -> Vec<f64> {
            found
                .iter()
                .filter_map(|f| f.found.as_ref())
                .map(|(_, branch, a, b)| [*branch as f64, *a, *b][i])
                .collect()
        };
        let (branch, at, written) = (median(pick(0)), median(pick(1)), median(pick(2)));
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        line(format!(
            "  median of the {} of {} campaigns that found one: {} s to the branch that found it ({} min; goal under 5), {} s to the finding written (shrunk), on branch {}; times are the campaign's wall time from its boot (the helper VMs' start not included)",
            found.len(),
            firsts.len(),
            fmt(at),
            at.map_or("-".to_string(), |s| format!("{:.2}", s / 60.0)),
            fmt(written),
            branch.map_or("-".to_string(), |b| format!("{b:.0}"))
        ));
        json.push(serde_json::json!({
            "campaign": campaign,
            "campaigns": firsts.iter().map(|f| serde_json::json!({
                "seed": f.seed,
                "branches": f.branches,
                "campaign_s": f.campaign_s,
                "finding": f.found.as_ref().map(|(key, branch, found, written)| serde_json::json!({
                    "key": key, "branch": branch, "found_s": found, "written_s": written,
                })),
            })).collect::<Vec<_>>(),
            "found": found.len(),
            "median_found_s": at,
            "median_written_s": written,
            "median_branch": branch,
        }));
    }
    line(
        serde_json::json!({
            "bench": "first-finding",
            "budget_s": args.budget.0 as f64 / 1e9,
            "jobs": args.jobs,
            "seeds": args.seeds,
            "targets": json,
        })
        .to_string(),
    );
    args.common.finish(
        &setup,
        "first-finding",
        &out,
        is_full(args.budget, FULL_BUDGET),
    )
}
