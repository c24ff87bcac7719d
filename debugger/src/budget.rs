//! Hard limits on what a debugging session may spend, per session and per
//! call: an agent left alone with a time machine would otherwise branch and
//! replay without end. A call that would pass a limit it can know in
//! advance (virtual time to simulate, branches, depth, workers, bytes) is
//! refused before it starts, naming the limit and by how much; wall time is
//! checked between the slices a call runs in, and a call that passes it
//! stops with the same error. Every result reports what it used and what
//! is left, and every call's use is appended to a log file (JSON lines).

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vmm::VirtNanos;

/// The limits. The defaults are meant for one agent on one finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall time of the whole session.
    pub session_wall: VirtNanos,
    /// Wall time of one call.
    pub call_wall: VirtNanos,
    /// Virtual time simulated by the whole session (replays, branches,
    /// commands, verification and likelihood runs).
    pub session_virtual: VirtNanos,
    /// Virtual time one call may simulate.
    pub call_virtual: VirtNanos,
    /// Branches created in the session.
    pub branches_created: u64,
    /// Branches whose end is kept at once.
    pub branches_alive: u64,
    /// Branches from one moment.
    pub siblings: u64,
    /// Branches on branches: instants a history may have branched at.
    pub depth: u64,
    /// Runs at once (verification and likelihood).
    pub workers: u64,
    /// Bytes of files and command output returned by the session.
    pub session_bytes: u64,
    /// Bytes one call may return.
    pub call_bytes: u64,
    /// Host memory the kept checkpoints may hold.
    pub memory_bytes: u64,
    /// Disk the session may write (plots, extracted files written by the
    /// CLI).
    pub disk_bytes: u64,
}

const SECOND: u64 = 1_000_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            session_wall: VirtNanos(4 * 3600 * SECOND),
            call_wall: VirtNanos(30 * 60 * SECOND),
            session_virtual: VirtNanos(24 * 3600 * SECOND),
            call_virtual: VirtNanos(3600 * SECOND),
            branches_created: 1024,
            branches_alive: 64,
            siblings: 16,
            depth: 8,
            workers: 64,
            session_bytes: 256 << 20,
            call_bytes: 16 << 20,
            memory_bytes: 2 << 30,
            disk_bytes: 1 << 30,
        }
    }
}

/// What a session or a call used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub wall: VirtNanos,
    pub virtual_time: VirtNanos,
    pub branches_created: u64,
    pub bytes: u64,
    pub disk_bytes: u64,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.wall = VirtNanos(self.wall.0 + other.wall.0);
        self.virtual_time = VirtNanos(self.virtual_time.0 + other.virtual_time.0);
        self.branches_created += other.branches_created;
        self.bytes += other.bytes;
        self.disk_bytes += other.disk_bytes;
    }
}

/// What a result reports: the call's use, the session's, and what is left.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spent {
    pub call: Usage,
    pub session: Usage,
    pub left: Usage,
    /// The budgets shared with other sessions that this one is within (a
    /// server's, a client's): what they used together and what is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<SharedSpent>,
}

/// A shared budget's use, as a result reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSpent {
    /// Whose it is (`server`, `client`).
    pub scope: SharedScope,
    pub used: Usage,
    pub left: SharedLeft,
}

/// What is left of a shared budget; `None` (null in JSON) where it has no
/// limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedLeft {
    pub wall: Option<VirtNanos>,
    pub virtual_time: Option<VirtNanos>,
    pub branches_created: Option<u64>,
    pub bytes: Option<u64>,
}

/// Whose a shared budget is: the limits it refuses are named after it
/// (`server_virtual_time`, `client_branches_created`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedScope {
    /// Every client of a server together.
    Server,
    /// One client's sessions (one per source) together.
    Client,
}

impl SharedScope {
    fn name(self, what: &str) -> &'static str {
        match (self, what) {
            (SharedScope::Server, "wall") => "server_wall",
            (SharedScope::Server, "virtual_time") => "server_virtual_time",
            (SharedScope::Server, "branches_created") => "server_branches_created",
            (SharedScope::Server, _) => "server_bytes",
            (SharedScope::Client, "wall") => "client_wall",
            (SharedScope::Client, "virtual_time") => "client_virtual_time",
            (SharedScope::Client, "branches_created") => "client_branches_created",
            (SharedScope::Client, _) => "client_bytes",
        }
    }
}

