//! Where a run's exits go: counts by kind and by device, in all and per
//! virtual second, from a trace's lines ([`read_report`]) or from records
//! as a run makes them ([`TraceReport::add`], or a [`LiveReport`] set as a
//! session's observer).

use super::{ExitObserver, TraceLine};
use crate::exit::ExitKind;
use crate::record::ExitRecord;
use devices::VirtNanos;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::sync::{Arc, Mutex, PoisonError};

/// The device column of exits that concern no address (`Hlt`, ...).
pub const NO_DEVICE: &str = "-";

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Exits counted by kind (as the run summary's `exits_by_kind` names them)
/// and by device ([`NO_DEVICE`] for none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub exits: u64,
    pub by_kind: BTreeMap<String, u64>,
    pub by_device: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, kind: &str, device: &str) {
        self.exits += 1;
        // Looked up before inserting: almost every exit's key is there already.
        match self.by_kind.get_mut(kind) {
            Some(n) => *n += 1,
            None => {
                self.by_kind.insert(kind.to_owned(), 1);
            }
        }
        match self.by_device.get_mut(device) {
            Some(n) => *n += 1,
            None => {
                self.by_device.insert(device.to_owned(), 1);
            }
        }
    }
}

/// The exits of one virtual second: `[second, second + 1)` s since boot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondCounts {
    pub second: u64,
    #[serde(flatten)]
    pub counts: Counts,
}

/// Counts of a trace's exits, in all and per virtual second (seconds with
/// no exit are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceReport {
    /// The first and last exit index seen (a branch's trace starts at the
    /// branch point, not at 0).
    pub first_index: Option<u64>,
    pub last_index: Option<u64>,
    /// Virtual time of the last exit seen (nanoseconds in the JSON).
    pub last_time_ns: VirtNanos,
    pub total: Counts,
    /// In time order.
    pub seconds: Vec<SecondCounts>,
}

impl TraceReport {
    pub fn new() -> Self {
        TraceReport::default()
    }

    /// Counts one exit (live: from the record a run just made).
    pub fn add(&mut self, record: &ExitRecord, device: Option<&str>) {
        self.count(record.index, record.time, record.kind, device);
    }

    /// Counts one line of a trace.
    pub fn add_line(&mut self, line: &TraceLine) {
        self.count(line.index, line.time_ns, line.kind, line.device.as_deref());
    }

    fn count(&mut self, index: u64, time: VirtNanos, kind: ExitKind, device: Option<&str>) {
        let kind = kind_name(kind);
        let device = device.unwrap_or(NO_DEVICE);
        self.first_index.get_or_insert(index);
        self.last_index = Some(index);
        self.last_time_ns = self.last_time_ns.max(time);
        self.total.add(kind, device);
        let second = time.0 / NANOS_PER_SECOND;
        // Exits come in time order: nearly always the last bucket, or a new one.
        let at = match self.seconds.last() {
            Some(last) if last.second == second => self.seconds.len() - 1,
            Some(last) if last.second < second => self.push_second(second),
            None => self.push_second(second),
            Some(_) => {
                let at = self.seconds.partition_point(|s| s.second < second);
                if self.seconds.get(at).is_none_or(|s| s.second != second) {
                    self.seconds.insert(
                        at,
                        SecondCounts {
                            second,
                            counts: Counts::default(),
                        },
                    );
                }
                at
            }
        };
        self.seconds[at].counts.add(kind, device);
    }

    fn push_second(&mut self, second: u64) -> usize {
        self.seconds.push(SecondCounts {
            second,
            counts: Counts::default(),
        });
        self.seconds.len() - 1
    }
}

/// A report a run fills as it goes: set a clone as the session's observer
/// ([`crate::vm::Session::set_exit_observer`]) and read [`LiveReport::report`]
/// whenever (no trace file needed).
#[derive(Clone, Default)]
pub struct LiveReport(Arc<Mutex<TraceReport>>);

impl LiveReport {
    pub fn new() -> Self {
        LiveReport::default()
    }

