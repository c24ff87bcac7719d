//! In-place checkpoints of a session (the fuzzing loop's reset, the
//! campaign's tree of moments) and the dirty-page log they rest on: taking
//! them, moving the live guest among them by copying back only the pages
//! that differ, and keeping the memory digest up to date from the pages
//! that changed.
//!
//! The rules about pages live in `kept_pages` (the tree, plain data,
//! unit-tested) and `page_digest`; this file connects them to KVM's dirty
//! log and the guest's mapping.

use super::kept_pages::{self, root_pages, CheckpointMemory, GuestPages, InitialPages, NodeId};
use super::memory::{host_ram, PAGE_SIZE};
use super::memory_scan::{
    candidate_pages, memory_hash_and_residency, page_hashes_and_residency, private_copies,
    resident_bytes, MemoryBacking,
};
use super::{kvm_err, stepping, CheckpointError, ResetStats, Session, SessionState, VmError};
use crate::irq_window::WindowGuard;
use crate::vcpu_state;
use std::time::{Duration, Instant};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// A moment of a session kept in host memory, to return to in place
/// (`Session::reset_to`) as often as wanted, from anywhere in the session's
/// tree of checkpoints. Its pages are the session's: hand it back with
/// `Session::release_checkpoint` to free them.
pub struct Checkpoint {
    state: SessionState,
    node: NodeId,
    pages_kept: u64,
}

impl Checkpoint {
    pub fn exits(&self) -> u64 {
        self.state.machine.exits
    }

    /// Pages it kept a copy of when taken: the first of a session keeps,
    /// restored from a snapshot, its private copies (pages written since the
    /// restore, and layers read in rather than mapped), fresh from boot the
    /// non-zero pages; any later one the pages written since the checkpoint
    /// the session was last reset to or taken at.
    pub fn pages_kept(&self) -> u64 {
        self.pages_kept
    }
}

/// The live guest RAM mapping, page by page, for a reset.
pub(super) struct MappedRam {
    base: *mut u8,
    len: usize,
}

impl MappedRam {
    /// # Safety
    /// `base..base+len` must be the live, writable guest RAM mapping, with
    /// the vCPU stopped and no other reference to the memory alive, for as
    /// long as the value is used.
    pub(super) unsafe fn new((base, len): (*mut u8, usize)) -> Self {
        MappedRam { base, len }
    }

    fn page_ptr(&self, page: u64) -> *mut u8 {
        assert!(
            (page as usize + 1) * PAGE_SIZE <= self.len,
            "page {page} is beyond RAM"
        );
        // SAFETY: checked just above to lie inside the mapping `new` was given.
        unsafe { self.base.add(page as usize * PAGE_SIZE) }
    }
}

impl GuestPages for MappedRam {
    fn len(&self) -> usize {
        self.len
    }

    fn page(&self, page: u64) -> &[u8] {
        // SAFETY: one page inside the live mapping (`page_ptr`), nothing
        // writes it while the returned borrow of `self` lives (see `new`).
        unsafe { std::slice::from_raw_parts(self.page_ptr(page), PAGE_SIZE) }
    }

    fn write_page(&mut self, page: u64, bytes: &[u8]) {
        assert_eq!(bytes.len(), PAGE_SIZE);
        // SAFETY: one writable page of guest RAM (`page_ptr`); `bytes` is
        // the checkpoint's own buffer, not guest RAM, so they do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.page_ptr(page), PAGE_SIZE) };
    }

