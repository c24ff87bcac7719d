//! A debugging session: one source, one held run, the checkpoints it kept,
//! and the budget. Reaching a moment resets the run to the nearest kept
//! checkpoint on the same history at or before it (the run library's
//! checkpoint tree: only the pages that differ are copied) and replays
//! forward from there, or boots and replays from the start when none is
//! kept; the moment reached is kept in turn, so later calls near it are
//! cheap. What is kept is bounded (by count here and by bytes in the run
//! library's checkpoint budget); the least recently used goes first.

use crate::budget::{Budget, BudgetError, Cancelled, Limits, LogError, SharedBudget, Spent};
use crate::moment::{Action, MomentId};
use crate::source::{FindingSource, Source, SourceError};
use run::api::{CheckpointId, Position, RunId, Until};
use run::client::{Calls, Runner, RunnerError};
use run::moment::{Moment, When};
use run::records::GuestRecord;
use serde::Serialize;
use std::sync::Arc;
use vmm::stall::StallTimeout;
use vmm::VirtNanos;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Cancelled(#[from] Cancelled),
    #[error("{moment}: {what} names a moment of a finding's history; {source_dir} is a directory of snapshots")]
    NotAFinding {
        moment: String,
        what: &'static str,
        source_dir: String,
    },
    #[error("{moment}: a snapshot id names a moment of a directory of snapshots, not of a finding's history (use a time, failure, -DURATION or exit:N)")]
    IdInFinding { moment: String },
    #[error("{moment}: `latest` of a branch is not a moment (give its time)")]
    LatestOfBranch { moment: String },
    /// `exit:N+insn:K` with K past the interval's last position.
    #[error(
        "{moment}: the guest's next exit comes {steps} single step(s) after exit {exit}: the \
         positions between them are exit:{exit}+insn:0 to exit:{exit}+insn:{steps}"
    )]
    PastInterval {
        moment: String,
        exit: u64,
        steps: u64,
    },
    #[error("{moment}: {before} before the failure (at {failure}) is before the boot")]
    BeforeBoot {
        moment: String,
        before: VirtNanos,
        failure: VirtNanos,
    },
    #[error("{moment}: the guest stopped ({stop}) at {at}, before the moment")]
    StoppedBefore {
        moment: String,
        stop: String,
        at: VirtNanos,
    },
    #[error(
        "{moment}: a command started at {at} ran until {ended}: the moments between are inside it"
    )]
    InsideExec {
        moment: String,
        at: VirtNanos,
        ended: VirtNanos,
    },
    #[error("{moment}: the source is {actual}, not this session's {expected}")]
    OtherSource {
        moment: String,
        expected: String,
        actual: String,
    },
}

pub type Result<T, E = SessionError> = std::result::Result<T, E>;

/// Where a session's runs happen and what it may spend.
pub struct SessionOptions {
    pub limits: Limits,
    /// Where each call's use is appended (JSON lines), if anywhere.
    pub log: Option<std::path::PathBuf>,
    /// Checkpoints kept at once (the least recently used is let go).
    pub max_kept: usize,
    /// A budget the session is within, shared with other sessions (a
    /// server's).
    pub shared: Vec<SharedBudget>,
    /// Calls stop once this is set (see [`Budget::cancelled_by`]).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// What a session tells while it replays toward a moment: the virtual
/// time reached and the time it is going to.
pub type ProgressHook = Box<dyn Fn(VirtNanos, VirtNanos)>;

/// Checkpoints a session keeps by default.
pub const DEFAULT_KEPT: usize = 8;

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            limits: Limits::default(),
            log: None,
            max_kept: DEFAULT_KEPT,
            shared: Vec::new(),
            cancel: None,
        }
    }
}

/// A moment kept in the run's checkpoint tree.
struct Kept {
    checkpoint: CheckpointId,
    /// The actions taken before it (a prefix of its history).
    history: Vec<Action>,
    position: Position,
    /// The earliest virtual time whose moment (the first exit at or after
    /// it) is known to be this one: a moment at any time from here to the
    /// position's is this checkpoint, not one to replay to.
    since: VirtNanos,
    records: Arc<Vec<GuestRecord>>,
    digest: String,
    last_used: u64,
}

