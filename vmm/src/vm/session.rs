//! The session: a booted (or resumed) guest with everything needed to run
//! it one exit at a time, its complete state between exits
//! ([`SessionState`]), and the report of a run ([`RunOutcome`]).
//!
//! Running it (the exit loop) is in `stepping`, in-place checkpoints in
//! `checkpoint`.

use super::console::{self, ConsoleCapture, ConsoleInput};
use super::kvm_vm::{create_vm, Vm};
use super::memory::{fresh_ram, host_ram, GuestRam};
use super::memory_scan::MemoryBacking;
use super::page_ledger::PageLedger;
use super::wiring::{build_devices, DeviceSetSpec, DiskSpec, NetworkSpec};
use super::{
    kvm_err, DigestParts, IncompatibleState, ResumeConfig, RunOutcome, SetupError, VmConfig,
    VmError,
};
use crate::boot::{self, BootError, BootInputs};
use crate::clock::Clock;
use crate::cpu_model;
use crate::entropy::{self, stream, EntropyStream};
use crate::exit::{Machine, MachineState, StopReason};
use crate::guest_crng::GuestCrng;
use crate::irq_window::WindowGuard;
use crate::pmu_clock::PmuCounterChoice;
use crate::record::{self, ChainHash, Recorder, RecorderState};
use crate::stall::{StallGuard, StallTimeout};
use crate::vcpu_state::{self, VcpuState};
use devices::ExitPath;
use devices::{Devices, DevicesState, Persist, VirtNanos};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// Everything a snapshot needs besides guest RAM: the vCPU, the devices, the
/// clock, the record stream's position and the console hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionState {
    pub ram_bytes: u64,
    pub seed: u64,
    /// The NICs and switch the machine was built with (attached again, then
    /// restored from `devices`).
    pub network: Option<NetworkSpec>,
    /// Whether the machine has the control channel (a virtio console).
    /// (Saved under its former name, so snapshots keep their format.)
    #[serde(default, rename = "agent_channel")]
    pub control_channel: bool,
    /// The disks' base images (attached again, checked by digest, then
    /// restored from `devices`); none in states saved before disks.
    #[serde(default)]
    pub disks: Vec<DiskSpec>,
    /// Whether the machine has the clock page (attached again; its
    /// contents are guest memory).
    pub exit_path: ExitPath,
    pub cpu_model_version: u32,
    pub vcpu: VcpuState,
    pub devices: DevicesState,
    pub machine: MachineState,
    pub recorder: RecorderState,
    pub console_hash: ChainHash,
    pub console_bytes: u64,
    pub injected_interrupts: u64,
    /// kvm_run.request_interrupt_window as the loop left it.
    pub request_interrupt_window: u8,
    /// RIP at the last guest-caused exit (what a stall reports; absent in
    /// snapshots older than the stall guard).
    #[serde(default)]
    pub last_exit_rip: u64,
    /// Single steps taken as an observer since the last exit (see
    /// `insn_steps`): the state is at `exit:N+insn:K`. Not written when 0,
    /// so states at exits keep their format; a detvisor that predates it
    /// refuses a state that has it (unknown field) rather than misplace it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub insn_steps: u64,
    /// Where the guest kernel keeps its CRNG, found in the vmlinux at boot
    /// (`None`: a kernel without the symbols; see [`crate::guest_crng`]).
    pub guest_crng: Option<GuestCrng>,
}

/// How [`Session::rekey`] re-keyed the guest kernel's CRNG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestCrngRekey {
    /// In guest memory, at the branch exit: exact.
    InMemory,
    /// Not at all: the kernel has no CRNG symbols the VMM knows.
    NoSymbols,
}

