//! Positions between two exits: single-stepping the guest from an exit,
//! one instruction at a time, as an observer (`exit:N+insn:K`, see
//! [`crate::position`]).
//!
//! Under the exit clock, stepping is observation, never history: a step
//! advances no clock, makes no record, injects nothing, feeds no console
//! input and writes no clock page (under the step clock each step is the
//! clock's tick instead: see `step_clock`). What the guest computes is what it computes unstepped, so
//! stepping through an interval and running on reaches the free run's next
//! exit with the free run's state. The trap flag KVM single-steps with is
//! the one way stepping could show in the guest: an instruction that
//! saves RFLAGS would save it set. Those are mended after their step
//! (`PUSHF`'s stack word, `SYSCALL`'s R11, the frame of a fault taken by
//! the stepped instruction), the delivery of an event queued at the exit
//! is made without it (a one-byte `HLT` at the handler, removed once hit:
//! the hardware pushes the frame as it would unstepped), and a software
//! interrupt (`INT n`), whose frame could not be mended before its handler
//! reads it, is refused.
//!
//! The guest exits met while stepping are the free run's: each is handled
//! exactly as the exit loop handles it (counted, recorded, its interrupt
//! decided) and the position moves to it. An interrupt that waits for the
//! guest to enable interrupts (a requested window) is delivered where the
//! window guard would deliver it: at the first boundary with IF=1 that
//! does not follow an `STI` opcode byte (see `irq_window`).

use super::console::feed_console_input;
use super::kvm_exit::{complete, convert_exit};
use super::pmu_run::count_step;
use super::stepping::{follows_sti_in_kernel, set_single_step, window_stop};
use super::{kvm_err, Session, VmError};
use crate::exit::{Exit, ExitAction, StopReason};
use crate::position::InsnPosition;
use crate::vcpu_state;
use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

/// The most single steps one request may take (at 10-20 thousand steps a
/// second in the helper VM, about ten minutes): a position past it is
/// refused, not stepped to for hours.
pub const MAX_INSN_STEPS: u64 = 10_000_000;

/// RFLAGS.TF, the trap flag.
const TF: u64 = 1 << 8;
/// RFLAGS.IF.
const IF: u64 = 1 << 9;
/// The one-byte `HLT` that stops the guest at a handler's first byte.
const HLT_OPCODE: u8 = 0xf4;
/// EFER.LMA: long mode active.
const EFER_LMA: u64 = 1 << 10;
/// The smallest page: a linear address is translated once per page of it.
const PAGE: u64 = 4096;
/// The longest x86 instruction.
const MAX_INSN_BYTES: usize = 15;

/// Why the guest cannot be stepped from where it stands.
#[derive(Debug, thiserror::Error)]
pub enum StepRefusal {
    #[error("{asked} single steps asked for: at most {MAX_INSN_STEPS} at once")]
    TooMany { asked: u64 },
    #[error("the guest has stopped ({reason:?})")]
    Stopped { reason: StopReason },
    #[error(
        "a non-maskable interrupt is queued for delivery: stepping its delivery is not supported"
    )]
    Nmi,
    #[error(
        "the instruction at {rip:#x} is a software interrupt (opcode {opcode:#04x}): \
         its handler would read the trap flag from its frame, so it is not stepped"
    )]
    SoftwareInterrupt { rip: u64, opcode: u8 },
    #[error("guest address {address:#x} is not mapped")]
    Unmapped { address: u64 },
    #[error(
        "delivering vector {vector} to its handler at {handler:#x} stopped with {exit:?} \
         at rip {rip:#x}, not at the handler"
    )]
    Delivery {
        vector: u8,
        handler: u64,
        exit: Exit,
        rip: u64,
    },
}

/// What [`Session::step_insns`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InsnSteps {
    /// Single steps taken (an exit met counts as the step of its
    /// instruction).
    pub stepped: u64,
    /// Guest exits met on the way (each handled as the free run does).
    pub exits: u64,
    /// Set when the guest stopped at one of them.
    pub stop: Option<StopReason>,
}

/// The mode the guest's code runs in, as far as decoding goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CodeMode {
    Long,
    Legacy,
}

