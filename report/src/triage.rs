//! A report against a baseline (`fuzzer::triage`): each finding marked new,
//! known or ignored, and the baseline's entries that no finding has
//! tonight listed as possibly fixed. The classification is the baseline's
//! own (`fuzzer::triage::classify`), the one `detvisor findings --baseline`
//! prints, so the two never disagree.

use crate::model::{PossiblyFixedEntry, Report, Triage};
use fuzzer::triage::{classify, Baseline, Status};

/// Why a report could not be triaged.
#[derive(Debug, thiserror::Error)]
#[error("listing the findings of {}", dir.display())]
pub struct TriageError {
    pub dir: std::path::PathBuf,
    #[source]
    pub source: Box<fuzzer::campaign::CampaignError>,
}

/// Marks `report`'s findings by `baseline`.
pub fn apply(report: &mut Report, baseline: &Baseline) -> Result<(), TriageError> {
    let mut lines = Vec::new();
    for part in &report.campaigns {
        lines.extend(
            fuzzer::campaign::findings(&part.dir).map_err(|source| TriageError {
                dir: part.dir.clone(),
                source: Box::new(source),
            })?,
        );
    }
    let triage = classify(&lines, baseline);
    for finding in &mut report.findings {
        let failure = triage
            .failures
            .iter()
            .find(|f| f.findings.iter().any(|l| l.key == finding.key));
        finding.triage = Some(match failure {
            Some(failure) => Triage {
                status: failure.status,
                note: failure.entry.as_ref().map(|e| e.note.clone()),
            },
            // Every finding read is among the lines classified.
            None => Triage {
                status: Status::New,
                note: None,
            },
        });
    }
    report.possibly_fixed = triage
        .possibly_fixed
        .into_iter()
        .map(|p| PossiblyFixedEntry {
            key: p.key,
            note: p.entry.note,
        })
        .collect();
    Ok(())
}
