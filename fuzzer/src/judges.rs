//! The campaign's judge and fault source, from its spec: the property tally
//! over the SDK records and test-composer commands, and the linearizability
//! checker on the recorded history; the fault profile of `[faults]`.

use crate::engine::FaultSource;
use crate::failure::FailureKey;
use crate::judge::{Failure, Judge, Verdict};
use crate::linearizability::{self, check_kv, parse_history_values, render_html};
use crate::profile::FaultProfile;
use crate::properties::{self, sdk_observations, Observation, PropertyTally, StretchId};
use crate::spec::{CampaignSpec, HistoryChecker};
use run::records::{GuestRecord, RecordBody};
use run::up::{PreparedUp, UpEvent};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use vmm::VirtNanos;

/// Why a campaign's judge or profile could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JudgesError {
    #[error("the campaign's fault profile")]
    Profile(#[source] crate::profile::ProfileError),
}

/// How long the checker may search one history before it says "unknown".
pub const CHECK_DEADLINE: Duration = Duration::from_secs(60);

/// The campaign's judge: properties and the history checker.
pub struct CampaignJudge {
    tally: PropertyTally,
    checker: HistoryChecker,
    /// How many stretches had each combination of fault kinds (see
    /// [`fault_combination`]): a rare combination scores as news.
    combinations: BTreeMap<String, u64>,
}

/// What [`CampaignJudge::save`] keeps (and `load` reads back, owned).
#[derive(Serialize)]
struct SavedJudge<'a> {
    tally: &'a PropertyTally,
    fault_combinations: &'a BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct LoadedJudge {
    tally: PropertyTally,
    fault_combinations: BTreeMap<String, u64>,
}

/// The kinds of the faults that began in a stretch, sorted and joined with
/// `+` (`""`: none began).
fn fault_combination(records: &[GuestRecord]) -> String {
    let kinds: BTreeSet<&str> = records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::Event {
                event: UpEvent::Fault { action },
            } => action.kind(),
            _ => None,
        })
        .collect();
    kinds.into_iter().collect::<Vec<_>>().join("+")
}

pub fn campaign_judge(spec: &CampaignSpec) -> Result<Box<dyn Judge>, JudgesError> {
    Ok(Box::new(CampaignJudge {
        tally: PropertyTally::new(),
        checker: spec.checker,
        combinations: BTreeMap::new(),
    }))
}

/// What a stretch shows about the properties: its SDK records and the
/// test-composer commands that ended in it.
fn observations(records: &[GuestRecord]) -> Vec<Observation> {
    let (mut observations, _malformed) = sdk_observations(records);
    // A command the composer killed has no exit here: no verdict on it.
    for record in records {
        if let RecordBody::Event {
            event: UpEvent::CommandExited {
                command, status, ..
            },
        } = &record.body
        {
            observations.push(Observation::CommandExited {
                command: command.clone(),
                status: status.shell_code(),
            });
        }
    }
    observations
}

fn from_property(failure: properties::Failure) -> Failure {
    Failure {
        summary: format!(
            "{} ({}) failed: {}",
            failure.key, failure.property, failure.message
        ),
        key: failure.key,
        details: serde_json::json!({
            "property": failure.property,
            "message": failure.message,
            "details": failure.details,
        }),
        artifacts: Vec::new(),
    }
}

impl CampaignJudge {
    /// The checker's failure on the history of `path`, if any.
    fn check_history(&self, path: &[&[GuestRecord]]) -> Option<Failure> {
        if self.checker == HistoryChecker::None {
            return None;
        }
        let events: Vec<serde_json::Value> = path
            .iter()
            .flat_map(|s| s.iter())
            .filter_map(|r| match &r.body {
                RecordBody::History { json } => Some(json.clone()),
                _ => None,
            })
            .collect();
        if events.is_empty() {
            return None;
        }
        let history = match parse_history_values(&events) {
            Ok(history) => history,
            Err(e) => {
                let key = FailureKey::Checker {
                    checker: "history".into(),
                    key: "malformed".into(),
                };
                return Some(Failure {
                    summary: format!("{key}: the recorded history is malformed: {e}"),
                    key,
                    details: serde_json::json!({ "error": e.to_string() }),
                    artifacts: Vec::new(),
                });
            }
        };
        let report = check_kv(&history, Some(CHECK_DEADLINE));
        let linearizability::Verdict::Illegal(violation) = &report.verdict else {
            return None;
        };
        let key = FailureKey::Checker {
            checker: "linearizability".into(),
            key: violation.key.clone(),
        };
        Some(Failure {
            summary: format!(
                "{key}: not linearizable ({} of {} operations on the key show it)",
                violation.operations.len(),
                violation.partition_operations
            ),
            key,
            details: serde_json::to_value(&report).expect("reports serialize"),
            artifacts: vec![
                ("history.jsonl".into(), history.to_jsonl().into_bytes()),
                ("checker.html".into(), render_html(&report).into_bytes()),
                (
                    "checker.json".into(),
                    serde_json::to_vec_pretty(&report).expect("reports serialize"),
                ),
            ],
        })
    }
}

