//! Per-exit records and the run digest.
//!
//! Every exit yields one [`ExitRecord`]; the digest folds all of them, then the
//! final guest-memory and device-state hashes. Two runs of one configuration
//! and seed must produce equal record streams; the audit compares them.

use crate::exit::ExitKind;
use devices::VirtNanos;
use devices::{Persist, RestoreError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Hears of every exit record as it is made (an observer: it cannot change
/// the run).
pub trait ExitObserver: Send {
    /// `device`: see [`crate::trace::exit_device`].
    fn exit(&mut self, record: &ExitRecord, device: Option<&str>);
}

/// No interrupt was injected at this exit.
pub const NO_VECTOR: u16 = 0xffff;
/// No state hash was taken at this exit.
pub const NO_HASH: u64 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    pub index: u64,
    pub time: VirtNanos,
    pub kind: ExitKind,
    /// Port, MMIO address or MSR index.
    pub address: u64,
    /// Data written, or returned to the guest, little-endian.
    pub data: u64,
    pub size: u8,
    pub rip: u64,
    /// Hash of the general-purpose registers, RIP and RFLAGS at the exit.
    pub regs_hash: u64,
    /// Vector injected before re-entering the guest, or NO_VECTOR.
    pub injected: u16,
    /// Hash of device state (every `device_state_every` exits), or NO_HASH.
    pub device_hash: u64,
    /// Hash of guest memory (every `memory_every` exits), or NO_HASH.
    pub memory_hash: u64,
}

/// The size of an [`ExitRecord`] as bytes ([`ExitRecord::to_bytes`]).
pub const RECORD_BYTES: usize = 68;

impl ExitRecord {
    /// The record as the digest hashes it (and a soak stores it).
    pub fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..8].copy_from_slice(&self.index.to_le_bytes());
        b[8..16].copy_from_slice(&self.time.0.to_le_bytes());
        b[16] = self.kind as u8;
        b[17..25].copy_from_slice(&self.address.to_le_bytes());
        b[25..33].copy_from_slice(&self.data.to_le_bytes());
        b[33] = self.size;
        b[34..42].copy_from_slice(&self.rip.to_le_bytes());
        b[42..50].copy_from_slice(&self.regs_hash.to_le_bytes());
        b[50..52].copy_from_slice(&self.injected.to_le_bytes());
        b[52..60].copy_from_slice(&self.device_hash.to_le_bytes());
        b[60..68].copy_from_slice(&self.memory_hash.to_le_bytes());
        b
    }

    /// The record [`ExitRecord::to_bytes`] made these bytes of (`None`: no
    /// exit kind has the code in them).
    pub fn from_bytes(b: &[u8; RECORD_BYTES]) -> Option<ExitRecord> {
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(word)
        };
        Some(ExitRecord {
            index: u64_at(0),
            time: VirtNanos(u64_at(8)),
            kind: ExitKind::from_code(b[16])?,
            address: u64_at(17),
            data: u64_at(25),
            size: b[33],
            rip: u64_at(34),
            regs_hash: u64_at(42),
            injected: u16::from_le_bytes([b[50], b[51]]),
            device_hash: u64_at(52),
            memory_hash: u64_at(60),
        })
    }
}

impl fmt::Display for ExitRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "exit {} at {} {:?} addr={:#x} data={:#x}/{} rip={:#x} regs={:016x}",
            self.index,
            self.time,
            self.kind,
            self.address,
            self.data,
            self.size,
            self.rip,
            self.regs_hash
        )?;
        if self.injected != NO_VECTOR {
            write!(f, " injected={:#x}", self.injected)?;
        }
        if self.device_hash != NO_HASH {
            write!(f, " devices={:016x}", self.device_hash)?;
        }
        if self.memory_hash != NO_HASH {
            write!(f, " memory={:016x}", self.memory_hash)?;
        }
        Ok(())
    }
}

/// How much the recorder keeps and how often it samples state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordConfig {
    /// Keep every record in memory (the audit needs them; a plain run does not).
    pub keep_records: bool,
    /// Hash device state every N exits (0 = never, except at the end).
    pub device_state_every: u64,
    /// Hash guest memory every N exits (0 = never, except at the end).
    pub memory_every: u64,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            keep_records: false,
            device_state_every: 4096,
            memory_every: 0,
        }
    }
}

