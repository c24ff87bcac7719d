//! `detvisor serve --root DIR [--http ADDR]`: the debugger over MCP for
//! coding agents. Flags and wiring only; the server is the `serve` crate's.

use crate::PlaceArgs;
use anyhow::{Context, Result};
use clap::Args;
use debugger::budget::{Limits, SharedLimits};
use std::net::SocketAddr;
use std::path::PathBuf;
use vmm::VirtNanos;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Every path a call names stays inside this directory (campaigns,
    /// findings, patched images).
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Serve MCP over streamable HTTP at this address (e.g.
    /// 127.0.0.1:7700, at /mcp) instead of over stdio.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// With --http: listen on an address that is not loopback.
    #[arg(long, requires = "http")]
    http_any_address: bool,
    /// With --http: where the bearer token is written (mode 0600; default
    /// ${DETVISOR_CACHE:-~/.cache/detvisor}/serve/token). The token is made
    /// here, or given in DETVISOR_SERVE_TOKEN.
    #[arg(long, value_name = "FILE", requires = "http")]
    token_file: Option<PathBuf>,
    /// With --http: another Origin allowed (e.g. http://localhost:3000).
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    allow_origins: Vec<String>,
    /// Wall time of all calls of all clients together (e.g. 30m).
    #[arg(long, value_name = "DURATION")]
    budget_wall: Option<VirtNanos>,
    /// Virtual time all clients may simulate together (e.g. 2h).
    #[arg(long, value_name = "DURATION")]
    budget_virtual: Option<VirtNanos>,
    /// Branches all clients may create together.
    #[arg(long, value_name = "N")]
    budget_branches: Option<u64>,
    /// Bytes all clients may be returned together (files, command output).
    #[arg(long, value_name = "BYTES")]
    budget_bytes: Option<u64>,
    /// Each client's limits (all its sessions together), as the server's:
    /// wall time of its calls.
    #[arg(long, value_name = "DURATION")]
    client_budget_wall: Option<VirtNanos>,
    #[arg(long, value_name = "DURATION")]
    client_budget_virtual: Option<VirtNanos>,
    #[arg(long, value_name = "N")]
    client_budget_branches: Option<u64>,
    #[arg(long, value_name = "BYTES")]
    client_budget_bytes: Option<u64>,
    /// Each debugger session's limits (a client has one per source), a
    /// JSON object of docs/debugging.md's budget fields.
    #[arg(long, value_name = "FILE")]
    budget: Option<PathBuf>,
    /// Append each call's use here, a JSON line each (default:
    /// ${DETVISOR_CACHE:-~/.cache/detvisor}/debugger/usage.jsonl).
    #[arg(long, value_name = "FILE")]
    usage_log: Option<PathBuf>,
    /// The most bytes one result may hold.
    #[arg(long, default_value_t = serve::DEFAULT_MAX_RESULT_BYTES)]
    max_result_bytes: usize,
    /// The most bytes `extract` reads.
    #[arg(long, default_value_t = serve::DEFAULT_MAX_EXTRACT_BYTES)]
    max_extract_bytes: u64,
    /// The longest request (a stdio line, an HTTP body), bytes.
    #[arg(long, default_value_t = serve::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// The shared helper VM's memory (MiB) at least, where runs go through
    /// one.
    #[arg(long, default_value_t = serve::DEFAULT_HELPER_MEMORY_MIB)]
    helper_memory: u32,
    #[command(flatten)]
    place: PlaceArgs,
}

fn shared_limits(
    wall: Option<VirtNanos>,
    virtual_time: Option<VirtNanos>,
    branches: Option<u64>,
    bytes: Option<u64>,
) -> SharedLimits {
    let none = SharedLimits::default();
    SharedLimits {
        wall: wall.unwrap_or(none.wall),
        virtual_time: virtual_time.unwrap_or(none.virtual_time),
        branches_created: branches.unwrap_or(none.branches_created),
        bytes: bytes.unwrap_or(none.bytes),
    }
}

pub fn cmd_serve(args: ServeArgs) -> Result<u8> {
    let session_limits = match &args.budget {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--budget {}", path.display()))?;
            serde_json::from_str::<Limits>(&text)
                .with_context(|| format!("--budget {}", path.display()))?
        }
        None => Limits::default(),
    };
    let options = serve::ServeOptions {
        root: args.root,
        placement: helper_vm::placement(args.place.host_vm),
        seccomp: !args.place.no_seccomp,
        session_limits,
        client_limits: shared_limits(
            args.client_budget_wall,
            args.client_budget_virtual,
            args.client_budget_branches,
            args.client_budget_bytes,
        ),
        server_limits: shared_limits(
            args.budget_wall,
            args.budget_virtual,
            args.budget_branches,
            args.budget_bytes,
        ),
        usage_log: Some(
            args.usage_log
                .unwrap_or_else(|| image_builder::cache_root().join("debugger/usage.jsonl")),
        ),
        max_result_bytes: args.max_result_bytes,
        max_extract_bytes: args.max_extract_bytes,
        helper_memory_mib: args.helper_memory,
        max_request_bytes: args.max_request_bytes,
    };
    match args.http {
        None => serve::serve_stdio(&options)?,
        Some(addr) => {
            let http = serve::http::HttpOptions {
                addr,
                any_address: args.http_any_address,
                token_file: args
                    .token_file
                    .unwrap_or_else(|| image_builder::cache_root().join("serve/token")),
                allowed_origins: args.allow_origins,
                max_request_bytes: args.max_request_bytes,
            };
            serve::serve_http(&options, &http)?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        let mut argv = vec!["detvisor", "serve"];
        argv.extend_from_slice(args);
        let crate::Command::Serve(args) = crate::Cli::try_parse_from(argv)?.command else {
            panic!("a serve");
        };
        Ok(args)
    }

    #[test]
    fn test_serve_reads_its_budgets_and_http_flags() {
        let args = parse(&[
            "--root",
            "n",
            "--budget-wall",
            "30m",
            "--budget-branches",
            "200",
            "--budget-virtual",
            "2h",
        ])
        .unwrap();
        assert_eq!(args.http, None);
        let limits = shared_limits(
            args.budget_wall,
            args.budget_virtual,
            args.budget_branches,
            None,
        );
        assert_eq!(limits.wall, VirtNanos(30 * 60 * 1_000_000_000));
        assert_eq!(limits.virtual_time, VirtNanos(7200 * 1_000_000_000));
        assert_eq!(limits.branches_created, 200);
        assert_eq!(limits.bytes, u64::MAX);
        let args = parse(&["--root", "n", "--http", "127.0.0.1:7700"]).unwrap();
        assert_eq!(args.http, Some("127.0.0.1:7700".parse().unwrap()));
        assert!(
            parse(&["--root", "n", "--token-file", "t"]).is_err(),
            "--token-file needs --http"
        );
        assert!(
            parse(&["--http", "127.0.0.1:1"]).is_err(),
            "--root is required"
        );
        assert!(parse(&["--root", "n", "--budget-wall", "soon"]).is_err());
    }
}
