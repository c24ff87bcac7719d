//! The `detvisor soak` command: a determinism soak of a plain run (`soak
//! boot`) or a multi-node run (`soak up MANIFEST`), many runs with one seed
//! in one helper VM, every run compared with a stored reference, results in
//! a directory that a later invocation resumes (see run::soak and
//! docs/determinism.md).

use crate::up_cmd::UpRunArgs;
use crate::{GuestArgs, RunPlaceArgs, Stdin};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use run::client::Calls;
use run::soak::{SoakIdentity, SoakReport, SoakRequest, SoakTarget};
use run::up::UpOptions;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SoakArgs {
    #[command(subcommand)]
    target: SoakCommand,
}

#[derive(Subcommand, Debug)]
enum SoakCommand {
    /// Soak a plain run (the guest `run` and `audit` boot).
    Boot {
        #[command(flatten)]
        soak: SoakOptions,
        #[command(flatten)]
        guest: GuestArgs,
    },
    /// Soak a multi-node run from a manifest (as `up`), faults and all.
    Up {
        #[command(flatten)]
        soak: SoakOptions,
        #[command(flatten)]
        up: UpRunArgs,
    },
}

/// What every soak takes.
#[derive(Args, Debug)]
struct SoakOptions {
    /// Runs in all (the first is the reference); a soak with fewer done resumes.
    #[arg(long, default_value_t = 100)]
    runs: u32,
    /// The scenario's name (default: `boot`, or the manifest's file stem).
    #[arg(long)]
    name: Option<String>,
    /// The results directory (default: ~/.cache/detvisor/soak/NAME).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    perturb: crate::PerturbArgs,
}

pub fn cmd_soak(args: SoakArgs) -> Result<u8> {
    match args.target {
        SoakCommand::Boot { soak, guest } => {
            if guest.command.is_empty() {
                bail!("a soak's runs must end: give the command to run after --");
            }
            let target = SoakTarget::Boot(crate::guest_spec(&guest)?);
            soak_target(soak, "boot".into(), guest.seed, target, guest.place)
        }
        SoakCommand::Up { soak, up } => {
            let until = up.until;
            if until.is_none() {
                bail!("a soak's runs must end: give --until");
            }
            let prepared = up.prepare()?;
            let options = UpOptions {
                until,
                exit_path: up.exit_path,
                ..UpOptions::new(up.seed)
            };
            let name = up
                .manifest
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "up".into());
            let target = SoakTarget::Up {
                prepared: Box::new(prepared),
                options,
            };
            soak_target(soak, name, up.seed, target, up.place)
        }
    }
}

fn soak_target(
    soak: SoakOptions,
    default_name: String,
    seed: u64,
    target: SoakTarget,
    place: RunPlaceArgs,
) -> Result<u8> {
    if soak.runs < 2 {
        bail!("--runs must be at least 2 to compare anything");
    }
    let name = soak.name.unwrap_or(default_name);
    let dir = match soak.out {
        Some(dir) => dir,
        None => run::guest::cache_root().join("soak").join(&name),
    };
    let identity = SoakIdentity {
        scenario: name,
        seed,
        config: run::soak::fingerprint(&target)?,
        build: run::soak::executable_id()?,
        perturb: soak.perturb.perturb(),
    };
    // Another soak's directory is refused before any VM starts.
    let before = run::soak::status(&dir, &identity, soak.runs)?;
    if before.missing().is_empty() {
        eprintln!(
            "detvisor soak: {}: all {} runs done already",
            dir.display(),
            soak.runs
        );
        return print(&before, soak.json);
    }
    if before.done() > 0 {
        eprintln!(
            "detvisor soak: {}: resuming, {} of {} runs done",
            dir.display(),
            before.done(),
            soak.runs
        );
    }
    let request = SoakRequest {
        target,
        identity,
        dir,
        runs: soak.runs,
    };
    let mut runner = place.runner(Stdin::None);
    let report = Calls::new(&mut runner)
        .soak(request)
        .map_err(crate::failed)?;
    print(&report, soak.json)
}

/// The report: the verdict line (and the first divergence) on stdout, or
/// JSON; exit status 1 if any run diverged, 2 if runs are missing.
fn print(report: &SoakReport, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", report.verdict());
        if let Some(first) = report.first_divergence() {
            println!(
                "first divergence: run {}: {}",
                first.run,
                first.divergence.as_deref().unwrap_or("")
            );
        }
        println!("results: {}", report.dir.display());
    }
    Ok(if report.diverged() > 0 {
        1
    } else if !report.missing().is_empty() {
        2
    } else {
        0
    })
}
