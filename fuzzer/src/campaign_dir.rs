//! A campaign directory's checks and its lock: what it must be (a
//! directory on a file system that can be written, its database a regular
//! file) and the exclusive `flock` on `DIR/lock` that one campaign holds
//! from the moment it claims the directory to its end.

use crate::store::{StoreError, DB_FILE, LOCK_FILE};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

type Result<T, E = StoreError> = std::result::Result<T, E>;

pub(crate) fn lock(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => StoreError::NotWritable {
                dir: dir.to_owned(),
                source,
            },
            _ => StoreError::Lock {
                path: path.clone(),
                source,
            },
        })?;
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(StoreError::Busy {
                dir: dir.to_owned(),
            });
        }
        return Err(StoreError::Lock { path, source: e });
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
                Err(StoreError::WrongKind {
                    path: path.to_owned(),
                    wanted,
                    kind: hostfile::kind_name(meta.file_type()),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(StoreError::Inspect {
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
        return Err(StoreError::NotACampaign {
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
            return Err(StoreError::Exists {
                dir: dir.to_owned(),
            });
        }
        // The directory, or the nearest ancestor that exists (where it
        // would be made); a read-only mount says EROFS even to root.
        let absolute = std::path::absolute(dir).map_err(|source| StoreError::CreateDir {
            dir: dir.to_owned(),
            source,
        })?;
        let existing = absolute
            .ancestors()
            .find(|a| std::fs::symlink_metadata(a).is_ok())
            .unwrap_or(Path::new("/"));
        let c_path =
            std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).map_err(|e| {
                StoreError::CreateDir {
                    dir: dir.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                }
            })?;
        // SAFETY: access(2) reads the NUL-terminated path it is given and
        // nothing else.
        if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
            return Err(StoreError::NotWritable {
                dir: existing.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    pub fn claim(dir: &Path) -> Result<Self> {
        check_kind(dir, "directory")?;
        let create = |source| StoreError::CreateDir {
            dir: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(create)?;
        let dir = dir.canonicalize().map_err(create)?;
        let lock = lock(&dir)?;
        // Whatever it is (a FIFO too): a database there is not replaced.
        if check_kind(&dir.join(DB_FILE), "regular file")? {
            return Err(StoreError::Exists { dir });
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two new campaigns on one fresh directory: the second claim is
    /// refused while the first is held (before either writes anything), and
    /// a directory holding a campaign is never claimed again.
    #[test]
    fn test_a_fresh_directory_is_claimed_by_one_new_campaign_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let first = NewCampaignDir::claim(&out).unwrap();
        let second = NewCampaignDir::claim(&out).err().expect("refused");
        assert!(matches!(second, StoreError::Busy { .. }), "{second}");
        drop(crate::store::Store::create_in(first, &[]).unwrap());
        let again = NewCampaignDir::claim(&out).err().expect("refused");
        assert!(matches!(again, StoreError::Exists { .. }), "{again}");
        let checked = NewCampaignDir::check(&out).expect_err("refused");
        assert!(matches!(checked, StoreError::Exists { .. }), "{checked}");
    }
}
