//! The host end of the channel: [`Client`] speaks the protocol over a connected Unix stream
//! (the errors of [`super::HelperVm`]'s operations are here too).

use std::io::{self, BufReader, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::frame::{read_frame, write_frame, Frame, FrameError, MAX_DATA_LEN};
use super::PROTOCOL_VERSION;
use crate::launch::LaunchError;
use crate::qemu::VmFailed;
use crate::stdio::{poll_pair, read_raw};

/// The caller's stdin for one call.
#[derive(Clone, Copy, Debug)]
pub enum StdinSource<'a> {
    /// All of it, known up front.
    Bytes(&'a [u8]),
    /// Read while the call runs (a terminal, a pipe), unbuffered, until it ends or the call
    /// does: nothing past what the payload could have been sent is consumed.
    Fd(BorrowedFd<'a>),
}

/// The payload's greeting went wrong.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("bad greeting on the channel")]
    Frame(#[source] FrameError),
    #[error("the payload's first frame is a {0} frame, not a hello")]
    NotHello(&'static str),
    #[error("the payload speaks channel protocol {got}, this launcher {want}")]
    Version { got: u32, want: u32 },
}

/// Why [`super::HelperVm::start`] has no running payload to return.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("cannot connect to the helper VM's channel socket {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// QEMU ended, or the payload did not open the channel in time (QEMU was killed then).
    #[error(transparent)]
    Ended(#[from] VmFailed),
}

/// Why a call has no response.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot send the request on the channel")]
    Send(#[source] FrameError),
    #[error("bad frame from the payload")]
    Receive(#[source] FrameError),
    #[error("unexpected {0} frame from the payload")]
    Unexpected(&'static str),
    #[error("cannot write the payload's output")]
    Output(#[source] io::Error),
    #[error("cannot read the stdin to forward")]
    Stdin(#[source] io::Error),
    /// The channel closed during the call: the payload or QEMU ended (see the tails).
    #[error(transparent)]
    Ended(#[from] VmFailed),
    #[error("the helper VM is stopped (an earlier call failed)")]
    Stopped,
}

/// Why [`super::HelperVm::shutdown`] has no exit status.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error(transparent)]
    Failed(#[from] VmFailed),
    #[error("the helper VM is stopped (an earlier call failed)")]
    Stopped,
}

/// The host end of the channel over a connected stream: handshake, then calls.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: Sender,
}

/// The writing half, shared with the stdin forwarder during a call.
struct Sender(Mutex<UnixStream>);

impl Sender {
    fn send<T: Serialize>(&self, frame: &Frame<T>) -> Result<(), FrameError> {
        let mut w = self
            .0
            .lock()
            .map_err(|_| FrameError::Io(io::Error::other("channel writer poisoned")))?;
        write_frame(&mut *w, frame)
    }

    /// Copies `fd` to stdin frames until it ends or `stop` closes; always ends with the
    /// end-of-stdin frame.
    fn forward_stdin(&self, fd: BorrowedFd<'_>, stop: &io::PipeReader) -> Result<(), CallError> {
        let mut buf = vec![0u8; MAX_DATA_LEN];
        let result = loop {
            match poll_pair(fd.as_raw_fd(), stop.as_raw_fd(), -1) {
                Ok(Some(true)) => {}
                Ok(None) => continue,
                Ok(Some(false)) => break Ok(()),
                Err(e) => break Err(CallError::Stdin(e)),
            }
            match read_raw(fd.as_raw_fd(), &mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    if let Err(e) = self.send(&Frame::<()>::Stdin(buf[..n].to_vec())) {
                        break Err(CallError::Send(e));
                    }
                }
                Err(e) => break Err(CallError::Stdin(e)),
            }
        };
        let eof = self.send(&Frame::<()>::StdinEof).map_err(CallError::Send);
        result.and(eof)
    }
}

impl Client {
    /// Reads the payload's hello from `stream` (blocking) and checks its version.
    pub fn handshake(stream: UnixStream) -> Result<Client, HandshakeError> {
        let writer = stream
            .try_clone()
            .map_err(|e| HandshakeError::Frame(FrameError::Io(e)))?;
        let mut reader = BufReader::new(stream);
        match read_frame::<(), _>(&mut reader).map_err(HandshakeError::Frame)? {
            Frame::Hello { version } if version == PROTOCOL_VERSION => Ok(Client {
                reader,
                writer: Sender(Mutex::new(writer)),
            }),
            Frame::Hello { version } => Err(HandshakeError::Version {
                got: version,
                want: PROTOCOL_VERSION,
            }),
            other => Err(HandshakeError::NotHello(other.kind_name())),
        }
    }

    /// Sends `req`, forwards `stdin` (then its end), writes the output frames to `stdout` and
    /// `stderr` as they arrive, and returns the response. A failing sink does not end the call
    /// early (the output is dropped, the error returned after the response came).
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        req: &Req,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
        stdin: Option<StdinSource<'_>>,
    ) -> Result<Resp, CallError> {
        let (reader, writer) = (&mut self.reader, &self.writer);
        writer.send(&Frame::Message(req)).map_err(CallError::Send)?;
        let fd = match stdin {
            None => None,
            Some(StdinSource::Bytes(bytes)) => {
                for chunk in bytes.chunks(MAX_DATA_LEN) {
                    writer
                        .send(&Frame::<()>::Stdin(chunk.to_vec()))
                        .map_err(CallError::Send)?;
                }
                None
            }
            Some(StdinSource::Fd(fd)) => Some(fd),
        };
        let Some(fd) = fd else {
            writer
                .send(&Frame::<()>::StdinEof)
                .map_err(CallError::Send)?;
            return receive(reader, stdout, stderr);
        };
        let (stop_r, stop_w) = io::pipe().map_err(CallError::Stdin)?;
        thread::scope(|s| {
            let forwarder = s.spawn(move || writer.forward_stdin(fd, &stop_r));
            let resp = receive(reader, stdout, stderr);
            drop(stop_w);
            let forwarded = forwarder.join().unwrap_or(Ok(()));
            let resp = resp?;
            forwarded?;
            Ok(resp)
        })
    }

    /// Asks the payload to return from `serve`.
    pub fn send_shutdown(&self) -> Result<(), FrameError> {
        self.writer.send(&Frame::<()>::Shutdown)
    }
}

/// Reads output frames into the sinks until the response.
fn receive<Resp: DeserializeOwned>(
    reader: &mut BufReader<UnixStream>,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<Resp, CallError> {
    let mut sink_error = None;
    loop {
        let frame = read_frame::<Resp, _>(reader).map_err(CallError::Receive)?;
        let (sink, data): (&mut dyn Write, _) = match frame {
            Frame::Message(resp) => {
                return match sink_error {
                    Some(e) => Err(CallError::Output(e)),
                    None => Ok(resp),
                };
            }
            Frame::Stdout(data) => (stdout, data),
            Frame::Stderr(data) => (stderr, data),
            other => return Err(CallError::Unexpected(other.kind_name())),
        };
        if sink_error.is_none() {
            if let Err(e) = sink.write_all(&data).and_then(|()| sink.flush()) {
                sink_error = Some(e);
            }
        }
    }
}
