//! Messages between the VMM (host) and the in-guest agent, and their framing.
//!
//! # Framing
//! The channel (virtio-console, `/dev/hvc0` in the guest) is a byte stream in
//! both directions. Each message is one **frame**: a `u32` little-endian
//! payload length, then that many bytes of UTF-8 JSON (serde). A payload
//! longer than [`MAX_FRAME_LEN`] is an error on both sides: the encoder
//! refuses to produce it and the [`FrameDecoder`] rejects it as soon as the
//! 4-byte header is in, without buffering the body.
//!
//! A frame whose payload is not a valid message (bad JSON, unknown `type`,
//! missing field) is *malformed*: the decoder drops exactly that frame and
//! stays usable, since the framing itself is intact. An oversized length
//! means the framing is lost (there is no way to find the next frame
//! boundary), so the decoder is then *poisoned*: it discards all further
//! input and keeps returning [`FrameError::TooLarge`].
//!
//! # Messages
//! JSON objects tagged by a `type` field in snake_case, e.g.
//! `{"type":"hello","version":1}`. Output bytes travel base64-encoded
//! (standard alphabet, padded) in the `data` field. Environment maps are
//! JSON objects; `BTreeMap` keeps their order deterministic.
//!
//! # Conversation
//! The agent speaks first: [`AgentToHost::Booted`] once its end of the
//! channel is in raw mode. **The host must not send anything before it has
//! received `booted`**: on a terminal (`/dev/hvc0`), input that arrives
//! before raw mode is set would be echoed back and line-edited. The host
//! then sends [`HostToAgent::Hello`]; the agent answers
//! [`AgentToHost::Ready`] with its own version and rejects anything else
//! before a matching hello. Requests are handled strictly in order; every
//! request gets at least one answer or an [`AgentToHost::Error`] naming it:
//!
//! | request | answers |
//! |---|---|
//! | (none: at start) | `booted` |
//! | `hello` | `ready` |
//! | `create_node` | `node_started` (then `output`*, `exited` when it ends) |
//! | `start_workload` | `workload_started` (then `output`* with `node: null`, `workload_exited`) |
//! | `pause` / `resume` | `paused` / `resumed` (every process of the node is stopped / continued) |
//! | `kill` | nothing immediate; `exited` once the node's PID 1 is gone |
//! | `restart` | `exited` for the running instance (if any), then `node_started` (once its disk is mounted) |
//! | `crash` | `exited` for the running instance (if any), then `disk_released` once its disk is unmounted |
//! | `mount_disk` | `disk_mounted` |
//! | `fill_disk` / `free_disk` | `disk_filled` / `disk_freed` |
//! | `step_clock` / `drift_clock` | `clock_set` (the node's realtime offset and rate now) |
//! | `shutdown` | `exited` / `workload_exited` for whatever was still running, then the agent ends |
//! | `random` | nothing: it answers the agent's `random_request` of the same id |
//!
//! Unsolicited, besides output and exits: `sdk` (a record an Antithesis SDK
//! wrote through the guest's libvoidstar shim, `detvisor-assert`, or an
//! `ANTITHESIS_SDK_LOCAL_OUTPUT` file), `history` (a `{"detvisor_history":..}`
//! line a node or the workload printed on stdout) and `random_request` (a
//! guest program waits for a value from the host's seeded stream: the host
//! answers `random` with the same id at the exit where it reads the request).
//! | `list_template` | `template_commands` (the test-composer commands of a template directory) |
//! | `start_command` | `command_started` (then `command_output`*, `command_exited`) |
//! | `kill_command` | nothing immediate; `command_exited` once it is gone (nothing if it had ended) |

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version exchanged in `hello` / `ready`; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 2;

/// Largest payload (JSON bytes, without the 4-byte length) either side
/// accepts. Output chunks are at most [`MAX_OUTPUT_CHUNK`] raw bytes, which
/// base64-encode well below this.
pub const MAX_FRAME_LEN: usize = 1 << 20;

/// Largest number of raw output bytes the agent puts in one `output` message.
pub const MAX_OUTPUT_CHUNK: usize = 64 << 10;

/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;

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
}

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
    Error { context: String, message: String },
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

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix exceeds the maximum: the stream cannot be resynced.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge { len: u64, max: usize },
    /// The frame's payload is not a valid message; the frame was dropped.
    #[error("malformed frame ({len} bytes): {reason}")]
    Malformed { len: usize, reason: String },
    /// A message could not be encoded (too large, or serialization failed).
    #[error("cannot encode message: {0}")]
    Encode(String),
}

