//! A toy protocol for the channel's tests, served by `examples/toy_payload.rs` in the helper VM
//! and by a thread over a socket pair in `tests/channel.rs`.

use std::io::{Read, Write};

use helper_vm::channel::CallIo;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToyReq {
    Echo(String),
    Add(i64, i64),
    /// Writes `text` `times` times to stdout (one write each) and `err` once to stderr.
    Print {
        text: String,
        times: usize,
        err: String,
    },
    /// Reads all of stdin; answers [`stdin_summary`] of it.
    ReadStdin,
    /// Reads nothing of stdin.
    IgnoreStdin,
    /// Answers with a typed error.
    Fail(String),
    /// Exits the payload process without answering.
    Exit(i32),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToyResp {
    Echo(String),
    Sum(i64),
    Printed(usize),
    Stdin { len: usize, sum: u64, head: Vec<u8> },
    Ignored,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToyError {
    Refused(String),
    Overflow,
}

pub type Reply = Result<ToyResp, ToyError>;

/// What `ReadStdin` answers for `data`.
pub fn stdin_summary(data: &[u8]) -> ToyResp {
    ToyResp::Stdin {
        len: data.len(),
        sum: data.iter().map(|&b| u64::from(b)).sum(),
        head: data.iter().take(16).copied().collect(),
    }
}

/// The toy handler.
pub fn handle(req: ToyReq, io: &mut CallIo) -> Reply {
    match req {
        ToyReq::Echo(s) => Ok(ToyResp::Echo(s)),
        ToyReq::Add(a, b) => a.checked_add(b).map(ToyResp::Sum).ok_or(ToyError::Overflow),
        ToyReq::Print { text, times, err } => {
            for _ in 0..times {
                io.stdout.write_all(text.as_bytes()).unwrap();
            }
            io.stderr.write_all(err.as_bytes()).unwrap();
            Ok(ToyResp::Printed(times * text.len()))
        }
        ToyReq::ReadStdin => {
            let mut all = Vec::new();
            io.stdin.read_to_end(&mut all).unwrap();
            Ok(stdin_summary(&all))
        }
        ToyReq::IgnoreStdin => Ok(ToyResp::Ignored),
        ToyReq::Fail(why) => Err(ToyError::Refused(why)),
        ToyReq::Exit(code) => {
            eprintln!("toy payload: exiting with {code} as asked");
            std::process::exit(code)
        }
    }
}
