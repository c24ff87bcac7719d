//! Shrinking a new finding on every worker at once (`crate::shrink_finding`),
//! on the simulated run: the same finding whatever the number of workers,
//! a finding without faults shrunk to its minimal path, and a replay that
//! fails on any worker reported.

use super::*;
use crate::shrink_finding::{shrink, Shrinking};

/// The simulated run, where a re-key with a seed ending in 7 pauses n1 and
/// kills n2 (no fault of the path says so): a failure that needs no fault,
/// only that step. With `broken`, every reset fails (a worker that cannot
/// replay).
struct BadSeeds {
    sim: Sim,
    broken: bool,
}

impl Runner for BadSeeds {
    fn call(&mut self, request: Request) -> std::result::Result<Response, String> {
        if self.broken && matches!(request, Request::Reset { .. }) {
            return Err("the reset broke".into());
        }
        let bad = match &request {
            Request::Rekey { run, seed } if seed % 10 == 7 => Some(*run),
            _ => None,
        };
        let response = self.sim.call(request)?;
        if let Some(run) = bad {
            let faults = ["at=+100ms pause n1 for=1s", "at=+200ms kill n2"];
            for fault in run::faults::parse_faults(&faults).unwrap() {
                self.sim.call(Request::InjectFault { run, fault })?;
            }
        }
        Ok(response)
    }
}

fn step(at_secs: u64, seed: u64) -> crate::step::Step {
    crate::step::Step {
        at_ns: VirtNanos::from_secs(at_secs),
        seed,
        faults: Vec::new(),
    }
}

/// Workers on `runners`, booted to the root moment: the root's records and
/// its end.
fn booted(
    runners: Vec<BadSeeds>,
    dir: &Path,
) -> (Vec<Worker<'static>>, Vec<GuestRecord>, VirtNanos) {
    let files = tempfile::tempdir().unwrap();
    let run = prepared(files.path());
    let spec = spec(1);
    let runners: Vec<Box<dyn Runner + Send>> = runners
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn Runner + Send>)
        .collect();
    let mut workers = worker::workers(runners, &spec, dir);
    let mut root = None;
    for worker in &mut workers {
        root = Some(worker.boot(&run, &spec).unwrap());
    }
    let root = root.expect("a worker");
    (workers, root.records, root.position.virtual_ns)
}

fn bad_seeds(n: usize, broken: bool) -> Vec<BadSeeds> {
    (0..n)
        .map(|_| BadSeeds {
            sim: Sim::default(),
            broken,
        })
        .collect()
}

/// A path of four steps without faults, the third (at 5 s) with a bad
/// seed: the failure shows at 5.5 s.
fn found() -> crate::step::Path {
    crate::step::Path {
        steps: vec![step(1, 1), step(3, 2), step(5, 17), step(7, 3)],
        end_ns: VirtNanos::from_secs(9),
    }
}

fn key() -> FailureKey {
    FailureKey::Command {
        name: "pause+kill".into(),
    }
}

#[test]
fn test_a_finding_without_faults_shrinks_to_its_fewest_steps_and_earliest_end() {
    let judge = FailJudge::default();
    let mut first: Option<(crate::step::Path, String, Shrinking)> = None;
    for workers in [1, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        let (mut workers_v, root_records, root_end) = booted(bad_seeds(workers, false), dir.path());
        assert_eq!(root_end, VirtNanos::from_secs(1));
        let shrunk = shrink(
            &mut workers_v,
            &judge,
            &root_records,
            root_end,
            &found(),
            &key(),
        )
        .unwrap();
        // Only the bad seed's step; ending at the failure moment.
        assert_eq!(shrunk.path.steps, vec![step(5, 17)], "{workers} workers");
        assert_eq!(shrunk.path.end_ns, VirtNanos::from_micros(5_500_000));
        assert_eq!(shrunk.position.virtual_ns, shrunk.path.end_ns);
        let failure = shrunk.failure.as_ref().expect("it fails again");
        assert_eq!(failure.key, key());
        assert_eq!(
            shrunk.shrinking,
            Shrinking {
                fault_trials: 0,
                // [0] alone, [1,2] alone, [1], [2], then none.
                step_trials: 5,
                ends_at_failure: true,
            }
        );
        assert_eq!(shrunk.stats.findings, 1);
        // The trials, the found path's replay and the last replay.
        assert!(shrunk.stats.replays >= 5 + 2, "{:?}", shrunk.stats);
        let this = (shrunk.path, shrunk.digest, shrunk.shrinking);
        match &first {
            None => first = Some(this),
            Some(one) => assert_eq!(&this, one, "{workers} workers: the same as one"),
        }
    }
}

/// A replay that fails on any worker ends the shrinking with its error,
/// the others of its batch named with it.
#[test]
fn test_a_failed_replay_on_any_worker_is_reported() {
    let judge = FailJudge::default();
    let dir = tempfile::tempdir().unwrap();
    let (mut workers, root_records, root_end) = booted(bad_seeds(2, true), dir.path());
    // Two faults: ddmin's first batch is each alone, on both workers.
    let mut found = found();
    found.steps[0].faults = run::faults::parse_faults(&[
        "at=+100ms slow n3 latency=5ms for=1s",
        "at=+200ms loss n3 0.1 for=1s",
    ])
    .unwrap();
    let error = shrink(
        &mut workers,
        &judge,
        &root_records,
        root_end,
        &found,
        &key(),
    )
    .err()
    .expect("the replays fail");
    assert_eq!(error.worker, 0);
    assert_eq!(error.others.len(), 1, "{error:?}");
    let text = run::chain(&error);
    assert!(
        text.starts_with("shrinking the finding: a replay on worker 0 (and on worker 1: ")
            && text.contains("the reset broke"),
        "{text}"
    );
}

/// A campaign that finds the pause and the kill writes the same finding
/// with one, two and four workers (batches of two: the same search), and
/// the workers that run no branch replay shrinking trials.
#[test]
fn test_every_worker_shrinks_and_the_finding_is_the_same_with_any_number() {
    let mut first: Option<findings::FindingFile> = None;
    for n in [1, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        let sims: Vec<Sim> = (0..n).map(|_| Sim::default()).collect();
        let calls: Vec<_> = sims.iter().map(|s| s.calls.clone()).collect();
        let (summary, _, rows) = campaign_with(dir.path(), 2, 12, sims);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(summary.shrinking.findings, 1);
        let file = findings::load(&findings::finding_dir(dir.path(), 1))
            .unwrap()
            .file;
        let shrinking = file.shrinking.expect("written with the finding");
        assert!(shrinking.fault_trials > 0, "{shrinking:?}");
        assert_eq!(file.path.fault_count(), 2, "{:?}", file.path);
        assert!(file.path.steps.len() <= file.found_path.steps.len());
        if n == 4 {
            // Batches of two run on workers 0 and 1; 2 and 3 reset to the
            // root only to replay trials.
            for (w, calls) in calls.iter().enumerate().skip(2) {
                let resets = calls
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|c| *c == "Reset")
                    .count();
                assert!(resets > 0, "worker {w} replayed no trial");
            }
        }
        match &first {
            None => first = Some(file),
            Some(one) => assert_eq!(&file, one, "{n} workers: the same finding as one"),
        }
    }
}
