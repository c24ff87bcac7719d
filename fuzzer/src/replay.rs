//! `detvisor replay findings/NNNN`: a finding reproduced from a fresh
//! process: boot its run (files by digest, from the finding's directory),
//! reach the root moment by the campaign's rule, take the path's steps, and
//! compare the digest and the failure with those recorded.

use crate::failure::FailureKey;
use crate::failure_moment::FailureMoment;
use crate::findings::LoadedFinding;
use crate::judge::{Failure, Judge};
use crate::session::{apply_steps_each, boot_options, reach, SessionError};
use run::api::Request;
use run::client::{Calls, Runner, RunnerError};
use serde::Serialize;
use std::path::Path;
use vmm::VirtNanos;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// What a replay saw.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub number: u32,
    pub key: String,
    pub expected_digest: String,
    pub digest: String,
    pub exits: u64,
    pub virtual_ns: vmm::VirtNanos,
    /// The recorded failure was seen again.
    pub failed_again: bool,
    /// Same digest and the same failure: reproduced bit for bit.
    pub reproduced: bool,
    pub failures: Vec<String>,
    /// Where the failure happened in the replayed history (the first
    /// record that broke the property, see [`crate::failure_moment`]);
    /// `None` when it was not seen again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_moment: Option<FailureMoment>,
}

/// How far a replay has come, told as it goes (the caller shows it; the
/// library prints nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayProgress {
    /// The runner is ready (here, or in a helper VM started for it): the
    /// finding's run boots next.
    Booting,
    /// The root moment was reached by the campaign's rule; the path's
    /// `slices` follow (one per step, ending at its time, and the last to
    /// the path's end at `end`).
    Root {
        virtual_ns: VirtNanos,
        slices: usize,
        end: VirtNanos,
    },
    /// Slice `done` (1-based) of `total` was run: the virtual time reached,
    /// of the path's `end`.
    Slice {
        done: usize,
        total: usize,
        virtual_ns: VirtNanos,
        end: VirtNanos,
    },
    /// The history is complete: judged next.
    Judging,
}

/// Replays `finding` (read by the caller, which may have moved its files,
/// e.g. into a helper VM) on `runner`, judged by `judge`, telling
/// `progress` how far it has come.
pub fn replay_loaded(
    runner: &mut dyn Runner,
    finding: &LoadedFinding,
    judge: &dyn Judge,
    logs: Option<&Path>,
    progress: &mut dyn FnMut(ReplayProgress),
) -> Result<ReplayReport, ReplayError> {
    let file = &finding.file;
    // The phases' wall time, with RUST_LOG (see docs/campaigns.md, "Progress").
    let _replay = tracing::info_span!("replay", finding = file.number, key = %file.key).entered();
    let mut calls = Calls { runner };
    let options = boot_options(&file.spec, logs);
    progress(ReplayProgress::Booting);
    let boot_to_root = tracing::info_span!("boot_to_root").entered();
    let (run, _) = calls.start(Request::BootUp {
        prepared: finding.run.clone(),
        options,
    })?;
    calls.collect_records(run)?;
    let (root, mut records) = reach(&mut calls, run, &file.spec.root)?;
    drop(boot_to_root);
    let path = tracing::info_span!("path", steps = file.path.steps.len()).entered();
    let (end, slices) = (file.path.end_ns, file.path.steps.len() + 1);
    progress(ReplayProgress::Root {
        virtual_ns: root.virtual_ns,
        slices,
        end,
    });
    let position = apply_steps_each(
        &mut calls,
        run,
        &file.path.steps,
        end,
        &mut |done, virtual_ns| {
            progress(ReplayProgress::Slice {
                done,
                total: slices,
                virtual_ns,
                end,
            })
        },
    )?;
    records.extend(calls.take_records(run)?);
    let digest = calls.outcome(run)?.digest;
    calls.close(run)?;
    drop(path);
    progress(ReplayProgress::Judging);
    let judging = tracing::info_span!("judge", records = records.len()).entered();
    let failures: Vec<Failure> = judge.check(&[&records]);
    drop(judging);
    // The finding's own failure: its key, or the new key an old one maps to.
    let key = FailureKey::from_slug(&file.key).ok();
    let is_the_finding_s =
        |f: &&Failure| f.key.slug() == file.key || key.as_ref().is_some_and(|k| k.matches(&f.key));
    let failed_again = failures.iter().any(|f| is_the_finding_s(&f));
    let failure_moment = failures.iter().find(is_the_finding_s).map(|f| {
        crate::failure_moment::find_or_end(
            &records,
            judge,
            &f.key,
            position.exits,
            position.virtual_ns,
        )
    });
    Ok(ReplayReport {
        number: file.number,
        key: file.key.clone(),
        expected_digest: file.digest.clone(),
        reproduced: failed_again && digest == file.digest,
        digest,
        exits: position.exits,
        virtual_ns: position.virtual_ns,
        failed_again,
        failures: failures.into_iter().map(|f| f.key.slug()).collect(),
        failure_moment,
    })
}