/// The run the session holds.
struct Held {
    run: RunId,
    /// The actions taken so far.
    history: Vec<Action>,
    position: Position,
    /// Everything the guest reported since the run started.
    records: Vec<GuestRecord>,
}

/// Where a call stands: the moment's id, its digest and position.
#[derive(Clone, Debug, Serialize)]
pub struct At {
    pub moment: MomentId,
    pub digest: String,
    pub exits: u64,
    /// Single steps after that exit (`exit:N+insn:K`; not written when 0).
    #[serde(skip_serializing_if = "vmm::vm::is_zero")]
    pub insn_steps: u64,
    pub virtual_ns: VirtNanos,
}

/// A checkpoint kept, as listed.
#[derive(Clone, Debug, Serialize)]
pub struct KeptRow {
    pub history: Vec<Action>,
    pub exits: u64,
    pub virtual_ns: VirtNanos,
    pub digest: String,
}

/// How far a moment is, once resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Time(VirtNanos),
    Exit(u64),
}

impl Target {
    fn reached(self, position: &Position) -> bool {
        match self {
            Target::Time(t) => position.virtual_ns >= t,
            Target::Exit(n) => position.exits >= n,
        }
    }

    fn passed_by(self, position: &Position) -> bool {
        match self {
            Target::Time(t) => position.virtual_ns > t,
            Target::Exit(n) => position.exits > n,
        }
    }
}

/// How much virtual time one slice of a replay runs: the wall budget is
/// checked between slices.
const SLICE: VirtNanos = VirtNanos(2_000_000_000);

/// A debugging session on one source.
pub struct Session {
    runner: Box<dyn Runner>,
    source: Source,
    pub budget: Budget,
    held: Option<Held>,
    kept: Vec<Kept>,
    uses: u64,
    max_kept: usize,
    /// The branches made from each moment (by its id): for the siblings
    /// budget.
    branches: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    /// A finding's boot, kept for the whole session.
    boot: Option<(CheckpointId, Position)>,
    /// The finding's run as the runner sees it (its files where a helper
    /// VM holds them), when the runner was started for it.
    run_as_seen: Option<run::up::PreparedUp>,
    /// Told each slice of a replay.
    progress: Option<ProgressHook>,
}

impl Session {
    /// A session on `source`, its runs on `runner`.
    pub fn new(source: Source, runner: Box<dyn Runner>, options: SessionOptions) -> Session {
        Session {
            runner,
            source,
            budget: Budget::new(options.limits, options.log.as_deref())
                .within(options.shared)
                .cancelled_by(options.cancel),
            held: None,
            kept: Vec::new(),
            uses: 0,
            max_kept: options.max_kept.max(1),
            branches: Default::default(),
            boot: None,
            run_as_seen: None,
            progress: None,
        }
    }

    /// Tells `hook` the virtual time reached and the target after each
    /// slice of a replay (`None`: tells no one).
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// For a runner started for the finding's run (e.g. by
    /// `fuzzer::campaign::start_runners`): the run as it sees it.
    pub fn with_run_as_seen(mut self, prepared: run::up::PreparedUp) -> Session {
        self.run_as_seen = Some(prepared);
        self
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    pub(crate) fn calls(&mut self) -> Calls<'_> {
        Calls::new(&mut self.runner)
    }

    /// The held run (after [`Session::reach`]).
    pub(crate) fn run(&self) -> Option<RunId> {
        self.held.as_ref().map(|h| h.run)
    }

    /// Records the guest reported from the start of the held run to its
    /// present.
    pub(crate) fn records(&self) -> &[GuestRecord] {
        self.held.as_ref().map_or(&[], |h| h.records.as_slice())
    }

    /// Where the held run stands (after [`Session::reach`]).
    pub(crate) fn present(&self) -> Option<Position> {
        self.held.as_ref().map(|h| h.position)
    }

