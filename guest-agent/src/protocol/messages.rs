//! The messages both ways, tagged by `type` (see the module's table).

use super::{base64, ErrorContext};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the host asks the agent to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostToAgent {
    /// First message; the agent answers `ready` if `version` matches.
    Hello { version: u32 },
    /// Create a node (container) and start its command.
    CreateNode(NodeSpec),
    /// Start the run's workload, in the root namespaces (`node: None`) or
    /// inside a running node (like `nsenter`). Its exit status is the run's.
    StartWorkload {
        #[serde(default)]
        node: Option<String>,
        command: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// Stop (SIGSTOP) every process of the node.
    Pause { node: String },
    /// Continue (SIGCONT) every process of the node.
    Resume { node: String },
    /// Send `signal` (a Linux signal number, e.g. 9) to the node's PID 1.
    /// When PID 1 dies, the kernel kills every other process of the node.
    Kill { node: String, signal: i32 },
    /// Kill the node (SIGKILL) if it runs, then start its command again in
    /// fresh PID/mount/UTS/IPC namespaces; the network namespace (NIC,
    /// addresses) and the root filesystem directory are kept.
    Restart { node: String },
    /// Kill the node (SIGKILL) if it runs; once every process of it is gone
    /// its disk's file system is unmounted (it is mounted in the node's
    /// mount namespace only), which the agent reports (`disk_released`): the
    /// host discards the disk's writes from the crash until then, so nothing
    /// the guest's page cache held for that file system reaches it. The node
    /// stays down.
    Crash { node: String },
    /// After a crash: the disk takes writes again, so the node may mount it
    /// (it does when it starts; ext4's journal recovery then runs on what
    /// was flushed). A `restart` that came meanwhile starts the node now.
    MountDisk { node: String },
    /// Fill the free space of the node's disk with a file
    /// (`<data>/.detvisor-full`), so that writes fail with ENOSPC.
    FillDisk { node: String },
    /// Remove the file `fill_disk` made.
    FreeDisk { node: String },
    /// Step the node's CLOCK_REALTIME by `by_ns` nanoseconds (negative:
    /// back). Its time namespace keeps it across restarts; monotonic and
    /// boot time do not move.
    StepClock { node: String, by_ns: i64 },
    /// The node's CLOCK_REALTIME runs `ppm` parts per million fast
    /// (negative: slow) from now on; 0 stops the drift and keeps the
    /// offset gained so far.
    DriftClock { node: String, ppm: i32 },
    /// Kill everything and end the agent.
    Shutdown,
    /// An interactive shell on a new pseudo-terminal, for a user looking
    /// into a fork of a run (`detvisor shell`). Every running node is paused
    /// first (SIGSTOP), so what the user sees stays that moment. In the root
    /// namespaces (`node: None`) or inside a running node (its `/bin/sh`).
    /// One shell at a time; `shell_input` feeds it.
    OpenShell {
        #[serde(default)]
        node: Option<String>,
        /// The user's terminal size (0: leave the default).
        #[serde(default)]
        rows: u16,
        #[serde(default)]
        cols: u16,
        /// `TERM` for the shell (default `vt100`).
        #[serde(default)]
        term: Option<String>,
    },
    /// Bytes typed into the open shell's terminal.
    ShellInput {
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// Mix `bytes` into the kernel's entropy pool, credited as entropy
    /// (`RNDADDENTROPY`), and reseed the kernel's CRNG from it now
    /// (`RNDRESEEDCRNG`). Sent at a branch only for a kernel whose CRNG the
    /// VMM cannot re-key in guest memory itself (no `base_crng` symbol:
    /// `vmm::guest_crng`), so it is late: processes that run before the
    /// agent reads it still draw the parent's bytes. Accepted before
    /// `hello` too.
    Reseed {
        #[serde(with = "base64")]
        bytes: Vec<u8>,
    },
    /// The answer to the agent's `random_request` `id`: a value of the
    /// host's seeded SDK stream, for the guest program waiting on it.
    Random { id: u64, value: u64 },
    /// List the test-composer template `/opt/antithesis/test/v1/<template>/`
    /// as node `node` sees its root: answered by `template_commands`.
    ListTemplate { node: String, template: String },
    /// Start the template's command `command` (a file name listed by
    /// `template_commands`) inside node `node`, as a workload is started;
    /// `id` names this run of it in the answers (unique per run).
    StartCommand {
        id: u32,
        node: String,
        template: String,
        command: String,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// SIGKILL command run `id`'s process group (its `command_exited` follows).
    KillCommand { id: u32 },
    /// Run a command to its end and report what it printed (`exec_output`*,
    /// then `exec_exited` with the same `id`): inside a running node's
    /// namespaces (like `nsenter`), or in the root namespaces (`node:
    /// None`). With `freeze`, every running node is paused first (as
    /// `open_shell` does) so the command sees that moment; without, no
    /// node is touched. The command is SIGKILLed (its process group) once
    /// `timeout_ns` of the guest's monotonic time has passed. Of each
    /// stream the first `output_limit` bytes are sent, the rest counted.
    Exec(ExecSpec),
    /// Every running node paused, then a node's file (as the node sees it:
    /// resolved inside its root) or a file of the guest (`node: None`)
    /// read: `file_chunk`* then `file_read`, its first `limit` bytes.
    ReadFile {
        id: u64,
        #[serde(default)]
        node: Option<String>,
        path: String,
        limit: u64,
    },
    /// Every running node paused, then the processes of a node (PIDs as
    /// its PID namespace sees them) or of the whole guest (`node: None`),
    /// read from /proc: `process_rows`*, then `processes_listed`.
    Processes {
        id: u64,
        #[serde(default)]
        node: Option<String>,
    },
}

/// What `exec` runs, where and how (see [`HostToAgent::Exec`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Names this request in the answers (the host's; unique per request).
    pub id: u64,
    #[serde(default)]
    pub node: Option<String>,
    /// argv; `argv[0]` without a `/` is looked up in `PATH`.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Pause every running node before the command starts.
    pub freeze: bool,
    /// Guest monotonic nanoseconds before the command is killed (> 0).
    pub timeout_ns: u64,
    /// Bytes of each stream sent (the rest is counted, not sent).
    pub output_limit: u64,
}

impl ExecSpec {
    /// Why the request cannot be run as it stands, before anything starts.
    pub fn check(&self) -> Result<(), String> {
        if self.command.first().is_none_or(String::is_empty) {
            return Err("exec: empty command".to_string());
        }
        if self.timeout_ns == 0 {
            return Err("exec: a timeout of 0 ns".to_string());
        }
        Ok(())
    }
}

/// One process, as `processes` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRow {
    /// As seen in the node's PID namespace (the guest's for `node: None`).
    pub pid: i32,
    /// The parent's PID in the same namespace; 0 when the parent is
    /// outside it (a node's PID 1, whose parent is the agent).
    pub ppid: i32,
    /// `/proc/PID/stat`'s state letter (`R`, `S`, `T` for a paused node...).
    pub state: char,
    /// `comm`: the kernel's name for it (at most 15 bytes).
    pub name: String,
    /// `/proc/PID/cmdline`'s arguments (empty for a kernel thread or a
    /// zombie), cut to [`MAX_PROCESS_COMMAND`] bytes in all.
    pub command: Vec<String>,
}

/// The most bytes of arguments a [`ProcessRow`] carries (so that a batch
/// of rows always fits in a frame, even JSON-escaped six times over).
pub const MAX_PROCESS_COMMAND: usize = 4096;
/// Rows per `process_rows` message.
pub const PROCESS_ROWS_PER_MESSAGE: usize = 8;

/// One node: a container with its own namespaces and root directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Unique; tags the node's output. Also the default hostname.
    pub name: String,
    /// Absolute path of the node's root directory inside the guest image.
    pub rootfs: String,
    /// Hostname inside the node; `None`: the node's name.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Network interface (in the agent's namespace) moved into the node.
    #[serde(default)]
    pub nic: Option<String>,
    /// IPv4 address with prefix length for `nic`, e.g. `192.0.2.1/24`.
    #[serde(default)]
    pub address: Option<String>,
    /// The command's whole environment (`PATH` defaults to
    /// `/usr/sbin:/usr/bin:/sbin:/bin` when absent).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// argv; `argv[0]` without a `/` is looked up in the node's `PATH`.
    pub command: Vec<String>,
    /// The node's data disk, mounted before the command starts.
    #[serde(default)]
    pub disk: Option<NodeDisk>,
}

