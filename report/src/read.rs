//! One campaign directory read into a [`Report`]: its database (opened read
//! only, as `detvisor findings` opens it, so also while it runs) for the
//! spec, budget, tree, tallies and stats; each finding's directory for its
//! schedule, logs and `checker.html`; and the debugger's reading of each
//! finding's own history (`records.jsonl`) for the properties' examples
//! and the finding's notable moments. No run is booted: the debugger
//! session is given a runner that refuses every request, and reading a
//! finding's own history by time never calls it.

use crate::merge;
use crate::model::*;
use debugger::moment::MomentId;
use debugger::reading;
use debugger::session::{Session, SessionError, SessionOptions};
use debugger::source::{Source, SourceError};
use fuzzer::failure::FailureKey;
use fuzzer::listing::{self, ListError, Listed};
use fuzzer::node_logs::LOGS_DIR;
use fuzzer::properties::PropertyTally;
use fuzzer::spec::HistoryChecker;
use fuzzer::store::{Store, StoreError};
use run::api::{Reply, Request};
use run::client::Runner;
use run::moment::When;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lines kept of the end of each finding's log.
pub const LOG_LINES: usize = 12;

/// Most bytes of a `checker.html` embedded.
pub const MAX_CHECKER_HTML: u64 = 8 << 20;

/// Most bytes of a log read for its last lines.
const MAX_LOG: u64 = 64 << 20;

