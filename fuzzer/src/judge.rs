//! What decides that a history failed: the properties the guest reported
//! (tallied over the whole campaign) and the checker run on its recorded
//! history. The search asks a [`Judge`] about each branch.

use run::records::GuestRecord;
use serde::{Deserialize, Serialize};

/// One failure seen in a history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The failure's identity: findings are one per key.
    pub key: String,
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
