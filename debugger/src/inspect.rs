//! Looking and acting at a moment. Inspections (a command with every node
//! stopped, a file, the processes, the machine) run in a throwaway fork:
//! the run is reset to the moment's checkpoint afterwards, so they create
//! no history. A command in a branch lets the nodes run while it runs and
//! names the moment it ended at, a new history whose id carries it.

use crate::moment::{Action, MomentId};
use crate::session::{At, Result, Session};
use run::api::Position;
use run::inspect::{ExecMode, ExecOutcome, ExecRequest, ExitStatus, InspectReport, ProcessRow};
use run::moment::When;
use run::shell::Terminal;
use serde::Serialize;
use std::collections::BTreeMap;
use vmm::VirtNanos;

/// A command to run at a moment.
#[derive(Clone, Debug)]
pub struct Command {
    /// Inside this node's namespaces (`None`: beside the nodes, in the
    /// guest).
    pub node: Option<String>,
    pub command: Vec<String>,
    /// Virtual time it may take before it is killed.
    pub timeout: VirtNanos,
    /// Bytes of each of stdout and stderr kept.
    pub output_limit: u64,
}

/// The timeout of a command (virtual time) unless given.
pub const DEFAULT_TIMEOUT: VirtNanos = VirtNanos(30_000_000_000);
/// The bytes of each stream a command keeps unless told.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1 << 20;
/// A command in a branch is part of its history, replayed whenever the
/// branch is reached: its timeout and output limit are fixed (they change
/// what the guest does).
pub const BRANCH_TIMEOUT: VirtNanos = VirtNanos(60_000_000_000);
pub const BRANCH_OUTPUT_LIMIT: u64 = 1 << 20;

/// What a command did.
#[derive(Clone, Debug, Serialize)]
pub struct Executed {
    /// The moment it ran at.
    pub at: At,
    pub stdout: String,
    pub stderr: String,
    /// Its exit code (`None` when a signal ended it or it timed out).
    pub status: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Virtual time it took.
    pub took: VirtNanos,
    /// In a branch: the moment it ended at.
    pub end: Option<At>,
}