/// A node's data disk: the virtio-blk disk whose serial
/// (`/sys/block/vdX/serial`) is `serial`, an ext4 file system mounted at
/// `mount` inside the node's root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDisk {
    pub serial: String,
    pub mount: String,
}

/// What the agent reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentToHost {
    /// The agent's first frame, unsolicited: the channel is open and in raw
    /// mode. The host must send nothing before it has received this (bytes
    /// that reach a terminal before raw mode are echoed and mangled).
    Booted { version: u32 },
    /// Answer to `hello`.
    Ready { version: u32 },
    /// A node's command runs; `pid` is its PID in the agent's namespace (it
    /// is PID 1 inside the node).
    NodeStarted { name: String, pid: i32 },
    /// The workload runs; `pid` in the agent's namespace.
    WorkloadStarted {
        #[serde(default)]
        node: Option<String>,
        pid: i32,
    },
    /// A chunk of output, as one `read` returned it. `node: None` is the
    /// workload's output (wherever it runs).
    Output {
        #[serde(default)]
        node: Option<String>,
        stream: Stream,
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// A node's PID 1 ended (all of its output was sent before this).
    Exited { node: String, status: ExitStatus },
    /// The workload ended (its output read so far was sent before this).
    WorkloadExited { status: ExitStatus },
    /// Answer to `pause`: every process of the node has been sent SIGSTOP.
    Paused { node: String },
    /// Answer to `resume`: every process of the node has been sent SIGCONT.
    Resumed { node: String },
    /// After `crash`: the node's processes are gone and its file system
    /// unmounted.
    DiskReleased { node: String },
    /// Answer to `mount_disk`: the node may mount its disk again.
    DiskMounted { node: String },
    /// Answer to `fill_disk`: the filler file's size.
    DiskFilled { node: String, bytes: u64 },
    /// Answer to `free_disk`.
    DiskFreed { node: String },
    /// Answer to `step_clock` and `drift_clock`: the node's realtime offset
    /// from the guest's now (drift included) and its rate, as the kernel
    /// reports them.
    ClockSet {
        node: String,
        offset_ns: i64,
        rate_ppm: i32,
    },
    /// Answer to `open_shell`: the shell runs; `pid` in the agent's namespace.
    ShellOpened { pid: i32 },
    /// What the shell's terminal printed (echo of the input included).
    ShellOutput {
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// The shell ended (its terminal's output was sent before this, up to
    /// 64 reads of what was still buffered at the end).
    ShellExited { status: ExitStatus },
    /// A request failed, or something went wrong on the agent's side.
    /// `context` names the request (e.g. `create_node n1`) or the subsystem.
    Error {
        context: ErrorContext,
        message: String,
    },
    /// One record an Antithesis SDK wrote (a JSON object, as the guest
    /// wrote it: the host parses it), from node `node` (`None`: the root
    /// namespaces' socket, i.e. a workload that runs outside every node).
    Sdk {
        #[serde(default)]
        node: Option<String>,
        json: String,
    },
    /// One `{"detvisor_history":{..}}` line of stdout (without its newline)
    /// of node `node` (`None`: the workload's stdout).
    History {
        #[serde(default)]
        node: Option<String>,
        json: String,
    },
    /// A guest program on node `node` waits for a random value; the host
    /// answers `random` with this `id` (ids are the agent's, increasing).
    RandomRequest {
        #[serde(default)]
        node: Option<String>,
        id: u64,
    },
    /// Answer to `list_template`: the template's commands, sorted by name,
    /// `helper_` files left out.
    TemplateCommands {
        template: String,
        commands: Vec<String>,
    },
    /// A template command runs; `pid` in the agent's namespace.
    CommandStarted { id: u32, pid: i32 },
    /// A chunk of a template command's output.
    CommandOutput {
        id: u32,
        stream: Stream,
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// A template command ended (its output read so far was sent before this).
    CommandExited { id: u32, status: ExitStatus },
    /// A chunk of an `exec`'s output (only bytes within its limit).
    ExecOutput {
        id: u64,
        stream: Stream,
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// The `exec` ended: its status, each stream's whole size (what was
    /// sent is its first `output_limit` bytes), and whether its timeout
    /// killed it. A command that could not start is an `error` instead
    /// (context `exec ID`).
    ExecExited {
        id: u64,
        status: ExitStatus,
        stdout_bytes: u64,
        stderr_bytes: u64,
        timed_out: bool,
    },
    /// A chunk of a `read_file`'s bytes, in order.
    FileChunk {
        id: u64,
        #[serde(with = "base64")]
        data: Vec<u8>,
    },
    /// The `read_file` is done: the file's whole size (the chunks hold its
    /// first `limit` bytes).
    FileRead { id: u64, size: u64 },
    /// Rows of a `processes` answer, in PID order.
    ProcessRows { id: u64, rows: Vec<ProcessRow> },
    /// The `processes` answer is complete: `count` rows were sent.
    ProcessesListed { id: u64, count: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// `exit(code)`; `{"code": 0}`.
    Code(i32),
    /// Killed by a signal; `{"signal": 9}`.
    Signal(i32),
}

impl ExitStatus {
    /// The shell's convention: the code, or 128 + the signal number.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(code) => code,
            // A misbehaving peer may send any number: never overflow.
            ExitStatus::Signal(signal) => 128i32.saturating_add(signal),
        }
    }
}

impl HostToAgent {
    /// The context an error answering this request names.
    pub fn error_context(&self) -> ErrorContext {
        match self {
            HostToAgent::Hello { .. } => ErrorContext::Hello,
            HostToAgent::CreateNode(spec) => ErrorContext::CreateNode {
                node: spec.name.clone(),
            },
            HostToAgent::StartWorkload { .. } => ErrorContext::StartWorkload,
            HostToAgent::Pause { node } => ErrorContext::Pause { node: node.clone() },
            HostToAgent::Resume { node } => ErrorContext::Resume { node: node.clone() },
            HostToAgent::Kill { node, .. } => ErrorContext::Kill { node: node.clone() },
            HostToAgent::Restart { node } => ErrorContext::Restart { node: node.clone() },
            HostToAgent::Crash { node } => ErrorContext::Crash { node: node.clone() },
            HostToAgent::MountDisk { node } => ErrorContext::MountDisk { node: node.clone() },
            HostToAgent::FillDisk { node } => ErrorContext::FillDisk { node: node.clone() },
            HostToAgent::FreeDisk { node } => ErrorContext::FreeDisk { node: node.clone() },
            HostToAgent::StepClock { node, .. } => ErrorContext::StepClock { node: node.clone() },
            HostToAgent::DriftClock { node, .. } => ErrorContext::DriftClock { node: node.clone() },
            HostToAgent::Shutdown => ErrorContext::Shutdown,
            HostToAgent::OpenShell { .. } => ErrorContext::OpenShell,
            HostToAgent::ShellInput { .. } => ErrorContext::ShellInput,
            HostToAgent::Reseed { .. } => ErrorContext::Reseed,
            HostToAgent::Random { id, .. } => ErrorContext::Random { id: *id },
            HostToAgent::ListTemplate { template, .. } => ErrorContext::ListTemplate {
                template: template.clone(),
            },
            HostToAgent::StartCommand { command, .. } => ErrorContext::StartCommand {
                command: command.clone(),
            },
            HostToAgent::KillCommand { id } => ErrorContext::KillCommand { id: *id },
            HostToAgent::Exec(spec) => ErrorContext::Exec { id: spec.id },
            HostToAgent::ReadFile { id, .. } => ErrorContext::ReadFile { id: *id },
            HostToAgent::Processes { id, .. } => ErrorContext::Processes { id: *id },
        }
    }
}
