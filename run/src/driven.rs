//! A run between two exits: the session plus whatever drives it (nothing
//! for a plain run, the agent conversation for `up`), its saved state and its
//! in-memory checkpoints. Everything that continues a history (snapshots,
//! `branch`, `seek`, in-place resets, the fork shell, the request API) steps
//! a [`Driven`], so a resumed run takes exactly the steps the original took.

use crate::conversation::{self, DriveError, OutputError, UpDriver, UpState};
use crate::faults::{Fault, FaultError};
use devices::{Persist, RestoreError};
use serde::{Deserialize, Serialize};
use vmm::exit::StopReason;
use vmm::vm::{
    Checkpoint, GuestCrngRekey, InsnSteps, RunOutcome, Session, SessionState, Until, VmError,
};

/// Why a run could not step, be captured, kept or reset, or summed up.
#[derive(Debug, thiserror::Error)]
pub enum DrivenError {
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The `up` run's step (its conversation, faults, output).
    #[error(transparent)]
    Up(#[from] DriveError),
    #[error("capturing the VM state")]
    Capture(#[source] VmError),
    /// Returning the `up` run's host side to a checkpoint.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error(transparent)]
    Breakpoint(#[from] vmm::vm::BreakpointError),
    #[error("fault \"{fault}\": this is a plain `run` (no nodes, no agent): faults need a snapshot of an `up` run")]
    FaultOnPlainRun { fault: Box<Fault> },
}

type Result<T, E = DrivenError> = std::result::Result<T, E>;

impl DrivenError {
    /// The breakpoint a run stopped at, when this "error" is that stop.
    fn breakpoint_hit(&self) -> Option<u64> {
        match self {
            DrivenError::Vm(VmError::BreakpointHit { address, .. })
            | DrivenError::Up(DriveError::Vm(VmError::BreakpointHit { address, .. })) => {
                Some(*address)
            }
            _ => None,
        }
    }
}

/// A range of guest virtual memory a debugger watches for writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watch {
    pub address: u64,
    pub len: u64,
}

/// The most bytes one watch compares.
pub const MAX_WATCH_BYTES: u64 = 4096;

/// The address of the first watch whose bytes differ.
fn first_change(watches: &[Watch], before: &[Vec<u8>], now: &[Vec<u8>]) -> Option<u64> {
    watches
        .iter()
        .zip(before.iter().zip(now))
        .find(|(_, (b, n))| b != n)
        .map(|(w, _)| w.address)
}

/// How [`Driven::run_to_breakpoint`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakpointRun {
    /// The guest stands at the breakpoint at `address`.
    Hit { address: u64 },
    /// The watched range at `address` changed before the exit just made.
    Changed { address: u64 },
    /// The limit was reached (`None`) or the guest stopped first.
    Ended { stop: Option<StopReason> },
}

/// What a snapshot's `state.bin` holds: the machine's state and, for an `up`
/// run, the host side of its agent conversation (`None` for `run`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedState {
    pub session: SessionState,
    pub up: Option<UpState>,
}

impl SavedState {
    /// The state of a plain `run` (no host-side driver).
    pub fn of_run(session: SessionState) -> Self {
        SavedState { session, up: None }
    }
}

/// A session with whatever runs it between exits: nothing for `run`, the
/// agent conversation for `up`. Everything that continues a saved history
/// (`branch`, `seek`, snapshots) steps it this way, so a resumed run takes
/// exactly the steps the original took.
pub struct Driven {
    pub session: Session,
    pub up: Option<UpDriver>,
}

/// A [`Driven`] moment in host memory, to return to in place.
pub struct DrivenCheckpoint {
    session: Checkpoint,
    up: Option<UpState>,
}

impl Driven {
    pub fn plain(session: Session) -> Self {
        Driven { session, up: None }
    }

    /// One exit (`Some` when the guest stopped there).
    pub fn step(&mut self) -> Result<Option<StopReason>> {
        match &mut self.up {
            Some(up) => Ok(up.step(&mut self.session)?),
            None => Ok(self.session.step_one()?),
        }
    }

    /// As [`Session::run_until`], each exit a [`Driven::step`]: until the
    /// guest stops or `until` is reached (`None` when the limit was).
    pub fn run_until(&mut self, until: Until) -> Result<Option<StopReason>> {
        match &mut self.up {
            Some(up) => Ok(self
                .session
                .run_until_with(until, |session| up.step(session))?),
            None => Ok(self.session.run_until(until)?),
        }
    }

