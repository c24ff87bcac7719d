//! `detvisor verify FINDING --image patched.img --seeds N`: arguments and
//! printing. The verification is the debugger library's
//! (`debugger::verify`).

use crate::progress::{Mode, Reporter};
use crate::PlaceArgs;
use anyhow::Result;
use clap::{ArgGroup, Args};
use debugger::budget::{Budget, Limits};
use debugger::verify::{self, Patch, SeedRow, SystemRun, VerifyReport, VerifyRequest, MAX_SEEDS};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The exit status of `detvisor verify`, said in its help.
const VERIFY_EXIT_STATUS: &str = "Seeds: at offset d (0..N-1) the boot seed is the campaign's + d and each step's seed its own + d, so offset 0 is the finding's own history (the control must reproduce its digest there). A history fails on a failure of the finding's kind: the same property or command, or the same checker on any key.

Exit status: 0 verified (the unpatched control failed at least once, the patched system never), 1 not verified, 2 on an error (bad input, a run that failed).";

#[derive(Args, Debug)]
#[command(after_help = VERIFY_EXIT_STATUS)]
#[command(group(ArgGroup::new("patch").required(true).args(["image", "manifest"])))]
pub struct VerifyArgs {
    /// A finding's directory (DIR/findings/NNNN, wherever it was copied), or
    /// a campaign's directory holding one finding.
    finding: PathBuf,
    /// The patched node image: it replaces every node image of the finding's
    /// manifest (and the workload's own node's, when it is the same file).
    #[arg(long, value_name = "FILE")]
    image: Option<PathBuf>,
    /// The patched system's manifest, its nodes named as the finding's.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Histories per system, the finding's own (offset 0) included.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SEEDS)))]
    seeds: u32,
    /// Workers (0: one per core, at most 64), each running both systems:
    /// through the helper VM, two helper VMs a worker.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=64))]
    jobs: u32,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Show no progress (no display, no lines on stderr; errors still).
    /// Without it, a terminal gets a live display (seed offsets done, the
    /// failures so far, ETA) and anything else a line per seed offset.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    place: PlaceArgs,
}

pub fn cmd_verify(args: VerifyArgs) -> Result<u8> {
    let patch = match (args.image, args.manifest) {
        (Some(image), _) => Patch::Image(image),
        (None, Some(manifest)) => Patch::Manifest(manifest),
        (None, None) => unreachable!("clap requires --image or --manifest"),
    };
    let request = VerifyRequest {
        finding: args.finding,
        patch,
        seeds: args.seeds,
        jobs: args.jobs,
        place: args.place.campaign(),
    };
    let mut budget = Budget::new(Limits::default(), None);
    let mut reporter = Reporter::new(Mode::detect(args.quiet));
    reporter.start(Some(u64::from(args.seeds)), 0, true);
    // Seed offsets done, and of those the control's and the patched
    // system's failures.
    let counts = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let progress = |row: &SeedRow| {
        let done = counts[0].fetch_add(1, Ordering::Relaxed) + 1;
        let control = counts[1].fetch_add(u64::from(row.control.failed), Ordering::Relaxed)
            + u64::from(row.control.failed);
        let patched = counts[2].fetch_add(u64::from(row.patched.failed), Ordering::Relaxed)
            + u64::from(row.patched.failed);
        reporter.update(
            done,
            format!("seed offsets · unpatched control failed {control} · patched failed {patched}"),
        );
        reporter.event(&format!(
            "detvisor: seed offset {}: unpatched control {}, patched {}",
            row.seeds.offset,
            if row.control.failed { "FAIL" } else { "pass" },
            if row.patched.failed { "FAIL" } else { "pass" },
        ));
    };
    let report = verify::verify(&request, &mut budget, &progress);
    reporter.finish();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(if report.comparison.verified { 0 } else { 1 })
}

/// `FAIL` or `pass`, the virtual time reached and the digest's start.
fn cell(run: &SystemRun) -> String {
    format!(
        "{:<4} {:>9} {:.12}{}",
        if run.failed { "FAIL" } else { "pass" },
        run.virtual_ns.to_string(),
        run.digest,
        run.stopped
            .as_ref()
            .map(|stop| format!(" (stopped: {stop})"))
            .unwrap_or_default()
    )
}

