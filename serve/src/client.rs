//! One MCP client session: a thread of its own holding a debugger session
//! per source directory it named (a session's runs stay on one thread,
//! and the debugger's calls block), its budget within the server's, and
//! the calls it runs one after the other.

use crate::paths::{PathError, Root};
use crate::runner::SharedRunner;
use crate::tools::*;
use debugger::budget::{Budget, Limits, SharedBudget, SharedLimits, SharedScope, Spent};
use debugger::inspect::{self, Command as GuestCommand};
use debugger::moment::MomentId;
use debugger::reading::{self, EventFilter};
use debugger::session::{Session, SessionError, SessionOptions};
use debugger::source::Source;
use run::moment::When;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use vmm::VirtNanos;

/// What every client of a server shares.
pub struct Shared {
    pub root: Root,
    pub runner: SharedRunner,
    /// Whether runs go through a helper VM (then verify and likelihood run
    /// on the shared runner too, paying no helper VM's start).
    pub in_helper_vm: bool,
    pub place: fuzzer::campaign::Place,
    pub server_budget: SharedBudget,
    /// The limits of each debugger session (one per client and source).
    pub session_limits: Limits,
    /// What one client may spend in all.
    pub client_limits: SharedLimits,
    /// Where each call's use is appended.
    pub usage_log: Option<PathBuf>,
    /// The most bytes one result may hold (serialized).
    pub max_result_bytes: usize,
    /// The most bytes `extract` reads.
    pub max_extract_bytes: u64,
}

/// Why a call failed: told to the client as a tool error.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("arguments of {tool}: {reason}")]
    Arguments { tool: String, reason: String },
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("{0}")]
    Failed(String),
    #[error("the result is {size} bytes, more than the server's limit of {limit}: narrow the call (`last`, `node`, `limit`, `output_limit`)")]
    TooLarge { size: usize, limit: usize },
}

/// The chain of an error, joined into one line.
fn failed(error: &dyn std::error::Error) -> CallError {
    CallError::Failed(run::chain(error))
}

impl From<SessionError> for CallError {
    fn from(error: SessionError) -> Self {
        failed(&error)
    }
}

/// What a call tells as it runs: progress so far, the total when known, a
/// message.
pub type Progress = Arc<dyn Fn(f64, Option<f64>, String) + Send + Sync>;

/// One call's hooks: its cancellation flag and its progress.
pub struct CallEnv {
    pub cancel: Arc<AtomicBool>,
    pub progress: Progress,
}

/// A client's state, on its thread.
pub struct ClientState {
    shared: Arc<Shared>,
    budget: SharedBudget,
    sessions: BTreeMap<PathBuf, Session>,
}

impl ClientState {
    pub fn new(shared: Arc<Shared>) -> ClientState {
        let budget = SharedBudget::new(SharedScope::Client, shared.client_limits.clone());
        ClientState {
            shared,
            budget,
            sessions: BTreeMap::new(),
        }
    }

    fn budgets(&self) -> Vec<SharedBudget> {
        vec![self.shared.server_budget.clone(), self.budget.clone()]
    }

    /// The session on `dir` (opened on first use), its hooks set for a call.
    fn session(&mut self, dir: &Path, env: &CallEnv) -> Result<&mut Session, CallError> {
        if !self.sessions.contains_key(dir) {
            let source = Source::open(dir).map_err(|e| failed(&e))?;
            let options = SessionOptions {
                limits: self.shared.session_limits.clone(),
                log: self.shared.usage_log.clone(),
                shared: self.budgets(),
                ..SessionOptions::default()
            };
            let session = Session::new(source, self.shared.runner.handle(), options);
            self.sessions.insert(dir.to_owned(), session);
        }
        let session = self.sessions.get_mut(dir).expect("opened");
        session.budget.set_cancel(Some(env.cancel.clone()));
        let progress = env.progress.clone();
        session.set_progress(Some(Box::new(
            move |reached: VirtNanos, target: VirtNanos| {
                progress(
                    reached.0 as f64 / 1e9,
                    Some(target.0 as f64 / 1e9),
                    format!("replaying: at {reached} of {target} (virtual)"),
                )
            },
        )));
        Ok(session)
    }

