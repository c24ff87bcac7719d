//! Looking into a held `up` run and acting in it, for a debugger: a
//! command run in a node's namespaces or beside the nodes ([`exec`]), a
//! node's file ([`read_file`]), its processes ([`processes`]), all done by
//! the in-guest agent; and the machine's state ([`inspect`]), read on the
//! host. The requests and answers are the run API's
//! ([`crate::api::Request::Exec`] and the others).
//!
//! Every agent request is sent at the exit the run stands at (as a fork
//! shell's are) and answered at later exits, so the run advances while it
//! waits. Two modes: **frozen** (every inspection, and `exec` in
//! [`ExecMode::Frozen`]) pauses every running node and holds the
//! conductor (no fault, restart or shutdown is sent from then on), so
//! what is seen is that moment; the caller checkpoints before and resets
//! after, and no history is made. **Live** (`exec` in [`ExecMode::Live`])
//! touches no node and lets the fault schedule go on: the command runs in
//! the history, which it advances.

use crate::api::{Position, RunId};
use crate::driven::{Driven, DrivenError};
use crate::up::DriveError;
use guest_agent::protocol::{base64, AgentToHost, ErrorContext, ExecSpec, HostToAgent, Stream};
/// How a command ended (`{"code": N}` or `{"signal": N}`), and a process
/// row: the agent's own types.
pub use guest_agent::protocol::{ExitStatus, ProcessRow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use vmm::exit::StopReason;
use vmm::VirtNanos;

/// A command to run in a held `up` run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Inside this node's namespaces (like `nsenter`); `None`: beside the
    /// nodes, in the guest's root namespaces. Never on the host.
    pub node: Option<String>,
    /// argv; `command[0]` without a `/` is looked up in `PATH`.
    pub command: Vec<String>,
    /// The command's whole environment (`PATH` defaults to
    /// `/usr/sbin:/usr/bin:/sbin:/bin`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub mode: ExecMode,
    /// Virtual time after which the command is killed (its process group,
    /// SIGKILL) and reported `timed_out`.
    pub timeout: VirtNanos,
    /// Bytes kept of each of stdout and stderr (the rest is counted).
    pub output_limit: u64,
}

/// Whether an `exec` looks at a moment or acts in the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Every running node paused and the conductor held first: the command
    /// sees that moment. For inspection: checkpoint before, reset after.
    Frozen,
    /// The nodes keep running and the fault schedule goes on while the
    /// command runs: it advances the run (an `exec` in a branch).
    Live,
}

/// What an `exec` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// The first `output_limit` bytes of its stdout (base64 in JSON).
    #[serde(with = "base64")]
    pub stdout: Vec<u8>,
    #[serde(with = "base64")]
    pub stderr: Vec<u8>,
    /// How it ended: `{"code": N}` or `{"signal": N}`.
    pub status: ExitStatus,
    /// The stream wrote more than `output_limit` bytes.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Its timeout killed it.
    pub timed_out: bool,
    /// Where the run stood when the command was sent.
    pub started: Position,
    /// Where the run stands after its end.
    pub position: Position,
}

/// A file's bytes as the agent read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileContents {
    pub bytes: Vec<u8>,
    /// The file's whole size.
    pub size: u64,
    /// `bytes` is less than the whole file.
    pub truncated: bool,
}

/// A node's state as the run's conductor knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    Running,
    /// Stopped (SIGSTOP) by a fault or an inspection.
    Paused,
    /// Not running (ended, killed or crashed, or not started yet).
    Down,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    pub state: NodeState,
}

/// The vCPU's registers at the run's present (between two exits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registers {
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    pub cr3: u64,
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    /// The segment registers and what a debugger shows beside them
    /// (written since `detvisor gdb`; 0 in older answers).
    #[serde(default)]
    pub segments: Segments,
}

/// Segment selectors and bases, and the control registers a debugger shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segments {
    pub cs: u16,
    pub ss: u16,
    pub ds: u16,
    pub es: u16,
    pub fs: u16,
    pub gs: u16,
    pub fs_base: u64,
    pub gs_base: u64,
    pub cr0: u64,
    pub cr2: u64,
    pub cr4: u64,
    pub efer: u64,
}

impl Registers {
    /// The registers of a captured vCPU.
    pub fn of(vcpu: &vmm::vcpu_state::VcpuState) -> Registers {
        Registers::from_kvm(&vcpu.regs, &vcpu.sregs)
    }