/// A limit a call would pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget {budget}: the call needs {needed}, {used} is used of {limit}: {over} over (see docs/debugging.md, budgets)")]
pub struct BudgetError {
    /// Which limit (its field name in [`Limits`]).
    pub budget: &'static str,
    pub limit: String,
    pub used: String,
    pub needed: String,
    pub over: String,
}

/// Why the log could not be written.
#[derive(Debug, thiserror::Error)]
#[error("budget log {}", path.display())]
pub struct LogError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// A call was cancelled by its caller (checked where the wall budget is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the call was cancelled")]
pub struct Cancelled;

/// The limits of a budget several sessions share (a server's, over all its
/// clients): what they may spend together. Wall time here is the sum of
/// the calls' wall times (the compute they held), not time since start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedLimits {
    /// Wall time of all calls together.
    pub wall: VirtNanos,
    /// Virtual time simulated by all calls together.
    pub virtual_time: VirtNanos,
    /// Branches created by all sessions together.
    pub branches_created: u64,
    /// Bytes returned by all sessions together.
    pub bytes: u64,
}

impl Default for SharedLimits {
    /// No limit (each session keeps its own).
    fn default() -> Self {
        SharedLimits {
            wall: VirtNanos(u64::MAX),
            virtual_time: VirtNanos(u64::MAX),
            branches_created: u64::MAX,
            bytes: u64::MAX,
        }
    }
}

/// A budget several sessions draw from at once (clone it into each): a
/// call is checked against what the others used and ended, its use added
/// when it ends. Checks and ends of concurrent calls interleave: a call is
/// checked against the calls that ended before it, so concurrent calls
/// may together pass a limit by at most what they were each allowed.
#[derive(Clone, Debug)]
pub struct SharedBudget {
    inner: Arc<Mutex<SharedState>>,
}

#[derive(Debug)]
struct SharedState {
    scope: SharedScope,
    limits: SharedLimits,
    used: Usage,
}

impl SharedBudget {
    pub fn new(scope: SharedScope, limits: SharedLimits) -> SharedBudget {
        SharedBudget {
            inner: Arc::new(Mutex::new(SharedState {
                scope,
                limits,
                used: Usage::default(),
            })),
        }
    }

    pub fn scope(&self) -> SharedScope {
        self.state().scope
    }

