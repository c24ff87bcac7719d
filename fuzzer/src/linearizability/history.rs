//! Recorded histories: the `detvisor_history` event lines a workload client
//! prints, paired into operations (an invoke with its completion).
//!
//! The format is fixed (see the module documentation of
//! [`crate::linearizability`]): `invoke`, then at most one of `ok` (took
//! effect, with its output), `fail` (definitely did not take effect: the
//! operation is dropped) or `info` (unknown). An `info` completion or none at
//! all leaves the operation without a return.
//!
//! Parsing and printing of events live here only ([`parse_history_values`],
//! [`parse_history_jsonl`], [`History::to_events`]), with round-trip tests.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The key under which a client's stdout line carries one history event.
pub const HISTORY_LINE_KEY: &str = "detvisor_history";

/// A stamp of the guest's `CLOCK_MONOTONIC`, in nanoseconds (under detvisor,
/// the VMM's virtual clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TimeNs(pub u64);

impl fmt::Display for TimeNs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ns", self.0)
    }
}

/// What a client asked the key-value store to do (the `f` and the invoke's
/// `value`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum KvInput {
    /// Read the key.
    Get,
    /// Write `value` to the key.
    Put { value: String },
    /// Remove the key.
    Delete,
    /// Write `to` if the key currently holds `from`.
    Cas { from: String, to: String },
}

impl KvInput {
    /// The `f` field of the history format.
    pub fn name(&self) -> &'static str {
        match self {
            KvInput::Get => "get",
            KvInput::Put { .. } => "put",
            KvInput::Delete => "delete",
            KvInput::Cas { .. } => "cas",
        }
    }
}

/// What the store answered (the `ok` completion's `value`), whose shape is
/// fixed by the operation's `f`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum KvOutput {
    /// The value read, `None` when the key was absent.
    Get {
        value: Option<String>,
    },
    Put,
    Delete,
    /// Whether the compare succeeded (and the swap happened).
    Cas {
        swapped: bool,
    },
}

/// One operation of a history: an invoke paired with its completion.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Operation {
    /// The client that issued it.
    pub process: u64,
    /// Its id, unique per process.
    pub op: u64,
    pub key: String,
    pub input: KvInput,
    /// `None`: no return (timed out, `info`, or never completed).
    pub output: Option<KvOutput>,
    pub call: TimeNs,
    /// `None`: no return; the operation may take effect at any point after
    /// its call, or never.
    #[serde(rename = "return")]
    pub ret: Option<TimeNs>,
}

impl Operation {
    /// Whether the operation completed with `ok`.
    pub fn returned(&self) -> bool {
        self.ret.is_some()
    }
}

/// A recorded history: its operations in the order of their invokes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub operations: Vec<Operation>,
    /// How many operations completed with `fail` and were dropped.
    pub failed: usize,
}

/// A history line (1-based; for events given as values, the position in the
/// slice plus one) that could not be taken, and why.
#[derive(Debug, thiserror::Error)]
#[error("history line {line}: {problem}")]
pub struct HistoryError {
    pub line: usize,
    pub problem: HistoryProblem,
}

/// What is wrong with one history line.
#[derive(Debug, thiserror::Error)]
pub enum HistoryProblem {
    #[error("not JSON")]
    NotJson(#[source] serde_json::Error),
    #[error("not an object with the single key \"{HISTORY_LINE_KEY}\"")]
    NotHistoryLine,
    #[error("the event is not a JSON object")]
    NotObject,
    #[error("field \"{0}\" is missing")]
    MissingField(&'static str),
    #[error("field \"{field}\" should be {expected}, found {found}")]
    BadField {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("unknown event type {0:?} (expected invoke, ok, fail or info)")]
    UnknownType(String),
    #[error("unknown operation {0:?} (expected get, put, delete or cas)")]
    UnknownFunction(String),
    #[error("{f}: {side} value should be {expected}, found {found}")]
    BadValue {
        f: &'static str,
        side: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("process {process} invokes op {op} a second time (first on line {first_line})")]
    DuplicateOp {
        process: u64,
        op: u64,
        first_line: usize,
    },
    #[error("completion of op {op} of process {process}, which was never invoked")]
    CompletionWithoutInvoke { process: u64, op: u64 },
    #[error("second completion of op {op} of process {process} (first on line {first_line})")]
    DuplicateCompletion {
        process: u64,
        op: u64,
        first_line: usize,
    },
    #[error(
        "completion of op {op} of process {process} says {found}, its invoke (line {invoke_line}) said {expected}"
    )]
    CompletionMismatch {
        process: u64,
        op: u64,
        invoke_line: usize,
        expected: String,
        found: String,
    },
    #[error(
        "op {op} of process {process} completes at {completion} before its invoke at {invoke}"
    )]
    CompletionBeforeInvoke {
        process: u64,
        op: u64,
        invoke: TimeNs,
        completion: TimeNs,
    },
}

