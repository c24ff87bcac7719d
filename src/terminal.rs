//! The host terminal for interactive guest shells: raw mode and a stdin reader.

use anyhow::{Context, Result};
use std::io::Read;
use std::os::fd::AsRawFd;

/// Puts stdin's terminal in raw mode (no echo, no line editing, no signals:
/// Ctrl-C goes to the guest) until dropped.
pub struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    pub fn enter() -> Result<RawMode> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: termios is plain old data; all-zero is a valid value to be overwritten.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is stdin, `saved` is a valid termios to write into.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(std::io::Error::last_os_error()).context("reading terminal settings");
        }
        let mut raw = saved;
        // SAFETY: `raw` is a valid termios obtained from tcgetattr.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Keep output post-processing so the summary lines still start at column 0.
        raw.c_oflag = saved.c_oflag;
        // SAFETY: `fd` is stdin and `raw` a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(std::io::Error::last_os_error()).context("setting terminal raw mode");
        }
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: restores the settings read in `enter` on the same fd.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &self.saved) };
    }
}

/// Where the user's input ends besides the end of stdin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinEnd {
    /// Only at the end of stdin (bytes pass through unchanged, Ctrl-D too).
    Never,
    /// Also at an EOT byte: how the end of a stdin forwarded through the
    /// helper VM's serial line arrives.
    AtEot,
}

/// Reads stdin on a thread, chunk by chunk; the channel closes at its end.
pub fn spawn_stdin_reader(end: StdinEnd) -> run::streams::Input {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = &buf[..n];
                    let eot = (end == StdinEnd::AtEot)
                        .then(|| chunk.iter().position(|&b| b == helper_vm::EOT))
                        .flatten();
                    if let Some(at) = eot {
                        let _ = tx.send(chunk[..at].to_vec());
                        break;
                    }
                    if tx.send(chunk.to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// This process's stdio as a request's streams.
#[derive(Default)]
pub struct StdStreams {
    input: std::cell::Cell<Option<StdinEnd>>,
}

impl StdStreams {
    /// With stdin as input (read from the first request that asks for it).
    pub fn with_input(input: Option<StdinEnd>) -> Self {
        StdStreams {
            input: std::cell::Cell::new(input),
        }
    }
}

impl run::streams::Streams for StdStreams {
    fn stdout(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(std::io::stdout())
    }
    fn stderr(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(std::io::stderr())
    }
    fn stdin(&self) -> Option<run::streams::Input> {
        self.input.take().map(spawn_stdin_reader)
    }
}

/// The user's terminal size (rows, columns), 24x80 when unknown.
pub fn size() -> (u16, u16) {
    // SAFETY: winsize is plain old data; all-zero is valid.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into `size`; on a descriptor
    // that is not a terminal it fails and leaves it zero.
    let known = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if known && size.ws_row > 0 && size.ws_col > 0 {
        (size.ws_row, size.ws_col)
    } else {
        (24, 80)
    }
}
