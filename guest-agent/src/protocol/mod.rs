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
//! | `exec` | `exec_output`*, then `exec_exited` (or an `error` `exec ID` if it could not start) |
//! | `read_file` | `file_chunk`*, then `file_read` (or an `error` `read_file ID`) |
//! | `processes` | `process_rows`*, then `processes_listed` (or an `error` `processes ID`) |
//!
//! The three inspection requests carry a host-chosen `id` that every answer
//! repeats. `exec` with `freeze`, `read_file` and `processes` pause every
//! running node first (`paused` for each), as `open_shell` does: they are
//! for looking at a moment in a fork the host throws away afterwards.

mod error_context;
mod frame;
mod messages;

pub mod base64;

pub use error_context::{ErrorContext, UnknownErrorContext};
pub use frame::{encode_frame, frame_payload, FrameDecoder, FrameError};
pub use messages::{
    AgentToHost, ExecSpec, ExitStatus, HostToAgent, NodeDisk, NodeSpec, ProcessRow, Stream,
    MAX_PROCESS_COMMAND, PROCESS_ROWS_PER_MESSAGE,
};

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

#[cfg(test)]
mod tests;
