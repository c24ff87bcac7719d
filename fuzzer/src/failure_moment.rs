//! A finding's failure moment: the exit and virtual time of the first
//! record of its path that broke the property, i.e. the last record of the
//! shortest prefix of the path's records whose history the campaign's judge
//! fails with the finding's key.
//!
//! # Why bisection finds the first record
//!
//! The prefix is found by bisection over its length, which finds the first
//! failing prefix when a failure seen in a prefix stays in every longer
//! one. That holds for what [`Judge::check`] reports:
//!
//! - properties (`crate::properties`): a failure in a stretch is an
//!   assertion's first breaking hit (`first_failure`, set once, whether a
//!   hit breaks depends on the hit and the assertion's kind only) or a
//!   command's first nonzero exit (`first_nonzero`, set once): more records
//!   never unset them;
//! - the linearizability checker (`crate::linearizability`): a prefix of
//!   the records is a prefix of the recorded history, where an operation
//!   whose completion is cut off is one without a return (it may have taken
//!   effect or not), so a history that is not linearizable has no
//!   linearizable extension (linearizability is a safety property). The
//!   checker reports the first illegal key in key order; the finding's key
//!   is the first at the path's end, so no smaller key is illegal in any
//!   prefix either. A malformed history stays malformed when lines are
//!   added (every problem is of a line and the lines before it).
//!
//! Where it does not hold, the answer is still a record at which the
//! failure is seen and was not one record earlier, maybe later than the
//! first: a checker that gives up on a prefix (its deadline, "unknown")
//! counts as not failing there.
//!
//! # Failures known only at the end
//!
//! A must-hit assertion never hit, a `Sometimes` never true, a command that
//! never exited 0 ([`Judge::end_of_campaign`]) are no record's: no prefix
//! shows them, nor does anything else [`Judge::check`] does not report for
//! the whole path (a checker that gives up on it). Their moment is the
//! path's end ([`FailureMoment::at_end`], `record` `None`). The campaign
//! makes findings of failures seen in a branch only, so today this is the
//! case of a checker that gave up when the moment is computed.

use crate::failure::FailureKey;
use crate::judge::Judge;
use run::records::GuestRecord;
use serde::{Deserialize, Serialize};
use vmm::VirtNanos;

/// Where a finding's failure happened in its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureMoment {
    /// The exit after which the host read the first failing record (the
    /// path's end exit count when `record` is `None`).
    pub exit: u64,
    /// The virtual time of that exit (nanoseconds in the JSON).
    pub virtual_ns: VirtNanos,
    /// The first failing record's index (0-based) in the finding's
    /// `records.jsonl`; `None`: no prefix of the records shows the failure,
    /// and the moment is the path's end (see the module's documentation).
    pub record: Option<usize>,
}

impl FailureMoment {
    /// The moment of the record `index` of `records`.
    pub fn of_record(records: &[GuestRecord], index: usize) -> Self {
        let record = &records[index];
        FailureMoment {
            exit: record.exit,
            virtual_ns: record.virtual_ns,
            record: Some(index),
        }
    }

    /// The path's end (`exits` handled, at `virtual_ns`): the moment of a
    /// failure no record shows.
    pub fn at_end(exits: u64, virtual_ns: VirtNanos) -> Self {
        FailureMoment {
            exit: exits,
            virtual_ns,
            record: None,
        }
    }
}