    /// Checks that `moment` is of this session's source.
    fn check_source(&self, moment: &MomentId) -> Result<()> {
        let given = moment
            .source
            .canonicalize()
            .unwrap_or_else(|_| moment.source.clone());
        let expected = self.source.dir();
        // A campaign directory stands for its one finding.
        if given == expected || expected.starts_with(&given) {
            return Ok(());
        }
        Err(SessionError::OtherSource {
            moment: moment.to_string(),
            expected: expected.display().to_string(),
            actual: given.display().to_string(),
        })
    }

    /// The actions of `moment`'s whole history: the source's own (a
    /// finding's path) up to the instant of the first of the moment's,
    /// then its own.
    fn history(&self, moment: &MomentId) -> Vec<Action> {
        let mut history = Vec::new();
        if let Source::Finding(finding) = &self.source {
            let cut = moment.actions.first().map(Action::at);
            for step in &finding.finding.file.path.steps {
                // A moment at an instant comes after the source's own
                // actions at it: a branch from there continues them.
                if cut.is_some_and(|cut| step.at_ns > cut) {
                    break;
                }
                history.push(Action::Seed {
                    at: step.at_ns,
                    seed: step.seed,
                });
                history.extend(step.faults.iter().map(|fault| Action::Fault {
                    at: step.at_ns,
                    fault: fault.clone(),
                }));
            }
        }
        history.extend(moment.actions.iter().cloned());
        history
    }

    /// Where `moment` is on its history.
    fn target(&self, moment: &MomentId) -> Result<Target> {
        let finding = self.source.finding();
        let not_finding = |what| SessionError::NotAFinding {
            moment: moment.to_string(),
            what,
            source_dir: self.source.dir().display().to_string(),
        };
        Ok(match &moment.when {
            When::Time(t) => Target::Time(*t),
            // `+insn:K` is stepped to from exit N (see `reach`).
            When::Exit(position) => Target::Exit(position.exit),
            When::Failure => Target::Time(
                finding
                    .ok_or_else(|| not_finding("failure"))?
                    .failure
                    .virtual_ns,
            ),
            When::BeforeFailure(before) => {
                let failure = finding
                    .ok_or_else(|| not_finding("a time before the failure"))?
                    .failure
                    .virtual_ns;
                if before.0 > failure.0 {
                    return Err(SessionError::BeforeBoot {
                        moment: moment.to_string(),
                        before: *before,
                        failure,
                    });
                }
                Target::Time(VirtNanos(failure.0 - before.0))
            }
            When::Latest if !moment.actions.is_empty() => {
                return Err(SessionError::LatestOfBranch {
                    moment: moment.to_string(),
                })
            }
            When::Latest => match finding {
                Some(finding) => Target::Time(finding.finding.file.path.end_ns),
                // A snapshot directory's latest is restored as saved.
                None => Target::Exit(0),
            },
            When::Id(_) if finding.is_some() => {
                return Err(SessionError::IdInFinding {
                    moment: moment.to_string(),
                })
            }
            // A snapshot restored as saved.
            When::Id(_) => Target::Exit(0),
        })
    }

    /// The virtual time of `moment` when it is on a finding's own history
    /// and named by a time (then its records are the finding's file's, up
    /// to it): no run is needed.
    pub(crate) fn own_history_time(&self, moment: &MomentId) -> Result<Option<VirtNanos>> {
        self.check_source(moment)?;
        if !moment.actions.is_empty() || self.source.finding().is_none() {
            return Ok(None);
        }
        Ok(match self.target(moment)? {
            Target::Time(t) => Some(t),
            Target::Exit(_) => None,
        })
    }

    /// The kept checkpoint to start from for `history` up to `target`.
    fn nearest_kept(&self, history: &[Action], target: Target, steps: u64) -> Option<usize> {
        self.kept
            .iter()
            .enumerate()
            .filter(|(_, kept)| {
                let n = kept.history.len();
                // A moment between two exits serves only a target in the
                // same interval at or after it.
                let p = &kept.position;
                (p.insn_steps == 0
                    || matches!(target, Target::Exit(e) if e == p.exits && p.insn_steps <= steps))
                    && n <= history.len()
                    && kept.history[..] == history[..n]
                    // No action of the history was due before it and not taken.
                    && history.get(n).is_none_or(|next| next.at() >= kept.position.virtual_ns)
                    && (!target.passed_by(&kept.position)
                        || matches!(target, Target::Time(t) if kept.since <= t))
            })
            .max_by_key(|(_, kept)| (kept.position.exits, kept.last_used))
            .map(|(index, _)| index)
    }

