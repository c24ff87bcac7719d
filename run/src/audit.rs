//! The determinism audit: one configuration run several times, every exit
//! compared, and the first place two runs differ named.

use crate::outcome::stepped_note;
use crate::plain::GuestSpec;
use serde::{Deserialize, Serialize};
use vmm::exit::Perturbation;
use vmm::record::{first_divergence, Divergence, RecordConfig};
use vmm::vm::{DigestParts, RunOutcome};

/// How an audit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditOptions {
    /// How many runs to compare (at least 2).
    pub runs: u32,
    /// Hash guest memory every N exits (0: only at the end).
    pub memory_every: u64,
    /// Hash device state every N exits (0: only at the end).
    pub devices_every: u64,
    /// Testing the audit itself: in run `.0` (1-based) flip a bit of the
    /// first value the guest reads at or after exit `.1`.
    pub perturb: Option<(u32, u64)>,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            runs: 3,
            memory_every: 0,
            devices_every: 4096,
            perturb: None,
        }
    }
}

/// What an audit found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditSummary {
    pub identical: bool,
    pub runs: u32,
    pub exits: Vec<u64>,
    pub digests: Vec<String>,
    pub divergence: Option<String>,
}

impl AuditSummary {
    /// The audit's verdict for people: `identical: ...` or `DIVERGED: ...`.
    pub fn verdict(&self) -> String {
        if self.identical {
            format!(
                "identical: {} runs, {} exits each, digest {}",
                self.runs,
                self.exits.first().copied().unwrap_or(0),
                self.digests.first().map(String::as_str).unwrap_or("")
            )
        } else {
            format!("DIVERGED: {}", self.divergence.as_deref().unwrap_or(""))
        }
    }
}

/// Why an audit could not run.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("an audit needs at least 2 runs to compare anything")]
    TooFewRuns,
    /// The guest's configuration.
    #[error(transparent)]
    Guest(#[from] crate::plain::PlainError),
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
}

/// Runs `spec` `options.runs` times with the console discarded, comparing
/// each run with the first; stops at the first divergence. `progress` gets
/// one line per run.
pub fn audit(
    spec: &GuestSpec,
    options: &AuditOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<AuditSummary, AuditError> {
    if options.runs < 2 {
        return Err(AuditError::TooFewRuns);
    }
    let record = RecordConfig {
        keep_records: true,
        device_state_every: options.devices_every,
        memory_every: options.memory_every,
    };
    let base = spec.vm_config(record)?;
    let mut first: Option<RunOutcome> = None;
    let mut summary = AuditSummary {
        identical: true,
        runs: options.runs,
        exits: Vec::new(),
        digests: Vec::new(),
        divergence: None,
    };
    for run in 1..=options.runs {
        let mut config = base.clone();
        if let Some((perturbed_run, at_exit)) = options.perturb {
            if perturbed_run == run {
                config.perturbation = Some(Perturbation { at_exit });
            }
        }
        let outcome = vmm::vm::run(&config, Box::new(std::io::sink()), None)?;
        progress(&format!(
            "detvisor audit: run {run}/{}: {} exits, virtual {}, digest {}{}",
            options.runs,
            outcome.exits,
            outcome.virtual_time,
            outcome.digest,
            stepped_note(&outcome)
        ));
        summary.exits.push(outcome.exits);
        summary.digests.push(outcome.digest.clone());
        match &first {
            None => first = Some(outcome),
            Some(reference) => {
                if let Some(text) = compare_runs(reference, &outcome, run) {
                    summary.identical = false;
                    summary.divergence = Some(text);
                    break;
                }
            }
        }
    }
    Ok(summary)
}

/// How run `run` differs from the reference run 1, if it does: the first
/// differing exit, or else which part of the final state differs.
pub fn compare_runs(reference: &RunOutcome, outcome: &RunOutcome, run: u32) -> Option<String> {
    match first_divergence(&reference.records, &outcome.records) {
        Some(divergence) => Some(divergence_text(&divergence, run)),
        None => final_state_text(
            (&reference.digest, &reference.digest_parts),
            (&outcome.digest, &outcome.digest_parts),
            run,
        ),
    }
}

/// The first place run `run`'s exits differ from run 1's, for people.
pub fn divergence_text(divergence: &Divergence, run: u32) -> String {
    match divergence {
        Divergence::Record {
            position,
            left,
            right,
        } => format!(
            "runs 1 and {run} diverge at exit {position}:\n  run 1: {left}\n  run {run}: {right}"
        ),
        Divergence::Length { left, right, next } => format!(
            "runs 1 and {run} diverge in length: {left} vs {right} exits; first extra: {}",
            next.map(|r| r.to_string()).unwrap_or_default()
        ),
    }
}

/// Which part of the final state (memory, devices, console) differs
/// between two runs whose exits are equal, if the digests differ.
/// Each side is a run's digest and its parts.
pub fn final_state_text(
    (reference, a): (&str, &DigestParts),
    (digest, b): (&str, &DigestParts),
    run: u32,
) -> Option<String> {
    if reference == digest {
        return None;
    }
    let differing: Vec<&str> = [
        ("memory", a.memory != b.memory),
        ("devices", a.devices != b.devices),
        ("console", a.console != b.console),
    ]
    .iter()
    .filter(|(_, differs)| *differs)
    .map(|(name, _)| *name)
    .collect();
    Some(format!(
        "runs 1 and {run} have equal exits but different final state (digest {} vs {}): {} differ",
        reference,
        digest,
        differing.join(", ")
    ))
}