/// The shortest length `n` in `1..=len` for which `fails(n)` holds, by
/// bisection (see the module's documentation for when that is the first);
/// `None` when `fails(len)` does not hold. `fails` is called at most about
/// log2(len) + 1 times.
pub fn first_failing_prefix(len: usize, mut fails: impl FnMut(usize) -> bool) -> Option<usize> {
    if len == 0 || !fails(len) {
        return None;
    }
    // fails(high) holds; every length below `low` was found not failing.
    let (mut low, mut high) = (1, len);
    while low < high {
        let middle = low + (high - low) / 2;
        if fails(middle) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Some(high)
}

/// The failure moment of `key` in the history `records` (a finding's
/// `records.jsonl`: the root's stretch and the path's steps), as `judge`
/// sees it; `None` when no prefix of `records` shows it (the caller places
/// it at the path's end, [`FailureMoment::at_end`]).
pub fn find(records: &[GuestRecord], judge: &dyn Judge, key: &FailureKey) -> Option<FailureMoment> {
    let length = first_failing_prefix(records.len(), |n| {
        judge
            .check(&[&records[..n]])
            .iter()
            .any(|failure| &failure.key == key)
    })?;
    Some(FailureMoment::of_record(records, length - 1))
}

/// [`find`], or the path's end when no record shows the failure.
pub fn find_or_end(
    records: &[GuestRecord],
    judge: &dyn Judge,
    key: &FailureKey,
    end_exits: u64,
    end_ns: VirtNanos,
) -> FailureMoment {
    find(records, judge, key).unwrap_or_else(|| FailureMoment::at_end(end_exits, end_ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::{Failure, Verdict};
    use run::records::RecordBody;
    use std::cell::Cell;

    /// Fails a history once it holds a record whose SDK JSON is `"bad"`
    /// (or at the end only, when `at_end_only`); counts its checks.
    struct FakeJudge {
        key: FailureKey,
        checks: Cell<usize>,
        at_end_only: bool,
    }

    fn fake(at_end_only: bool) -> FakeJudge {
        FakeJudge {
            key: FailureKey::Command { name: "x".into() },
            checks: Cell::new(0),
            at_end_only,
        }
    }

    impl Judge for FakeJudge {
        fn judge(&mut self, path: &[&[GuestRecord]]) -> Verdict {
            Verdict {
                failures: self.check(path),
                novelty: 0.0,
            }
        }

        fn check(&self, path: &[&[GuestRecord]]) -> Vec<Failure> {
            self.checks.set(self.checks.get() + 1);
            let bad = path
                .iter()
                .flat_map(|s| s.iter())
                .any(|r| matches!(&r.body, RecordBody::Sdk { json } if json == "bad"));
            if bad && !self.at_end_only {
                vec![Failure {
                    key: self.key.clone(),
                    summary: "bad".into(),
                    details: serde_json::Value::Null,
                    artifacts: Vec::new(),
                }]
            } else {
                Vec::new()
            }
        }

        fn end_of_campaign(&self) -> Vec<Failure> {
            Vec::new()
        }

        fn save(&self) -> String {
            String::new()
        }

        fn load(&mut self, _saved: &str) -> Result<(), String> {
            Ok(())
        }
    }

    /// `len` records, exit `10 * i` at `i` ms; those at `bad` say "bad".
    fn records(len: usize, bad: &[usize]) -> Vec<GuestRecord> {
        (0..len)
            .map(|i| GuestRecord {
                exit: 10 * i as u64,
                virtual_ns: VirtNanos::from_micros(1_000 * i as u64),
                node: Some("n1".into()),
                body: RecordBody::Sdk {
                    json: serde_json::json!(if bad.contains(&i) { "bad" } else { "ok" }),
                },
            })
            .collect()
    }

    #[test]
    fn test_the_first_failing_record_is_found_in_the_middle_at_the_start_and_at_the_end() {
        for (len, bad, first) in [
            (1000, vec![417, 800], 417),
            (1000, vec![0, 3], 0),
            (1000, vec![999], 999),
            (1, vec![0], 0),
            (2, vec![1], 1),
        ] {
            let judge = fake(false);
            let records = records(len, &bad);
            let moment = find(&records, &judge, &judge.key).unwrap();
            assert_eq!(
                moment,
                FailureMoment {
                    exit: 10 * first as u64,
                    virtual_ns: VirtNanos::from_micros(1_000 * first as u64),
                    record: Some(first),
                },
                "{bad:?}"
            );
            // Bisection: about log2(len) + 1 checks, not len.
            let bound = (usize::BITS - len.leading_zeros()) as usize + 1;
            assert!(judge.checks.get() <= bound, "{} checks", judge.checks.get());
        }
    }

    /// Another key, no failing record, no records at all, or a failure
    /// known only at the end: no record's; the caller's end it is.
    #[test]
    fn test_a_failure_no_prefix_shows_is_at_the_path_s_end() {
        let judge = fake(false);
        let other = FailureKey::Command { name: "y".into() };
        assert_eq!(find(&records(10, &[4]), &judge, &other), None);
        assert_eq!(find(&records(10, &[]), &judge, &judge.key), None);
        assert_eq!(find(&[], &judge, &judge.key), None);
        let end_only = fake(true);
        let end = FailureMoment::at_end(77, VirtNanos::from_secs(3));
        assert_eq!(
            find_or_end(
                &records(10, &[4]),
                &end_only,
                &end_only.key,
                77,
                VirtNanos::from_secs(3)
            ),
            end
        );
        assert_eq!(end.record, None);
    }

    #[test]
    fn test_first_failing_prefix_is_the_smallest_of_a_monotone_predicate() {
        for len in 1..40 {
            for first in 1..=len {
                let found = first_failing_prefix(len, |n| n >= first);
                assert_eq!(found, Some(first), "len {len}");
            }
            assert_eq!(first_failing_prefix(len, |_| false), None);
        }
        assert_eq!(first_failing_prefix(0, |_| true), None);
    }

    /// The JSON of a moment: the time as bare nanoseconds, as everywhere.
    #[test]
    fn test_a_failure_moment_json_round_trips() {
        let moment = FailureMoment {
            exit: 12,
            virtual_ns: VirtNanos(1_500),
            record: Some(3),
        };
        let text = r#"{"exit":12,"virtual_ns":1500,"record":3}"#;
        assert_eq!(serde_json::to_string(&moment).unwrap(), text);
        assert_eq!(serde_json::from_str::<FailureMoment>(text).unwrap(), moment);
        let end = FailureMoment::at_end(5, VirtNanos(9));
        let text = serde_json::to_string(&end).unwrap();
        assert_eq!(text, r#"{"exit":5,"virtual_ns":9,"record":null}"#);
        assert_eq!(serde_json::from_str::<FailureMoment>(&text).unwrap(), end);
    }
}