/// Why a directory could not be read, each naming it.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: no such directory", path.display())]
    Missing { path: PathBuf },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    List(#[from] ListError),
    #[error("{}: the property tally in the campaign's database does not read", dir.display())]
    Tally {
        dir: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: reading the finding's history", dir.display())]
    Finding {
        dir: PathBuf,
        #[source]
        source: Box<SessionError>,
    },
    #[error("{}: opening the finding", dir.display())]
    Source {
        dir: PathBuf,
        #[source]
        source: SourceError,
    },
    #[error(transparent)]
    File(#[from] hostfile::ReadError),
    #[error("no campaign directory given")]
    Nothing,
}

/// The judge's saved state, as the engine keeps it under `tally`.
#[derive(serde::Deserialize)]
struct SavedJudge {
    tally: PropertyTally,
    #[serde(default)]
    fault_combinations: BTreeMap<String, u64>,
}

/// The campaign directories `dirs` read and merged (see [`merge::merge`]).
pub fn read(dirs: &[PathBuf]) -> Result<Report, ReadError> {
    read_each(dirs, |_, _| {})
}

/// [`read`], telling `on_read` each directory (its index) once it is read:
/// the progress of a report of many shards.
pub fn read_each(
    dirs: &[PathBuf],
    mut on_read: impl FnMut(usize, &Path),
) -> Result<Report, ReadError> {
    if dirs.is_empty() {
        return Err(ReadError::Nothing);
    }
    let mut parts = Vec::with_capacity(dirs.len());
    for (i, dir) in dirs.iter().enumerate() {
        parts.push(read_one(dir)?);
        on_read(i, dir);
    }
    Ok(merge::merge(parts))
}

/// One campaign directory.
pub fn read_one(dir: &Path) -> Result<Report, ReadError> {
    let dir = dir.canonicalize().map_err(|_| ReadError::Missing {
        path: dir.to_owned(),
    })?;
    let store = Store::open_read_only(&dir)?;
    let meta = store.campaign_meta()?;
    let stats = store.stats()?;
    let nodes = store.nodes()?;
    let saved = meta
        .tally
        .as_deref()
        .map(serde_json::from_str::<SavedJudge>)
        .transpose()
        .map_err(|source| ReadError::Tally {
            dir: dir.clone(),
            source,
        })?;
    let listed = listing::list(&dir)?;
    drop(store);

    let mut report = Report::empty();
    let (tally, combinations) = match saved {
        Some(saved) => (saved.tally, saved.fault_combinations),
        None => (PropertyTally::new(), BTreeMap::new()),
    };
    report.properties = properties_of(&tally, meta.spec.checker);
    for (combination, count) in &combinations {
        let kinds: Vec<&str> = combination.split('+').filter(|k| !k.is_empty()).collect();
        for kind in kinds {
            *report.fault_kinds.entry(kind.to_owned()).or_default() += count;
        }
    }
    report.fault_combinations = combinations;

    for listed in &listed {
        let finding = read_finding(listed, stats.as_ref())?;
        attach(&mut report.properties, &finding.finding, finding.rows);
        report.findings.push(finding.finding);
    }

    let mut exploration = Exploration {
        branches: meta.branches,
        moments: nodes.len() as u64,
        stopped: nodes.iter().filter(|n| n.stopped).count() as u64,
        depth: nodes.iter().map(|n| n.depth).max().unwrap_or(0),
        wall_ms: meta.wall_ms,
        ..Exploration::default()
    };
    exploration.moments_by_depth = vec![0; exploration.depth as usize + 1];
    for node in &nodes {
        exploration.moments_by_depth[node.depth as usize] += 1;
    }
    let kept = stats.as_ref();
    exploration.worker_ms = kept.map(|s| meta.wall_ms * u64::from(s.workers.max(1)));
    exploration.phases = kept.map(|s| Phases {
        root_ms: s.root_ms,
        branch_ms: s.branch_ms,
        shrink_ms: s.shrink_ms,
    });
    exploration.spilled = kept.map(|s| s.spilled);
    exploration.loaded = kept.map(|s| s.loaded);
    exploration.replayed_steps = kept.map(|s| s.replayed_steps);
    exploration.live_checkpoints = kept.map(|s| s.live_checkpoints);
    exploration.branches_by_minute = kept
        .map(|s| s.branches_by_minute.clone())
        .unwrap_or_default();
    report.exploration = exploration;
    report.campaigns.push(CampaignPart {
        dir,
        budget: BudgetUsed {
            branches: meta.branches,
            wall_ms: meta.wall_ms,
            max_branches: (meta.spec.max_branches > 0).then_some(meta.spec.max_branches),
            max_wall: meta.spec.wall_budget(),
        },
        spec: meta.spec,
        stats,
    });
    // One directory is a merge of one: the rates and verdicts are computed
    // in one place.
    Ok(merge::merge(vec![report]))
}

/// The properties of the tally (assertions in the order first seen, then
/// commands by name) and of the checker.
fn properties_of(tally: &PropertyTally, checker: HistoryChecker) -> Vec<PropertyReport> {
    let mut out = Vec::new();
    for t in tally.assertions() {
        let kind = match t.kind() {
            run::records::sdk::AssertionKind::Always => PropertyKind::Always,
            run::records::sdk::AssertionKind::AlwaysOrUnreachable => {
                PropertyKind::AlwaysOrUnreachable
            }
            run::records::sdk::AssertionKind::Sometimes => PropertyKind::Sometimes,
            run::records::sdk::AssertionKind::Reachable => PropertyKind::Reachable,
            run::records::sdk::AssertionKind::Unreachable => PropertyKind::Unreachable,
        };
        out.push(PropertyReport {
            key: t.key().slug(),
            name: t.id.clone(),
            kind,
            must_hit: t.must_hit,
            message: t.message.clone(),
            location: Some(location_text(&t.location)).filter(|l| !l.is_empty()),
            verdict: Verdict::Passed,
            why: None,
            hits: t.hits,
            passes: t.true_hits,
            failures: t.false_hits,
            failed_stretches: t.failed_stretches,
            findings: Vec::new(),
            examples: Vec::new(),
            counterexamples: Vec::new(),
        });
    }
    for (name, t) in tally.commands() {
        out.push(PropertyReport {
            key: FailureKey::Command { name: name.clone() }.slug(),
            name: name.clone(),
            kind: PropertyKind::Command,
            must_hit: true,
            message: format!("{name} never exits nonzero, and exits 0 at least once"),
            location: None,
            verdict: Verdict::Passed,
            why: None,
            hits: t.runs,
            passes: t.zero_exits,
            failures: t.nonzero_exits,
            failed_stretches: u64::from(t.first_nonzero.is_some()),
            findings: Vec::new(),
            examples: Vec::new(),
            counterexamples: Vec::new(),
        });
    }
    if checker == HistoryChecker::Kv {
        let stretches = tally.stretch_count() as u64;
        out.push(checker_property("linearizability", stretches));
    }
    out
}

fn checker_property(name: &str, histories: u64) -> PropertyReport {
    PropertyReport {
        key: format!("checker:{name}"),
        name: name.to_owned(),
        kind: PropertyKind::Checker,
        must_hit: false,
        message: match name {
            "linearizability" => "every key's operations are linearizable".to_owned(),
            "history" => "the recorded history is well-formed".to_owned(),
            other => format!("the {other} checker finds nothing wrong"),
        },
        location: None,
        verdict: Verdict::Passed,
        why: None,
        hits: histories,
        passes: histories,
        failures: 0,
        failed_stretches: 0,
        findings: Vec::new(),
        examples: Vec::new(),
        counterexamples: Vec::new(),
    }
}

/// A finding read, with the debugger's property rows of its history.
struct ReadFinding {
    finding: FindingReport,
    rows: Vec<reading::PropertyRow>,
}

/// A runner that refuses every request: reading a finding's own history
/// never needs a run, and a call that did would fail rather than boot.
struct NoRuns;

impl Runner for NoRuns {
    fn call(&mut self, _request: Request) -> Reply {
        Err("a report reads what is on disk and runs nothing".to_owned())
    }
}

fn read_finding(
    listed: &Listed,
    stats: Option<&fuzzer::stats::CampaignStats>,
) -> Result<ReadFinding, ReadError> {
    let dir = &listed.dir;
    let file = &listed.file;
    let source = Source::open(dir).map_err(|source| ReadError::Source {
        dir: dir.clone(),
        source,
    })?;
    let failure = source
        .finding()
        .map(|f| FailureAt {
            exit: f.failure.exit,
            virtual_ns: f.failure.virtual_ns,
        })
        .expect("a finding's directory opens as a finding");
    let mut session = Session::new(source, Box::new(NoRuns), SessionOptions::default());
    let history = MomentId::of_source(dir, When::Latest);
    let history_error = |source| ReadError::Finding {
        dir: dir.clone(),
        source: Box::new(source),
    };
    let rows = reading::properties(&mut session, &history).map_err(history_error)?;
    let timeline = reading::moments(&session)
        .into_iter()
        .map(|m| TimelineEntry {
            moment: m.moment.to_string(),
            virtual_ns: m.virtual_ns,
            exit: m.exit,
            kind: m.kind.to_owned(),
            what: m.what,
        })
        .collect();
    let checker_path = dir.join("checker.html");
    let checker_html = if checker_path.exists() {
        Some(hostfile::read_text_limited(
            &checker_path,
            MAX_CHECKER_HTML,
        )?)
    } else {
        None
    };
    let faults = file
        .path
        .steps
        .iter()
        .flat_map(|step| {
            step.faults.iter().map(|fault| ScheduledFault {
                branch_at: step.at_ns,
                fault: fault.to_string(),
            })
        })
        .collect();
    let replay = replay_command(dir);
    Ok(ReadFinding {
        finding: FindingReport {
            key: file.key.clone(),
            number: file.number,
            dir: dir.clone(),
            campaign: 0,
            summary: file.summary.clone(),
            moment: MomentId::of_source(dir, When::Failure).to_string(),
            failure,
            faults,
            faults_found: file.found_path.steps.iter().map(|s| s.faults.len()).sum(),
            steps: file.path.steps.len(),
            exits: file.exits,
            virtual_ns: file.virtual_ns,
            digest: file.digest.clone(),
            timeline,
            checker_html,
            logs: last_lines(&dir.join(LOGS_DIR))?,
            replay,
            found_at_ms: stats.and_then(|s| s.findings_at_ms.get(&file.number).copied()),
            also_in: Vec::new(),
            triage: None,
        },
        rows,
    })
}

/// The command that replays the finding in `dir`.
pub fn replay_command(dir: &Path) -> String {
    let text = dir.display().to_string();
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+=,".contains(&b));
    if plain {
        format!("detvisor replay {text}")
    } else {
        format!("detvisor replay '{}'", text.replace('\'', r"'\''"))
    }
}

/// The last [`LOG_LINES`] lines of each `*.log` in `logs`, by name.
fn last_lines(logs: &Path) -> Result<BTreeMap<String, Vec<String>>, ReadError> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(logs) else {
        return Ok(out);
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        let bytes = hostfile::read_limited(&path, MAX_LOG)?;
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(LOG_LINES);
        out.insert(
            name.to_owned(),
            lines[from..].iter().map(|l| (*l).to_owned()).collect(),
        );
    }
    Ok(out)
}

/// Gives the finding's examples to its properties: the debugger's rows of
/// its history by assertion id, its own failure (a checker's row, or the
/// property its key names) as a counterexample.
fn attach(
    properties: &mut Vec<PropertyReport>,
    finding: &FindingReport,
    rows: Vec<reading::PropertyRow>,
) {
    let key = FailureKey::from_slug(&finding.key).ok();
    let owner = match &key {
        Some(FailureKey::Checker { checker, .. }) => format!("checker:{checker}"),
        _ => finding.key.clone(),
    };
    if !properties.iter().any(|p| p.key == owner) {
        if let Some(FailureKey::Checker { checker, .. }) = &key {
            properties.push(checker_property(checker, 0));
        }
    }
    if let Some(p) = properties.iter_mut().find(|p| p.key == owner) {
        p.findings.push(finding.key.clone());
    }
    let example = |e: &reading::Example| Example {
        moment: e.moment.to_string(),
        exit: e.exit,
        node: e.node.clone(),
        details: e.details.clone(),
    };
    for row in rows {
        // The debugger gives a finding's own failure a row of its own when
        // no assertion's id ends its key: a property's failure is already
        // its assertion's counterexample.
        if row.kind == "checker" && matches!(key, Some(FailureKey::Property { .. })) {
            continue;
        }
        let targets: Vec<&mut PropertyReport> = if row.kind == "checker" {
            properties.iter_mut().filter(|p| p.key == owner).collect()
        } else {
            properties
                .iter_mut()
                .filter(|p| p.kind != PropertyKind::Checker && p.name == row.id)
                .collect()
        };
        for p in targets {
            p.examples.extend(row.passing.iter().map(example));
            p.counterexamples.extend(row.failing.iter().map(example));
        }
    }
}

/// Where an assertion is, for people: `file:line` (the line is shown, never
/// part of the key), else its function or class.
fn location_text(location: &run::records::sdk::Location) -> String {
    if location.file.is_empty() {
        location.key_function().to_owned()
    } else {
        format!("{}:{}", location.file, location.begin_line)
    }
}
