//! Shared by the `file_*` targets: a directory tree encoded as bytes (so a
//! fuzz input can be a snapshot, campaign or OCI layout directory), a
//! per-process scratch directory recreated for every input, a picture of a
//! tree to prove that reading it changed nothing, and the checks every
//! error must pass.
//!
//! # The encoding
//!
//! `flags:u8` then entries until the input ends, each
//! `kind:u8 name_len:u8 name[name_len] data_len:u32le data[data_len]`
//! (a length past the end takes what is left). `kind % 4`: 0 a file,
//! 1 a directory, 2 a symlink whose target is `data`, 3 a sparse file:
//! `data` is `len:u32le` and the contents, the file is then `set_len` to
//! `len` (at most [`MAX_SPARSE`]). Names are `/`-separated relative paths;
//! empty, `.` and `..` components are dropped. A symlink whose target
//! would leave the scratch directory, or an entry that cannot be made
//! (a file where a directory is wanted), is skipped: every tree the
//! decoder makes lies inside the scratch directory.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::error::Error;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The longest a sparse file is made (its holes cost nothing on tmpfs).
pub const MAX_SPARSE: u64 = 1 << 20;
/// The most entries decoded from one input.
const MAX_ENTRIES: usize = 64;
/// The most bytes of one file.
const MAX_FILE: usize = 1 << 20;

/// A scratch directory of this process, recreated for each input:
/// `<base>/root` is the decoded tree, `<base>/canary` a file beside it that
/// nothing may touch.
pub struct Scratch {
    pub base: PathBuf,
}

/// What the canary file holds.
pub const CANARY: &[u8] = b"canary: nothing outside the tree may change\n";

impl Scratch {
    /// A scratch directory for target `name` of this process, under
    /// /dev/shm when there is one (no disk writes), else the temp dir.
    pub fn new(name: &str) -> Scratch {
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let base = parent.join(format!("detvisor-fuzz-{name}-{}", std::process::id()));
        Scratch { base }
    }

    pub fn root(&self) -> PathBuf {
        self.base.join("root")
    }

    pub fn canary(&self) -> PathBuf {
        self.base.join("canary")
    }

    /// Empties the scratch directory and makes `root/` (empty) and the canary.
    pub fn reset(&self) -> PathBuf {
        match std::fs::remove_dir_all(&self.base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("cannot clear {}: {e}", self.base.display()),
        }
        std::fs::create_dir_all(self.root()).expect("scratch root");
        std::fs::write(self.canary(), CANARY).expect("canary");
        self.root()
    }

    /// Resets the scratch directory and decodes `input` into its root;
    /// returns the root and the flags byte.
    pub fn decode(&self, input: &[u8]) -> (PathBuf, u8) {
        let root = self.reset();
        let flags = decode_tree(input, &root);
        (root, flags)
    }

    /// Runs `read` and asserts it changed nothing in the tree under `root`
    /// (`what` it did, for the message) nor beside it.
    pub fn check_read_only(&self, root: &Path, what: &str, read: impl FnOnce()) {
        let before = picture(root);
        read();
        assert!(picture(root) == before, "{what} changed the tree");
        self.assert_outside_untouched();
    }

    /// Asserts the canary is as [`Scratch::reset`] left it and nothing else
    /// appeared beside the root.
    pub fn assert_outside_untouched(&self) {
        assert_eq!(
            std::fs::read(self.canary()).expect("canary is still there"),
            CANARY,
            "the canary beside the tree changed"
        );
        let mut names: Vec<_> = std::fs::read_dir(&self.base)
            .expect("scratch")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["canary", "root"],
            "something was made beside the tree"
        );
    }
}

/// A cursor over the input.
pub struct Reader<'a> {
    pub data: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    pub fn u32(&mut self) -> Option<u32> {
        let bytes = self.take(4)?;
        Some(u32::from_le_bytes(bytes.try_into().expect("four bytes")))
    }

    /// `n` bytes, or `None` if fewer are left.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.data.len() < n {
            return None;
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }

    /// Up to `n` bytes.
    pub fn take_up_to(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        self.take(n).expect("within the input")
    }
}

