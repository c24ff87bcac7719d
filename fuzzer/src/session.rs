//! A campaign's run taken through its moments, the same way by a worker of
//! the search and by a replay in a fresh process: booted with the
//! campaign's options, run to its root moment by the campaign's rule, then
//! along a path's steps (each: run to its time, re-key, add its faults).

use crate::spec::{CampaignSpec, RootRule, ROOT_POLL};
use crate::step::Step;
use run::api::{Position, RunId, Until};
use run::client::{Calls, RunnerError};
use run::records::{GuestRecord, RecordBody};
use run::up::{UpEvent, UpOptions};
use std::path::Path;
use vmm::VirtNanos;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("the run stopped ({stop}) at {at} before its root moment ({rule})")]
    StoppedBeforeRoot {
        stop: String,
        at: VirtNanos,
        rule: String,
    },
    #[error("the system under test did not report setup_complete within {wait} of virtual time")]
    NoSetupComplete { wait: VirtNanos },
}

type Result<T, E = SessionError> = std::result::Result<T, E>;

/// Options for booting a campaign's run (the campaign's, or a replay's
/// with node logs): quiet, held, seeded by the campaign.
pub fn boot_options(spec: &CampaignSpec, logs: Option<&Path>) -> UpOptions {
    UpOptions {
        logs: logs.map(Path::to_path_buf),
        ..UpOptions::new(spec.seed)
    }
}

/// Runs `run` to its root moment; the records of the way there.
pub fn reach(
    calls: &mut Calls<'_>,
    run: RunId,
    rule: &RootRule,
) -> Result<(Position, Vec<GuestRecord>)> {
    let stopped = |position: &Position| SessionError::StoppedBeforeRoot {
        stop: format!("{:?}", position.stop),
        at: position.virtual_ns,
        rule: format!("{rule:?}"),
    };
    match *rule {
        RootRule::At { at_ns } => {
            let position = calls.run_until(run, Until::Time(at_ns))?;
            if position.stop.is_some() {
                return Err(stopped(&position));
            }
            Ok((position, calls.take_records(run)?))
        }
        RootRule::SetupComplete { wait_ns } => {
            let mut records = Vec::new();
            let mut at = VirtNanos::ZERO;
            loop {
                at = at + ROOT_POLL;
                let position = calls.run_until(run, Until::Time(at))?;
                let taken = calls.take_records(run)?;
                let done = taken.iter().any(|r| {
                    matches!(
                        r.body,
                        RecordBody::Event {
                            event: UpEvent::SetupComplete
                        }
                    )
                });
                records.extend(taken);
                if done {
                    // The root's stretch keeps its output capped as one.
                    run::records::cap_output(&mut records, run::records::OUTPUT_CAP_BYTES);
                    return Ok((position, records));
                }
                if position.stop.is_some() {
                    return Err(stopped(&position));
                }
                if at >= wait_ns {
                    return Err(SessionError::NoSetupComplete { wait: wait_ns });
                }
            }
        }
    }
}

/// Takes `steps` from the present (each: run to its time, re-key, add its
/// faults), then runs to `end_ns`.
pub fn apply_steps(
    calls: &mut Calls<'_>,
    run: RunId,
    steps: &[Step],
    end_ns: VirtNanos,
) -> Result<Position> {
    apply_steps_each(calls, run, steps, end_ns, &mut |_, _| {})
}

/// [`apply_steps`], calling `reached` with each slice of the path run
/// (1-based: slice `i` of `steps.len() + 1` ends at step `i`'s time, the
/// last at `end_ns`) and the virtual time reached: for a caller that shows
/// how far it has come. A guest that stops early ends the slices there.
pub fn apply_steps_each(
    calls: &mut Calls<'_>,
    run: RunId,
    steps: &[Step],
    end_ns: VirtNanos,
    reached: &mut dyn FnMut(usize, VirtNanos),
) -> Result<Position> {
    for (index, step) in steps.iter().enumerate() {
        let position = calls.run_until(run, Until::Time(step.at_ns))?;
        if position.stop.is_some() {
            return Ok(position);
        }
        reached(index + 1, position.virtual_ns);
        calls.rekey(run, step.seed)?;
        for fault in &step.faults {
            // `at=+` counts from the run's present, the branch point.
            calls.inject(run, fault.clone())?;
        }
    }
    let position = calls.run_until(run, Until::Time(end_ns))?;
    reached(steps.len() + 1, position.virtual_ns);
    Ok(position)
}
