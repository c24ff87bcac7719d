//! The channel's frames and their wire format.
//!
//! ```text
//! frame   := len:u32 (little endian) kind:u8 body        len = 1 + body length, 1..=MAX_FRAME_LEN
//! kind 1  Hello     body = protocol version, u32 LE      guest -> host, first frame
//! kind 2  Message   body = serde_json of the message     request (host -> guest) or response
//! kind 3  Stdout    body = raw bytes                     guest -> host, during a call
//! kind 4  Stderr    body = raw bytes                     guest -> host, during a call
//! kind 5  Stdin     body = raw bytes                     host -> guest, during a call
//! kind 6  StdinEof  body = empty                         host -> guest, exactly once per call
//! kind 7  Shutdown  body = empty                         host -> guest: serve returns
//! ```
//!
//! Stream data travels as raw bytes (no JSON escaping); only messages are JSON. A frame is
//! written with one `write_all` of header and body, so writers sharing a stream under a lock
//! never interleave. Anything else on the wire is a [`FrameError`], never a panic; a length
//! over [`MAX_FRAME_LEN`] is refused before anything is allocated.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest `len` accepted (kind byte + body): 16 MiB.
pub const MAX_FRAME_LEN: u32 = 16 << 20;
/// Largest body of one stream-data frame the writers produce (longer writes are split).
pub const MAX_DATA_LEN: usize = 64 << 10;

/// One unit on the channel: a typed message `T`, or stream data and control.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<T> {
    /// The guest end is up and speaks this protocol version (its first frame).
    Hello { version: u32 },
    /// A request (host -> guest) or a response (guest -> host).
    Message(T),
    /// Bytes the payload wrote to its stdout during a call.
    Stdout(Vec<u8>),
    /// Bytes the payload wrote to its stderr during a call.
    Stderr(Vec<u8>),
    /// Bytes of the caller's stdin for the current call.
    Stdin(Vec<u8>),
    /// The end of the current call's stdin (sent once per call, even with no stdin).
    StdinEof,
    /// No more requests: the guest end returns from `serve`.
    Shutdown,
}

impl<T> Frame<T> {
    /// The frame's kind, for messages about unexpected frames.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "hello",
            Frame::Message(_) => "message",
            Frame::Stdout(_) => "stdout",
            Frame::Stderr(_) => "stderr",
            Frame::Stdin(_) => "stdin",
            Frame::StdinEof => "stdin-eof",
            Frame::Shutdown => "shutdown",
        }
    }
}

