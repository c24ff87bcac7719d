//! The files a user or a snapshot names, read and written safely.
//!
//! Reading: [`open_regular`] opens without blocking (a FIFO would otherwise
//! hang the open) and refuses anything that is not a regular file once open
//! (a FIFO, a device such as `/dev/zero`, a directory), following symlinks
//! only to a regular file. [`read_limited`] then reads at most a limit of
//! bytes: a file that is larger, or grows past it while being read, is an
//! error naming the path and the limit. Every such read in detvisor goes
//! through here.
//!
//! Writing: [`Output`] writes a new version of a file into a temporary file
//! of a unique name, created exclusively in the output's directory, and
//! renames it over the output at the end, which must be a regular file or
//! absent; anything else (a device node such as `/dev/null`, a directory, a
//! FIFO, a symlink) is refused before anything is written. [`OutputLock`]
//! keeps a second process from writing the same output at once.

mod lock;

pub use lock::{LockError, OutputLock};

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a file could not be read, each naming its path.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a regular file (a {kind})", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{}: larger than the limit of {limit} bytes", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
}

impl ReadError {
    /// The I/O error's kind, where there is one (`NotFound`, ...); `InvalidInput`
    /// for a file that is not a regular one or too large, `InvalidData` for
    /// text that is not UTF-8.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            ReadError::Open { source, .. } | ReadError::Read { source, .. } => source.kind(),
            ReadError::NotRegular { .. } | ReadError::TooLarge { .. } => {
                io::ErrorKind::InvalidInput
            }
            ReadError::NotUtf8 { .. } => io::ErrorKind::InvalidData,
        }
    }
}

/// What a file that is not a regular one is, for messages.
pub fn kind_name(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_symlink() {
        "symbolic link"
    } else if file_type.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// Opens `path` for reading if it is (or a symlink leads to) a regular file.
/// The open does not block on a FIFO; the file's type is checked on the open
/// descriptor, so it cannot change between the check and the read.
pub fn open_regular(path: &Path) -> Result<File, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| ReadError::Open {
            path: path.to_owned(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| ReadError::Open {
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            path: path.to_owned(),
            kind: kind_name(meta.file_type()),
        });
    }
    Ok(file)
}

/// The whole of the regular file `path`, at most `limit` bytes.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_regular(path)?;
    let too_large = || ReadError::TooLarge {
        path: path.to_owned(),
        limit,
    };
    let size = file
        .metadata()
        .map_err(|source| ReadError::Read {
            path: path.to_owned(),
            source,
        })?
        .len();
    if size > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Read {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_limited`] as UTF-8 text.
pub fn read_text_limited(path: &Path, limit: u64) -> Result<String, ReadError> {
    String::from_utf8(read_limited(path, limit)?).map_err(|_| ReadError::NotUtf8 {
        path: path.to_owned(),
    })
}

/// Why an output file could not be written, each naming its path.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{}: exists and is not a regular file (a {kind}); give a new path or a regular file to replace", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{}: cannot inspect", path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot create a temporary file beside it", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot write", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: cannot put the new file in place", path.display())]
    Persist {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Checks that `path` can be replaced by an [`Output`]: a regular file (not a
/// symlink) or nothing.
pub fn check_output(path: &Path) -> Result<(), WriteError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(meta) => Err(WriteError::NotRegular {
            path: path.to_owned(),
            kind: kind_name(meta.file_type()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(WriteError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A new version of the file `path`, written into a temporary file of a
/// unique name beside it (created with `O_EXCL`, so never through an
/// existing file or symlink) and renamed over `path` by [`Output::commit`].
/// Dropped without a commit, the temporary file is removed.
pub struct Output {
    path: PathBuf,
    temp: tempfile::NamedTempFile,
}

impl Output {
    /// Refuses an existing `path` that is not a regular file (see [`check_output`]).
    pub fn create(path: &Path) -> Result<Output, WriteError> {
        check_output(path)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Created as `File::create` creates files (0666 less the umask),
        // not owner-only as temporary files usually are.
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .permissions(std::fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)
            .map_err(|source| WriteError::Create {
                path: path.to_owned(),
                source,
            })?;
        Ok(Output {
            path: path.to_owned(),
            temp,
        })
    }

    /// The temporary file, to write into.
    pub fn file(&mut self) -> &mut File {
        self.temp.as_file_mut()
    }

    /// Writes all of `bytes`.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        self.temp
            .as_file_mut()
            .write_all(bytes)
            .map_err(|source| WriteError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Flushes the file to disk and renames it over the output, checking
    /// again that what is there is a regular file or nothing. Returns the
    /// bytes written, as they are now in the file this process wrote.
    pub fn commit(self) -> Result<u64, WriteError> {
        let path = self.path;
        let file = self.temp.as_file();
        let write = |source| WriteError::Write {
            path: path.clone(),
            source,
        };
        file.sync_all().map_err(write)?;
        let len = file.metadata().map_err(write)?.len();
        check_output(&path)?;
        self.temp.persist(&path).map_err(|e| WriteError::Persist {
            path: path.clone(),
            source: e.error,
        })?;
        Ok(len)
    }
}

/// Writes `bytes` as the new version of `path` (see [`Output`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<u64, WriteError> {
    let mut out = Output::create(path)?;
    out.write_all(bytes)?;
    out.commit()
}

#[cfg(test)]
mod tests;
