//! Frames: a `u32` little-endian payload length, then the payload; the
//! decoder drops a malformed frame and is poisoned by an oversized one.

use super::{LEN_PREFIX, MAX_FRAME_LEN};
use serde::de::DeserializeOwned;
use serde::Serialize;

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
