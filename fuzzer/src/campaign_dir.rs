//! A campaign directory's checks and its lock: what it must be (a
//! directory on a file system that can be written, its database a regular
//! file) and the exclusive `flock` on `DIR/lock` that one campaign holds
//! from the moment it claims the directory to its end.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The database file's name in a campaign directory.
pub const DB_FILE: &str = "campaign.db";
/// The lock file's name in a campaign directory.
pub const LOCK_FILE: &str = "lock";

/// Why a campaign directory cannot be used (see [`NewCampaignDir`]).
#[derive(Debug, thiserror::Error)]
pub enum CampaignDirError {
    #[error("creating campaign directory {dir}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir} is not a campaign directory (no {DB_FILE})")]
    NotACampaign { dir: PathBuf },
    /// A campaign directory, or its database, that is something else (a
    /// regular file given as the directory, a FIFO or a directory as the
    /// database): said at once, never opened (a FIFO would block).
    #[error("{}: not a {wanted} (a {kind})", path.display())]
    WrongKind {
        path: PathBuf,
        wanted: &'static str,
        kind: &'static str,
    },
    #[error("{path}: cannot inspect")]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir}: cannot write in it (a campaign keeps its database, findings and files there)")]
    NotWritable {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{dir} already holds a campaign: resume it with `detvisor campaign --resume {dir}`, or choose another --out")]
    Exists { dir: PathBuf },
    #[error("opening lock file {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another campaign is running on {dir} (it holds {LOCK_FILE})")]
    Busy { dir: PathBuf },
}

type Result<T, E = CampaignDirError> = std::result::Result<T, E>;

pub(crate) fn lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => CampaignDirError::NotWritable {
                dir: dir.to_owned(),
                source,
            },
            _ => CampaignDirError::Lock {
                path: path.clone(),
                source,
            },
        })?;
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(CampaignDirError::Busy {
                dir: dir.to_owned(),
            });
        }
        return Err(CampaignDirError::Lock { path, source: e });
    }
    Ok(file)
}

/// Refuses an existing `path` that is not a `wanted` ("directory" or
/// "regular file"; symlinks followed); whether it exists.
fn check_kind(path: &Path, wanted: &'static str) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            let ok = match wanted {
                "directory" => meta.is_dir(),
                _ => meta.is_file(),
            };
            if ok {
                Ok(true)
            } else {
                Err(CampaignDirError::WrongKind {
                    path: path.to_owned(),
                    wanted,
                    kind: hostfile::kind_name(meta.file_type()),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(CampaignDirError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The database of the campaign directory `dir`, checked to be a regular
/// file (a FIFO is never opened: it would block).
pub(crate) fn db_path(dir: &Path) -> Result<PathBuf> {
    check_kind(dir, "directory")?;
    let path = dir.join(DB_FILE);
    if !check_kind(&path, "regular file")? {
        return Err(CampaignDirError::NotACampaign {
            dir: dir.to_owned(),
        });
    }
    Ok(path)
}

/// A directory claimed for a new campaign: created, locked, and holding no
/// campaign. Claimed before anything is written there (blobs, the
/// database) and before any worker starts, so of two new campaigns on one
/// fresh directory the second is refused at once, having done nothing.
pub struct NewCampaignDir {
    /// Absolute.
    dir: PathBuf,
    lock: File,
}

impl NewCampaignDir {
    /// What can be known of `dir` for a new campaign without writing
    /// anything: it is a directory (or nothing yet) on a file system that
    /// can be written, holding no campaign. Checked before the campaign
    /// file is read, so a refusal leaves nothing behind.
    pub fn check(dir: &Path) -> Result<()> {
        // A database that is something else (a FIFO) says what it is.
        if check_kind(dir, "directory")? && check_kind(&dir.join(DB_FILE), "regular file")? {
            return Err(CampaignDirError::Exists {
                dir: dir.to_owned(),
            });
        }
        // The directory, or the nearest ancestor that exists (where it
        // would be made); a read-only mount says EROFS even to root.
        let absolute = std::path::absolute(dir).map_err(|source| CampaignDirError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let existing = absolute
            .ancestors()
            .find(|a| std::fs::symlink_metadata(a).is_ok())
            .unwrap_or(Path::new("/"));
        let c_path =
            std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).map_err(|e| {
                CampaignDirError::CreateDir {
                    dir: dir.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                }
            })?;
        // SAFETY: access(2) reads the NUL-terminated path it is given and
        // nothing else.
        if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
            return Err(CampaignDirError::NotWritable {
                dir: existing.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    pub fn claim(dir: &Path) -> Result<Self> {
        check_kind(dir, "directory")?;
        let create = |source| CampaignDirError::CreateDir {
            dir: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(create)?;
        let dir = dir.canonicalize().map_err(create)?;
        let lock = lock(&dir)?;
        // Whatever it is (a FIFO too): a database there is not replaced.
        if check_kind(&dir.join(DB_FILE), "regular file")? {
            return Err(CampaignDirError::Exists { dir });
        }
        Ok(NewCampaignDir { dir, lock })
    }

    /// The directory, absolute.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory and its lock, for the database made there.
    pub(crate) fn into_parts(self) -> (PathBuf, File) {
        (self.dir, self.lock)
    }
}
