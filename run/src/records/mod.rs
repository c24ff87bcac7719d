//! What a guest reports during an `up` run, for a caller that judges runs (a
//! campaign): the run's events, the records of the Antithesis SDKs
//! (assertions, guidance, setup, user events) and the lines of recorded
//! histories, each stamped with the exit and the virtual time at which the
//! host saw it. The driver keeps them only when asked
//! ([`crate::conversation::UpDriver::collect_records`]); a caller takes them with
//! [`crate::api::Request::TakeRecords`]. An SDK record is kept as the SDK
//! wrote it; [`sdk`] reads it.

pub mod sdk;

use crate::event::UpEvent;
use guest_agent::protocol::Stream;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vmm::VirtNanos;

/// The output of one log (a node, the workload, a test-composer command)
/// kept per stretch: its last this many bytes; the rest is replaced by one
/// [`RecordBody::OutputDropped`]. A guest can print without end, a
/// campaign keeps every stretch's records in its database, and a stretch's
/// records cross from the helper VM in one frame (at most 16 MiB).
pub const OUTPUT_CAP_BYTES: usize = 256 << 10;

/// The records other than output (events, SDK records, history lines) a
/// driver holds between two takes, in bytes of their JSON: 8 MiB. They are
/// what a campaign judges, so none may be dropped; a guest that reports more
/// in one stretch stops the run with [`RecordsFull`] instead (a stretch's
/// records cross from the helper VM in one frame of at most 16 MiB).
pub const RECORDS_CAP_BYTES: usize = 8 << 20;

/// A guest reported more than [`RECORDS_CAP_BYTES`] of records in one
/// stretch (between two takes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the guest reported more than {limit} bytes of records (events, SDK records, history \
     lines) since they were last taken, at exit {exit}; take them more often (shorter \
     stretches) or report less"
)]
pub struct RecordsFull {
    pub limit: usize,
    pub exit: u64,
}

/// One thing a guest reported, and when the host saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRecord {
    /// The exit after which the host read it.
    pub exit: u64,
    /// The virtual time of that exit (nanoseconds in the JSON).
    pub virtual_ns: VirtNanos,
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
    /// `antithesis_sdk`, or a user event `{name: details}`), typed by
    /// [`sdk::SdkRecord::parse`].
    Sdk { json: serde_json::Value },
    /// One line of a recorded history (an operation's invocation or
    /// completion, see the fuzzer's history format).
    History { json: serde_json::Value },
    /// A chunk of output, as the agent read it: `log` names the log it goes
    /// to under `up --logs` (a node, the workload, a test-composer
    /// command), `text` its bytes as UTF-8 (invalid sequences replaced).
    Output {
        log: String,
        stream: Stream,
        text: String,
    },
    /// `bytes` of `log`'s output were dropped here (see
    /// [`OUTPUT_CAP_BYTES`]): the chunks after it are the log's last ones.
    OutputDropped { log: String, bytes: u64 },
}

/// The records a driver collects between two [`crate::api::Request::TakeRecords`].
/// Output is capped per log to [`OUTPUT_CAP_BYTES`] when taken, and on the
/// way once a log holds twice that (so memory stays bounded).
#[derive(Debug)]
pub struct RecordLog {
    records: Vec<GuestRecord>,
    /// Output bytes held per log.
    output: BTreeMap<String, usize>,
    /// JSON bytes of the other records held.
    other: usize,
    /// The most `other` may reach ([`RECORDS_CAP_BYTES`]; tests lower it).
    other_cap: usize,
}

impl Default for RecordLog {
    fn default() -> Self {
        Self::with_cap(RECORDS_CAP_BYTES)
    }
}

impl RecordLog {
    /// A log that holds at most `cap` bytes of records other than output.
    pub fn with_cap(cap: usize) -> Self {
        RecordLog {
            records: Vec::new(),
            output: BTreeMap::new(),
            other: 0,
            other_cap: cap,
        }
    }

    /// Keeps `record`; refuses it (and keeps nothing) once the records
    /// other than output would pass the cap.
    pub fn push(&mut self, record: GuestRecord) -> Result<(), RecordsFull> {
        let mut over = false;
        match &record.body {
            RecordBody::Output { log, text, .. } => {
                let held = self.output.entry(log.clone()).or_default();
                *held += text.len();
                over = *held > 2 * OUTPUT_CAP_BYTES;
            }
            RecordBody::OutputDropped { .. } => {}
            other => {
                let bytes = serde_json::to_vec(other).map_or(0, |json| json.len());
                if self.other + bytes > self.other_cap {
                    return Err(RecordsFull {
                        limit: self.other_cap,
                        exit: record.exit,
                    });
                }
                self.other += bytes;
            }
        }
        self.records.push(record);
        if over {
            cap_output(&mut self.records, OUTPUT_CAP_BYTES);
            self.output = output_bytes(&self.records);
        }
        Ok(())
    }

