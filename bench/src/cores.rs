//! `detvisor bench cores`: issue 30's "both cores". The same campaign with `--jobs 1`, then with
//! `--jobs 0` (a worker per core), the same wall budget each: branches per hour of each (of the
//! whole campaign, and less the time shrinking a finding took), and the ratio.

use crate::campaign_run::{is_full, CampaignRun, Common, Lines, Ran};
use crate::say;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use vmm::VirtNanos;

/// The budget, a side.
const FULL_BUDGET: &str = "20m";

#[derive(Args, Debug, Clone)]
pub struct CoresArgs {
    /// The campaign file.
    #[arg(long, default_value = "examples/etcd/campaign-serializable.toml")]
    pub campaign: PathBuf,
    /// Wall time of each side (the issue's: 20m; a shorter one is a smoke run, whose results
    /// are not written to bench/ unless --results says where).
    #[arg(long, short = 'b', default_value = FULL_BUDGET)]
    pub budget: VirtNanos,
    #[command(flatten)]
    pub common: Common,
}

fn row(name: &str, ran: &Ran) -> String {
    let s = &ran.stats;
    format!(
        "{name:<10} {:>8} {:>9} {:>10.0} {:>8.1} {:>10.1} {:>14.1} {:>9}",
        ran.summary.workers,
        ran.summary.branches_this_run,
        ran.campaign_s,
        s.root_ms as f64 / 1000.0,
        s.shrink_ms as f64 / 1000.0,
        ran.branches_per_hour(),
        ran.summary.findings.len()
    ) + &format!(" {:>14.1}", ran.branches_per_hour_searching())
}

pub fn orchestrate(args: &CoresArgs) -> Result<u8> {
    let setup = args.common.setup("cores", args.budget)?;
    let (place, machine, dir) = (setup.place, &setup.machine, &setup.dir);
    say!(
        "bench: cores: {}, {} a side: --jobs 1, then --jobs 0 ({} worker(s))",
        args.campaign.display(),
        args.budget,
        fuzzer::campaign::workers(0)
    );
    let side = |jobs: u32| {
        CampaignRun {
            label: format!("--jobs {jobs}"),
            file: &args.campaign,
            out: dir.join(format!("jobs{jobs}")),
            wall: args.budget,
            jobs,
            place,
            seed: None,
            stop_at_first_finding: false,
        }
        .run()
    };
    let one = side(1)?;
    let all = side(0)?;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut out = Lines::default();
    let mut line = |l: String| out.line(l);
    line(format!(
        "detvisor bench cores: {}, {} a side, --jobs 0 against --jobs 1",
        args.campaign.display(),
        args.budget
    ));
    line(format!("machine: {machine}"));
    line(format!(
        "{:<10} {:>8} {:>9} {:>10} {:>8} {:>10} {:>14} {:>9} {:>14}",
        "side",
        "workers",
        "branches",
        "wall (s)",
        "root (s)",
        "shrink (s)",
        "branches/h",
        "findings",
        "less shrinking"
    ));
    line(row("--jobs 1", &one));
    line(row("--jobs 0", &all));
    let whole = ratio(all.branches_per_hour(), one.branches_per_hour());
    let searching = ratio(
        all.branches_per_hour_searching(),
        one.branches_per_hour_searching(),
    );
    line(format!(
        "--jobs 0 / --jobs 1: {whole:.2}x the branches per hour ({searching:.2}x less shrinking)"
    ));
    let side_json = |ran: &Ran| {
        serde_json::json!({
            "workers": ran.summary.workers,
            "branches": ran.summary.branches_this_run,
            "wall_s": ran.campaign_s,
            "root_ms": ran.stats.root_ms,
            "branch_ms": ran.stats.branch_ms,
            "shrink_ms": ran.stats.shrink_ms,
            "branches_per_hour": ran.branches_per_hour(),
            "branches_per_hour_less_shrinking": ran.branches_per_hour_searching(),
            "findings": ran.summary.findings.len(),
        })
    };
    line(
        serde_json::json!({
            "bench": "cores",
            "campaign": args.campaign,
            "budget_s": args.budget.0 as f64 / 1e9,
            "jobs1": side_json(&one),
            "jobs0": side_json(&all),
            "ratio": whole,
            "ratio_less_shrinking": searching,
        })
        .to_string(),
    );
    args.common
        .finish(&setup, "cores", &out, is_full(args.budget, FULL_BUDGET))
}
