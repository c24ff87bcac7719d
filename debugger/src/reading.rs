//! Reading a history without running it where the finding's files already
//! say it: its events (node output, faults, property records, run events)
//! up to a moment, its properties with their passing and failing examples,
//! its notable moments and its nodes. On a finding's own history these come
//! from `records.jsonl`; on a branch the session replays it and reads what
//! the guest reported on the way.

use crate::moment::MomentId;
use crate::session::{Result, Session};
use crate::source::Source;
use run::moment::When;
use run::records::sdk::SdkRecord;
use run::records::{GuestRecord, RecordBody};
use run::up::UpEvent;
use serde::Serialize;
use std::collections::BTreeMap;
use vmm::VirtNanos;

/// What to keep of a history's records.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Only this node's (`workload` for the workload's own).
    pub node: Option<String>,
    /// Only records whose text contains this.
    pub text: Option<String>,
    /// Only this kind: `event`, `sdk`, `history`, `output`, or an event's
    /// name (`fault`, `node_exited`, ...).
    pub kind: Option<String>,
    /// Only the records of this property (an assertion's id).
    pub property: Option<String>,
    /// At most this many, the last ones (0: all).
    pub last: usize,
}

/// One record as listed.
#[derive(Clone, Debug, Serialize)]
pub struct EventRow {
    /// Where it was read, as a moment of the history.
    pub moment: MomentId,
    pub exit: u64,
    pub virtual_ns: VirtNanos,
    pub node: Option<String>,
    /// `event`, `sdk`, `history`, `output`, `output_dropped`.
    pub kind: &'static str,
    /// An event's name (`node_paused`, `fault`, ...) or the SDK record's
    /// kind (`assert`, `guidance`, ...), when there is one.
    pub name: Option<String>,
    /// One line for people.
    pub text: String,
}

fn kind_of(body: &RecordBody) -> &'static str {
    match body {
        RecordBody::Event { .. } => "event",
        RecordBody::Sdk { .. } => "sdk",
        RecordBody::History { .. } => "history",
        RecordBody::Output { .. } => "output",
        RecordBody::OutputDropped { .. } => "output_dropped",
    }
}

/// An event's tag (`node_paused`), as its JSON names it.
fn event_name(event: &UpEvent) -> Option<String> {
    let json = serde_json::to_value(event).ok()?;
    match &json {
        serde_json::Value::Object(map) => map
            .get("event")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .or_else(|| map.keys().next().cloned()),
        serde_json::Value::String(name) => Some(name.clone()),
        _ => None,
    }
}

/// The property an SDK record is of, if any.
fn property_of(body: &RecordBody) -> Option<String> {
    match body {
        RecordBody::Sdk { json } => match SdkRecord::parse(json).ok()? {
            SdkRecord::Assert(assertion) => Some(assertion.id),
            SdkRecord::Guidance(guidance) => Some(guidance.id),
            _ => None,
        },
        _ => None,
    }
}

/// `record` as listed, its moment on `history`.
pub fn event_row(history: &MomentId, record: &GuestRecord) -> EventRow {
    let (name, text) = match &record.body {
        RecordBody::Event { event } => (
            event_name(event),
            serde_json::to_string(event).unwrap_or_default(),
        ),
        RecordBody::Sdk { json } => (
            SdkRecord::parse(json).ok().map(|r| {
                match r {
                    SdkRecord::SdkInfo { .. } => "sdk_info",
                    SdkRecord::Setup { .. } => "setup",
                    SdkRecord::Assert(_) => "assert",
                    SdkRecord::Guidance(_) => "guidance",
                    SdkRecord::Event { .. } => "event",
                }
                .to_owned()
            }),
            json.to_string(),
        ),
        RecordBody::History { json } => (None, json.to_string()),
        RecordBody::Output { log, text, .. } => (Some(log.clone()), text.clone()),
        RecordBody::OutputDropped { log, bytes } => (
            Some(log.clone()),
            format!("{bytes} bytes of output dropped"),
        ),
    };
    EventRow {
        moment: history.at(When::Time(record.virtual_ns)),
        exit: record.exit,
        virtual_ns: record.virtual_ns,
        node: record.node.clone(),
        kind: kind_of(&record.body),
        name,
        text,
    }
}

impl EventFilter {
    /// Whether `record` of `history` is kept.
    pub fn matches(&self, history: &MomentId, record: &GuestRecord) -> bool {
        self.keeps(record, &event_row(history, record))
    }