    /// Writes the general registers, RIP and RFLAGS into `regs`.
    pub fn write_general(&self, regs: &mut kvm_bindings::kvm_regs) {
        regs.rip = self.rip;
        regs.rsp = self.rsp;
        regs.rflags = self.rflags;
        regs.rax = self.rax;
        regs.rbx = self.rbx;
        regs.rcx = self.rcx;
        regs.rdx = self.rdx;
        regs.rsi = self.rsi;
        regs.rdi = self.rdi;
        regs.rbp = self.rbp;
        regs.r8 = self.r8;
        regs.r9 = self.r9;
        regs.r10 = self.r10;
        regs.r11 = self.r11;
        regs.r12 = self.r12;
        regs.r13 = self.r13;
        regs.r14 = self.r14;
        regs.r15 = self.r15;
    }

    /// The registers KVM reports.
    pub fn from_kvm(r: &kvm_bindings::kvm_regs, sregs: &kvm_bindings::kvm_sregs) -> Registers {
        Registers {
            segments: Segments {
                cs: sregs.cs.selector,
                ss: sregs.ss.selector,
                ds: sregs.ds.selector,
                es: sregs.es.selector,
                fs: sregs.fs.selector,
                gs: sregs.gs.selector,
                fs_base: sregs.fs.base,
                gs_base: sregs.gs.base,
                cr0: sregs.cr0,
                cr2: sregs.cr2,
                cr4: sregs.cr4,
                efer: sregs.efer,
            },
            rip: r.rip,
            rsp: r.rsp,
            rflags: r.rflags,
            cr3: sregs.cr3,
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            rbp: r.rbp,
            r8: r.r8,
            r9: r.r9,
            r10: r.r10,
            r11: r.r11,
            r12: r.r12,
            r13: r.r13,
            r14: r.r14,
            r15: r.r15,
        }
    }
}

/// One device, in a line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSummary {
    pub name: String,
    pub state: String,
}

/// The machine at a held run's present.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectReport {
    pub position: Position,
    pub registers: Registers,
    pub devices: Vec<DeviceSummary>,
    /// Each node's state, in manifest order (empty for a plain run).
    pub nodes: Vec<NodeStatus>,
    /// Whether the conductor is held (after a frozen inspection).
    pub conductor_held: bool,
}

