//! `detvisor serve-channel` (hidden): what runs inside the helper VM (see
//! `helper_vm::client::serve`).

use anyhow::Result;

/// Serves requests until the host shuts the channel down.
pub fn serve() -> Result<u8> {
    helper_vm::client::serve()?;
    Ok(0)
}