    /// Boots (a finding's run) or restores (a snapshot directory's moment)
    /// a fresh run at the start of `moment`'s history.
    fn start(&mut self, moment: &MomentId) -> Result<()> {
        // A finding's run is booted once a session: its boot is kept and
        // returned to (the helper VM that holds the run's files stays).
        if let (Some(held), Some((checkpoint, _))) = (&self.held, self.boot) {
            let run = held.run;
            let position = self.calls().reset(run, checkpoint)?;
            self.held = Some(Held {
                run,
                history: Vec::new(),
                position,
                records: Vec::new(),
            });
            return Ok(());
        }
        if let Some(held) = self.held.take() {
            self.calls().close(held.run)?;
            self.kept.clear();
        }
        let (run, position) = match &self.source {
            Source::Finding(finding) => {
                let options = fuzzer::session::boot_options(&finding.finding.file.spec, None);
                let prepared = self
                    .run_as_seen
                    .clone()
                    .unwrap_or_else(|| finding.finding.run.clone());
                let (run, _) = Calls::new(&mut self.runner).boot_up(prepared, options)?;
                let position = Calls::new(&mut self.runner).collect_records(run)?;
                let (checkpoint, _) = Calls::new(&mut self.runner).checkpoint(run)?;
                self.boot = Some((checkpoint, position));
                Calls::new(&mut self.runner)
                    .checkpoint_budget(run, Some(self.budget.limits.memory_bytes))?;
                (run, position)
            }
            Source::Snapshots(dir) => {
                // Restored (replayed forward from the last snapshot at or
                // before it) by the run library.
                let when = match moment.actions.first() {
                    Some(first) => When::Time(first.at()),
                    None => moment.when.clone(),
                };
                let saved = Moment::At {
                    dir: dir.clone(),
                    when,
                };
                let (run, _) = Calls::new(&mut self.runner).restore(
                    saved,
                    None,
                    StallTimeout::default(),
                    false,
                )?;
                let position = Calls::new(&mut self.runner).collect_records(run)?;
                (run, position)
            }
        };
        self.held = Some(Held {
            run,
            history: Vec::new(),
            position,
            records: Vec::new(),
        });
        Ok(())
    }

    /// Runs the held run toward `until` (at most `limit`), in slices,
    /// counting virtual time and checking the wall budget between them.
    fn advance(&mut self, limit: Target) -> Result<Position> {
        loop {
            let held = self.held.as_ref().expect("a held run");
            let (run, from) = (held.run, held.position);
            if limit.reached(&from) || from.stop.is_some() {
                return Ok(from);
            }
            self.budget.check_wall()?;
            self.budget.check_cancelled()?;
            let until = match limit {
                Target::Time(t) => Until::Time(VirtNanos(t.0.min(from.virtual_ns.0 + SLICE.0))),
                Target::Exit(n) => Until::ExitOrTime {
                    exit: n,
                    time: VirtNanos(from.virtual_ns.0 + SLICE.0),
                },
            };
            let position = self.calls().run_until(run, until)?;
            let records = self.calls().take_records(run)?;
            self.budget.simulated(VirtNanos(
                position.virtual_ns.0.saturating_sub(from.virtual_ns.0),
            ));
            let held = self.held.as_mut().expect("a held run");
            held.records.extend(records);
            held.position = position;
            if let (Some(hook), Target::Time(target)) = (&self.progress, limit) {
                hook(position.virtual_ns, target);
            }
        }
    }