/// Why a look into a held run failed.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("run {run:?} is a plain run, not an `up` run: {what} needs its agent")]
    NotUp { run: RunId, what: &'static str },
    #[error("no node {node:?} in this run (its nodes: {})", nodes.join(", "))]
    UnknownNode { node: String, nodes: Vec<String> },
    #[error(
        "exec in live mode: run {run:?} was frozen for an inspection (its nodes paused, its \
         conductor held); reset it to a checkpoint first"
    )]
    LiveWhileFrozen { run: RunId },
    #[error("exec: an empty command")]
    EmptyCommand,
    #[error("exec: a timeout of 0 ns (give the command some virtual time)")]
    ZeroTimeout,
    #[error("read_file: an empty path")]
    EmptyPath,
    #[error("{what}: the guest stopped ({stop:?}) before the agent answered")]
    GuestStopped { what: String, stop: StopReason },
    #[error(
        "{what}: the agent did not answer within {waited} of virtual time (an agent older \
         than this request ignores it: boot the run again with this detvisor)"
    )]
    NoAnswer { what: String, waited: VirtNanos },
    /// The agent could not do it (a command that does not exist, a missing
    /// file, a node that is down...): its message.
    #[error("{what}: {message}")]
    Agent { what: String, message: String },
    #[error("{what}: the agent sent {got} answers for one request")]
    Unexpected { what: String, got: &'static str },
    #[error(transparent)]
    Driven(#[from] DrivenError),
    #[error(transparent)]
    Drive(#[from] DriveError),
    #[error("reading the vCPU's state")]
    Capture(#[source] vmm::vm::VmError),
}

type Result<T, E = InspectError> = std::result::Result<T, E>;

/// How much virtual time the agent has to answer a `read_file` or a
/// `processes` (and an `exec`, past its own timeout).
pub const ANSWER_BUDGET: VirtNanos = VirtNanos(30_000_000_000);

fn where_(node: Option<&str>) -> String {
    match node {
        Some(node) => format!("in node {node}"),
        None => "beside the nodes".to_string(),
    }
}

/// The run's `up` driver, after checking `node` is one of its nodes.
fn up_with_node<'a>(
    driven: &'a mut Driven,
    run: RunId,
    what: &'static str,
    node: Option<&str>,
) -> Result<&'a mut crate::up::UpDriver> {
    let up = driven
        .up
        .as_mut()
        .ok_or(InspectError::NotUp { run, what })?;
    if let Some(node) = node {
        if !up.node_names().iter().any(|n| n == node) {
            return Err(InspectError::UnknownNode {
                node: node.to_string(),
                nodes: up.node_names().to_vec(),
            });
        }
    }
    Ok(up)
}

/// Where a held run stands (its step within the interval too).
pub(crate) fn position(driven: &Driven, stop: Option<StopReason>) -> Position {
    Position {
        exits: driven.session.exits(),
        virtual_ns: driven.session.now(),
        insn_steps: driven.session.insn_position().steps,
        stop,
    }
}

/// The id an answer names, if it answers an inspection request.
fn answer_id(answer: &AgentToHost) -> Option<u64> {
    Some(match answer {
        AgentToHost::ExecOutput { id, .. }
        | AgentToHost::ExecExited { id, .. }
        | AgentToHost::FileChunk { id, .. }
        | AgentToHost::FileRead { id, .. }
        | AgentToHost::ProcessRows { id, .. }
        | AgentToHost::ProcessesListed { id, .. } => *id,
        AgentToHost::Error {
            context:
                ErrorContext::Exec { id }
                | ErrorContext::ReadFile { id }
                | ErrorContext::Processes { id },
            ..
        } => *id,
        _ => return None,
    })
}

/// Sends `message` (whose answers carry `id`) and steps the run until
/// `answer` says the answers are complete, the guest stops, or `budget` of
/// virtual time passes. `stop` is the held run's: set when the guest stops.
fn ask(
    driven: &mut Driven,
    stop: &mut Option<StopReason>,
    message: &HostToAgent,
    id: u64,
    what: &str,
    budget: VirtNanos,
    mut answer: impl FnMut(AgentToHost) -> Result<bool>,
) -> Result<()> {
    crate::up::send_message(&mut driven.session, message)?;
    let deadline = driven.session.now().0.saturating_add(budget.0);
    loop {
        if let Some(stopped) = driven.step()? {
            *stop = Some(stopped);
            return Err(InspectError::GuestStopped {
                what: what.to_string(),
                stop: stopped,
            });
        }
        let up = driven.up.as_mut().expect("an up run");
        for message in up.take_inspect_answers() {
            // Answers to an earlier request (one given up on) are not ours.
            if answer_id(&message) != Some(id) {
                continue;
            }
            if let AgentToHost::Error { message, .. } = message {
                return Err(InspectError::Agent {
                    what: what.to_string(),
                    message,
                });
            }
            if answer(message)? {
                return Ok(());
            }
        }
        if driven.session.now().0 > deadline {
            return Err(InspectError::NoAnswer {
                what: what.to_string(),
                waited: budget,
            });
        }
    }
}

/// A request's id: the exit it is sent at. The same call at the same
/// moment sends the same bytes (a live `exec` is part of a history), and
/// each waits for its answers, which take exits, before the next is sent.
fn request_id(driven: &Driven) -> u64 {
    driven.session.exits()
}

/// Runs `request` in held run `run` (see the module's modes).
pub fn exec(
    driven: &mut Driven,
    stop: &mut Option<StopReason>,
    run: RunId,
    request: &ExecRequest,
) -> Result<ExecOutcome> {
    let up = up_with_node(driven, run, "exec", request.node.as_deref())?;
    if request.command.first().is_none_or(String::is_empty) {
        return Err(InspectError::EmptyCommand);
    }
    if request.timeout.0 == 0 {
        return Err(InspectError::ZeroTimeout);
    }
    match request.mode {
        ExecMode::Frozen => up.hold_conductor(),
        // A history with its nodes paused and no conductor is none the
        // run would have: a live command needs the run as it goes.
        ExecMode::Live if up.conductor_held() => {
            return Err(InspectError::LiveWhileFrozen { run });
        }
        ExecMode::Live => {}
    }
    let started = position(driven, *stop);
    let id = request_id(driven);
    let what = format!(
        "exec {:?} {}",
        request.command,
        where_(request.node.as_deref())
    );
    let message = HostToAgent::Exec(ExecSpec {
        id,
        node: request.node.clone(),
        command: request.command.clone(),
        env: request.env.clone(),
        freeze: request.mode == ExecMode::Frozen,
        timeout_ns: request.timeout.0,
        output_limit: request.output_limit,
    });
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut ended = None;
    let budget = VirtNanos(request.timeout.0.saturating_add(ANSWER_BUDGET.0));
    ask(driven, stop, &message, id, &what, budget, |answer| {
        match answer {
            AgentToHost::ExecOutput { stream, data, .. } => match stream {
                Stream::Stdout => stdout.extend_from_slice(&data),
                Stream::Stderr => stderr.extend_from_slice(&data),
            },
            AgentToHost::ExecExited {
                status,
                stdout_bytes,
                stderr_bytes,
                timed_out,
                ..
            } => {
                ended = Some((status, stdout_bytes, stderr_bytes, timed_out));
                return Ok(true);
            }
            _ => {
                return Err(InspectError::Unexpected {
                    what: what.clone(),
                    got: "file or process",
                })
            }
        }
        Ok(false)
    })?;
    let (status, stdout_bytes, stderr_bytes, timed_out) = ended.expect("the exec ended");
    // The agent keeps at most the limit; a peer sending more is cut here.
    let limit = usize::try_from(request.output_limit).unwrap_or(usize::MAX);
    stdout.truncate(limit);
    stderr.truncate(limit);
    Ok(ExecOutcome {
        stdout_truncated: stdout_bytes > stdout.len() as u64,
        stderr_truncated: stderr_bytes > stderr.len() as u64,
        stdout,
        stderr,
        status,
        timed_out,
        started,
        position: position(driven, *stop),
    })
}

/// The first `limit` bytes of `path` as node `node` sees it (resolved in
/// its root), or of the guest's file (`None`); nodes frozen.
pub fn read_file(
    driven: &mut Driven,
    stop: &mut Option<StopReason>,
    run: RunId,
    node: Option<&str>,
    path: &str,
    limit: u64,
) -> Result<FileContents> {
    let up = up_with_node(driven, run, "read_file", node)?;
    if path.is_empty() {
        return Err(InspectError::EmptyPath);
    }
    up.hold_conductor();
    let id = request_id(driven);
    let what = format!("read_file {path:?} {}", where_(node));
    let message = HostToAgent::ReadFile {
        id,
        node: node.map(str::to_string),
        path: path.to_string(),
        limit,
    };
    let mut bytes = Vec::new();
    let mut size = None;
    ask(driven, stop, &message, id, &what, ANSWER_BUDGET, |answer| {
        match answer {
            AgentToHost::FileChunk { data, .. } => bytes.extend_from_slice(&data),
            AgentToHost::FileRead { size: whole, .. } => {
                size = Some(whole);
                return Ok(true);
            }
            _ => {
                return Err(InspectError::Unexpected {
                    what: what.clone(),
                    got: "exec or process",
                })
            }
        }
        Ok(false)
    })?;
    bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let size = size.expect("the read ended").max(bytes.len() as u64);
    Ok(FileContents {
        truncated: size > bytes.len() as u64,
        bytes,
        size,
    })
}

/// The processes of node `node` (PIDs in its namespace) or of the guest.
pub fn processes(
    driven: &mut Driven,
    stop: &mut Option<StopReason>,
    run: RunId,
    node: Option<&str>,
) -> Result<Vec<ProcessRow>> {
    up_with_node(driven, run, "processes", node)?.hold_conductor();
    let id = request_id(driven);
    let what = format!("processes {}", where_(node));
    let message = HostToAgent::Processes {
        id,
        node: node.map(str::to_string),
    };
    let mut rows = Vec::new();
    ask(driven, stop, &message, id, &what, ANSWER_BUDGET, |answer| {
        match answer {
            AgentToHost::ProcessRows { rows: batch, .. } => rows.extend(batch),
            AgentToHost::ProcessesListed { .. } => return Ok(true),
            _ => {
                return Err(InspectError::Unexpected {
                    what: what.clone(),
                    got: "exec or file",
                })
            }
        }
        Ok(false)
    })?;
    Ok(rows)
}

/// The machine at the run's present: no agent, nothing sent, the run does
/// not advance.
pub fn inspect(driven: &mut Driven, stop: Option<StopReason>) -> Result<InspectReport> {
    let state = driven.session.capture().map_err(InspectError::Capture)?;
    let registers = Registers::of(&state.vcpu);
    let nodes = match &driven.up {
        Some(up) => up
            .node_names()
            .iter()
            .map(|name| NodeStatus {
                name: name.clone(),
                state: if !up.conductor().is_running(name) {
                    NodeState::Down
                } else if up.conductor().is_paused(name) {
                    NodeState::Paused
                } else {
                    NodeState::Running
                },
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(InspectReport {
        position: position(driven, stop),
        registers,
        devices: device_summaries(&state.devices),
        nodes,
        conductor_held: driven.up.as_ref().is_some_and(|up| up.conductor_held()),
    })
}

/// A line per device: the machine's clock and events, each virtio device,
/// the switch.
fn device_summaries(devices: &devices::DevicesState) -> Vec<DeviceSummary> {
    let line = |name: &str, state: String| DeviceSummary {
        name: name.to_string(),
        state,
    };
    let mut out = vec![line(
        "machine",
        format!(
            "virtual time {}, {} guest events pending, {} unhandled accesses",
            devices.now,
            devices.pending_events.len(),
            devices.unhandled_accesses
        ),
    )];
    for (slot, device) in devices.virtio.iter().enumerate() {
        let kind = match &device.backend {
            devices::VirtioBackendState::Rng(_) => "rng",
            devices::VirtioBackendState::Console(_) => "console",
            devices::VirtioBackendState::Net(_) => "net",
            devices::VirtioBackendState::Blk(_) => "blk",
        };
        let transport = &device.transport;
        let mut state = format!(
            "{kind}: status {:#x}, {} queues, interrupt status {:#x}",
            transport.status,
            transport.queues.len(),
            transport.interrupt_status
        );
        if let Some(violation) = &transport.violation {
            state.push_str(&format!(", broken: {violation:?}"));
        }
        out.push(line(&format!("virtio{slot}"), state));
    }
    if let Some(switch) = &devices.switch {
        out.push(line(
            "switch",
            format!(
                "{} ports, {} directed links blocked",
                switch.ports.len(),
                switch.blocked.len()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Request, Response};

    #[test]
    fn test_an_exec_request_and_outcome_round_trip_through_json() {
        let request = ExecRequest {
            node: Some("n1".into()),
            command: vec!["cat".into(), "/etc/hostname".into()],
            env: BTreeMap::new(),
            mode: ExecMode::Frozen,
            timeout: VirtNanos::from_secs(5),
            output_limit: 1024,
        };
        let text = serde_json::to_string(&request).unwrap();
        assert!(text.contains(r#""mode":"frozen""#), "{text}");
        assert_eq!(serde_json::from_str::<ExecRequest>(&text).unwrap(), request);
        let at = Position {
            exits: 5,
            virtual_ns: VirtNanos(7),
            insn_steps: 0,
            stop: None,
        };
        let outcome = ExecOutcome {
            stdout: b"n1\n".to_vec(),
            stderr: vec![0xff],
            status: ExitStatus::Code(0),
            stdout_truncated: false,
            stderr_truncated: true,
            timed_out: false,
            started: at,
            position: at,
        };
        let text = serde_json::to_string(&outcome).unwrap();
        assert!(text.contains(r#""stdout":"bjEK""#), "{text}");
        assert!(text.contains(r#""status":{"code":0}"#), "{text}");
        assert_eq!(serde_json::from_str::<ExecOutcome>(&text).unwrap(), outcome);
    }

    /// The inspection requests and their answers cross into the helper VM
    /// and back as JSON: bytes as base64, rows and reports whole.
    #[test]
    fn test_the_inspection_requests_and_answers_round_trip_through_json() {
        let requests = [
            Request::Exec {
                run: RunId(1),
                exec: ExecRequest {
                    node: None,
                    command: vec!["ps".into()],
                    env: [("A".to_string(), "1".to_string())].into(),
                    mode: ExecMode::Live,
                    timeout: VirtNanos::from_secs(1),
                    output_limit: 7,
                },
            },
            Request::ReadFile {
                run: RunId(1),
                node: Some("n1".into()),
                path: "/etc/os-release".into(),
                limit: 64,
            },
            Request::Processes {
                run: RunId(1),
                node: Some("n2".into()),
            },
            Request::Inspect { run: RunId(1) },
        ];
        for request in requests {
            let text = serde_json::to_string(&request).unwrap();
            let back: Request = serde_json::from_str(&text).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), text);
        }
        let position = Position {
            exits: 3,
            virtual_ns: VirtNanos(1_500),
            insn_steps: 0,
            stop: None,
        };
        let file = Response::File {
            bytes: vec![0, 1, 254, 255],
            size: 9,
            truncated: true,
            position,
        };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(
            text,
            r#"{"response":"file","bytes":"AAH+/w==","size":9,"truncated":true,"position":{"exits":3,"virtual_ns":1500,"stop":null}}"#
        );
        let back: Response = serde_json::from_str(&text).unwrap();
        assert!(matches!(back, Response::File { bytes, size: 9, .. } if bytes == [0, 1, 254, 255]));
        let processes = Response::Processes {
            processes: vec![ProcessRow {
                pid: 1,
                ppid: 0,
                state: 'S',
                name: "sh".into(),
                command: vec!["sh".into(), "-c".into(), "x".into()],
            }],
            position,
        };
        let text = serde_json::to_string(&processes).unwrap();
        let back: Response = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        let report = Response::Inspect(InspectReport {
            position,
            registers: Registers {
                rip: 0xffff_ffff_8100_0000,
                rsp: 1,
                rflags: 2,
                cr3: 3,
                rax: 4,
                rbx: 5,
                rcx: 6,
                rdx: 7,
                rsi: 8,
                rdi: 9,
                rbp: 10,
                r8: 11,
                r9: 12,
                r10: 13,
                r11: 14,
                r12: 15,
                r13: 16,
                r14: 17,
                r15: 18,
                segments: Segments {
                    cs: 0x10,
                    fs_base: 19,
                    ..Segments::default()
                },
            },
            devices: vec![DeviceSummary {
                name: "switch".into(),
                state: "2 ports".into(),
            }],
            nodes: vec![NodeStatus {
                name: "n1".into(),
                state: NodeState::Paused,
            }],
            conductor_held: true,
        });
        let text = serde_json::to_string(&report).unwrap();
        assert!(text.contains(r#""state":"paused""#), "{text}");
        let back: Response = serde_json::from_str(&text).unwrap();
        assert!(matches!(back, Response::Inspect(r) if r.registers.rip == 0xffff_ffff_8100_0000));
    }

    #[test]
    fn test_the_errors_name_what_failed() {
        let unknown = InspectError::UnknownNode {
            node: "n9".into(),
            nodes: vec!["n1".into(), "n2".into()],
        };
        assert_eq!(
            unknown.to_string(),
            "no node \"n9\" in this run (its nodes: n1, n2)"
        );
        let plain = InspectError::NotUp {
            run: RunId(4),
            what: "exec",
        };
        assert_eq!(
            plain.to_string(),
            "run RunId(4) is a plain run, not an `up` run: exec needs its agent"
        );
        let agent = InspectError::Agent {
            what: "exec [\"nope\"] in node n1".into(),
            message: "exec \"nope\": No such file or directory (os error 2)".into(),
        };
        assert_eq!(
            agent.to_string(),
            "exec [\"nope\"] in node n1: exec \"nope\": No such file or directory (os error 2)"
        );
        let silent = InspectError::NoAnswer {
            what: "processes beside the nodes".into(),
            waited: ANSWER_BUDGET,
        };
        assert!(silent
            .to_string()
            .starts_with("processes beside the nodes: the agent did not answer within"));
        assert_eq!(
            InspectError::LiveWhileFrozen { run: RunId(2) }.to_string(),
            "exec in live mode: run RunId(2) was frozen for an inspection (its nodes paused, \
             its conductor held); reset it to a checkpoint first"
        );
        let stopped = InspectError::GuestStopped {
            what: "read_file \"/x\" in node n1".into(),
            stop: StopReason::TimeLimit,
        };
        assert_eq!(
            stopped.to_string(),
            "read_file \"/x\" in node n1: the guest stopped (TimeLimit) before the agent answered"
        );
    }

    #[test]
    fn test_answers_are_matched_by_their_request_id() {
        let chunk = AgentToHost::FileChunk {
            id: 7,
            data: vec![1],
        };
        assert_eq!(answer_id(&chunk), Some(7));
        let failed = AgentToHost::Error {
            context: ErrorContext::Exec { id: 9 },
            message: "m".into(),
        };
        assert_eq!(answer_id(&failed), Some(9));
        let other = AgentToHost::Error {
            context: ErrorContext::Channel,
            message: "m".into(),
        };
        assert_eq!(answer_id(&other), None);
    }
}
