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
    Frame(Frame<Req>),
    Error(FrameError),
}

/// The current call's stdin: the host's stdin frames until its end-of-stdin frame.
pub struct CallStdin<'a, Req> {
    events: &'a Receiver<Event<Req>>,
    buf: Vec<u8>,
    pos: usize,
    /// The call's stdin-eof frame has been consumed (or the channel ended).
    ended: bool,
    /// A frame that ends the session, seen while reading stdin: handled after the call.
    pending: Option<Event<Req>>,
}

impl<Req> Read for CallStdin<'_, Req> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() && !self.ended {
            match self.events.recv() {
                Ok(Event::Frame(Frame::Stdin(data))) => {
                    self.buf = data;
                    self.pos = 0;
                }
                Ok(Event::Frame(Frame::StdinEof)) => self.ended = true,
                Ok(other) => {
                    self.ended = true;
                    self.pending = Some(other);
                }
                Err(_) => self.ended = true,
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The streams of one call, handed to the handler.
pub struct CallIo<'a, Req> {
    pub stdout: OutputWriter,
    pub stderr: OutputWriter,
    pub stdin: CallStdin<'a, Req>,
}

/// Serves requests on [`GUEST_PORT_PATH`] until the host sends a shutdown (`Ok`); see
/// [`serve_on`].
pub fn serve<Req, Resp, F>(handler: F) -> Result<(), ServeError>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize,
    F: FnMut(Req, &mut CallIo<'_, Req>) -> Resp,
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
    F: FnMut(Req, &mut CallIo<'_, Req>) -> Resp,
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
    // Reads ahead so that stdin the handler does not read never blocks the host. Left blocked
    // in its read when serve returns without a shutdown; the process is about to exit then.
    thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        loop {
            let event = match read_frame::<Req, _>(&mut reader) {
                Ok(frame) => {
                    let last = matches!(frame, Frame::Shutdown);
                    let sent = tx.send(Event::Frame(frame));
                    if last || sent.is_err() {
                        return;
                    }
                    continue;
                }
                Err(e) => Event::Error(e),
            };
            let _ = tx.send(event);
            return;
        }
    });
    let mut pending = None;
    loop {
        let event = match pending.take() {
            Some(event) => event,
            None => events.recv().map_err(|_| ServeError::Closed)?,
        };
        let req = match event {
            Event::Frame(Frame::Message(req)) => req,
            Event::Frame(Frame::Shutdown) => return Ok(()),
            Event::Error(FrameError::Closed) => return Err(ServeError::Closed),
            Event::Error(e) => return Err(ServeError::Receive(e)),
            // Stdin the last handler did not read, up to and including its end.
            Event::Frame(Frame::Stdin(_) | Frame::StdinEof) => continue,
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
                events: &events,
                buf: Vec::new(),
                pos: 0,
                ended: false,
                pending: None,
            },
        };
        let resp = handler(req, &mut io);
        pending = io.stdin.pending.take();
        send(&writer, &Frame::Message(resp)).map_err(ServeError::Send)?;
    }
}
