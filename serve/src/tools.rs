//! The tools: one per operation of the debugger library, named as the CLI's
//! verbs, each with its arguments (an input schema derived from them), an
//! output schema, and annotations saying which only look.

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `findings`: a campaign's findings.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindingsArgs {
    /// A campaign directory, relative to the server's root (or absolute
    /// inside it).
    pub campaign: String,
}

/// `finding`: one finding's file and failure moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindingArgs {
    /// A finding's directory (CAMPAIGN/findings/NNNN), or a campaign's
    /// holding one finding.
    pub finding: String,
}

/// `properties`, `nodes`: a history up to a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryArgs {
    /// A finding's directory or a moment id (SOURCE[~ACTION]...@WHEN).
    pub source: String,
    /// Up to this moment of the history (`@-1s`, `@failure`, `@12.5s`, or
    /// a whole moment id). Default: its end.
    #[serde(default)]
    pub until: Option<String>,
}

/// `events`: what a history reported up to a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsArgs {
    /// A finding's directory or a moment id.
    pub source: String,
    /// Up to this moment (as for `properties`).
    #[serde(default)]
    pub until: Option<String>,
    /// Only this node's records and output.
    #[serde(default)]
    pub node: Option<String>,
    /// Only records whose text contains this.
    #[serde(default)]
    pub text: Option<String>,
    /// Only this kind (event, sdk, history, output) or event name.
    #[serde(default)]
    pub kind: Option<String>,
    /// Only this property's records (an assertion's id).
    #[serde(default)]
    pub property: Option<String>,
    /// Only the last N (0: all).
    #[serde(default)]
    pub last: Option<usize>,
}

/// `moments`, `kept`, `free`: a source.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceArgs {
    /// A finding's directory, a campaign's holding one finding, or a
    /// directory of snapshots.
    pub source: String,
}

/// `inspect`: a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MomentArgs {
    /// A moment id: SOURCE[~ACTION]...@WHEN, e.g. camp/findings/0001@-1s.
    pub moment: String,
}

/// `rewind`: to a moment, or a duration before it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindArgs {
    /// A moment id.
    pub moment: String,
    /// Go this much virtual time before the moment (e.g. `1s`).
    #[serde(default)]
    pub by: Option<String>,
}

/// `branch`: a new history from a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchArgs {
    /// The moment to branch from.
    pub moment: String,
    /// Re-key every seeded stream from this seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Faults added at the branch point, e.g. `at=+2s pause n1 for=1s`.
    #[serde(default)]
    pub faults: Vec<String>,
    /// Run the branch on to this virtual time (since boot), e.g. `40s`.
    #[serde(default)]
    pub until: Option<String>,
}

/// `wait`: run a history on for a while.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    pub moment: String,
    /// Virtual time to run on, e.g. `500ms`.
    pub duration: String,
}

/// `wait_until`: run a history on until a record arrives.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitUntilArgs {
    pub moment: String,
    /// At most this much virtual time, e.g. `10s`.
    pub cap: String,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub property: Option<String>,
}

/// `exec`: a command at a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    pub moment: String,
    /// The command and its arguments, e.g. ["ps", "-ef"].
    pub command: Vec<String>,
    /// Inside this node's namespaces (default: beside the nodes).
    #[serde(default)]
    pub node: Option<String>,
    /// Run in a branch: the nodes run on while the command runs, and the
    /// branch's end moment is returned. Default: in a throwaway fork with
    /// every node stopped.
    #[serde(default)]
    pub branch: bool,
    /// Virtual time the command may take (default 30s).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Bytes of stdout and of stderr kept (at most the server's limit).
    #[serde(default)]
    pub output_limit: Option<u64>,
}

/// How extracted bytes are returned.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// `base64`: the bytes as they are.
    #[default]
    Base64,
    /// `text`: UTF-8, invalid sequences replaced.
    Text,
}

