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

/// Reads stdin on a thread and hands each chunk to the VMM.
pub fn spawn_stdin_reader() -> vmm::vm::ConsoleInput {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 256];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}