    /// The records since the last take, each log's output capped.
    pub fn take(&mut self) -> Vec<GuestRecord> {
        self.output.clear();
        self.other = 0;
        let mut records = std::mem::take(&mut self.records);
        cap_output(&mut records, OUTPUT_CAP_BYTES);
        records
    }

    pub fn clear(&mut self) {
        self.records.clear();
        self.output.clear();
        self.other = 0;
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// Output bytes per log in `records`.
fn output_bytes(records: &[GuestRecord]) -> BTreeMap<String, usize> {
    let mut bytes = BTreeMap::new();
    for record in records {
        if let RecordBody::Output { log, text, .. } = &record.body {
            *bytes.entry(log.clone()).or_default() += text.len();
        }
    }
    bytes
}

/// Keeps the last `cap` bytes of each log's output in `records` (one
/// stretch, in order): earlier chunks are removed, the first one kept may
/// lose its front (at a character boundary), and one
/// [`RecordBody::OutputDropped`] where the first dropped chunk was says how
/// much went (markers already there for that log are merged into it).
pub fn cap_output(records: &mut Vec<GuestRecord>, cap: usize) {
    let mut to_drop: BTreeMap<String, usize> = output_bytes(records)
        .into_iter()
        .filter(|(_, bytes)| *bytes > cap)
        .map(|(log, bytes)| (log, bytes - cap))
        .collect();
    if to_drop.is_empty() {
        return;
    }
    // Per log: the marker's index in `kept`, and the bytes it stands for.
    let mut markers: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut kept = Vec::with_capacity(records.len());
    for mut record in std::mem::take(records) {
        let (log, dropped) = match &mut record.body {
            RecordBody::Output { log, text, .. } => match to_drop.get_mut(log.as_str()) {
                Some(left) if *left > 0 => {
                    if text.len() <= *left {
                        *left -= text.len();
                        (log.clone(), text.len() as u64)
                    } else {
                        let mut cut = *left;
                        while !text.is_char_boundary(cut) {
                            cut += 1;
                        }
                        *left = 0;
                        text.drain(..cut);
                        let log = log.clone();
                        let at = record.exit;
                        let ns = record.virtual_ns;
                        add_marker(&mut markers, &mut kept, &log, cut as u64, at, ns);
                        kept.push(record);
                        continue;
                    }
                }
                _ => {
                    kept.push(record);
                    continue;
                }
            },
            RecordBody::OutputDropped { log, bytes } if to_drop.contains_key(log.as_str()) => {
                (log.clone(), *bytes)
            }
            _ => {
                kept.push(record);
                continue;
            }
        };
        add_marker(
            &mut markers,
            &mut kept,
            &log,
            dropped,
            record.exit,
            record.virtual_ns,
        );
    }
    for (log, (index, bytes)) in markers {
        kept[index].body = RecordBody::OutputDropped { log, bytes };
    }
    *records = kept;
}

/// Counts `bytes` dropped from `log`, placing its marker now if it has none.
fn add_marker(
    markers: &mut BTreeMap<String, (usize, u64)>,
    kept: &mut Vec<GuestRecord>,
    log: &str,
    bytes: u64,
    exit: u64,
    virtual_ns: VirtNanos,
) {
    let marker = markers.entry(log.to_owned()).or_insert_with(|| {
        kept.push(GuestRecord {
            exit,
            virtual_ns,
            node: None,
            body: RecordBody::OutputDropped {
                log: log.to_owned(),
                bytes: 0,
            },
        });
        (kept.len() - 1, 0)
    });
    marker.1 += bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_record_round_trips_through_json() {
        let record = GuestRecord {
            exit: 12,
            virtual_ns: VirtNanos(3_000_000_000),
            node: Some("n1".into()),
            body: RecordBody::Sdk {
                json: serde_json::json!({"antithesis_setup": {"status": "complete", "details": null}}),
            },
        };
        let text = serde_json::to_string(&record).unwrap();
        // The time is the bare number it was before it was typed.
        assert!(
            text.starts_with(r#"{"exit":12,"virtual_ns":3000000000,"node":"n1","#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<GuestRecord>(&text).unwrap(), record);
        let event = GuestRecord {
            exit: 1,
            virtual_ns: VirtNanos(2),
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
            virtual_ns: VirtNanos(1),
            node: None,
            body: RecordBody::History {
                json: serde_json::json!({"x": 1}),
            },
        };
        log.push(record.clone()).unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log.take(), vec![record]);
        assert!(log.is_empty());
    }

    /// A guest that reports history lines without end fills the log to its
    /// cap and no further: the push past it is refused with the cap and the
    /// exit named, nothing is dropped silently, and a take starts afresh.
    #[test]
    fn test_records_past_the_cap_are_refused_not_held() {
        let line = |exit: u64| GuestRecord {
            exit,
            virtual_ns: VirtNanos(exit),
            node: Some("workload".into()),
            body: RecordBody::History {
                json: serde_json::json!({"process": 1, "op": exit, "type": "invoke", "f": "get"}),
            },
        };
        let one = serde_json::to_vec(&line(0).body).unwrap().len();
        let mut log = RecordLog::with_cap(10 * one);
        for exit in 0..10 {
            log.push(line(exit)).unwrap();
        }
        let full = log.push(line(10)).unwrap_err();
        assert_eq!(
            full,
            RecordsFull {
                limit: 10 * one,
                exit: 10
            }
        );
        assert!(full
            .to_string()
            .contains(&format!("more than {} bytes", 10 * one)));
        assert_eq!(log.len(), 10, "the refused record is not held");
        // Output is capped on its own terms, not refused.
        log.push(output(11, "n1", &"x".repeat(one))).unwrap();
        assert_eq!(log.take().len(), 11);
        log.push(line(12)).unwrap();
        // The default holds 8 MiB of JSON, below the helper VM's 16 MiB frames.
        assert_eq!(RecordLog::default().other_cap, RECORDS_CAP_BYTES);
    }

    fn output(at: u64, log: &str, text: &str) -> GuestRecord {
        GuestRecord {
            exit: at,
            virtual_ns: VirtNanos(at),
            node: Some(log.into()),
            body: RecordBody::Output {
                log: log.into(),
                stream: Stream::Stdout,
                text: text.into(),
            },
        }
    }

    fn texts(records: &[GuestRecord]) -> Vec<String> {
        records
            .iter()
            .map(|r| match &r.body {
                RecordBody::Output { log, text, .. } => format!("{log}:{text}"),
                RecordBody::OutputDropped { log, bytes } => format!("{log}-{bytes}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn test_output_keeps_the_last_bytes_of_each_log_and_says_what_went() {
        let mut records = vec![
            output(1, "a", "0123"),
            output(2, "b", "xy"),
            output(3, "a", "4567"),
            output(4, "a", "89"),
        ];
        cap_output(&mut records, 5);
        // "a" had 10 bytes: 5 dropped (all of the first chunk, one of the
        // second); "b" is under the cap.
        assert_eq!(texts(&records), ["a-5", "b:xy", "a:567", "a:89"]);
        // Capping again merges the marker, and never cuts a character.
        records.push(output(5, "a", "é!"));
        cap_output(&mut records, 4);
        assert_eq!(texts(&records), ["a-9", "b:xy", "a:9", "a:é!"]);
        cap_output(&mut records, 2);
        assert_eq!(texts(&records), ["a-12", "b:xy", "a:!"]);
        let mut under = vec![output(1, "a", "01")];
        cap_output(&mut under, 5);
        assert_eq!(texts(&under), ["a:01"]);
    }

    #[test]
    fn test_the_log_bounds_output_while_collecting_and_caps_it_when_taken() {
        let mut log = RecordLog::default();
        let chunk = "x".repeat(OUTPUT_CAP_BYTES / 4);
        for i in 0..20 {
            log.push(output(i, "n1", &chunk)).unwrap();
            let held: usize = output_bytes(&log.records).values().sum();
            assert!(held <= 2 * OUTPUT_CAP_BYTES + chunk.len());
        }
        let records = log.take();
        assert_eq!(output_bytes(&records)["n1"], OUTPUT_CAP_BYTES);
        assert_eq!(
            records[0].body,
            RecordBody::OutputDropped {
                log: "n1".into(),
                bytes: (20 * chunk.len() - OUTPUT_CAP_BYTES) as u64
            }
        );
    }
}