/// Parses history events, each the inner object of a `detvisor_history`
/// line (as `run::records::RecordBody::History` carries it).
pub fn parse_history_values(events: &[Value]) -> Result<History, HistoryError> {
    let mut pairing = Pairing::default();
    for (index, event) in events.iter().enumerate() {
        let line = index + 1;
        let event = parse_event(event).map_err(|problem| HistoryError { line, problem })?;
        pairing
            .take(line, event)
            .map_err(|problem| HistoryError { line, problem })?;
    }
    Ok(pairing.finish())
}

/// Parses a JSONL history: one `{"detvisor_history":{...}}` object a line;
/// blank lines are skipped.
pub fn parse_history_jsonl(text: &str) -> Result<History, HistoryError> {
    let mut pairing = Pairing::default();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let event = parse_line(raw).map_err(|problem| HistoryError { line, problem })?;
        pairing
            .take(line, event)
            .map_err(|problem| HistoryError { line, problem })?;
    }
    Ok(pairing.finish())
}

fn parse_line(raw: &str) -> Result<Event, HistoryProblem> {
    let value: Value = serde_json::from_str(raw).map_err(HistoryProblem::NotJson)?;
    match value {
        Value::Object(mut map) if map.len() == 1 => match map.remove(HISTORY_LINE_KEY) {
            Some(inner) => parse_event(&inner),
            None => Err(HistoryProblem::NotHistoryLine),
        },
        _ => Err(HistoryProblem::NotHistoryLine),
    }
}

impl History {
    /// The history as events (inner objects of `detvisor_history` lines):
    /// an invoke per operation, and an `ok` for those that returned, in time
    /// order. Failed operations are gone and are not printed. Parsing the
    /// result gives this history back.
    pub fn to_events(&self) -> Vec<Value> {
        let mut stamped: Vec<(TimeNs, u8, usize, Value)> = Vec::new();
        for (index, op) in self.operations.iter().enumerate() {
            stamped.push((op.call, 0, index, invoke_event(op)));
            if let (Some(ret), Some(output)) = (op.ret, &op.output) {
                stamped.push((ret, 1, index, ok_event(op, output, ret)));
            }
        }
        // Invokes keep their order (it is the order of `operations`); a
        // completion never precedes its own invoke.
        stamped.sort_by_key(|(time, kind, index, _)| (*time, *kind, *index));
        stamped.into_iter().map(|(_, _, _, event)| event).collect()
    }

    /// The history as JSONL lines of the client format.
    pub fn to_jsonl(&self) -> String {
        let mut text = String::new();
        for event in self.to_events() {
            text.push_str(&json!({ HISTORY_LINE_KEY: event }).to_string());
            text.push('\n');
        }
        text
    }
}

fn invoke_event(op: &Operation) -> Value {
    let value = match &op.input {
        KvInput::Get | KvInput::Delete => Value::Null,
        KvInput::Put { value } => Value::String(value.clone()),
        KvInput::Cas { from, to } => json!([from, to]),
    };
    json!({
        "process": op.process, "op": op.op, "type": "invoke", "f": op.input.name(),
        "key": op.key, "value": value, "time_ns": op.call.0,
    })
}

fn ok_event(op: &Operation, output: &KvOutput, ret: TimeNs) -> Value {
    let value = match output {
        KvOutput::Get { value } => value.clone().map_or(Value::Null, Value::String),
        KvOutput::Put | KvOutput::Delete => Value::Null,
        KvOutput::Cas { swapped } => Value::Bool(*swapped),
    };
    json!({
        "process": op.process, "op": op.op, "type": "ok", "f": op.input.name(),
        "key": op.key, "value": value, "time_ns": ret.0,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    Get,
    Put,
    Delete,
    Cas,
}

impl Function {
    fn name(self) -> &'static str {
        match self {
            Function::Get => "get",
            Function::Put => "put",
            Function::Delete => "delete",
            Function::Cas => "cas",
        }
    }
}

/// One event line, its fields checked but not yet paired.
struct Event {
    process: u64,
    op: u64,
    kind: EventType,
    f: Function,
    key: String,
    value: Value,
    time: TimeNs,
}

fn describe(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        let short: String = text.chars().take(60).collect();
        format!("{short}…")
    } else {
        text
    }
}