    /// Runs tool `name` with `arguments`: its result, as the CLI verb's
    /// `--json` prints it.
    pub fn call(
        &mut self,
        name: &str,
        arguments: Value,
        env: &CallEnv,
    ) -> Result<Value, CallError> {
        let value = match name {
            "findings" => self.findings(args(name, arguments)?)?,
            "finding" => self.finding(args(name, arguments)?)?,
            "properties" => {
                let a: HistoryArgs = args(name, arguments)?;
                let moment = self.history_until(&a.source, a.until.as_deref())?;
                let (rows, spent) = self.run(&moment, env, "properties", |s| {
                    reading::properties(s, &moment)
                })?;
                with_spent(&json!({ "properties": rows }), &spent)
            }
            "nodes" => {
                let a: HistoryArgs = args(name, arguments)?;
                let moment = self.history_until(&a.source, a.until.as_deref())?;
                let (rows, spent) =
                    self.run(&moment, env, "nodes", |s| reading::nodes(s, &moment))?;
                with_spent(&json!({ "nodes": rows }), &spent)
            }
            "events" => {
                let a: EventsArgs = args(name, arguments)?;
                let moment = self.history_until(&a.source, a.until.as_deref())?;
                let filter = EventFilter {
                    node: a.node,
                    text: a.text,
                    kind: a.kind,
                    property: a.property,
                    last: a.last.unwrap_or(0),
                };
                let (events, spent) = self.run(&moment, env, "events", |s| {
                    reading::events(s, &moment, &filter)
                })?;
                with_spent(&json!({ "until": moment, "events": events }), &spent)
            }
            "moments" => {
                let a: SourceArgs = args(name, arguments)?;
                let dir = self.shared.root.resolve(Path::new(&a.source))?;
                let session = self.session(&dir, env)?;
                let (moments, spent) = session.call("moments", |s| Ok(reading::moments(s)))?;
                with_spent(&json!({ "moments": moments }), &spent)
            }
            "rewind" => {
                let a: RewindArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let by = a.by.as_deref().map(|t| duration("by", t)).transpose()?;
                let (at, spent) = self.run(&moment, env, "rewind", |s| match by {
                    Some(by) => debugger::moving::rewind_by(s, &moment, by),
                    None => debugger::moving::rewind(s, &moment),
                })?;
                with_spent(&at, &spent)
            }
            "branch" => {
                let a: BranchArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let faults = a
                    .faults
                    .iter()
                    .map(|f| run::faults::parse_fault_flag(f).map_err(|e| arguments_error(name, e)))
                    .collect::<Result<Vec<_>, _>>()?;
                let until = a
                    .until
                    .as_deref()
                    .map(|t| duration("until", t))
                    .transpose()?;
                let (at, spent) = self.run(&moment, env, "branch", |s| {
                    let start = debugger::moving::branch(s, &moment, a.seed, &faults)?;
                    match until {
                        Some(until) if until > start.virtual_ns => {
                            s.reach(&start.moment.at(When::Time(until)))
                        }
                        _ => Ok(start),
                    }
                })?;
                with_spent(&at, &spent)
            }
            "wait" => {
                let a: WaitArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let duration = duration("duration", &a.duration)?;
                let (at, spent) = self.run(&moment, env, "wait", |s| {
                    debugger::moving::wait(s, &moment, duration)
                })?;
                with_spent(&at, &spent)
            }
            "wait_until" => {
                let a: WaitUntilArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let cap = duration("cap", &a.cap)?;
                let filter = EventFilter {
                    node: a.node,
                    text: a.text,
                    kind: a.kind,
                    property: a.property,
                    last: 0,
                };
                let (waited, spent) = self.run(&moment, env, "wait_until", |s| {
                    debugger::moving::wait_until(s, &moment, &filter, cap)
                })?;
                with_spent(&waited, &spent)
            }
            "exec" => self.exec(args(name, arguments)?, env)?,
            "extract" => self.extract(args(name, arguments)?, env)?,
            "processes" => {
                let a: ProcessesArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let (listed, spent) = self.run(&moment, env, "processes", |s| {
                    inspect::processes(s, &moment, a.node.clone())
                })?;
                with_spent(&listed, &spent)
            }
            "inspect" => {
                let a: MomentArgs = args(name, arguments)?;
                let moment = self.shared.root.moment(&a.moment)?;
                let (inspected, spent) =
                    self.run(&moment, env, "inspect", |s| inspect::inspect(s, &moment))?;
                with_spent(&inspected, &spent)
            }
            "verify" => self.verify(args(name, arguments)?, env)?,
            "likelihood" => self.likelihood(args(name, arguments)?, env)?,
            "kept" => {
                let a: SourceArgs = args(name, arguments)?;
                let dir = self.shared.root.resolve(Path::new(&a.source))?;
                let kept = self.session(&dir, env)?.kept();
                json!({ "kept": kept })
            }
            "free" => {
                let a: SourceArgs = args(name, arguments)?;
                let dir = self.shared.root.resolve(Path::new(&a.source))?;
                let freed = self.session(&dir, env)?.free()?;
                json!({ "freed": freed })
            }
            "budget" => {
                let _: NoArgs = args(name, arguments)?;
                json!({
                    "shared": [self.shared.server_budget.spent(), self.budget.spent()],
                    "session_limits": self.shared.session_limits,
                })
            }
            other => {
                return Err(CallError::Arguments {
                    tool: other.to_owned(),
                    reason: "no such tool".into(),
                })
            }
        };
        let size = serde_json::to_vec(&value).map_or(0, |v| v.len());
        if size > self.shared.max_result_bytes {
            return Err(CallError::TooLarge {
                size,
                limit: self.shared.max_result_bytes,
            });
        }
        Ok(value)
    }

