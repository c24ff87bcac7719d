//! The agent's side of the Antithesis SDKs: the Unix sockets the guest's
//! `libvoidstar.so` shim (agent/shim/libvoidstar.c) and `detvisor-assert`
//! write to, and the frames they send.
//!
//! # Sockets and identity
//! One listening socket per node, `<dir>/nodes/<name>/sdk.sock`, whose
//! directory the node's mount namespace sees as `/run/detvisor` (see
//! `container`), and one for the root namespaces, `<dir>/sdk.sock`
//! (`<dir>` is `/run/detvisor` in a guest). The socket a connection came in
//! on names the node of its records: a workload started inside a node uses
//! that node's socket. `<dir>/libvoidstar.so` is the shim every node gets
//! bind-mounted at `/usr/lib/libvoidstar.so`.
//!
//! # Frames (shim to agent)
//! `u32` little-endian length of what follows, then a kind byte, then the
//! payload: [`KIND_JSON`] (a record, at most [`MAX_RECORD_LEN`] bytes of
//! UTF-8), [`KIND_FLUSH`] and [`KIND_RANDOM`] (no payload). A random
//! request is answered with 8 bytes (a little-endian `u64`) once the host
//! has sent the value. A bad frame (length 0 or too long, unknown kind, a
//! payload where none belongs, a record that is not UTF-8) closes that
//! connection and is reported to the host as an `error`; the agent goes on.
//!
//! Connections are non-blocking: a client that stops reading loses its
//! connection when an answer cannot be written at once, and never stalls
//! the agent's loop.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The shim, as built by build.rs.
pub const SHIM: &[u8] = include_bytes!(env!("DETVISOR_SHIM_PATH"));

/// Kind byte of a JSON record.
pub const KIND_JSON: u8 = 1;
/// Kind byte of a flush (nothing to do: records are forwarded at once).
pub const KIND_FLUSH: u8 = 2;
/// Kind byte of a random request.
pub const KIND_RANDOM: u8 = 3;

/// Largest record accepted. Forwarded inside a JSON string whose escaping
/// may grow it up to six times, it must stay under the channel's frame
/// limit (1 MiB); the shim drops longer records itself.
pub const MAX_RECORD_LEN: usize = 128 << 10;

/// Random requests one connection may have waiting (a well-behaved client
/// has one); more close it.
const MAX_PENDING_RANDOM: usize = 64;

/// Connections open at once (all sockets); the next one is refused.
const MAX_CONNECTIONS: usize = 256;

/// One frame from a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShimFrame {
    Json(String),
    Flush,
    Random,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShimFrameError {
    #[error("frame length {len} is outside 1..={max}")]
    BadLength { len: u32, max: usize },
    #[error("unknown frame kind {kind}")]
    UnknownKind { kind: u8 },
    #[error("frame kind {kind} carries {len} payload bytes, expected none")]
    UnexpectedPayload { kind: u8, len: usize },
    #[error("a record is not UTF-8 (at byte {valid_up_to})")]
    NotUtf8 { valid_up_to: usize },
}

/// Frames from one connection's byte stream. After an error the
/// connection must be closed (the stream cannot be trusted any more).
#[derive(Debug, Default)]
pub struct ShimDecoder {
    buffer: Vec<u8>,
}

