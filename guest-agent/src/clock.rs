//! Per-node clocks: each node has its own time namespace, made once when the
//! node is created and kept (by a descriptor) across restarts, so a
//! restarted node keeps its clock. The guest kernel's
//! `0003-timens-runtime-realtime-offset-and-rate.patch` gives a time
//! namespace a CLOCK_REALTIME offset and rate that can change while tasks
//! are in it, through `/proc/<pid>/timens_realtime` (of the namespace the
//! task's children get): writes `step <ns>` or `rate <ppb>`, reads
//! `offset <ns>\nrate <ppb>\n`. Monotonic and boot time are the
//! namespace's ordinary offsets, which stay 0: they never jump.
//!
//! A kernel without time namespaces (`CONFIG_TIME_NS` off: images built
//! before the patch) still runs nodes, without a clock of their own; clock
//! requests then fail with a message saying so.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::sys;

/// The agent's own time namespace (the guest's), to return to; `None`
/// when the kernel has no time namespaces.
pub fn own_timens() -> Option<OwnedFd> {
    sys::open(Path::new("/proc/self/ns/time"), libc::O_RDONLY).ok()
}

/// A new time namespace for a node, held by a descriptor (`None` without
/// time namespaces). The agent itself stays where it is: `unshare` only
/// changes the namespace of its future children, which `setns` back to
/// `own` resets at once.
pub fn new_timens(own: Option<BorrowedFd<'_>>) -> io::Result<Option<OwnedFd>> {
    let Some(own) = own else {
        return Ok(None);
    };
    sys::unshare(libc::CLONE_NEWTIME)
        .map_err(|e| io::Error::new(e.kind(), format!("unshare(CLONE_NEWTIME): {e}")))?;
    let timens = sys::open(Path::new("/proc/self/ns/time_for_children"), libc::O_RDONLY);
    sys::setns(own, libc::CLONE_NEWTIME).expect("return to the agent's time namespace");
    timens
        .map(Some)
        .map_err(|e| io::Error::new(e.kind(), format!("open the new time namespace: {e}")))
}

/// A change of a node's realtime clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockChange {
    /// Add this many ns (negative: back).
    Step(i64),
    /// Run this many ppm fast from now on (0: stop drifting).
    Rate(i32),
}

/// The namespace's realtime offset now (drift included) and its rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockState {
    pub offset_ns: i64,
    pub rate_ppm: i32,
}

/// Applies `change` to the time namespace `timens` and reads back its
/// state. The agent enters the namespace for the write (its
/// `/proc/self/timens_realtime` is then the node's, whether or not the
/// node runs) and returns to `own` right after.
pub fn change(
    timens: BorrowedFd<'_>,
    own: BorrowedFd<'_>,
    change: ClockChange,
) -> io::Result<ClockState> {
    let line = match change {
        ClockChange::Step(ns) => format!("step {ns}\n"),
        ClockChange::Rate(ppm) => format!("rate {}\n", i64::from(ppm) * 1000),
    };
    sys::setns(timens, libc::CLONE_NEWTIME)
        .map_err(|e| io::Error::new(e.kind(), format!("enter the node's time namespace: {e}")))?;
    let result = (|| {
        let path = Path::new("/proc/self/timens_realtime");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{path:?}: {e}")))?;
        file.write_all(line.as_bytes())
            .map_err(|e| io::Error::new(e.kind(), format!("write {:?}: {e}", line.trim())))?;
        let mut text = String::new();
        std::fs::File::open(path)?.read_to_string(&mut text)?;
        parse_state(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path:?} reads {text:?}"),
            )
        })
    })();
    sys::setns(own.as_fd(), libc::CLONE_NEWTIME).expect("return to the agent's time namespace");
    result
}

/// `offset <ns>\nrate <ppb>\n`, as the kernel prints it.
fn parse_state(text: &str) -> Option<ClockState> {
    let mut offset_ns = None;
    let mut rate_ppb = None;
    for line in text.lines() {
        match line.split_once(' ')? {
            ("offset", value) => offset_ns = value.trim().parse::<i64>().ok(),
            ("rate", value) => rate_ppb = value.trim().parse::<i64>().ok(),
            _ => {}
        }
    }
    Some(ClockState {
        offset_ns: offset_ns?,
        rate_ppm: i32::try_from(rate_ppb? / 1000).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_state() {
        assert_eq!(
            parse_state("offset -2000000000\nrate 200000\n"),
            Some(ClockState {
                offset_ns: -2_000_000_000,
                rate_ppm: 200
            })
        );
        assert_eq!(parse_state("offset 1\n"), None);
        assert_eq!(parse_state("garbage"), None);
    }
}
