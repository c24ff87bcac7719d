//! `detvisor replay findings/NNNN`: a finding reproduced from a fresh
//! process: boot its run (files by digest, from the finding's directory),
//! reach the root moment by the campaign's rule, take the path's steps, and
//! compare the digest and the failure with those recorded.

use crate::engine::{apply_steps, boot_options, reach, EngineError};
use crate::findings::{self, FindingError};
use crate::judge::{Failure, Judge};
use crate::runner::{Calls, Runner};
use run::api::Request;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Finding(#[from] FindingError),
    #[error(transparent)]
    Engine(#[from] EngineError),
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
}

/// Replays the finding in `dir` on `runner`, judged by `judge`.
pub fn replay(
    runner: &mut dyn Runner,
    dir: &Path,
    judge: &dyn Judge,
    logs: Option<&Path>,
) -> Result<ReplayReport, ReplayError> {
    let finding = findings::load(dir)?;
    replay_loaded(runner, &finding, judge, logs)
}

/// As [`replay`], the finding already read (the caller may have moved its
/// files, e.g. into a helper VM).
pub fn replay_loaded(
    runner: &mut dyn Runner,
    finding: &findings::LoadedFinding,
    judge: &dyn Judge,
    logs: Option<&Path>,
) -> Result<ReplayReport, ReplayError> {
    let file = &finding.file;
    let mut calls = Calls { runner };
    let options = boot_options(&file.spec, logs);
    let (run, _) = calls
        .start(Request::BootUp {
            prepared: finding.run.clone(),
            options,
        })
        .map_err(EngineError::from)?;
    calls.collect_records(run).map_err(EngineError::from)?;
    let (_, mut records) = reach(&mut calls, run, &file.spec.root)?;
    let position = apply_steps(&mut calls, run, &file.path.steps, file.path.end_ns)?;
    records.extend(calls.take_records(run).map_err(EngineError::from)?);
    let digest = calls.outcome(run).map_err(EngineError::from)?.digest;
    calls.close(run).map_err(EngineError::from)?;
    let failures: Vec<Failure> = judge.check(&[&records]);
    let failed_again = failures.iter().any(|f| f.key == file.key);
    Ok(ReplayReport {
        number: file.number,
        key: file.key.clone(),
        expected_digest: file.digest.clone(),
        reproduced: failed_again && digest == file.digest,
        digest,
        exits: position.exits,
        virtual_ns: position.virtual_ns,
        failed_again,
        failures: failures.into_iter().map(|f| f.key).collect(),
    })
}
