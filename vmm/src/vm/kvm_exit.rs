//! Exit translation: KVM's borrowed `VcpuExit` becomes detvisor's owned
//! [`Exit`] plus a slot in the kvm_run page for the answer, and the answer
//! the machine gives is written back into that slot before the next entry.
//!
//! Owning the exit at once keeps the kvm_run borrow out of `Machine`, which
//! stays pure and unit-testable with fake exits.

use crate::cpu_model::MsrAccess;
use crate::exit::{AccessData, Completion, Exit, ExitFailure};
use crate::record;
use kvm_ioctls::VcpuExit;

/// Where the response to an exit goes in the kvm_run page.
pub(super) enum ResponseSlot<'a> {
    None,
    Data(&'a mut [u8]),
    Msr {
        error: &'a mut u8,
        data: Option<&'a mut u64>,
    },
}

pub(super) fn convert_exit(exit: VcpuExit<'_>) -> (Exit, ResponseSlot<'_>) {
    match exit {
        VcpuExit::IoIn(port, data) => (
            Exit::IoIn {
                port,
                len: data.len().min(8) as u8,
            },
            ResponseSlot::Data(data),
        ),
        VcpuExit::IoOut(port, data) => (
            Exit::IoOut {
                port,
                data: AccessData::new(data),
            },
            ResponseSlot::None,
        ),
        VcpuExit::MmioRead(addr, data) => (
            Exit::MmioRead {
                addr,
                len: data.len().min(8) as u8,
            },
            ResponseSlot::Data(data),
        ),
        VcpuExit::MmioWrite(addr, data) => (
            Exit::MmioWrite {
                addr,
                data: AccessData::new(data),
            },
            ResponseSlot::None,
        ),
        VcpuExit::X86Rdmsr(msr) => (
            Exit::RdMsr { index: msr.index },
            ResponseSlot::Msr {
                error: msr.error,
                data: Some(msr.data),
            },
        ),
        VcpuExit::X86Wrmsr(msr) => (
            Exit::WrMsr {
                index: msr.index,
                value: msr.data,
            },
            ResponseSlot::Msr {
                error: msr.error,
                data: None,
            },
        ),
        VcpuExit::Hlt => (Exit::Hlt, ResponseSlot::None),
        VcpuExit::IrqWindowOpen => (Exit::IrqWindowOpen, ResponseSlot::None),
        VcpuExit::Shutdown => (Exit::Shutdown, ResponseSlot::None),
        VcpuExit::SystemEvent(_, _) => (Exit::Shutdown, ResponseSlot::None),
        VcpuExit::Intr => (Exit::Interrupted, ResponseSlot::None),
        VcpuExit::Debug(_) => (Exit::SingleStep, ResponseSlot::None),
        VcpuExit::InternalError => (
            Exit::Fatal {
                reason: ExitFailure::InternalError { suberror: 0 },
            },
            ResponseSlot::None,
        ),
        VcpuExit::FailEntry(reason, _) => (
            Exit::Fatal {
                reason: ExitFailure::FailEntry { reason },
            },
            ResponseSlot::None,
        ),
        VcpuExit::Unsupported(code) => (
            Exit::Fatal {
                reason: ExitFailure::Unexpected { exit_reason: code },
            },
            ResponseSlot::None,
        ),
        other => (
            Exit::Fatal {
                reason: ExitFailure::Unexpected {
                    exit_reason: exit_reason_code(&other),
                },
            },
            ResponseSlot::None,
        ),
    }
}

fn exit_reason_code(exit: &VcpuExit<'_>) -> u32 {
    match exit {
        VcpuExit::Unknown => kvm_bindings::KVM_EXIT_UNKNOWN,
        VcpuExit::Exception => kvm_bindings::KVM_EXIT_EXCEPTION,
        VcpuExit::Hypercall(_) => kvm_bindings::KVM_EXIT_HYPERCALL,
        _ => u32::MAX,
    }
}

/// Writes the machine's answer to an exit into its slot in kvm_run.
pub(super) fn complete(slot: ResponseSlot<'_>, completion: &Completion) {
    match (slot, completion) {
        (ResponseSlot::Data(buf), Completion::Data(data)) => {
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data.as_slice()[..n]);
            // Bytes beyond what an access can carry read as all-ones.
            buf[n..].fill(0xff);
        }
        (ResponseSlot::Msr { error, data }, Completion::Msr(access)) => match access {
            MsrAccess::Value(v) => {
                *error = 0;
                if let Some(d) = data {
                    *d = *v;
                }
            }
            MsrAccess::GeneralProtection => *error = 1,
        },
        _ => {}
    }
}

/// Hash of the general registers and RFLAGS, for the exit's record.
pub(super) fn regs_hash(regs: &kvm_bindings::kvm_regs) -> u64 {
    let words = [
        regs.rax,
        regs.rbx,
        regs.rcx,
        regs.rdx,
        regs.rsi,
        regs.rdi,
        regs.rsp,
        regs.rbp,
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rip,
        regs.rflags,
    ];
    let mut bytes = [0u8; 18 * 8];
    for (chunk, w) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    record::hash64(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_data_fills_the_access_and_pads_with_all_ones() {
        let mut buf = [0u8; 4];
        complete(
            ResponseSlot::Data(&mut buf),
            &Completion::Data(AccessData::new(&[0x12, 0x34])),
        );
        assert_eq!(buf, [0x12, 0x34, 0xff, 0xff]);
    }

    #[test]
    fn msr_answers_set_the_value_or_the_fault() {
        let (mut error, mut data) = (1u8, 0u64);
        complete(
            ResponseSlot::Msr {
                error: &mut error,
                data: Some(&mut data),
            },
            &Completion::Msr(MsrAccess::Value(0x1234)),
        );
        assert_eq!((error, data), (0, 0x1234));
        complete(
            ResponseSlot::Msr {
                error: &mut error,
                data: Some(&mut data),
            },
            &Completion::Msr(MsrAccess::GeneralProtection),
        );
        assert_eq!((error, data), (1, 0x1234), "a fault leaves the data alone");
    }

    #[test]
    fn port_reads_keep_their_slot_and_writes_carry_their_data() {
        let mut buf = [0u8; 2];
        let (exit, slot) = convert_exit(VcpuExit::IoIn(0x3f8, &mut buf));
        assert_eq!(
            exit,
            Exit::IoIn {
                port: 0x3f8,
                len: 2
            }
        );
        assert!(matches!(slot, ResponseSlot::Data(b) if b.len() == 2));
        let (exit, slot) = convert_exit(VcpuExit::IoOut(0x610, &[7]));
        assert_eq!(
            exit,
            Exit::IoOut {
                port: 0x610,
                data: AccessData::new(&[7])
            }
        );
        assert!(matches!(slot, ResponseSlot::None));
    }

    #[test]
    fn register_hash_covers_rip_and_rflags() {
        let regs = kvm_bindings::kvm_regs {
            rip: 0x1000,
            rflags: 2,
            ..Default::default()
        };
        let moved = kvm_bindings::kvm_regs {
            rip: 0x1001,
            ..regs
        };
        let flags = kvm_bindings::kvm_regs {
            rflags: 0x202,
            ..regs
        };
        assert_ne!(regs_hash(&regs), regs_hash(&moved));
        assert_ne!(regs_hash(&regs), regs_hash(&flags));
        let same = kvm_bindings::kvm_regs { ..regs };
        assert_eq!(regs_hash(&regs), regs_hash(&same));
    }
}
