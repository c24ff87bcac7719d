//! The clock page: exit-free clock reads and timer arming for the guest.
//!
//! A page of guest RAM (reserved in the e820 map, at
//! [`layout::CLOCK_PAGE_ADDR`]) that the guest kernel's `detvisor`
//! clocksource and clockevent use instead of the HPET's registers (patch
//! `guest-image/patches/0004-*`; the kernel finds it through
//! `detvisor=<address>` on its command line). Layout, little-endian:
//!
//! | offset | field         | written by | meaning                                   |
//! |--------|---------------|------------|-------------------------------------------|
//! | 0x00   | `magic` u32   | VMM        | [`MAGIC`] ("DVPV")                        |
//! | 0x04   | `version` u32 | VMM        | [`VERSION`]                               |
//! | 0x08   | `exits` u64   | VMM        | guest-caused exits so far                 |
//! | 0x10   | `time_ns` u64 | VMM        | virtual time at the last of them          |
//! | 0x18   | `deadline` u64| guest      | clockevent deadline (virtual ns), 0 = none; the VMM clears it when it fires |
//! | 0x20   | `seen_exits`  | guest      | the exit count `reads` belongs to         |
//! | 0x28   | `reads` u64   | guest      | clock reads since `seen_exits` changed    |
//!
//! Determinism: the VMM writes the page only at guest-caused exits
//! ([`ClockPage::publish`], called by the exit handler, and once before the
//! first entry after a boot or a restore, with the values of the last
//! exit), and reads the deadline only at guest-caused exits (every device
//! step is one). So what the guest reads, and when its timer fires, is a
//! function of its own instructions. The writes go through the guest memory
//! handle, whose dirty bitmap incremental snapshots and resets consult.
//!
//! The guest's reader forces an exit (a write to
//! [`layout::CLOCK_PAGE_EXIT_PORT`]) after [`READS_PER_EXIT`] consecutive
//! reads that saw no new exit, so a loop that polls the clock progresses.

use crate::layout;
use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

/// "DVPV", little-endian.
pub const MAGIC: u32 = 0x5650_5644;
/// The page layout's version; the guest kernel checks it.
pub const VERSION: u32 = 1;
/// The guest's forced-exit rule: after this many consecutive clock reads
/// that saw no new exit, the reader writes the exit port (mirrors
/// `DETVISOR_READS_PER_EXIT` in the guest kernel patch).
pub const READS_PER_EXIT: u64 = 64;

const OFFSET_MAGIC: u64 = 0x00;
const OFFSET_VERSION: u64 = 0x04;
const OFFSET_EXITS: u64 = 0x08;
const OFFSET_TIME: u64 = 0x10;
const OFFSET_DEADLINE: u64 = 0x18;

/// How the guest reads the time and takes its timer interrupts: one
/// concept, parsed and printed here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitPath {
    /// The clock page (no exit per clock read or timer arming) and an
    /// auto-EOI PIC (no port access per interrupt).
    #[default]
    ClockPage,
    /// The path before the clock page: the HPET as clocksource and
    /// clockevent, and an EOI, a mask and an unmask per interrupt. Kept
    /// for comparisons (`bench exits`).
    Legacy,
}

impl ExitPath {
    pub const ALL: [ExitPath; 2] = [ExitPath::ClockPage, ExitPath::Legacy];

    pub fn as_str(self) -> &'static str {
        match self {
            ExitPath::ClockPage => "clock-page",
            ExitPath::Legacy => "legacy",
        }
    }
}

impl fmt::Display for ExitPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown exit path {0:?}: expected clock-page or legacy")]
pub struct ExitPathError(String);

impl FromStr for ExitPath {
    type Err = ExitPathError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ExitPath::ALL
            .into_iter()
            .find(|path| path.as_str() == text)
            .ok_or_else(|| ExitPathError(text.to_owned()))
    }
}

/// The VMM's side of the clock page.
pub struct ClockPage {
    memory: GuestMemory,
    /// Deadlines fired (a diagnostic; not guest-visible).
    fired: u64,
}

impl ClockPage {
    pub fn new(memory: GuestMemory) -> Self {
        ClockPage { memory, fired: 0 }
    }

    /// The kernel command-line entry that points the guest at the page.
    pub fn cmdline_fragment() -> String {
        format!("detvisor={:#x}", layout::CLOCK_PAGE_ADDR)
    }

    fn write_u64(&self, offset: u64, value: u64) {
        // The page is in low RAM, which every machine has (the smallest RAM
        // is 64 MiB): the write cannot miss.
        let _ = self
            .memory
            .write_obj(value, GuestAddress(layout::CLOCK_PAGE_ADDR + offset));
    }

    fn read_u64(&self, offset: u64) -> u64 {
        self.memory
            .read_obj(GuestAddress(layout::CLOCK_PAGE_ADDR + offset))
            .unwrap_or(0)
    }