/// `extract`: a node's file at a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtractArgs {
    pub moment: String,
    /// The file, as the node (or the guest) sees it.
    pub path: String,
    #[serde(default)]
    pub node: Option<String>,
    /// The most bytes read (at most the server's limit).
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub encoding: Encoding,
}

/// `processes`: a node's processes at a moment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessesArgs {
    pub moment: String,
    #[serde(default)]
    pub node: Option<String>,
}

/// `verify`: a fix against the unpatched control.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyArgs {
    /// A finding's directory.
    pub finding: String,
    /// The patched node image (inside the root); or give `manifest`.
    #[serde(default)]
    pub image: Option<String>,
    /// The patched system's manifest (inside the root).
    #[serde(default)]
    pub manifest: Option<String>,
    /// Histories per system, the finding's own included (default 2).
    #[serde(default)]
    pub seeds: Option<u32>,
    /// Workers (default 1).
    #[serde(default)]
    pub jobs: Option<u32>,
}

/// `likelihood`: when the failure became likely.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LikelihoodArgs {
    pub finding: String,
    /// Points between the root and the failure (default 4).
    #[serde(default)]
    pub points: Option<u32>,
    /// Branches from each point (default 4).
    #[serde(default)]
    pub branches: Option<u32>,
    /// The base of the branches' seeds (default: the campaign's).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Workers (default 1).
    #[serde(default)]
    pub jobs: Option<u32>,
    /// Return the plot as SVG text too.
    #[serde(default)]
    pub svg: bool,
}

/// `budget`: what this client and the server used and have left.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

fn input<T: JsonSchema>() -> Arc<JsonObject> {
    let schema = schemars::schema_for!(T);
    let Value::Object(mut object) = serde_json::to_value(schema).expect("a schema is JSON") else {
        unreachable!("a derived schema is an object")
    };
    object.remove("$schema");
    Arc::new(object)
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required })
}

fn usage() -> Value {
    object(
        json!({
            "wall": {"type": "integer", "description": "nanoseconds"},
            "virtual_time": {"type": "integer", "description": "nanoseconds"},
            "branches_created": {"type": "integer"},
            "bytes": {"type": "integer"},
            "disk_bytes": {"type": "integer"},
        }),
        &[
            "wall",
            "virtual_time",
            "branches_created",
            "bytes",
            "disk_bytes",
        ],
    )
}

fn shared_spent() -> Value {
    object(
        json!({
            "scope": {"type": "string", "enum": ["server", "client"]},
            "used": usage(),
            "left": object(
                json!({
                    "wall": {"type": ["integer", "null"], "description": "nanoseconds; null: no limit"},
                    "virtual_time": {"type": ["integer", "null"], "description": "nanoseconds; null: no limit"},
                    "branches_created": {"type": ["integer", "null"]},
                    "bytes": {"type": ["integer", "null"]},
                }),
                &["wall", "virtual_time", "branches_created", "bytes"],
            ),
        }),
        &["scope", "used", "left"],
    )
}

/// What a call spent, as every result reports it (`budget`).
fn spent() -> Value {
    object(
        json!({
            "call": usage(),
            "session": usage(),
            "left": usage(),
            "shared": {"type": "array", "items": shared_spent()},
        }),
        &["call", "session", "left"],
    )
}

/// Where a call stands.
fn at() -> Value {
    object(
        json!({
            "moment": {"type": "string", "description": "the moment's id"},
            "digest": {"type": "string"},
            "exits": {"type": "integer"},
            "virtual_ns": {"type": "integer"},
        }),
        &["moment", "digest", "exits", "virtual_ns"],
    )
}

fn array_of_objects() -> Value {
    json!({"type": "array", "items": {"type": "object"}})
}

fn output(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let Value::Object(object) = object(properties, required) else {
        unreachable!()
    };
    Arc::new(object)
}

/// A result with what the call spent.
fn with_budget(mut properties: Value, required: &[&str]) -> Arc<JsonObject> {
    properties["budget"] = spent();
    let mut required = required.to_vec();
    required.push("budget");
    output(properties, &required)
}

