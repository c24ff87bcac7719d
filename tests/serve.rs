//! `detvisor serve` driven by MCP clients no one here wrote: the official
//! Python SDK over stdio through a whole debugging session on the Raft
//! stale-read finding (tests/serve/session.py), and over HTTP with the
//! Python and TypeScript SDKs (tests/serve/over_http.py, client.mjs) and
//! the MCP Inspector's CLI; raw
//! malformed requests over stdio. The clients are installed by
//! scripts/mcp-clients into the cache; the finding is the campaign the
//! test run shares (tests/common/stale.rs).

mod common;

use common::images::patched_raft_image;
use common::stale::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cache() -> PathBuf {
    std::env::var_os("DETVISOR_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/detvisor"))
}

/// The clients' directory in the cache, installed once.
fn clients() -> &'static Path {
    static DONE: OnceLock<PathBuf> = OnceLock::new();
    DONE.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("scripts/mcp-clients"))
            .output()
            .expect("scripts/mcp-clients starts");
        assert!(
            out.status.success(),
            "scripts/mcp-clients: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cache()
    })
}

fn python() -> PathBuf {
    clients().join("mcp-venv/bin/python")
}

/// Runs `command`, shows its output, and returns its stdout's last line
/// as JSON after checking it succeeded.
fn run_client(command: &mut Command, what: &str) -> serde_json::Value {
    let started = std::time::Instant::now();
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- {what} ({:.1} s), status {:?}\n--- stdout:\n{text}\n--- stderr:\n{}",
        started.elapsed().as_secs_f64(),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed");
    serde_json::from_str(text.lines().last().unwrap_or("")).expect("a JSON line of figures")
}

/// The patched image, inside the shared root (a call's paths stay there).
fn patched_in_root() -> &'static str {
    let dest = stale_root().join("patched/raft-patched.img");
    if !dest.exists() {
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let partial = dest.with_extension(format!("{}", std::process::id()));
        std::fs::copy(patched_raft_image(), &partial).unwrap();
        std::fs::rename(&partial, &dest).unwrap();
    }
    "patched/raft-patched.img"
}

/// One agent's session over stdio with the Python SDK: list findings, the
/// failure moment, rewind 1 s, processes and a file in the old leader's
/// node, a command in a branch, the history unchanged, a call a budget
/// refuses, malformed calls answered, a long call cancelled (its work
/// stops), and the source patch verified with 2 seeds.
#[test]
fn test_an_agent_debugs_the_stale_read_over_stdio_with_the_python_sdk() {
    let root = stale_root();
    let leader = old_leader(&stale_finding());
    let patched = patched_in_root();
    let figures = run_client(
        Command::new(python())
            .arg(repo().join("tests/serve/session.py"))
            .arg(env!("CARGO_BIN_EXE_detvisor"))
            .arg(root)
            .arg("campaign")
            .arg(patched)
            .arg(&leader),
        "tests/serve/session.py",
    );
    eprintln!("figures: {figures}");
    assert!(figures["cancel_s"].as_f64().unwrap() < 120.0, "{figures}");
}

/// The MCP Inspector's CLI mode (`mcp-inspector --cli TARGET...`).
fn inspector(target: &[&str]) -> Command {
    let mut command = Command::new(clients().join("mcp-node/node_modules/.bin/mcp-inspector"));
    command.arg("--cli").args(target);
    command
}

/// The JSON the Inspector's CLI printed, after checking it succeeded.
fn inspector_json(out: &std::process::Output, what: &str) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The JSON follows any notice the CLI prints first.
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("{what}: no JSON in {text}"));
    serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("{what}: {e}: {text}"))
}

/// Reads the server's stderr until it says where it serves; the URL.
fn served_url(stderr: &mut impl BufRead) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the server ended before it served"
        );
        eprint!("server: {line}");
        if let Some(rest) = line.split("serving MCP on ").nth(1) {
            return rest.split(';').next().unwrap().trim().to_owned();
        }
    }
}