fn field<'a>(map: &'a Map<String, Value>, name: &'static str) -> Result<&'a Value, HistoryProblem> {
    map.get(name).ok_or(HistoryProblem::MissingField(name))
}

fn u64_field(map: &Map<String, Value>, name: &'static str) -> Result<u64, HistoryProblem> {
    let value = field(map, name)?;
    value.as_u64().ok_or_else(|| HistoryProblem::BadField {
        field: name,
        expected: "a non-negative integer",
        found: describe(value),
    })
}

fn str_field<'a>(
    map: &'a Map<String, Value>,
    name: &'static str,
) -> Result<&'a str, HistoryProblem> {
    let value = field(map, name)?;
    value.as_str().ok_or_else(|| HistoryProblem::BadField {
        field: name,
        expected: "a string",
        found: describe(value),
    })
}

fn parse_event(value: &Value) -> Result<Event, HistoryProblem> {
    let map = value.as_object().ok_or(HistoryProblem::NotObject)?;
    let process = u64_field(map, "process")?;
    let op = u64_field(map, "op")?;
    let kind = match str_field(map, "type")? {
        "invoke" => EventType::Invoke,
        "ok" => EventType::Ok,
        "fail" => EventType::Fail,
        "info" => EventType::Info,
        other => return Err(HistoryProblem::UnknownType(other.to_owned())),
    };
    let f = match str_field(map, "f")? {
        "get" => Function::Get,
        "put" => Function::Put,
        "delete" => Function::Delete,
        "cas" => Function::Cas,
        other => return Err(HistoryProblem::UnknownFunction(other.to_owned())),
    };
    let key = str_field(map, "key")?.to_owned();
    // A missing value reads as null (get/delete invokes, put/delete oks).
    let value = map.get("value").cloned().unwrap_or(Value::Null);
    let time = TimeNs(u64_field(map, "time_ns")?);
    Ok(Event {
        process,
        op,
        kind,
        f,
        key,
        value,
        time,
    })
}

fn bad_value(
    f: Function,
    side: &'static str,
    expected: &'static str,
    found: &Value,
) -> HistoryProblem {
    HistoryProblem::BadValue {
        f: f.name(),
        side,
        expected,
        found: describe(found),
    }
}

fn parse_input(f: Function, value: &Value) -> Result<KvInput, HistoryProblem> {
    match f {
        Function::Get | Function::Delete => match value {
            Value::Null => Ok(if f == Function::Get {
                KvInput::Get
            } else {
                KvInput::Delete
            }),
            other => Err(bad_value(f, "invoke", "null", other)),
        },
        Function::Put => match value {
            Value::String(value) => Ok(KvInput::Put {
                value: value.clone(),
            }),
            other => Err(bad_value(f, "invoke", "a string", other)),
        },
        Function::Cas => match value.as_array().map(Vec::as_slice) {
            Some([Value::String(from), Value::String(to)]) => Ok(KvInput::Cas {
                from: from.clone(),
                to: to.clone(),
            }),
            _ => Err(bad_value(f, "invoke", "[from, to] (two strings)", value)),
        },
    }
}

fn parse_output(f: Function, value: &Value) -> Result<KvOutput, HistoryProblem> {
    match (f, value) {
        (Function::Get, Value::Null) => Ok(KvOutput::Get { value: None }),
        (Function::Get, Value::String(read)) => Ok(KvOutput::Get {
            value: Some(read.clone()),
        }),
        (Function::Get, other) => Err(bad_value(f, "ok", "a string or null", other)),
        (Function::Put, Value::Null) => Ok(KvOutput::Put),
        (Function::Delete, Value::Null) => Ok(KvOutput::Delete),
        (Function::Put | Function::Delete, other) => Err(bad_value(f, "ok", "null", other)),
        (Function::Cas, Value::Bool(swapped)) => Ok(KvOutput::Cas { swapped: *swapped }),
        (Function::Cas, other) => Err(bad_value(f, "ok", "true or false", other)),
    }
}

/// Invokes waiting for their completion, and operations already paired.
#[derive(Default)]
struct Pairing {
    /// Per (process, op): its index in `slots` and the line of its invoke.
    ids: HashMap<(u64, u64), (usize, usize)>,
    /// Per invoke in order: the operation, its completion line, and whether
    /// it failed (and is dropped).
    slots: Vec<Slot>,
}

