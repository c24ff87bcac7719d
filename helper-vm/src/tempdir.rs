//! Private temporary directories: [`TempDir`], and the launcher's own ([`new_temp_dir`]), which
//! also clears those that launchers killed before they could clean up left behind.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A private temporary directory (mode 0700, `$TMPDIR/<prefix><pid>-<nanos>-<n>`), removed
/// with its contents on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for n in 0..1000u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = base.join(format!("{prefix}{}-{nanos:x}-{n}", std::process::id()));
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("no free temporary directory name"))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the directory (no removal on drop) and returns its path.
    pub fn keep(self) -> PathBuf {
        let path = self.0.clone();
        std::mem::forget(self);
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Prefix of the launcher's temporary directories (the payload initrd, the status, console and
/// QEMU logs, the channel's socket).
pub(crate) const TEMP_PREFIX: &str = "detvisor-helper-vm-";

/// The launcher's private temporary directory (`detvisor-helper-vm-<pid>-*`), made after
/// clearing those of launchers that died without cleaning up.
pub(crate) fn new_temp_dir() -> io::Result<TempDir> {
    remove_stale_temp_dirs(&std::env::temp_dir());
    TempDir::new(TEMP_PREFIX)
}

/// Removes the temporary directories of launchers that died without cleaning up (SIGKILL):
/// `detvisor-helper-vm-<pid>-*` whose process no longer exists.
fn remove_stale_temp_dirs(base: &Path) {
    let Ok(dir) = fs::read_dir(base) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest
            .split('-')
            .next()
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temp_dirs_are_removed() {
        let base = new_temp_dir().unwrap();
        let dead = base.path().join(format!("{TEMP_PREFIX}{}-1-0", i32::MAX));
        let alive = base
            .path()
            .join(format!("{TEMP_PREFIX}{}-1-0", std::process::id()));
        let other = base.path().join("unrelated-123");
        for d in [&dead, &alive, &other] {
            fs::create_dir(d).unwrap();
            fs::write(d.join("f"), b"x").unwrap();
        }
        remove_stale_temp_dirs(base.path());
        assert!(!dead.exists());
        assert!(alive.exists());
        assert!(other.exists());
    }

    #[test]
    fn removed_on_drop_unless_kept() {
        let dir = TempDir::new("detvisor-tempdir-test-").unwrap();
        let path = dir.path().to_path_buf();
        fs::write(path.join("f"), b"x").unwrap();
        drop(dir);
        assert!(!path.exists());
        let kept = TempDir::new("detvisor-tempdir-test-").unwrap().keep();
        assert!(kept.is_dir());
        fs::remove_dir_all(kept).unwrap();
    }
}
