//! `detvisor-assert`: the Antithesis SDK for shell workloads. The agent's
//! binary runs as this command when called by that name (every node has it
//! at `/usr/bin/detvisor-assert`). It writes records in the SDKs' exact JSON
//! shapes to the node's SDK socket, like the libvoidstar shim does.
//!
//! ```text
//! detvisor-assert always|always-or-unreachable|sometimes|reachable|unreachable MESSAGE
//!                 [--condition true|false] [--details JSON]
//! detvisor-assert setup-complete [--details JSON]
//! detvisor-assert event NAME JSON
//! detvisor-assert random          # prints a u64 from the explorer's stream
//! ```
//! Exit status: 0 done, 2 bad usage, 1 the agent could not be reached (or
//! did not answer).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use serde_json::{json, Value};

use crate::sdk::{encode_shim_frame, KIND_JSON, KIND_RANDOM, MAX_RECORD_LEN};

/// Where the node's SDK socket is (`DETVISOR_SDK_SOCKET` overrides it).
pub const SOCKET: &str = "/run/detvisor/sdk.sock";

pub const USAGE: &str = "usage: detvisor-assert always|always-or-unreachable|sometimes|reachable|unreachable MESSAGE [--condition true|false] [--details JSON]
       detvisor-assert setup-complete [--details JSON]
       detvisor-assert event NAME JSON
       detvisor-assert random";

/// What one invocation does.
#[derive(Debug, PartialEq)]
pub enum Invocation {
    Record(Value),
    Random,
}

/// One assertion kind's fields, as the SDKs write them.
struct Kind {
    display_type: &'static str,
    assert_type: &'static str,
    must_hit: bool,
}

fn kind(name: &str) -> Option<Kind> {
    let (display_type, assert_type, must_hit) = match name {
        "always" => ("Always", "always", true),
        "always-or-unreachable" => ("AlwaysOrUnreachable", "always", false),
        "sometimes" => ("Sometimes", "sometimes", true),
        "reachable" => ("Reachable", "reachability", true),
        "unreachable" => ("Unreachable", "reachability", false),
        _ => return None,
    };
    Some(Kind {
        display_type,
        assert_type,
        must_hit,
    })
}

fn parse_json(what: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not JSON ({e}): {text:?}"))
}

/// Parses the arguments (after the command name).
pub fn parse(args: &[String]) -> Result<Invocation, String> {
    let Some((verb, rest)) = args.split_first() else {
        return Err("missing a command".to_string());
    };
    match verb.as_str() {
        "random" if rest.is_empty() => Ok(Invocation::Random),
        "event" => match rest {
            [name, details] => {
                let details = parse_json("the event's details", details)?;
                let mut record = serde_json::Map::new();
                record.insert(name.clone(), details);
                Ok(Invocation::Record(Value::Object(record)))
            }
            _ => Err("event needs NAME and JSON".to_string()),
        },
        "setup-complete" => {
            let details = options(rest, false)?.1;
            Ok(Invocation::Record(json!({
                "antithesis_setup": {"status": "complete", "details": details}
            })))
        }
        name => {
            let kind = kind(name).ok_or_else(|| format!("unknown command {name:?}"))?;
            let Some((message, rest)) = rest.split_first() else {
                return Err(format!("{name} needs a MESSAGE"));
            };
            let (condition, details) = options(rest, true)?;
            Ok(Invocation::Record(json!({
                "antithesis_assert": {
                    "assert_type": kind.assert_type,
                    "display_type": kind.display_type,
                    "condition": condition,
                    "message": message,
                    "location": {
                        "class": "",
                        "function": "",
                        "file": "detvisor-assert",
                        "begin_line": 0,
                        "begin_column": 0
                    },
                    "hit": true,
                    "must_hit": kind.must_hit,
                    "id": message,
                    "details": details
                }
            })))
        }
    }
}

/// `--condition` (if allowed; default true) and `--details` (default null).
fn options(args: &[String], condition_allowed: bool) -> Result<(bool, Value), String> {
    let mut condition = true;
    let mut details = Value::Null;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value"))
                .cloned()
        };
        match arg.as_str() {
            "--condition" if condition_allowed => {
                condition = match value()?.as_str() {
                    "true" => true,
                    "false" => false,
                    other => return Err(format!("--condition is true or false, not {other:?}")),
                }
            }
            "--details" => details = parse_json("--details", &value()?)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((condition, details))
}

