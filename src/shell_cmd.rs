//! `detvisor shell DIR@T`: an interactive shell inside the guest at a saved
//! moment, in a fork. The snapshot is restored into this process (replayed
//! exactly to T); the fork-shell listener every `run` guest carries (see
//! `guest::FORK_SHELL_LISTENER`) is woken on the machine's virtio console,
//! freezes the system under test and runs `sh -i` there. What happens in the
//! fork never touches the snapshot files: the saved history is unchanged.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::sync::mpsc;

use crate::guest::FORK_SHELL_END;
use crate::hostvm::EOT;
use crate::snapshots;
use vmm::exit::StopReason;

/// What the stdin reader passes on.
enum Input {
    Bytes(Vec<u8>),
    End,
}

/// Reads stdin on a thread of its own: bytes as they come, then `End` (at end
/// of file, or at an EOT byte, which is how the end of a forwarded stdin
/// arrives through the helper VM's serial line).
fn spawn_stdin_reader() -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = &buf[..n];
                    if let Some(end) = chunk.iter().position(|&b| b == EOT) {
                        let _ = tx.send(Input::Bytes(chunk[..end].to_vec()));
                        break;
                    }
                    if tx.send(Input::Bytes(chunk.to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Input::End);
    });
    rx
}

/// Runs the shell; returns the exit status for the process (0 when the shell
/// ended, 1 when the guest stopped under it).
pub fn run(spec: &str) -> Result<u8> {
    let resume = vmm::vm::ResumeConfig {
        until: None,
        record: vmm::record::RecordConfig::default(),
    };
    // The guest's own console (the workload's output) goes to stderr, the
    // shell to stdout.
    let mut restored = snapshots::restore(spec, &resume, Box::new(std::io::stderr()), None)?;
    if let Some(stop) = restored.stopped_early {
        bail!(
            "the guest stopped before that moment ({stop:?}): there is nothing to open a shell in"
        );
    }
    let session = &mut restored.session;
    if !session.has_control_channel() {
        bail!(
            "snapshot {} was taken of a machine without a shell channel (a virtio console): \
             take it again with this detvisor",
            restored.snapshot.meta.id
        );
    }
    eprintln!(
        "detvisor shell: a fork of {} at exit {}, virtual time {}; every process of the \
         guest is stopped while you look (end with `exit` or end of input)",
        restored.snapshot.meta.id,
        session.exits(),
        session.now()
    );
    let input = spawn_stdin_reader();
    // The listener's first line wakes it; the user's lines follow.
    session
        .send_to_agent(b"\n")
        .context("waking the guest's shell listener")?;
    let mut stdout = std::io::stdout();
    let mut seen = Vec::new();
    let mut input_ended = false;
    loop {
        // Input is delivered whenever it arrives: in a fork the moment of
        // delivery needs to be deterministic no more.
        while let Ok(message) = input.try_recv() {
            match message {
                Input::Bytes(bytes) => session.send_to_agent(&bytes)?,
                Input::End => {
                    input_ended = true;
                    session.send_to_agent(b"\nexit\n")?;
                }
            }
        }
        let stop = session.step_one()?;
        let out = session.take_agent_output();
        if !out.is_empty() {
            seen.extend_from_slice(&out);
            let text = strip_end_marker(&out);
            stdout.write_all(text)?;
            stdout.flush()?;
            if contains(&seen, FORK_SHELL_END.as_bytes()) {
                return Ok(0);
            }
            // Only the tail can still be the start of the marker.
            let keep = seen.len().saturating_sub(FORK_SHELL_END.len());
            seen.drain(..keep);
        }
        match stop {
            None => {}
            Some(StopReason::HaltedForever) => {
                // Nothing in the guest will happen until the user types.
                if input_ended {
                    bail!("the guest went idle without ending the shell");
                }
                match input.recv() {
                    Ok(Input::Bytes(bytes)) => session.send_to_agent(&bytes)?,
                    Ok(Input::End) | Err(_) => {
                        input_ended = true;
                        session.send_to_agent(b"\nexit\n")?;
                    }
                }
            }
            Some(other) => {
                eprintln!("detvisor shell: the guest stopped under the shell: {other:?}");
                return Ok(1);
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The output without the end marker's line (if it is in this chunk).
fn strip_end_marker(out: &[u8]) -> &[u8] {
    let marker = FORK_SHELL_END.as_bytes();
    match out.windows(marker.len()).position(|w| w == marker) {
        Some(at) => &out[..at],
        None => out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_marker_is_found_and_not_printed() {
        let out = format!("hello\n{FORK_SHELL_END}\n");
        assert_eq!(strip_end_marker(out.as_bytes()), b"hello\n");
        assert!(contains(out.as_bytes(), FORK_SHELL_END.as_bytes()));
        assert_eq!(strip_end_marker(b"plain"), b"plain");
    }
}