    /// Writes the exit count and the virtual time: call it only at
    /// guest-caused exits (and before the first entry after a boot or a
    /// restore, with the last exit's values).
    pub fn publish(&self, exits: u64, now: VirtNanos) {
        // The VMM's fields are contiguous (magic, version, exits, time): one
        // write per exit, not one per field.
        debug_assert_eq!(OFFSET_VERSION, OFFSET_MAGIC + 4);
        debug_assert_eq!(OFFSET_EXITS, OFFSET_MAGIC + 8);
        debug_assert_eq!(OFFSET_TIME, OFFSET_MAGIC + 16);
        let mut fields = [0u8; 24];
        fields[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        fields[4..8].copy_from_slice(&VERSION.to_le_bytes());
        fields[8..16].copy_from_slice(&exits.to_le_bytes());
        fields[16..24].copy_from_slice(&now.0.to_le_bytes());
        // The page is in low RAM, which every machine has: it cannot miss.
        let _ = self.memory.write_slice(
            &fields,
            GuestAddress(layout::CLOCK_PAGE_ADDR + OFFSET_MAGIC),
        );
    }

    /// The deadline the guest's clockevent armed, if any.
    pub fn deadline(&self) -> Option<VirtNanos> {
        match self.read_u64(OFFSET_DEADLINE) {
            0 => None,
            at => Some(VirtNanos(at)),
        }
    }

    /// If the armed deadline has been reached at `now`, clears it and
    /// returns true (the caller raises the timer interrupt).
    pub fn take_due(&mut self, now: VirtNanos) -> bool {
        match self.deadline() {
            Some(at) if at <= now => {
                self.write_u64(OFFSET_DEADLINE, 0);
                self.fired += 1;
                true
            }
            _ => false,
        }
    }

    pub fn fired(&self) -> u64 {
        self.fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn guest_arms(memory: &GuestMemory, at: u64) {
        memory
            .write_obj(at, GuestAddress(layout::CLOCK_PAGE_ADDR + OFFSET_DEADLINE))
            .unwrap();
    }

    #[test]
    fn test_exit_path_parses_what_it_prints() {
        for path in ExitPath::ALL {
            assert_eq!(path.to_string().parse::<ExitPath>(), Ok(path));
            let json = serde_json::to_string(&path).unwrap();
            assert_eq!(json, format!("\"{path}\""));
            assert_eq!(serde_json::from_str::<ExitPath>(&json).unwrap(), path);
        }
        let err = "hpet".parse::<ExitPath>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown exit path \"hpet\": expected clock-page or legacy"
        );
        assert_eq!(ExitPath::default(), ExitPath::ClockPage);
    }

    #[test]
    fn test_publish_writes_the_layout_the_guest_reads() {
        let memory = memory();
        let page = ClockPage::new(memory.clone());
        page.publish(7, VirtNanos(1_400));
        let at = |offset: u64| GuestAddress(layout::CLOCK_PAGE_ADDR + offset);
        assert_eq!(memory.read_obj::<u32>(at(0)).unwrap(), MAGIC);
        assert_eq!(&MAGIC.to_le_bytes(), b"DVPV");
        assert_eq!(memory.read_obj::<u32>(at(4)).unwrap(), VERSION);
        assert_eq!(memory.read_obj::<u64>(at(8)).unwrap(), 7);
        assert_eq!(memory.read_obj::<u64>(at(0x10)).unwrap(), 1_400);
        // The guest's own fields are left alone.
        memory.write_obj(5u64, at(0x28)).unwrap();
        page.publish(8, VirtNanos(1_600));
        assert_eq!(memory.read_obj::<u64>(at(0x28)).unwrap(), 5);
    }

    #[test]
    fn test_deadline_fires_once_when_reached_and_is_cleared() {
        let memory = memory();
        let mut page = ClockPage::new(memory.clone());
        assert_eq!(page.deadline(), None);
        assert!(!page.take_due(VirtNanos(u64::MAX)));
        guest_arms(&memory, 5_000);
        assert_eq!(page.deadline(), Some(VirtNanos(5_000)));
        assert!(!page.take_due(VirtNanos(4_999)));
        assert!(page.take_due(VirtNanos(5_000)));
        assert_eq!(page.deadline(), None);
        assert!(!page.take_due(VirtNanos(6_000)));
        assert_eq!(page.fired(), 1);
    }

    #[test]
    fn test_publish_marks_the_page_dirty_for_snapshots() {
        use vm_memory::bitmap::Bitmap;
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        let memory = memory();
        let page = ClockPage::new(memory.clone());
        page.publish(1, VirtNanos(200));
        let region = memory.iter().next().unwrap();
        assert!(region.bitmap().dirty_at(layout::CLOCK_PAGE_ADDR as usize));
        assert!(!region.bitmap().dirty_at(0));
    }
}