    fn keeps(&self, record: &GuestRecord, row: &EventRow) -> bool {
        let node_ok = self.node.as_ref().is_none_or(|node| {
            record.node.as_deref() == Some(node.as_str())
                || matches!(&record.body, RecordBody::Output { log, .. } if log == node)
        });
        let kind_ok = self
            .kind
            .as_ref()
            .is_none_or(|kind| row.kind == kind || row.name.as_deref() == Some(kind.as_str()));
        let text_ok = self
            .text
            .as_ref()
            .is_none_or(|text| row.text.contains(text.as_str()));
        let property_ok = self
            .property
            .as_ref()
            .is_none_or(|p| property_of(&record.body).as_deref() == Some(p.as_str()));
        node_ok && kind_ok && text_ok && property_ok
    }
}

/// The records of `moment`'s history up to it: from the finding's file on
/// its own history at a known time, else replayed.
fn records_until(session: &mut Session, moment: &MomentId) -> Result<Vec<GuestRecord>> {
    if let Some(time) = session.own_history_time(moment)? {
        let finding = session.finding().expect("a finding's own history");
        return Ok(finding
            .records
            .iter()
            .filter(|r| r.virtual_ns <= time)
            .cloned()
            .collect());
    }
    session.reach(moment)?;
    Ok(session.records().to_vec())
}

/// The events of `moment`'s history up to it, filtered.
pub fn events(
    session: &mut Session,
    moment: &MomentId,
    filter: &EventFilter,
) -> Result<Vec<EventRow>> {
    let records = records_until(session, moment)?;
    let history = moment.at(When::Latest);
    let mut rows: Vec<EventRow> = records
        .iter()
        .filter_map(|record| {
            let row = event_row(&history, record);
            filter.keeps(record, &row).then_some(row)
        })
        .collect();
    if filter.last > 0 && rows.len() > filter.last {
        rows.drain(..rows.len() - filter.last);
    }
    Ok(rows)
}

/// One evaluation of a property, as an example.
#[derive(Clone, Debug, Serialize)]
pub struct Example {
    pub moment: MomentId,
    pub exit: u64,
    pub node: Option<String>,
    pub details: serde_json::Value,
}

/// A property of the history with its examples.
#[derive(Clone, Debug, Serialize)]
pub struct PropertyRow {
    pub id: String,
    pub kind: String,
    pub message: String,
    pub passed: u64,
    pub failed: u64,
    /// The first few evaluations that held.
    pub passing: Vec<Example>,
    /// The first few that did not.
    pub failing: Vec<Example>,
}

/// Examples of each sort kept per property.
pub const EXAMPLES: usize = 3;

/// Every property the history's records evaluated, with passing and
/// failing examples (each naming its moment), up to `moment`; the
/// finding's own failure (a checker's) comes first when it is one.
pub fn properties(session: &mut Session, moment: &MomentId) -> Result<Vec<PropertyRow>> {
    let records = records_until(session, moment)?;
    let history = moment.at(When::Latest);
    let mut by_id: BTreeMap<String, PropertyRow> = BTreeMap::new();
    for record in &records {
        let RecordBody::Sdk { json } = &record.body else {
            continue;
        };
        let Ok(SdkRecord::Assert(assertion)) = SdkRecord::parse(json) else {
            continue;
        };
        let row = by_id
            .entry(assertion.id.clone())
            .or_insert_with(|| PropertyRow {
                id: assertion.id.clone(),
                kind: format!("{:?}", assertion.kind()),
                message: assertion.message.clone(),
                passed: 0,
                failed: 0,
                passing: Vec::new(),
                failing: Vec::new(),
            });
        if !assertion.hit {
            continue;
        }
        let example = Example {
            moment: history.at(When::Time(record.virtual_ns)),
            exit: record.exit,
            node: record.node.clone(),
            details: assertion.details.clone(),
        };
        let (count, examples) = if assertion.condition {
            (&mut row.passed, &mut row.passing)
        } else {
            (&mut row.failed, &mut row.failing)
        };
        *count += 1;
        if examples.len() < EXAMPLES {
            examples.push(example);
        }
    }
    let mut rows: Vec<PropertyRow> = by_id.into_values().collect();
    if let Some(finding) = session.finding() {
        let file = &finding.finding.file;
        if !rows.iter().any(|r| file.key.ends_with(&r.id)) {
            rows.insert(
                0,
                PropertyRow {
                    id: file.key.clone(),
                    kind: "checker".into(),
                    message: file.summary.clone(),
                    passed: 0,
                    failed: 1,
                    passing: Vec::new(),
                    failing: vec![Example {
                        moment: MomentId::of_source(&finding.dir, When::Failure),
                        exit: finding.failure.exit,
                        node: None,
                        details: file.details.clone(),
                    }],
                },
            );
        }
    }
    Ok(rows)
}