fn executed(at: At, outcome: &ExecOutcome, end: Option<At>) -> Executed {
    Executed {
        stdout: String::from_utf8_lossy(&outcome.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
        status: match outcome.status {
            ExitStatus::Code(code) => Some(code),
            ExitStatus::Signal(_) => None,
        },
        signal: match outcome.status {
            ExitStatus::Signal(signal) => Some(signal),
            ExitStatus::Code(_) => None,
        },
        timed_out: outcome.timed_out,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        took: VirtNanos(
            outcome
                .position
                .virtual_ns
                .0
                .saturating_sub(outcome.started.virtual_ns.0),
        ),
        at,
        end,
    }
}

fn request(command: &Command, mode: ExecMode) -> ExecRequest {
    ExecRequest {
        node: command.node.clone(),
        command: command.command.clone(),
        env: BTreeMap::new(),
        mode,
        timeout: command.timeout,
        output_limit: command.output_limit,
    }
}

/// Runs `body` on the held run standing at `moment`, then returns the run
/// to the moment: nothing it did stays.
fn in_fork<T>(
    session: &mut Session,
    moment: &MomentId,
    body: impl FnOnce(&mut Session, run::api::RunId) -> Result<T>,
) -> Result<(At, T)> {
    let at = session.reach(moment)?;
    let run = session.run().expect("reached");
    let result = body(session, run);
    // Back to the moment whatever happened in the fork.
    session.back_to(&at)?;
    Ok((at, result?))
}

/// `command` at `moment` with every node stopped, in a fork.
pub fn exec(session: &mut Session, moment: &MomentId, command: &Command) -> Result<Executed> {
    session.budget.check_bytes(
        2 * command
            .output_limit
            .min(session.budget.limits.call_bytes / 2),
    )?;
    session.budget.check_virtual(command.timeout)?;
    let (at, outcome) = in_fork(session, moment, |session, run| {
        Ok(session
            .calls()
            .exec(run, request(command, ExecMode::Frozen))?)
    })?;
    session
        .budget
        .returned((outcome.stdout.len() + outcome.stderr.len()) as u64);
    session.budget.simulated(VirtNanos(
        outcome
            .position
            .virtual_ns
            .0
            .saturating_sub(outcome.started.virtual_ns.0),
    ));
    Ok(executed(at, &outcome, None))
}

/// The command of an [`Action::Exec`] at the held run's present, the nodes
/// running on (part of reaching a branch that ran it).
pub(crate) fn exec_live(
    session: &mut Session,
    node: Option<String>,
    command: Vec<String>,
) -> Result<ExecOutcome> {
    let run = session.run().expect("a held run");
    let command = Command {
        node,
        command,
        timeout: BRANCH_TIMEOUT,
        output_limit: BRANCH_OUTPUT_LIMIT,
    };
    Ok(session
        .calls()
        .exec(run, request(&command, ExecMode::Live))?)
}

/// `command` at `moment` in a branch: the nodes and the fault schedule run
/// on while it runs; the branch ends where it ended.
pub fn exec_in_branch(
    session: &mut Session,
    moment: &MomentId,
    command: &Command,
) -> Result<Executed> {
    let at = session.reach(moment)?;
    let action = Action::Exec {
        at: at.virtual_ns,
        node: command.node.clone(),
        command: command.command.clone(),
    };
    let mut branch = moment.at(When::Time(at.virtual_ns));
    branch.actions.push(action.clone());
    session.budget.check_branches(
        1,
        session.siblings_of(&branch),
        branch.depth() as u64,
        session.branches_alive(),
    )?;
    session.budget.check_virtual(BRANCH_TIMEOUT)?;
    let outcome = exec_live(session, command.node.clone(), command.command.clone())?;
    let end: Position = outcome.position;
    session.budget.simulated(VirtNanos(
        end.virtual_ns
            .0
            .saturating_sub(outcome.started.virtual_ns.0),
    ));
    session.moved(action, end)?;
    branch.when = When::Time(end.virtual_ns);
    let end_at = session.keep_as(&branch)?;
    session.budget.branched(1);
    session.note_branch(&branch);
    session
        .budget
        .returned((outcome.stdout.len() + outcome.stderr.len()) as u64);
    Ok(executed(at, &outcome, Some(end_at)))
}

/// Bytes of a node's file at a moment.
#[derive(Clone, Debug, Serialize)]
pub struct Extracted {
    pub at: At,
    pub path: String,
    /// The file's whole size.
    pub size: u64,
    pub truncated: bool,
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// The largest file extract returns unless told.
pub const DEFAULT_EXTRACT_LIMIT: u64 = 8 << 20;

/// `path` as `node` sees it at `moment` (at most `limit` bytes), in a fork.
pub fn extract(
    session: &mut Session,
    moment: &MomentId,
    node: Option<String>,
    path: &str,
    limit: u64,
) -> Result<Extracted> {
    session
        .budget
        .check_bytes(limit.min(session.budget.limits.call_bytes))?;
    let limit = limit.min(session.budget.limits.call_bytes);
    let (at, (file, _)) = in_fork(session, moment, |session, run| {
        Ok(session
            .calls()
            .read_file(run, node, path.to_owned(), limit)?)
    })?;
    session.budget.returned(file.bytes.len() as u64);
    Ok(Extracted {
        at,
        path: path.to_owned(),
        size: file.size,
        truncated: file.truncated,
        bytes: file.bytes,
    })
}

/// The processes of a node (or of the guest) at a moment.
#[derive(Clone, Debug, Serialize)]
pub struct Processes {
    pub at: At,
    pub node: Option<String>,
    pub processes: Vec<ProcessRow>,
}

pub fn processes(
    session: &mut Session,
    moment: &MomentId,
    node: Option<String>,
) -> Result<Processes> {
    let (at, (processes, _)) = in_fork(session, moment, |session, run| {
        Ok(session.calls().processes(run, node.clone())?)
    })?;
    Ok(Processes {
        at,
        node,
        processes,
    })
}

/// The machine at a moment: registers, virtual time, exit index, devices,
/// nodes.
#[derive(Clone, Debug, Serialize)]
pub struct Inspected {
    pub at: At,
    pub machine: InspectReport,
}

pub fn inspect(session: &mut Session, moment: &MomentId) -> Result<Inspected> {
    let at = session.reach(moment)?;
    let run = session.run().expect("reached");
    let machine = session.calls().inspect(run)?;
    Ok(Inspected { at, machine })
}

/// An interactive shell at `moment` (inside `terminal.node`, or beside the
/// nodes), its terminal on the runner's streams, in a fork: every node is
/// paused while it runs and the run is reset to the moment afterwards. The
/// moment it ran at, and the shell's exit status.
pub fn shell(session: &mut Session, moment: &MomentId, terminal: &Terminal) -> Result<(At, u8)> {
    let label = moment.to_string();
    in_fork(session, moment, |session, run| {
        Ok(session.calls().shell_in(run, label, terminal.clone())?)
    })
}
