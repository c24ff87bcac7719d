//! `detvisor shell DIR@T`: an interactive shell inside the guest at a saved
//! moment, in a fork. The snapshot is restored into this process (replayed
//! exactly to T); the fork-shell listener every `run` guest carries (see
//! `guest::FORK_SHELL_LISTENER`) is woken on the machine's virtio console,
//! freezes the system under test and runs `sh -i` there. What happens in the
//! fork never touches the snapshot files: the saved history is unchanged.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::sync::mpsc;
use std::time::Duration;

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
    // Output not yet printed: it might be the start of the end marker.
    let mut held = Vec::new();
    let mut input_ended = false;
    let woken_at = session.now();
    let mut listener_answered = false;
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
        let before = session.now();
        let stop = session.step_one()?;
        let out = session.take_agent_output();
        // An idle guest jumps to its next timer: pace such jumps by the wall
        // clock (at most 50 ms at a time) while waiting for input, instead of
        // racing through virtual time on a spinning host CPU.
        let jumped = session.now().0.saturating_sub(before.0);
        if jumped > IDLE_JUMP_NS && out.is_empty() && !input_ended {
            let wait = Duration::from_nanos(jumped.min(MAX_IDLE_WAIT_NS));
            match input.recv_timeout(wait) {
                Ok(Input::Bytes(bytes)) => session.send_to_agent(&bytes)?,
                Ok(Input::End) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    input_ended = true;
                    session.send_to_agent(b"\nexit\n")?;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        if !out.is_empty() {
            listener_answered = true;
            held.extend_from_slice(&out);
            let (print, ended) = split_output(&held);
            stdout.write_all(&held[..print])?;
            stdout.flush()?;
            if ended {
                return Ok(0);
            }
            held.drain(..print);
        } else if !listener_answered && session.now().0 > woken_at.0 + LISTENER_BUDGET.0 {
            bail!(
                "no fork-shell listener answered in this guest (a `run` without a command has \
                 none: its shell is on the console; or the snapshot was taken before the \
                 listener started)"
            );
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

/// A step that advanced virtual time by more than this was an idle jump.
const IDLE_JUMP_NS: u64 = 1_000_000;
/// Longest wall-clock wait for input after one idle jump.
const MAX_IDLE_WAIT_NS: u64 = 50_000_000;

/// How much virtual time the listener has to answer the wake-up line.
const LISTENER_BUDGET: vmm::VirtNanos = vmm::VirtNanos(30_000_000_000);

/// How many bytes of `held` can be printed, and whether the end marker is
/// there (then everything before it is printed and nothing after). Bytes at
/// the end that could begin the marker are held back.
fn split_output(held: &[u8]) -> (usize, bool) {
    let marker = FORK_SHELL_END.as_bytes();
    if let Some(at) = held.windows(marker.len()).position(|w| w == marker) {
        return (at, true);
    }
    let keep = (1..marker.len().min(held.len() + 1))
        .rev()
        .find(|&n| held.ends_with(&marker[..n]))
        .unwrap_or(0);
    (held.len() - keep, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_marker_is_found_and_not_printed() {
        let out = format!("hello\n{FORK_SHELL_END}\n");
        assert_eq!(split_output(out.as_bytes()), (6, true));
        assert_eq!(split_output(b"plain"), (5, false));
    }

    #[test]
    fn a_marker_split_across_chunks_is_held_back_not_printed() {
        let marker = FORK_SHELL_END.as_bytes();
        let mut held = b"# out\n".to_vec();
        held.extend_from_slice(&marker[..5]);
        // Only the text before the possible marker start is printed.
        assert_eq!(split_output(&held), (6, false));
        held.drain(..6);
        held.extend_from_slice(&marker[5..]);
        held.push(b'\n');
        assert_eq!(split_output(&held), (0, true));
    }
}
