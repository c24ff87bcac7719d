//! detvisor's run library: everything that owns a run, between the VMM
//! (`vmm`) and whatever drives runs: the CLI's verbs, the campaign engine
//! (`fuzzer`), the benchmarks and the helper VM's server.
//!
//! A run boots or is restored, steps exit by exit, runs until a time, an exit
//! or its end, returns in memory to a checkpoint, writes snapshots, takes
//! faults and new seeds, and reports one [`RunSummary`]. The `up` conductor
//! (the host side of the in-guest agent's conversation), manifests, fault
//! schedules, the determinism audit and soak, and traces live here too.
//! Callers speak one typed request API, [`api::Request`] /
//! [`api::Response`], answered by an [`api::Controller`] in this process or
//! in a helper VM, where the same enum crosses serialized; they send it
//! through the typed calls of [`client`], which check each answer's kind. Getting it there
//! is the `helper-vm` crate's business, a floor above this one: the library
//! never depends on it (only this crate's end-to-end tests place themselves
//! with it).
//!
//! The modules import one another in one direction, from the bottom up:
//! the leaves (`units`, `outcome`, `moment`, `streams`, `guest`, `pcap`,
//! `trace`, `composer`); then `faults`, `manifest`, an `up` run's `event`s
//! and the `records` kept of them; the `conversation` with the in-guest
//! agent (the up run's driver and its saved state); [`driven`], a run
//! between two exits, which steps either kind of run; `snapshots` and
//! `spill`; the plain run, `branch` and `seeds`; `audit`; the `up` run from
//! manifest to summary (which re-exports the conversation's types under
//! `up::`); `shell` and `soak`; and on top the request [`api`] and its
//! [`client`]. A module never imports one above it.

pub mod api;
pub mod audit;
pub mod branch;
pub mod client;
pub mod composer;
pub mod conversation;
pub mod driven;
pub mod event;
pub mod faults;
pub mod guest;
pub mod inspect;
pub mod manifest;
pub mod moment;
pub mod outcome;
pub mod pcap;
pub mod plain;
pub mod records;
pub mod seeds;
pub mod shell;
pub mod snapshots;
pub mod soak;
pub mod spill;
pub mod streams;
pub mod trace;
pub mod units;
pub mod up;

pub use outcome::{exit_status, RunSummary};

/// An error and its causes as one line, `a: b: c` (as anyhow's `{:#}` prints
/// them): for the texts that must carry a whole chain, serde's messages.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Files for tests.
#[cfg(test)]
pub(crate) mod test_files {
    use std::path::{Path, PathBuf};

    /// A FIFO named `name` in `dir`: a file nothing may wait on.
    pub fn fifo(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        let status = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success());
        path
    }
}
