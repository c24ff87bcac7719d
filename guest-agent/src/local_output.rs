//! The SDKs' fallback when a program cannot load libvoidstar: JSON lines in
//! the file named by `ANTITHESIS_SDK_LOCAL_OUTPUT`. Every process the agent
//! starts in a node (the node itself, the workload, a test-composer
//! command) may set it; the agent reads each file named so, in the node's
//! root, every [`POLL_INTERVAL_NS`] of guest time, when a workload or
//! command ends and when the node ends (before it reports that end), and
//! passes every complete line on as a record of the node (as a record sent
//! through the node's libvoidstar socket is). The root workload's files
//! are read the same way, in the agent's root, as the root's records.
//!
//! A file on a tmpfs of the node (/tmp, /run: a fresh one per start) ends
//! with the node's mount namespace: the agent holds the deepest directory
//! on the way to the file that exists (opened through the node's
//! `/proc/<pid>/root` when it starts, before it execs, and again at every
//! read while it runs), and reads through it after the end too.
//!
//! Limits (the SDKs' own): a process truncates the file when it opens it,
//! so several processes on one path overwrite each other; the agent starts
//! again from the top when the file shrank or is another file (a new /tmp,
//! a file made anew), and may miss what a process wrote between two reads
//! before another truncated it. A line longer than
//! [`crate::sdk::MAX_RECORD_LEN`] is dropped.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::sdk::MAX_RECORD_LEN;
use crate::sys;

/// The environment variable the SDKs read.
pub const VARIABLE: &str = "ANTITHESIS_SDK_LOCAL_OUTPUT";

/// How often (guest monotonic time) the files are read.
pub const POLL_INTERVAL_NS: i64 = 100_000_000;

/// Bytes read from one file at one poll at most (the rest next time).
const MAX_READ: u64 = 1 << 20;

/// The files of one place (a node, or the agent's own root), by path: a
/// path that several processes name is read once.
#[derive(Debug, Default)]
pub struct LocalOutputs(BTreeMap<PathBuf, LocalOutput>);

impl LocalOutputs {
    /// Adds the file `env` names (an absolute path), unless known already;
    /// whether it added one.
    pub fn add_from_env(&mut self, env: &BTreeMap<String, String>) -> bool {
        let Some(local) = LocalOutput::from_env(env) else {
            return false;
        };
        if self.0.contains_key(&local.path) {
            return false;
        }
        self.0.insert(local.path.clone(), local);
        true
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// See [`LocalOutput::look_up`], for every file.
    pub fn look_up(&mut self, root: &Path) {
        for local in self.0.values_mut() {
            local.look_up(root);
        }
    }

    /// Lets go of every directory held (the place starts anew).
    pub fn forget(&mut self) {
        for local in self.0.values_mut() {
            local.anchor = None;
        }
    }

    /// The complete lines added to every file since the last read, file by
    /// file in path order.
    pub fn read_new(&mut self) -> Vec<String> {
        self.0
            .values_mut()
            .flat_map(LocalOutput::read_new)
            .collect()
    }
}

/// One local output file and how far it was read.
#[derive(Debug)]
pub struct LocalOutput {
    /// Absolute, inside the root.
    path: PathBuf,
    anchor: Option<Anchor>,
    /// The file last read, held open so that its device and inode numbers
    /// cannot go to another file (a new /tmp may get the device number of
    /// the last one, and its first inode numbers).
    file: Option<(std::fs::File, (u64, u64))>,
    offset: u64,
    partial: Vec<u8>,
    /// The current line outgrew the limit: skip to its end.
    overlong: bool,
}

/// The deepest directory on the way to the file that existed when looked
/// up, held open, and the way from it to the file.
#[derive(Debug)]
struct Anchor {
    dir: OwnedFd,
    rest: PathBuf,
}

impl LocalOutput {
    /// The file `env` names, if an absolute path.
    pub fn from_env(env: &BTreeMap<String, String>) -> Option<Self> {
        let path = PathBuf::from(env.get(VARIABLE)?);
        path.is_absolute().then_some(LocalOutput {
            path,
            anchor: None,
            file: None,
            offset: 0,
            partial: Vec::new(),
            overlong: false,
        })
    }

    /// Holds the deepest existing directory on the way to the file under
    /// root directory `root` (a running process's `/proc/<pid>/root`, or
    /// `/`). When nothing under `root` opens (the process has ended), the
    /// directory held before stays.
    pub fn look_up(&mut self, root: &Path) {
        let relative = self.path.strip_prefix("/").unwrap_or(&self.path);
        let mut dir = relative.parent();
        while let Some(d) = dir {
            let flags = libc::O_PATH | libc::O_DIRECTORY;
            if let Ok(fd) = sys::open(&root.join(d), flags) {
                let rest = relative.strip_prefix(d).unwrap_or(relative);
                self.anchor = Some(Anchor {
                    dir: fd,
                    rest: rest.to_path_buf(),
                });
                return;
            }
            dir = d.parent();
        }
    }

