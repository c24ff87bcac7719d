//! What decides that a history failed: the properties the guest reported
//! (tallied over the whole campaign) and the checker run on its recorded
//! history. The search asks a [`Judge`] about each branch.

use crate::failure::FailureKey;
use run::records::GuestRecord;
use serde::{Deserialize, Serialize};

/// One failure seen in a history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The failure's identity: findings are one per key. Serialized as its
    /// slug.
    #[serde(with = "crate::failure::as_slug")]
    pub key: FailureKey,
    /// One line for people.
    pub summary: String,
    /// What the property or checker said (details, the failing operations).
    pub details: serde_json::Value,
    /// Files for the finding's directory (name, contents): the history, the
    /// checker's HTML, ...
    #[serde(skip)]
    pub artifacts: Vec<(String, Vec<u8>)>,
}

/// The judgement of one branch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verdict {
    pub failures: Vec<Failure>,
    /// How much new the branch showed (assertions hit or failed for the first
    /// time, new guidance maxima, a rare combination of fault kinds): the
    /// search prefers to branch such moments.
    pub novelty: f64,
}

/// Judges branches. `path` is the records of every stretch from the boot to
/// the branch's end, the branch's own last.
pub trait Judge {
    /// A branch finished: count its stretch (once) and judge its history.
    fn judge(&mut self, path: &[&[GuestRecord]]) -> Verdict;
    /// The failures of a history, counting nothing (replay, shrinking).
    fn check(&self, path: &[&[GuestRecord]]) -> Vec<Failure>;
    /// Failures known only at the campaign's end (a must-hit assertion
    /// never hit, a `Sometimes` never true).
    fn end_of_campaign(&self) -> Vec<Failure>;
    /// The tallies, saved with each branch and restored on `--resume`.
    fn save(&self) -> String;
    fn load(&mut self, saved: &str) -> Result<(), String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure's key is written as its slug, as when it was a string.
    #[test]
    fn test_a_failure_serializes_its_key_as_the_slug() {
        let failure = Failure {
            key: FailureKey::Checker {
                checker: "linearizability".into(),
                key: "k 2".into(),
            },
            summary: "not linearizable".into(),
            details: serde_json::json!({"operations": 3}),
            artifacts: vec![("history.jsonl".into(), b"{}".to_vec())],
        };
        let text = r#"{"key":"checker:linearizability:k%202","summary":"not linearizable","details":{"operations":3}}"#;
        assert_eq!(serde_json::to_string(&failure).unwrap(), text);
        let back: Failure = serde_json::from_str(text).unwrap();
        assert_eq!(back.key, failure.key);
        assert!(back.artifacts.is_empty());
        let bad =
            serde_json::from_str::<Failure>(r#"{"key":"nonsense","summary":"","details":null}"#)
                .unwrap_err();
        assert!(bad.to_string().contains("\"nonsense\""), "{bad}");
    }
}
