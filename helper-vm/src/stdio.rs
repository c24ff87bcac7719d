//! The launcher's side of QEMU's stdio: pumps that copy the payload's serial stdout and stderr
//! to where they go (keeping a tail for error messages), and the forwarder that copies our
//! stdin to the payload.

use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
#[cfg(test)]
use std::sync::Mutex;
use std::thread;

/// End of transmission: how the end of forwarded stdin reaches the payload (a serial line has
/// no end of file of its own).
pub const EOT: u8 = 0x04;

/// How much of each output stream is kept for error messages.
pub(crate) const TAIL_BYTES: usize = 4096;

/// The last `max` bytes of `bytes`.
pub(crate) fn tail(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(max)..]
}

/// Where a payload output stream goes.
#[derive(Clone)]
pub(crate) enum Target {
    Stdout,
    Stderr,
    /// Nowhere: only the tail is kept, for error messages.
    Discard,
    /// Collected in memory (tests).
    #[cfg(test)]
    Buffer(Arc<Mutex<Vec<u8>>>),
}

/// Copies `from` to `to` as data arrives; returns the last [`TAIL_BYTES`]. Sets `spoke` at the
/// first byte. Keeps draining (and discarding) when `to` is closed so QEMU never blocks.
pub(crate) fn pump(mut from: io::PipeReader, to: Target, spoke: &AtomicBool) -> Vec<u8> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = Vec::new();
    let mut broken = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        spoke.store(true, Ordering::Release);
        last.extend_from_slice(chunk);
        if last.len() > 2 * TAIL_BYTES {
            last.drain(..last.len() - TAIL_BYTES);
        }
        if !broken {
            let written = match &to {
                Target::Stdout => {
                    let mut o = io::stdout().lock();
                    o.write_all(chunk).and_then(|()| o.flush())
                }
                Target::Stderr => {
                    let mut e = io::stderr().lock();
                    e.write_all(chunk).and_then(|()| e.flush())
                }
                Target::Discard => Ok(()),
                #[cfg(test)]
                Target::Buffer(buf) => buf
                    .lock()
                    .map_err(|_| io::Error::other("poisoned"))
                    .map(|mut b| b.extend_from_slice(chunk)),
            };
            broken = written.is_err();
        }
    }
    tail(&last, TAIL_BYTES).to_vec()
}

/// Whether stdin is a terminal whose foreground process group is ours. Only then is it
/// forwarded to the payload: reading it from a background group (e.g. under `timeout`, which
/// runs its command in a process group of its own) would stop us with SIGTTIN.
pub(crate) fn stdin_is_foreground_terminal() -> bool {
    if !io::stdin().is_terminal() {
        return false;
    }
    // SAFETY: tcgetpgrp and getpgrp only query the kernel about fd 0 and this process.
    unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Waits until `fd` is readable (`true`) or `stop` is readable or closed (`false`).
/// `timeout_ms` < 0 waits without limit; a timeout returns `true` only if `fd` became ready.
pub(crate) fn poll_pair(fd: i32, stop: i32, timeout_ms: i32) -> io::Result<Option<bool>> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: fds is a valid array of 2 pollfd structs that outlives the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            return Ok(Some(false));
        }
        if fds[0].revents != 0 {
            return Ok(Some(true));
        }
        return Ok(None); // timed out
    }
}

/// Reads `fd` once without any buffering (so no input that belongs to whoever reads it after
/// us is kept), retrying on EINTR.
pub(crate) fn read_raw(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is valid for writes of buf.len() bytes; the caller keeps fd open.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got >= 0 {
            return Ok(got as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Copies our stdin (a terminal, left in its own mode: lines arrive when Enter is pressed) to
/// QEMU's stdin until our stdin ends or [`StdinForwarder::stop`].
pub(crate) struct StdinForwarder {
    stop_w: io::PipeWriter,
    thread: thread::JoinHandle<()>,
}

impl StdinForwarder {
    /// With `eot_at_end`, the end of our stdin is passed on as one EOT byte;
    /// with `wait_for`, nothing is forwarded before that flag is set.
    pub(crate) fn start(
        mut to_qemu: io::PipeWriter,
        eot_at_end: bool,
        wait_for: Option<Arc<AtomicBool>>,
    ) -> io::Result<Self> {
        let (stop_r, stop_w) = io::pipe()?;
        let thread = thread::spawn(move || {
            let stop = stop_r.as_raw_fd();
            if let Some(flag) = wait_for {
                while !flag.load(Ordering::Acquire) {
                    // Wait on the stop pipe alone (-1 is never ready): 50 ms steps.
                    if !matches!(poll_pair(-1, stop, 50), Ok(None)) {
                        return; // stopped before the payload spoke
                    }
                }
            }
            let stdin = io::stdin();
            let fd = stdin.as_fd().as_raw_fd();
            let mut buf = [0u8; 4096];
            loop {
                match poll_pair(fd, stop, -1) {
                    Ok(Some(true)) => {}
                    Ok(None) => continue,
                    Ok(Some(false)) | Err(_) => return,
                }
                let got = match read_raw(fd, &mut buf) {
                    Ok(n) => n,
                    Err(_) => return,
                };
                if got == 0 {
                    if eot_at_end {
                        let _ = to_qemu.write_all(&[EOT]);
                    }
                    return; // end of our input
                }
                if to_qemu.write_all(&buf[..got]).is_err() {
                    return; // QEMU is gone
                }
            }
        });
        Ok(Self { stop_w, thread })
    }

    pub(crate) fn stop(self) {
        drop(self.stop_w); // makes stop_r readable (EOF)
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pump_keeps_a_tail_and_copies_everything() {
        let (r, mut w) = io::pipe().unwrap();
        let buf = Arc::new(Mutex::new(Vec::new()));
        let spoke = AtomicBool::new(false);
        let data: Vec<u8> = (0..3 * TAIL_BYTES).map(|i| i as u8).collect();
        let writer = {
            let data = data.clone();
            thread::spawn(move || w.write_all(&data).unwrap())
        };
        let last = pump(r, Target::Buffer(buf.clone()), &spoke);
        writer.join().unwrap();
        assert!(spoke.load(Ordering::Acquire));
        assert_eq!(*buf.lock().unwrap(), data);
        assert_eq!(last, tail(&data, TAIL_BYTES));
    }

    #[test]
    fn poll_pair_sees_data_stop_and_timeout() {
        let (r, mut w) = io::pipe().unwrap();
        let (stop_r, stop_w) = io::pipe().unwrap();
        let (fd, stop) = (r.as_raw_fd(), stop_r.as_raw_fd());
        assert_eq!(poll_pair(fd, stop, 10).unwrap(), None);
        w.write_all(b"x").unwrap();
        assert_eq!(poll_pair(fd, stop, -1).unwrap(), Some(true));
        let mut b = [0u8; 4];
        assert_eq!(read_raw(fd, &mut b).unwrap(), 1);
        drop(stop_w);
        assert_eq!(poll_pair(fd, stop, -1).unwrap(), Some(false));
    }
}