/// A running hash whose whole state is 32 bytes, so it can be saved in a
/// snapshot and continued in another process: `h' = BLAKE3(h || bytes)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHash(pub [u8; 32]);

impl ChainHash {
    pub fn update(&mut self, bytes: &[u8]) {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.0);
        hasher.update(bytes);
        self.0 = *hasher.finalize().as_bytes();
    }
}

/// The recorder's resumable state (records themselves are not kept in snapshots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecorderState {
    pub digest: ChainHash,
    pub count: u64,
    pub by_kind: std::collections::BTreeMap<String, u64>,
}

pub struct Recorder {
    pub config: RecordConfig,
    records: Vec<ExitRecord>,
    /// Hears of every record (a trace); not part of the state.
    observer: Option<Box<dyn ExitObserver>>,
    by_kind: std::collections::BTreeMap<String, u64>,
    digest: ChainHash,
    count: u64,
}

impl Recorder {
    pub fn new(config: RecordConfig) -> Self {
        Recorder {
            config,
            records: Vec::new(),
            observer: None,
            by_kind: std::collections::BTreeMap::new(),
            digest: ChainHash::default(),
            count: 0,
        }
    }

    pub fn wants_device_hash(&self, index: u64) -> bool {
        self.config.device_state_every != 0 && index.is_multiple_of(self.config.device_state_every)
    }

    pub fn wants_memory_hash(&self, index: u64) -> bool {
        self.config.memory_every != 0 && index.is_multiple_of(self.config.memory_every)
    }

