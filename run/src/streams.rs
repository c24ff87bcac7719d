//! Where a request's output goes and its input comes from: this process's
//! stdio for the CLI on the host, frames on the helper-VM channel inside it,
//! buffers in tests.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Input for the guest or a fork's shell, chunk by chunk; the sender's drop
/// is the end of input.
pub type Input = std::sync::mpsc::Receiver<Vec<u8>>;

/// The streams a request writes to and reads from.
pub trait Streams {
    /// The guest's console, an `up` run's node output, a shell's terminal.
    fn stdout(&self) -> Box<dyn Write + Send>;
    /// Events and progress lines for people.
    fn stderr(&self) -> Box<dyn Write + Send>;
    /// Input for an interactive console or shell (`None`: there is none).
    fn stdin(&self) -> Option<Input>;
}

/// Output thrown away, no input.
pub struct Discard;

impl Streams for Discard {
    fn stdout(&self) -> Box<dyn Write + Send> {
        Box::new(std::io::sink())
    }
    fn stderr(&self) -> Box<dyn Write + Send> {
        Box::new(std::io::sink())
    }
    fn stdin(&self) -> Option<Input> {
        None
    }
}

/// Output kept in memory (for tests and callers that read it afterwards).
#[derive(Clone, Default)]
pub struct Captured {
    pub stdout: Arc<Mutex<Vec<u8>>>,
    pub stderr: Arc<Mutex<Vec<u8>>>,
}

impl Captured {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap_or_else(|e| e.into_inner())).into()
    }
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into()
    }
}

/// A writer appending to a shared buffer.
pub struct SharedBuffer(pub Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Streams for Captured {
    fn stdout(&self) -> Box<dyn Write + Send> {
        Box::new(SharedBuffer(self.stdout.clone()))
    }
    fn stderr(&self) -> Box<dyn Write + Send> {
        Box::new(SharedBuffer(self.stderr.clone()))
    }
    fn stdin(&self) -> Option<Input> {
        None
    }
}

/// A line for people on `streams`' stderr (lost lines lose nothing of a run).
pub fn say(streams: &dyn Streams, line: &str) {
    let _ = writeln!(streams.stderr(), "{line}");
}

/// `input` up to its first EOT byte (Ctrl-D), which ends it: how a fork's
/// shell takes the end of the user's input from a raw terminal.
pub fn until_eot(input: Input) -> Input {
    const EOT: u8 = 0x04;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for chunk in input {
            if let Some(end) = chunk.iter().position(|&b| b == EOT) {
                let _ = tx.send(chunk[..end].to_vec());
                return;
            }
            if tx.send(chunk).is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_input_ends_at_the_first_eot() {
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(b"ls\n".to_vec()).unwrap();
        tx.send(b"exit\x04more".to_vec()).unwrap();
        tx.send(b"never".to_vec()).unwrap();
        let got: Vec<Vec<u8>> = until_eot(rx).into_iter().collect();
        assert_eq!(got, vec![b"ls\n".to_vec(), b"exit".to_vec()]);
    }
}