    /// Runs `body` as a call of the session on `moment`'s source.
    fn run<T>(
        &mut self,
        moment: &MomentId,
        env: &CallEnv,
        name: &str,
        body: impl FnOnce(&mut Session) -> Result<T, SessionError>,
    ) -> Result<(T, Spent), CallError> {
        let session = self.session(&moment.source, env)?;
        let result = session.call(name, body);
        session.set_progress(None);
        Ok(result?)
    }

    /// A history named by `text` (a directory, or a moment whose `@WHEN`
    /// is ignored) up to `until`, as `detvisor events` reads them.
    fn history_until(&self, text: &str, until: Option<&str>) -> Result<MomentId, CallError> {
        let root = &self.shared.root;
        let base = match root.moment(text) {
            Ok(moment) => moment,
            Err(PathError::Moment { .. }) => {
                MomentId::of_source(root.resolve(Path::new(text))?, When::Latest)
            }
            Err(other) => return Err(other.into()),
        };
        Ok(match until {
            None => base,
            Some(when) if when.starts_with('@') => base.at(When::parse_in(when, &when[1..])
                .map_err(|e| arguments_error("until", run::chain(&e)))?),
            Some(moment) => root.moment(moment)?,
        })
    }

    fn findings(&self, a: FindingsArgs) -> Result<Value, CallError> {
        let dir = self.shared.root.resolve(Path::new(&a.campaign))?;
        let listed = fuzzer::campaign::findings(&dir).map_err(|e| failed(&e))?;
        Ok(json!({ "findings": listed }))
    }

    fn finding(&self, a: FindingArgs) -> Result<Value, CallError> {
        let dir = self.shared.root.resolve(Path::new(&a.finding))?;
        let source = Source::open(&dir).map_err(|e| failed(&e))?;
        let Some(finding) = source.finding() else {
            return Err(CallError::Failed(format!(
                "{}: a directory of snapshots, not a finding",
                dir.display()
            )));
        };
        Ok(json!({
            "dir": finding.dir,
            "failure_moment": MomentId::of_source(&finding.dir, When::Failure),
            "failure": finding.failure,
            "finding": finding.finding.file,
        }))
    }

    fn exec(&mut self, a: ExecArgs, env: &CallEnv) -> Result<Value, CallError> {
        let moment = self.shared.root.moment(&a.moment)?;
        if a.command.is_empty() {
            return Err(arguments_error("exec", "`command` is empty"));
        }
        let limit = (self.shared.max_result_bytes as u64 / 2).saturating_sub(4096);
        let command = GuestCommand {
            node: a.node,
            command: a.command,
            timeout: a
                .timeout
                .as_deref()
                .map(|t| duration("timeout", t))
                .transpose()?
                .unwrap_or(inspect::DEFAULT_TIMEOUT),
            output_limit: a
                .output_limit
                .unwrap_or(inspect::DEFAULT_OUTPUT_LIMIT)
                .min(limit),
        };
        let (executed, spent) = self.run(&moment, env, "exec", |s| {
            if a.branch {
                inspect::exec_in_branch(s, &moment, &command)
            } else {
                inspect::exec(s, &moment, &command)
            }
        })?;
        Ok(with_spent(&executed, &spent))
    }

    fn extract(&mut self, a: ExtractArgs, env: &CallEnv) -> Result<Value, CallError> {
        let moment = self.shared.root.moment(&a.moment)?;
        let limit = a
            .limit
            .unwrap_or(inspect::DEFAULT_EXTRACT_LIMIT)
            .min(self.shared.max_extract_bytes);
        let (extracted, spent) = self.run(&moment, env, "extract", |s| {
            inspect::extract(s, &moment, a.node.clone(), &a.path, limit)
        })?;
        let mut value = with_spent(&extracted, &spent);
        match a.encoding {
            Encoding::Base64 => {
                use base64::Engine;
                value["base64"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(&extracted.bytes));
            }
            Encoding::Text => {
                value["text"] = json!(String::from_utf8_lossy(&extracted.bytes));
            }
        }
        Ok(value)
    }

