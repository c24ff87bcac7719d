//! The memory bookkeeping of in-place checkpoints, over plain data: which
//! pages a checkpoint keeps, which checkpoint the dirty log counts from, and
//! what a reset copies back or returns to the backing.
//!
//! Nothing here touches KVM or the guest's mapping directly: guest RAM is
//! reached through [`GuestPages`], so the rules can be tested over byte
//! buffers.

use super::memory::PAGE_SIZE;
use super::memory_scan::flagged_pages;
use serde::Serialize;
use std::collections::BTreeMap;
use thiserror::Error;

/// A checkpoint cannot be taken or returned to.
#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("dirty pages were asked for, but dirty logging was never started")]
    DirtyLogOff,
    #[error("this checkpoint is not the session's live one (another checkpoint or a snapshot read the dirty log since, or it is of another session): take a new one")]
    StaleCheckpoint,
    #[error("returning guest page {page} to its checkpoint")]
    ResetPage {
        page: u64,
        #[source]
        source: std::io::Error,
    },
}

/// What one in-place reset did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResetStats {
    /// Pages written since the checkpoint (or the previous reset) copied back
    /// from the checkpoint ...
    pub pages_copied: u64,
    /// ... and returned to the backing's page instead (the snapshot file's,
    /// or zeros: what they were at the checkpoint), which the checkpoint
    /// keeps from now on.
    pub pages_fetched: u64,
}

/// Guest RAM as a reset sees it: pages to read, overwrite, or hand back to
/// the backing.
pub(super) trait GuestPages {
    /// Bytes of RAM (a whole number of pages).
    fn len(&self) -> usize;
    /// The current bytes of `page`.
    fn page(&self, page: u64) -> &[u8];
    /// Overwrites `page` with `bytes` (one page).
    fn write_page(&mut self, page: u64, bytes: &[u8]);
    /// Drops the private copy of `page`, so it reads as the backing's page
    /// again (the snapshot file's, or zeros).
    fn discard(&mut self, page: u64) -> std::io::Result<()>;
}

