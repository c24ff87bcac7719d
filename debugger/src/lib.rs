//! detvisor's time-travel debugger, a library for people (the CLI's verbs)
//! and coding agents (the MCP server) alike: the moments of a finding,
//! commands, files and processes in the past without changing the history,
//! branches that run on, a fix verified against an unpatched control, when
//! a bug became likely, all within hard budgets. It is built on the run
//! library's typed requests and the campaign engine's findings and
//! sessions, never re-implementing them. See docs/debugging.md.
//!
//! - [`moment`]: a moment's id (`SOURCE[~ACTION]...@WHEN`);
//! - [`source`]: what a directory is (a finding, a campaign, snapshots);
//! - [`session`]: one held run and the checkpoints it keeps; reaching a
//!   moment;
//! - [`budget`]: the limits, what was used, the log;
//! - [`reading`]: events, properties, notable moments, nodes;
//! - [`inspect`]: commands, files, processes and the machine at a moment
//!   (in a fork), and commands in a branch that runs on;
//! - [`moving`]: rewinding, branching and waiting.

pub mod budget;
pub mod inspect;
pub mod likelihood;
pub mod moment;
pub mod moving;
pub mod rate;
pub mod reading;
pub mod session;
pub mod source;
pub mod verify;