/// What a stepped instruction does that stepping has to mend or refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Saves {
    Nothing,
    /// `PUSHF`: RFLAGS to the stack.
    Pushf,
    /// `SYSCALL`: RFLAGS to R11.
    Syscall,
    /// `INT n`, `INT3`, `INTO`, `INT1`: RFLAGS to an interrupt frame.
    SoftwareInterrupt(u8),
    /// RFLAGS loaded from what the guest saved (long mode), which would
    /// drop the trap flag and with it the stepping until the next exit
    /// (a return to user space ran unstepped).
    Loads(FlagsFrom),
}

/// Where an instruction that loads RFLAGS takes it from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlagsFrom {
    /// `SYSRET`: R11.
    Sysret,
    /// `IRET`: the frame on the stack (8-byte slots with REX.W, else 4).
    Iret { wide: bool },
    /// `POPF`: the word on the stack.
    Popf,
}

/// The trap flag put into what a stepped instruction loads RFLAGS from,
/// taken out again after the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planted {
    Nothing,
    R11,
    /// The byte (RFLAGS bits 8-15) at this address, as it was.
    Byte {
        address: u64,
        original: u8,
    },
    /// IA32_FMASK as it was (with TF, which SYSCALL would clear).
    SyscallMask(u64),
}

/// IA32_FMASK: the RFLAGS bits SYSCALL clears.
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;

/// Classifies the instruction in `bytes` (legacy and REX prefixes skipped).
fn classify(bytes: &[u8], mode: CodeMode) -> Saves {
    let mut i = 0;
    let (mut rex_w, mut operand_16) = (false, false);
    while i < bytes.len() {
        match bytes[i] {
            0x66 => {
                operand_16 = true;
                i += 1;
            }
            0x67 | 0xf0 | 0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65 => i += 1,
            rex @ 0x40..=0x4f if mode == CodeMode::Long => {
                rex_w = rex & 8 != 0;
                i += 1;
            }
            _ => break,
        }
    }
    let long = mode == CodeMode::Long;
    match (bytes.get(i), bytes.get(i + 1)) {
        (Some(0x9c), _) => Saves::Pushf,
        (Some(0x0f), Some(0x05)) => Saves::Syscall,
        (Some(&op @ (0xcc | 0xcd | 0xce | 0xf1)), _) => Saves::SoftwareInterrupt(op),
        (Some(0x0f), Some(0x07)) if long => Saves::Loads(FlagsFrom::Sysret),
        (Some(0xcf), _) if long && !operand_16 => Saves::Loads(FlagsFrom::Iret { wide: rex_w }),
        (Some(0x9d), _) if long && !operand_16 => Saves::Loads(FlagsFrom::Popf),
        _ => Saves::Nothing,
    }
}

/// An event KVM holds for delivery at the next entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queued {
    None,
    Vector(u8),
    Nmi,
}

impl Session {
    /// Where the run stands at instruction granularity.
    pub fn insn_position(&self) -> InsnPosition {
        InsnPosition {
            exit: self.machine.exits(),
            steps: self.insn_steps,
        }
    }

    /// Single-steps the guest `count` instructions as an observer (see the
    /// module's text). A guest exit met on the way is handled and counts as
    /// its instruction's step; with `within_interval` the stepping ends
    /// there instead (the exit handled, not counted as a step). Refused,
    /// naming the position, where a step could show in the guest; the run
    /// is then where it was refused.
    pub fn step_insns(&mut self, count: u64, within_interval: bool) -> Result<InsnSteps, VmError> {
        self.step_insns_to(count, within_interval, None)
            .map(|(done, _)| done)
    }

    /// Single-steps within the interval until RIP is `address` (the
    /// present boundary included), at most `max` steps; the `bool` says
    /// whether it got there. Where it did not, the run stands where the
    /// stepping ended: `max` steps on, or at the exit that ended the
    /// interval (handled). A breakpoint's hit is found this way, from the
    /// exit before it. An interrupt delivered at the interval's first step
    /// enters its handler within that step, so a handler's first
    /// instruction is not a boundary here.
    pub fn step_to_address(
        &mut self,
        address: u64,
        max: u64,
    ) -> Result<(InsnSteps, bool), VmError> {
        self.step_insns_to(max, true, Some(address))
    }