impl ShimDecoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` if more bytes are needed. The
    /// length is checked as soon as the header is in, so at most one
    /// frame's worth is ever buffered.
    pub fn next_frame(&mut self) -> Result<Option<ShimFrame>, ShimFrameError> {
        let Some(header) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(header.try_into().expect("4 bytes"));
        let max = MAX_RECORD_LEN + 1;
        if len == 0 || len as usize > max {
            return Err(ShimFrameError::BadLength { len, max });
        }
        let end = 4 + len as usize;
        if self.buffer.len() < end {
            return Ok(None);
        }
        let kind = self.buffer[4];
        let payload: Vec<u8> = self.buffer[5..end].to_vec();
        self.buffer.drain(..end);
        match kind {
            KIND_JSON => String::from_utf8(payload)
                .map(|text| Some(ShimFrame::Json(text)))
                .map_err(|e| ShimFrameError::NotUtf8 {
                    valid_up_to: e.utf8_error().valid_up_to(),
                }),
            KIND_FLUSH | KIND_RANDOM if !payload.is_empty() => {
                Err(ShimFrameError::UnexpectedPayload {
                    kind,
                    len: payload.len(),
                })
            }
            KIND_FLUSH => Ok(Some(ShimFrame::Flush)),
            KIND_RANDOM => Ok(Some(ShimFrame::Random)),
            kind => Err(ShimFrameError::UnknownKind { kind }),
        }
    }
}

/// Encodes one frame (for `detvisor-assert` and tests).
pub fn encode_shim_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    frame.push(kind);
    frame.extend_from_slice(payload);
    frame
}

/// What a client asked for, for the agent to pass on to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SdkEvent {
    Record {
        node: Option<String>,
        json: String,
    },
    RandomRequest {
        node: Option<String>,
        id: u64,
    },
    /// A connection sent a bad frame and was closed.
    BadClient {
        node: Option<String>,
        message: String,
    },
}

#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    node: Option<String>,
    decoder: ShimDecoder,
    pending_random: usize,
}

/// Which descriptor of the SDK server is ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SdkReady {
    Listener(Option<String>),
    Connection(u64),
}

/// The listening sockets and the open connections.
#[derive(Debug)]
pub struct SdkServer {
    dir: PathBuf,
    listeners: BTreeMap<Option<String>, UnixListener>,
    connections: BTreeMap<u64, Connection>,
    next_connection: u64,
    next_random: u64,
    /// Random request id -> the connection waiting for it.
    waiting: BTreeMap<u64, u64>,
}

impl SdkServer {
    /// Creates `dir` with the shim in it and the root namespaces' socket.
    pub fn start(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir.join("nodes"))?;
        let shim = dir.join("libvoidstar.so");
        std::fs::write(&shim, SHIM)?;
        set_mode(&shim, 0o755)?;
        let mut server = SdkServer {
            dir: dir.to_path_buf(),
            listeners: BTreeMap::new(),
            connections: BTreeMap::new(),
            next_connection: 0,
            next_random: 0,
            waiting: BTreeMap::new(),
        };
        server.listen(None)?;
        Ok(server)
    }

    /// The shim's file.
    pub fn shim_path(&self) -> PathBuf {
        self.dir.join("libvoidstar.so")
    }

    /// The directory node `node`'s mount namespace sees as /run/detvisor.
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }

    /// Listens on node `node`'s socket (kept across the node's restarts).
    pub fn add_node(&mut self, node: &str) -> io::Result<()> {
        if self.listeners.contains_key(&Some(node.to_string())) {
            return Ok(());
        }
        std::fs::create_dir_all(self.node_dir(node))?;
        self.listen(Some(node.to_string()))
    }

    fn listen(&mut self, node: Option<String>) -> io::Result<()> {
        let path = match &node {
            Some(name) => self.node_dir(name).join("sdk.sock"),
            None => self.dir.join("sdk.sock"),
        };
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        set_mode(&path, 0o777)?;
        self.listeners.insert(node, listener);
        Ok(())
    }

    /// Every descriptor to poll for input, in a fixed order.
    pub fn interest(&self) -> Vec<(BorrowedFd<'_>, SdkReady)> {
        let listeners = self
            .listeners
            .iter()
            .map(|(node, l)| (l.as_fd(), SdkReady::Listener(node.clone())));
        let connections = self
            .connections
            .iter()
            .map(|(id, c)| (c.stream.as_fd(), SdkReady::Connection(*id)));
        listeners.chain(connections).collect()
    }

    /// Serves one ready descriptor; what clients asked for goes to `events`.
    pub fn serve(&mut self, ready: &SdkReady, events: &mut Vec<SdkEvent>) {
        match ready {
            SdkReady::Listener(node) => self.accept(node, events),
            SdkReady::Connection(id) => self.read(*id, events),
        }
    }

    fn accept(&mut self, node: &Option<String>, events: &mut Vec<SdkEvent>) {
        let Some(listener) = self.listeners.get(node) else {
            return;
        };
        // A bounded number per wake-up: the loop serves others in between.
        for _ in 0..16 {
            match listener.accept() {
                Ok((stream, _)) => {
                    if self.connections.len() >= MAX_CONNECTIONS
                        || stream.set_nonblocking(true).is_err()
                    {
                        events.push(SdkEvent::BadClient {
                            node: node.clone(),
                            message: format!(
                                "connection refused: {MAX_CONNECTIONS} are open already"
                            ),
                        });
                        continue;
                    }
                    let id = self.next_connection;
                    self.next_connection += 1;
                    self.connections.insert(
                        id,
                        Connection {
                            stream,
                            node: node.clone(),
                            decoder: ShimDecoder::default(),
                            pending_random: 0,
                        },
                    );
                }
                Err(_) => return,
            }
        }
    }

    fn read(&mut self, id: u64, events: &mut Vec<SdkEvent>) {
        let Some(connection) = self.connections.get_mut(&id) else {
            return;
        };
        let mut buffer = [0u8; 16 << 10];
        let mut closed = false;
        // Bounded per wake-up, like the output pipes.
        for _ in 0..16 {
            match connection.stream.read(&mut buffer) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => connection.decoder.push(&buffer[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        let node = connection.node.clone();
        loop {
            let connection = self.connections.get_mut(&id).expect("still open");
            match connection.decoder.next_frame() {
                Ok(None) => break,
                Ok(Some(ShimFrame::Flush)) => {}
                Ok(Some(ShimFrame::Json(json))) => events.push(SdkEvent::Record {
                    node: node.clone(),
                    json,
                }),
                Ok(Some(ShimFrame::Random)) => {
                    if connection.pending_random >= MAX_PENDING_RANDOM {
                        self.close(id);
                        events.push(SdkEvent::BadClient {
                            node,
                            message: format!(
                                "more than {MAX_PENDING_RANDOM} random requests waiting"
                            ),
                        });
                        return;
                    }
                    connection.pending_random += 1;
                    let request = self.next_random;
                    self.next_random += 1;
                    self.waiting.insert(request, id);
                    events.push(SdkEvent::RandomRequest {
                        node: node.clone(),
                        id: request,
                    });
                }
                Err(error) => {
                    self.close(id);
                    events.push(SdkEvent::BadClient {
                        node,
                        message: error.to_string(),
                    });
                    return;
                }
            }
        }
        if closed {
            self.close(id);
        }
    }

    fn close(&mut self, id: u64) {
        self.connections.remove(&id);
        self.waiting.retain(|_, connection| *connection != id);
    }

    /// The host's answer to random request `id`: written to the waiting
    /// client at once (8 bytes always fit an empty socket buffer; a client
    /// that let its buffer fill loses its connection). An unknown id (its
    /// client went away) is ignored.
    pub fn answer_random(&mut self, id: u64, value: u64) {
        let Some(connection_id) = self.waiting.remove(&id) else {
            return;
        };
        let Some(connection) = self.connections.get_mut(&connection_id) else {
            return;
        };
        connection.pending_random = connection.pending_random.saturating_sub(1);
        let bytes = value.to_le_bytes();
        if !matches!(connection.stream.write(&bytes), Ok(8)) {
            self.close(connection_id);
        }
    }
}

fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> (Vec<ShimFrame>, Option<ShimFrameError>) {
        let mut decoder = ShimDecoder::default();
        decoder.push(bytes);
        let mut frames = Vec::new();
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => return (frames, None),
                Err(e) => return (frames, Some(e)),
            }
        }
    }

    #[test]
    fn test_frames_decode_whole_and_split_at_every_byte() {
        let mut stream = encode_shim_frame(KIND_JSON, br#"{"a":1}"#);
        stream.extend(encode_shim_frame(KIND_FLUSH, b""));
        stream.extend(encode_shim_frame(KIND_RANDOM, b""));
        let expected = vec![
            ShimFrame::Json(r#"{"a":1}"#.into()),
            ShimFrame::Flush,
            ShimFrame::Random,
        ];
        assert_eq!(decode_all(&stream), (expected.clone(), None));
        for split in 0..=stream.len() {
            let mut decoder = ShimDecoder::default();
            let mut frames = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                decoder.push(part);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            assert_eq!(frames, expected, "split at {split}");
        }
    }

    #[test]
    fn test_bad_frames_are_errors_after_the_good_ones() {
        let good = encode_shim_frame(KIND_FLUSH, b"");
        let cases: Vec<(Vec<u8>, ShimFrameError)> = vec![
            (
                0u32.to_le_bytes().to_vec(),
                ShimFrameError::BadLength {
                    len: 0,
                    max: MAX_RECORD_LEN + 1,
                },
            ),
            (
                u32::MAX.to_le_bytes().to_vec(),
                ShimFrameError::BadLength {
                    len: u32::MAX,
                    max: MAX_RECORD_LEN + 1,
                },
            ),
            (
                encode_shim_frame(9, b""),
                ShimFrameError::UnknownKind { kind: 9 },
            ),
            (
                encode_shim_frame(KIND_RANDOM, b"x"),
                ShimFrameError::UnexpectedPayload {
                    kind: KIND_RANDOM,
                    len: 1,
                },
            ),
            (
                encode_shim_frame(KIND_JSON, b"\xff\xfe"),
                ShimFrameError::NotUtf8 { valid_up_to: 0 },
            ),
        ];
        for (bad, error) in cases {
            let mut stream = good.clone();
            stream.extend(&bad);
            assert_eq!(
                decode_all(&stream),
                (vec![ShimFrame::Flush], Some(error)),
                "{bad:?}"
            );
        }
        // The longest record is fine.
        let record = "x".repeat(MAX_RECORD_LEN);
        let (frames, error) = decode_all(&encode_shim_frame(KIND_JSON, record.as_bytes()));
        assert_eq!((frames, error), (vec![ShimFrame::Json(record)], None));
    }

    /// The server end to end over real sockets: records, a random round
    /// trip, a bad client closed while a good one goes on.
    #[test]
    fn test_server_forwards_records_and_answers_random_requests() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = SdkServer::start(dir.path()).unwrap();
        server.add_node("n1").unwrap();
        assert_eq!(std::fs::read(server.shim_path()).unwrap(), SHIM);
        let mut client = UnixStream::connect(server.node_dir("n1").join("sdk.sock")).unwrap();
        let mut bad = UnixStream::connect(dir.path().join("sdk.sock")).unwrap();
        let mut events = Vec::new();
        let serve_all = |server: &mut SdkServer, events: &mut Vec<SdkEvent>| {
            for _ in 0..4 {
                let ready: Vec<SdkReady> = server.interest().into_iter().map(|(_, r)| r).collect();
                for r in ready {
                    server.serve(&r, events);
                }
            }
        };
        serve_all(&mut server, &mut events);
        client
            .write_all(&encode_shim_frame(KIND_JSON, br#"{"e":{}}"#))
            .unwrap();
        client
            .write_all(&encode_shim_frame(KIND_RANDOM, b""))
            .unwrap();
        bad.write_all(&encode_shim_frame(7, b"")).unwrap();
        serve_all(&mut server, &mut events);
        assert_eq!(
            events,
            // Connections in the order they were accepted: the root
            // socket's listener comes first.
            vec![
                SdkEvent::BadClient {
                    node: None,
                    message: "unknown frame kind 7".into()
                },
                SdkEvent::Record {
                    node: Some("n1".into()),
                    json: r#"{"e":{}}"#.into()
                },
                SdkEvent::RandomRequest {
                    node: Some("n1".into()),
                    id: 0
                },
            ]
        );
        server.answer_random(0, 0x0102_0304_0506_0708);
        let mut reply = [0u8; 8];
        client.read_exact(&mut reply).unwrap();
        assert_eq!(u64::from_le_bytes(reply), 0x0102_0304_0506_0708);
        // The bad client was closed.
        let mut byte = [0u8; 1];
        assert_eq!(bad.read(&mut byte).unwrap(), 0);
    }

    /// The shim itself (loaded with dlopen) against the server, in a mount
    /// namespace of its own where /run is a fresh tmpfs (the shim's socket
    /// path is fixed): run by the test below as a child, never directly.
    #[test]
    #[ignore = "run by test_the_shim_talks_to_the_server_in_a_private_run"]
    fn shim_child() {
        if std::env::var_os("DETVISOR_SHIM_CHILD").is_none() {
            return;
        }
        let mut server = SdkServer::start(Path::new("/run/detvisor")).unwrap();
        let shim = std::ffi::CString::new(server.shim_path().to_str().unwrap()).unwrap();
        // SAFETY: dlopen of the shim, which has no initializers.
        let lib = unsafe { libc::dlopen(shim.as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null(), "dlopen the shim");
        let symbol = |name: &str| {
            let name = std::ffi::CString::new(name).unwrap();
            // SAFETY: dlsym on a valid handle with a NUL-terminated name.
            let pointer = unsafe { libc::dlsym(lib, name.as_ptr()) };
            assert!(!pointer.is_null(), "{name:?}");
            pointer as usize
        };
        type JsonData = extern "C" fn(*const libc::c_char, usize);
        type Flush = extern "C" fn();
        type Random = extern "C" fn() -> u64;
        type InitCoverage = extern "C" fn(usize, *const libc::c_char) -> usize;
        type Notify = extern "C" fn(usize) -> bool;
        // Each transmute below: the address of the shim's exported
        // function of exactly that C signature.
        // SAFETY: as said.
        let json_data = unsafe { std::mem::transmute::<usize, JsonData>(symbol("fuzz_json_data")) };
        // SAFETY: as above.
        let flush = unsafe { std::mem::transmute::<usize, Flush>(symbol("fuzz_flush")) };
        // SAFETY: as above.
        let random = unsafe { std::mem::transmute::<usize, Random>(symbol("fuzz_get_random")) };
        // SAFETY: as above.
        let init_coverage =
            unsafe { std::mem::transmute::<usize, InitCoverage>(symbol("init_coverage_module")) };
        // SAFETY: as above.
        let notify = unsafe { std::mem::transmute::<usize, Notify>(symbol("notify_coverage")) };
        assert_eq!(init_coverage(10, c"a".as_ptr()), 0);
        assert_eq!(init_coverage(5, c"b".as_ptr()), 10);
        assert!(!notify(3));
        let client = std::thread::spawn(move || {
            let record = br#"{"antithesis_setup":{"status":"complete","details":null}}"#;
            json_data(record.as_ptr().cast(), record.len());
            flush();
            random()
        });
        let mut events = Vec::new();
        let mut answered = false;
        while !client.is_finished() {
            let ready: Vec<SdkReady> = server.interest().into_iter().map(|(_, r)| r).collect();
            for r in ready {
                server.serve(&r, &mut events);
            }
            if !answered
                && events
                    .iter()
                    .any(|e| matches!(e, SdkEvent::RandomRequest { .. }))
            {
                server.answer_random(0, 0xdead_beef_0bad_cafe);
                answered = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(client.join().unwrap(), 0xdead_beef_0bad_cafe);
        assert_eq!(
            events,
            vec![
                SdkEvent::Record {
                    node: None,
                    json: r#"{"antithesis_setup":{"status":"complete","details":null}}"#.into()
                },
                SdkEvent::RandomRequest { node: None, id: 0 },
            ]
        );
        println!("shim child: ok");
    }

    #[test]
    fn test_the_shim_talks_to_the_server_in_a_private_run() {
        // SAFETY: geteuid has no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (a mount namespace with its own /run)");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs /run && exec \"$0\" --exact sdk::tests::shim_child --ignored --nocapture")
            .arg(&exe)
            .env("DETVISOR_SHIM_CHILD", "1")
            .output()
            .expect("unshare runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("shim child: ok"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn test_the_shim_exports_the_sdk_symbols_and_needs_no_library() {
        let path = env!("DETVISOR_SHIM_PATH");
        let dynamic = std::process::Command::new("readelf")
            .args(["-dW", path])
            .output()
            .expect("readelf runs");
        let dynamic = String::from_utf8_lossy(&dynamic.stdout);
        assert!(!dynamic.contains("(NEEDED)"), "{dynamic}");
        let symbols = std::process::Command::new("nm")
            .args(["-D", "--defined-only", path])
            .output()
            .expect("nm runs");
        let mut names: Vec<String> = String::from_utf8_lossy(&symbols.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "fuzz_flush",
                "fuzz_get_random",
                "fuzz_json_data",
                "init_coverage_module",
                "notify_coverage"
            ]
        );
    }
}
