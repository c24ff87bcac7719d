//! The VM's errors: one enum per operation where the operation stands on its
//! own (setting the machine up, resuming a snapshot; guest memory and
//! checkpoints have theirs beside their code), and [`VmError`] over all of
//! them for the session's operations.
//!
//! A variant with an underlying error either marks it `#[source]` or prints
//! it in its message, never both: the CLI prints the whole chain (`{:#}`),
//! so both would show the source twice.

use super::kept_pages::CheckpointError;
use super::memory::MemoryError;
use crate::boot::BootError;
use crate::vcpu_state::VcpuStateError;
use thiserror::Error;

/// The machine could not be set up: KVM itself, or its devices.
#[derive(Debug, Error)]
pub enum SetupError {
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("KVM lacks a capability detvisor needs: {0}")]
    MissingCapability(&'static str),
    #[error("setting up devices")]
    Devices(#[source] devices::DevicesError),
    #[error("setting up the network")]
    Network(#[source] devices::SwitchError),
    /// Not a regular file, larger than `MAX_DISK_IMAGE_BYTES`, or unreadable.
    #[error(transparent)]
    Clock(#[from] crate::clock::ClockError),
    #[error("cannot read a disk image")]
    ReadDisk(#[source] hostfile::ReadError),
    #[error("disk image {} has digest {found}, expected {expected} (it changed since it was made)", path.display())]
    DiskDigest {
        path: std::path::PathBuf,
        found: String,
        expected: String,
    },
    #[error("disk image {}", path.display())]
    DiskImage {
        path: std::path::PathBuf,
        #[source]
        source: devices::virtio::DiskImageError,
    },
}

/// A saved state does not fit this detvisor or the memory given with it.
#[derive(Debug, Error)]
pub enum IncompatibleState {
    #[error("cannot resume this snapshot: snapshot was taken with CPU model version {snapshot}, this detvisor has {ours}")]
    CpuModel { snapshot: u32, ours: u32 },
    #[error(
        "cannot resume this snapshot: snapshot memory is {memory} bytes, its state says {state}"
    )]
    RamSize { memory: u64, state: u64 },
    #[error("cannot resume this snapshot: device state")]
    Devices(#[source] devices::RestoreError),
    #[error("cannot resume this snapshot: clock or exit records")]
    Machine(#[source] devices::RestoreError),
    #[error(
        "cannot resume this snapshot with the {asked} clock: its history was made with the \
         {saved} clock, and one history keeps one clock"
    )]
    Clock {
        saved: devices::ClockKind,
        asked: devices::ClockKind,
    },
}

#[derive(Debug, Error)]
pub enum VmError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error("KVM call {call} failed")]
    Kvm {
        call: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error(transparent)]
    Pmu(#[from] crate::pmu_clock::PmuError),
    #[error("the pmu clock's counter of {event} failed: {reason}")]
    PmuCounter {
        event: crate::pmu_clock::CountedEvent,
        reason: String,
    },
    #[error(transparent)]
    StallGuard(#[from] crate::stall::StallGuardError),
    #[error("injecting an interrupt failed")]
    Inject(#[source] std::io::Error),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    VcpuState(#[from] VcpuStateError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Incompatible(#[from] IncompatibleState),
    #[error("writing to the control channel")]
    ControlChannel(#[source] devices::DevicesError),
    #[error(transparent)]
    GuestCrng(#[from] crate::guest_crng::GuestCrngError),
    /// Not a failure: the guest reached a software breakpoint (see
    /// `vm::breakpoints`) after exit `exit`; the run stands at it.
    #[error("the guest reached the breakpoint at {address:#x} after exit {exit}")]
    BreakpointHit { address: u64, exit: u64 },
    #[error("the position of the run was lost at a breakpoint hit: reset or restore it first")]
    PositionLost,
    #[error(
        "the run is between exit {exit} and the next at a step count not known: the pmu \
         clock's counter stopped it after running free (positions between two exits are \
         known where the interval was single-stepped from its exit)"
    )]
    PositionUnknown { exit: u64 },
    #[error("building a KVM MSR list")]
    MsrList,
    #[error("cannot single-step the guest at {at}")]
    Step {
        at: crate::position::InsnPosition,
        #[source]
        reason: super::insn_steps::StepRefusal,
    },
}

/// Maps a failed KVM call named `call` to a [`VmError`].
pub(super) fn kvm_err(call: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { call, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// The error and its sources joined by ": ", as `anyhow`'s `{:#}` (what
    /// the CLI prints) shows them.
    fn chain(error: &dyn Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(inner) = source {
            text += &format!(": {inner}");
            source = inner.source();
        }
        text
    }

    fn assert_source_once(error: &dyn Error, source_text: &str) {
        let text = chain(error);
        assert_eq!(
            text.matches(source_text).count(),
            1,
            "{source_text:?} should appear once in {text:?}"
        );
    }

    fn eisdir() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EISDIR)
    }

    #[test]
    fn every_error_prints_its_source_once() {
        let io_text = eisdir().to_string();
        let kvm_text = kvm_ioctls::Error::new(libc::EBADF).to_string();
        let cases: Vec<(VmError, &str)> = vec![
            (
                SetupError::OpenKvm(kvm_ioctls::Error::new(libc::EBADF)).into(),
                &kvm_text,
            ),
            (
                kvm_err("KVM_RUN")(kvm_ioctls::Error::new(libc::EBADF)),
                &kvm_text,
            ),
            (VmError::Inject(eisdir()), &io_text),
            (
                MemoryError::Mmap {
                    bytes: 4096,
                    source: eisdir(),
                }
                .into(),
                &io_text,
            ),
            (
                CheckpointError::ResetPage {
                    page: 3,
                    source: eisdir(),
                }
                .into(),
                &io_text,
            ),
            (
                BootError::OpenKernel(hostfile::ReadError::Open {
                    path: "/boot".into(),
                    source: eisdir(),
                })
                .into(),
                &io_text,
            ),
            (
                VcpuStateError::Kvm {
                    call: "KVM_GET_REGS",
                    source: kvm_ioctls::Error::new(libc::EBADF),
                }
                .into(),
                &kvm_text,
            ),
        ];
        for (error, source_text) in &cases {
            assert_source_once(error, source_text);
        }
    }

    #[test]
    fn a_chain_reads_outer_to_inner() {
        let error: VmError = CheckpointError::ResetPage {
            page: 3,
            source: eisdir(),
        }
        .into();
        assert_eq!(
            chain(&error),
            format!("returning guest page 3 to its checkpoint: {}", eisdir())
        );
    }
}
