//! `detvisor gdb`: a gdb remote-protocol server (the `gdbstub` crate) on
//! a held run of the run library, through any runner (this process or a
//! helper VM).
//!
//! gdb sees one x86-64 CPU: its registers, guest virtual memory through
//! the guest's page tables, `stepi`, `continue` to software breakpoints
//! (kernel addresses: see `vmm::vm::breakpoints`), and reverse execution
//! (`reverse-stepi`, `reverse-continue`) by returning to a checkpoint and
//! replaying deterministically ([`timeline`]). Every stop is an
//! instruction position of the history (`monitor position` names it), the
//! same on every run and host. The listener is a network socket: it runs
//! in this process's own threads, never under the VMM's seccomp filter
//! (see docs/security.md).

pub mod target;
pub mod timeline;

pub use target::{serve_connection, GdbTarget};
pub use timeline::{Stop, Timeline, TimelineError};

use std::net::{SocketAddr, TcpListener};

/// Why serving gdb failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listening on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("accepting gdb's connection")]
    Accept(#[source] std::io::Error),
    #[error("the gdb connection: {0}")]
    Protocol(String),
}

/// A listener bound for gdb (bound first, so a caller can say where).
pub fn bind(addr: &str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).map_err(|source| ServeError::Listen {
        addr: addr.to_owned(),
        source,
    })
}

/// Serves one gdb connection on `listener` (told to `on_connect`) until
/// gdb kills, detaches or disconnects; how it ended.
pub fn serve(
    listener: &TcpListener,
    target: &mut GdbTarget,
    mut on_connect: impl FnMut(SocketAddr),
) -> Result<gdbstub::stub::DisconnectReason, ServeError> {
    let (stream, peer) = listener.accept().map_err(ServeError::Accept)?;
    on_connect(peer);
    // gdb's packets are small and answered one by one.
    let _ = stream.set_nodelay(true);
    serve_connection(target, Box::new(stream)).map_err(ServeError::Protocol)
}