    /// Takes `action` at the held run's present.
    fn take(&mut self, action: &Action) -> Result<()> {
        let run = self.run().expect("a held run");
        let before = self.held.as_ref().expect("a held run").position;
        let position = match action {
            Action::Seed { seed, .. } => self.calls().rekey(run, *seed)?,
            Action::Fault { fault, .. } => self.calls().inject(run, fault.clone())?,
            Action::Exec { node, command, .. } => {
                crate::inspect::exec_live(self, node.clone(), command.clone())?.position
            }
        };
        let records = self.calls().take_records(run)?;
        self.budget.simulated(VirtNanos(
            position.virtual_ns.0.saturating_sub(before.virtual_ns.0),
        ));
        let held = self.held.as_mut().expect("a held run");
        held.records.extend(records);
        held.position = position;
        held.history.push(action.clone());
        Ok(())
    }

    /// Stands the held run at `moment` (exactly: the same machine whichever
    /// way it is reached) and keeps a checkpoint there; where it stands.
    pub fn reach(&mut self, moment: &MomentId) -> Result<At> {
        self.check_source(moment)?;
        let history = self.history(moment);
        let target = self.target(moment)?;
        let steps = match &moment.when {
            When::Exit(position) => position.steps,
            _ => 0,
        };
        let start = self.nearest_kept(&history, target, steps);
        // The virtual time to simulate, known before anything runs when the
        // target is a time.
        if let Target::Time(t) = target {
            let from = start.map_or(VirtNanos::ZERO, |index| {
                self.kept[index].position.virtual_ns
            });
            self.budget
                .check_virtual(VirtNanos(t.0.saturating_sub(from.0)))?;
        }
        self.uses += 1;
        match start {
            Some(index) => {
                let kept = &mut self.kept[index];
                kept.last_used = self.uses;
                let (checkpoint, kept_history, records) =
                    (kept.checkpoint, kept.history.clone(), kept.records.clone());
                let run = self.run().expect("kept checkpoints belong to the held run");
                let position = self.calls().reset(run, checkpoint)?;
                let held = self.held.as_mut().expect("a held run");
                held.position = position;
                held.history = kept_history;
                held.records = records.as_ref().clone();
            }
            None => self.start(moment)?,
        }
        let mut applied = self.held.as_ref().expect("a held run").history.len();
        while let Some(action) = history.get(applied) {
            let at = action.at();
            // A moment at a time comes after the actions taken at it (a
            // branch's first moment is after its re-key and faults).
            if let Target::Time(t) = target {
                if at > t {
                    break;
                }
            }
            let position = self.advance(Target::Time(at))?;
            if target.reached(&position) && !matches!(target, Target::Time(_)) {
                break;
            }
            self.stopped_before(moment, &position, Target::Time(at))?;
            self.take(action)?;
            let position = self.held.as_ref().expect("a held run").position;
            if target.passed_by(&position) {
                return Err(SessionError::InsideExec {
                    moment: moment.to_string(),
                    at,
                    ended: position.virtual_ns,
                });
            }
            applied += 1;
        }
        let mut position = self.advance(target)?;
        self.stopped_before(moment, &position, target)?;
        if steps > 0 {
            position = self.step_into_interval(moment, steps)?;
        }
        let since = match target {
            Target::Time(t) => t.min(position.virtual_ns),
            Target::Exit(_) => position.virtual_ns,
        };
        self.keep(moment, since)
    }

    /// From exit N (or a kept moment after it in the interval), single
    /// steps to `exit:N+insn:steps` as an observer (docs/debugging.md,
    /// "Instruction positions"); refused past the interval's end.
    fn step_into_interval(&mut self, moment: &MomentId, steps: u64) -> Result<Position> {
        let held = self.held.as_ref().expect("a held run");
        let (run, from) = (held.run, held.position);
        let (position, stepped, exits) =
            self.calls()
                .step_insns(run, steps.saturating_sub(from.insn_steps), true)?;
        self.held.as_mut().expect("a held run").position = position;
        if exits > 0 {
            return Err(SessionError::PastInterval {
                moment: moment.to_string(),
                exit: from.exits,
                steps: from.insn_steps + stepped,
            });
        }
        Ok(position)
    }

