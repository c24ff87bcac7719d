//! detvisor's virtual machine monitor: KVM, guest memory, the vCPU loop,
//! the virtual clock, the fixed CPU model, boot, per-exit records and their trace.

pub mod acpi;
pub mod boot;
pub mod clock;
pub mod cpu_model;
pub mod entropy;
pub mod exit;
pub mod guest_crng;
pub mod insn_probe;
pub mod irq_window;
mod kvm_util;
pub mod pmu_clock;
pub mod position;
pub mod probe;
pub mod record;
pub mod seccomp;
pub mod stall;
pub mod trace;
pub mod vcpu_state;
pub mod vm;

pub use devices::{ClockKind, ExitPath, VirtNanos};