    fn step_insns_to(
        &mut self,
        count: u64,
        within_interval: bool,
        stop_at: Option<u64>,
    ) -> Result<(InsnSteps, bool), VmError> {
        if self.position_lost {
            return Err(VmError::PositionLost);
        }
        if self.ran_free {
            return Err(VmError::PositionUnknown {
                exit: self.machine.exits(),
            });
        }
        let refuse = |session: &Session, reason| VmError::Step {
            at: session.insn_position(),
            reason,
        };
        if count > MAX_INSN_STEPS {
            return Err(refuse(self, StepRefusal::TooMany { asked: count }));
        }
        let mut done = InsnSteps {
            stepped: 0,
            exits: 0,
            stop: None,
        };
        let mut reached = false;
        let result = (|| {
            loop {
                if let Some(address) = stop_at {
                    let rip = self
                        .vm
                        .vcpu
                        .get_regs()
                        .map_err(kvm_err("KVM_GET_REGS"))?
                        .rip;
                    if rip == address {
                        reached = true;
                        break;
                    }
                }
                if done.stepped >= count {
                    break;
                }
                match self.step_insn()? {
                    Ok(None) => done.stepped += 1,
                    Ok(Some(ExitAction::Resume(_))) if within_interval => {
                        done.exits += 1;
                        break;
                    }
                    Ok(Some(ExitAction::Resume(_))) => {
                        done.stepped += 1;
                        done.exits += 1;
                    }
                    Ok(Some(ExitAction::Stop(reason))) => {
                        done.exits += 1;
                        done.stop = Some(reason);
                        break;
                    }
                    Err(reason) => return Err(refuse(self, reason)),
                }
            }
            Ok(())
        })();
        // The trap flag off again whatever happened: the free run resumes
        // from here, its stall guard watching afresh.
        self.stall.take_signal();
        set_single_step(&self.vm.vcpu, false)?;
        result.map(|()| (done, reached))
    }