    pub fn push(&mut self, record: ExitRecord) {
        self.digest.update(&record.to_bytes());
        self.count += 1;
        *self
            .by_kind
            .entry(format!("{:?}", record.kind))
            .or_default() += 1;
        if self.config.keep_records {
            self.records.push(record);
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sets (or removes) what hears of every record from now on; returns
    /// the one set before.
    pub fn set_observer(
        &mut self,
        observer: Option<Box<dyn ExitObserver>>,
    ) -> Option<Box<dyn ExitObserver>> {
        std::mem::replace(&mut self.observer, observer)
    }

    /// What hears of every record, if anything.
    pub fn observer_mut(&mut self) -> Option<&mut (dyn ExitObserver + 'static)> {
        self.observer.as_deref_mut()
    }

    /// Exits counted per kind (IoIn, Hlt, ...), in name order.
    pub fn counts_by_kind(&self) -> std::collections::BTreeMap<String, u64> {
        self.by_kind.clone()
    }

    /// Ends the stream with the final state hashes and returns (digest hex, records).
    pub fn finish(
        mut self,
        memory_hash: u64,
        device_hash: u64,
        console_hash: [u8; 32],
    ) -> (String, Vec<ExitRecord>) {
        self.digest.update(&memory_hash.to_le_bytes());
        self.digest.update(&device_hash.to_le_bytes());
        self.digest.update(&console_hash);
        let digest: String = self.digest.0[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (digest, self.records)
    }
}

/// The first place two record streams differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Divergence {
    /// Records at the same position differ.
    Record {
        position: usize,
        left: ExitRecord,
        right: ExitRecord,
    },
    /// One stream ended earlier.
    Length {
        left: usize,
        right: usize,
        next: Option<ExitRecord>,
    },
}

pub fn first_divergence(left: &[ExitRecord], right: &[ExitRecord]) -> Option<Divergence> {
    if let Some(position) = left.iter().zip(right).position(|(a, b)| a != b) {
        return Some(Divergence::Record {
            position,
            left: left[position],
            right: right[position],
        });
    }
    if left.len() != right.len() {
        let shorter = left.len().min(right.len());
        let next = left.get(shorter).or_else(|| right.get(shorter)).copied();
        return Some(Divergence::Length {
            left: left.len(),
            right: right.len(),
            next,
        });
    }
    None
}

/// A 64-bit hash of bytes (xxh3: fast enough to hash all of guest memory).
pub fn hash64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The digest so far and the counts; records kept from a restore on start
/// empty (the stream continues, its past records are not part of the state).
impl Persist for Recorder {
    type State = RecorderState;

    fn save(&self) -> RecorderState {
        RecorderState {
            digest: self.digest,
            count: self.count,
            by_kind: self.by_kind.clone(),
        }
    }

    fn restore(&mut self, state: &RecorderState) -> Result<(), RestoreError> {
        self.digest = state.digest;
        self.count = state.count;
        self.by_kind = state.by_kind.clone();
        self.records.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: u64) -> ExitRecord {
        ExitRecord {
            index,
            time: VirtNanos(index * 1000),
            kind: ExitKind::IoOut,
            address: 0x3f8,
            data: 0x41,
            size: 1,
            rip: 0xffff_ffff_8100_0000 + index,
            regs_hash: index * 7,
            injected: NO_VECTOR,
            device_hash: NO_HASH,
            memory_hash: NO_HASH,
        }
    }

    #[test]
    fn test_identical_streams_have_no_divergence_and_equal_digests() {
        let a: Vec<_> = (0..10).map(record).collect();
        assert_eq!(first_divergence(&a, &a.clone()), None);
        let digest = |records: &[ExitRecord]| {
            let mut r = Recorder::new(RecordConfig::default());
            records.iter().for_each(|x| r.push(*x));
            r.finish(1, 2, [0; 32]).0
        };
        assert_eq!(digest(&a), digest(&a));
    }

    #[test]
    fn test_first_divergence_reports_position_and_both_sides() {
        let a: Vec<_> = (0..10).map(record).collect();
        let mut b = a.clone();
        b[6].regs_hash ^= 1;
        b[8].data = 0;
        match first_divergence(&a, &b) {
            Some(Divergence::Record {
                position,
                left,
                right,
            }) => {
                assert_eq!(position, 6);
                assert_eq!(left, a[6]);
                assert_eq!(right, b[6]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn test_shorter_stream_is_a_length_divergence() {
        let a: Vec<_> = (0..10).map(record).collect();
        let b = a[..7].to_vec();
        assert_eq!(
            first_divergence(&a, &b),
            Some(Divergence::Length {
                left: 10,
                right: 7,
                next: Some(a[7])
            })
        );
    }

    #[test]
    fn test_recorder_state_round_trip_continues_same_digest() {
        let all: Vec<_> = (0..10).map(record).collect();
        let mut straight = Recorder::new(RecordConfig::default());
        all.iter().for_each(|r| straight.push(*r));
        let mut first = Recorder::new(RecordConfig::default());
        all[..4].iter().for_each(|r| first.push(*r));
        let saved = first.save();
        let json = serde_json::to_string(&saved).unwrap();
        let mut resumed = Recorder::new(RecordConfig::default());
        resumed
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        assert_eq!(resumed.save(), saved);
        all[4..].iter().for_each(|r| resumed.push(*r));
        assert_eq!(resumed.count(), 10);
        assert_eq!(
            resumed.finish(1, 2, [3; 32]).0,
            straight.finish(1, 2, [3; 32]).0
        );
    }

    #[test]
    fn test_record_bytes_round_trip() {
        let mut r = record(5);
        r.injected = 0x30;
        r.memory_hash = 0x1234;
        assert_eq!(ExitRecord::from_bytes(&r.to_bytes()), Some(r));
        let mut bytes = r.to_bytes();
        bytes[16] = 0;
        assert_eq!(ExitRecord::from_bytes(&bytes), None);
    }

    #[test]
    fn test_digest_changes_with_any_record_field() {
        let digest = |r: ExitRecord| {
            let mut rec = Recorder::new(RecordConfig::default());
            rec.push(r);
            rec.finish(0, 0, [0; 32]).0
        };
        let base = record(3);
        let mut changed = base;
        changed.memory_hash = 1;
        assert_ne!(digest(base), digest(changed));
        changed = base;
        changed.injected = 0x20;
        assert_ne!(digest(base), digest(changed));
    }

    fn recorded(n: u64) -> Recorder {
        let mut rec = Recorder::new(RecordConfig::default());
        (0..n).for_each(|i| rec.push(record(i)));
        rec
    }

    devices::persist_round_trip_tests! {
        mod recorder_persist {
            fresh: Recorder::new(RecordConfig::default()),
            saved: recorded(4),
            mutate: |rec: &mut Recorder| rec.push(record(9)),
        }
    }
}
