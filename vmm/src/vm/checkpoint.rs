//! In-place checkpoints of a session (the fuzzing loop's reset) and the
//! dirty-page log they rest on: taking one, and returning the live guest to
//! it by copying back only the pages written since.
//!
//! The rules about pages live in `kept_pages` (plain data, unit-tested);
//! this file connects them to KVM's dirty log and the guest's mapping.

use super::kept_pages::{self, CheckpointPages, GuestPages, InitialPages};
use super::memory::{host_ram, PAGE_SIZE};
use super::memory_scan::{candidate_pages, private_copies, MemoryBacking};
use super::{kvm_err, stepping, CheckpointError, ResetStats, Session, SessionState, VmError};
use crate::irq_window::WindowGuard;
use crate::vcpu_state;
use std::time::{Duration, Instant};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// A moment of a session kept in host memory, to return to in place
/// (`Session::reset_to`) as often as wanted: the fuzzing loop's reset.
pub struct Checkpoint {
    state: SessionState,
    pages: CheckpointPages,
}

impl Checkpoint {
    pub fn exits(&self) -> u64 {
        self.state.machine.exits
    }

    /// Pages it keeps a copy of: when taken, for a session restored from a
    /// snapshot, its private copies (pages written since the restore, and
    /// layers read in rather than mapped); for a fresh one, the non-zero
    /// pages. Resets add the pages they return (see `reset_to`).
    pub fn pages_kept(&self) -> u64 {
        self.pages.len()
    }
}

/// The live guest RAM mapping, page by page, for a reset.
struct MappedRam {
    base: *mut u8,
    len: usize,
}

impl MappedRam {
    /// # Safety
    /// `base..base+len` must be the live, writable guest RAM mapping, with
    /// the vCPU stopped and no other reference to the memory alive, for as
    /// long as the value is used.
    unsafe fn new((base, len): (*mut u8, usize)) -> Self {
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
        if !self.vm.dirty_log {
            self.vm
                .register_memory(kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES)?;
            self.vm.dirty_log = true;
        }
        self.take_dirty_pages().map(drop)
    }

    /// The guest pages (page numbers, ascending) written since the previous
    /// call or `start_dirty_log`, by the guest or by the VMM; resets the log.
    /// May include a few pages that were only touched (KVM's own page-table
    /// walks), never misses a written one.
    pub fn take_dirty_pages(&mut self) -> Result<Vec<u64>, VmError> {
        // The log restarts here: a checkpoint counting from earlier is stale.
        self.live_checkpoint.clear();
        self.read_dirty_log()
    }

    fn read_dirty_log(&mut self) -> Result<Vec<u64>, VmError> {
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
        Ok(pages)
    }

    /// Keeps this moment in memory for `reset_to`: the complete state and a
    /// copy of the pages the backing cannot give back by itself. Restored
    /// from a snapshot, those are only the pages written since the restore
    /// (the others are the file's, shared copy-on-write); fresh from boot,
    /// the non-zero pages. Starts the dirty log, so a reset costs only the
    /// pages written since; a session that is reset must not also take
    /// incremental snapshots (they share the log).
    pub fn checkpoint(&mut self) -> Result<Checkpoint, VmError> {
        let state = self.capture()?;
        self.start_dirty_log()?;
        let (ptr, ram_len) = host_ram(&self.vm.memory);
        // SAFETY: `ptr..ptr+ram_len` is the live guest RAM mapping, owned by
        // the session, which outlives this borrow; the vCPU is stopped (we
        // hold the session), so nothing writes to it meanwhile.
        let ram = unsafe { std::slice::from_raw_parts(ptr, ram_len) };
        let pages = match &self.backing {
            MemoryBacking::File { .. } => match private_copies(ptr, ram_len) {
                Some(copies) => CheckpointPages::new(ram, InitialPages::Flagged(&copies)),
                // Without pagemap a page the guest zeroed cannot be told from
                // the file's: keep every page that may be non-zero, zero or not.
                None => {
                    let candidates = candidate_pages(ptr, ram_len, 0, &self.backing);
                    CheckpointPages::new(ram, InitialPages::Flagged(&candidates))
                }
            },
            // Fresh memory: `DONTNEED` gives back zeros, so every non-zero
            // page is kept.
            MemoryBacking::Anonymous => {
                let candidates = candidate_pages(ptr, ram_len, 0, &self.backing);
                CheckpointPages::new(ram, InitialPages::FlaggedNonZero(&candidates))
            }
        };
        self.live_checkpoint.set(&pages);
        Ok(Checkpoint { state, pages })
    }

    /// Returns this session, in place, to `checkpoint` (taken from it): the
    /// pages written since the checkpoint or the previous reset are copied
    /// back, and the vCPU, devices, clock, records and console digest are
    /// restored. What runs next is exactly what ran after the checkpoint
    /// (or, after `rekey`, an alternate history from it).
    pub fn reset_to(&mut self, checkpoint: &mut Checkpoint) -> Result<ResetStats, VmError> {
        let ram = host_ram(&self.vm.memory);
        self.live_checkpoint.check(&checkpoint.pages, ram.1)?;
        if self.window.stepping() {
            // Only after a failed step: never leave the guest single-stepped.
            stepping::set_single_step(&self.vm.vcpu, false)?;
        }
        // A pending I/O completion would otherwise run after the restore and
        // change the restored registers.
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let dirty = self.read_dirty_log()?;
        // SAFETY: `ram` is the live guest RAM mapping, owned by the session
        // and writable; the vCPU is not running and nothing else borrows the
        // memory while `mapped` is used (we hold `&mut self`).
        let mut mapped = unsafe { MappedRam::new(ram) };
        let stats = checkpoint.pages.reset(&dirty, &mut mapped)?;
        self.restore_state(&checkpoint.state)?;
        self.window = WindowGuard::default();
        self.started = Instant::now();
        self.wall_setup = Duration::ZERO;
        Ok(stats)
    }
}