/// The table people read: a row per seed offset, the control's check, the
/// verdict.
fn table(report: &VerifyReport) -> String {
    let c = &report.comparison;
    let mut out = format!(
        "finding {} ({}), patch: {}, {} seed{} on {} worker{}\n",
        c.finding.display(),
        c.key,
        c.patch,
        c.seeds.len(),
        if c.seeds.len() == 1 { "" } else { "s" },
        c.workers,
        if c.workers == 1 { "" } else { "s" },
    );
    out.push_str(&format!(
        "{:>6}  {:>20}  {:<32}  {:<32}  step seeds\n",
        "offset", "boot seed", "unpatched control", "patched"
    ));
    for row in &c.seeds {
        let steps: Vec<String> = row.seeds.steps.iter().map(u64::to_string).collect();
        out.push_str(&format!(
            "{:>6}  {:>20}  {:<32}  {:<32}  {}\n",
            row.seeds.offset,
            row.seeds.boot,
            cell(&row.control),
            cell(&row.patched),
            if steps.is_empty() {
                "-".into()
            } else {
                steps.join(",")
            }
        ));
    }
    let check = &c.control_check;
    out.push_str(&format!(
        "control at offset 0: digest {} {} finding.json's {} ({})\n",
        check.digest,
        if check.digest == check.expected_digest {
            "="
        } else {
            "!="
        },
        check.expected_digest,
        if check.reproduced {
            "reproduced"
        } else {
            "NOT reproduced"
        }
    ));
    out.push_str(&c.verdict);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<VerifyArgs, clap::Error> {
        let mut argv = vec!["detvisor", "verify"];
        argv.extend_from_slice(args);
        let crate::Command::Verify(args) = crate::Cli::try_parse_from(argv)?.command else {
            panic!("a verify");
        };
        Ok(args)
    }

    fn run(failed: bool, digest: &str) -> SystemRun {
        SystemRun {
            failed,
            failures: Vec::new(),
            digest: digest.into(),
            exits: 10,
            virtual_ns: vmm::VirtNanos(30_000_000_000),
            stopped: None,
        }
    }

    #[test]
    fn test_the_table_has_a_row_per_seed_the_control_check_and_the_verdict() {
        use debugger::budget::{Spent, Usage};
        use debugger::verify::{Comparison, ControlCheck, Rate, SeedChoice};
        let check = ControlCheck {
            expected_digest: "c0".repeat(16),
            digest: "c0".repeat(16),
            reproduced: true,
        };
        let (control, patched) = (Rate::wilson(1, 2), Rate::wilson(0, 2));
        let (verified, verdict) = verify::verdict(&check, &control, &patched);
        let row = |offset, control_failed| verify::SeedRow {
            seeds: SeedChoice {
                offset,
                boot: 1 + u64::from(offset),
                steps: vec![5 + u64::from(offset)],
            },
            control: run(control_failed, &"c0".repeat(16)),
            patched: run(false, &"9a".repeat(16)),
        };
        let report = VerifyReport {
            comparison: Comparison {
                finding: "/n/findings/0001".into(),
                key: "checker:linearizability:k1".into(),
                patch: Patch::Image("p.img".into()),
                manifest: "/n/m.toml".into(),
                workers: 1,
                seeds: vec![row(0, true), row(1, false)],
                control_check: check,
                control,
                patched,
                verified,
                verdict,
            },
            spent: Spent {
                call: Usage::default(),
                session: Usage::default(),
                left: Usage::default(),
                shared: Vec::new(),
            },
        };
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(
            lines[0].contains("patch: image p.img, 2 seeds on 1 worker"),
            "{text}"
        );
        assert!(
            lines[2].contains("FAIL       30s c0c0c0c0c0c0")
                && lines[2].contains("pass       30s 9a9a9a9a9a9a")
                && lines[2].ends_with("  5"),
            "{text}"
        );
        assert!(lines[3].trim_start().starts_with("1 "), "{text}");
        assert!(lines[4].ends_with("(reproduced)"), "{text}");
        assert!(
            lines[5].starts_with("verified: patched failed 0/2"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["verified"], true);
        assert_eq!(json["seeds"][1]["seeds"]["boot"], 2);
        assert_eq!(json["spent"]["call"]["branches_created"], 0);
    }

    #[test]
    fn test_verify_needs_one_patch_and_at_least_one_seed() {
        let args = parse(&["f", "--image", "p.img", "--seeds", "2", "--jobs", "0"]).unwrap();
        assert_eq!(
            (args.image, args.seeds, args.jobs),
            (Some("p.img".into()), 2, 0)
        );
        assert_eq!(parse(&["f", "--manifest", "m.toml"]).unwrap().seeds, 32);
        assert!(parse(&["f"]).is_err(), "a patch is required");
        assert!(parse(&["f", "--image", "a", "--manifest", "b"]).is_err());
        assert!(parse(&["f", "--image", "a", "--seeds", "0"]).is_err());
    }
}
