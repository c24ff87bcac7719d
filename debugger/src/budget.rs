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

/// A session's budget: its limits, what it used, and the call under way.
pub struct Budget {
    pub limits: Limits,
    session: Usage,
    started: Instant,
    call: Option<(String, Instant, Usage)>,
    log: Option<PathBuf>,
}

fn time_error(
    budget: &'static str,
    limit: VirtNanos,
    used: VirtNanos,
    needed: VirtNanos,
) -> BudgetError {
    let over = VirtNanos((used.0 + needed.0).saturating_sub(limit.0));
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
        over: (used + needed).saturating_sub(limit).to_string(),
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
        }
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
        Ok(())
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
        Ok(())
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
        Ok(())
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
        Ok(())
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
        let spent = Spent {
            call: call.clone(),
            session: self.session.clone(),
            left: self.left(),
        };
        if let Some(path) = &self.log {
            let line = serde_json::json!({
                "call": name,
                "outcome": outcome,
                "used": call,
                "session": self.session,
                "left": spent.left,
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
    fn test_limits_read_from_json_fill_in_defaults() {
        let limits: Limits = serde_json::from_str(r#"{"siblings": 4}"#).unwrap();
        assert_eq!(limits.siblings, 4);
        assert_eq!(limits.depth, Limits::default().depth);
        assert!(serde_json::from_str::<Limits>(r#"{"sibling": 4}"#).is_err());
    }
}