    /// What a result reports of it.
    pub fn spent(&self) -> SharedSpent {
        SharedSpent {
            scope: self.scope(),
            used: self.used(),
            left: self.left(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
        // A panic elsewhere left the counts as they were: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn limits(&self) -> SharedLimits {
        self.state().limits.clone()
    }

    /// What all sessions used (calls that ended).
    pub fn used(&self) -> Usage {
        self.state().used.clone()
    }

    /// What is left (`None` where there is no limit: `u64::MAX`).
    pub fn left(&self) -> SharedLeft {
        let state = self.state();
        let (limits, used) = (&state.limits, &state.used);
        let left = |limit: u64, used: u64| (limit != u64::MAX).then(|| limit.saturating_sub(used));
        SharedLeft {
            wall: left(limits.wall.0, used.wall.0).map(VirtNanos),
            virtual_time: left(limits.virtual_time.0, used.virtual_time.0).map(VirtNanos),
            branches_created: left(limits.branches_created, used.branches_created),
            bytes: left(limits.bytes, used.bytes),
        }
    }

    fn add(&self, call: &Usage) {
        self.state().used.add(call);
    }

    /// Refuses a call whose use so far is `call` and that needs `needed`
    /// more.
    fn check(&self, call: &Usage, needed: &Usage) -> Result<(), BudgetError> {
        let state = self.state();
        let (limits, used, scope) = (&state.limits, &state.used, state.scope);
        let wall = VirtNanos(used.wall.0.saturating_add(call.wall.0));
        if wall.0.saturating_add(needed.wall.0) > limits.wall.0 {
            return Err(time_error(
                scope.name("wall"),
                limits.wall,
                wall,
                needed.wall,
            ));
        }
        let virtual_time = VirtNanos(used.virtual_time.0.saturating_add(call.virtual_time.0));
        if virtual_time.0.saturating_add(needed.virtual_time.0) > limits.virtual_time.0 {
            return Err(time_error(
                scope.name("virtual_time"),
                limits.virtual_time,
                virtual_time,
                needed.virtual_time,
            ));
        }
        let branches = used.branches_created.saturating_add(call.branches_created);
        if branches.saturating_add(needed.branches_created) > limits.branches_created {
            return Err(count_error(
                scope.name("branches_created"),
                limits.branches_created,
                branches,
                needed.branches_created,
            ));
        }
        let bytes = used.bytes.saturating_add(call.bytes);
        if bytes.saturating_add(needed.bytes) > limits.bytes {
            return Err(count_error(
                scope.name("bytes"),
                limits.bytes,
                bytes,
                needed.bytes,
            ));
        }
        Ok(())
    }
}

/// A session's budget: its limits, what it used, and the call under way.
pub struct Budget {
    pub limits: Limits,
    session: Usage,
    started: Instant,
    call: Option<(String, Instant, Usage)>,
    log: Option<PathBuf>,
    shared: Vec<SharedBudget>,
    cancel: Option<Arc<AtomicBool>>,
}

fn time_error(
    budget: &'static str,
    limit: VirtNanos,
    used: VirtNanos,
    needed: VirtNanos,
) -> BudgetError {
    let over = VirtNanos(used.0.saturating_add(needed.0).saturating_sub(limit.0));
    BudgetError {
        budget,
        limit: limit.to_string(),
        used: used.to_string(),
        needed: needed.to_string(),
        over: over.to_string(),
    }
}

fn count_error(budget: &'static str, limit: u64, used: u64, needed: u64) -> BudgetError {
    BudgetError {
        budget,
        limit: limit.to_string(),
        used: used.to_string(),
        needed: needed.to_string(),
        over: used
            .saturating_add(needed)
            .saturating_sub(limit)
            .to_string(),
    }
}

impl Budget {
    /// A session's budget; each call's use is appended to `log` when given.
    pub fn new(limits: Limits, log: Option<&Path>) -> Budget {
        Budget {
            limits,
            session: Usage::default(),
            started: Instant::now(),
            call: None,
            log: log.map(Path::to_path_buf),
            shared: Vec::new(),
            cancel: None,
        }
    }

    /// This budget within `shared` too: every check also against them,
    /// every call's use also added to them.
    pub fn within(mut self, shared: impl IntoIterator<Item = SharedBudget>) -> Budget {
        self.shared.extend(shared);
        self
    }

    /// Calls stop (with [`Cancelled`], between the slices they run in)
    /// once `flag` is set; a new call clears nothing: the flag's owner
    /// does.
    pub fn cancelled_by(mut self, flag: Option<Arc<AtomicBool>>) -> Budget {
        self.cancel = flag;
        self
    }

    /// Sets (or takes away) the flag that cancels calls.
    pub fn set_cancel(&mut self, flag: Option<Arc<AtomicBool>>) {
        self.cancel = flag;
    }

    /// Refuses going on once the call was cancelled.
    pub fn check_cancelled(&self) -> Result<(), Cancelled> {
        match &self.cancel {
            Some(flag) if flag.load(Ordering::SeqCst) => Err(Cancelled),
            _ => Ok(()),
        }
    }

    /// The flag that cancels calls, for work on other threads.
    pub fn cancel_flag(&self) -> Option<Arc<AtomicBool>> {
        self.cancel.clone()
    }

    /// The shared budgets this one is within.
    pub fn shared(&self) -> &[SharedBudget] {
        &self.shared
    }

    /// Checks `needed` more of this call against the shared budgets.
    fn check_shared(&self, needed: Usage) -> Result<(), BudgetError> {
        let mut call = self.call_usage();
        if let Some((_, started, _)) = &self.call {
            call.wall = VirtNanos(started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64);
        }
        for shared in &self.shared {
            shared.check(&call, &needed)?;
        }
        Ok(())
    }

    /// A call named `name` begins (its wall time counts from here).
    pub fn begin(&mut self, name: &str) -> Result<(), BudgetError> {
        self.call = Some((name.to_owned(), Instant::now(), Usage::default()));
        self.check_wall()
    }

    fn call_usage(&self) -> Usage {
        self.call
            .as_ref()
            .map(|(_, _, u)| u.clone())
            .unwrap_or_default()
    }

    /// Refuses simulating `needed` more virtual time in this call.
    pub fn check_virtual(&self, needed: VirtNanos) -> Result<(), BudgetError> {
        let call = self.call_usage();
        if call.virtual_time.0 + needed.0 > self.limits.call_virtual.0 {
            return Err(time_error(
                "call_virtual",
                self.limits.call_virtual,
                call.virtual_time,
                needed,
            ));
        }
        let used = VirtNanos(self.session.virtual_time.0 + call.virtual_time.0);
        if used.0 + needed.0 > self.limits.session_virtual.0 {
            return Err(time_error(
                "session_virtual",
                self.limits.session_virtual,
                used,
                needed,
            ));
        }
        self.check_shared(Usage {
            virtual_time: needed,
            ..Usage::default()
        })
    }

    /// Counts `simulated` virtual time against the call.
    pub fn simulated(&mut self, simulated: VirtNanos) {
        if let Some((_, _, usage)) = &mut self.call {
            usage.virtual_time = VirtNanos(usage.virtual_time.0 + simulated.0);
        }
    }

    /// Refuses returning `needed` more bytes.
    pub fn check_bytes(&self, needed: u64) -> Result<(), BudgetError> {
        let call = self.call_usage();
        if call.bytes + needed > self.limits.call_bytes {
            return Err(count_error(
                "call_bytes",
                self.limits.call_bytes,
                call.bytes,
                needed,
            ));
        }
        let used = self.session.bytes + call.bytes;
        if used + needed > self.limits.session_bytes {
            return Err(count_error(
                "session_bytes",
                self.limits.session_bytes,
                used,
                needed,
            ));
        }
        self.check_shared(Usage {
            bytes: needed,
            ..Usage::default()
        })
    }

    pub fn returned(&mut self, bytes: u64) {
        if let Some((_, _, usage)) = &mut self.call {
            usage.bytes += bytes;
        }
    }

    /// Refuses writing `needed` more bytes to disk.
    pub fn check_disk(&self, needed: u64) -> Result<(), BudgetError> {
        let used = self.session.disk_bytes + self.call_usage().disk_bytes;
        if used + needed > self.limits.disk_bytes {
            return Err(count_error(
                "disk_bytes",
                self.limits.disk_bytes,
                used,
                needed,
            ));
        }
        Ok(())
    }

    pub fn wrote(&mut self, bytes: u64) {
        if let Some((_, _, usage)) = &mut self.call {
            usage.disk_bytes += bytes;
        }
    }

    /// Refuses creating `needed` more branches, `siblings` of them from one
    /// moment that has `existing` already, `depth` deep, with
    /// `alive` kept now.
    pub fn check_branches(
        &self,
        needed: u64,
        existing_siblings: u64,
        depth: u64,
        alive: u64,
    ) -> Result<(), BudgetError> {
        let used = self.session.branches_created + self.call_usage().branches_created;
        if used + needed > self.limits.branches_created {
            return Err(count_error(
                "branches_created",
                self.limits.branches_created,
                used,
                needed,
            ));
        }
        if existing_siblings + needed > self.limits.siblings {
            return Err(count_error(
                "siblings",
                self.limits.siblings,
                existing_siblings,
                needed,
            ));
        }
        if depth > self.limits.depth {
            return Err(count_error("depth", self.limits.depth, depth - 1, 1));
        }
        if alive + 1 > self.limits.branches_alive {
            return Err(count_error(
                "branches_alive",
                self.limits.branches_alive,
                alive,
                1,
            ));
        }
        self.check_shared(Usage {
            branches_created: needed,
            ..Usage::default()
        })
    }

    pub fn branched(&mut self, count: u64) {
        if let Some((_, _, usage)) = &mut self.call {
            usage.branches_created += count;
        }
    }

    /// Refuses `workers` runs at once.
    pub fn check_workers(&self, workers: u64) -> Result<(), BudgetError> {
        if workers > self.limits.workers {
            return Err(count_error("workers", self.limits.workers, 0, workers));
        }
        Ok(())
    }

    /// Refuses going on once the call's or the session's wall time is
    /// spent (checked between slices of a call).
    pub fn check_wall(&self) -> Result<(), BudgetError> {
        let to_nanos = |d: Duration| VirtNanos(d.as_nanos().min(u128::from(u64::MAX)) as u64);
        if let Some((_, started, _)) = &self.call {
            let used = to_nanos(started.elapsed());
            if used > self.limits.call_wall {
                return Err(time_error(
                    "call_wall",
                    self.limits.call_wall,
                    used,
                    VirtNanos::ZERO,
                ));
            }
        }
        let used = to_nanos(self.started.elapsed());
        if used > self.limits.session_wall {
            return Err(time_error(
                "session_wall",
                self.limits.session_wall,
                used,
                VirtNanos::ZERO,
            ));
        }
        self.check_shared(Usage::default())
    }

    /// Ends the call (also a failed one): its use counts against the
    /// session and is logged. What was spent.
    pub fn end(&mut self, outcome: &str) -> Result<Spent, LogError> {
        let (name, started, mut call) = self
            .call
            .take()
            .unwrap_or_else(|| ("call".into(), Instant::now(), Usage::default()));
        call.wall = VirtNanos(started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64);
        self.session.add(&call);
        for shared in &self.shared {
            shared.add(&call);
        }
        let spent = Spent {
            call: call.clone(),
            session: self.session.clone(),
            left: self.left(),
            shared: self.shared.iter().map(SharedBudget::spent).collect(),
        };
        if let Some(path) = &self.log {
            let line = serde_json::json!({
                "call": name,
                "outcome": outcome,
                "used": call,
                "session": self.session,
                "left": spent.left,
                "shared": spent.shared,
            });
            let error = |source| LogError {
                path: path.clone(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(error)?;
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(error)?;
            writeln!(file, "{line}").map_err(error)?;
        }
        Ok(spent)
    }

    /// What the session has left.
    pub fn left(&self) -> Usage {
        let wall = VirtNanos(self.started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64);
        Usage {
            wall: VirtNanos(self.limits.session_wall.0.saturating_sub(wall.0)),
            virtual_time: VirtNanos(
                self.limits
                    .session_virtual
                    .0
                    .saturating_sub(self.session.virtual_time.0),
            ),
            branches_created: self
                .limits
                .branches_created
                .saturating_sub(self.session.branches_created),
            bytes: self.limits.session_bytes.saturating_sub(self.session.bytes),
            disk_bytes: self
                .limits
                .disk_bytes
                .saturating_sub(self.session.disk_bytes),
        }
    }

    /// What the session used so far.
    pub fn session(&self) -> &Usage {
        &self.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_call_past_a_limit_is_refused_naming_it_and_by_how_much() {
        let limits = Limits {
            call_virtual: VirtNanos(10 * SECOND),
            call_bytes: 100,
            siblings: 2,
            ..Limits::default()
        };
        let mut budget = Budget::new(limits, None);
        budget.begin("exec").unwrap();
        budget.simulated(VirtNanos(8 * SECOND));
        let error = budget.check_virtual(VirtNanos(3 * SECOND)).unwrap_err();
        assert_eq!(error.budget, "call_virtual");
        assert_eq!(
            error.to_string(),
            "budget call_virtual: the call needs 3s, 8s is used of 10s: 1s over (see docs/debugging.md, budgets)"
        );
        budget.check_virtual(VirtNanos(2 * SECOND)).unwrap();
        assert_eq!(budget.check_bytes(101).unwrap_err().over, "1");
        assert_eq!(
            budget.check_branches(1, 2, 1, 0).unwrap_err().budget,
            "siblings"
        );
        let spent = budget.end("ok").unwrap();
        assert_eq!(spent.call.virtual_time, VirtNanos(8 * SECOND));
        // A new call starts from nothing; the session keeps counting.
        budget.begin("exec").unwrap();
        budget.check_virtual(VirtNanos(10 * SECOND)).unwrap();
        assert_eq!(budget.session().virtual_time, VirtNanos(8 * SECOND));
    }

    #[test]
    fn test_every_call_is_logged_with_what_it_used_and_what_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sub/usage.jsonl");
        let mut budget = Budget::new(Limits::default(), Some(&log));
        for bytes in [5, 7] {
            budget.begin("extract").unwrap();
            budget.returned(bytes);
            budget.end("ok").unwrap();
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["call"], "extract");
        assert_eq!(lines[1]["used"]["bytes"], 7);
        assert_eq!(lines[1]["session"]["bytes"], 12);
        assert_eq!(
            lines[1]["left"]["bytes"],
            serde_json::json!(Limits::default().session_bytes - 12)
        );
    }

    #[test]
    fn test_sessions_within_a_shared_budget_draw_from_it_together() {
        let shared = SharedBudget::new(
            SharedScope::Server,
            SharedLimits {
                virtual_time: VirtNanos(10 * SECOND),
                branches_created: 3,
                ..SharedLimits::default()
            },
        );
        let mut a = Budget::new(Limits::default(), None).within([shared.clone()]);
        let client = SharedBudget::new(
            SharedScope::Client,
            SharedLimits {
                bytes: 10,
                ..SharedLimits::default()
            },
        );
        let mut b = Budget::new(Limits::default(), None).within([shared.clone(), client]);
        a.begin("wait").unwrap();
        a.check_virtual(VirtNanos(6 * SECOND)).unwrap();
        a.simulated(VirtNanos(6 * SECOND));
        a.branched(2);
        let spent = a.end("ok").unwrap();
        let reported = &spent.shared[0];
        assert_eq!(reported.scope, SharedScope::Server);
        assert_eq!(reported.used.virtual_time, VirtNanos(6 * SECOND));
        assert_eq!(reported.left.virtual_time, Some(VirtNanos(4 * SECOND)));
        assert_eq!(reported.left.branches_created, Some(1));
        // No limit on bytes: nothing to count down from.
        assert_eq!(reported.left.bytes, None);
        // The other session has its own limits untouched, but not the
        // shared ones.
        b.begin("wait").unwrap();
        let error = b.check_virtual(VirtNanos(5 * SECOND)).unwrap_err();
        assert_eq!(error.budget, "server_virtual_time");
        assert_eq!(error.over, "1s");
        b.check_virtual(VirtNanos(4 * SECOND)).unwrap();
        let error = b.check_branches(2, 0, 1, 0).unwrap_err();
        assert_eq!(
            (error.budget, error.used.as_str(), error.over.as_str()),
            ("server_branches_created", "2", "1")
        );
        b.check_branches(1, 0, 1, 0).unwrap();
        assert_eq!(b.check_bytes(11).unwrap_err().budget, "client_bytes");
        b.check_bytes(10).unwrap();
        assert_eq!(b.session().virtual_time, VirtNanos::ZERO);
        assert_eq!(b.end("ok").unwrap().shared.len(), 2);
        // Without limits a shared budget refuses nothing.
        let free = Budget::new(Limits::default(), None).within([SharedBudget::new(
            SharedScope::Server,
            SharedLimits::default(),
        )]);
        free.check_virtual(VirtNanos(SECOND)).unwrap();
        free.check_bytes(1).unwrap();
    }

    #[test]
    fn test_a_cancelled_call_is_told_so() {
        let flag = Arc::new(AtomicBool::new(false));
        let budget = Budget::new(Limits::default(), None).cancelled_by(Some(flag.clone()));
        budget.check_cancelled().unwrap();
        flag.store(true, Ordering::SeqCst);
        assert_eq!(budget.check_cancelled(), Err(Cancelled));
        assert!(Budget::new(Limits::default(), None)
            .check_cancelled()
            .is_ok());
    }

    #[test]
    fn test_limits_read_from_json_fill_in_defaults() {
        let limits: Limits = serde_json::from_str(r#"{"siblings": 4}"#).unwrap();
        assert_eq!(limits.siblings, 4);
        assert_eq!(limits.depth, Limits::default().depth);
        assert!(serde_json::from_str::<Limits>(r#"{"sibling": 4}"#).is_err());
    }
}
