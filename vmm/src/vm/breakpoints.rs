//! Software breakpoints for a debugger (`detvisor gdb`): a one-byte `HLT`
//! over the first byte of each kernel instruction asked for, present only
//! while the guest runs.
//!
//! A `HLT` at CPL 0 makes an exit to the VMM (the one instruction that
//! surely does here: KVM is not asked to report `INT3`, and the helper VM's
//! nested KVM was never shown to). The patches are written just before each
//! entry and taken out as soon as the guest exits, before the exit is
//! handled, so every record, hash, checkpoint and snapshot sees the
//! guest's own bytes: the only reader of a patch is the guest's code
//! between two exits (an instruction fetch at the breakpoint, or code
//! reading its own text, which Linux does only to patch it). A byte the
//! guest rewrote while patched is left as the guest wrote it.
//!
//! An exit at a patched `HLT` is a hit, not an exit of the history: it is
//! not handled, counted or recorded; RIP is put back on the breakpoint and
//! the run ends with [`VmError::BreakpointHit`], which the callers above
//! the session (an `up` run's driver among them) pass on untouched. Which
//! single step of its interval the hit is at is not known there: the
//! position is lost until the run is reset or restored, and a caller finds
//! it by replaying to the hit's exit and stepping to the address
//! ([`Session::step_to_address`]). User-space addresses are refused: a
//! `HLT` at CPL 3 is a general-protection fault the guest would see.

use super::{kvm_err, Session, VmError};
use devices::GuestMemory;
use vm_memory::{Bytes, GuestAddress};

/// The lowest address of the kernel's half of a 4-level address space.
pub const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

const HLT_OPCODE: u8 = 0xf4;

/// Why a breakpoint cannot be set.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BreakpointError {
    #[error(
        "a software breakpoint at {address:#x}: only kernel addresses (from {KERNEL_HALF:#x}) \
         take one here (a HLT in user code faults in the guest)"
    )]
    UserAddress { address: u64 },
    #[error(
        "breakpoints in a history of the {0} clock: not supported (its run is single-stepped, \
         all of it or near each deadline, without the patches in place, so a hit there would \
         be missed); step or watch instead"
    )]
    CountingClock(devices::ClockKind),
}

/// One patched byte.
#[derive(Clone, Copy, Debug)]
struct Patch {
    linear: u64,
    gpa: u64,
    original: u8,
}

/// The breakpoints asked for, and the patches written for the present
/// entry.
#[derive(Debug, Default)]
pub(super) struct Breakpoints {
    addresses: Vec<u64>,
    patched: Vec<Patch>,
}

impl Breakpoints {
    pub(super) fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// Writes a `HLT` over each breakpoint mapped in the present address
    /// space (one not mapped cannot be fetched either).
    pub(super) fn install(
        &mut self,
        session_translate: impl Fn(u64) -> Option<u64>,
        memory: &GuestMemory,
    ) {
        for &linear in &self.addresses {
            let Some(gpa) = session_translate(linear) else {
                continue;
            };
            let Ok(original) = memory.read_obj::<u8>(GuestAddress(gpa)) else {
                continue;
            };
            // Two breakpoints on one byte (aliases) are patched once.
            if self.patched.iter().any(|p| p.gpa == gpa) {
                continue;
            }
            if original != HLT_OPCODE && memory.write_obj(HLT_OPCODE, GuestAddress(gpa)).is_err() {
                continue;
            }
            self.patched.push(Patch {
                linear,
                gpa,
                original,
            });
        }
    }

    /// Puts the guest's bytes back; returns the breakpoints whose `HLT`
    /// was still there (those the guest can have stopped at).
    pub(super) fn remove(&mut self, memory: &GuestMemory) -> Vec<u64> {
        let mut intact = Vec::new();
        for patch in self.patched.drain(..) {
            // A byte the guest rewrote stays as it wrote it.
            if memory.read_obj::<u8>(GuestAddress(patch.gpa)).ok() == Some(HLT_OPCODE) {
                let _ = memory.write_obj(patch.original, GuestAddress(patch.gpa));
                intact.push(patch.linear);
            }
        }
        intact
    }
}

/// The breakpoint a `HLT` exit at `rip` stopped at, of those `patched`
/// (KVM moves RIP past the `HLT`).
fn hit_at(patched: &[u64], rip: u64) -> Option<u64> {
    patched
        .iter()
        .copied()
        .find(|&linear| rip == linear.wrapping_add(1))
}

impl Session {
    /// Sets the software breakpoints the next runs stop at (none: an empty
    /// list), replacing those set before. See the module's text.
    pub fn set_breakpoints(&mut self, addresses: &[u64]) -> Result<(), BreakpointError> {
        if let Some(&address) = addresses.iter().find(|&&a| a < KERNEL_HALF) {
            return Err(BreakpointError::UserAddress { address });
        }
        let clock = self.machine.clock.kind();
        if !clock.is_exit() && !addresses.is_empty() {
            return Err(BreakpointError::CountingClock(clock));
        }
        let mut addresses = addresses.to_vec();
        addresses.sort_unstable();
        addresses.dedup();
        self.breakpoints.addresses = addresses;
        Ok(())
    }