    /// One step: `Ok(None)` a step inside the interval, `Ok(Some(action))`
    /// the guest exit it met (handled), `Err` a refusal (nothing done).
    /// Under the step clock it is also the clock's tick (`step_clock`).
    pub(super) fn step_insn(&mut self) -> Result<Result<Option<ExitAction>, StepRefusal>, VmError> {
        // The first step since the guest last ran unstepped: right after
        // its exit, or after a pmu free run (which leaves the count at 0).
        let first = self.insn_steps == 0;
        if first {
            // The exit's own instruction is finished first (as a snapshot
            // does) and with the trap flag off, so that finishing it is no
            // step; then the event it queued is delivered.
            vcpu_state::complete_pending_exit(&mut self.vm.vcpu)?;
            self.stall.take_signal();
        }
        if let Some(stop) = self.before_entry()? {
            return Ok(Err(StepRefusal::Stopped { reason: stop }));
        }
        let regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
        let sregs = self.vm.vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
        // Under the step clock, a deadline the clock has reached is taken
        // as the free run takes a pending interrupt: at a window (below).
        if self.counted_deadline_due() {
            self.vm.vcpu.get_kvm_run().request_interrupt_window = 1;
        }
        // A window the free run waits for opens here: the exit it makes
        // (KVM is not asked for it while stepping, so that it is found
        // here, at the boundary the window guard would choose).
        let wants_window = self.vm.vcpu.get_kvm_run().request_interrupt_window;
        if wants_window != 0
            && regs.rflags & IF != 0
            && !follows_sti_in_kernel(&self.vm.vcpu, &self.vm.memory, regs.rip)
        {
            let run = self.vm.vcpu.get_kvm_run();
            run.if_flag = 1;
            run.ready_for_interrupt_injection = 1;
            return Ok(Ok(Some(self.take_window_exit()?)));
        }
        let (regs, sregs) = if first {
            match self.queued_event()? {
                Queued::None => (regs, sregs),
                Queued::Nmi => return Ok(Err(StepRefusal::Nmi)),
                Queued::Vector(vector) => {
                    if let Err(refusal) = self.deliver_without_trap_flag(vector, &sregs)? {
                        return Ok(Err(refusal));
                    }
                    // The delivery moved them.
                    (
                        self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?,
                        self.vm.vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?,
                    )
                }
            }
        } else {
            (regs, sregs)
        };
        let mode = if sregs.efer & EFER_LMA != 0 && sregs.cs.l != 0 {
            CodeMode::Long
        } else {
            CodeMode::Legacy
        };
        let mut bytes = [0u8; MAX_INSN_BYTES];
        let read = self.read_linear(regs.rip, &mut bytes);
        if read == 0 {
            return Ok(Err(StepRefusal::Unmapped { address: regs.rip }));
        }
        let saves = classify(&bytes[..read], mode);
        if let Saves::SoftwareInterrupt(opcode) = saves {
            return Ok(Err(StepRefusal::SoftwareInterrupt {
                rip: regs.rip,
                opcode,
            }));
        }
        let frames = self.fault_frames(&regs, &sregs);
        let planted = match saves {
            Saves::Loads(from) => self.plant_trap_flag(from, &regs)?,
            Saves::Syscall => self.keep_trap_flag_through_syscall()?,
            _ => Planted::Nothing,
        };
        set_single_step(&self.vm.vcpu, true)?;
        self.vm.vcpu.get_kvm_run().request_interrupt_window = 0;
        let ran = loop {
            match self.vm.vcpu.run() {
                Ok(vcpu_exit) => break Ok(convert_exit(vcpu_exit)),
                // A host signal: not the guest's doing; enter again (the
                // stall guard's, pending until taken, would end every
                // later entry at once).
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.stall.take_signal();
                    continue;
                }
                Err(e) => break Err(kvm_err("KVM_RUN")(e)),
            }
        };
        let (exit, slot) = ran?;
        if exit == Exit::SingleStep {
            self.unplant_trap_flag(planted)?;
            self.vm.vcpu.get_kvm_run().request_interrupt_window = wants_window;
            self.mend_after_step(saves, mode, &regs, &frames)?;
            self.insn_steps += 1;
            count_step(&mut self.counter, &mut self.machine.clock);
            if self.step_clocked() {
                self.machine.publish_clock_page();
            }
            return Ok(Ok(None));
        }
        // The guest's own exit, handled as the exit loop handles it (its
        // instruction finishes at the next entry, with the trap flag off).
        if let Some(input) = &self.input {
            feed_console_input(&mut self.machine, input, exit == Exit::Hlt);
        }
        // The exiting instruction is this step's (time under the step
        // clock, before the exit sees the time).
        count_step(&mut self.counter, &mut self.machine.clock);
        let action = self.machine.handle_exit(&exit);
        if let ExitAction::Resume(completion) = &action {
            complete(slot, completion);
        }
        self.unplant_trap_flag(planted)?;
        self.vm.vcpu.get_kvm_run().request_interrupt_window = wants_window;
        set_single_step(&self.vm.vcpu, false)?;
        self.mend_fault_frames(&frames, regs.rip);
        Ok(Ok(Some(self.finish_exit(
            window_stop(&exit),
            &exit,
            action,
        )?)))
    }

    /// The event KVM delivers at the next entry, if any.
    fn queued_event(&self) -> Result<Queued, VmError> {
        let events = self
            .vm
            .vcpu
            .get_vcpu_events()
            .map_err(kvm_err("KVM_GET_VCPU_EVENTS"))?;
        Ok(if events.nmi.injected != 0 || events.nmi.pending != 0 {
            Queued::Nmi
        } else if events.exception.injected != 0 || events.exception.pending != 0 {
            Queued::Vector(events.exception.nr)
        } else if events.interrupt.injected != 0 {
            Queued::Vector(events.interrupt.nr)
        } else {
            Queued::None
        })
    }

    /// Delivers the queued `vector` with the trap flag off: a `HLT` over
    /// the first byte of its handler stops the guest there, the byte is put
    /// back and RIP set to the handler. The frame the hardware pushed is
    /// the free run's.
    fn deliver_without_trap_flag(
        &mut self,
        vector: u8,
        sregs: &kvm_sregs,
    ) -> Result<Result<(), StepRefusal>, VmError> {
        let long = sregs.efer & EFER_LMA != 0;
        // An IDT gate is 16 bytes in long mode, 8 in legacy mode.
        let size: usize = if long { 16 } else { 8 };
        let mut gate = [0u8; 16];
        let entry = sregs.idt.base.wrapping_add(u64::from(vector) * size as u64);
        if self.read_linear(entry, &mut gate[..size]) < size {
            return Ok(Err(StepRefusal::Unmapped { address: entry }));
        }
        let word = |i: usize| u64::from(u16::from_le_bytes([gate[i], gate[i + 1]]));
        let mut handler = word(0) | word(6) << 16;
        if long {
            handler |= u64::from(u32::from_le_bytes([gate[8], gate[9], gate[10], gate[11]])) << 32;
        }
        let Some(gpa) = self.translate(handler) else {
            return Ok(Err(StepRefusal::Unmapped { address: handler }));
        };
        let memory = &self.vm.memory;
        let original: u8 = memory
            .read_obj(GuestAddress(gpa))
            .map_err(|_| VmError::Step {
                at: self.insn_position(),
                reason: StepRefusal::Unmapped { address: handler },
            })?;
        let write = |byte: u8| {
            memory
                .write_obj(byte, GuestAddress(gpa))
                .map_err(|_| StepRefusal::Unmapped { address: handler })
        };
        if let Err(refusal) = write(HLT_OPCODE) {
            return Ok(Err(refusal));
        }
        set_single_step(&self.vm.vcpu, false)?;
        let entered = loop {
            match self.vm.vcpu.run() {
                Ok(vcpu_exit) => break Ok(convert_exit(vcpu_exit).0),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.stall.take_signal();
                    continue;
                }
                Err(e) => break Err(kvm_err("KVM_RUN")(e)),
            }
        };
        // The byte goes back whatever happened.
        let put_back = write(original);
        let exit = entered?;
        if let Err(refusal) = put_back {
            return Ok(Err(refusal));
        }
        let mut regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
        // KVM moves RIP past a HLT it exits for.
        if exit != Exit::Hlt || !(regs.rip == handler || regs.rip == handler + 1) {
            return Ok(Err(StepRefusal::Delivery {
                vector,
                handler,
                exit,
                rip: regs.rip,
            }));
        }
        regs.rip = handler;
        self.set_regs(&regs)?;
        Ok(Ok(()))
    }

    /// Where a fault taken by the instruction about to be stepped would
    /// leave RFLAGS (with the trap flag set) for its handler: the
    /// hardware's frame on the same stack (CPL 0), or on the stack in the
    /// TSS's RSP0 (CPL 3) and, for a Linux guest, the copy of it the entry
    /// code makes at the top of the task's stack (TSS.SP1: `pt_regs`, whose
    /// saved RIP is also 40 bytes below the top). Each is the address of
    /// the saved RIP; RFLAGS is two words above it.
    fn fault_frames(&self, regs: &kvm_regs, sregs: &kvm_sregs) -> Vec<u64> {
        if sregs.efer & EFER_LMA == 0 {
            return Vec::new();
        }
        if sregs.cs.selector & 3 == 0 {
            return vec![(regs.rsp & !0xf).wrapping_sub(40)];
        }
        let mut frames = Vec::new();
        let mut tss = [0u8; 20];
        if self.read_linear(sregs.tr.base, &mut tss) == tss.len() {
            let word =
                |at: usize| u64::from_le_bytes(tss[at..at + 8].try_into().unwrap_or_default());
            // RSP0 at byte 4, RSP1 at byte 12 of the 64-bit TSS.
            frames.push(word(4).wrapping_sub(40));
            frames.push(word(12).wrapping_sub(40));
        }
        frames
    }

    /// Clears the trap flag in any of `frames` that holds a frame of a
    /// fault at the instruction just stepped.
    fn mend_fault_frames(&self, frames: &[u64], stepped_rip: u64) {
        for &frame in frames {
            let mut words = [0u8; 24];
            if self.read_linear(frame, &mut words) < words.len() {
                continue;
            }
            let word = |i: usize| {
                u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap_or_default())
            };
            let flags = word(2);
            // RIP, CS (a code selector), RFLAGS with TF and bit 1 set.
            if flags & TF != 0 && flags & 2 != 0 && word(1) < 0x1_0000 && word(0) == stepped_rip {
                self.write_virtual(frame + 16, &(flags & !TF).to_le_bytes());
            }
        }
    }

    /// Takes the trap flag out of what the stepped instruction saved.
    fn mend_after_step(
        &mut self,
        saves: Saves,
        mode: CodeMode,
        before: &kvm_regs,
        frames: &[u64],
    ) -> Result<(), VmError> {
        match saves {
            Saves::Pushf => {
                let regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
                let rsp = match mode {
                    CodeMode::Long => regs.rsp,
                    CodeMode::Legacy => regs.rsp & 0xffff_ffff,
                };
                // TF is bit 0 of the pushed word's second byte.
                let mut byte = [0u8; 1];
                if self.read_linear(rsp.wrapping_add(1), &mut byte) == 1 && byte[0] & 1 != 0 {
                    self.write_virtual(rsp.wrapping_add(1), &[byte[0] & !1]);
                }
            }
            Saves::Syscall => {
                let mut regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
                if regs.r11 & TF != 0 {
                    regs.r11 &= !TF;
                    self.set_regs(&regs)?;
                }
            }
            Saves::Nothing | Saves::SoftwareInterrupt(_) | Saves::Loads(_) => {}
        }
        // A fault the instruction took ran its handler unstepped and
        // returned: its frame, now below the stack, held the trap flag.
        self.mend_fault_frames(frames, before.rip);
        Ok(())
    }

    /// Sets the trap flag in what the instruction about to be stepped
    /// loads RFLAGS from, so that the step after it traps too (KVM hides
    /// that flag from KVM_GET_REGS while it single-steps, and clears it
    /// when stepping ends). A value that has it already is left alone.
    fn plant_trap_flag(&mut self, from: FlagsFrom, regs: &kvm_regs) -> Result<Planted, VmError> {
        let byte_at = match from {
            FlagsFrom::Sysret => {
                if regs.r11 & TF != 0 {
                    return Ok(Planted::Nothing);
                }
                let mut with = *regs;
                with.r11 |= TF;
                self.set_regs(&with)?;
                return Ok(Planted::R11);
            }
            // RIP, CS, then RFLAGS.
            FlagsFrom::Iret { wide: true } => regs.rsp.wrapping_add(16),
            FlagsFrom::Iret { wide: false } => regs.rsp.wrapping_add(8),
            FlagsFrom::Popf => regs.rsp,
        };
        // TF is bit 0 of the saved word's second byte.
        let address = byte_at.wrapping_add(1);
        let mut byte = [0u8; 1];
        if self.read_linear(address, &mut byte) < 1 || byte[0] & 1 != 0 {
            return Ok(Planted::Nothing);
        }
        if self.write_virtual(address, &[byte[0] | 1]) < 1 {
            return Ok(Planted::Nothing);
        }
        Ok(Planted::Byte {
            address,
            original: byte[0],
        })
    }

    /// SYSCALL clears the RFLAGS bits in IA32_FMASK (Linux's has TF), and
    /// the trap is decided on the flags after it: the kernel's whole path
    /// to the next exit would run unstepped as one step. For that one step
    /// FMASK leaves TF alone (put back after), so the step ends at the
    /// entry's first instruction, as SYSCALL's own; R11 gets TF, which the
    /// `Syscall` mend takes out.
    fn keep_trap_flag_through_syscall(&mut self) -> Result<Planted, VmError> {
        let mut msrs = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
            index: MSR_SYSCALL_MASK,
            ..Default::default()
        }])
        .map_err(|_| VmError::MsrList)?;
        let read = self
            .vm
            .vcpu
            .get_msrs(&mut msrs)
            .map_err(kvm_err("KVM_GET_MSRS"))?;
        let mask = msrs.as_slice()[0].data;
        if read != 1 || mask & TF == 0 {
            return Ok(Planted::Nothing);
        }
        self.set_syscall_mask(mask & !TF)?;
        Ok(Planted::SyscallMask(mask))
    }

    fn set_syscall_mask(&mut self, mask: u64) -> Result<(), VmError> {
        let msrs = kvm_bindings::Msrs::from_entries(&[kvm_bindings::kvm_msr_entry {
            index: MSR_SYSCALL_MASK,
            data: mask,
            ..Default::default()
        }])
        .map_err(|_| VmError::MsrList)?;
        self.vm
            .vcpu
            .set_msrs(&msrs)
            .map_err(kvm_err("KVM_SET_MSRS"))?;
        Ok(())
    }

    /// Takes out what [`Session::plant_trap_flag`] put in: R11's flag, or
    /// the saved byte (popped by now, below the stack) as it was.
    fn unplant_trap_flag(&mut self, planted: Planted) -> Result<(), VmError> {
        match planted {
            Planted::Nothing => {}
            Planted::R11 => {
                let mut regs = self.vm.vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
                regs.r11 &= !TF;
                self.set_regs(&regs)?;
            }
            Planted::Byte { address, original } => {
                self.write_virtual(address, &[original]);
            }
            Planted::SyscallMask(mask) => self.set_syscall_mask(mask)?,
        }
        Ok(())
    }

    /// KVM_SET_REGS, and the synced copy the exit loop reads made to match.
    pub(super) fn set_regs(&mut self, regs: &kvm_regs) -> Result<(), VmError> {
        self.vm
            .vcpu
            .set_regs(regs)
            .map_err(kvm_err("KVM_SET_REGS"))?;
        self.vm.vcpu.sync_regs_mut().regs = *regs;
        Ok(())
    }

    /// The guest-physical address of linear address `linear`.
    pub(super) fn translate(&self, linear: u64) -> Option<u64> {
        match self.vm.vcpu.translate_gva(linear) {
            Ok(t) if t.valid != 0 => Some(t.physical_address),
            _ => None,
        }
    }

    /// Reads guest linear memory into `buf` up to the first byte that is
    /// not mapped; returns how many bytes were read.
    pub(super) fn read_linear(&self, linear: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let at = linear.wrapping_add(done as u64);
            let Some(gpa) = self.translate(at) else {
                return done;
            };
            // Up to the end of this 4 KiB page: one translation a page.
            let in_page = (PAGE - (at % PAGE)) as usize;
            let end = (done + in_page).min(buf.len());
            let chunk = &mut buf[done..end];
            if self.vm.memory.read_slice(chunk, GuestAddress(gpa)).is_err() {
                return done;
            }
            done += chunk.len();
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_that_save_rflags_are_recognised_past_their_prefixes() {
        use CodeMode::{Legacy, Long};
        for (bytes, mode, saves) in [
            (&[0x9c][..], Long, Saves::Pushf),
            (&[0x66, 0x9c][..], Long, Saves::Pushf),
            (&[0x48, 0x9c][..], Long, Saves::Pushf),
            (&[0x0f, 0x05][..], Long, Saves::Syscall),
            (&[0xcd, 0x80][..], Legacy, Saves::SoftwareInterrupt(0xcd)),
            (&[0xcc][..], Long, Saves::SoftwareInterrupt(0xcc)),
            (&[0xf1][..], Long, Saves::SoftwareInterrupt(0xf1)),
            // REX is INC/DEC in legacy mode: 0x48 is an instruction there.
            (&[0x48, 0x9c][..], Legacy, Saves::Nothing),
            (&[0x49, 0xff, 0xc7][..], Long, Saves::Nothing),
            (&[0x0f, 0x01, 0xd9][..], Long, Saves::Nothing),
            (&[0xf3, 0xaa][..], Long, Saves::Nothing),
            (
                &[0x48, 0x0f, 0x07][..],
                Long,
                Saves::Loads(FlagsFrom::Sysret),
            ),
            (
                &[0x48, 0xcf][..],
                Long,
                Saves::Loads(FlagsFrom::Iret { wide: true }),
            ),
            (
                &[0xcf][..],
                Long,
                Saves::Loads(FlagsFrom::Iret { wide: false }),
            ),
            (&[0x9d][..], Long, Saves::Loads(FlagsFrom::Popf)),
            (&[0x66, 0x9d][..], Long, Saves::Nothing),
            (&[0x9d][..], Legacy, Saves::Nothing),
            (&[][..], Long, Saves::Nothing),
        ] {
            assert_eq!(classify(bytes, mode), saves, "{bytes:02x?} {mode:?}");
        }
    }
}
