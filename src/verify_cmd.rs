//! `detvisor verify FINDING --image patched.img --seeds N`: arguments and
//! printing. The verification is the debugger library's
//! (`debugger::verify`).

use crate::PlaceArgs;
use anyhow::Result;
use clap::{ArgGroup, Args};
use debugger::budget::{Budget, Limits};
use debugger::verify::{self, Patch, SystemRun, VerifyReport, VerifyRequest, MAX_SEEDS};
use std::path::PathBuf;

/// The exit status of `detvisor verify`, said in its help.
const VERIFY_EXIT_STATUS: &str = "Seeds: at offset d (0..N-1) the boot seed is the campaign's + d and each step's seed its own + d, so offset 0 is the finding's own history (the control must reproduce its digest there). A history fails on a failure of the finding's kind: the same property or command, or the same checker on any key.

Exit status: 0 verified (the unpatched control failed at least once, the patched system never), 1 not verified, 2 on an error (bad input, a run that failed).";

#[derive(Args, Debug)]
#[command(after_help = VERIFY_EXIT_STATUS)]
#[command(group(ArgGroup::new("patch").required(true).args(["image", "manifest"])))]
pub struct VerifyArgs {
    /// A finding's directory (DIR/findings/NNNN), wherever it was copied.
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
    let report = verify::verify(&request, &mut budget)?;
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