/// A booted guest and everything needed to run it one exit at a time.
pub struct Session {
    pub(super) vm: Vm,
    pub(super) backing: MemoryBacking,
    pub(super) seed: u64,
    pub(super) network: Option<NetworkSpec>,
    pub(super) control_channel: bool,
    pub(super) disks: Vec<DiskSpec>,
    pub(super) exit_path: ExitPath,
    /// The clock page must be written before the next entry (after a
    /// boot or a restore).
    pub(super) publish_before_entry: bool,
    pub(super) machine: Machine,
    pub(super) recorder: Recorder,
    pub(super) console: Arc<Mutex<ConsoleCapture>>,
    pub(super) input: Option<ConsoleInput>,
    pub(super) injected_total: u64,
    /// Finds where interrupt windows really open (not saved: it is idle
    /// between exits, and its counters are per process).
    pub(super) window: WindowGuard,
    /// The checkpoint tree, the kept page hashes, and who has to hear of
    /// pages changed (fed from the dirty log).
    pub(super) ram_ledger: PageLedger,
    pub(super) started: Instant,
    pub(super) wall_setup: Duration,
    /// Ends a run whose guest executes too long without an exit (host
    /// policy, not saved).
    pub(super) stall: StallGuard,
    /// RIP at the last guest-caused exit.
    pub(super) last_exit_rip: u64,
    /// Single steps taken since the last exit (reset by each exit).
    pub(super) insn_steps: u64,
    /// The pmu clock's counter (see `pmu_run`; `None` under other clocks).
    pub(super) counter: Option<Box<dyn crate::pmu_clock::PmuCounter>>,
    /// The guest ran free (unstepped) since the last exit and the hardware
    /// counter stopped it: the steps since the exit are not known, so
    /// neither is the position (until the next exit).
    pub(super) ran_free: bool,
    /// Software breakpoints a debugger set (not saved: a debugger's).
    pub(super) breakpoints: super::breakpoints::Breakpoints,
    /// A breakpoint hit left the run at an unknown step of its interval.
    pub(super) position_lost: bool,
    /// Where the guest kernel keeps its CRNG (re-keyed at a branch).
    pub(super) guest_crng: Option<GuestCrng>,
}

