//! The wire protocol between detvisor's VMM and its in-guest agent.
//!
//! The agent binary (`src/main.rs`) is PID 1 of multi-node guests; this
//! library holds only what both sides share: [`protocol`].

pub mod protocol;