fn at_result(extra: Value, required: &[&str]) -> Arc<JsonObject> {
    let mut properties = extra;
    for (key, value) in at()["properties"].as_object().expect("properties") {
        properties[key] = value.clone();
    }
    let mut required = required.to_vec();
    required.extend(["moment", "digest", "exits", "virtual_ns"]);
    with_budget(properties, &required)
}

/// How a tool behaves, for its annotations.
#[derive(Clone, Copy)]
enum Kind {
    /// Reads or inspects; changes nothing.
    Looks,
    /// Moves: creates branches and kept checkpoints, never changes a
    /// recorded history.
    Moves,
    /// Lets go of what the session kept.
    Frees,
}

fn tool(
    name: &'static str,
    description: &'static str,
    input_schema: Arc<JsonObject>,
    output_schema: Arc<JsonObject>,
    kind: Kind,
) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(matches!(kind, Kind::Looks))
        .destructive(matches!(kind, Kind::Frees))
        .idempotent(!matches!(kind, Kind::Moves))
        .open_world(false);
    Tool::new(name, description, input_schema)
        .with_raw_output_schema(output_schema)
        .with_annotations(annotations)
}

/// Every tool, in the order they are listed.
pub fn all() -> Vec<Tool> {
    use Kind::*;
    vec![
        tool(
            "findings",
            "A campaign's findings, one row per distinct failure (as `detvisor findings --json`).",
            input::<FindingsArgs>(),
            output(json!({"findings": array_of_objects()}), &["findings"]),
            Looks,
        ),
        tool(
            "finding",
            "One finding: its finding.json and its failure moment's id (take it to rewind).",
            input::<FindingArgs>(),
            output(
                json!({
                    "dir": {"type": "string"},
                    "failure_moment": {"type": "string"},
                    "failure": object(json!({"exit": {"type": "integer"}, "virtual_ns": {"type": "integer"}}), &["exit", "virtual_ns"]),
                    "finding": {"type": "object"},
                }),
                &["dir", "failure_moment", "failure", "finding"],
            ),
            Looks,
        ),
        tool(
            "properties",
            "Every property a history evaluated up to a moment, with passing and failing examples, each naming its moment.",
            input::<HistoryArgs>(),
            with_budget(json!({"properties": array_of_objects()}), &["properties"]),
            Looks,
        ),
        tool(
            "events",
            "What a history reported up to a moment: node output, faults, property records, run events; filtered by node, text, kind, property.",
            input::<EventsArgs>(),
            with_budget(json!({"until": {"type": "string"}, "events": array_of_objects()}), &["until", "events"]),
            Looks,
        ),
        tool(
            "nodes",
            "The nodes of a history and the last event of each.",
            input::<HistoryArgs>(),
            with_budget(json!({"nodes": array_of_objects()}), &["nodes"]),
            Looks,
        ),
        tool(
            "moments",
            "A source's notable moments: a finding's failure, its branch points, faults, node events, failed properties; a directory's snapshots.",
            input::<SourceArgs>(),
            with_budget(json!({"moments": array_of_objects()}), &["moments"]),
            Looks,
        ),
        tool(
            "rewind",
            "Go to a moment of any history (or `by` a duration before it); its id and digest. Nothing changes the history.",
            input::<RewindArgs>(),
            at_result(json!({}), &[]),
            Moves,
        ),
        tool(
            "branch",
            "A new history from a moment: re-keyed from a seed and/or with faults added, run on to `until` when given; the moment it ends at.",
            input::<BranchArgs>(),
            at_result(json!({}), &[]),
            Moves,
        ),
        tool(
            "wait",
            "Run a history on from a moment for a virtual duration; the moment it ends at.",
            input::<WaitArgs>(),
            at_result(json!({}), &[]),
            Moves,
        ),
        tool(
            "wait_until",
            "Run a history on from a moment until a record matching the filter arrives, for at most `cap`; where it stopped and the record.",
            input::<WaitUntilArgs>(),
            with_budget(json!({"at": at(), "event": {"type": ["object", "null"]}}), &["at"]),
            Moves,
        ),
        tool(
            "exec",
            "A command at a moment, inside a node or beside the nodes, in the guest (never on the host): in a throwaway fork with every node stopped, or with `branch` while the nodes run on (then the branch's end moment is returned).",
            input::<ExecArgs>(),
            with_budget(
                json!({
                    "at": at(),
                    "stdout": {"type": "string"},
                    "stderr": {"type": "string"},
                    "status": {"type": ["integer", "null"]},
                    "signal": {"type": ["integer", "null"]},
                    "timed_out": {"type": "boolean"},
                    "stdout_truncated": {"type": "boolean"},
                    "stderr_truncated": {"type": "boolean"},
                    "took": {"type": "integer"},
                    "end": {"anyOf": [at(), {"type": "null"}]},
                }),
                &["at", "stdout", "stderr", "timed_out", "took"],
            ),
            Moves,
        ),
        tool(
            "extract",
            "Bytes of a node's file at a moment (in a fork), base64 or text, size-limited.",
            input::<ExtractArgs>(),
            with_budget(
                json!({
                    "at": at(),
                    "path": {"type": "string"},
                    "size": {"type": "integer"},
                    "truncated": {"type": "boolean"},
                    "base64": {"type": "string"},
                    "text": {"type": "string"},
                }),
                &["at", "path", "size", "truncated"],
            ),
            Looks,
        ),
        tool(
            "processes",
            "The processes of a node (or of the guest) at a moment, in a fork.",
            input::<ProcessesArgs>(),
            with_budget(
                json!({"at": at(), "node": {"type": ["string", "null"]}, "processes": array_of_objects()}),
                &["at", "processes"],
            ),
            Looks,
        ),
        tool(
            "inspect",
            "The machine at a moment: registers, virtual time, exit index, devices, nodes.",
            input::<MomentArgs>(),
            with_budget(json!({"at": at(), "machine": {"type": "object"}}), &["at", "machine"]),
            Looks,
        ),
        tool(
            "verify",
            "Verify a fix: the finding's faults replayed with N seeds on the patched and the unpatched system side by side; `verified` only when the control fails at least once and the patched system never does.",
            input::<VerifyArgs>(),
            output(
                json!({
                    "verified": {"type": "boolean"},
                    "verdict": {"type": "string"},
                    "seeds": array_of_objects(),
                    "control": {"type": "object"},
                    "patched": {"type": "object"},
                    "control_check": {"type": "object"},
                    "spent": spent(),
                }),
                &["verified", "verdict", "seeds", "spent"],
            ),
            Looks,
        ),
        tool(
            "likelihood",
            "When the failure became likely: branches with new seeds from points before the failure; P(failure) per point with 95% intervals (and the plot as SVG when asked).",
            input::<LikelihoodArgs>(),
            output(
                json!({
                    "points": array_of_objects(),
                    "failure": {"type": "string"},
                    "used": usage(),
                    "svg": {"type": "string"},
                    "budget": {"type": "array", "items": shared_spent()},
                }),
                &["points", "used"],
            ),
            Looks,
        ),
        tool(
            "kept",
            "The checkpoints this client's session on a source keeps, most recently used first.",
            input::<SourceArgs>(),
            output(json!({"kept": array_of_objects()}), &["kept"]),
            Looks,
        ),
        tool(
            "free",
            "Lets go of every checkpoint this client's session on a source keeps.",
            input::<SourceArgs>(),
            output(json!({"freed": {"type": "integer"}}), &["freed"]),
            Frees,
        ),
        tool(
            "budget",
            "What this client and the whole server used and have left, and the limits of each session.",
            input::<NoArgs>(),
            output(
                json!({"shared": {"type": "array", "items": shared_spent()}, "session_limits": {"type": "object"}}),
                &["shared", "session_limits"],
            ),
            Looks,
        ),
    ]
}