    fn stopped_before(&self, moment: &MomentId, position: &Position, target: Target) -> Result<()> {
        match position.stop {
            Some(stop) if !target.reached(position) => Err(SessionError::StoppedBefore {
                moment: moment.to_string(),
                stop: format!("{stop:?}"),
                at: position.virtual_ns,
            }),
            _ => Ok(()),
        }
    }

    /// Keeps the held run's present (unless kept already); where it stands.
    fn keep(&mut self, moment: &MomentId, since: VirtNanos) -> Result<At> {
        let held = self.held.as_ref().expect("a held run");
        let (run, position) = (held.run, held.position);
        let existing = self
            .kept
            .iter()
            .position(|k| k.position == position && k.history == held.history);
        let digest = match existing {
            Some(index) => {
                let kept = &mut self.kept[index];
                kept.last_used = self.uses;
                kept.since = kept.since.min(since);
                kept.digest.clone()
            }
            None => {
                while self.kept.len() >= self.max_kept {
                    let oldest = (0..self.kept.len())
                        .min_by_key(|&i| self.kept[i].last_used)
                        .expect("kept is not empty");
                    let gone = self.kept.remove(oldest);
                    self.calls().drop_checkpoint(run, gone.checkpoint)?;
                }
                let digest = self.calls().outcome(run)?.digest;
                // Past the memory budget the run library refuses a
                // checkpoint: the least recently used kept ones go first.
                let checkpoint = loop {
                    match self.calls().checkpoint(run) {
                        Ok((checkpoint, _)) => break checkpoint,
                        Err(error) if self.kept.is_empty() => return Err(error.into()),
                        Err(_) => {
                            let oldest = (0..self.kept.len())
                                .min_by_key(|&i| self.kept[i].last_used)
                                .expect("kept is not empty");
                            let gone = self.kept.remove(oldest);
                            self.calls().drop_checkpoint(run, gone.checkpoint)?;
                        }
                    }
                };
                let held = self.held.as_ref().expect("a held run");
                self.kept.push(Kept {
                    checkpoint,
                    history: held.history.clone(),
                    position,
                    since,
                    records: Arc::new(held.records.clone()),
                    digest: digest.clone(),
                    last_used: self.uses,
                });
                digest
            }
        };
        Ok(At {
            moment: moment.clone(),
            digest,
            exits: position.exits,
            insn_steps: position.insn_steps,
            virtual_ns: position.virtual_ns,
        })
    }

    /// Runs the held run on from its present until a record `wanted` picks
    /// arrives or `cap` is reached; that record, if one came.
    pub(crate) fn run_until_record(
        &mut self,
        cap: VirtNanos,
        wanted: &dyn Fn(&GuestRecord) -> bool,
    ) -> Result<Option<GuestRecord>> {
        let from = self.held.as_ref().expect("a held run").records.len();
        let now = self.held.as_ref().expect("a held run").position.virtual_ns;
        self.budget
            .check_virtual(VirtNanos(cap.0.saturating_sub(now.0)))?;
        loop {
            let held = self.held.as_ref().expect("a held run");
            if let Some(found) = held.records[from..].iter().find(|r| wanted(r)) {
                return Ok(Some(found.clone()));
            }
            let position = held.position;
            if position.virtual_ns >= cap || position.stop.is_some() {
                return Ok(None);
            }
            let slice = VirtNanos(cap.0.min(position.virtual_ns.0 + SLICE.0 / 4));
            self.advance(Target::Time(slice))?;
        }
    }

    /// Returns the held run to the checkpoint kept at its present (after an
    /// inspection ran in a fork of it).
    pub(crate) fn back_to(&mut self, at: &At) -> Result<()> {
        let held = self.held.as_ref().expect("a held run");
        let run = held.run;
        let kept = self
            .kept
            .iter()
            .find(|k| {
                k.position.exits == at.exits && k.digest == at.digest && k.history == held.history
            })
            .expect("the moment an inspection forked from is kept");
        let (checkpoint, records) = (kept.checkpoint, kept.records.clone());
        let position = self.calls().reset(run, checkpoint)?;
        let held = self.held.as_mut().expect("a held run");
        held.position = position;
        held.records = records.as_ref().clone();
        Ok(())
    }