    /// Writes the patches for the entry about to be made.
    pub(super) fn install_breakpoints(&mut self) {
        if self.breakpoints.is_empty() {
            return;
        }
        let vcpu = &self.vm.vcpu;
        let translate = |linear: u64| match vcpu.translate_gva(linear) {
            Ok(t) if t.valid != 0 => Some(t.physical_address),
            _ => None,
        };
        self.breakpoints.install(translate, &self.vm.memory);
    }

    /// After a `HLT` exit with `patched` breakpoints in place: if the
    /// guest stopped at one, puts RIP back on it and ends the run with
    /// `Err(BreakpointHit)` (nothing handled, counted or recorded).
    pub(super) fn stop_at_hit(&mut self, patched: &[u64]) -> Result<(), VmError> {
        let rip = self.vm.vcpu.sync_regs().regs.rip;
        let Some(address) = hit_at(patched, rip) else {
            return Ok(());
        };
        let mut regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
        regs.rip = address;
        self.set_regs(&regs)?;
        self.position_lost = true;
        Err(VmError::BreakpointHit {
            address,
            exit: self.machine.exits(),
        })
    }

    /// Whether a breakpoint hit left the run between two exits at a step
    /// count not known (until it is reset or restored).
    pub fn position_lost(&self) -> bool {
        self.position_lost
    }

    /// The vCPU's registers at the present, the exit's instruction
    /// finished first (as a snapshot finishes it).
    pub fn registers(
        &mut self,
    ) -> Result<(kvm_bindings::kvm_regs, kvm_bindings::kvm_sregs), VmError> {
        if self.position_lost {
            return Err(VmError::PositionLost);
        }
        crate::vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
        let sregs = self.vm.vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
        Ok((regs, sregs))
    }

    /// Sets the vCPU's general registers, RIP and RFLAGS (a debugger's
    /// write: the history from here on is a new branch).
    pub fn set_general_registers(&mut self, regs: &kvm_bindings::kvm_regs) -> Result<(), VmError> {
        if self.position_lost {
            return Err(VmError::PositionLost);
        }
        crate::vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        self.set_regs(regs)
    }

    /// Writes `bytes` to guest virtual memory (through the guest's page
    /// tables) up to the first byte not mapped; returns how many were
    /// written. A debugger's write: the history from here on is a new
    /// branch.
    pub fn write_virtual(&self, address: u64, bytes: &[u8]) -> usize {
        let mut done = 0;
        while done < bytes.len() {
            let at = address.wrapping_add(done as u64);
            let Some(gpa) = self.translate(at) else {
                break;
            };
            let in_page = (4096 - (at % 4096)) as usize;
            let end = (done + in_page).min(bytes.len());
            if self
                .vm
                .memory
                .write_slice(&bytes[done..end], vm_memory::GuestAddress(gpa))
                .is_err()
            {
                break;
            }
            done = end;
        }
        done
    }

    /// Reads guest virtual memory (through the guest's page tables) into
    /// `buf` up to the first byte not mapped; returns how many were read.
    /// Breakpoint patches are never in memory between two requests.
    pub fn read_virtual(&self, address: u64, buf: &mut [u8]) -> usize {
        self.read_linear(address, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_patch_is_put_back_and_a_hlt_exit_after_it_is_a_hit() {
        let memory = GuestMemory::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
        memory.write_obj(0x55u8, GuestAddress(0x1000)).unwrap();
        let at = KERNEL_HALF + 0x1000;
        let mut bps = Breakpoints {
            addresses: vec![at, KERNEL_HALF + 0x1800],
            patched: Vec::new(),
        };
        // The second is not mapped: not patched.
        let translate = |l: u64| (l == at).then_some(0x1000);
        bps.install(translate, &memory);
        assert_eq!(
            memory.read_obj::<u8>(GuestAddress(0x1000)).unwrap(),
            HLT_OPCODE
        );
        let patched = bps.remove(&memory);
        assert_eq!(patched, [at]);
        assert_eq!(memory.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0x55);
        assert_eq!(hit_at(&patched, at + 1), Some(at));
        assert_eq!(hit_at(&patched, at + 2), None);
        // A byte the guest rewrote meanwhile is kept, and cannot be hit.
        bps.install(translate, &memory);
        memory.write_obj(0x90u8, GuestAddress(0x1000)).unwrap();
        assert!(bps.remove(&memory).is_empty());
        assert_eq!(memory.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0x90);
    }

    #[test]
    fn test_user_addresses_are_refused() {
        assert_eq!(
            BreakpointError::UserAddress { address: 0x40_1000 }.to_string(),
            "a software breakpoint at 0x401000: only kernel addresses (from 0xffff800000000000) \
             take one here (a HLT in user code faults in the guest)"
        );
    }
}
