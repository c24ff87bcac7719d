//! `detvisor likelihood FINDING`: when the finding's failure became likely
//! (the debugger library's `likelihood`), printed, as JSON, and as an SVG
//! plot.

use crate::PlaceArgs;
use anyhow::{Context, Result};
use clap::Args;
use debugger::budget::Limits;
use debugger::likelihood::{self, Likelihood, LikelihoodOptions, PointEstimate};
use std::path::PathBuf;
use vmm::VirtNanos;

/// P(failure) against virtual time along a finding's history: branches
/// with new seeds (and faults from the campaign's profile) from points
/// between its root and its failure, with 95% intervals (see
/// docs/debugging.md).
#[derive(Args, Debug)]
pub struct LikelihoodArgs {
    /// A finding's directory (DIR/findings/NNNN), or a campaign directory
    /// holding one finding.
    finding: PathBuf,
    /// Points from the root moment to just before the failure, evenly
    /// spaced.
    #[arg(long, default_value_t = 12)]
    points: u32,
    /// Branches from each point.
    #[arg(long, default_value_t = 16)]
    branches: u32,
    /// The base of the branches' seeds (default: the campaign's seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Workers, each its own run (0: one per core); at most one per point.
    #[arg(long, default_value_t = 1)]
    jobs: u32,
    /// Write the plot here, as SVG.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Virtual time the branches may run in all (default: the debugger's
    /// call budget, 1h).
    #[arg(long, value_name = "DURATION")]
    max_virtual: Option<VirtNanos>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    place: PlaceArgs,
}

pub fn cmd_likelihood(args: LikelihoodArgs) -> Result<u8> {
    let mut limits = Limits::default();
    if let Some(max) = args.max_virtual {
        limits.call_virtual = max;
        limits.session_virtual = limits.session_virtual.max(max);
    }
    let options = LikelihoodOptions {
        points: args.points,
        branches: args.branches,
        seed: args.seed,
        limits,
    };
    let workers = fuzzer::campaign::workers(args.jobs);
    let points = args.points;
    let progress = |index: usize, point: &PointEstimate| {
        eprintln!(
            "detvisor: point {}/{points} at {}: {}/{} failed, P {:.3} [{:.3}, {:.3}]",
            index + 1,
            point.virtual_ns,
            point.failures,
            point.branches,
            point.p,
            point.low,
            point.high
        );
    };
    let result = likelihood::likelihood(
        &args.finding,
        &options,
        args.place.campaign(),
        workers,
        &progress,
    )?;
    if let Some(path) = &args.svg {
        let svg = likelihood::svg(&result)?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print_table(&result);
    }
    Ok(0)
}

fn print_table(result: &Likelihood) {
    println!(
        "{} ({}): failure at {}, root at {}, branches to {} at most, seeds from {}",
        result.finding.display(),
        result.key,
        result.failure_ns,
        result.root_ns,
        result.end_ns,
        result.seed
    );
    println!(
        "{:>14}  {:>8}  {:>6}  {:>16}  moment",
        "time", "failed", "P", "95% interval"
    );
    for point in &result.points {
        println!(
            "{:>14}  {:>8}  {:>6.3}  {:>16}  {}",
            point.virtual_ns.to_string(),
            format!("{}/{}", point.failures, point.branches),
            point.p,
            format!("[{:.3}, {:.3}]", point.low, point.high),
            point.moment
        );
    }
    println!(
        "used: {} of virtual time, {} branches",
        result.used.virtual_time, result.used.branches_created
    );
}
