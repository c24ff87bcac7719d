//! The VM: KVM file descriptors, guest memory, and the vCPU run loop.
//!
//! Only this module calls KVM_RUN. Each exit is converted to an owned
//! [`Exit`](crate::exit::Exit) at once, handed to the pure
//! [`Machine`](crate::exit::Machine), recorded, and the answer written back
//! into the kvm_run page before re-entering the guest. Interrupts are
//! injected only here, only between a guest-caused exit and the next entry.
//!
//! This file holds what a caller hands in and gets back ([`VmConfig`],
//! [`ResumeConfig`], [`RunOutcome`]) and the one-shot [`run`]; the parts:
//! - `session`: [`Session`] (boot, resume, capture, outcome) and [`SessionState`];
//! - `stepping`: the exit loop (step, interrupt windows and injection, records);
//! - `insn_steps`: single-stepping between two exits as an observer
//!   (positions `exit:N+insn:K`);
//! - `step_clock`: running under the step clock, every instruction
//!   stepped and counted;
//! - `checkpoint`, `kept_pages`: in-place checkpoints, resets, the dirty log;
//! - `kvm_exit`: KVM's exits to owned [`Exit`](crate::exit::Exit)s and answers back;
//! - `kvm_vm`: creating the KVM VM and vCPU;
//! - `memory`, `memory_scan`: guest RAM, and walking or hashing it page by page;
//! - `wiring`: the device set and its virtio slots; `console`: the host side
//!   of the console;
//! - `observe`: handing each record to an observer (a trace), with the
//!   name of the device the exit hit;
//! - `error`: [`VmError`] and the per-operation errors.

mod breakpoints;
mod checkpoint;
mod console;
mod error;
mod insn_steps;
mod kept_pages;
mod kvm_exit;
mod kvm_vm;
mod load_in_place;
mod memory;
mod memory_scan;
mod observe;
mod page_digest;
mod page_ledger;
mod pmu_run;
mod session;
mod step_clock;
mod stepping;
mod wiring;

pub use breakpoints::{BreakpointError, KERNEL_HALF};
pub use checkpoint::Checkpoint;
pub use console::ConsoleInput;
pub use error::{IncompatibleState, SetupError, VmError};
pub use insn_steps::{InsnSteps, StepRefusal, MAX_INSN_STEPS};
pub use kept_pages::{CheckpointError, CheckpointMemory, ResetStats};
pub use load_in_place::LoadStats;
pub use memory::{memory_from_file, memory_from_mapping, GuestRam, MemoryError};
pub use session::{is_zero, GuestCrngRekey, Session, SessionState};
pub use stepping::Until;
pub use wiring::{disk_digest, nic_mac, DiskSpec, NetworkSpec};

use crate::exit::{Perturbation, StopReason};
use crate::record::{ExitRecord, RecordConfig};
use crate::stall::StallTimeout;
use devices::{ClockKind, ExitPath, VirtNanos};
use error::kvm_err;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// What a resumed run may set anew.
#[derive(Clone, Debug, Default)]
pub struct ResumeConfig {
    pub until: Option<VirtNanos>,
    pub record: RecordConfig,
    /// Host policy, not part of the run: see [`crate::stall`].
    pub stall_timeout: StallTimeout,
    /// The clock the caller expects the history to have (`None`: whichever
    /// made it). Another clock is refused: one history keeps one clock.
    pub clock: Option<ClockKind>,
}

/// Everything that defines a run. Two runs with equal configs are identical.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: PathBuf,
    /// The complete initrd image (detvisor's command archive already appended).
    pub initrd: Vec<u8>,
    pub cmdline: String,
    pub ram_bytes: u64,
    pub seed: u64,
    pub until: Option<VirtNanos>,
    pub rtc_epoch_unix_secs: i64,
    pub record: RecordConfig,
    pub perturbation: Option<Perturbation>,
    /// NICs and the switch between them (none: no network devices).
    pub network: Option<NetworkSpec>,
    /// A virtio console as the machine's control channel (`/dev/hvc0`):
    /// the in-guest agent's under `up`, the fork-shell listener's under
    /// `run`; driven through [`Session::send_on_control_channel`] and
    /// [`Session::take_control_output`].
    pub control_channel: bool,
    /// Wall time the guest may execute without an exit before the run ends
    /// as stalled. Host policy, not part of the run's definition (see
    /// [`crate::stall`]).
    pub stall_timeout: StallTimeout,
    /// virtio-blk disks, after every other virtio device, in this order.
    pub disks: Vec<DiskSpec>,
    /// How the guest reads the time and takes interrupts: the clock page
    /// (default) or the legacy HPET path (for comparisons).
    pub exit_path: ExitPath,
    /// What moves virtual time (see [`crate::clock`]).
    pub clock: ClockKind,
    /// What the pmu clock counts with (ignored by the other clocks).
    pub pmu_counter: crate::pmu_clock::PmuCounterChoice,
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub stop: StopReason,
    pub virtual_time: VirtNanos,
    pub exits: u64,
    pub exits_by_kind: std::collections::BTreeMap<String, u64>,
    pub injected_interrupts: u64,
    /// Interrupt-window exits that followed an `STI` byte and were stepped
    /// past (host-dependent: not part of the digest).
    pub irq_windows_stepped: u64,
    /// Instructions single-stepped for them.
    pub single_steps: u64,
    pub wall: Duration,
    /// Wall time spent creating the VM and writing boot data.
    pub wall_setup: Duration,
    /// Wall time spent hashing the final state.
    pub wall_finish: Duration,
    pub digest: String,
    /// The parts of the digest, for telling which part of two runs differs:
    /// the exit records alone, final guest memory, final device state, console output.
    pub digest_parts: DigestParts,
    pub console_bytes: u64,
    pub unhandled_accesses: u64,
    /// Guest RAM the host had backed at the end (the rest was never touched).
    pub guest_resident_bytes: u64,
    pub records: Vec<ExitRecord>,
}

/// The components the run digest is made of (hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestParts {
    pub records: String,
    pub memory: String,
    pub devices: String,
    pub console: String,
}

/// Boots and runs a guest to completion.
pub fn run(
    config: &VmConfig,
    console: Box<dyn Write + Send>,
    input: Option<ConsoleInput>,
) -> Result<RunOutcome, VmError> {
    let mut session = Session::boot(config, console, input)?;
    let stop = session.run_to_end()?;
    Ok(session.finish(stop))
}
