//! The guest console on the host side: output forwarded live and folded
//! into the run's console hash, and interactive keystrokes fed to the UART.

use crate::exit::Machine;
use crate::record::ChainHash;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Console output: forwarded live, and hashed into the digest.
pub(super) struct ConsoleSink {
    pub(super) shared: Arc<Mutex<ConsoleCapture>>,
}

/// Where console output goes, and what of it the digest has seen.
pub(super) struct ConsoleCapture {
    pub(super) out: Box<dyn Write + Send>,
    pub(super) hash: ChainHash,
    pub(super) bytes: u64,
}

impl ConsoleCapture {
    /// Folds `bytes` into the console hash and count.
    pub(super) fn absorb(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
        self.bytes += bytes.len() as u64;
    }
}

/// Locks the shared capture. Poison is ignored: a panic elsewhere must not
/// silence the console or lose its hash.
pub(super) fn lock(shared: &Mutex<ConsoleCapture>) -> std::sync::MutexGuard<'_, ConsoleCapture> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut capture = lock(&self.shared);
        capture.absorb(buf);
        // The host side of the console may go away (a closed pipe); the
        // guest's history must not depend on that, so errors are dropped.
        let _ = capture.out.write_all(buf);
        if buf.contains(&b'\n') {
            let _ = capture.out.flush();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = lock(&self.shared).out.flush();
        Ok(())
    }
}

/// Keystrokes for the guest console, from an interactive terminal. They
/// arrive on host time, so a run that takes them is not reproducible.
pub type ConsoleInput = std::sync::mpsc::Receiver<Vec<u8>>;

/// Moves pending console input into the UART; on a halt with nothing else to
/// do, waits for it: until the next timer deadline, in wall time (so an idle
/// interactive guest's clock roughly follows the user's), or indefinitely when
/// no timer is pending.
pub(super) fn feed_console_input(machine: &mut Machine, input: &ConsoleInput, halted: bool) {
    let mut fed = false;
    while let Ok(bytes) = input.try_recv() {
        machine.devices.enqueue_console_input(&bytes);
        fed = true;
    }
    if fed || !halted || machine.devices.has_pending_interrupt() {
        return;
    }
    let received = match machine.devices.next_deadline() {
        Some(deadline) => {
            let wait = deadline.saturating_sub(machine.now());
            input.recv_timeout(Duration::from_nanos(wait.0)).ok()
        }
        None => input.recv().ok(),
    };
    if let Some(bytes) = received {
        machine.devices.enqueue_console_input(&bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn console_output_is_forwarded_counted_and_hashed() {
        let out = Shared::default();
        let shared = Arc::new(Mutex::new(ConsoleCapture {
            out: Box::new(out.clone()),
            hash: ChainHash::default(),
            bytes: 0,
        }));
        let mut sink = ConsoleSink {
            shared: shared.clone(),
        };
        sink.write_all(b"hello\n").unwrap();
        let mut expected = ChainHash::default();
        expected.update(b"hello\n");
        let capture = lock(&shared);
        assert_eq!(capture.bytes, 6);
        assert_eq!(capture.hash, expected);
        assert_eq!(out.0.lock().unwrap().as_slice(), b"hello\n");
    }
}