impl FrameError {
    /// Whether the stream is lost (nothing more can be decoded from it).
    pub fn is_fatal(&self) -> bool {
        matches!(self, FrameError::TooLarge { .. })
    }
}

/// Encodes `message` as one frame (length prefix + JSON).
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(message).map_err(|e| FrameError::Encode(e.to_string()))?;
    frame_payload(&json)
}

/// Frames an already encoded payload.
pub fn frame_payload(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() > MAX_FRAME_LEN {
        return Err(FrameError::Encode(format!(
            "payload of {} bytes exceeds the maximum of {MAX_FRAME_LEN} bytes",
            payload.len()
        )));
    }
    let mut frame = Vec::with_capacity(LEN_PREFIX + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// Reassembles frames from a byte stream fed in arbitrary pieces.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    max_frame_len: usize,
    poisoned: Option<u64>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

impl FrameDecoder {
    pub fn new(max_frame_len: usize) -> Self {
        Self {
            buffer: Vec::new(),
            max_frame_len,
            poisoned: None,
        }
    }

    /// Appends bytes read from the channel. Once poisoned, input is dropped.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.poisoned.is_none() {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// Bytes buffered that do not form a complete frame yet.
    pub fn buffered_len(&self) -> usize {
        self.buffer.len()
    }

    /// The bytes buffered (a frame's beginning), to save with a snapshot:
    /// a new decoder fed with them continues exactly where this one is.
    pub fn buffered(&self) -> &[u8] {
        &self.buffer
    }

    /// Whether an oversized frame has made the stream undecodable.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// The next complete frame's payload, `None` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if let Some(len) = self.poisoned {
            return Err(self.too_large(len));
        }
        let Some(header) = self.buffer.get(..LEN_PREFIX) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(header.try_into().expect("4-byte header"));
        let len = u64::from(len);
        if len > self.max_frame_len as u64 {
            self.poisoned = Some(len);
            self.buffer = Vec::new();
            return Err(self.too_large(len));
        }
        let end = LEN_PREFIX + len as usize;
        if self.buffer.len() < end {
            return Ok(None);
        }
        let payload = self.buffer[LEN_PREFIX..end].to_vec();
        self.buffer.drain(..end);
        Ok(Some(payload))
    }

    /// The next complete message. A malformed frame is consumed and
    /// reported; calling again continues with the frame after it.
    pub fn next_message<T: DeserializeOwned>(&mut self) -> Result<Option<T>, FrameError> {
        let Some(payload) = self.next_frame()? else {
            return Ok(None);
        };
        serde_json::from_slice(&payload)
            .map(Some)
            .map_err(|e| FrameError::Malformed {
                len: payload.len(),
                reason: e.to_string(),
            })
    }

    fn too_large(&self, len: u64) -> FrameError {
        FrameError::TooLarge {
            len,
            max: self.max_frame_len,
        }
    }
}