    /// The counts so far.
    pub fn report(&self) -> TraceReport {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ExitObserver for LiveReport {
    fn exit(&mut self, record: &ExitRecord, device: Option<&str>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(record, device);
    }
}

/// An exit kind's name, as the run summary's `exits_by_kind` has it.
pub fn kind_name(kind: ExitKind) -> &'static str {
    match kind {
        ExitKind::IoIn => "IoIn",
        ExitKind::IoOut => "IoOut",
        ExitKind::MmioRead => "MmioRead",
        ExitKind::MmioWrite => "MmioWrite",
        ExitKind::RdMsr => "RdMsr",
        ExitKind::WrMsr => "WrMsr",
        ExitKind::Hlt => "Hlt",
        ExitKind::IrqWindowOpen => "IrqWindowOpen",
        ExitKind::Shutdown => "Shutdown",
        ExitKind::Interrupted => "Interrupted",
        ExitKind::Fatal => "Fatal",
        ExitKind::SingleStep => "SingleStep",
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading line {line}")]
    Io {
        line: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line} is not a trace line")]
    Line {
        line: u64,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads a trace (one [`TraceLine`] per line; empty lines are skipped)
/// and counts its exits, a line at a time.
pub fn read_report(reader: impl BufRead) -> Result<TraceReport, ReadError> {
    let mut report = TraceReport::new();
    for (n, text) in reader.lines().enumerate() {
        let line = n as u64 + 1;
        let text = text.map_err(|source| ReadError::Io { line, source })?;
        if text.trim().is_empty() {
            continue;
        }
        let parsed =
            TraceLine::from_json(&text).map_err(|source| ReadError::Line { line, source })?;
        report.add_line(&parsed);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NO_HASH, NO_VECTOR};

    fn record(index: u64, time_ns: u64, kind: ExitKind, address: u64) -> ExitRecord {
        ExitRecord {
            index,
            time: VirtNanos(time_ns),
            kind,
            address,
            data: 0,
            size: 1,
            rip: 0x1000 + index,
            regs_hash: index,
            injected: NO_VECTOR,
            device_hash: NO_HASH,
            memory_hash: NO_HASH,
        }
    }

    /// A small trace: serial and HPET exits in second 0, a halt and a PM
    /// timer read in second 2 (second 1 has none).
    fn exits() -> Vec<(ExitRecord, Option<&'static str>)> {
        vec![
            (record(0, 10, ExitKind::IoOut, 0x3f8), Some("serial")),
            (record(1, 20, ExitKind::IoOut, 0x3f8), Some("serial")),
            (
                record(2, 999_999_999, ExitKind::MmioRead, 0xfed0_00f0),
                Some("hpet"),
            ),
            (record(3, 2_000_000_000, ExitKind::Hlt, 0), None),
            (
                record(4, 2_500_000_000, ExitKind::IoIn, 0x608),
                Some("acpi-pm-timer"),
            ),
        ]
    }

    fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn test_report_counts_by_kind_device_and_virtual_second() {
        let mut report = TraceReport::new();
        for (record, device) in exits() {
            report.add(&record, device);
        }
        assert_eq!(report.first_index, Some(0));
        assert_eq!(report.last_index, Some(4));
        assert_eq!(report.last_time_ns, VirtNanos(2_500_000_000));
        assert_eq!(report.total.exits, 5);
        assert_eq!(
            report.total.by_kind,
            map(&[("Hlt", 1), ("IoIn", 1), ("IoOut", 2), ("MmioRead", 1)])
        );
        assert_eq!(
            report.total.by_device,
            map(&[("-", 1), ("acpi-pm-timer", 1), ("hpet", 1), ("serial", 2)])
        );
        let seconds: Vec<u64> = report.seconds.iter().map(|s| s.second).collect();
        assert_eq!(seconds, [0, 2]);
        assert_eq!(report.seconds[0].counts.exits, 3);
        assert_eq!(
            report.seconds[0].counts.by_device,
            map(&[("hpet", 1), ("serial", 2)])
        );
        assert_eq!(
            report.seconds[1].counts.by_kind,
            map(&[("Hlt", 1), ("IoIn", 1)])
        );
    }

    #[test]
    fn test_report_from_trace_text_equals_report_of_live_records() {
        let mut live = TraceReport::new();
        let mut text = String::new();
        for (record, device) in exits() {
            live.add(&record, device);
            text.push_str(&TraceLine::new(&record, device).to_json());
            text.push('\n');
        }
        text.push('\n');
        assert_eq!(read_report(text.as_bytes()).unwrap(), live);
    }

    #[test]
    fn test_live_report_counts_what_its_clone_observed() {
        let live = LiveReport::new();
        let mut observer: Box<dyn ExitObserver> = Box::new(live.clone());
        let mut direct = TraceReport::new();
        for (record, device) in exits() {
            observer.exit(&record, device);
            direct.add(&record, device);
        }
        assert_eq!(live.report(), direct);
    }

    #[test]
    fn test_report_kind_names_are_the_summary_names() {
        for kind in [
            ExitKind::IoIn,
            ExitKind::IrqWindowOpen,
            ExitKind::SingleStep,
        ] {
            assert_eq!(kind_name(kind), format!("{kind:?}"));
        }
    }

    #[test]
    fn test_report_out_of_order_second_lands_in_its_bucket() {
        let mut report = TraceReport::new();
        report.add(&record(0, 3_000_000_000, ExitKind::Hlt, 0), None);
        report.add(&record(1, 1_000_000_000, ExitKind::Hlt, 0), None);
        report.add(&record(2, 3_100_000_000, ExitKind::Hlt, 0), None);
        let seconds: Vec<(u64, u64)> = report
            .seconds
            .iter()
            .map(|s| (s.second, s.counts.exits))
            .collect();
        assert_eq!(seconds, [(1, 1), (3, 2)]);
    }

    #[test]
    fn test_report_names_the_line_that_is_not_a_trace_line() {
        let good = TraceLine::new(&exits()[0].0, Some("serial")).to_json();
        let text = format!("{good}\n{{\"index\":1}}\n");
        let error = read_report(text.as_bytes()).unwrap_err();
        assert!(matches!(error, ReadError::Line { line: 2, .. }), "{error}");
    }

    #[test]
    fn test_report_round_trips_through_json() {
        let mut report = TraceReport::new();
        for (record, device) in exits() {
            report.add(&record, device);
        }
        let json = serde_json::to_string(&report).unwrap();
        assert!(json.contains(r#""second":2,"exits":2"#), "{json}");
        assert_eq!(serde_json::from_str::<TraceReport>(&json).unwrap(), report);
    }
}
