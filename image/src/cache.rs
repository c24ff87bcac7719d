//! Where detvisor keeps what it builds once and reuses (the guest image, the
//! helper VM's assets, the static agent, example images): one root for every
//! crate and script, `$DETVISOR_CACHE`, else `$HOME/.cache/detvisor`.

use std::ffi::OsString;
use std::path::PathBuf;

/// The cache root: `$DETVISOR_CACHE` when set and not empty, else
/// `$HOME/.cache/detvisor` (`/tmp/.cache/detvisor` without a usable `HOME`),
/// as the build scripts' `${DETVISOR_CACHE:-$HOME/.cache/detvisor}`.
pub fn cache_root() -> PathBuf {
    match std::env::var_os("DETVISOR_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home = std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| OsString::from("/tmp"));
            PathBuf::from(home).join(".cache/detvisor")
        }
    }
}
