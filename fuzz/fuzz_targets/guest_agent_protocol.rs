//! The agent protocol's frame decoder and messages as the host parses them:
//! the bytes the guest writes on its console channel, framed or not, fed to
//! a [`FrameDecoder`] and decoded as [`AgentToHost`] (what the host's
//! driver does) and as [`HostToAgent`] (what the agent does with the host's
//! bytes).
//!
//! Invariants asserted:
//! 1. No panic, whatever the bytes.
//! 2. Chunking does not matter: the stream fed in input-chosen pieces (with
//!    the decoder drained after each) yields exactly the messages and
//!    errors that feeding it all at once does.
//! 3. A snapshot of the decoder (`buffered()` pushed into a new decoder, as
//!    the host's driver saves it) continues exactly where the old one was.
//! 4. Every decoded message re-encodes (`encode_frame`) and decodes to an
//!    equal message.
//! 5. The buffer stays bounded: once drained, it holds less than one
//!    largest frame plus its length prefix; once poisoned it holds nothing.
//! 6. Only an oversized length is fatal: a malformed frame is dropped and
//!    the decoder stays usable; a poisoned decoder returns `TooLarge` from
//!    then on.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use guest_agent::protocol::{
    encode_frame, frame_payload, AgentToHost, FrameDecoder, FrameError, HostToAgent, LEN_PREFIX,
    MAX_FRAME_LEN,
};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// The input: these settings, then the channel's bytes, one line per
/// frame: each line (without its `\n`) is a payload framed with its true
/// length (JSON has no raw newline, so a message is a line), except a line
/// starting with `!`, whose other bytes go on the channel as they are (a
/// length prefix of any value, garbage, a frame's beginning).
#[derive(Arbitrary, Debug)]
struct Input {
    /// A small maximum frame length instead of the protocol's, so that
    /// oversized frames are within the fuzzer's reach.
    small_max: Option<u16>,
    /// Piece sizes to feed the stream in (cycled).
    chunks: Vec<u8>,
    /// After which pieces the decoder is snapshotted and replaced.
    snapshot_every: u8,
}

/// The channel's bytes from the input's lines.
fn channel(lines: &[u8]) -> Vec<u8> {
    let mut stream = Vec::new();
    for line in lines.split(|&b| b == b'\n') {
        match line.strip_prefix(b"!") {
            Some(raw) => stream.extend_from_slice(raw),
            None => stream.extend(frame_payload(line).expect("a fuzz payload is small")),
        }
    }
    stream
}

type Outcome<T> = Result<T, FrameError>;

/// Drains every result the decoder has now, checking the buffer bound.
fn drain<T: DeserializeOwned>(decoder: &mut FrameDecoder, max: usize, out: &mut Vec<Outcome<T>>) {
    loop {
        let result = decoder.next_message::<T>();
        match result {
            Ok(None) => break,
            Ok(Some(message)) => out.push(Ok(message)),
            Err(error) => {
                let fatal = error.is_fatal();
                assert_eq!(fatal, decoder.is_poisoned(), "{error} vs poisoned state");
                assert!(
                    matches!(
                        error,
                        FrameError::TooLarge { .. } | FrameError::Malformed { .. }
                    ),
                    "decoding returned {error}"
                );
                out.push(Err(error));
                if fatal {
                    break;
                }
            }
        }
    }
    if decoder.is_poisoned() {
        assert_eq!(
            decoder.buffered_len(),
            0,
            "a poisoned decoder buffers input"
        );
        assert!(decoder.next_frame().is_err_and(|e| e.is_fatal()));
    } else {
        assert!(
            decoder.buffered_len() < LEN_PREFIX + max,
            "{} bytes buffered after draining",
            decoder.buffered_len()
        );
    }
}

fn check<T>(input: &Input, stream: &[u8])
where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let max = input
        .small_max
        .map_or(MAX_FRAME_LEN, |m| usize::from(m).min(MAX_FRAME_LEN));

    let mut whole = FrameDecoder::new(max);
    let mut expected: Vec<Outcome<T>> = Vec::new();
    whole.push(stream);
    drain(&mut whole, max, &mut expected);

    let mut chunked = FrameDecoder::new(max);
    let mut got: Vec<Outcome<T>> = Vec::new();
    let mut rest = stream;
    let sizes = input.chunks.iter().map(|&c| usize::from(c).max(1));
    let sizes: Vec<usize> = if input.chunks.is_empty() {
        vec![1]
    } else {
        sizes.collect()
    };
    for (piece, size) in sizes.iter().cycle().enumerate() {
        if rest.is_empty() {
            break;
        }
        let (head, tail) = rest.split_at((*size).min(rest.len()));
        rest = tail;
        chunked.push(head);
        drain(&mut chunked, max, &mut got);
        let every = usize::from(input.snapshot_every);
        if every != 0 && piece % every == 0 && !chunked.is_poisoned() {
            let mut fresh = FrameDecoder::new(max);
            fresh.push(chunked.buffered());
            chunked = fresh;
        }
    }
    // A poisoned decoder repeats its error at every later drain: the
    // chunked run has the whole run's results, then only that error again.
    assert!(got.len() >= expected.len());
    assert_eq!(
        expected[..],
        got[..expected.len()],
        "chunking changed the decoded stream"
    );
    assert!(got[expected.len()..]
        .iter()
        .all(|r| r.as_ref().is_err_and(FrameError::is_fatal)));
    assert_eq!(whole.is_poisoned(), chunked.is_poisoned());

    for message in expected.iter().flatten() {
        let frame = encode_frame(message).expect("a decoded message re-encodes");
        let mut decoder = FrameDecoder::new(MAX_FRAME_LEN);
        decoder.push(&frame);
        let again: T = decoder
            .next_message()
            .expect("a re-encoded message decodes")
            .expect("a whole frame");
        assert_eq!(&again, message, "re-encoding changed the message");
        assert_eq!(decoder.buffered_len(), 0);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let stream = channel(u.take_rest());
    check::<AgentToHost>(&input, &stream);
    check::<HostToAgent>(&input, &stream);
});