    /// Single-steps the guest `count` instructions as an observer (see
    /// [`Session::step_insns`]). A guest exit met on the way is taken as
    /// [`Driven::step`] takes it (an `up` run's conversation after it);
    /// with `within_interval` the stepping ends there.
    pub fn step_insns(&mut self, count: u64, within_interval: bool) -> Result<InsnSteps> {
        let Some(up) = &mut self.up else {
            return Ok(self.session.step_insns(count, within_interval)?);
        };
        let mut done = InsnSteps {
            stepped: 0,
            exits: 0,
            stop: None,
        };
        while done.stepped < count {
            let pending = up.before_exit(&mut self.session);
            let interval = self.session.step_insns(count - done.stepped, true)?;
            done.stepped += interval.stepped;
            if interval.exits == 0 {
                break;
            }
            done.exits += 1;
            if let Some(stop) = interval.stop {
                done.stop = Some(stop);
                break;
            }
            up.after_exit(&mut self.session, pending)?;
            if within_interval {
                break;
            }
            // The exit counts as its instruction's step.
            done.stepped += 1;
        }
        Ok(done)
    }

    /// Steps within the interval until RIP is `address` (see
    /// [`Session::step_to_address`]); an exit that ends the interval first
    /// is taken as [`Driven::step`] takes it.
    pub fn step_to_address(&mut self, address: u64, max: u64) -> Result<(InsnSteps, bool)> {
        let pending = self.up.as_mut().map(|up| up.before_exit(&mut self.session));
        let (done, reached) = self.session.step_to_address(address, max)?;
        if let (Some(up), Some(pending)) = (&mut self.up, pending) {
            if done.exits > 0 && done.stop.is_none() {
                up.after_exit(&mut self.session, pending)?;
            }
        }
        Ok((done, reached))
    }

    /// Runs as [`Driven::run_until`] does, stopping at the first of the
    /// software breakpoints at `breakpoints` (kernel addresses, see
    /// `vmm::vm::breakpoints`) the guest reaches. After a hit the run's
    /// step count within its interval is unknown until it is reset.
    ///
    /// With `watches`, the run goes exit by exit and stops at the first
    /// exit after which a watched range's bytes differ from what they were
    /// when it started (a change undone within one interval is not seen).
    pub fn run_to_breakpoint(
        &mut self,
        breakpoints: &[u64],
        watches: &[Watch],
        until: Until,
    ) -> Result<BreakpointRun> {
        self.session.set_breakpoints(breakpoints)?;
        let ran = if watches.is_empty() {
            self.run_until(until)
                .map(|stop| BreakpointRun::Ended { stop })
        } else {
            self.run_watching(watches, until)
        };
        self.session.set_breakpoints(&[])?;
        match ran {
            Ok(ran) => Ok(ran),
            Err(error) => match error.breakpoint_hit() {
                Some(address) => Ok(BreakpointRun::Hit { address }),
                None => Err(error),
            },
        }
    }

    fn run_watching(&mut self, watches: &[Watch], until: Until) -> Result<BreakpointRun> {
        let before = self.watched(watches);
        let start = self.session.exits();
        loop {
            if until.reached(start, self.session.exits(), self.session.now()) {
                return Ok(BreakpointRun::Ended { stop: None });
            }
            if let Some(stop) = self.step()? {
                return Ok(BreakpointRun::Ended { stop: Some(stop) });
            }
            if let Some(address) = first_change(watches, &before, &self.watched(watches)) {
                return Ok(BreakpointRun::Changed { address });
            }
        }
    }

    /// Single-steps within the interval until a watched range's bytes
    /// differ from what they were at the start (at most `max` steps): the
    /// steps taken and the range's address, if one changed. An exit that
    /// ends the interval first is taken as [`Driven::step`] takes it (and
    /// a change its handling made is seen after it).
    pub fn step_to_change(
        &mut self,
        watches: &[Watch],
        max: u64,
    ) -> Result<(InsnSteps, Option<u64>)> {
        let before = self.watched(watches);
        let mut done = InsnSteps {
            stepped: 0,
            exits: 0,
            stop: None,
        };
        while done.stepped < max {
            let step = self.step_insns(1, true)?;
            done.stepped += step.stepped;
            done.exits += step.exits;
            done.stop = step.stop;
            if let Some(address) = first_change(watches, &before, &self.watched(watches)) {
                return Ok((done, Some(address)));
            }
            if step.exits > 0 || step.stepped == 0 {
                break;
            }
        }
        Ok((done, None))
    }

