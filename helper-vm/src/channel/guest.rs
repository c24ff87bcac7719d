//! The guest end of the channel: what a long-lived payload inside L1 runs. [`serve`] reads
//! requests, runs the handler with a [`CallIo`] whose stdout and stderr send output frames and
//! whose stdin reads the call's stdin frames, and sends each response.

use std::fs::OpenOptions;
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::frame::{read_frame, write_frame, Frame, FrameError, MAX_DATA_LEN};
use super::{GUEST_PORT_PATH, PROTOCOL_VERSION};

/// Why [`serve`] stopped without a shutdown from the host.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the channel's port {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot send on the channel")]
    Send(#[source] FrameError),
    #[error("bad frame from the host")]
    Receive(#[source] FrameError),
    #[error("the host closed the channel without a shutdown")]
    Closed,
    #[error("unexpected {0} frame from the host")]
    Unexpected(&'static str),
}

/// The writing half shared by the response path and the output writers.
type SharedWriter = Arc<Mutex<Box<dyn Write + Send>>>;

fn send<T: Serialize>(w: &SharedWriter, frame: &Frame<T>) -> Result<(), FrameError> {
    let mut w = w
        .lock()
        .map_err(|_| FrameError::Io(io::Error::other("channel writer poisoned")))?;
    write_frame(&mut **w, frame)
}

/// A `Write` that sends what is written as stdout or stderr frames of the current call
/// (unbuffered: one frame per `write`, at most [`MAX_DATA_LEN`] bytes each; wrap it in a
/// `BufWriter` for many small writes). Clone it to write from other threads.
#[derive(Clone)]
pub struct OutputWriter {
    writer: SharedWriter,
    stderr: bool,
}

impl Write for OutputWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let chunk = buf[..buf.len().min(MAX_DATA_LEN)].to_vec();
        let n = chunk.len();
        let frame = if self.stderr {
            Frame::<()>::Stderr(chunk)
        } else {
            Frame::<()>::Stdout(chunk)
        };
        send(&self.writer, &frame).map_err(io::Error::other)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the reader thread passes on.
enum Event<Req> {
    /// A request, with the receiving end of its stdin (closed at its end-of-stdin frame).
    Call(Req, Receiver<Vec<u8>>),
    /// A frame that is neither a request nor stdin.
    Frame(Frame<Req>),
    Error(FrameError),
}

/// The current call's stdin: the host's stdin frames until its end-of-stdin frame. Read it,
/// or take its chunks as a channel ([`CallStdin::take_receiver`]) to read on another thread:
/// the call can return while its stdin is still open (the host ends it after the response).
pub struct CallStdin {
    chunks: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl CallStdin {
    /// The stdin chunks as they arrive; the channel closes at the end of stdin. This
    /// `CallStdin` reads nothing afterwards.
    pub fn take_receiver(&mut self) -> Receiver<Vec<u8>> {
        let (_, closed) = mpsc::channel();
        std::mem::replace(&mut self.chunks, closed)
    }
}

impl Read for CallStdin {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.chunks.recv() {
                Ok(data) => {
                    self.buf = data;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The streams of one call, handed to the handler.
pub struct CallIo {
    pub stdout: OutputWriter,
    pub stderr: OutputWriter,
    pub stdin: CallStdin,
}

/// Serves requests on [`GUEST_PORT_PATH`] until the host sends a shutdown (`Ok`); see
/// [`serve_on`].
pub fn serve<Req, Resp, F>(handler: F) -> Result<(), ServeError>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize,
    F: FnMut(Req, &mut CallIo) -> Resp,
{
    let open_err = |source| ServeError::Open {
        path: GUEST_PORT_PATH.into(),
        source,
    };
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(GUEST_PORT_PATH)
        .map_err(open_err)?;
    let reader = port.try_clone().map_err(open_err)?;
    serve_on(reader, port, handler)
}

/// Serves requests read from `reader`, writing frames to `writer`: sends the hello, then for
/// each request runs `handler` (whose stdout and stderr become output frames, whose stdin reads
/// the call's stdin frames) and sends its response. Returns `Ok` at the host's shutdown.
pub fn serve_on<Req, Resp, F, R, W>(reader: R, writer: W, mut handler: F) -> Result<(), ServeError>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize,
    F: FnMut(Req, &mut CallIo) -> Resp,
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    let writer: SharedWriter = Arc::new(Mutex::new(Box::new(writer)));
    // Before reading: a virtio port reads EOF until the host is connected, but a write waits.
    send(
        &writer,
        &Frame::<()>::Hello {
            version: PROTOCOL_VERSION,
        },
    )
    .map_err(ServeError::Send)?;
    let (tx, events) = mpsc::channel();
    // Reads ahead so that stdin the handler does not read never blocks the host: each call's
    // stdin goes to that call's own channel, closed at its end-of-stdin frame. Left blocked
    // in its read when serve returns without a shutdown; the process is about to exit then.
    thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut stdin: Option<mpsc::Sender<Vec<u8>>> = None;
        loop {
            let event = match read_frame::<Req, _>(&mut reader) {
                // Stdin nobody reads any more is dropped.
                Ok(Frame::Stdin(data)) => {
                    if let Some(sink) = &stdin {
                        let _ = sink.send(data);
                    }
                    continue;
                }
                Ok(Frame::StdinEof) => {
                    stdin = None;
                    continue;
                }
                Ok(Frame::Message(req)) => {
                    let (sink, chunks) = mpsc::channel();
                    stdin = Some(sink);
                    Event::Call(req, chunks)
                }
                Ok(frame) => {
                    let last = matches!(frame, Frame::Shutdown);
                    if tx.send(Event::Frame(frame)).is_err() || last {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    let _ = tx.send(Event::Error(e));
                    return;
                }
            };
            if tx.send(event).is_err() {
                return;
            }
        }
    });
    loop {
        let event = events.recv().map_err(|_| ServeError::Closed)?;
        let (req, chunks) = match event {
            Event::Call(req, chunks) => (req, chunks),
            Event::Frame(Frame::Shutdown) => return Ok(()),
            Event::Error(FrameError::Closed) => return Err(ServeError::Closed),
            Event::Error(e) => return Err(ServeError::Receive(e)),
            Event::Frame(other) => return Err(ServeError::Unexpected(other.kind_name())),
        };
        let mut io = CallIo {
            stdout: OutputWriter {
                writer: writer.clone(),
                stderr: false,
            },
            stderr: OutputWriter {
                writer: writer.clone(),
                stderr: true,
            },
            stdin: CallStdin {
                chunks,
                buf: Vec::new(),
                pos: 0,
            },
        };
        let resp = handler(req, &mut io);
        send(&writer, &Frame::Message(resp)).map_err(ServeError::Send)?;
    }
}
