//! `branch --seeds A..B`: many alternate histories from one moment, each in
//! its own process (one vCPU each), several at a time; or, with `--in-place`,
//! each worker restores the moment once and returns to it in memory between
//! seeds (`Session::reset_to`: cost proportional to the pages the previous
//! history dirtied).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// "1..64" (inclusive) or a single seed.
pub fn parse_seed_range(text: &str) -> Result<Vec<u64>> {
    let (first, last) = match text.split_once("..") {
        Some((a, b)) => (a.trim(), b.trim_start_matches('=').trim()),
        None => (text.trim(), text.trim()),
    };
    let first: u64 = first
        .parse()
        .with_context(|| format!("bad seed range {text:?}: {first:?} is not a number"))?;
    let last: u64 = last
        .parse()
        .with_context(|| format!("bad seed range {text:?}: {last:?} is not a number"))?;
    if last < first {
        bail!("bad seed range {text:?}: it is empty");
    }
    if last - first >= 100_000 {
        bail!("seed range {text:?} has more than 100000 seeds");
    }
    Ok((first..=last).collect())
}

#[derive(Serialize, Clone)]
struct Outcome {
    seed: u64,
    exit_status: Option<i64>,
    stop: String,
    virtual_ns: Option<u64>,
    exits: Option<u64>,
    digest: Option<String>,
    error: Option<String>,
}

fn run_one(spec: &str, seed: u64, until: Option<&str>) -> Outcome {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return failed(seed, format!("locating detvisor: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.args([
        "branch",
        spec,
        "--seed",
        &seed.to_string(),
        "--json",
        "--host-vm",
        "never",
    ]);
    if let Some(until) = until {
        cmd.args(["--until", until]);
    }
    let out = match cmd.stdin(Stdio::null()).output() {
        Ok(out) => out,
        Err(e) => return failed(seed, format!("starting the branch: {e}")),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    match summary {
        Some(s) => Outcome {
            seed,
            exit_status: s["exit_status"].as_i64(),
            stop: s["stop"]["kind"].as_str().unwrap_or("?").to_string(),
            virtual_ns: s["virtual_ns"].as_u64(),
            exits: s["exits"].as_u64(),
            digest: s["digest"].as_str().map(str::to_string),
            error: None,
        },
        None => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            failed(
                seed,
                stderr.lines().last().unwrap_or("no summary").to_string(),
            )
        }
    }
}

fn failed(seed: u64, error: String) -> Outcome {
    Outcome {
        seed,
        exit_status: None,
        stop: "error".into(),
        virtual_ns: None,
        exits: None,
        digest: None,
        error: Some(error),
    }
}

/// One in-place worker: restores `spec` once, keeps it as a checkpoint, and
/// runs one seed after another from it, resetting in between.
fn in_place_worker(
    spec: &str,
    until: Option<&str>,
    next_seed: &dyn Fn() -> Option<u64>,
    done: &dyn Fn(Outcome),
) {
    let first = next_seed();
    let Some(mut seed) = first else { return };
    let setup = || -> Result<(crate::snapshots::Driven, crate::snapshots::DrivenCheckpoint)> {
        let until = until
            .map(crate::units::parse_duration)
            .transpose()
            .context("--until")?;
        let resume = vmm::vm::ResumeConfig {
            until,
            record: vmm::record::RecordConfig::default(),
        };
        let mut restored = crate::snapshots::restore(
            spec,
            &resume,
            Box::new(std::io::sink()),
            None,
            crate::snapshots::NodeOutput::discard(),
        )?;
        if let Some(stop) = restored.stopped_early {
            bail!("the guest stopped before the branch point: {stop:?}");
        }
        let checkpoint = restored.driven.checkpoint()?;
        Ok((restored.driven, checkpoint))
    };
    let (mut driven, mut checkpoint) = match setup() {
        Ok(ready) => ready,
        Err(e) => {
            // Only this seed fails; seeds this worker would have taken go to
            // the others (or are reported as not run at the end).
            done(failed(seed, format!("{e:#}")));
            return;
        }
    };
    loop {
        driven.session.set_seed(seed);
        let run = driven.run_to_end().and_then(|stop| {
            let exit_status = driven.exit_status(stop);
            Ok((exit_status, driven.outcome(stop)?))
        });
        let outcome = match run {
            Ok((exit_status, run)) => Outcome {
                seed,
                exit_status: exit_status.map(i64::from),
                stop: stop_kind(&run.stop),
                virtual_ns: Some(run.virtual_time.0),
                exits: Some(run.exits),
                digest: Some(run.digest),
                error: None,
            },
            Err(e) => failed(seed, format!("{e:#}")),
        };
        done(outcome);
        if let Err(e) = driven.reset_to(&mut checkpoint) {
            // The next seed cannot start from the branch point here; this
            // worker stops, the others go on.
            if let Some(next) = next_seed() {
                done(failed(
                    next,
                    format!("resetting to the branch point: {e:#}"),
                ));
            }
            return;
        }
        let Some(next) = next_seed() else { return };
        seed = next;
    }
}