/// Carries out `invocation` on `socket`; the random value (if asked).
pub fn run(invocation: &Invocation, socket: &str) -> Result<Option<u64>, String> {
    let mut stream = UnixStream::connect(socket)
        .map_err(|e| format!("cannot reach the agent at {socket}: {e}"))?;
    match invocation {
        Invocation::Record(record) => {
            let text = record.to_string();
            if text.len() > MAX_RECORD_LEN {
                return Err(format!(
                    "the record is {} bytes, more than {MAX_RECORD_LEN}",
                    text.len()
                ));
            }
            stream
                .write_all(&encode_shim_frame(KIND_JSON, text.as_bytes()))
                .map_err(|e| format!("writing to the agent: {e}"))?;
            Ok(None)
        }
        Invocation::Random => {
            stream
                .write_all(&encode_shim_frame(KIND_RANDOM, b""))
                .map_err(|e| format!("writing to the agent: {e}"))?;
            let mut reply = [0u8; 8];
            stream
                .read_exact(&mut reply)
                .map_err(|e| format!("reading the agent's answer: {e}"))?;
            Ok(Some(u64::from_le_bytes(reply)))
        }
    }
}

/// The command's `main`: returns the exit status.
pub fn main(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return 0;
    }
    let invocation = match parse(args) {
        Ok(invocation) => invocation,
        Err(message) => {
            eprintln!("detvisor-assert: {message}\n{USAGE}");
            return 2;
        }
    };
    let socket = std::env::var("DETVISOR_SDK_SOCKET").unwrap_or_else(|_| SOCKET.to_string());
    match run(&invocation, &socket) {
        Ok(Some(value)) => {
            println!("{value}");
            0
        }
        Ok(None) => 0,
        Err(message) => {
            eprintln!("detvisor-assert: {message}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_assertions_have_the_sdks_fields() {
        let Invocation::Record(record) = parse(&args(&[
            "unreachable",
            "never here",
            "--details",
            r#"{"k":1}"#,
        ]))
        .unwrap() else {
            panic!("a record")
        };
        let a = &record["antithesis_assert"];
        assert_eq!(a["assert_type"], "reachability");
        assert_eq!(a["display_type"], "Unreachable");
        assert_eq!(a["must_hit"], false);
        assert_eq!(a["condition"], true);
        assert_eq!(a["hit"], true);
        assert_eq!(a["id"], "never here");
        assert_eq!(a["message"], "never here");
        assert_eq!(a["details"], json!({"k": 1}));
        let Invocation::Record(record) =
            parse(&args(&["always", "x", "--condition", "false"])).unwrap()
        else {
            panic!("a record")
        };
        assert_eq!(record["antithesis_assert"]["condition"], false);
        assert_eq!(record["antithesis_assert"]["must_hit"], true);
        assert_eq!(
            parse(&args(&["setup-complete"])).unwrap(),
            Invocation::Record(
                json!({"antithesis_setup": {"status": "complete", "details": null}})
            )
        );
        assert_eq!(
            parse(&args(&["event", "leader", r#"{"node":"n1"}"#])).unwrap(),
            Invocation::Record(json!({"leader": {"node": "n1"}}))
        );
        assert_eq!(parse(&args(&["random"])).unwrap(), Invocation::Random);
    }

    #[test]
    fn test_bad_usage_is_named() {
        for (bad, expected) in [
            (&[][..], "missing a command"),
            (&["often", "x"], "unknown command \"often\""),
            (&["always"], "always needs a MESSAGE"),
            (&["always", "x", "--condition", "yes"], "true or false"),
            (&["always", "x", "--details", "{"], "--details is not JSON"),
            (&["event", "e"], "event needs NAME and JSON"),
            (
                &["setup-complete", "--condition", "true"],
                "unknown argument",
            ),
            (&["random", "x"], "unknown command \"random\""),
        ] {
            let error = parse(&args(bad)).unwrap_err();
            assert!(error.contains(expected), "{bad:?}: {error}");
        }
    }

    #[test]
    fn test_without_an_agent_it_fails_clearly() {
        let error = run(&Invocation::Random, "/nonexistent/sdk.sock").unwrap_err();
        assert!(error.starts_with("cannot reach the agent at /nonexistent/sdk.sock"));
    }
}