    fn verify(&mut self, a: VerifyArgs, env: &CallEnv) -> Result<Value, CallError> {
        use debugger::verify::{self, Patch, SeedRow, VerifyRequest};
        let root = &self.shared.root;
        let finding = root.resolve(Path::new(&a.finding))?;
        let patch = match (a.image, a.manifest) {
            (Some(image), None) => Patch::Image(root.resolve(Path::new(&image))?),
            (None, Some(manifest)) => Patch::Manifest(root.resolve(Path::new(&manifest))?),
            _ => {
                return Err(arguments_error(
                    "verify",
                    "give one of `image` and `manifest`",
                ))
            }
        };
        let seeds = a.seeds.unwrap_or(2);
        let request = VerifyRequest {
            finding,
            patch,
            seeds,
            jobs: a.jobs.unwrap_or(1).clamp(1, 64),
            place: self.shared.place,
        };
        let mut budget = Budget::new(
            self.shared.session_limits.clone(),
            self.shared.usage_log.as_deref(),
        )
        .within(self.budgets())
        .cancelled_by(Some(env.cancel.clone()));
        let done = std::sync::atomic::AtomicU32::new(0);
        let progress = env.progress.clone();
        let told = |row: &SeedRow| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            progress(
                f64::from(n),
                Some(f64::from(seeds)),
                format!(
                    "seed offset {}: unpatched control {}, patched {}",
                    row.seeds.offset,
                    if row.control.failed { "FAIL" } else { "pass" },
                    if row.patched.failed { "FAIL" } else { "pass" }
                ),
            )
        };
        let runner = self.shared.runner.clone();
        let make = move || runner.handle();
        let runners: Option<verify::MakeRunner<'_>> = self.shared.in_helper_vm.then_some(&make);
        let report =
            verify::verify_on(&request, &mut budget, &told, runners).map_err(|e| failed(&e))?;
        Ok(serde_json::to_value(&report).expect("a report is JSON"))
    }

    fn likelihood(&mut self, a: LikelihoodArgs, env: &CallEnv) -> Result<Value, CallError> {
        use debugger::likelihood::{self, LikelihoodOptions, PointEstimate};
        let dir = self.shared.root.resolve(Path::new(&a.finding))?;
        let options = LikelihoodOptions {
            points: a.points.unwrap_or(4),
            branches: a.branches.unwrap_or(4),
            seed: a.seed,
            limits: self.shared.session_limits.clone(),
        };
        let plan = likelihood::plan(&dir, &options).map_err(|e| failed(&e))?;
        let workers = a
            .jobs
            .unwrap_or(1)
            .clamp(1, plan.points.len().max(1) as u32);
        plan.check(&options.limits, workers, &self.budgets())
            .map_err(|e| failed(&e))?;
        let session_options = || SessionOptions {
            limits: self.shared.session_limits.clone(),
            log: self.shared.usage_log.clone(),
            shared: self.budgets(),
            cancel: Some(env.cancel.clone()),
            ..SessionOptions::default()
        };
        let seats = if self.shared.in_helper_vm {
            let runner = self.shared.runner.clone();
            likelihood::seats_on(&dir, workers, &move || runner.handle(), &session_options)
        } else {
            likelihood::sessions(&dir, self.shared.place, workers, &session_options)
        }
        .map_err(|e| failed(&e))?;
        let total = plan.points.len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let progress = env.progress.clone();
        let told = |index: usize, point: &PointEstimate| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            progress(
                n as f64,
                Some(total as f64),
                format!(
                    "point {} at {}: {}/{} failed",
                    index + 1,
                    point.virtual_ns,
                    point.failures,
                    point.branches
                ),
            )
        };
        let result = likelihood::measure(&plan, seats, &told).map_err(|e| failed(&e))?;
        let mut value = serde_json::to_value(&result).expect("a likelihood is JSON");
        if a.svg {
            value["svg"] = json!(likelihood::svg(&result).map_err(|e| failed(&e))?);
        }
        value["budget"] = json!([self.shared.server_budget.spent(), self.budget.spent()]);
        Ok(value)
    }

    /// Lets every session's run go.
    pub fn close(&mut self) {
        for (_, session) in std::mem::take(&mut self.sessions) {
            if let Err(error) = session.close() {
                eprintln!("detvisor: closing a session: {}", run::chain(&error));
            }
        }
    }
}

fn arguments_error(tool: &str, reason: impl std::fmt::Display) -> CallError {
    CallError::Arguments {
        tool: tool.to_owned(),
        reason: reason.to_string(),
    }
}

fn args<T: DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, CallError> {
    serde_json::from_value(arguments).map_err(|e| arguments_error(tool, e))
}

fn duration(what: &str, text: &str) -> Result<VirtNanos, CallError> {
    text.parse::<VirtNanos>()
        .map_err(|e| arguments_error(what, format!("{text:?}: {e}")))
}

/// A result with what the call spent, as the CLI prints it.
fn with_spent<T: Serialize>(result: &T, spent: &Spent) -> Value {
    let mut value = serde_json::to_value(result).expect("a result is JSON");
    if let Value::Object(map) = &mut value {
        map.insert(
            "budget".into(),
            serde_json::to_value(spent).expect("spent is JSON"),
        );
    }
    value
}
