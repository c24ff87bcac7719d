//! Creating the KVM virtual machine: the capabilities detvisor needs, guest
//! RAM handed to KVM, the MSR filter and the one vCPU with the fixed CPU
//! model. No in-kernel irqchip or PIT is created (see determinism.md).

use super::memory::{GuestRam, HostMapping};
use super::{kvm_err, SetupError, VmError};
use crate::cpu_model;
use devices::GuestMemory;
use kvm_bindings::{
    kvm_msr_entry, kvm_userspace_memory_region, Msrs, KVM_MSR_EXIT_REASON_FILTER,
    KVM_MSR_EXIT_REASON_INVAL, KVM_MSR_EXIT_REASON_UNKNOWN,
};
use kvm_ioctls::{
    Cap, Kvm, MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, SyncReg, VcpuFd, VmFd,
};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// A created, booted-but-not-started VM.
pub(super) struct Vm {
    pub(super) vm: VmFd,
    pub(super) vcpu: VcpuFd,
    pub(super) memory: GuestMemory,
    /// Whether KVM logs the guest's writes to RAM (see `Session::start_dirty_log`).
    pub(super) dirty_log: bool,
    /// The host mapping behind `memory` when the VMM made it (RAM split
    /// around the MMIO hole); dropped after everything that uses it.
    _mapping: Option<HostMapping>,
}

impl Vm {
    /// Gives KVM guest RAM (one slot per region) with the given slot flags.
    pub(super) fn register_memory(&self, flags: u32) -> Result<(), VmError> {
        register_memory(&self.vm, &self.memory, flags)
    }
}

/// Gives KVM `memory` (one slot per region) with the given slot flags.
fn register_memory(vm: &VmFd, memory: &GuestMemory, flags: u32) -> Result<(), VmError> {
    for (slot, region) in memory.iter().enumerate() {
        let region_desc = kvm_userspace_memory_region {
            slot: slot as u32,
            flags,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
        };
        // SAFETY: the region is a live mapping of `memory`, which the `Vm`
        // owns together with the VM fd, so it outlives the VM's use of it.
        unsafe { vm.set_user_memory_region(region_desc) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

fn check_caps(kvm: &Kvm) -> Result<(), SetupError> {
    for (cap, name) in [
        (Cap::X86UserSpaceMsr, "KVM_CAP_X86_USER_SPACE_MSR"),
        (Cap::X86MsrFilter, "KVM_CAP_X86_MSR_FILTER"),
        (Cap::SyncRegs, "KVM_CAP_SYNC_REGS"),
        (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
        (Cap::SetGuestDebug, "KVM_CAP_SET_GUEST_DEBUG"),
    ] {
        if !kvm.check_extension(cap) {
            return Err(SetupError::MissingCapability(name));
        }
    }
    Ok(())
}

/// Opens /dev/kvm and creates the VM over `ram`, the fixed CPU model and
/// MSR filter.
pub(super) fn create_vm(ram: GuestRam) -> Result<Vm, VmError> {
    let GuestRam { memory, mapping } = ram;
    let kvm = Kvm::new().map_err(SetupError::OpenKvm)?;
    check_caps(&kvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm.set_tss_address(0xfffb_d000)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    register_memory(&vm, &memory, 0)?;
    install_msr_filter(&vm)?;
    let vcpu = create_vcpu(&vm)?;
    Ok(Vm {
        vm,
        vcpu,
        memory,
        dirty_log: false,
        _mapping: mapping,
    })
}

/// Every MSR outside the allow-list exits to us (default deny + user-space exits).
fn install_msr_filter(vm: &VmFd) -> Result<(), VmError> {
    let user_msr = kvm_bindings::kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR,
        args: [
            u64::from(
                KVM_MSR_EXIT_REASON_FILTER
                    | KVM_MSR_EXIT_REASON_UNKNOWN
                    | KVM_MSR_EXIT_REASON_INVAL,
            ),
            0,
            0,
            0,
        ],
        ..Default::default()
    };
    vm.enable_cap(&user_msr)
        .map_err(kvm_err("KVM_ENABLE_CAP(X86_USER_SPACE_MSR)"))?;
    let bitmaps: Vec<Vec<u8>> = cpu_model::ALLOWED_MSR_RANGES
        .iter()
        .map(|&(_, count)| vec![0xffu8; (count as usize).div_ceil(8)])
        .collect();
    let ranges: Vec<MsrFilterRange<'_>> = cpu_model::ALLOWED_MSR_RANGES
        .iter()
        .zip(&bitmaps)
        .map(|(&(base, count), bitmap)| MsrFilterRange {
            flags: MsrFilterRangeFlags::READ | MsrFilterRangeFlags::WRITE,
            base,
            msr_count: count,
            bitmap,
        })
        .collect();
    vm.set_msr_filter(MsrFilterDefaultAction::DENY, &ranges)
        .map_err(kvm_err("KVM_X86_SET_MSR_FILTER"))
}

/// The one vCPU, with the fixed CPUID, no local APIC, and the general
/// registers synced into kvm_run at every exit.
fn create_vcpu(vm: &VmFd) -> Result<VcpuFd, VmError> {
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    vcpu.set_cpuid2(&cpu_model::kvm_cpuid())
        .map_err(kvm_err("KVM_SET_CPUID2"))?;
    // No local APIC: its base MSR says disabled (this also clears KVM's
    // dynamic CPUID APIC bit).
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: cpu_model::msr::IA32_APIC_BASE,
        data: 0,
        ..Default::default()
    }])
    .expect("one MSR entry fits");
    vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    vcpu.set_sync_valid_reg(SyncReg::Register);
    Ok(vcpu)
}
