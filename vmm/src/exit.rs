//! Owned VM exits and the pure exit handler.
//!
//! `VcpuExit<'_>` borrows the kvm_run page; it is converted into [`Exit`] at
//! once, and everything after that (device dispatch, time, interrupts, stop
//! conditions) happens in [`Machine`], which knows nothing of KVM, so unit tests
//! drive it with fake exits.

use crate::clock::{Clock, TimedExit, VirtualClock};
use crate::cpu_model::{self, MsrAccess};
use devices::{Devices, GuestEvent, VirtNanos};
use devices::{Persist, RestoreError};
use serde::{Deserialize, Serialize};

/// Up to 8 bytes of access data, inline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccessData {
    bytes: [u8; 8],
    len: u8,
}

impl AccessData {
    pub fn new(data: &[u8]) -> Self {
        let len = data.len().min(8);
        let mut bytes = [0u8; 8];
        bytes[..len].copy_from_slice(&data[..len]);
        AccessData {
            bytes,
            len: len as u8,
        }
    }

    pub fn zeroed(len: usize) -> Self {
        AccessData {
            bytes: [0; 8],
            len: len.min(8) as u8,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as a little-endian integer (for records).
    pub fn as_u64(&self) -> u64 {
        u64::from_le_bytes(self.bytes)
    }
}

/// A VM exit, owned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    IoIn {
        port: u16,
        len: u8,
    },
    IoOut {
        port: u16,
        data: AccessData,
    },
    MmioRead {
        addr: u64,
        len: u8,
    },
    MmioWrite {
        addr: u64,
        data: AccessData,
    },
    RdMsr {
        index: u32,
    },
    WrMsr {
        index: u32,
        value: u64,
    },
    Hlt,
    IrqWindowOpen,
    /// KVM_EXIT_DEBUG after a single step: the loop's own business while it
    /// finds where an interrupt window opens (see `irq_window`); it never
    /// reaches the machine as an exit.
    SingleStep,
    /// Triple fault or an explicit shutdown: how `reboot=t` ends the guest.
    Shutdown,
    /// KVM_EXIT_INTR: the KVM_RUN was interrupted by a signal (not guest-caused).
    Interrupted,
    /// Anything the VMM cannot continue from (internal error, failed entry, ...).
    Fatal {
        reason: ExitFailure,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitFailure {
    InternalError {
        suberror: u32,
    },
    FailEntry {
        reason: u64,
    },
    Unexpected {
        exit_reason: u32,
    },
    /// A single-step trap reached the machine: the loop lost track of stepping.
    StraySingleStep,
}

/// Small numeric code per exit kind, for records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum ExitKind {
    IoIn = 1,
    IoOut = 2,
    MmioRead = 3,
    MmioWrite = 4,
    RdMsr = 5,
    WrMsr = 6,
    Hlt = 7,
    IrqWindowOpen = 8,
    Shutdown = 9,
    Interrupted = 10,
    Fatal = 11,
    SingleStep = 12,
}

impl ExitKind {
    /// The kind whose code (`kind as u8`) is `code`.
    pub fn from_code(code: u8) -> Option<ExitKind> {
        use ExitKind::*;
        [
            IoIn,
            IoOut,
            MmioRead,
            MmioWrite,
            RdMsr,
            WrMsr,
            Hlt,
            IrqWindowOpen,
            Shutdown,
            Interrupted,
            Fatal,
            SingleStep,
        ]
        .into_iter()
        .find(|kind| *kind as u8 == code)
    }
}

impl Exit {
    pub fn kind(&self) -> ExitKind {
        match self {
            Exit::IoIn { .. } => ExitKind::IoIn,
            Exit::IoOut { .. } => ExitKind::IoOut,
            Exit::MmioRead { .. } => ExitKind::MmioRead,
            Exit::MmioWrite { .. } => ExitKind::MmioWrite,
            Exit::RdMsr { .. } => ExitKind::RdMsr,
            Exit::WrMsr { .. } => ExitKind::WrMsr,
            Exit::Hlt => ExitKind::Hlt,
            Exit::IrqWindowOpen => ExitKind::IrqWindowOpen,
            Exit::Shutdown => ExitKind::Shutdown,
            Exit::Interrupted => ExitKind::Interrupted,
            Exit::Fatal { .. } => ExitKind::Fatal,
            Exit::SingleStep => ExitKind::SingleStep,
        }
    }