/// A frame that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly between frames.
    #[error("the channel was closed")]
    Closed,
    /// The stream ended inside a frame.
    #[error("the channel ended inside a frame ({got} of {want} bytes)")]
    Truncated { want: usize, got: usize },
    #[error("frame length {len} is out of range (1..={max})")]
    BadLength { len: u32, max: u32 },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("{kind} frame with a body of {len} bytes")]
    BadBody { kind: &'static str, len: usize },
    #[error("the message does not parse")]
    BadMessage(#[source] serde_json::Error),
    #[error("the message cannot be serialized")]
    Encode(#[source] serde_json::Error),
    #[error("the message is {len} bytes, more than a frame holds ({max})")]
    TooLong { len: usize, max: u32 },
    #[error("channel I/O failed")]
    Io(#[source] io::Error),
}

const HELLO: u8 = 1;
const MESSAGE: u8 = 2;
const STDOUT: u8 = 3;
const STDERR: u8 = 4;
const STDIN: u8 = 5;
const STDIN_EOF: u8 = 6;
const SHUTDOWN: u8 = 7;

/// Writes `frame` (and flushes).
pub fn write_frame<T: Serialize, W: Write + ?Sized>(
    w: &mut W,
    frame: &Frame<T>,
) -> Result<(), FrameError> {
    let json;
    let version;
    let (kind, body): (u8, &[u8]) = match frame {
        Frame::Hello { version: v } => {
            version = v.to_le_bytes();
            (HELLO, &version)
        }
        Frame::Message(m) => {
            json = serde_json::to_vec(m).map_err(FrameError::Encode)?;
            (MESSAGE, &json)
        }
        Frame::Stdout(b) => (STDOUT, b),
        Frame::Stderr(b) => (STDERR, b),
        Frame::Stdin(b) => (STDIN, b),
        Frame::StdinEof => (STDIN_EOF, &[]),
        Frame::Shutdown => (SHUTDOWN, &[]),
    };
    let len = u32::try_from(body.len() + 1)
        .ok()
        .filter(|&l| l <= MAX_FRAME_LEN)
        .ok_or(FrameError::TooLong {
            len: body.len() + 1,
            max: MAX_FRAME_LEN,
        })?;
    let mut buf = Vec::with_capacity(5 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(body);
    w.write_all(&buf).map_err(FrameError::Io)?;
    w.flush().map_err(FrameError::Io)
}

/// Fills `buf`; `Ok(false)` when the stream ends before the first byte.
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> Result<bool, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(FrameError::Truncated {
                    want: buf.len(),
                    got,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(true)
}

/// Reads one frame. [`FrameError::Closed`] when the stream ends between frames.
pub fn read_frame<T: DeserializeOwned, R: Read + ?Sized>(
    r: &mut R,
) -> Result<Frame<T>, FrameError> {
    let mut head = [0u8; 5];
    if !read_full(r, &mut head[..4])? {
        return Err(FrameError::Closed);
    }
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if len == 0 || len > MAX_FRAME_LEN {
        return Err(FrameError::BadLength {
            len,
            max: MAX_FRAME_LEN,
        });
    }
    // Where the stream ended, counted from the start of the frame.
    let want = 4 + len as usize;
    let truncated = |offset: usize| {
        move |e| match e {
            FrameError::Truncated { got, .. } => FrameError::Truncated {
                want,
                got: offset + got,
            },
            e => e,
        }
    };
    if !read_full(r, &mut head[4..]).map_err(truncated(4))? {
        return Err(FrameError::Truncated { want, got: 4 });
    }
    let mut body = vec![0u8; len as usize - 1];
    if !body.is_empty() && !read_full(r, &mut body).map_err(truncated(5))? {
        return Err(FrameError::Truncated { want, got: 5 });
    }
    let empty = |kind, frame| {
        if body.is_empty() {
            Ok(frame)
        } else {
            Err(FrameError::BadBody {
                kind,
                len: body.len(),
            })
        }
    };
    match head[4] {
        HELLO => match <[u8; 4]>::try_from(&body[..]) {
            Ok(v) => Ok(Frame::Hello {
                version: u32::from_le_bytes(v),
            }),
            Err(_) => Err(FrameError::BadBody {
                kind: "hello",
                len: body.len(),
            }),
        },
        MESSAGE => serde_json::from_slice(&body)
            .map(Frame::Message)
            .map_err(FrameError::BadMessage),
        STDOUT => Ok(Frame::Stdout(body)),
        STDERR => Ok(Frame::Stderr(body)),
        STDIN => Ok(Frame::Stdin(body)),
        STDIN_EOF => empty("stdin-eof", Frame::StdinEof),
        SHUTDOWN => empty("shutdown", Frame::Shutdown),
        k => Err(FrameError::UnknownKind(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    enum Msg {
        Ping(u32),
        Text(String),
    }

    fn encode(frames: &[Frame<Msg>]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            write_frame(&mut out, f).unwrap();
        }
        out
    }

    #[test]
    fn round_trip() {
        let frames = vec![
            Frame::Hello { version: 7 },
            Frame::Message(Msg::Ping(3)),
            Frame::Message(Msg::Text("é\n\0\"".into())),
            Frame::Stdout(b"out\0\xff".to_vec()),
            Frame::Stderr(Vec::new()),
            Frame::Stdin(vec![0u8; 100_000]),
            Frame::StdinEof,
            Frame::Shutdown,
        ];
        let bytes = encode(&frames);
        let mut r = &bytes[..];
        for f in &frames {
            assert_eq!(&read_frame::<Msg, _>(&mut r).unwrap(), f);
        }
        assert!(matches!(
            read_frame::<Msg, _>(&mut r),
            Err(FrameError::Closed)
        ));
        // The documented layout.
        assert_eq!(
            encode(&[Frame::Stdout(b"ab".to_vec())]),
            b"\x03\0\0\0\x03ab"
        );
        assert_eq!(
            encode(&[Frame::Message(Msg::Ping(1))]),
            b"\x0b\0\0\0\x02{\"Ping\":1}"
        );
    }

    #[test]
    fn truncated_frames_are_named() {
        let bytes = encode(&[Frame::Message(Msg::Text("hello".into()))]);
        for cut in 1..bytes.len() {
            let err = read_frame::<Msg, _>(&mut &bytes[..cut]).unwrap_err();
            assert!(
                matches!(err, FrameError::Truncated { want, got }
                    if want == if cut < 4 { 4 } else { bytes.len() } && got == cut),
                "cut at {cut}: {err:?}"
            );
        }
    }

    #[test]
    fn bad_lengths_kinds_and_bodies_are_refused() {
        let err = read_frame::<Msg, _>(&mut &b"\xff\xff\xff\xff\x02"[..]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadLength { len: u32::MAX, .. }),
            "{err:?}"
        );
        let over = (MAX_FRAME_LEN + 1).to_le_bytes();
        let err = read_frame::<Msg, _>(&mut &over[..]).unwrap_err();
        assert!(matches!(err, FrameError::BadLength { .. }), "{err:?}");
        let err = read_frame::<Msg, _>(&mut &b"\0\0\0\0"[..]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadLength { len: 0, .. }),
            "{err:?}"
        );
        let err = read_frame::<Msg, _>(&mut &b"\x01\0\0\0\x63"[..]).unwrap_err();
        assert!(matches!(err, FrameError::UnknownKind(0x63)), "{err:?}");
        let err = read_frame::<Msg, _>(&mut &b"\x02\0\0\0\x06x"[..]).unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::BadBody {
                    kind: "stdin-eof",
                    len: 1
                }
            ),
            "{err:?}"
        );
        let err = read_frame::<Msg, _>(&mut &b"\x03\0\0\0\x01ab"[..]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadBody { kind: "hello", .. }),
            "{err:?}"
        );
        let err = read_frame::<Msg, _>(&mut &b"\x04\0\0\0\x02{x}"[..]).unwrap_err();
        assert!(matches!(err, FrameError::BadMessage(_)), "{err:?}");
        // Garbage: plain text is read as a huge length, never allocated.
        let err = read_frame::<Msg, _>(&mut &b"hello world"[..]).unwrap_err();
        assert!(matches!(err, FrameError::BadLength { .. }), "{err:?}");
    }

    #[test]
    fn oversized_messages_are_not_written() {
        let big = Frame::Message(Msg::Text("x".repeat(MAX_FRAME_LEN as usize)));
        let mut out = Vec::new();
        let err = write_frame(&mut out, &big).unwrap_err();
        assert!(matches!(err, FrameError::TooLong { .. }), "{err:?}");
        assert!(out.is_empty());
    }
}
