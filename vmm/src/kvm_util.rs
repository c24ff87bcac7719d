//! KVM pieces kvm-ioctls does not wrap.

use kvm_bindings::{kvm_interrupt, KVMIO};
use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

ioctl_iow_nr!(KVM_INTERRUPT, KVMIO, 0x86, kvm_interrupt);

/// Queues external interrupt `vector` for injection at the next KVM_RUN
/// (only valid without an in-kernel irqchip, when the guest is interruptible).
pub fn inject_interrupt(vcpu: &VcpuFd, vector: u8) -> std::io::Result<()> {
    let irq = kvm_interrupt {
        irq: u32::from(vector),
    };
    // SAFETY: `vcpu` is a valid vCPU fd, and KVM_INTERRUPT only reads the
    // `kvm_interrupt` we pass by reference, which outlives the call.
    let ret = unsafe { ioctl_with_ref(vcpu, KVM_INTERRUPT(), &irq) };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