    /// The complete lines added to the file since the last read (through
    /// the directory held; none before [`LocalOutput::look_up`]).
    pub fn read_new(&mut self) -> Vec<String> {
        let Some(anchor) = &self.anchor else {
            return Vec::new();
        };
        // Non-blocking: a FIFO there must not stop the agent.
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        let Ok(fd) = sys::openat(anchor.dir.as_fd(), &anchor.rest, flags) else {
            return Vec::new();
        };
        let mut handle = std::fs::File::from(fd);
        let Ok(meta) = handle.metadata() else {
            return Vec::new();
        };
        if !meta.is_file() {
            return Vec::new();
        }
        let id = (meta.dev(), meta.ino());
        let same = self.file.as_ref().is_some_and(|(_, held)| *held == id);
        if meta.len() < self.offset || !same {
            // Truncated (a process opened it anew), or another file.
            self.offset = 0;
            self.partial.clear();
            self.overlong = false;
        }
        let mut bytes = Vec::new();
        if handle.seek(SeekFrom::Start(self.offset)).is_err()
            || (&mut handle)
                .take(MAX_READ)
                .read_to_end(&mut bytes)
                .is_err()
        {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        self.file = Some((handle, id));
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
    use std::io::Write;

    fn env(path: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(VARIABLE.to_string(), path.to_string())])
    }

    #[test]
    fn test_new_complete_lines_are_read_once_and_a_truncation_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut local = LocalOutput::from_env(&env("/out/sdk.jsonl")).unwrap();
        local.look_up(dir.path());
        assert!(local.read_new().is_empty(), "no file yet");
        // The directory is made after the look-up: reached from the root.
        let file = dir.path().join("out/sdk.jsonl");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let mut out = std::fs::File::create(&file).unwrap();
        out.write_all(b"{\"a\":1}\n{\"b\":").unwrap();
        assert_eq!(local.read_new(), vec!["{\"a\":1}".to_string()]);
        out.write_all(b"2}\n").unwrap();
        assert_eq!(local.read_new(), vec!["{\"b\":2}".to_string()]);
        assert!(local.read_new().is_empty());
        // Another process opens it: truncated, then written again.
        std::fs::write(&file, b"{\"c\":3}\n").unwrap();
        assert_eq!(local.read_new(), vec!["{\"c\":3}".to_string()]);
    }

    #[test]
    fn test_another_file_at_the_path_is_read_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut local = LocalOutput::from_env(&env("/sdk.jsonl")).unwrap();
        local.look_up(dir.path());
        let file = dir.path().join("sdk.jsonl");
        std::fs::write(&file, b"{\"a\":1}\n").unwrap();
        assert_eq!(local.read_new(), vec!["{\"a\":1}".to_string()]);
        // A longer file in its place (as on a node's new /tmp).
        let new = dir.path().join("new");
        std::fs::write(&new, b"{\"b\":2,\"c\":3}\n").unwrap();
        std::fs::rename(&new, &file).unwrap();
        assert_eq!(local.read_new(), vec!["{\"b\":2,\"c\":3}".to_string()]);
    }

    #[test]
    fn test_the_directory_held_is_read_through_once_its_path_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let mut local = LocalOutput::from_env(&env("/tmp/sdk.jsonl")).unwrap();
        local.look_up(&root);
        std::fs::write(root.join("tmp/sdk.jsonl"), b"{\"late\":1}\n").unwrap();
        std::fs::rename(&root, dir.path().join("elsewhere")).unwrap();
        // Nothing under the old root opens: the held directory stays.
        local.look_up(&root);
        assert_eq!(local.read_new(), vec!["{\"late\":1}".to_string()]);
    }

    #[test]
    fn test_a_fifo_at_the_path_is_no_file_and_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = sys::path_cstring(&dir.path().join("sdk.jsonl")).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let mut local = LocalOutput::from_env(&env("/sdk.jsonl")).unwrap();
        local.look_up(dir.path());
        assert!(local.read_new().is_empty());
    }

    #[test]
    fn test_a_path_named_twice_is_one_file() {
        let mut outputs = LocalOutputs::default();
        assert!(outputs.add_from_env(&env("/tmp/a.jsonl")));
        assert!(!outputs.add_from_env(&env("/tmp/a.jsonl")));
        assert!(outputs.add_from_env(&env("/tmp/b.jsonl")));
        assert!(!outputs.add_from_env(&env("relative.jsonl")));
        assert!(!outputs.add_from_env(&BTreeMap::new()));
    }

    #[test]
    fn test_a_relative_or_missing_path_is_no_local_output() {
        assert!(LocalOutput::from_env(&BTreeMap::new()).is_none());
        assert!(LocalOutput::from_env(&env("rel.jsonl")).is_none());
    }
}
