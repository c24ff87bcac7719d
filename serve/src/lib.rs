//! `detvisor serve`: the debugger library over MCP, for coding agents.
//! Every operation of the `debugger` crate is a tool with the CLI verb's
//! name and `--json` result; over stdio (one client) or streamable HTTP
//! (several, each with a session of its own), within budgets that the
//! server enforces for all clients together and for each.
//!
//! - [`tools`]: the tools, their arguments and schemas;
//! - [`client`]: one client's debugger sessions and calls, on a thread of
//!   its own;
//! - [`handler`]: the MCP side of a client session (rmcp);
//! - [`runner`]: the one runner all sessions share (a helper VM kept for
//!   every call where one is needed);
//! - [`paths`]: every path stays inside the server's root;
//! - [`http`]: the HTTP listener: loopback, `Origin`, bearer token.
//!
//! Process layout (docs/security.md): the async runtime, the listener and
//! the clients' threads run in this process, never under the VMM's seccomp
//! filter; guests run on the run library's own thread here (filtered per
//! thread) or in the helper VM's serving process (filtered whole).

pub mod client;
pub mod handler;
pub mod http;
pub mod paths;
pub mod runner;
mod stdio;
pub mod tools;

use client::Shared;
use debugger::budget::{Limits, SharedBudget, SharedLimits, SharedScope};
use handler::Handler;
use helper_vm::Placement;
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--root {}: not a directory", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the server's threads")]
    Threads(#[source] std::io::Error),
    #[error("setting the protocol's stdout apart")]
    Stdout(#[source] std::io::Error),
    #[error("the MCP session over stdio")]
    Stdio(#[source] std::io::Error),
    #[error("the MCP session over stdio ended with an error: {0}")]
    Session(String),
    #[error(transparent)]
    Http(#[from] http::HttpError),
}

/// What a server serves and within which limits.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub root: PathBuf,
    pub placement: Placement,
    pub seccomp: bool,
    /// Each debugger session's limits (a client has one per source).
    pub session_limits: Limits,
    /// One client's limits, all its sessions together.
    pub client_limits: SharedLimits,
    /// All clients' limits together.
    pub server_limits: SharedLimits,
    pub usage_log: Option<PathBuf>,
    /// The most bytes a result may hold.
    pub max_result_bytes: usize,
    /// The most bytes `extract` reads.
    pub max_extract_bytes: u64,
    /// The helper VM's memory at least, MiB.
    pub helper_memory_mib: u32,
    /// The longest request (a stdio line, an HTTP body), bytes.
    pub max_request_bytes: usize,
}

/// The longest request by default.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 << 20;

/// The default size limit of one result.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 8 << 20;
/// The default size limit of `extract`.
pub const DEFAULT_MAX_EXTRACT_BYTES: u64 = 4 << 20;
/// The shared helper VM's memory by default (it holds several clients'
/// runs).
pub const DEFAULT_HELPER_MEMORY_MIB: u32 = 6144;

/// The server's state every client shares.
fn shared(options: &ServeOptions) -> Result<Arc<Shared>, ServeError> {
    let root = paths::Root::new(&options.root).map_err(|source| ServeError::Root {
        path: options.root.clone(),
        source,
    })?;
    // Snapshots of `up` runs name their disks' base images in the node
    // disks' cache: shared with a helper VM at its own path.
    let disks = run::guest::cache_root().join("disks");
    let _ = std::fs::create_dir_all(&disks);
    let mut shared_dirs = vec![root.dir().to_path_buf()];
    if let Ok(disks) = disks.canonicalize() {
        shared_dirs.push(disks);
    }
    let in_helper_vm = matches!(options.placement, Placement::HelperVm { .. });
    let runner = runner::SharedRunner::start(runner::RunnerOptions {
        placement: options.placement.clone(),
        seccomp: options.seccomp,
        shared_dirs,
        helper_memory_mib: options.helper_memory_mib,
    })
    .map_err(ServeError::Threads)?;
    Ok(Arc::new(Shared {
        root,
        runner,
        in_helper_vm,
        place: fuzzer::campaign::Place {
            host_vm: if in_helper_vm {
                helper_vm::HostVmMode::Always
            } else {
                helper_vm::HostVmMode::Never
            },
            seccomp: options.seccomp,
        },
        server_budget: SharedBudget::new(SharedScope::Server, options.server_limits.clone()),
        session_limits: options.session_limits.clone(),
        client_limits: options.client_limits.clone(),
        usage_log: options.usage_log.clone(),
        max_result_bytes: options.max_result_bytes,
        max_extract_bytes: options.max_extract_bytes,
    }))
}

fn runtime() -> Result<tokio::runtime::Runtime, ServeError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServeError::Threads)
}

/// Serves one client over this process's stdin and stdout until it goes.
/// Anything else written to stdout (a run's output) goes to stderr
/// instead: stdout is the protocol's.
pub fn serve_stdio(options: &ServeOptions) -> Result<(), ServeError> {
    let protocol_out = stdout_apart().map_err(ServeError::Stdout)?;
    let shared = shared(options)?;
    let tools = Arc::new(tools::all());
    let handler = Handler::new(shared, tools).map_err(ServeError::Threads)?;
    let max_line = options.max_request_bytes;
    runtime()?.block_on(async move {
        let out = tokio::fs::File::from_std(protocol_out);
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (from_rmcp, to_rmcp) = tokio::io::split(ours);
        tokio::spawn(stdio::pump(
            tokio::io::stdin(),
            out,
            from_rmcp,
            to_rmcp,
            max_line,
        ));
        let service = handler
            .serve(tokio::io::split(theirs))
            .await
            .map_err(|e| ServeError::Session(e.to_string()))?;
        service
            .waiting()
            .await
            .map_err(|e| ServeError::Session(e.to_string()))?;
        Ok(())
    })
}

/// Serves clients over streamable HTTP (see [`http`]) until interrupted.
pub fn serve_http(options: &ServeOptions, http: &http::HttpOptions) -> Result<(), ServeError> {
    let shared = shared(options)?;
    runtime()?.block_on(http::serve(shared, http))?;
    Ok(())
}

/// This process's stdout as a file of its own, fd 1 pointed at stderr from
/// now on (for everything else that writes to stdout).
fn stdout_apart() -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: dup of fd 1, which this process holds open; the new fd is
    // owned by the File made from it below and by nothing else.
    let fd = unsafe { libc::dup(1) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by dup and is owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    // SAFETY: dup2 of two fds this process holds open; fd 1 now writes
    // where fd 2 does.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}