/// A moment worth going to.
#[derive(Clone, Debug, Serialize)]
pub struct NotableMoment {
    pub moment: MomentId,
    pub virtual_ns: VirtNanos,
    pub exit: Option<u64>,
    /// `failure`, `branch`, `fault`, `node`, `property_failed`,
    /// `snapshot`.
    pub kind: &'static str,
    pub what: String,
}

/// A source's notable moments, in time order: a finding's failure, the
/// points its path branched at, the faults carried out, nodes that paused,
/// stopped or exited, properties that failed; a snapshot directory's
/// snapshots.
pub fn moments(session: &Session) -> Vec<NotableMoment> {
    let dir = session.source().dir().to_path_buf();
    let at = |t: VirtNanos| MomentId::of_source(&dir, When::Time(t));
    let mut out = Vec::new();
    match session.source() {
        Source::Snapshots(dir) => {
            for info in snapshot::list(dir).unwrap_or_default() {
                out.push(NotableMoment {
                    moment: MomentId::of_source(dir, When::Id(info.meta.id.clone())),
                    virtual_ns: info.meta.virtual_ns,
                    exit: Some(info.meta.exit_index),
                    kind: "snapshot",
                    what: format!("snapshot {}", info.meta.id),
                });
            }
        }
        Source::Finding(finding) => {
            let file = &finding.finding.file;
            out.push(NotableMoment {
                moment: MomentId::of_source(&dir, When::Failure),
                virtual_ns: finding.failure.virtual_ns,
                exit: Some(finding.failure.exit),
                kind: "failure",
                what: format!("{}: {}", file.key, file.summary),
            });
            for step in &file.path.steps {
                let faults: Vec<String> = step.faults.iter().map(|f| f.to_string()).collect();
                out.push(NotableMoment {
                    moment: at(step.at_ns),
                    virtual_ns: step.at_ns,
                    exit: None,
                    kind: "branch",
                    what: format!(
                        "re-keyed from seed {}; faults: [{}]",
                        step.seed,
                        faults.join("; ")
                    ),
                });
            }
            for record in &finding.records {
                let (kind, what) = match &record.body {
                    RecordBody::Event { event } => {
                        let name = event_name(event).unwrap_or_default();
                        let kind = if name.starts_with("fault") {
                            "fault"
                        } else if name.starts_with("node_") || name.starts_with("workload_") {
                            "node"
                        } else {
                            continue;
                        };
                        (kind, serde_json::to_string(event).unwrap_or_default())
                    }
                    RecordBody::Sdk { json } => match SdkRecord::parse(json) {
                        Ok(SdkRecord::Assert(a)) if a.hit && !a.condition => {
                            ("property_failed", format!("{} failed: {}", a.id, a.message))
                        }
                        _ => continue,
                    },
                    _ => continue,
                };
                out.push(NotableMoment {
                    moment: at(record.virtual_ns),
                    virtual_ns: record.virtual_ns,
                    exit: Some(record.exit),
                    kind,
                    what,
                });
            }
        }
    }
    out.sort_by_key(|m| (m.virtual_ns, m.exit));
    out
}

/// A node of the history.
#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    pub name: String,
    /// What its records last said of it (`started`, `paused`, `exited`,
    /// ...), up to the moment; `None` when nothing.
    pub last_event: Option<String>,
}

/// The nodes of the finding's run and, up to `moment`, the last event of
/// each.
pub fn nodes(session: &mut Session, moment: &MomentId) -> Result<Vec<NodeRow>> {
    let names: Vec<String> = match session.source() {
        Source::Finding(finding) => finding.finding.run.node_names.clone(),
        Source::Snapshots(_) => Vec::new(),
    };
    let records = records_until(session, moment)?;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut names = names;
    for record in &records {
        if let RecordBody::Event { event } = &record.body {
            let json = serde_json::to_value(event).unwrap_or_default();
            if let Some(node) = json.get("node").and_then(|n| n.as_str()) {
                if !names.iter().any(|n| n == node) {
                    names.push(node.to_owned());
                }
                last.insert(node.to_owned(), event_name(event).unwrap_or_default());
            }
        }
    }
    Ok(names
        .into_iter()
        .map(|name| NodeRow {
            last_event: last.get(&name).cloned(),
            name,
        })
        .collect())
}