impl Judge for CampaignJudge {
    fn judge(&mut self, path: &[&[GuestRecord]]) -> Verdict {
        let stretch = StretchId(self.tally.stretch_count() as u64);
        let last = path.last().copied().unwrap_or_default();
        let news = self
            .tally
            .add_stretch(stretch, &observations(last))
            .unwrap_or_default();
        let new_failures = news.failures.iter().filter(|f| f.new).count();
        let seen = self
            .combinations
            .entry(fault_combination(last))
            .or_default();
        let rarity = 1.0 / (1.0 + *seen as f64);
        *seen += 1;
        let novelty = news.first_hits.len() as f64
            + news.first_passes.len() as f64
            + 0.5 * news.guidance.len() as f64
            + 2.0 * new_failures as f64
            + rarity;
        let mut failures: Vec<Failure> = news
            .failures
            .into_iter()
            .map(|f| from_property(f.failure))
            .collect();
        failures.extend(self.check_history(path));
        Verdict { failures, novelty }
    }

    fn check(&self, path: &[&[GuestRecord]]) -> Vec<Failure> {
        let mut tally = PropertyTally::new();
        for (i, stretch) in path.iter().enumerate() {
            let _ = tally.add_stretch(StretchId(i as u64), &observations(stretch));
        }
        let mut failures: Vec<Failure> = tally
            .failures_in_stretches()
            .into_iter()
            .map(from_property)
            .collect();
        failures.extend(self.check_history(path));
        failures
    }

    fn end_of_campaign(&self) -> Vec<Failure> {
        self.tally
            .end_of_campaign_failures()
            .into_iter()
            .map(from_property)
            .collect()
    }

    fn save(&self) -> String {
        serde_json::to_string(&SavedJudge {
            tally: &self.tally,
            fault_combinations: &self.combinations,
        })
        .expect("tallies serialize")
    }

    fn load(&mut self, saved: &str) -> Result<(), String> {
        let saved: LoadedJudge =
            serde_json::from_str(saved).map_err(|e| format!("the property tally: {e}"))?;
        self.tally = saved.tally;
        self.combinations = saved.fault_combinations;
        Ok(())
    }
}

/// Draws each branch's faults from the campaign's profile.
pub struct ProfileSource {
    profile: FaultProfile,
    nodes: Vec<String>,
    nodes_with_disks: Vec<String>,
}

impl FaultSource for ProfileSource {
    fn draw(&self, seed: u64, slice_ns: VirtNanos) -> Vec<run::faults::Fault> {
        self.profile
            .draw(seed, slice_ns, &self.nodes, &self.nodes_with_disks)
    }
}

/// The spec's `[faults]` profile over the run's nodes.
pub fn fault_source(
    spec: &CampaignSpec,
    prepared: &PreparedUp,
) -> Result<Box<dyn FaultSource>, JudgesError> {
    // Checked when the file was read; again for a campaign saved before.
    let mut profile = spec.faults.clone();
    profile.validate().map_err(JudgesError::Profile)?;
    for node in &spec.exclude {
        if !profile.exclude.contains(node) {
            profile.exclude.push(node.clone());
        }
    }
    let nodes_with_disks = prepared
        .specs
        .iter()
        .filter(|s| s.disk.is_some())
        .map(|s| s.name.clone())
        .collect();
    Ok(Box::new(ProfileSource {
        profile,
        nodes: prepared.node_names.clone(),
        nodes_with_disks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stretch(faults: &[&str]) -> Vec<GuestRecord> {
        faults
            .iter()
            .flat_map(|text| {
                let fault: run::faults::Fault = text.parse().unwrap();
                fault.scheduled(None).unwrap()
            })
            .map(|fault| GuestRecord {
                exit: 0,
                virtual_ns: fault.at,
                node: None,
                body: RecordBody::Event {
                    event: UpEvent::Fault {
                        action: fault.action,
                    },
                },
            })
            .collect()
    }

    fn judge() -> CampaignJudge {
        CampaignJudge {
            tally: PropertyTally::new(),
            checker: HistoryChecker::None,
            combinations: BTreeMap::new(),
        }
    }

    fn novelty(judge: &mut CampaignJudge, faults: &[&str]) -> f64 {
        judge.judge(&[&stretch(faults)]).novelty
    }

    #[test]
    fn test_a_fault_combination_is_news_the_less_it_was_seen() {
        let mut j = judge();
        assert_eq!(novelty(&mut j, &[]), 1.0);
        assert_eq!(novelty(&mut j, &["at=1s pause n1 for=1s"]), 1.0);
        // The same kinds on other nodes and times: the same combination.
        assert_eq!(novelty(&mut j, &["at=3s pause n2"]), 0.5);
        let both = ["at=1s partition n1 | n2,n3 for=2s", "at=2s pause n3"];
        assert_eq!(novelty(&mut j, &both), 1.0);
        assert_eq!(novelty(&mut j, &["at=1s pause n1"]), 1.0 / 3.0);
        // Sorted kinds, endings (heal) left out.
        assert_eq!(fault_combination(&stretch(&both)), "partition+pause");
    }

    #[test]
    fn test_saved_judge_scores_the_next_stretch_as_the_original() {
        let mut j = judge();
        novelty(&mut j, &[]);
        novelty(&mut j, &["at=1s kill n1"]);
        let mut loaded = judge();
        loaded.load(&j.save()).unwrap();
        assert_eq!(loaded.combinations, j.combinations);
        assert_eq!(
            novelty(&mut loaded, &["at=2s kill n2"]),
            novelty(&mut j, &["at=2s kill n2"])
        );
        assert!(judge().load("{\"tally\":1}").is_err());
    }
}
