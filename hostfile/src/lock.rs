//! One writer of an output at a time: [`OutputLock`] holds an exclusive
//! `flock` on `.<name>.lock` beside the output for as long as a process
//! builds it, so a second process that would write the same file is refused
//! at once, naming the process that holds it (two writers would both say
//! they wrote the file, though only the last one's is there).

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{}: another process{} is writing it now (it holds {}); this one stops and leaves it to that one", path.display(), holder.map(|p| format!(" (pid {p})")).unwrap_or_default(), lock.display())]
    Busy {
        path: PathBuf,
        lock: PathBuf,
        holder: Option<u32>,
    },
    #[error("{}: cannot lock it for writing ({})", path.display(), lock.display())]
    Io {
        path: PathBuf,
        lock: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The exclusive right to write `path`, until dropped (which removes the
/// lock file).
pub struct OutputLock {
    lock: PathBuf,
    file: File,
}

/// `.<name>.lock` beside `path`.
fn lock_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.lock"))
}

impl OutputLock {
    /// Takes the lock on `path`'s output, or says who holds it.
    pub fn take(path: &Path) -> Result<OutputLock, LockError> {
        let lock = lock_path(path);
        let io_error = |source| LockError::Io {
            path: path.to_owned(),
            lock: lock.clone(),
            source,
        };
        // The holder removes the file as it lets go: a lock taken on a file
        // no longer at `lock` is taken again on the one there now.
        loop {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&lock)
                .map_err(io_error)?;
            // SAFETY: flock on a descriptor this function owns; no memory involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(io_error(e));
                }
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Busy {
                    path: path.to_owned(),
                    lock,
                    holder: text.trim().parse().ok(),
                });
            }
            let held = file.metadata().map_err(io_error)?;
            match std::fs::metadata(&lock) {
                Ok(there) if there.ino() == held.ino() && there.dev() == held.dev() => {}
                _ => continue,
            }
            file.set_len(0).map_err(io_error)?;
            file.rewind().map_err(io_error)?;
            write!(file, "{}", std::process::id()).map_err(io_error)?;
            return Ok(OutputLock { lock, file });
        }
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still held (the lock goes with the descriptor).
        let _ = std::fs::remove_file(&self.lock);
        let _ = self.file.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second writer of one output is refused while the first holds it,
    /// naming the holder's pid; after the first lets go, the lock file is
    /// gone and the output can be taken again.
    #[test]
    fn test_a_second_writer_of_one_output_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("node.img");
        let first = OutputLock::take(&out).unwrap();
        let error = OutputLock::take(&out).err().expect("refused");
        let message = error.to_string();
        assert!(
            matches!(error, LockError::Busy { holder: Some(pid), .. } if pid == std::process::id()),
            "{message}"
        );
        assert!(
            message.contains("node.img: another process (pid"),
            "{message}"
        );
        drop(first);
        assert!(!lock_path(&out).exists());
        drop(OutputLock::take(&out).unwrap());
    }
}
