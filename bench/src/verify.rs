//! `detvisor bench verify FINDING --image patched.img [--seeds 32]`: issue 28's target
//! "`verify` over 32 seeds with `--jobs 0` against `--jobs 1`". The same verification
//! (`debugger::verify::verify`, as `detvisor verify` runs it) twice in one run, one worker then
//! a worker per core, side by side: the wall time of each, seeds per minute, the speed-up, and
//! whether both gave the same rows (every seed's digests and verdicts: the workers must not
//! change a history).
//!
//! Unlike the other benches this one has no worker of its own: the verification places its
//! runs itself (here, or a helper VM per runner, as `--host-vm` says).

use crate::say;
use anyhow::{bail, Result};
use clap::Args;
use debugger::budget::{Budget, Limits};
use debugger::verify::{self, Patch, SeedRow, VerifyReport, VerifyRequest};
use helper_vm::HostVmMode;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct VerifyBenchArgs {
    /// A finding's directory (DIR/findings/NNNN).
    pub finding: PathBuf,
    /// The patched node image (as `detvisor verify --image`).
    #[arg(long, value_name = "FILE", conflicts_with = "manifest")]
    pub image: Option<PathBuf>,
    /// The patched system's manifest (as `detvisor verify --manifest`).
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Seeds per verification.
    #[arg(long, default_value_t = 32)]
    pub seeds: u32,
    /// Workers of the parallel side (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub jobs: u32,
    /// Where the runs happen.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
}

/// One side: its workers, its wall time and its report.
struct Side {
    workers: u32,
    seconds: f64,
    report: VerifyReport,
}

fn side(args: &VerifyBenchArgs, patch: &Patch, jobs: u32) -> Result<Side> {
    let request = VerifyRequest {
        finding: args.finding.clone(),
        patch: patch.clone(),
        seeds: args.seeds,
        jobs,
        place: fuzzer::campaign::Place {
            host_vm: args.host_vm,
            seccomp: true,
        },
    };
    let mut budget = Budget::new(Limits::default(), None);
    let started = Instant::now();
    let progress = |row: &SeedRow| {
        say!(
            "bench: --jobs {jobs}: seed offset {} done ({:.0} s)",
            row.seeds.offset,
            started.elapsed().as_secs_f64()
        )
    };
    let report = verify::verify(&request, &mut budget, &progress)?;
    Ok(Side {
        workers: report.comparison.workers,
        seconds: started.elapsed().as_secs_f64(),
        report,
    })
}

pub fn orchestrate(args: &VerifyBenchArgs) -> Result<u8> {
    let patch = match (&args.image, &args.manifest) {
        (Some(image), _) => Patch::Image(image.clone()),
        (None, Some(manifest)) => Patch::Manifest(manifest.clone()),
        (None, None) => bail!("give the patch: --image FILE or --manifest FILE"),
    };
    say!(
        "bench: verify {} ({patch}), {} seeds: --jobs 1, then --jobs {}",
        args.finding.display(),
        args.seeds,
        args.jobs
    );
    let one = side(args, &patch, 1)?;
    let many = side(args, &patch, args.jobs)?;
    let same_rows = one.report.comparison.seeds == many.report.comparison.seeds;
    let speedup = one.seconds / many.seconds;
    let per_minute = |s: &Side| f64::from(args.seeds) * 60.0 / s.seconds;
    println!(
        "detvisor bench verify: {} ({patch}), {} seeds, both systems",
        args.finding.display(),
        args.seeds
    );
    println!(
        "{:>8}  {:>10}  {:>12}  verdict",
        "workers", "wall (s)", "seeds/min"
    );
    for s in [&one, &many] {
        println!(
            "{:>8}  {:>10.1}  {:>12.2}  {}",
            s.workers,
            s.seconds,
            per_minute(s),
            s.report.comparison.verdict
        );
    }
    println!(
        "--jobs {} / --jobs 1: {speedup:.2}x faster; the same rows (digests, verdicts) on both sides: {}",
        args.jobs,
        if same_rows { "yes" } else { "NO" }
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "verify",
            "seeds": args.seeds,
            "one": {"workers": one.workers, "wall_s": one.seconds},
            "many": {"workers": many.workers, "wall_s": many.seconds},
            "speedup": speedup,
            "same_rows": same_rows,
            "verified": many.report.comparison.verified,
        })
    );
    Ok(if same_rows { 0 } else { 1 })
}
