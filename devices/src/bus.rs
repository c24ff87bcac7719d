//! An address bus: non-overlapping ranges, each owned by one device.
//!
//! The bus maps an absolute address (a port number or a guest-physical
//! address) to `(key, offset)`; the owner of the bus keeps the devices and
//! dispatches by key, so that devices stay plain, serializable values.

use std::collections::BTreeMap;
use thiserror::Error;

/// What every device on a bus implements. `offset` is relative to the start of
/// the device's range; `data.len()` is the access size (1, 2, 4 or 8).
pub trait BusDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BusError {
    #[error("bus range {base:#x}+{len:#x} has zero length")]
    EmptyRange { base: u64, len: u64 },
    #[error("bus range {base:#x}+{len:#x} overlaps the range at {other_base:#x}+{other_len:#x}")]
    Overlap {
        base: u64,
        len: u64,
        other_base: u64,
        other_len: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range<K> {
    len: u64,
    key: K,
}

/// Ranges keyed by their base address.
#[derive(Clone, Debug, Default)]
pub struct Bus<K: Copy> {
    ranges: BTreeMap<u64, Range<K>>,
}

impl<K: Copy> Bus<K> {
    pub fn new() -> Self {
        Bus {
            ranges: BTreeMap::new(),
        }
    }

    /// Adds `[base, base + len)` for `key`; overlapping an existing range is an error.
    pub fn insert(&mut self, base: u64, len: u64, key: K) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::EmptyRange { base, len });
        }
        let end = base.saturating_add(len);
        // The nearest range starting at or before `base`, and the first one after it.
        let before = self.ranges.range(..=base).next_back();
        let after = self.ranges.range(base..).next();
        for (&other_base, other) in before.into_iter().chain(after) {
            let other_end = other_base.saturating_add(other.len);
            if base < other_end && other_base < end {
                return Err(BusError::Overlap {
                    base,
                    len,
                    other_base,
                    other_len: other.len,
                });
            }
        }
        self.ranges.insert(base, Range { len, key });
        Ok(())
    }

    /// The key owning `addr` and the offset of `addr` within its range.
    pub fn resolve(&self, addr: u64) -> Option<(K, u64)> {
        let (&base, range) = self.ranges.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset < range.len).then_some((range.key, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_finds_key_and_offset() {
        let mut bus = Bus::new();
        bus.insert(0x3f8, 8, 's').unwrap();
        bus.insert(0x20, 2, 'p').unwrap();
        assert_eq!(bus.resolve(0x3f8), Some(('s', 0)));
        assert_eq!(bus.resolve(0x3ff), Some(('s', 7)));
        assert_eq!(bus.resolve(0x400), None);
        assert_eq!(bus.resolve(0x21), Some(('p', 1)));
        assert_eq!(bus.resolve(0x1f), None);
    }

    #[test]
    fn insert_overlapping_range_returns_overlap() {
        let mut bus = Bus::new();
        bus.insert(0x100, 0x10, 1).unwrap();
        assert!(matches!(
            bus.insert(0x10f, 1, 2),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0xf8, 0x10, 2),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0x100, 1, 2),
            Err(BusError::Overlap { .. })
        ));
        bus.insert(0x110, 1, 3).unwrap();
        bus.insert(0xf0, 0x10, 4).unwrap();
    }

    #[test]
    fn insert_empty_range_returns_error() {
        let mut bus: Bus<u8> = Bus::new();
        assert_eq!(
            bus.insert(5, 0, 1),
            Err(BusError::EmptyRange { base: 5, len: 0 })
        );
    }
}