    /// The port, address or MSR index the exit concerns (0 if none).
    pub fn address(&self) -> u64 {
        match *self {
            Exit::IoIn { port, .. } | Exit::IoOut { port, .. } => port as u64,
            Exit::MmioRead { addr, .. } | Exit::MmioWrite { addr, .. } => addr,
            Exit::RdMsr { index } | Exit::WrMsr { index, .. } => index as u64,
            _ => 0,
        }
    }
}

/// What the vCPU must be given before it resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    None,
    /// Data for an IN or an MMIO read.
    Data(AccessData),
    /// The answer to an MSR exit.
    Msr(MsrAccess),
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StopReason {
    /// The guest reported its command's exit status through the status port.
    GuestExit { status: u8 },
    /// The guest asked for a reset or triple-faulted (e.g. `reboot -f` with `reboot=t`).
    GuestReset,
    /// The virtual-time limit was reached.
    TimeLimit,
    /// The guest halted with nothing that could ever wake it.
    HaltedForever,
    /// KVM reported something the VMM cannot continue from.
    Failure { failure: ExitFailure },
    /// The guest executed for the stall timeout (`timeout_ms` of wall time)
    /// without a VM exit, after exit `last_exit` (none: before its first)
    /// at `rip` (see [`crate::stall`]). A limit of detvisor on this host,
    /// not an event of the history.
    Stalled {
        last_exit: Option<u64>,
        rip: u64,
        timeout_ms: u64,
    },
    /// The VMM tried a syscall its seccomp filter refuses (see
    /// [`crate::seccomp`]): a defect of detvisor or an attack through it,
    /// not an event of the history.
    SeccompViolation {
        violation: crate::seccomp::Violation,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitAction {
    Resume(Completion),
    Stop(StopReason),
}

/// What to do about interrupts before re-entering the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptAction {
    None,
    Inject(u8),
    RequestWindow,
}

/// Deliberate divergence for testing the determinism audit: flip bit 0 of the
/// data returned by the first guest read at or after exit `at_exit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perturbation {
    pub at_exit: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineState {
    pub clock: crate::clock::ClockState,
    pub exits: u64,
    /// The run's virtual-time limit when the state was taken (informational:
    /// a resumed run gets its own limit).
    pub until: Option<VirtNanos>,
}

/// Everything the guest can observe apart from its memory and registers.
pub struct Machine {
    pub devices: Devices,
    pub clock: Clock,
    /// The run's virtual-time limit: the session stops the run at the
    /// first boundary between two exits at or after it (never inside an
    /// exit, and a halt is not cut short by it).
    pub until: Option<VirtNanos>,
    /// A host-side event (a fault of the run's schedule) that an idle guest
    /// must not sleep past.
    pub wakeup: Option<VirtNanos>,
    perturbation: Option<Perturbation>,
    exits: u64,
}

impl Machine {
    /// A machine with the exit clock.
    pub fn new(devices: Devices, until: Option<VirtNanos>) -> Self {
        Machine::with_clock(devices, until, Clock::default())
    }

    pub fn with_clock(devices: Devices, until: Option<VirtNanos>, clock: Clock) -> Self {
        Machine {
            devices,
            clock,
            until,
            wakeup: None,
            perturbation: None,
            exits: 0,
        }
    }

    pub fn set_perturbation(&mut self, perturbation: Option<Perturbation>) {
        self.perturbation = perturbation;
    }

    pub fn now(&self) -> VirtNanos {
        self.clock.now()
    }

    /// Number of exits handled so far.
    pub fn exits(&self) -> u64 {
        self.exits
    }

    fn perturb(&mut self, data: &mut AccessData) {
        if let Some(p) = self.perturbation {
            // `exits` already counts the current exit; its index is one less.
            if self.exits > p.at_exit && !data.is_empty() {
                data.as_mut_slice()[0] ^= 1;
                self.perturbation = None;
            }
        }
    }

    /// Handles one exit: advances virtual time, serves the access, reports whether to go on.
    pub fn handle_exit(&mut self, exit: &Exit) -> ExitAction {
        self.exits += 1;
        let timed = match exit {
            Exit::Hlt => TimedExit::Halt,
            _ => TimedExit::Access,
        };
        if !matches!(exit, Exit::Interrupted) {
            self.clock.on_exit(timed);
        }
        let now = self.clock.now();
        let completion = match *exit {
            Exit::IoIn { port, len } => {
                let mut data = AccessData::zeroed(len as usize);
                self.devices.pio_read(now, port, data.as_mut_slice());
                self.perturb(&mut data);
                Completion::Data(data)
            }
            Exit::IoOut { port, data } => {
                self.devices.pio_write(now, port, data.as_slice());
                Completion::None
            }
            Exit::MmioRead { addr, len } => {
                let mut data = AccessData::zeroed(len as usize);
                if !self.devices.mmio_read(now, addr, data.as_mut_slice()) {
                    data.as_mut_slice().fill(0xff);
                }
                self.perturb(&mut data);
                Completion::Data(data)
            }
            Exit::MmioWrite { addr, data } => {
                self.devices.mmio_write(now, addr, data.as_slice());
                Completion::None
            }
            Exit::RdMsr { index } => Completion::Msr(cpu_model::emulate_rdmsr(index)),
            Exit::WrMsr { index, value } => Completion::Msr(cpu_model::emulate_wrmsr(index, value)),
            Exit::Hlt => {
                self.devices.advance_to(now);
                if !self.devices.has_pending_interrupt() {
                    // A wake-up already passed is stale: ignore it.
                    let wakeup = self.wakeup.filter(|&at| at > now);
                    let Some(next) = [self.devices.next_deadline(), wakeup]
                        .into_iter()
                        .flatten()
                        .min()
                    else {
                        return ExitAction::Stop(StopReason::HaltedForever);
                    };
                    // Not cut short at the run's time limit: the limit ends a
                    // run between two exits (`Session::step`), so a moment at
                    // a time is the same machine whichever way it was reached.
                    self.clock.advance_to(next);
                    self.devices.advance_to(self.clock.now());
                }
                Completion::None
            }
            Exit::IrqWindowOpen | Exit::Interrupted => {
                self.devices.advance_to(now);
                Completion::None
            }
            Exit::Shutdown => return ExitAction::Stop(StopReason::GuestReset),
            Exit::Fatal { reason } => {
                return ExitAction::Stop(StopReason::Failure { failure: reason })
            }
            Exit::SingleStep => {
                return ExitAction::Stop(StopReason::Failure {
                    failure: ExitFailure::StraySingleStep,
                })
            }
        };
        // Every guest-caused exit (and only those) refreshes the clock page.
        if !matches!(exit, Exit::Interrupted) {
            self.publish_clock_page();
        }
        if let Some(event) = self.devices.take_event() {
            return ExitAction::Stop(match event {
                GuestEvent::Exit(status) => StopReason::GuestExit { status },
                GuestEvent::Reset => StopReason::GuestReset,
            });
        }
        ExitAction::Resume(completion)
    }

    /// Writes the exit count and virtual time into the guest's clock page
    /// (if it has one). The exit handler calls it at every guest-caused
    /// exit; the session once more before the first entry after a boot or
    /// a restore (the same values: the page is guest memory, restored too).
    pub fn publish_clock_page(&self) {
        self.devices
            .publish_clock_page(self.exits, self.clock.now());
    }

    /// Decides about interrupt delivery before the next KVM_RUN.
    /// `ready` is KVM's `ready_for_interrupt_injection` and the guest's IF flag combined.
    pub fn interrupt_action(&mut self, ready: bool) -> InterruptAction {
        if !self.devices.has_pending_interrupt() {
            return InterruptAction::None;
        }
        if !ready {
            return InterruptAction::RequestWindow;
        }
        match self.devices.acknowledge_interrupt() {
            Some(vector) => InterruptAction::Inject(vector),
            None => InterruptAction::None,
        }
    }
}

/// Clock and exit count (the devices have their own state; the time limit
/// is configuration and stays).
impl Persist for Machine {
    type State = MachineState;

    fn save(&self) -> MachineState {
        MachineState {
            clock: self.clock.save(),
            exits: self.exits,
            until: self.until,
        }
    }

    fn restore(&mut self, state: &MachineState) -> Result<(), RestoreError> {
        self.clock.restore(&state.clock)?;
        self.exits = state.exits;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::EXIT_COST;
    use devices::{layout, DevicesConfig};

    fn machine(until: Option<VirtNanos>) -> Machine {
        let devices = Devices::new(
            DevicesConfig {
                rtc_epoch_unix_secs: 1_704_067_200,
            },
            Box::new(std::io::sink()),
        );
        Machine::new(devices, until)
    }

    fn out(m: &mut Machine, port: u16, value: u8) -> ExitAction {
        m.handle_exit(&Exit::IoOut {
            port,
            data: AccessData::new(&[value]),
        })
    }

    fn mmio_write64(m: &mut Machine, offset: u64, value: u64) {
        m.handle_exit(&Exit::MmioWrite {
            addr: layout::HPET_BASE + offset,
            data: AccessData::new(&value.to_le_bytes()),
        });
    }

    /// The PIC initialisation Linux performs: vectors 0x20 (master) and 0x28 (slave).
    fn init_pic(m: &mut Machine) {
        for (port, value) in [
            (0x20, 0x11),
            (0x21, 0x20),
            (0x21, 0x04),
            (0x21, 0x01),
            (0xa0, 0x11),
            (0xa1, 0x28),
            (0xa1, 0x02),
            (0xa1, 0x01),
            (0x21, 0x00),
            (0xa1, 0x00),
        ] {
            out(m, port, value);
        }
    }

    /// HPET in legacy mode, timer 0 one-shot with its comparator at `ticks`.
    fn arm_hpet_timer0(m: &mut Machine, ticks: u64) {
        const GENERAL_CONFIG: u64 = 0x10;
        const TIMER0_CONFIG: u64 = 0x100;
        const TIMER0_COMPARATOR: u64 = 0x108;
        const INT_ENABLE: u64 = 1 << 2;
        mmio_write64(m, TIMER0_CONFIG, INT_ENABLE);
        mmio_write64(m, TIMER0_COMPARATOR, ticks);
        mmio_write64(m, GENERAL_CONFIG, 0b11);
    }

    #[test]
    fn test_status_port_write_stops_with_guest_exit_status() {
        let mut m = machine(None);
        assert_eq!(
            out(&mut m, layout::STATUS_PORT, 7),
            ExitAction::Stop(StopReason::GuestExit { status: 7 })
        );
    }

    #[test]
    fn test_every_exit_advances_virtual_time_by_fixed_cost() {
        let mut m = machine(None);
        out(&mut m, layout::POST_PORT, 0);
        m.handle_exit(&Exit::IoIn {
            port: layout::COM1_PORT + 5,
            len: 1,
        });
        assert_eq!(m.now(), VirtNanos(2 * EXIT_COST.0));
        assert_eq!(m.exits(), 2);
    }

    #[test]
    fn test_signal_interruption_costs_no_virtual_time() {
        let mut m = machine(None);
        m.handle_exit(&Exit::Interrupted);
        assert_eq!(m.now(), VirtNanos::ZERO);
    }

    #[test]
    fn test_hlt_jumps_to_hpet_deadline_and_injects_timer_vector() {
        let mut m = machine(None);
        init_pic(&mut m);
        // 1 ms at 100 MHz.
        arm_hpet_timer0(&mut m, 100_000);
        let action = m.handle_exit(&Exit::Hlt);
        assert_eq!(action, ExitAction::Resume(Completion::None));
        assert!(m.now() >= VirtNanos(1_000_000));
        assert!(m.now() < VirtNanos(1_000_000 + 100 * EXIT_COST.0));
        assert_eq!(m.interrupt_action(true), InterruptAction::Inject(0x20));
        assert_eq!(m.interrupt_action(true), InterruptAction::None);
    }

    /// A machine with the clock page in 1 MiB of guest memory.
    fn machine_with_clock_page() -> (Machine, devices::GuestMemory) {
        let memory =
            devices::GuestMemory::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap();
        let mut m = machine(None);
        m.devices.attach_clock_page(memory.clone());
        (m, memory)
    }

    fn page_u64(memory: &devices::GuestMemory, offset: u64) -> u64 {
        use vm_memory::Bytes;
        memory
            .read_obj(vm_memory::GuestAddress(layout::CLOCK_PAGE_ADDR + offset))
            .unwrap()
    }

    /// What the guest's clockevent does: the deadline goes into the page.
    fn guest_arms_clock_page(memory: &devices::GuestMemory, at: u64) {
        use vm_memory::Bytes;
        memory
            .write_obj(at, vm_memory::GuestAddress(layout::CLOCK_PAGE_ADDR + 0x18))
            .unwrap();
    }

    #[test]
    fn test_clock_page_holds_exits_and_time_of_the_last_guest_exit() {
        let (mut m, memory) = machine_with_clock_page();
        out(&mut m, layout::POST_PORT, 0);
        out(&mut m, layout::CLOCK_PAGE_EXIT_PORT, 0);
        assert_eq!(page_u64(&memory, 0x08), 2);
        assert_eq!(page_u64(&memory, 0x10), 2 * EXIT_COST.0);
        // A host event is no guest exit: the page keeps the last one's values.
        m.handle_exit(&Exit::Interrupted);
        assert_eq!(page_u64(&memory, 0x08), 2);
        assert_eq!(page_u64(&memory, 0x10), 2 * EXIT_COST.0);
    }

    #[test]
    fn test_hlt_jumps_to_clock_page_deadline_and_injects_timer_vector() {
        let (mut m, memory) = machine_with_clock_page();
        init_pic(&mut m);
        guest_arms_clock_page(&memory, 1_000_000);
        assert_eq!(m.devices.next_deadline(), Some(VirtNanos(1_000_000)));
        assert_eq!(
            m.handle_exit(&Exit::Hlt),
            ExitAction::Resume(Completion::None)
        );
        assert_eq!(m.now(), VirtNanos(1_000_000));
        assert_eq!(m.interrupt_action(true), InterruptAction::Inject(0x20));
        // Fired once and cleared; the page shows the time of the HLT exit.
        assert_eq!(page_u64(&memory, 0x18), 0);
        assert_eq!(page_u64(&memory, 0x10), 1_000_000);
        assert_eq!(m.devices.next_deadline(), None);
        assert_eq!(m.devices.clock_page_deadlines_fired(), 1);
    }

    #[test]
    fn test_clock_page_deadline_fires_at_the_first_exit_that_reaches_it() {
        let (mut m, memory) = machine_with_clock_page();
        init_pic(&mut m);
        let armed_at = m.now().0;
        guest_arms_clock_page(&memory, armed_at + EXIT_COST.0 + 1);
        out(&mut m, layout::POST_PORT, 0);
        assert_eq!(m.interrupt_action(true), InterruptAction::None);
        out(&mut m, layout::POST_PORT, 0);
        assert_eq!(m.interrupt_action(true), InterruptAction::Inject(0x20));
    }

    #[test]
    fn test_pending_interrupt_requests_window_when_guest_not_ready() {
        let mut m = machine(None);
        init_pic(&mut m);
        arm_hpet_timer0(&mut m, 100);
        m.handle_exit(&Exit::Hlt);
        assert_eq!(m.interrupt_action(false), InterruptAction::RequestWindow);
        m.handle_exit(&Exit::IrqWindowOpen);
        assert_eq!(m.interrupt_action(true), InterruptAction::Inject(0x20));
    }

    #[test]
    fn test_hlt_with_nothing_to_wake_stops_halted_forever() {
        let mut m = machine(None);
        init_pic(&mut m);
        assert_eq!(
            m.handle_exit(&Exit::Hlt),
            ExitAction::Stop(StopReason::HaltedForever)
        );
    }

    #[test]
    fn test_hlt_jump_stops_at_wakeup_and_ignores_a_stale_one() {
        let mut m = machine(None);
        init_pic(&mut m);
        // 10 ms at 100 MHz.
        arm_hpet_timer0(&mut m, 1_000_000);
        m.wakeup = Some(VirtNanos::from_micros(30));
        assert_eq!(
            m.handle_exit(&Exit::Hlt),
            ExitAction::Resume(Completion::None)
        );
        assert_eq!(m.now(), VirtNanos::from_micros(30));
        // Passed now: the next halt sleeps to the timer.
        m.handle_exit(&Exit::Hlt);
        assert!(m.now() >= VirtNanos::from_micros(10_000));
    }

    #[test]
    fn test_hlt_with_only_a_wakeup_sleeps_to_it() {
        let mut m = machine(None);
        init_pic(&mut m);
        m.wakeup = Some(VirtNanos::from_micros(2_000));
        assert_eq!(
            m.handle_exit(&Exit::Hlt),
            ExitAction::Resume(Completion::None)
        );
        assert_eq!(m.now(), VirtNanos::from_micros(2_000));
        assert_eq!(
            m.handle_exit(&Exit::Hlt),
            ExitAction::Stop(StopReason::HaltedForever)
        );
    }

    /// The time limit is no wake-up: a halt sleeps to its deadline past
    /// it, and the exit is handled whole (the session stops the run before
    /// the next entry), as when the run is handed back at that time.
    #[test]
    fn test_hlt_sleeps_past_the_time_limit_to_its_deadline() {
        let limit = VirtNanos::from_micros(50);
        let mut m = machine(Some(limit));
        init_pic(&mut m);
        arm_hpet_timer0(&mut m, 100_000_000);
        assert!(matches!(m.handle_exit(&Exit::Hlt), ExitAction::Resume(_)));
        assert!(m.now() > limit, "{}", m.now());
        assert!(m.devices.has_pending_interrupt());
    }

    #[test]
    fn test_unknown_msr_read_faults_and_misc_enable_reads_value() {
        let mut m = machine(None);
        assert_eq!(
            m.handle_exit(&Exit::RdMsr {
                index: cpu_model::msr::IA32_TSC
            }),
            ExitAction::Resume(Completion::Msr(MsrAccess::GeneralProtection))
        );
        assert_eq!(
            m.handle_exit(&Exit::RdMsr {
                index: cpu_model::msr::IA32_MISC_ENABLE
            }),
            ExitAction::Resume(Completion::Msr(MsrAccess::Value(1)))
        );
    }

    #[test]
    fn test_unowned_mmio_read_returns_all_ones() {
        let mut m = machine(None);
        let action = m.handle_exit(&Exit::MmioRead {
            addr: 0xfee0_0030,
            len: 4,
        });
        assert_eq!(
            action,
            ExitAction::Resume(Completion::Data(AccessData::new(&[0xff; 4])))
        );
    }

    #[test]
    fn test_shutdown_stops_with_guest_reset() {
        let mut m = machine(None);
        assert_eq!(
            m.handle_exit(&Exit::Shutdown),
            ExitAction::Stop(StopReason::GuestReset)
        );
    }

    #[test]
    fn test_perturbation_flips_first_read_at_or_after_exit() {
        let read = |m: &mut Machine| match m.handle_exit(&Exit::IoIn {
            port: layout::RTC_PORT + 1,
            len: 1,
        }) {
            ExitAction::Resume(Completion::Data(d)) => d.as_slice()[0],
            other => panic!("unexpected {other:?}"),
        };
        let mut plain = machine(None);
        let mut perturbed = machine(None);
        perturbed.set_perturbation(Some(Perturbation { at_exit: 1 }));
        for m in [&mut plain, &mut perturbed] {
            out(m, layout::RTC_PORT, 0x0d);
        }
        // Exit index 1 is the first read at or after index 1: flipped once, then never again.
        assert_eq!(read(&mut plain) ^ 1, read(&mut perturbed));
        assert_eq!(read(&mut plain), read(&mut perturbed));
    }

    fn after_exits(n: usize) -> Machine {
        let mut m = machine(None);
        for _ in 0..n {
            out(&mut m, layout::POST_PORT, 0);
        }
        m
    }

    devices::persist_round_trip_tests! {
        mod machine_persist {
            fresh: machine(None),
            saved: after_exits(3),
            mutate: |m: &mut Machine| {
                out(m, layout::POST_PORT, 0);
            },
        }
    }
}
