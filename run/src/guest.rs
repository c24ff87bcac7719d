//! The default guest image and the per-run command archive.

use image_builder::{NewcEntry, NewcWriter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::process::ExitStatus;

pub use image_builder::cache_root;

/// The source tree this binary was built from (for the image build scripts):
/// the workspace root, this crate's parent directory.
pub fn source_dir() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).to_path_buf()
}

/// Why the guest's image, its agent or its initrd is not at hand.
#[derive(Debug, thiserror::Error)]
pub enum GuestImageError {
    #[error("the default guest image is not built ({} is missing) and the build script {} is not available: pass --kernel and --initrd", kernel.display(), script.display())]
    ImageMissing { kernel: PathBuf, script: PathBuf },
    #[error("building the default guest image with {} failed ({status})", script.display())]
    ImageBuild { script: PathBuf, status: ExitStatus },
    #[error("the guest agent is not built ({} is missing) and its build script {} is not available", cached.display(), script.display())]
    AgentMissing { cached: PathBuf, script: PathBuf },
    #[error("building the guest agent with {} failed ({status}):\n{stderr}", script.display())]
    AgentBuild {
        script: PathBuf,
        status: ExitStatus,
        stderr: String,
    },
    /// Running a build script, or a file step of installing the agent
    /// (`what` names it: "running X", "creating X", "copying X to Y", ...).
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the initrd")]
    ReadInitrd(#[source] hostfile::ReadError),
    #[error("building the command archive")]
    CommandArchive(#[source] image_builder::ImageError),
}

type Result<T, E = GuestImageError> = std::result::Result<T, E>;

/// An I/O step's error, named by `what`.
fn io(what: impl FnOnce() -> String) -> impl FnOnce(std::io::Error) -> GuestImageError {
    move |source| GuestImageError::Io {
        what: what(),
        source,
    }
}

pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// The default kernel and initramfs, built (and cached) on first use.
pub fn default_image() -> Result<GuestImage> {
    let dir = cache_root().join("guest-image/default");
    let image = GuestImage {
        kernel: dir.join("vmlinux"),
        initrd: dir.join("initramfs.cpio.gz"),
    };
    if image.kernel.is_file() && image.initrd.is_file() {
        return Ok(image);
    }
    let script = source_dir().join("guest-image/build.sh");
    if !script.is_file() {
        return Err(GuestImageError::ImageMissing {
            kernel: image.kernel,
            script,
        });
    }
    eprintln!(
        "detvisor: building the default guest image (once; cached in {})",
        dir.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(io(|| format!("running {}", script.display())))?;
    if !status.success() || !image.kernel.is_file() {
        return Err(GuestImageError::ImageBuild { script, status });
    }
    Ok(image)
}

/// The static guest agent (`detvisor-agent`), built with `guest-agent/build.sh`
/// on first use and cached as `<cache>/agent/detvisor-agent`. A build from a
/// newer source tree replaces the cached copy (the script is cheap when
/// cargo has nothing to do).
pub fn agent_binary() -> Result<PathBuf> {
    let cached = cache_root().join("agent/detvisor-agent");
    let script = source_dir().join("guest-agent/build.sh");
    if !script.is_file() {
        if cached.is_file() {
            return Ok(cached);
        }
        return Err(GuestImageError::AgentMissing { cached, script });
    }
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(io(|| format!("running {}", script.display())))?;
    if !output.status.success() {
        return Err(GuestImageError::AgentBuild {
            script,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let built = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let dir = cached.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir).map_err(io(|| format!("creating {}", dir.display())))?;
    let built_bytes =
        std::fs::read(&built).map_err(io(|| format!("reading {}", built.display())))?;
    if std::fs::read(&cached).is_ok_and(|bytes| bytes == built_bytes) {
        return Ok(cached);
    }
    // Concurrent callers (parallel tests, several CLI runs) each write their
    // own partial file; the rename is atomic, so the last one wins whole.
    let partial = dir.join(format!(
        "detvisor-agent.partial.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::copy(&built, &partial).map_err(io(|| {
        format!("copying {} to {}", built.display(), partial.display())
    }))?;
    std::fs::rename(&partial, &cached)
        .map_err(io(|| format!("installing {}", cached.display())))?;
    Ok(cached)
}

/// Quotes one argument for a POSIX shell.
pub fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// Marks the end of a fork shell on the control channel (after it, nothing).
pub const FORK_SHELL_END: &str = "\x1edetvisor-fork-shell-end";

/// First line of every command script: a listener on the virtio console
/// (`/dev/hvc0`, the machine's control channel) that turns echo and output
/// processing off (plain newlines) and stays blocked on a read for the whole
/// run, so it changes no history (and prints nothing on the console). Only `detvisor shell`, in a
/// fork, ever writes to it: its first line makes the listener freeze every
/// process of the system under test (SIGSTOP to all but init and itself), so
/// the shell sees that moment, then read command lines from the channel, run
/// each with `eval` (output back on the channel, stdin /dev/null) after a
/// `# ` prompt, and at `exit` send the end marker. (An interactive `sh -i`
/// on the channel hung in the fork; the listener's own `read` does not.)
pub const FORK_SHELL_LISTENER: &str = "[ -c /dev/hvc0 ] && ( stty -echo -opost; read -r _ && \
{ kill -STOP -1; while printf '# '; IFS= read -r l; do [ \"$l\" = exit ] && break; \
eval \"$l\" 2>&1 </dev/null; done; printf '\\036detvisor-fork-shell-end\\n'; } ) \
<>/dev/hvc0 >&0 2>/dev/null &\n";

/// The largest initrd read (a regular file only): 4 GiB.
pub const MAX_INITRD_BYTES: u64 = 4 << 30;

/// The initrd at `path`: a regular file (a FIFO would hang), at most
/// [`MAX_INITRD_BYTES`].
pub fn read_initrd(path: &Path) -> Result<Vec<u8>, hostfile::ReadError> {
    hostfile::read_limited(path, MAX_INITRD_BYTES)
}

/// The initrd the guest gets: the image's initramfs, then (when a command is
/// given) an uncompressed newc archive holding `/detvisor/cmd`, which the
/// kernel unpacks on top and the guest init runs.
pub fn initrd_with_command(initrd: &Path, command: &[String]) -> Result<Vec<u8>> {
    let mut bytes = read_initrd(initrd).map_err(GuestImageError::ReadInitrd)?;
    if command.is_empty() {
        return Ok(bytes);
    }
    let script: String = FORK_SHELL_LISTENER.to_string()
        + &command
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
        + "\n";
    while bytes.len() % 4 != 0 {
        bytes.push(0);
    }
    // Inode 0 and one link for both members, as this archive always had:
    // its bytes are in the guest's memory, so in every run's digest.
    let member = |path, mode| NewcEntry {
        path,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        nlink: 1,
        rdev_major: 0,
        rdev_minor: 0,
    };
    let mut archive = NewcWriter::new(bytes);
    archive
        .append(&member("detvisor", 0o040755), 0, &mut std::io::empty())
        .map_err(GuestImageError::CommandArchive)?;
    let script = script.into_bytes();
    archive
        .append(
            &member("detvisor/cmd", 0o100644),
            script.len() as u64,
            &mut script.as_slice(),
        )
        .map_err(GuestImageError::CommandArchive)?;
    archive.finish().map_err(GuestImageError::CommandArchive)
}

/// The kernel command line detvisor boots with unless told otherwise.
pub fn default_cmdline() -> String {
    [
        "console=ttyS0",
        // The guest ends by writing its status to a port; reboot=t makes any
        // reboot a triple fault, which the VMM sees as a shutdown.
        "reboot=t",
        "panic=-1",
        // No local APIC or IOAPIC: the legacy PIC and the HPET's legacy routing.
        "noapic",
        "nolapic",
        // No TSC: skip the delay-loop calibration, which would spin on jiffies
        // without ever exiting (and so without time advancing).
        "lpj=1000000",
        "random.trust_cpu=off",
        "random.trust_bootloader=on",
        // Only critical kernel messages: the console is the command's output.
        "loglevel=3",
    ]
    .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_shell_quote_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn test_command_archive_is_appended_aligned() {
        let dir = std::env::temp_dir().join(format!("detvisor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("base");
        std::fs::write(&base, b"abcde").unwrap();
        let out = initrd_with_command(&base, &["echo".into(), "x y".into()]).unwrap();
        assert_eq!(&out[..5], b"abcde");
        assert_eq!(&out[8..14], b"070701");
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("'echo' 'x y'\n"));
        assert_eq!(initrd_with_command(&base, &[]).unwrap(), b"abcde");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let missing = Path::new("/nonexistent/detvisor-initrd");
        let e = initrd_with_command(missing, &[]).unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "cannot read the initrd: /nonexistent/detvisor-initrd: No such file or directory (os error 2)"
        );
        // A FIFO is refused at once, not waited on.
        let dir = tempfile::tempdir().unwrap();
        let fifo = crate::test_files::fifo(dir.path(), "initrd");
        let e = initrd_with_command(&fifo, &[]).unwrap_err();
        assert!(format!("{:#}", anyhow::Error::from(e))
            .ends_with("initrd: not a regular file (a FIFO)"));
    }

    #[test]
    fn test_source_dir_has_the_build_scripts() {
        assert!(source_dir().join("guest-image/build.sh").is_file());
        assert!(source_dir().join("guest-agent/build.sh").is_file());
    }
}