    /// Records the held run's present, after an action that moved it.
    pub(crate) fn moved(&mut self, action: Action, position: Position) -> Result<()> {
        let run = self.run().expect("a held run");
        let records = self.calls().take_records(run)?;
        let held = self.held.as_mut().expect("a held run");
        held.records.extend(records);
        held.position = position;
        held.history.push(action);
        Ok(())
    }

    /// Keeps the held run's present as `moment`.
    pub(crate) fn keep_as(&mut self, moment: &MomentId) -> Result<At> {
        self.uses += 1;
        let position = self.held.as_ref().expect("a held run").position;
        self.keep(moment, position.virtual_ns)
    }

    /// The checkpoints kept, most recently used first.
    pub fn kept(&self) -> Vec<KeptRow> {
        let mut kept: Vec<&Kept> = self.kept.iter().collect();
        kept.sort_by_key(|k| std::cmp::Reverse(k.last_used));
        kept.into_iter()
            .map(|k| KeptRow {
                history: k.history.clone(),
                exits: k.position.exits,
                virtual_ns: k.position.virtual_ns,
                digest: k.digest.clone(),
            })
            .collect()
    }

    /// Lets every kept checkpoint go (the held run stays where it is).
    pub fn free(&mut self) -> Result<usize> {
        let count = self.kept.len();
        if let Some(run) = self.run() {
            for kept in std::mem::take(&mut self.kept) {
                self.calls().drop_checkpoint(run, kept.checkpoint)?;
            }
        }
        Ok(count)
    }

    /// The moment a branch's history branched from: its last instant's
    /// actions removed.
    fn parent_of(moment: &MomentId) -> String {
        let last = moment.actions.last().map(Action::at);
        let mut parent = moment.clone();
        parent.actions.retain(|a| Some(a.at()) != last);
        if let Some(at) = last {
            parent.when = When::Time(at);
        }
        parent.to_string()
    }

    /// Branches made so far from the moment `moment` branched from.
    pub(crate) fn siblings_of(&self, moment: &MomentId) -> u64 {
        self.branches
            .get(&Self::parent_of(moment))
            .map_or(0, |set| set.len() as u64)
    }

    /// Counts `moment`'s history as a branch of its parent.
    pub(crate) fn note_branch(&mut self, moment: &MomentId) {
        let mut history = moment.clone();
        history.when = When::Latest;
        self.branches
            .entry(Self::parent_of(moment))
            .or_default()
            .insert(history.to_string());
    }

    /// Branches alive: distinct branched histories with a kept end.
    pub(crate) fn branches_alive(&self) -> u64 {
        let own = self.history_len_of_source();
        let mut histories: Vec<&[Action]> = Vec::new();
        for kept in self.kept.iter().filter(|k| k.history.len() > own) {
            if !histories.contains(&kept.history.as_slice()) {
                histories.push(&kept.history);
            }
        }
        histories.len() as u64
    }

    fn history_len_of_source(&self) -> usize {
        match &self.source {
            Source::Finding(f) => f
                .finding
                .file
                .path
                .steps
                .iter()
                .map(|s| 1 + s.faults.len())
                .sum(),
            Source::Snapshots(_) => 0,
        }
    }

    /// Runs a call: the budget's begin and end around `body`, its use
    /// reported with the result (also counted when it failed).
    pub fn call<T>(
        &mut self,
        name: &str,
        body: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<(T, Spent)> {
        self.budget.begin(name)?;
        let result = body(self);
        let spent = self
            .budget
            .end(if result.is_ok() { "ok" } else { "error" })?;
        result.map(|value| (value, spent))
    }

    /// The finding this session is on, if it is one.
    pub fn finding(&self) -> Option<&FindingSource> {
        self.source.finding()
    }

    /// Lets the held run go.
    pub fn close(mut self) -> Result<()> {
        if let Some(held) = self.held.take() {
            self.calls().close(held.run)?;
        }
        Ok(())
    }
}
