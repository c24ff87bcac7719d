//! `detvisor shell DIR@T`: an interactive shell inside the guest at a saved
//! moment, in a fork. The snapshot is restored into this process (replayed
//! exactly to T); the fork-shell listener every `run` guest carries (see
//! `guest::FORK_SHELL_LISTENER`) is woken on the machine's virtio console,
//! freezes the system under test and runs `sh -i` there. What happens in the
//! fork never touches the snapshot files: the saved history is unchanged.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::mpsc;
use std::time::Duration;

use crate::driven::Driven;
use crate::guest::FORK_SHELL_END;
use crate::moment::Moment;
use crate::snapshots;
use crate::streams::{say, Streams};
use crate::up::ShellEvent;
use guest_agent::protocol::{ErrorContext, HostToAgent};
use vmm::exit::StopReason;

/// The terminal's end-of-file character (Ctrl-D).
const TERMINAL_EOF: u8 = 0x04;

/// A shell in a fork of a saved moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShellRequest {
    /// The moment the fork is of.
    pub moment: Moment,
    /// For an `up` snapshot: open the shell inside this node.
    pub node: Option<String>,
    /// The user's terminal: rows, columns and `$TERM` (for an `up` fork's
    /// pseudo-terminal).
    pub rows: u16,
    pub cols: u16,
    pub term: Option<String>,
}

/// What the input stream passes on.
enum Input {
    Bytes(Vec<u8>),
    End,
}

/// The next input: without waiting (`None`), for at most `wait`, or until
/// there is some (`Duration::MAX`). A closed or missing stream is the end.
fn next_input(input: Option<&crate::streams::Input>, wait: Option<Duration>) -> Option<Input> {
    let Some(input) = input else {
        return Some(Input::End);
    };
    let received = match wait {
        None => match input.try_recv() {
            Err(mpsc::TryRecvError::Empty) => return None,
            other => other.ok(),
        },
        Some(Duration::MAX) => input.recv().ok(),
        Some(wait) => match input.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Timeout) => return None,
            other => other.ok(),
        },
    };
    Some(received.map_or(Input::End, Input::Bytes))
}

