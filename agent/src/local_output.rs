//! The SDKs' fallback when a program cannot load libvoidstar: JSON lines in
//! the file named by `ANTITHESIS_SDK_LOCAL_OUTPUT` (if the node's
//! environment sets it). The agent reads what was added to that file, in
//! the node's root, every [`POLL_INTERVAL_NS`] of guest time and when the
//! node ends, and passes every complete line on as a record of the node.
//!
//! Limits (the SDKs' own): a process truncates the file when it opens it,
//! so several processes on one path overwrite each other; the agent starts
//! again from the top when the file shrank, and may miss what a process
//! wrote between two reads before another truncated it. A line longer than
//! [`crate::sdk::MAX_RECORD_LEN`] is dropped. A file in the node's /tmp or
//! /run (fresh tmpfs per start) can be read only while the node runs.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::sdk::MAX_RECORD_LEN;

/// The environment variable the SDKs read.
pub const VARIABLE: &str = "ANTITHESIS_SDK_LOCAL_OUTPUT";

/// How often (guest monotonic time) the files are read.
pub const POLL_INTERVAL_NS: i64 = 100_000_000;

/// Bytes read from one file at one poll at most (the rest next time).
const MAX_READ: u64 = 1 << 20;

/// One node's local output file and how far it was read.
#[derive(Debug)]
pub struct LocalOutput {
    /// Absolute, inside the node's root.
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
    /// The current line outgrew the limit: skip to its end.
    overlong: bool,
}

impl LocalOutput {
    /// The node's file, if its environment names an absolute path.
    pub fn from_env(env: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        let path = PathBuf::from(env.get(VARIABLE)?);
        path.is_absolute().then_some(LocalOutput {
            path,
            offset: 0,
            partial: Vec::new(),
            overlong: false,
        })
    }

    /// The file as seen from the agent, under root directory `root` (a
    /// running node's `/proc/<pid>/root`, or its root directory).
    pub fn file_under(&self, root: &Path) -> PathBuf {
        root.join(self.path.strip_prefix("/").unwrap_or(&self.path))
    }

    /// The complete lines added to `file` since the last read.
    pub fn read_new(&mut self, file: &Path) -> Vec<String> {
        let Ok(mut handle) = std::fs::File::open(file) else {
            return Vec::new();
        };
        let Ok(len) = handle.metadata().map(|m| m.len()) else {
            return Vec::new();
        };
        if len < self.offset {
            // Truncated: a process opened it anew.
            self.offset = 0;
            self.partial.clear();
            self.overlong = false;
        }
        let mut bytes = Vec::new();
        if handle.seek(SeekFrom::Start(self.offset)).is_err()
            || handle.take(MAX_READ).read_to_end(&mut bytes).is_err()
        {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        self.push(&bytes)
    }

    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        let mut rest = bytes;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            if !self.overlong && self.partial.len() + end <= MAX_RECORD_LEN {
                self.partial.extend_from_slice(&rest[..end]);
                if let Ok(line) = String::from_utf8(std::mem::take(&mut self.partial)) {
                    if !line.trim().is_empty() {
                        lines.push(line);
                    }
                }
            }
            self.partial.clear();
            self.overlong = false;
            rest = &rest[end + 1..];
        }
        if !self.overlong {
            if self.partial.len() + rest.len() > MAX_RECORD_LEN {
                self.partial.clear();
                self.overlong = true;
            } else {
                self.partial.extend_from_slice(rest);
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Write;

    #[test]
    fn test_new_complete_lines_are_read_once_and_a_truncation_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([(VARIABLE.to_string(), "/out/sdk.jsonl".to_string())]);
        let mut local = LocalOutput::from_env(&env).unwrap();
        let file = local.file_under(dir.path());
        assert_eq!(file, dir.path().join("out/sdk.jsonl"));
        assert!(local.read_new(&file).is_empty(), "no file yet");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let mut out = std::fs::File::create(&file).unwrap();
        out.write_all(b"{\"a\":1}\n{\"b\":").unwrap();
        assert_eq!(local.read_new(&file), vec!["{\"a\":1}".to_string()]);
        out.write_all(b"2}\n").unwrap();
        assert_eq!(local.read_new(&file), vec!["{\"b\":2}".to_string()]);
        assert!(local.read_new(&file).is_empty());
        // Another process opens it: truncated, then written again.
        std::fs::write(&file, b"{\"c\":3}\n").unwrap();
        assert_eq!(local.read_new(&file), vec!["{\"c\":3}".to_string()]);
    }

    #[test]
    fn test_a_relative_or_missing_path_is_no_local_output() {
        assert!(LocalOutput::from_env(&BTreeMap::new()).is_none());
        let env = BTreeMap::from([(VARIABLE.to_string(), "rel.jsonl".to_string())]);
        assert!(LocalOutput::from_env(&env).is_none());
    }
}