/// Standard base64 (RFC 4648, padded) for `Vec<u8>` fields; strict on input.
pub mod base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                chunk.get(1).copied().unwrap_or(0),
                chunk.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }

    pub fn decode(text: &str) -> Result<Vec<u8>, String> {
        let input = text.as_bytes();
        if !input.len().is_multiple_of(4) {
            return Err(format!(
                "base64 length {} is not a multiple of 4",
                input.len()
            ));
        }
        let mut out = Vec::with_capacity(input.len() / 4 * 3);
        let quads = input.len() / 4;
        for (index, quad) in input.chunks(4).enumerate() {
            let last = index + 1 == quads;
            let padding = quad.iter().rev().take_while(|&&c| c == b'=').count();
            if padding > 2 || (padding > 0 && !last) {
                return Err("misplaced base64 padding".to_string());
            }
            let mut n = 0u32;
            for &c in &quad[..4 - padding] {
                let v = value(c).ok_or_else(|| format!("invalid base64 character {c:#04x}"))?;
                n = (n << 6) | v;
            }
            n <<= 6 * padding as u32;
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            let keep = 3 - padding;
            // Canonical form only: the bits that padding drops must be zero.
            if bytes[keep..].iter().any(|&b| b != 0) {
                return Err("non-canonical base64 (trailing bits set)".to_string());
            }
            out.extend_from_slice(&bytes[..keep]);
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        decode(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_host_messages() -> Vec<HostToAgent> {
        let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
        vec![
            HostToAgent::Hello { version: 1 },
            HostToAgent::CreateNode(NodeSpec {
                name: "n1".into(),
                rootfs: "/nodes/n1".into(),
                hostname: None,
                nic: Some("eth0".into()),
                address: Some("192.0.2.1/24".into()),
                env: env.clone(),
                command: vec!["sh".into(), "-c".into(), "echo hi".into()],
                disk: None,
            }),
            HostToAgent::StartWorkload {
                node: Some("n1".into()),
                command: vec!["true".into()],
                env,
            },
            HostToAgent::Pause { node: "n1".into() },
            HostToAgent::Resume { node: "n1".into() },
            HostToAgent::Kill {
                node: "n1".into(),
                signal: 9,
            },
            HostToAgent::Restart { node: "n1".into() },
            HostToAgent::StepClock {
                node: "n1".into(),
                by_ns: -2_000_000_000,
            },
            HostToAgent::DriftClock {
                node: "n1".into(),
                ppm: 200,
            },
            HostToAgent::Shutdown,
            HostToAgent::OpenShell {
                node: Some("n1".into()),
                rows: 24,
                cols: 80,
                term: Some("xterm".into()),
            },
            HostToAgent::ShellInput {
                data: b"ls\r\x04".to_vec(),
            },
            HostToAgent::Random {
                id: 3,
                value: u64::MAX,
            },
            HostToAgent::ListTemplate {
                node: "n1".into(),
                template: "t".into(),
            },
            HostToAgent::StartCommand {
                id: 3,
                node: "n1".into(),
                template: "t".into(),
                command: "parallel_driver_a.sh".into(),
                env: BTreeMap::new(),
            },
            HostToAgent::KillCommand { id: 3 },
        ]
    }

    fn sample_agent_messages() -> Vec<AgentToHost> {
        vec![
            AgentToHost::Booted { version: 1 },
            AgentToHost::Ready { version: 1 },
            AgentToHost::NodeStarted {
                name: "n1".into(),
                pid: 42,
            },
            AgentToHost::WorkloadStarted { node: None, pid: 7 },
            AgentToHost::Output {
                node: Some("n1".into()),
                stream: Stream::Stderr,
                data: (0..=255).collect(),
            },
            AgentToHost::Exited {
                node: "n1".into(),
                status: ExitStatus::Signal(9),
            },
            AgentToHost::WorkloadExited {
                status: ExitStatus::Code(3),
            },
            AgentToHost::Paused { node: "n1".into() },
            AgentToHost::Resumed { node: "n1".into() },
            AgentToHost::ClockSet {
                node: "n1".into(),
                offset_ns: 30_000_000_000,
                rate_ppm: -50,
            },
            AgentToHost::ShellOpened { pid: 9 },
            AgentToHost::ShellOutput {
                data: b"# \x1b[0m".to_vec(),
            },
            AgentToHost::ShellExited {
                status: ExitStatus::Code(0),
            },
            AgentToHost::Error {
                context: "kill n9".into(),
                message: "no such node".into(),
            },
            AgentToHost::Sdk {
                node: Some("n1".into()),
                json: r#"{"antithesis_setup":{"status":"complete","details":null}}"#.into(),
            },
            AgentToHost::History {
                node: None,
                json: r#"{"detvisor_history":{"process":1}}"#.into(),
            },
            AgentToHost::RandomRequest {
                node: Some("n2".into()),
                id: 7,
            },
            AgentToHost::TemplateCommands {
                template: "t".into(),
                commands: vec!["first_a".into(), "parallel_driver_b".into()],
            },
            AgentToHost::CommandStarted { id: 3, pid: 77 },
            AgentToHost::CommandOutput {
                id: 3,
                stream: Stream::Stdout,
                data: b"x\n".to_vec(),
            },
            AgentToHost::CommandExited {
                id: 3,
                status: ExitStatus::Code(1),
            },
        ]
    }

    fn stream_of<T: Serialize>(messages: &[T]) -> Vec<u8> {
        messages
            .iter()
            .flat_map(|m| encode_frame(m).unwrap())
            .collect()
    }

    #[test]
    fn test_frame_has_le_length_prefix_and_tagged_json() {
        // Act
        let frame = encode_frame(&HostToAgent::Hello { version: 1 }).unwrap();

        // Assert
        let json = br#"{"type":"hello","version":1}"#;
        assert_eq!(frame[..4], (json.len() as u32).to_le_bytes());
        assert_eq!(&frame[4..], json);
    }

    #[test]
    fn test_wire_format_examples() {
        // Arrange
        let output = AgentToHost::Output {
            node: None,
            stream: Stream::Stdout,
            data: b"hi\n".to_vec(),
        };
        let exited = AgentToHost::Exited {
            node: "n1".into(),
            status: ExitStatus::Code(0),
        };

        // Act
        let output_json = serde_json::to_string(&output).unwrap();
        let exited_json = serde_json::to_string(&exited).unwrap();
        let create: HostToAgent = serde_json::from_str(
            r#"{"type":"create_node","name":"n1","rootfs":"/n1","command":["sh"]}"#,
        )
        .unwrap();

        // Assert
        assert_eq!(
            output_json,
            r#"{"type":"output","node":null,"stream":"stdout","data":"aGkK"}"#
        );
        assert_eq!(
            exited_json,
            r#"{"type":"exited","node":"n1","status":{"code":0}}"#
        );
        assert_eq!(
            create,
            HostToAgent::CreateNode(NodeSpec {
                name: "n1".into(),
                rootfs: "/n1".into(),
                hostname: None,
                nic: None,
                address: None,
                env: BTreeMap::new(),
                command: vec!["sh".into()],
                disk: None,
            })
        );
    }

    #[test]
    fn test_every_message_round_trips() {
        // Arrange
        let host = sample_host_messages();
        let agent = sample_agent_messages();
        let mut host_decoder = FrameDecoder::default();
        let mut agent_decoder = FrameDecoder::default();

        // Act
        host_decoder.push(&stream_of(&host));
        agent_decoder.push(&stream_of(&agent));
        let host_back: Vec<HostToAgent> =
            std::iter::from_fn(|| host_decoder.next_message().unwrap()).collect();
        let agent_back: Vec<AgentToHost> =
            std::iter::from_fn(|| agent_decoder.next_message().unwrap()).collect();

        // Assert
        assert_eq!(host_back, host);
        assert_eq!(agent_back, agent);
        assert_eq!(host_decoder.buffered_len(), 0);
    }

    #[test]
    fn test_decoding_split_at_every_byte_gives_the_same_messages() {
        // Arrange
        let messages = sample_agent_messages();
        let stream = stream_of(&messages);

        for split in 0..=stream.len() {
            // Act: two pieces, split at `split`.
            let mut decoder = FrameDecoder::default();
            let mut decoded: Vec<AgentToHost> = Vec::new();
            for piece in [&stream[..split], &stream[split..]] {
                decoder.push(piece);
                while let Some(message) = decoder.next_message().unwrap() {
                    decoded.push(message);
                }
            }

            // Assert
            assert_eq!(decoded, messages, "split at {split}");
            assert_eq!(decoder.buffered_len(), 0);
        }
    }

    #[test]
    fn test_decoding_one_byte_at_a_time() {
        // Arrange
        let messages = sample_host_messages();
        let stream = stream_of(&messages);
        let mut decoder = FrameDecoder::default();
        let mut decoded: Vec<HostToAgent> = Vec::new();

        // Act
        for byte in &stream {
            decoder.push(std::slice::from_ref(byte));
            while let Some(message) = decoder.next_message().unwrap() {
                decoded.push(message);
            }
        }

        // Assert
        assert_eq!(decoded, messages);
    }

    #[test]
    fn test_partial_frame_waits_for_more_bytes() {
        // Arrange
        let frame = encode_frame(&HostToAgent::Shutdown).unwrap();
        let mut decoder = FrameDecoder::default();

        // Act
        decoder.push(&frame[..3]);
        let no_header = decoder.next_frame();
        decoder.push(&frame[3..frame.len() - 1]);
        let no_body = decoder.next_frame();
        decoder.push(&frame[frame.len() - 1..]);
        let message: Option<HostToAgent> = decoder.next_message().unwrap();

        // Assert
        assert_eq!(no_header, Ok(None));
        assert_eq!(no_body, Ok(None));
        assert_eq!(message, Some(HostToAgent::Shutdown));
    }

    #[test]
    fn test_oversized_length_is_rejected_at_the_header_and_poisons() {
        // Arrange
        let mut decoder = FrameDecoder::new(1000);
        let mut stream = 1001u32.to_le_bytes().to_vec();
        stream.extend_from_slice(&encode_frame(&HostToAgent::Shutdown).unwrap());

        // Act
        decoder.push(&stream[..4]);
        let first = decoder.next_frame();
        decoder.push(&stream[4..]);
        let second = decoder.next_message::<HostToAgent>();

        // Assert
        let expected = FrameError::TooLarge {
            len: 1001,
            max: 1000,
        };
        assert_eq!(first, Err(expected.clone()));
        assert!(expected.is_fatal());
        assert_eq!(second, Err(expected));
        assert!(decoder.is_poisoned());
        assert_eq!(decoder.buffered_len(), 0);
    }

    #[test]
    fn test_malformed_frame_is_dropped_and_the_next_one_decodes() {
        // Arrange
        let mut stream = Vec::new();
        for bad in [
            &b"not json"[..],
            br#"{"type":"no_such_message"}"#,
            br#"{"type":"kill","node":"n1"}"#,
            br#"{"type":"hello","version":1} trailing"#,
            b"",
        ] {
            stream.extend_from_slice(&frame_payload(bad).unwrap());
        }
        stream.extend_from_slice(&encode_frame(&HostToAgent::Shutdown).unwrap());
        let mut decoder = FrameDecoder::default();
        decoder.push(&stream);

        // Act
        let results: Vec<_> = (0..6)
            .map(|_| decoder.next_message::<HostToAgent>())
            .collect();

        // Assert
        for result in &results[..5] {
            match result {
                Err(error @ FrameError::Malformed { .. }) => assert!(!error.is_fatal()),
                other => panic!("expected a malformed-frame error, got {other:?}"),
            }
        }
        assert_eq!(results[5], Ok(Some(HostToAgent::Shutdown)));
    }

    #[test]
    fn test_garbage_input_never_panics_and_ends_in_errors() {
        // Arrange: a fixed pseudo-random byte stream (xorshift).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let garbage: Vec<u8> = (0..64 << 10)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for max in [16, 4096, MAX_FRAME_LEN] {
            let mut decoder = FrameDecoder::new(max);
            let mut errors = 0;

            // Act
            for piece in garbage.chunks(997) {
                decoder.push(piece);
                loop {
                    match decoder.next_message::<HostToAgent>() {
                        Ok(Some(message)) => panic!("garbage decoded as {message:?}"),
                        Ok(None) => break,
                        Err(error) => {
                            errors += 1;
                            if error.is_fatal() {
                                break;
                            }
                        }
                    }
                }
                if decoder.is_poisoned() {
                    break;
                }
            }

            // Assert
            assert!(errors > 0, "max {max}");
            assert!(decoder.buffered_len() <= max + LEN_PREFIX);
        }
    }

    #[test]
    fn test_encoder_refuses_oversized_payload() {
        // Arrange
        let big = AgentToHost::Output {
            node: None,
            stream: Stream::Stdout,
            data: vec![0; MAX_FRAME_LEN],
        };

        // Act
        let result = encode_frame(&big);

        // Assert
        assert!(matches!(result, Err(FrameError::Encode(_))));
    }

    #[test]
    fn test_max_output_chunk_fits_in_a_frame() {
        // Arrange
        let chunk = AgentToHost::Output {
            node: Some("x".repeat(255)),
            stream: Stream::Stderr,
            data: vec![0xff; MAX_OUTPUT_CHUNK],
        };

        // Act
        let frame = encode_frame(&chunk).unwrap();

        // Assert
        assert!(frame.len() < MAX_FRAME_LEN);
    }

    #[test]
    fn test_base64_matches_rfc4648_vectors_and_round_trips() {
        // Arrange
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        let all: Vec<u8> = (0..=255).chain((0..=255).rev()).collect();

        // Act + Assert
        for (plain, encoded) in vectors {
            assert_eq!(base64::encode(plain.as_bytes()), encoded);
            assert_eq!(base64::decode(encoded).unwrap(), plain.as_bytes());
        }
        for len in 0..all.len() {
            assert_eq!(
                base64::decode(&base64::encode(&all[..len])).unwrap(),
                &all[..len]
            );
        }
    }

    #[test]
    fn test_base64_rejects_invalid_input() {
        for bad in [
            "Zg=", "Zg=a", "Z===", "Zh==", "Zm9v!A==", "Zg==Zg==", "Zm 9",
        ] {
            assert!(base64::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_exit_status_shell_code() {
        assert_eq!(ExitStatus::Code(3).shell_code(), 3);
        assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
    }
}