/// Why a shell in a fork could not be opened or went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    /// Restoring the moment.
    #[error(transparent)]
    Restore(#[from] crate::snapshots::SnapshotsError),
    #[error(
        "the guest stopped before that moment ({stop:?}): there is nothing to open a shell in"
    )]
    StoppedBefore { stop: StopReason },
    #[error("--node: snapshot {id} is of a `run`, which has no nodes")]
    NodeOfRun { id: String },
    #[error(
        "snapshot {id} was taken of a machine without a control channel (a virtio \
             console): take it again with this detvisor"
    )]
    NoControlChannel { id: String },
    #[error("waking the guest's shell listener")]
    Wake(#[source] vmm::vm::VmError),
    #[error("an agent shell needs an `up` snapshot")]
    NotUp,
    #[error("the guest's agent could not open a shell: {message}")]
    AgentOpen { message: String },
    /// Why nothing answered (see `ShellChannel::silence`).
    #[error("{0}")]
    Silence(&'static str),
    #[error("the shell did not end within {LISTENER_BUDGET} (virtual) after the end of input")]
    NoEnd,
    #[error("the guest went idle without ending the shell")]
    Idle,
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
    /// A message to the agent.
    #[error(transparent)]
    Drive(#[from] crate::up::DriveError),
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
    /// Printing the shell's output.
    #[error(transparent)]
    Print(#[from] std::io::Error),
}

type Result<T, E = ShellError> = std::result::Result<T, E>;

/// How the user's bytes reach a shell in the fork, and its output comes back.
trait ShellChannel {
    /// Starts the shell (at the restored moment).
    fn open(&mut self, driven: &mut Driven) -> Result<()>;
    fn input(&mut self, driven: &mut Driven, bytes: &[u8]) -> Result<()>;
    fn end_of_input(&mut self, driven: &mut Driven) -> Result<()>;
    /// Output to print since the last call, and the shell's status once it
    /// ended. `answered` is set once the shell has shown a sign of life.
    fn output(&mut self, driven: &mut Driven) -> Result<(Vec<u8>, Option<u8>)>;
    fn answered(&self) -> bool;
    /// Why nothing answered, for the user.
    fn silence(&self) -> &'static str;
    /// Lines for the user since the last call.
    fn take_notices(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// A `run` guest's fork-shell listener on the control channel: raw lines in,
/// output up to an end marker back (see `guest::FORK_SHELL_LISTENER`).
struct Listener {
    /// Output not yet printed: it might be the start of the end marker.
    held: Vec<u8>,
    answered: bool,
}

impl ShellChannel for Listener {
    fn open(&mut self, driven: &mut Driven) -> Result<()> {
        // The listener's first line wakes it; the user's lines follow.
        driven
            .session
            .send_on_control_channel(b"\n")
            .map_err(ShellError::Wake)
    }

    fn input(&mut self, driven: &mut Driven, bytes: &[u8]) -> Result<()> {
        Ok(driven.session.send_on_control_channel(bytes)?)
    }

    fn end_of_input(&mut self, driven: &mut Driven) -> Result<()> {
        Ok(driven.session.send_on_control_channel(b"\nexit\n")?)
    }

    fn output(&mut self, driven: &mut Driven) -> Result<(Vec<u8>, Option<u8>)> {
        let out = driven.session.take_control_output();
        if out.is_empty() {
            return Ok((out, None));
        }
        self.answered = true;
        self.held.extend_from_slice(&out);
        let (print, ended) = split_output(&self.held);
        let printable = self.held.drain(..print).collect();
        Ok((printable, ended.then_some(0)))
    }

    fn answered(&self) -> bool {
        self.answered
    }

    fn silence(&self) -> &'static str {
        "no fork-shell listener answered in this guest (a `run` without a command has \
         none: its shell is on the console; or the snapshot was taken before the \
         listener started)"
    }
}

/// An `up` guest's agent: it pauses the nodes and runs `sh` on a
/// pseudo-terminal, whose bytes travel in the agent's frames.
struct AgentShell {
    node: Option<String>,
    answered: bool,
    /// Input held back until the shell has shown its first prompt (the
    /// agent's PS1 ends in `# `), or for at most `PROMPT_WAIT` after it
    /// opened: typed ahead, the terminal would echo it once before `sh`
    /// takes over the line, and `sh` once more.
    typed_ahead: Option<Vec<u8>>,
    /// The last byte of output so far (a prompt may end across two chunks).
    last_byte: Option<u8>,
    /// When the agent reported the shell open.
    opened_at: Option<vmm::VirtNanos>,
    rows: u16,
    cols: u16,
    term: Option<String>,
    /// Lines for the user not printed yet (lost input, ...).
    notices: Vec<String>,
}

/// How long typed-ahead input waits for the first prompt, in virtual time.
const PROMPT_WAIT: vmm::VirtNanos = vmm::VirtNanos(2_000_000_000);

impl AgentShell {
    fn up(driven: &mut Driven) -> Result<&mut crate::up::UpDriver> {
        driven.up.as_mut().ok_or(ShellError::NotUp)
    }
}

impl ShellChannel for AgentShell {
    fn open(&mut self, driven: &mut Driven) -> Result<()> {
        let message = HostToAgent::OpenShell {
            node: self.node.clone(),
            rows: self.rows,
            cols: self.cols,
            term: self.term.clone(),
        };
        // The fork is for looking: nothing the conductor would send next
        // (a fault resuming a node, a shutdown) may change it.
        Self::up(driven)?.hold_conductor();
        Ok(crate::up::send_message(&mut driven.session, &message)?)
    }

    fn input(&mut self, driven: &mut Driven, bytes: &[u8]) -> Result<()> {
        if let Some(held) = &mut self.typed_ahead {
            held.extend_from_slice(bytes);
            return Ok(());
        }
        let message = HostToAgent::ShellInput {
            data: bytes.to_vec(),
        };
        Ok(crate::up::send_message(&mut driven.session, &message)?)
    }

    fn end_of_input(&mut self, driven: &mut Driven) -> Result<()> {
        // The terminal's end-of-file character, twice: the first ends a last
        // line without a newline, and `sh` ends at an empty line.
        self.input(driven, &[TERMINAL_EOF, TERMINAL_EOF])
    }

    fn output(&mut self, driven: &mut Driven) -> Result<(Vec<u8>, Option<u8>)> {
        let mut out = Vec::new();
        let mut status = None;
        let now = driven.session.now();
        let mut prompt_seen = false;
        for event in Self::up(driven)?.take_shell_events() {
            self.answered = true;
            match event {
                ShellEvent::Opened { .. } => {
                    self.opened_at.get_or_insert(now);
                }
                ShellEvent::Output(bytes) => {
                    let mut previous = self.last_byte;
                    for &byte in &bytes {
                        prompt_seen |= previous == Some(b'#') && byte == b' ';
                        previous = Some(byte);
                    }
                    self.last_byte = previous;
                    out.extend_from_slice(&bytes);
                }
                ShellEvent::Failed {
                    context: ErrorContext::OpenShell,
                    message,
                } => return Err(ShellError::AgentOpen { message }),
                // Lost input is worth saying, not worth ending the shell for.
                ShellEvent::Failed { context, message } => self.notices.push(format!(
                    "detvisor shell: the guest's agent: {context}: {message}"
                )),
                ShellEvent::Exited(exit) => {
                    status = Some(
                        u8::try_from(exit.shell_code()).unwrap_or(crate::exit_status::NO_STATUS),
                    )
                }
            }
        }
        let waited_enough = self
            .opened_at
            .is_some_and(|at| now.0 > at.0.saturating_add(PROMPT_WAIT.0));
        if prompt_seen || waited_enough {
            if let Some(held) = self.typed_ahead.take() {
                if !held.is_empty() {
                    self.input(driven, &held)?;
                }
            }
        }
        Ok((out, status))
    }

    fn answered(&self) -> bool {
        self.answered
    }

    fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    fn silence(&self) -> &'static str {
        "the guest's agent did not open a shell (is the snapshot from an older detvisor \
         whose agent has no shell? see the agent's errors above)"
    }
}

/// Runs the shell, its terminal on `streams`' stdout and input from its
/// stdin; returns the exit status for the process (the shell's under `up`,
/// 0 when a `run` guest's listener ended, 1 when the guest stopped under it).
pub fn run(request: &ShellRequest, streams: &dyn Streams) -> Result<u8> {
    let resume = vmm::vm::ResumeConfig {
        until: None,
        record: vmm::record::RecordConfig::default(),
        stall_timeout: vmm::stall::StallTimeout::default(),
        clock: None,
    };
    // The guest's own console (and an `up` run's node output) goes to
    // stderr, the shell to stdout.
    let node_output = snapshots::NodeOutput {
        out: Box::new(streams.stderr()),
        events: Some(Box::new(streams.stderr())),
    };
    let mut restored = snapshots::restore(
        &request.moment,
        &resume,
        streams.stderr(),
        None,
        node_output,
    )?;
    if let Some(stop) = restored.stopped_early {
        return Err(ShellError::StoppedBefore { stop });
    }
    let id = restored.snapshot.meta.id.clone();
    let terminal = Terminal {
        node: request.node.clone(),
        rows: request.rows,
        cols: request.cols,
        term: request.term.clone(),
    };
    shell_in(&mut restored.driven, &id, &terminal, streams)
}

/// Where a shell opens and the user's terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terminal {
    /// For an `up` run: open the shell inside this node.
    pub node: Option<String>,
    /// The user's terminal: rows, columns and `$TERM` (for an `up` run's
    /// pseudo-terminal).
    pub rows: u16,
    pub cols: u16,
    pub term: Option<String>,
}

/// Runs a shell in `driven` as it stands (a fork: the caller throws it
/// away or resets it afterwards), `label` naming the moment for the user;
/// returns the exit status as [`run`] does.
pub fn shell_in(
    driven: &mut Driven,
    label: &str,
    terminal: &Terminal,
    streams: &dyn Streams,
) -> Result<u8> {
    let id = label.to_owned();
    let node = terminal.node.as_deref();
    let mut channel: Box<dyn ShellChannel> = if driven.up.is_some() {
        Box::new(AgentShell {
            node: node.map(str::to_string),
            answered: false,
            typed_ahead: Some(Vec::new()),
            last_byte: None,
            opened_at: None,
            rows: terminal.rows,
            cols: terminal.cols,
            term: terminal.term.clone(),
            notices: Vec::new(),
        })
    } else {
        if node.is_some() {
            return Err(ShellError::NodeOfRun { id });
        }
        if !driven.session.has_control_channel() {
            return Err(ShellError::NoControlChannel { id });
        }
        Box::new(Listener {
            held: Vec::new(),
            answered: false,
        })
    };
    let what = match (&driven.up, node) {
        (None, _) => "every process of the guest is stopped",
        (Some(_), None) => "every running node is paused; the shell runs beside them",
        (Some(_), Some(_)) => "every running node is paused; the shell runs inside that node",
    };
    say(
        streams,
        &format!(
            "detvisor shell: a fork of {id} at exit {}, virtual time {}; {what} \
             (end with `exit` or end of input)",
            driven.session.exits(),
            driven.session.now()
        ),
    );
    let input = streams.stdin();
    let input = input.as_ref();
    channel.open(driven)?;
    let mut stdout = streams.stdout();
    let mut input_ended = false;
    let mut input_ended_at: Option<vmm::VirtNanos> = None;
    let opened_at = driven.session.now();
    // Input is delivered whenever it arrives: in a fork the moment of
    // delivery needs to be deterministic no more.
    let deliver = |message: Input,
                   channel: &mut Box<dyn ShellChannel>,
                   driven: &mut Driven,
                   input_ended: &mut bool|
     -> Result<()> {
        match message {
            Input::Bytes(bytes) => channel.input(driven, &bytes),
            Input::End => {
                *input_ended = true;
                channel.end_of_input(driven)
            }
        }
    };
    loop {
        while !input_ended {
            let Some(message) = next_input(input, None) else {
                break;
            };
            deliver(message, &mut channel, driven, &mut input_ended)?;
        }
        let before = driven.session.now();
        let stop = driven.step()?;
        let (out, ended) = channel.output(driven)?;
        for notice in channel.take_notices() {
            say(streams, &notice);
        }
        // An idle guest jumps to its next timer: pace such jumps by the wall
        // clock (at most 50 ms at a time) while waiting for input, instead of
        // racing through virtual time on a spinning host CPU.
        let jumped = driven.session.now().0.saturating_sub(before.0);
        if jumped > IDLE_JUMP_NS && out.is_empty() && !input_ended {
            let wait = Duration::from_nanos(jumped.min(MAX_IDLE_WAIT_NS));
            if let Some(message) = next_input(input, Some(wait)) {
                deliver(message, &mut channel, driven, &mut input_ended)?;
            }
        }
        stdout.write_all(&out)?;
        stdout.flush()?;
        if let Some(status) = ended {
            return Ok(status);
        }
        let now = driven.session.now();
        if !channel.answered() && now.0 > opened_at.0 + LISTENER_BUDGET.0 {
            return Err(ShellError::Silence(channel.silence()));
        }
        if input_ended {
            let since = *input_ended_at.get_or_insert(now);
            if now.0 > since.0 + LISTENER_BUDGET.0 {
                return Err(ShellError::NoEnd);
            }
        }
        match stop {
            None => {}
            Some(StopReason::HaltedForever) => {
                // Nothing in the guest will happen until the user types.
                if input_ended {
                    return Err(ShellError::Idle);
                }
                let message = next_input(input, Some(Duration::MAX)).unwrap_or(Input::End);
                deliver(message, &mut channel, driven, &mut input_ended)?;
            }
            Some(other) => {
                say(
                    streams,
                    &format!("detvisor shell: the guest stopped under the shell: {other:?}"),
                );
                return Ok(1);
            }
        }
    }
}

/// A step that advanced virtual time by more than this was an idle jump.
const IDLE_JUMP_NS: u64 = 1_000_000;
/// Longest wall-clock wait for input after one idle jump.
const MAX_IDLE_WAIT_NS: u64 = 50_000_000;

/// How much virtual time the shell has to answer its opening, and to end
/// after the end of input.
const LISTENER_BUDGET: vmm::VirtNanos = vmm::VirtNanos(30_000_000_000);

/// How many bytes of `held` can be printed, and whether the end marker is
/// there (then everything before it is printed and nothing after). Bytes at
/// the end that could begin the marker are held back.
fn split_output(held: &[u8]) -> (usize, bool) {
    let marker = FORK_SHELL_END.as_bytes();
    if let Some(at) = held.windows(marker.len()).position(|w| w == marker) {
        return (at, true);
    }
    let keep = (1..marker.len().min(held.len() + 1))
        .rev()
        .find(|&n| held.ends_with(&marker[..n]))
        .unwrap_or(0);
    (held.len() - keep, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let chain = |e: ShellError| format!("{:#}", anyhow::Error::from(e));
        let e = ShellError::Wake(vmm::vm::VmError::Inject(std::io::Error::from_raw_os_error(
            libc::EBADF,
        )));
        assert_eq!(
            chain(e),
            "waking the guest's shell listener: injecting an interrupt failed: \
             Bad file descriptor (os error 9)"
        );
        assert_eq!(
            chain(ShellError::NoControlChannel {
                id: "exit-1".into()
            }),
            "snapshot exit-1 was taken of a machine without a control channel (a virtio \
             console): take it again with this detvisor"
        );
    }

    #[test]
    fn the_end_marker_is_found_and_not_printed() {
        let out = format!("hello\n{FORK_SHELL_END}\n");
        assert_eq!(split_output(out.as_bytes()), (6, true));
        assert_eq!(split_output(b"plain"), (5, false));
    }

    #[test]
    fn a_marker_split_across_chunks_is_held_back_not_printed() {
        let marker = FORK_SHELL_END.as_bytes();
        let mut held = b"# out\n".to_vec();
        held.extend_from_slice(&marker[..5]);
        // Only the text before the possible marker start is printed.
        assert_eq!(split_output(&held), (6, false));
        held.drain(..6);
        held.extend_from_slice(&marker[5..]);
        held.push(b'\n');
        assert_eq!(split_output(&held), (0, true));
    }
}
