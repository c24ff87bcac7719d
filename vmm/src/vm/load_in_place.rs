//! Loading a saved moment into a live session in place (a campaign's
//! spilled checkpoint coming back from disk): guest RAM is made equal to
//! the saved image by writing only the pages that differ, and every page
//! written is told to the page ledger as written, so the session's other
//! checkpoints stay valid (the tree copies them back like any page the
//! guest wrote) and the digest is brought up to date from them. Then the
//! vCPU, devices, clock, records and console digest are restored as a
//! reset restores them. No new VM, no new mapping.

use super::checkpoint::MappedRam;
use super::kept_pages::load_pages;
use super::memory::{host_ram, PAGE_SIZE};
use super::memory_scan::candidate_pages;
use super::{stepping, IncompatibleState, Session, SessionState, VmError};
use crate::irq_window::WindowGuard;
use crate::{cpu_model, vcpu_state};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// What one in-place load did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadStats {
    /// Pages that could differ (non-zero in the image or in RAM), compared.
    pub pages_compared: u64,
    /// Pages that did differ, written.
    pub pages_written: u64,
}

impl Session {
    /// Returns this session, in place, to a saved moment of the same run:
    /// `state` its complete state, `image` its guest RAM (a private mapping
    /// of a snapshot, say), `stored` the byte ranges the image may hold
    /// non-zero data in (every other byte of it is zero). Pages that differ
    /// are written and noted as written since the present's base, so every
    /// checkpoint of the session stays valid; the digest afterwards is the
    /// saved moment's.
    pub fn load_in_place(
        &mut self,
        state: &SessionState,
        image: &[u8],
        stored: &[(u64, u64)],
    ) -> Result<LoadStats, VmError> {
        if state.cpu_model_version != cpu_model::CPU_MODEL_VERSION {
            return Err(IncompatibleState::CpuModel {
                snapshot: state.cpu_model_version,
                ours: cpu_model::CPU_MODEL_VERSION,
            }
            .into());
        }
        let (ptr, ram_len) = host_ram(&self.vm.memory);
        for len in [state.ram_bytes, image.len() as u64] {
            if len != ram_len as u64 {
                return Err(IncompatibleState::RamSize {
                    memory: ram_len as u64,
                    state: len,
                }
                .into());
            }
        }
        if self.window.stepping() {
            stepping::set_single_step(&self.vm.vcpu, false)?;
        }
        // As for a reset: no I/O completion may land on the loaded registers.
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        if self.vm.dirty_log {
            // What the guest wrote so far is the tree's to know first.
            self.read_dirty_log()?;
        }
        // Pages that may differ: non-zero now, or stored in the image.
        let mut in_image = vec![false; ram_len / PAGE_SIZE];
        for &(start, end) in stored {
            let first = (start as usize / PAGE_SIZE).min(in_image.len());
            let last = (end as usize).div_ceil(PAGE_SIZE).min(in_image.len());
            in_image[first..last].fill(true);
        }
        let mut maybe = candidate_pages(ptr, ram_len, 0, &self.backing);
        maybe.resize(in_image.len(), true);
        for (m, &i) in maybe.iter_mut().zip(&in_image) {
            *m |= i;
        }
        let compared = maybe.iter().filter(|&&m| m).count() as u64;
        // SAFETY: `ptr..ptr+ram_len` is the live guest RAM mapping, owned by
        // the session and writable; the vCPU is not running and nothing
        // else borrows the memory while `mapped` is used (we hold `&mut self`).
        let mut mapped = unsafe { MappedRam::new((ptr, ram_len)) };
        let pages = maybe
            .iter()
            .zip(&in_image)
            .enumerate()
            .filter(|(_, (&m, _))| m)
            .map(|(page, (_, &i))| (page as u64, i));
        let written = load_pages(&mut mapped, image, pages);
        // Written by the VMM behind KVM's log and the memory's bitmap: the
        // ledger hears of them here, as of a guest's writes.
        self.note_loaded(&written);
        self.restore_state(state)?;
        self.window = WindowGuard::default();
        self.started = Instant::now();
        self.wall_setup = Duration::ZERO;
        Ok(LoadStats {
            pages_compared: compared,
            pages_written: written.len() as u64,
        })
    }
}