/// Over HTTP: the Python SDK initializes and calls with the token; raw
/// requests without it and with a foreign Origin are refused; malformed
/// and oversized ones answered; the TypeScript SDK lists the tools and
/// calls one; the MCP Inspector's CLI lists them with the token (and is
/// refused without it) and calls one over stdio, and one that names a path
/// outside the root is a tool error. And over stdio, raw lines that are no JSON-RPC are skipped
/// and the server answers what comes after.
#[test]
fn test_http_needs_the_token_and_its_own_origin_and_serves_typescript_and_the_inspector() {
    let root = stale_root();
    let scratch = tempfile::tempdir().unwrap();
    let token_file = scratch.path().join("token");
    let mut server = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(["serve", "--root"])
        .arg(root)
        .args([
            "--http",
            "127.0.0.1:0",
            "--budget-virtual",
            "1s",
            "--token-file",
        ])
        .arg(&token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("detvisor serve starts");
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let url = served_url(&mut stderr);
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            eprintln!("server: {line}");
        }
    });
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is its owner's only");

    let python_figures = run_client(
        Command::new(python())
            .arg(repo().join("tests/serve/over_http.py"))
            .args([&url, token_file.to_str().unwrap(), "campaign"]),
        "tests/serve/over_http.py",
    );
    assert!(python_figures["findings"].as_u64().unwrap() >= 1);

    // ES modules resolve packages from their own directory: the client
    // runs beside the SDK's node_modules.
    let script = clients().join("mcp-node/serve-client.mjs");
    std::fs::copy(repo().join("tests/serve/client.mjs"), &script).unwrap();
    let node_figures = run_client(
        Command::new("node")
            .arg(&script)
            .args([&url, token_file.to_str().unwrap(), "campaign"]),
        "tests/serve/client.mjs (TypeScript SDK)",
    );
    let tools = node_figures["tools"].as_array().unwrap();
    assert!(tools.len() >= 16, "{node_figures}");
    assert!(tools.iter().any(|t| t == "verify"), "{node_figures}");
    assert_eq!(node_figures["findings"], python_figures["findings"]);

    // The MCP Inspector's CLI, over HTTP with the token and over stdio.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let authorization = format!("Authorization: Bearer {}", token.trim());
    let listed = inspector(&[&url, "--transport", "http", "--header", &authorization])
        .args(["--method", "tools/list"])
        .output()
        .unwrap();
    let listed = inspector_json(&listed, "inspector tools/list over HTTP");
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), tools.len(), "{names:?}");
    let refused = inspector(&[&url, "--transport", "http"])
        .args(["--method", "tools/list"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "no token, no tools");
    assert!(
        String::from_utf8_lossy(&refused.stdout).contains("bearer token")
            || String::from_utf8_lossy(&refused.stderr).contains("bearer token"),
        "{refused:?}"
    );
    server.kill().unwrap();
    let detvisor = env!("CARGO_BIN_EXE_detvisor");
    let root_text = root.to_str().unwrap();
    let found = inspector(&[detvisor, "serve", "--root", root_text])
        .args(["--method", "tools/call", "--tool-name", "findings"])
        .args(["--tool-arg", "campaign=campaign"])
        .output()
        .unwrap();
    let found = inspector_json(&found, "inspector tools/call findings over stdio");
    assert_eq!(
        found["structuredContent"]["findings"]
            .as_array()
            .map(Vec::len),
        python_figures["findings"].as_u64().map(|n| n as usize),
        "{found}"
    );
    let outside = inspector(&[detvisor, "serve", "--root", root_text])
        .args(["--method", "tools/call", "--tool-name", "extract"])
        .args(["--tool-arg", "moment=../etc@1s", "path=/etc/passwd"])
        .output()
        .unwrap();
    let outside = inspector_json(&outside, "inspector tools/call extract outside the root");
    assert_eq!(outside["isError"], true, "{outside}");
    assert!(outside.to_string().contains("`..`"), "{outside}");
    server.wait().unwrap();

    // Over stdio, raw: lines that are no JSON-RPC do not stop the server.
    let mut stdio = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(["serve", "--root"])
        .arg(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("detvisor serve starts");
    let mut input = stdio.stdin.take().unwrap();
    let mut output = BufReader::new(stdio.stdout.take().unwrap());
    // Answers in the order they come; those without an id (errors about
    // lines that could not be read) set aside.
    let mut unread = Vec::new();
    let mut answer = |id: u64| loop {
        let mut line = String::new();
        assert!(output.read_line(&mut line).unwrap() > 0, "the server ended");
        let value: serde_json::Value = serde_json::from_str(&line).expect("a JSON-RPC answer");
        if value["id"] == id {
            return value;
        }
        assert!(value["id"].is_null(), "{value}");
        unread.push(value["error"]["code"].as_i64().unwrap());
    };
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}});
    writeln!(input, "this is not json\n{{\"jsonrpc\": \"2.0\", \"id\":").unwrap();
    writeln!(input, "{init}").unwrap();
    assert!(answer(1)["result"]["serverInfo"].is_object());
    writeln!(
        input,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    // Past the longest request the server takes (4 MiB): refused unread.
    let huge = "a".repeat(5 << 20);
    writeln!(
        input,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "findings", "arguments": {"campaign": huge}}})
    )
    .unwrap();
    // A long one it takes, with a path that is no directory: an error
    // result, cut short.
    let long = "a".repeat(1 << 20);
    writeln!(
        input,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "findings", "arguments": {"campaign": long}}})
    )
    .unwrap();
    let refused = answer(3);
    assert_eq!(refused["result"]["isError"], true, "{refused:.300}");
    assert!(refused.to_string().len() < 8192, "{refused:.300}");
    writeln!(
        input,
        "{}",
        serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "findings", "arguments": {"campaign": "campaign"}}})
    )
    .unwrap();
    let listed = answer(4);
    assert!(
        listed["result"]["structuredContent"]["findings"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "{listed}"
    );
    // Two lines that were no JSON (-32700), one too long (-32600).
    unread.sort();
    assert_eq!(unread, [-32700, -32700, -32600], "{unread:?}");
    drop(input);
    assert!(stdio.wait().unwrap().success());
}