/// The stop's `kind` as `run --json` spells it.
fn stop_kind(stop: &vmm::exit::StopReason) -> String {
    serde_json::to_value(stop)
        .ok()
        .and_then(|v| v["kind"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

pub fn branch_seeds(
    spec: &str,
    range: &str,
    jobs: usize,
    until: Option<&str>,
    in_place: bool,
    json: bool,
) -> Result<u8> {
    let seeds = parse_seed_range(range)?;
    let jobs = if jobs == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        jobs
    }
    .min(seeds.len());
    let queue = Arc::new(Mutex::new(seeds.clone().into_iter()));
    let results = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let queue = queue.clone();
            let results = results.clone();
            scope.spawn(move || {
                let next_seed = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let done = |outcome: Outcome| {
                    results
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(outcome)
                };
                if in_place {
                    in_place_worker(spec, until, &next_seed, &done);
                } else {
                    while let Some(seed) = next_seed() {
                        done(run_one(spec, seed, until));
                    }
                }
            });
        }
    });
    let mut outcomes = results.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Seeds no worker got to (every worker stopped early).
    let left: Vec<u64> = queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_ref()
        .collect();
    for seed in left {
        outcomes.push(failed(seed, "not run: every worker stopped".into()));
    }
    outcomes.sort_by_key(|o| o.seed);
    let failures = outcomes.iter().filter(|o| o.error.is_some()).count();
    let mut digests: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o.digest.as_deref())
        .collect();
    digests.sort_unstable();
    digests.dedup();
    if json {
        #[derive(Serialize)]
        struct Report<'a> {
            spec: &'a str,
            jobs: usize,
            distinct_histories: usize,
            failures: usize,
            branches: &'a [Outcome],
        }
        println!(
            "{}",
            serde_json::to_string(&Report {
                spec,
                jobs,
                distinct_histories: digests.len(),
                failures,
                branches: &outcomes,
            })?
        );
    } else {
        println!(
            "{:>8} {:>6} {:<14} {:>16} {:>10}  DIGEST",
            "SEED", "STATUS", "STOP", "VIRTUAL TIME", "EXITS"
        );
        for o in &outcomes {
            println!(
                "{:>8} {:>6} {:<14} {:>16} {:>10}  {}",
                o.seed,
                o.exit_status.map(|s| s.to_string()).unwrap_or("-".into()),
                o.stop,
                o.virtual_ns
                    .map(|v| vmm::VirtNanos(v).to_string())
                    .unwrap_or("-".into()),
                o.exits.map(|e| e.to_string()).unwrap_or("-".into()),
                o.digest.clone().or(o.error.clone()).unwrap_or_default()
            );
        }
        println!(
            "{} branches ({} at a time): {} distinct histories, {} failed",
            outcomes.len(),
            jobs,
            digests.len(),
            failures
        );
    }
    Ok(if failures == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_seed_range_inclusive_and_single() {
        assert_eq!(parse_seed_range("1..4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_seed_range("7").unwrap(), vec![7]);
        assert_eq!(parse_seed_range("1..=2").unwrap(), vec![1, 2]);
        assert!(parse_seed_range("5..1").is_err());
        assert!(parse_seed_range("a..b").is_err());
    }
}
