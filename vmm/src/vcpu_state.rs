//! The complete architectural state of the one vCPU, captured and restored
//! through KVM, as a serializable value.
//!
//! Capture must happen with no exit pending: after a port or MMIO exit, real
//! KVM moves RIP past the instruction only on the next KVM_RUN, so the caller
//! first completes the exit (a KVM_RUN with `immediate_exit` set) — see
//! [`complete_pending_exit`].

use crate::cpu_model;
use kvm_bindings::{
    kvm_debugregs, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xsave,
    Msrs,
};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum VcpuStateError {
    #[error("KVM call {call} failed")]
    Kvm {
        call: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("KVM {call} handled {done} of {wanted} MSRs (first missing: {missing:#x})")]
    PartialMsrs {
        call: &'static str,
        done: usize,
        wanted: usize,
        missing: u32,
    },
    #[error("the saved vCPU state has {0} bytes of FPU/SSE state; expected 4096")]
    BadXsave(usize),
}

fn kvm(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VcpuStateError {
    move |source| VcpuStateError::Kvm { call, source }
}

/// One MSR's index and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrValue {
    pub index: u32,
    pub value: u64,
}

/// Everything KVM holds for the vCPU that the guest can observe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VcpuState {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    /// The legacy FXSAVE/XSAVE area (x87, SSE). The CPU model has no XSAVE,
    /// so the 4 KiB legacy region is the whole extended state.
    pub xsave: Vec<u32>,
    pub msrs: Vec<MsrValue>,
    pub events: kvm_vcpu_events,
    pub mp_state: kvm_mp_state,
    pub debug_regs: kvm_debugregs,
}

/// MSRs a snapshot carries: those the guest may access directly (the others
/// are answered by the VMM from a fixed table and have no per-vCPU state).
pub fn snapshot_msr_indices() -> Vec<u32> {
    cpu_model::saved_msrs()
}

/// Runs KVM_RUN once with `immediate_exit` set, so KVM finishes the pending
/// PIO/MMIO instruction (moving RIP past it) and returns at once with EINTR.
pub fn complete_pending_exit(vcpu: &mut VcpuFd) -> Result<(), VcpuStateError> {
    vcpu.set_kvm_immediate_exit(1);
    let result = vcpu.run().map(|_| ());
    vcpu.set_kvm_immediate_exit(0);
    match result {
        Err(e) if e.errno() == libc::EINTR => Ok(()),
        Ok(()) => Ok(()),
        Err(e) => Err(VcpuStateError::Kvm {
            call: "KVM_RUN(immediate_exit)",
            source: e,
        }),
    }
}

pub fn capture(vcpu: &VcpuFd) -> Result<VcpuState, VcpuStateError> {
    let indices = snapshot_msr_indices();
    let entries: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut msrs = Msrs::from_entries(&entries).expect("the MSR list fits");
    let read = vcpu.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
    if read != indices.len() {
        return Err(VcpuStateError::PartialMsrs {
            call: "KVM_GET_MSRS",
            done: read,
            wanted: indices.len(),
            missing: indices[read],
        });
    }
    let xsave = vcpu.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?;
    Ok(VcpuState {
        regs: vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?,
        sregs: vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
        xsave: xsave.region.to_vec(),
        msrs: msrs
            .as_slice()
            .iter()
            .map(|e| MsrValue {
                index: e.index,
                value: e.data,
            })
            .collect(),
        events: vcpu.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
        mp_state: vcpu.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?,
        debug_regs: vcpu.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
    })
}

pub fn restore(vcpu: &VcpuFd, state: &VcpuState) -> Result<(), VcpuStateError> {
    if state.xsave.len() != 1024 {
        return Err(VcpuStateError::BadXsave(state.xsave.len() * 4));
    }
    vcpu.set_sregs(&state.sregs).map_err(kvm("KVM_SET_SREGS"))?;
    vcpu.set_regs(&state.regs).map_err(kvm("KVM_SET_REGS"))?;
    let mut xsave = kvm_xsave::default();
    xsave.region.copy_from_slice(&state.xsave);
    // SAFETY: `xsave` is a plain kvm_xsave with a fully initialised legacy
    // region and no trailing (XSAVE2) data, which is what KVM_SET_XSAVE reads.
    unsafe { vcpu.set_xsave(&xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
    let entries: Vec<kvm_msr_entry> = state
        .msrs
        .iter()
        .map(|m| kvm_msr_entry {
            index: m.index,
            data: m.value,
            ..Default::default()
        })
        .collect();
    let msrs = Msrs::from_entries(&entries).expect("the MSR list fits");
    let written = vcpu.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
    if written != entries.len() {
        return Err(VcpuStateError::PartialMsrs {
            call: "KVM_SET_MSRS",
            done: written,
            wanted: entries.len(),
            missing: entries[written].index,
        });
    }
    vcpu.set_vcpu_events(&state.events)
        .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
    vcpu.set_mp_state(state.mp_state)
        .map_err(kvm("KVM_SET_MP_STATE"))?;
    vcpu.set_debug_regs(&state.debug_regs)
        .map_err(kvm("KVM_SET_DEBUGREGS"))?;
    Ok(())
}