impl Session {
    /// Loads the kernel and boot data, creates the VM, and stops before the first instruction.
    pub fn boot(
        config: &VmConfig,
        console: Box<dyn Write + Send>,
        input: Option<ConsoleInput>,
    ) -> Result<Session, VmError> {
        if !(boot::MIN_RAM..=boot::MAX_RAM).contains(&config.ram_bytes) {
            return Err(BootError::RamSize(config.ram_bytes).into());
        }
        let started = Instant::now();
        let ram = fresh_ram(config.ram_bytes)?;
        let memory = ram.memory.clone();
        // Bad input (not a kernel, an initrd too large) is found before KVM is touched.
        let kernel = boot::load_kernel(&memory, &config.kernel)?;
        let (devices, console) = build_devices(
            ConsoleCapture {
                out: console,
                hash: ChainHash::default(),
                bytes: 0,
            },
            memory.clone(),
            DeviceSetSpec {
                rtc_epoch_unix_secs: config.rtc_epoch_unix_secs,
                seed: config.seed,
                network: config.network.as_ref(),
                control_channel: config.control_channel,
                disks: &config.disks,
                exit_path: config.exit_path,
            },
        )?;
        // The virtio devices and the clock page are declared on the kernel
        // command line.
        let mut cmdline = format!("{} {}", config.cmdline, devices.virtio_cmdline());
        if let Some(fragment) = devices.clock_page_cmdline() {
            cmdline = format!("{cmdline} {fragment}");
        }
        let mut rng_seed = [0u8; boot::RNG_SEED_LEN];
        EntropyStream::new(config.seed, stream::KERNEL_RNG_SEED).fill(&mut rng_seed);
        boot::write_boot_data(
            &memory,
            &kernel,
            &BootInputs {
                ram: config.ram_bytes,
                cmdline: &cmdline,
                initrd: &config.initrd,
                rng_seed,
            },
        )?;
        let vm = create_vm(ram)?;
        let sregs = vm.vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
        vm.vcpu
            .set_sregs(&boot::initial_sregs(sregs))
            .map_err(kvm_err("KVM_SET_SREGS"))?;
        vm.vcpu
            .set_regs(&boot::initial_regs(kernel.entry))
            .map_err(kvm_err("KVM_SET_REGS"))?;
        let fpu = kvm_bindings::kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        vm.vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))?;

        let (clock, counter) =
            Clock::open(config.clock, config.pmu_counter, None).map_err(SetupError::Clock)?;
        let mut machine = Machine::with_clock(devices, config.until, clock);
        machine.set_perturbation(config.perturbation);
        Ok(Session {
            vm,
            backing: MemoryBacking::Anonymous,
            seed: config.seed,
            network: config.network.clone(),
            control_channel: config.control_channel,
            disks: config.disks.clone(),
            exit_path: config.exit_path,
            publish_before_entry: true,
            machine,
            recorder: Recorder::new(config.record),
            console,
            input,
            injected_total: 0,
            stall: StallGuard::new(config.stall_timeout),
            last_exit_rip: 0,
            insn_steps: 0,
            counter,
            ran_free: false,
            breakpoints: Default::default(),
            position_lost: false,
            guest_crng: kernel.guest_crng,
            window: WindowGuard::default(),
            ram_ledger: PageLedger::default(),
            wall_setup: started.elapsed(),
            started,
        })
    }

    /// Changes the stall guard's timeout (host policy: see [`crate::stall`]).
    pub fn set_stall_timeout(&mut self, timeout: StallTimeout) {
        self.stall.set_timeout(timeout);
    }

    pub fn stall_timeout(&self) -> StallTimeout {
        self.stall.timeout()
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Re-keys every seeded stream the machine draws from
    /// ([`entropy::REKEYED_AT_BRANCH`] but the guest pool and the SDKs'
    /// random stream, which are the `up` run's: see
    /// `run::driven::Driven::rekey`) from `seed` and the present
    /// exit index: an alternate history from this moment. Branching the same
    /// moment with the same seed twice gives the same history.
    ///
    /// The guest kernel's CRNG is re-keyed here too, in guest memory, before
    /// the guest runs again ([`crate::guest_crng`]); the answer says whether
    /// it could be (`false`: the kernel has no CRNG symbols, and the caller
    /// must reseed it some other way).
    pub fn rekey(&mut self, seed: u64) -> Result<GuestCrngRekey, VmError> {
        self.seed = seed;
        let exit = self.machine.exits();
        let devices = &mut self.machine.devices;
        devices.rekey_virtio_rng(entropy::branch_key(seed, exit, stream::VIRTIO_RNG));
        devices.rekey_switch(entropy::branch_key(seed, exit, stream::NETWORK_SWITCH));
        let Some(crng) = self.guest_crng else {
            return Ok(GuestCrngRekey::NoSymbols);
        };
        crng.rekey(&self.vm.memory, &entropy::guest_pool_bytes(seed, exit))?;
        Ok(GuestCrngRekey::InMemory)
    }

    /// Queues a message for the agent on its control channel, delivered now
    /// (at this exit) as far as the guest has posted receive buffers. Call it
    /// only at points the run decides deterministically (after an exit chosen
    /// by guest output or virtual time).
    pub fn send_on_control_channel(&mut self, bytes: &[u8]) -> Result<(), VmError> {
        let now = self.machine.now();
        self.machine
            .devices
            .enqueue_virtio_console_input(now, bytes)
            .map_err(VmError::ControlChannel)
    }

    /// What the agent wrote on its control channel since the last call. The
    /// bytes are folded into the console digest, so a run's digest covers the
    /// agent's conversation too.
    pub fn take_control_output(&mut self) -> Vec<u8> {
        let bytes = self.machine.devices.take_virtio_console_output();
        if !bytes.is_empty() {
            console::lock(&self.console).absorb(&bytes);
        }
        bytes
    }

    /// Makes an idle guest wake at `at` at the latest (instead of jumping past
    /// it to the next device deadline), so a host-side event scheduled for
    /// `at` happens on time. Part of the run's definition: two runs with the
    /// same wake-ups are identical.
    pub fn set_wakeup(&mut self, at: Option<VirtNanos>) {
        self.machine.wakeup = at;
    }

    /// Whether the machine has a control channel (the virtio console the
    /// agent, or a fork shell, talks over).
    pub fn has_control_channel(&self) -> bool {
        self.control_channel
    }

    /// The devices, for scheduling network faults.
    pub fn devices_mut(&mut self) -> &mut devices::Devices {
        &mut self.machine.devices
    }

    /// Exits handled so far.
    pub fn exits(&self) -> u64 {
        self.machine.exits()
    }

    pub fn now(&self) -> VirtNanos {
        self.machine.now()
    }

    /// Guest RAM, for writing a snapshot. The vCPU is not running while borrowed.
    pub fn memory(&self) -> &[u8] {
        let (ptr, len) = host_ram(&self.vm.memory);
        // SAFETY: `host_ram` gives the live host mapping of all guest RAM,
        // owned by the session, which the returned borrow cannot outlive; the
        // vCPU only runs inside `&mut self` methods, so the memory does not
        // change meanwhile.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }

    /// Captures the complete state between two exits (the pending exit is
    /// completed first, so a restored copy neither repeats nor skips it).
    pub fn capture(&mut self) -> Result<SessionState, VmError> {
        if self.position_lost {
            return Err(VmError::PositionLost);
        }
        if self.ran_free {
            return Err(VmError::PositionUnknown {
                exit: self.machine.exits(),
            });
        }
        vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
        let vcpu = vcpu_state::capture(&self.vm.vcpu)?;
        let (console_hash, console_bytes) = {
            let capture = console::lock(&self.console);
            (capture.hash, capture.bytes)
        };
        Ok(SessionState {
            ram_bytes: self.vm.memory.iter().map(|r| r.len()).sum(),
            seed: self.seed,
            network: self.network.clone(),
            control_channel: self.control_channel,
            disks: self.disks.clone(),
            exit_path: self.exit_path,
            cpu_model_version: cpu_model::CPU_MODEL_VERSION,
            vcpu,
            devices: self.machine.devices.save(),
            machine: self.machine.save(),
            recorder: self.recorder.save(),
            console_hash,
            console_bytes,
            injected_interrupts: self.injected_total,
            request_interrupt_window: self.vm.vcpu.get_kvm_run().request_interrupt_window,
            last_exit_rip: self.last_exit_rip,
            insn_steps: self.insn_steps,
            guest_crng: self.guest_crng,
        })
    }

    /// Resumes a captured session over `memory` (the snapshot's RAM, typically
    /// mapped private from its file, with `data_ranges` the file's non-hole
    /// byte ranges). `config` supplies the new run's limit, records and seed.
    pub fn resume(
        config: &ResumeConfig,
        state: &SessionState,
        ram: GuestRam,
        data_ranges: Vec<(u64, u64)>,
        console: Box<dyn Write + Send>,
        input: Option<ConsoleInput>,
    ) -> Result<Session, VmError> {
        let started = Instant::now();
        if state.cpu_model_version != cpu_model::CPU_MODEL_VERSION {
            return Err(IncompatibleState::CpuModel {
                snapshot: state.cpu_model_version,
                ours: cpu_model::CPU_MODEL_VERSION,
            }
            .into());
        }
        let ram_bytes: u64 = ram.memory.iter().map(|r| r.len()).sum();
        if ram_bytes != state.ram_bytes {
            return Err(IncompatibleState::RamSize {
                memory: ram_bytes,
                state: state.ram_bytes,
            }
            .into());
        }
        let devices_memory = ram.memory.clone();
        let mut vm = create_vm(ram)?;
        vcpu_state::restore(&vm.vcpu, &state.vcpu)?;
        vm.vcpu.get_kvm_run().request_interrupt_window = state.request_interrupt_window;
        // The RTC epoch is part of the saved device state.
        let (mut devices, console) = build_devices(
            ConsoleCapture {
                out: console,
                hash: state.console_hash,
                bytes: state.console_bytes,
            },
            devices_memory,
            DeviceSetSpec {
                rtc_epoch_unix_secs: 0,
                seed: state.seed,
                network: state.network.as_ref(),
                control_channel: state.control_channel,
                disks: &state.disks,
                exit_path: state.exit_path,
            },
        )?;
        devices
            .restore(&state.devices)
            .map_err(IncompatibleState::Devices)?;
        let saved = state.machine.clock.kind;
        if let Some(asked) = config.clock.filter(|&asked| asked != saved) {
            return Err(IncompatibleState::Clock { saved, asked }.into());
        }
        let (clock, counter) =
            Clock::open(saved, PmuCounterChoice::Hardware, state.machine.clock.event)
                .map_err(SetupError::Clock)?;
        let mut machine = Machine::with_clock(devices, config.until, clock);
        machine
            .restore(&state.machine)
            .map_err(IncompatibleState::Machine)?;
        let mut recorder = Recorder::new(config.record);
        recorder
            .restore(&state.recorder)
            .map_err(IncompatibleState::Machine)?;
        Ok(Session {
            vm,
            backing: MemoryBacking::File { data_ranges },
            seed: state.seed,
            network: state.network.clone(),
            control_channel: state.control_channel,
            disks: state.disks.clone(),
            exit_path: state.exit_path,
            publish_before_entry: true,
            machine,
            recorder,
            console,
            input,
            injected_total: state.injected_interrupts,
            stall: StallGuard::new(config.stall_timeout),
            last_exit_rip: state.last_exit_rip,
            insn_steps: state.insn_steps,
            counter,
            ran_free: false,
            breakpoints: Default::default(),
            position_lost: false,
            guest_crng: state.guest_crng,
            window: WindowGuard::default(),
            ram_ledger: PageLedger::default(),
            wall_setup: started.elapsed(),
            started,
        })
    }

    /// Hashes the final state and reports the run.
    pub fn finish(mut self, stop: StopReason) -> RunOutcome {
        self.outcome(stop)
    }

    /// Hashes the current state and reports the run so far, leaving the
    /// session usable (for `reset_to`); its kept records move to the outcome.
    pub fn outcome(&mut self, stop: StopReason) -> RunOutcome {
        let finishing = Instant::now();
        let (mut final_memory, resident) = self.memory_digest(true);
        let guest_resident_bytes = resident.unwrap_or_default();
        // A stalled guest kept changing its memory after its last exit, by
        // as much as the host let it run: that is not part of the history.
        let stalled = matches!(stop, StopReason::Stalled { .. });
        if stalled {
            final_memory = 0;
        }

        let final_devices = devices_hash(&self.machine.devices);
        let (console_hash, console_bytes) = {
            let mut capture = console::lock(&self.console);
            let _ = capture.out.flush();
            (capture.hash.0, capture.bytes)
        };
        let exits = self.recorder.count();
        let exits_by_kind = self.recorder.counts_by_kind();
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let digest_parts = DigestParts {
            records: hex(&self.recorder.save().digest.0[..8]),
            memory: if stalled {
                "not hashed (stalled)".into()
            } else {
                format!("{final_memory:016x}")
            },
            devices: format!("{final_devices:016x}"),
            console: hex(&console_hash[..8]),
        };
        let fresh = Recorder::new(self.recorder.config);
        let recorder = std::mem::replace(&mut self.recorder, fresh);
        // A recorder takes any state: nothing to fail here.
        let _ = self.recorder.restore(&recorder.save());
        let (digest, records) = recorder.finish(final_memory, final_devices, console_hash);
        RunOutcome {
            stop,
            virtual_time: self.machine.now(),
            exits,
            exits_by_kind,
            injected_interrupts: self.injected_total,
            irq_windows_stepped: self.window.corrected_windows,
            single_steps: self.window.steps,
            wall: self.started.elapsed(),
            wall_setup: self.wall_setup,
            wall_finish: finishing.elapsed(),
            digest,
            digest_parts,
            console_bytes,
            unhandled_accesses: self.machine.devices.unhandled_accesses(),
            guest_resident_bytes,
            records,
        }
    }

    /// Puts the vCPU, devices, clock, records and console digest back as
    /// `state` says, in place (guest RAM is the caller's business).
    pub(super) fn restore_state(&mut self, state: &SessionState) -> Result<(), VmError> {
        vcpu_state::restore(&self.vm.vcpu, &state.vcpu)?;
        self.vm.vcpu.get_kvm_run().request_interrupt_window = state.request_interrupt_window;
        self.machine
            .devices
            .restore(&state.devices)
            .map_err(IncompatibleState::Devices)?;
        self.machine
            .restore(&state.machine)
            .map_err(IncompatibleState::Machine)?;
        // Not part of the state: a wake-up belongs to the run that set it.
        self.machine.wakeup = None;
        self.recorder
            .restore(&state.recorder)
            .map_err(IncompatibleState::Machine)?;
        {
            let mut capture = console::lock(&self.console);
            capture.hash = state.console_hash;
            capture.bytes = state.console_bytes;
        }
        self.injected_total = state.injected_interrupts;
        self.last_exit_rip = state.last_exit_rip;
        self.insn_steps = state.insn_steps;
        self.position_lost = false;
        self.ran_free = false;
        self.guest_crng = state.guest_crng;
        self.seed = state.seed;
        self.publish_before_entry = true;
        Ok(())
    }
}

/// Whether a count is 0: serde's `skip_serializing_if` for step counts
/// (`insn_steps`), which are not written at whole exits.
pub fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Hash of the complete device state.
pub(super) fn devices_hash(devices: &Devices) -> u64 {
    let bytes = serde_json::to_vec(&devices.save()).unwrap_or_default();
    record::hash64(&bytes)
}
