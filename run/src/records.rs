//! What a guest reports during an `up` run, for a caller that judges runs (a
//! campaign): the run's events, the records of the Antithesis SDKs
//! (assertions, guidance, setup, user events) and the lines of recorded
//! histories, each stamped with the exit and the virtual time at which the
//! host saw it. The driver keeps them only when asked
//! ([`crate::up::UpDriver::collect_records`]); a caller takes them with
//! [`crate::api::Request::TakeRecords`].

use crate::up::UpEvent;
use serde::{Deserialize, Serialize};

/// One thing a guest reported, and when the host saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRecord {
    /// The exit after which the host read it.
    pub exit: u64,
    /// The virtual time of that exit.
    pub virtual_ns: u64,
    /// The node it came from (`None`: the run itself, or the workload running
    /// inside a node).
    pub node: Option<String>,
    pub body: RecordBody,
}

/// What a [`GuestRecord`] holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RecordBody {
    /// An event of the run: a node started or exited, a fault was carried
    /// out, the workload ended...
    Event { event: UpEvent },
    /// One record of an Antithesis SDK, as the SDK wrote it: a one-key
    /// object (`antithesis_assert`, `antithesis_guidance`, `antithesis_setup`,
    /// `antithesis_sdk`, or a user event `{name: details}`).
    Sdk { json: serde_json::Value },
    /// One line of a recorded history (an operation's invocation or
    /// completion, see the fuzzer's history format).
    History { json: serde_json::Value },
}

/// The records a driver collects between two [`crate::api::Request::TakeRecords`].
#[derive(Debug, Default)]
pub struct RecordLog {
    records: Vec<GuestRecord>,
}

impl RecordLog {
    pub fn push(&mut self, record: GuestRecord) {
        self.records.push(record);
    }

    pub fn take(&mut self) -> Vec<GuestRecord> {
        std::mem::take(&mut self.records)
    }

    pub fn clear(&mut self) {
        self.records.clear();
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_record_round_trips_through_json() {
        let record = GuestRecord {
            exit: 12,
            virtual_ns: 3_000_000_000,
            node: Some("n1".into()),
            body: RecordBody::Sdk {
                json: serde_json::json!({"antithesis_setup": {"status": "complete", "details": null}}),
            },
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(serde_json::from_str::<GuestRecord>(&text).unwrap(), record);
        let event = GuestRecord {
            exit: 1,
            virtual_ns: 2,
            node: None,
            body: RecordBody::Event {
                event: UpEvent::NodePaused { node: "n2".into() },
            },
        };
        let text = serde_json::to_string(&event).unwrap();
        assert_eq!(serde_json::from_str::<GuestRecord>(&text).unwrap(), event);
    }

    #[test]
    fn test_the_log_hands_its_records_over_once() {
        let mut log = RecordLog::default();
        let record = GuestRecord {
            exit: 1,
            virtual_ns: 1,
            node: None,
            body: RecordBody::History {
                json: serde_json::json!({"x": 1}),
            },
        };
        log.push(record.clone());
        assert_eq!(log.len(), 1);
        assert_eq!(log.take(), vec![record]);
        assert!(log.is_empty());
    }
}
