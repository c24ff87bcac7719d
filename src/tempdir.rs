//! Moved to the `helper-vm` crate; this shim keeps the old path until the CLI uses it directly.
pub use helper_vm::TempDir;