/// Which pages a new checkpoint keeps a copy of, per page of RAM.
pub(super) enum InitialPages<'a> {
    /// Every flagged page, zero or not: a restored session's private copies
    /// (a page the guest zeroed differs from the file's).
    Flagged(&'a [bool]),
    /// The flagged pages that are non-zero: fresh memory, where the backing
    /// gives back zeros for every other page.
    FlaggedNonZero(&'a [bool]),
}

/// Source of `CheckpointPages::id`.
static NEXT_CHECKPOINT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The guest pages a checkpoint keeps, and which RAM they are of.
pub(super) struct CheckpointPages {
    /// Unique in the process: a reset accepts only the session's live
    /// checkpoint (the dirty log counts from it).
    id: u64,
    /// Length of the guest RAM it was taken of.
    ram_len: usize,
    /// Guest pages kept, by page number: where each one's bytes are in
    /// `bytes` (slot `i` is `bytes[i * PAGE_SIZE..][..PAGE_SIZE]`). At first
    /// the pages that differ from what the backing gives back after
    /// `MADV_DONTNEED` (zeros for fresh memory; the snapshot file's bytes for
    /// a restored session); resets add each other page the first time they
    /// return it, so later resets copy it without a page fault.
    slots: BTreeMap<u64, usize>,
    bytes: Vec<u8>,
}

impl CheckpointPages {
    /// The pages of `ram` that `initial` selects.
    pub(super) fn new(ram: &[u8], initial: InitialPages<'_>) -> Self {
        let mut pages = CheckpointPages {
            id: NEXT_CHECKPOINT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ram_len: ram.len(),
            slots: BTreeMap::new(),
            bytes: Vec::new(),
        };
        match initial {
            InitialPages::Flagged(flags) => {
                for (page, chunk) in flagged_pages(ram, flags) {
                    pages.keep(page as u64, chunk);
                }
            }
            InitialPages::FlaggedNonZero(flags) => {
                for (page, chunk) in flagged_pages(ram, flags) {
                    if chunk.iter().any(|b| *b != 0) {
                        pages.keep(page as u64, chunk);
                    }
                }
            }
        }
        pages
    }

    /// How many pages it keeps a copy of.
    pub(super) fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The kept copy of `page`, if any.
    fn page(&self, page: u64) -> Option<&[u8]> {
        let slot = *self.slots.get(&page)?;
        Some(&self.bytes[slot * PAGE_SIZE..(slot + 1) * PAGE_SIZE])
    }

    fn keep(&mut self, page: u64, bytes: &[u8]) {
        self.slots.insert(page, self.slots.len());
        self.bytes.extend_from_slice(bytes);
    }

    /// Returns the `dirty` pages of `ram` to this checkpoint: a kept page is
    /// copied back; any other page was the backing's at the checkpoint, so
    /// its private copy is dropped, and the backing's page is kept from now
    /// on. Pages beyond the RAM are ignored.
    pub(super) fn reset(
        &mut self,
        dirty: &[u64],
        ram: &mut impl GuestPages,
    ) -> Result<ResetStats, CheckpointError> {
        let mut stats = ResetStats::default();
        for &page in dirty {
            if (page as usize + 1) * PAGE_SIZE > ram.len() {
                continue;
            }
            if self.page(page).is_none() {
                ram.discard(page)
                    .map_err(|source| CheckpointError::ResetPage { page, source })?;
                self.keep(page, ram.page(page));
                stats.pages_fetched += 1;
            } else {
                stats.pages_copied += 1;
            }
            // Written back even when just fetched: the guest, which wrote
            // this page in this loop and likely will again, then finds a
            // private copy instead of faulting on it.
            ram.write_page(page, self.page(page).expect("kept above"));
        }
        Ok(stats)
    }
}

/// Which checkpoint the dirty log counts from: the last one taken, until
/// anything else reads the log (a snapshot, a newer checkpoint).
#[derive(Debug, Default)]
pub(super) struct LiveCheckpoint(Option<u64>);

impl LiveCheckpoint {
    /// The dirty log counts from `pages` now.
    pub(super) fn set(&mut self, pages: &CheckpointPages) {
        self.0 = Some(pages.id);
    }

    /// The dirty log was read by someone else: no checkpoint is live.
    pub(super) fn clear(&mut self) {
        self.0 = None;
    }

    /// Whether a reset of RAM of `ram_len` bytes may use `pages`: only the
    /// live checkpoint, and only of RAM of that size.
    pub(super) fn check(
        &self,
        pages: &CheckpointPages,
        ram_len: usize,
    ) -> Result<(), CheckpointError> {
        if self.0 != Some(pages.id) || pages.ram_len != ram_len {
            return Err(CheckpointError::StaleCheckpoint);
        }
        Ok(())
    }
}

/// Appends to `pages` the numbers of the pages set in either bitmap (KVM's
/// log of the guest's writes, vm-memory's of the VMM's), counting from
/// `first_page`; the bitmaps may differ in length.
pub(super) fn collect_dirty(first_page: u64, guest: &[u64], vmm: &[u64], pages: &mut Vec<u64>) {
    for w in 0..guest.len().max(vmm.len()) {
        let mut bits = guest.get(w).copied().unwrap_or(0) | vmm.get(w).copied().unwrap_or(0);
        while bits != 0 {
            let bit = u64::from(bits.trailing_zeros());
            pages.push(first_page + w as u64 * 64 + bit);
            bits &= bits - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guest RAM over a buffer, with the backing (what a page reads as after
    /// its private copy is dropped) as a second buffer.
    struct FakeRam {
        ram: Vec<u8>,
        backing: Vec<u8>,
        discarded: Vec<u64>,
        fail_discard: bool,
    }

    impl FakeRam {
        /// RAM and its backing, one page per byte given, each page filled
        /// with its byte.
        fn new(ram: &[u8], backing: &[u8]) -> Self {
            let fill = |bytes: &[u8]| bytes.iter().flat_map(|b| [*b; PAGE_SIZE]).collect();
            FakeRam {
                ram: fill(ram),
                backing: fill(backing),
                discarded: Vec::new(),
                fail_discard: false,
            }
        }

        fn set(&mut self, page: u64, byte: u8) {
            let at = page as usize * PAGE_SIZE;
            self.ram[at..at + PAGE_SIZE].fill(byte);
        }

        /// The byte every page holds (pages are filled uniformly).
        fn bytes(&self) -> Vec<u8> {
            self.ram.chunks_exact(PAGE_SIZE).map(|p| p[0]).collect()
        }
    }

    impl GuestPages for FakeRam {
        fn len(&self) -> usize {
            self.ram.len()
        }
        fn page(&self, page: u64) -> &[u8] {
            &self.ram[page as usize * PAGE_SIZE..][..PAGE_SIZE]
        }
        fn write_page(&mut self, page: u64, bytes: &[u8]) {
            self.ram[page as usize * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(bytes);
        }
        fn discard(&mut self, page: u64) -> std::io::Result<()> {
            if self.fail_discard {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.discarded.push(page);
            let at = page as usize * PAGE_SIZE;
            self.ram[at..at + PAGE_SIZE].copy_from_slice(&self.backing[at..at + PAGE_SIZE]);
            Ok(())
        }
    }

    fn kept_pages(pages: &CheckpointPages) -> Vec<(u64, u8)> {
        pages
            .slots
            .keys()
            .map(|&p| (p, pages.page(p).expect("kept")[0]))
            .collect()
    }

    #[test]
    fn fresh_memory_keeps_the_non_zero_candidates() {
        let ram = FakeRam::new(&[1, 0, 3, 4], &[0; 4]);
        // Page 3 is not a candidate (never backed): not even looked at.
        let pages = CheckpointPages::new(
            &ram.ram,
            InitialPages::FlaggedNonZero(&[true, true, true, false]),
        );
        assert_eq!(kept_pages(&pages), [(0, 1), (2, 3)]);
        assert_eq!(pages.len(), 2);
    }

    #[test]
    fn a_restored_session_keeps_its_private_copies_even_zero_ones() {
        // Page 1 was zeroed by the guest: it differs from the file's page,
        // so it must be kept although it is zero.
        let ram = FakeRam::new(&[5, 0, 7], &[5, 6, 7]);
        let pages = CheckpointPages::new(&ram.ram, InitialPages::Flagged(&[false, true, true]));
        assert_eq!(kept_pages(&pages), [(1, 0), (2, 7)]);
    }

    #[test]
    fn a_reset_copies_kept_pages_back_and_fetches_the_others() {
        let mut ram = FakeRam::new(&[1, 0, 3, 0], &[0; 4]);
        let mut pages = CheckpointPages::new(&ram.ram, InitialPages::FlaggedNonZero(&[true; 4]));
        // The guest writes a kept page and a page that was zero.
        ram.set(0, 9);
        ram.set(3, 8);
        let stats = pages.reset(&[0, 3], &mut ram).expect("reset");
        assert_eq!((stats.pages_copied, stats.pages_fetched), (1, 1));
        assert_eq!(ram.bytes(), [1, 0, 3, 0]);
        // Only the page the checkpoint did not keep went back to the backing.
        assert_eq!(ram.discarded, [3]);
        // ... and is kept from now on: the next reset copies it.
        assert_eq!(kept_pages(&pages), [(0, 1), (2, 3), (3, 0)]);
        ram.set(3, 7);
        let stats = pages.reset(&[3], &mut ram).expect("second reset");
        assert_eq!((stats.pages_copied, stats.pages_fetched), (1, 0));
        assert_eq!(ram.bytes(), [1, 0, 3, 0]);
        assert_eq!(ram.discarded, [3]);
    }

    #[test]
    fn a_fetched_page_is_the_backing_s_page() {
        // A restored session: page 1 is the file's (6) and not kept.
        let mut ram = FakeRam::new(&[5, 6], &[5, 6]);
        let mut pages = CheckpointPages::new(&ram.ram, InitialPages::Flagged(&[false, false]));
        ram.set(1, 0);
        pages.reset(&[1], &mut ram).expect("reset");
        assert_eq!(ram.bytes(), [5, 6]);
        assert_eq!(kept_pages(&pages), [(1, 6)]);
    }

    #[test]
    fn a_reset_leaves_clean_pages_and_ignores_pages_beyond_ram() {
        let mut ram = FakeRam::new(&[1, 2], &[0; 2]);
        let mut pages = CheckpointPages::new(&ram.ram, InitialPages::FlaggedNonZero(&[true; 2]));
        // Page 1 changed but is not reported dirty: left as it is.
        ram.set(1, 4);
        let stats = pages.reset(&[2, 1000], &mut ram).expect("reset");
        assert_eq!(stats, ResetStats::default());
        assert_eq!(ram.bytes(), [1, 4]);
        assert!(ram.discarded.is_empty());
    }

    #[test]
    fn a_failed_discard_names_the_page() {
        let mut ram = FakeRam::new(&[0, 0], &[0; 2]);
        let mut pages = CheckpointPages::new(&ram.ram, InitialPages::FlaggedNonZero(&[true; 2]));
        ram.fail_discard = true;
        let err = pages.reset(&[1], &mut ram).expect_err("discard fails");
        assert!(
            matches!(err, CheckpointError::ResetPage { page: 1, .. }),
            "{err:?}"
        );
        assert_eq!(pages.len(), 0, "nothing kept for the failed page");
    }

    #[test]
    fn only_the_live_checkpoint_of_the_same_ram_is_accepted() {
        let ram = vec![0u8; 2 * PAGE_SIZE];
        let first = CheckpointPages::new(&ram, InitialPages::Flagged(&[false; 2]));
        let second = CheckpointPages::new(&ram, InitialPages::Flagged(&[false; 2]));
        assert_ne!(first.id, second.id);
        let mut live = LiveCheckpoint::default();
        assert!(matches!(
            live.check(&first, ram.len()),
            Err(CheckpointError::StaleCheckpoint)
        ));
        live.set(&first);
        live.check(&first, ram.len()).expect("the live checkpoint");
        // A newer checkpoint makes the first stale.
        live.set(&second);
        assert!(live.check(&first, ram.len()).is_err());
        live.check(&second, ram.len()).expect("the newer one");
        // Of RAM of another size (another session): refused.
        assert!(live.check(&second, ram.len() + PAGE_SIZE).is_err());
        // Someone else read the dirty log: nothing is live.
        live.clear();
        assert!(live.check(&second, ram.len()).is_err());
    }

    #[test]
    fn dirty_pages_merge_both_logs_in_order() {
        let mut pages = vec![];
        // Guest wrote pages 0 and 65, the VMM pages 0, 3 and 130 (a third
        // word only the VMM's bitmap has).
        collect_dirty(100, &[1, 1 << 1], &[1 | 1 << 3, 0, 1 << 2], &mut pages);
        assert_eq!(pages, [100, 103, 165, 230]);
        collect_dirty(0, &[], &[], &mut pages);
        assert_eq!(pages.len(), 4, "empty logs add nothing");
    }
}