    /// The bytes of each watched range (up to its first byte not mapped).
    fn watched(&self, watches: &[Watch]) -> Vec<Vec<u8>> {
        watches
            .iter()
            .map(|w| {
                let mut bytes = vec![0; w.len.min(MAX_WATCH_BYTES) as usize];
                let read = self.session.read_virtual(w.address, &mut bytes);
                bytes.truncate(read);
                bytes
            })
            .collect()
    }

    pub fn run_to_end(&mut self) -> Result<StopReason> {
        loop {
            if let Some(stop) = self.step()? {
                return Ok(stop);
            }
        }
    }

    /// Re-keys every seeded stream from `seed` at this exit: an alternate
    /// history from this moment (the one function a branch calls). The
    /// machine's streams and the guest kernel's CRNG are re-keyed in the VMM
    /// ([`Session::rekey`]), before the guest runs again, so randomness any
    /// guest process draws from now on differs at once. A kernel whose CRNG
    /// the VMM cannot find (no symbols) is reseeded by an `up` run's agent
    /// instead, when it reads the message: late, and said so in
    /// docs/determinism.md. What stays inherited: see the same page.
    pub fn rekey(&mut self, seed: u64) -> Result<()> {
        let exit = self.session.exits();
        let crng = self.session.rekey(seed)?;
        if let Some(up) = &mut self.up {
            up.rekey_sdk_random(seed, exit);
            up.rekey_composer(seed, exit);
            if crng == GuestCrngRekey::NoSymbols {
                up.reseed_guest(
                    &mut self.session,
                    vmm::entropy::guest_pool_bytes(seed, exit),
                )?;
            }
        }
        Ok(())
    }

    /// Adds faults at this moment (a branch point): `at=+2s` counts from
    /// now, an absolute time must not be before now. They go into the
    /// run's state (the switch's schedule, the conductor's), so the
    /// snapshots that follow hold them once.
    pub fn add_faults(&mut self, faults: &[Fault]) -> Result<()> {
        let now = self.session.now();
        for fault in faults {
            let Some(up) = &mut self.up else {
                return Err(DrivenError::FaultOnPlainRun {
                    fault: Box::new(fault.clone()),
                });
            };
            for fault in fault.scheduled(Some(now))? {
                up.inject(&mut self.session, fault)?;
            }
        }
        Ok(())
    }

    /// The state to save between two exits.
    pub fn capture(&mut self) -> Result<SavedState> {
        Ok(SavedState {
            session: self.session.capture().map_err(DrivenError::Capture)?,
            up: self.up.as_ref().map(UpDriver::save),
        })
    }

    /// Keeps this moment in memory, with the `up` driver's host side (see
    /// [`Session::checkpoint`]): a child of the checkpoint last taken or
    /// reset to.
    pub fn checkpoint(&mut self) -> Result<DrivenCheckpoint> {
        Ok(DrivenCheckpoint {
            session: self.session.checkpoint()?,
            up: self.up.as_ref().map(UpDriver::save),
        })
    }

    /// Back to `checkpoint`, in place, from anywhere in the run's tree of
    /// checkpoints (see [`Session::reset_to`]).
    pub fn reset_to(&mut self, checkpoint: &DrivenCheckpoint) -> Result<()> {
        self.session.reset_to(&checkpoint.session)?;
        if let (Some(up), Some(state)) = (&mut self.up, &checkpoint.up) {
            up.restore(state)?;
            // Reported on the path just left: not part of the moment's past.
            drop(up.take_records());
        }
        Ok(())
    }

    /// Lets `checkpoint` go, freeing the pages only it needed.
    pub fn release(&mut self, checkpoint: DrivenCheckpoint) -> Result<()> {
        Ok(self.session.release_checkpoint(checkpoint.session)?)
    }

    /// The run's exit status once it stopped with `stop`: the guest's, or
    /// under `up` the workload's (`None`: the guest reported none).
    pub fn exit_status(&self, stop: StopReason) -> Option<u8> {
        match &self.up {
            Some(up) => Some(conversation::run_status(up.conductor(), stop)),
            None => match stop {
                StopReason::GuestExit { status } => Some(status),
                _ => None,
            },
        }
    }

    /// The outcome so far (the session stays usable, e.g. for a reset).
    pub fn outcome(&mut self, stop: StopReason) -> Result<RunOutcome> {
        if let Some(up) = &mut self.up {
            up.flush()?;
        }
        Ok(self.session.outcome(stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let e = DrivenError::Capture(VmError::Inject(std::io::Error::from_raw_os_error(
            libc::EISDIR,
        )));
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "capturing the VM state: injecting an interrupt failed: Is a directory (os error 21)"
        );
    }
}
