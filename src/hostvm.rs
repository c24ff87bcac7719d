//! Moved to the `helper-vm` crate; this shim keeps the old paths until the CLI uses it directly.
pub use helper_vm::{ensure_assets, payload_path, run, HelperVmConfig, PayloadFile, EOT};