/// `name` made relative and without `.`/`..`/empty components; `None` if
/// nothing is left.
fn clean_name(name: &[u8]) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in name.split(|&b| b == b'/') {
        if part.is_empty() || part == b"." || part == b".." || part.contains(&0) {
            continue;
        }
        out.push(std::ffi::OsStr::from_bytes(part));
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Whether a symlink at `link` (relative to `base`) with `target` stays
/// inside `base`, judged lexically (every link the decoder makes is judged
/// so, so no chain of them leaves either).
fn link_stays_inside(link: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth = link.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Decodes `input` (see the module docs) into `root`, which must exist and
/// be empty; returns the flags byte. Paths of symlinks are judged against
/// `root`'s parent, so a link may reach the canary beside the tree but
/// never further.
pub fn decode_tree(input: &[u8], root: &Path) -> u8 {
    let mut r = Reader { data: input };
    let flags = r.u8().unwrap_or(0);
    let mut entries = 0;
    while !r.data.is_empty() && entries < MAX_ENTRIES {
        entries += 1;
        let Some(kind) = r.u8() else { break };
        let Some(name_len) = r.u8() else { break };
        let Some(name) = r.take(name_len as usize) else {
            break;
        };
        let Some(len) = r.u32() else { break };
        let data = r.take_up_to(len as usize);
        let Some(name) = clean_name(name) else {
            continue;
        };
        let path = root.join(&name);
        if let Some(parent) = path.parent() {
            if std::fs::create_dir_all(parent).is_err() {
                continue;
            }
        }
        match kind % 4 {
            0 => {
                let _ = std::fs::write(&path, &data[..data.len().min(MAX_FILE)]);
            }
            1 => {
                let _ = std::fs::create_dir_all(&path);
            }
            2 => {
                let target = Path::new(std::ffi::OsStr::from_bytes(data));
                let in_base = Path::new("root").join(&name);
                if !data.is_empty() && !data.contains(&0) && link_stays_inside(&in_base, target) {
                    let _ = std::os::unix::fs::symlink(target, &path);
                }
            }
            _ => {
                let mut d = Reader { data };
                let len = u64::from(d.u32().unwrap_or(0)).min(MAX_SPARSE);
                let contents = d.data;
                if let Ok(file) = std::fs::File::create(&path) {
                    use std::io::Write;
                    let mut file = file;
                    let n = contents.len().min(len as usize);
                    let _ = file.write_all(&contents[..n]);
                    let _ = file.set_len(len);
                }
            }
        }
    }
    flags
}

/// Encodes the tree under `root` (files, directories, symlinks; sorted) in
/// the format [`decode_tree`] reads, with `flags`. A file with holes is
/// written as a sparse entry when that is shorter.
pub fn encode_tree(root: &Path, flags: u8) -> Vec<u8> {
    let mut out = vec![flags];
    let mut stack = vec![PathBuf::new()];
    let mut all = Vec::new();
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        for name in names {
            let rel = rel.join(name);
            let meta = std::fs::symlink_metadata(root.join(&rel)).expect("stat");
            all.push((rel.clone(), meta.file_type()));
            if meta.is_dir() {
                stack.push(rel);
            }
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (rel, kind) in all {
        let path = root.join(&rel);
        let (k, data) = if kind.is_dir() {
            (1u8, Vec::new())
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&path).expect("readlink");
            (2, target.as_os_str().as_bytes().to_vec())
        } else {
            let bytes = std::fs::read(&path).expect("read");
            let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            if end + 4 < bytes.len() {
                let mut d = (bytes.len() as u32).to_le_bytes().to_vec();
                d.extend_from_slice(&bytes[..end]);
                (3, d)
            } else {
                (0, bytes)
            }
        };
        let name = rel.as_os_str().as_bytes();
        out.push(k);
        out.push(u8::try_from(name.len()).expect("short names"));
        out.extend_from_slice(name);
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
    }
    out
}

/// What a tree holds, to compare before and after a reader ran: every
/// path's kind and bytes (a symlink's target; a directory's nothing).
pub fn picture(root: &Path) -> BTreeMap<PathBuf, (u8, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let value = if meta.is_dir() {
                stack.push(path.clone());
                (1, Vec::new())
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap_or_default();
                (2, target.as_os_str().as_bytes().to_vec())
            } else {
                (0, std::fs::read(&path).unwrap_or_default())
            };
            out.insert(path, value);
        }
    }
    out
}

/// The checks every refusal must pass: its message is not empty, and it
/// does not repeat its cause's message outside the text it quotes (each
/// layer says its own part; the cause is printed after it by whoever prints
/// the chain). Returns the
/// whole chain as one line.
pub fn check_error(error: &(dyn Error + 'static)) -> String {
    let text = error.to_string();
    assert!(
        !text.trim().is_empty(),
        "an error with no message: {error:?}"
    );
    let mut line = text.clone();
    let mut outer = text;
    let mut source = error.source();
    while let Some(cause) = source {
        let inner = cause.to_string();
        assert!(
            !inner.trim().is_empty(),
            "a cause with no message: {cause:?} (under {outer:?})"
        );
        assert!(
            inner.len() < 16 || !unquoted(&outer).contains(&inner),
            "{outer:?} repeats its cause {inner:?}"
        );
        line.push_str(": ");
        line.push_str(&inner);
        outer = inner;
        source = cause.source();
    }
    line
}

/// `text` without its `"..."` quotations (the user's text that a message
/// quotes with `{:?}` may hold anything, a cause's words included).
fn unquoted(text: &str) -> String {
    let mut out = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in text.chars() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, _, '"') => quoted = !quoted,
            (false, _, c) => out.push(c),
            (true, false, _) => {}
        }
    }
    out
}

/// A cheap 64-bit digest (FNV-1a) for comparing two loads.
pub fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The starting value for [`fnv`].
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Seeds: when `DETVISOR_FUZZ_WRITE_SEEDS` names a directory, the target's
/// initialisation calls this with its seed inputs, which writes them there
/// (`seed-<n>`) and exits. This is how the repository's corpora of the
/// snapshot, campaign and OCI targets were made (their inputs are
/// directories written by the owning crates' own writers).
pub fn maybe_write_seeds(make: impl FnOnce() -> Vec<Vec<u8>>) {
    let Some(dir) = std::env::var_os("DETVISOR_FUZZ_WRITE_SEEDS") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("seed directory");
    for (n, seed) in make().into_iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{n}")), seed).expect("write seed");
    }
    std::process::exit(0);
}
