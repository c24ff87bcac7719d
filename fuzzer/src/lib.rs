//! detvisor's campaign engine: it searches the histories of a system under
//! test for those in which a property breaks, and hands back a reproducer.
//!
//! A caller of the run library ([`run::api`]), in-process or through the
//! helper VM: it boots a run to its `setup_complete` moment, branches moments
//! of a tree with new seeds and faults, judges each branch by the properties
//! the guest reported and by checking its recorded history, keeps its state
//! in a database, and writes one directory per distinct failure.

pub mod budget;
pub mod campaign;
pub mod campaign_dir;
pub mod engine;
pub mod failure;
pub mod failure_moment;
pub mod findings;
pub mod judge;
pub mod judges;
pub mod linearizability;
pub mod listing;
pub mod node_logs;
pub mod profile;
pub mod properties;
pub mod replay;
pub mod session;
pub mod shard;
pub mod shrink;
pub mod shrink_finding;
pub mod silence;
pub mod sizing;
pub mod spec;
pub mod spill;
pub mod stats;
pub mod step;
pub mod store;
pub mod tree;
pub mod triage;
pub mod worker;