struct Slot {
    operation: Operation,
    f: Function,
    completion_line: Option<usize>,
    failed: bool,
}

impl Pairing {
    fn take(&mut self, line: usize, event: Event) -> Result<(), HistoryProblem> {
        let id = (event.process, event.op);
        if event.kind == EventType::Invoke {
            if let Some(&(_, first_line)) = self.ids.get(&id) {
                return Err(HistoryProblem::DuplicateOp {
                    process: event.process,
                    op: event.op,
                    first_line,
                });
            }
            let input = parse_input(event.f, &event.value)?;
            self.ids.insert(id, (self.slots.len(), line));
            self.slots.push(Slot {
                operation: Operation {
                    process: event.process,
                    op: event.op,
                    key: event.key,
                    input,
                    output: None,
                    call: event.time,
                    ret: None,
                },
                f: event.f,
                completion_line: None,
                failed: false,
            });
            return Ok(());
        }
        let &(slot_index, invoke_line) =
            self.ids
                .get(&id)
                .ok_or(HistoryProblem::CompletionWithoutInvoke {
                    process: event.process,
                    op: event.op,
                })?;
        let slot = &mut self.slots[slot_index];
        if let Some(first_line) = slot.completion_line {
            return Err(HistoryProblem::DuplicateCompletion {
                process: event.process,
                op: event.op,
                first_line,
            });
        }
        if slot.f != event.f || slot.operation.key != event.key {
            return Err(HistoryProblem::CompletionMismatch {
                process: event.process,
                op: event.op,
                invoke_line,
                expected: format!("{} {:?}", slot.f.name(), slot.operation.key),
                found: format!("{} {:?}", event.f.name(), event.key),
            });
        }
        if event.time < slot.operation.call {
            return Err(HistoryProblem::CompletionBeforeInvoke {
                process: event.process,
                op: event.op,
                invoke: slot.operation.call,
                completion: event.time,
            });
        }
        match event.kind {
            EventType::Ok => {
                slot.operation.output = Some(parse_output(event.f, &event.value)?);
                slot.operation.ret = Some(event.time);
            }
            EventType::Fail => slot.failed = true,
            EventType::Info => {}
            EventType::Invoke => unreachable!("handled above"),
        }
        slot.completion_line = Some(line);
        Ok(())
    }

    fn finish(self) -> History {
        let mut history = History::default();
        for slot in self.slots {
            if slot.failed {
                history.failed += 1;
            } else {
                history.operations.push(slot.operation);
            }
        }
        history
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: Value) -> String {
        json!({ HISTORY_LINE_KEY: event }).to_string()
    }

    fn event(process: u64, op: u64, kind: &str, f: &str, value: Value, time: u64) -> Value {
        json!({"process": process, "op": op, "type": kind, "f": f, "key": "k2", "value": value, "time_ns": time})
    }

    #[test]
    fn pairs_invokes_with_completions_and_drops_failures() {
        let events = vec![
            event(3, 17, "invoke", "put", json!("v41"), 100),
            event(1, 1, "invoke", "get", Value::Null, 110),
            event(2, 5, "invoke", "cas", json!(["v41", "v42"]), 120),
            event(4, 9, "invoke", "delete", Value::Null, 125),
            event(5, 2, "invoke", "put", json!("v9"), 126),
            event(3, 17, "ok", "put", Value::Null, 130),
            event(1, 1, "ok", "get", json!("v41"), 140),
            event(2, 5, "info", "cas", Value::Null, 150),
            event(4, 9, "fail", "delete", Value::Null, 160),
        ];
        let history = parse_history_values(&events).unwrap();
        assert_eq!(history.failed, 1);
        let ops = &history.operations;
        assert_eq!(ops.len(), 4);
        assert_eq!(
            ops[0].input,
            KvInput::Put {
                value: "v41".into()
            }
        );
        assert_eq!(ops[0].output, Some(KvOutput::Put));
        assert_eq!((ops[0].call, ops[0].ret), (TimeNs(100), Some(TimeNs(130))));
        assert_eq!(
            ops[1].output,
            Some(KvOutput::Get {
                value: Some("v41".into())
            })
        );
        assert_eq!(
            ops[2].input,
            KvInput::Cas {
                from: "v41".into(),
                to: "v42".into()
            }
        );
        assert_eq!(
            (ops[2].output.as_ref(), ops[2].ret),
            (None, None),
            "info: no return"
        );
        assert_eq!(
            (ops[3].process, ops[3].ret),
            (5, None),
            "never completed: no return"
        );
    }

