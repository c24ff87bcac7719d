//! Where a campaign's runs happen: a [`Runner`] answers the run library's
//! requests, in this process ([`InProcess`], on a host whose KVM runs
//! Linux) or in a helper VM (`helper_vm::client`). The campaign itself, its
//! database and its findings stay in the calling process either way. The
//! client is the run library's ([`run::client`]); its names are kept here
//! for the engine's modules.

pub use run::client::{Calls, InProcess, Runner, RunnerError};