    fn discard(&mut self, page: u64) -> std::io::Result<()> {
        // SAFETY: one page inside the guest RAM mapping (`page_ptr`), no
        // reference to it alive; DONTNEED on a private mapping only discards
        // our copy, and KVM's mappings follow (MMU notifier).
        if unsafe { libc::madvise(self.page_ptr(page).cast(), PAGE_SIZE, libc::MADV_DONTNEED) } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Session {
    /// Starts tracking which guest pages change: KVM logs the guest's own
    /// writes, and the memory's bitmap the VMM's (device) writes. From here
    /// on, `take_dirty_pages` tells what changed since the previous call (or
    /// since now). Costs the guest a write fault per page per interval.
    pub fn start_dirty_log(&mut self) -> Result<(), VmError> {
        self.ram_ledger.outside_reader = true;
        self.turn_dirty_log_on()?;
        self.take_dirty_pages().map(drop)
    }

    fn turn_dirty_log_on(&mut self) -> Result<(), VmError> {
        if !self.vm.dirty_log {
            self.vm
                .register_memory(kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES)?;
            self.vm.dirty_log = true;
            // From here on the log counts; what it held before means nothing.
            self.read_dirty_log()?;
        }
        Ok(())
    }

    /// The guest pages (page numbers, ascending) written since the previous
    /// call or `start_dirty_log`, by the guest or by the VMM, or rewritten
    /// by a reset; resets the log. May include a few pages that were only
    /// touched (KVM's own page-table walks), never misses a written one.
    /// The checkpoints and the digest hear of them too, so they stay valid.
    pub fn take_dirty_pages(&mut self) -> Result<Vec<u64>, VmError> {
        self.ram_ledger.outside_reader = true;
        self.read_dirty_log()?;
        Ok(std::mem::take(&mut self.ram_ledger.unreported)
            .into_iter()
            .collect())
    }

    /// Reads and resets the dirty log, telling the ledger.
    pub(super) fn read_dirty_log(&mut self) -> Result<Vec<u64>, VmError> {
        if !self.vm.dirty_log {
            return Err(CheckpointError::DirtyLogOff.into());
        }
        let mut pages = Vec::new();
        let mut first_page = 0u64;
        for (slot, region) in self.vm.memory.iter().enumerate() {
            let guest_writes = self
                .vm
                .vm
                .get_dirty_log(slot as u32, region.len() as usize)
                .map_err(kvm_err("KVM_GET_DIRTY_LOG"))?;
            let mapping: &vm_memory::mmap::MmapRegion<AtomicBitmap> = region;
            let vmm_writes = mapping.bitmap().get_and_reset();
            kept_pages::collect_dirty(first_page, &guest_writes, &vmm_writes, &mut pages);
            first_page += region.len() / PAGE_SIZE as u64;
        }
        self.ram_ledger.note_written(&pages);
        Ok(pages)
    }

    /// The VMM wrote these pages behind the dirty log (an in-place load):
    /// the checkpoints, the digest and a snapshot chain hear of them as of
    /// the guest's writes.
    pub(super) fn note_loaded(&mut self, pages: &[u64]) {
        self.ram_ledger.note_written(pages);
    }

    /// Keeps this moment in memory for `reset_to`: the complete state, and
    /// the pages needed to come back to it from any other checkpoint. The
    /// first checkpoint of a session (the tree's root) copies the pages the
    /// backing cannot give back by itself: restored from a snapshot, the
    /// pages written since the restore (the others are the file's, shared
    /// copy-on-write); fresh from boot, the non-zero pages. Each later one
    /// is a child of the checkpoint the session was last reset to or taken
    /// at, and copies only the pages written since. Starts the dirty log.
    pub fn checkpoint(&mut self) -> Result<Checkpoint, VmError> {
        let state = self.capture()?;
        self.turn_dirty_log_on()?;
        let dirty = self.read_dirty_log()?;
        let (ptr, ram_len) = host_ram(&self.vm.memory);
        // SAFETY: `ptr..ptr+ram_len` is the live guest RAM mapping, owned by
        // the session, and writable; the vCPU is stopped (we hold the
        // session), so nothing else touches it while `mapped` is used.
        let mapped = unsafe { MappedRam::new((ptr, ram_len)) };
        let backing = &self.backing;
        let node = self
            .ram_ledger
            .tree
            .take(&mapped, &dirty, |ram| match backing {
                MemoryBacking::File { .. } => match private_copies(ptr, ram_len) {
                    Some(copies) => root_pages(ram, InitialPages::Flagged(&copies)),
                    // Without pagemap a page the guest zeroed cannot be told from
                    // the file's: keep every page that may be non-zero, zero or not.
                    None => {
                        let candidates = candidate_pages(ptr, ram_len, 0, backing);
                        root_pages(ram, InitialPages::Flagged(&candidates))
                    }
                },
                // Fresh memory: `DONTNEED` gives back zeros, so every non-zero
                // page is kept.
                MemoryBacking::Anonymous => {
                    let candidates = candidate_pages(ptr, ram_len, 0, backing);
                    root_pages(ram, InitialPages::FlaggedNonZero(&candidates))
                }
            })?;
        Ok(Checkpoint {
            state,
            pages_kept: self.ram_ledger.tree.pages_of(node),
            node,
        })
    }

    /// Returns this session, in place, to `checkpoint` (taken from it, from
    /// anywhere in its tree): the pages written since the checkpoint it was
    /// last reset to or taken at, and those that differ on the way from
    /// there to `checkpoint`, are copied back, and the vCPU, devices, clock,
    /// records and console digest are restored. What runs next is exactly
    /// what ran after the checkpoint (or, after `rekey`, an alternate
    /// history from it).
    pub fn reset_to(&mut self, checkpoint: &Checkpoint) -> Result<ResetStats, VmError> {
        if self.window.stepping() {
            // Only after a failed step: never leave the guest single-stepped.
            stepping::set_single_step(&self.vm.vcpu, false)?;
        }
        // A pending I/O completion would otherwise run after the restore and
        // change the restored registers.
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let dirty = if self.ram_ledger.tree.is_empty() {
            Vec::new()
        } else {
            self.read_dirty_log()?
        };
        let ram = host_ram(&self.vm.memory);
        // SAFETY: `ram` is the live guest RAM mapping, owned by the session
        // and writable; the vCPU is not running and nothing else borrows the
        // memory while `mapped` is used (we hold `&mut self`).
        let mut mapped = unsafe { MappedRam::new(ram) };
        let ledger = &mut self.ram_ledger;
        let (stats, rewritten) = ledger.tree.reset(checkpoint.node, &dirty, &mut mapped)?;
        ledger.note_rewritten(&rewritten);
        self.restore_state(&checkpoint.state)?;
        self.window = WindowGuard::default();
        self.started = Instant::now();
        self.wall_setup = Duration::ZERO;
        Ok(stats)
    }

    /// Lets `checkpoint` go: it can no longer be reset to, and the pages
    /// only it needed are freed (see [`Session::checkpoint_memory`]).
    pub fn release_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), VmError> {
        Ok(self.ram_ledger.tree.release(checkpoint.node)?)
    }

    /// How much host memory the checkpoints hold, and the budget.
    pub fn checkpoint_memory(&self) -> CheckpointMemory {
        self.ram_ledger.tree.memory()
    }

    /// The most bytes of kept pages from now on (`None`: no limit): a
    /// checkpoint that would pass it is refused with
    /// `CheckpointError::OverBudget`, for the caller to release older ones
    /// (or to write the moment as an incremental snapshot instead).
    pub fn set_checkpoint_budget(&mut self, bytes: Option<u64>) {
        self.ram_ledger.tree.set_budget(bytes);
    }

    /// The guest's whole RAM hashed, as hex: equal for equal memory (a
    /// seek's check that a position is the same however it is reached).
    pub fn memory_digest_hex(&mut self) -> String {
        format!("{:016x}", self.memory_digest(false).0)
    }

    /// The digest of guest RAM (see `page_digest`), and (when `residency`)
    /// the bytes of it the host has backed. With the dirty log on
    /// (checkpoints, snapshot chains), RAM is scanned once and from then on
    /// only the pages changed since the previous digest are hashed again.
    pub(super) fn memory_digest(&mut self, residency: bool) -> (u64, Option<u64>) {
        if !self.vm.dirty_log {
            let (digest, resident) = memory_hash_and_residency(&self.vm.memory, &self.backing);
            return (digest, Some(resident));
        }
        if self.read_dirty_log().is_err() {
            // The log could not be read: what changed is unknown, so the
            // kept hashes are of no use; a whole scan is still right.
            self.ram_ledger.hashes = None;
            let (digest, resident) = memory_hash_and_residency(&self.vm.memory, &self.backing);
            return (digest, Some(resident));
        }
        let (ptr, ram_len) = host_ram(&self.vm.memory);
        let ledger = &mut self.ram_ledger;
        let (hashes, resident) = match &mut ledger.hashes {
            Some(hashes) => {
                let resident = residency.then(|| resident_bytes(&self.vm.memory, &self.backing));
                (hashes, resident)
            }
            None => {
                let (hashes, resident) =
                    page_hashes_and_residency(&self.vm.memory, &self.backing, ram_len);
                ledger.unhashed.clear();
                (ledger.hashes.insert(hashes), Some(resident))
            }
        };
        // SAFETY: the live guest RAM mapping, owned by the session; the vCPU
        // is stopped (we hold `&mut self`), so nothing writes to it while
        // `mapped` is read.
        let mapped = unsafe { MappedRam::new((ptr, ram_len)) };
        for page in std::mem::take(&mut ledger.unhashed) {
            if (page as usize + 1) * PAGE_SIZE <= ram_len {
                hashes.set(page, mapped.page(page));
            }
        }
        (hashes.digest(), resident)
    }
}