    #[test]
    fn jsonl_round_trips_through_events() {
        let text = [
            line(event(3, 17, "invoke", "put", json!("v41"), 100)),
            String::new(),
            line(event(1, 1, "invoke", "get", Value::Null, 110)),
            line(event(2, 5, "invoke", "cas", json!(["a", "b"]), 115)),
            line(event(3, 17, "ok", "put", Value::Null, 130)),
            line(event(1, 1, "ok", "get", Value::Null, 130)),
            line(event(2, 5, "ok", "cas", json!(false), 131)),
            line(event(4, 1, "invoke", "delete", Value::Null, 140)),
        ]
        .join("\n");
        let history = parse_history_jsonl(&text).unwrap();
        assert_eq!(history.operations.len(), 4);
        let printed = history.to_jsonl();
        assert_eq!(parse_history_jsonl(&printed).unwrap(), history);
        assert_eq!(parse_history_values(&history.to_events()).unwrap(), history);
        let report = serde_json::to_string(&history).unwrap();
        assert_eq!(serde_json::from_str::<History>(&report).unwrap(), history);
    }

    fn problem_of_values(events: Vec<Value>) -> HistoryError {
        parse_history_values(&events).unwrap_err()
    }

    #[test]
    fn malformed_events_name_their_line_and_problem() {
        let invoke = event(1, 1, "invoke", "put", json!("v"), 10);
        let cases: Vec<(Vec<Value>, usize, &str)> = vec![
            (vec![json!(3)], 1, "not a JSON object"),
            (vec![json!({"op": 1})], 1, "\"process\" is missing"),
            (vec![json!({"process": -1})], 1, "non-negative integer"),
            (
                vec![event(1, 1, "begin", "put", json!("v"), 1)],
                1,
                "unknown event type",
            ),
            (
                vec![event(1, 1, "invoke", "append", json!("v"), 1)],
                1,
                "unknown operation",
            ),
            (
                vec![event(1, 1, "invoke", "put", json!(5), 1)],
                1,
                "put: invoke value should be a string",
            ),
            (
                vec![event(1, 1, "invoke", "cas", json!(["a"]), 1)],
                1,
                "[from, to]",
            ),
            (
                vec![event(1, 1, "ok", "put", Value::Null, 1)],
                1,
                "never invoked",
            ),
            (
                vec![invoke.clone(), invoke.clone()],
                2,
                "second time (first on line 1)",
            ),
            (
                vec![
                    invoke.clone(),
                    event(1, 1, "ok", "put", Value::Null, 20),
                    event(1, 1, "info", "put", Value::Null, 30),
                ],
                3,
                "second completion",
            ),
            (
                vec![invoke.clone(), event(1, 1, "ok", "get", Value::Null, 20)],
                2,
                "says get",
            ),
            (
                vec![invoke.clone(), event(1, 1, "ok", "put", Value::Null, 5)],
                2,
                "before its invoke",
            ),
            (
                vec![invoke.clone(), event(1, 1, "ok", "put", json!("x"), 20)],
                2,
                "put: ok value should be null",
            ),
            (
                vec![
                    event(1, 1, "invoke", "cas", json!(["a", "b"]), 1),
                    event(1, 1, "ok", "cas", json!("yes"), 2),
                ],
                2,
                "true or false",
            ),
            (
                vec![
                    event(1, 1, "invoke", "get", Value::Null, 1),
                    event(1, 1, "ok", "get", json!(7), 2),
                ],
                2,
                "a string or null",
            ),
        ];
        for (events, expected_line, expected_text) in cases {
            let error = problem_of_values(events.clone());
            let text = error.to_string();
            assert_eq!(error.line, expected_line, "{events:?}: {text}");
            assert!(text.contains(expected_text), "{events:?}: {text}");
        }
    }

    #[test]
    fn jsonl_rejects_non_history_lines() {
        let good = line(event(1, 1, "invoke", "get", Value::Null, 1));
        let error = parse_history_jsonl(&format!("{good}\n{{oops")).unwrap_err();
        assert_eq!(error.line, 2);
        assert!(matches!(error.problem, HistoryProblem::NotJson(_)));
        let error = parse_history_jsonl(&format!("{good}\n{{\"other\":{{}}}}")).unwrap_err();
        assert!(error.to_string().contains("detvisor_history"), "{error}");
        assert!(parse_history_jsonl("").unwrap().operations.is_empty());
    }
}
