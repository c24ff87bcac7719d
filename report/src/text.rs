//! The report as plain text for a terminal: the same data as the HTML
//! page, without its embeds (checker views) and plots.

use crate::model::*;
use std::fmt::Write;

/// Milliseconds as `1h02m03s`, `4m05s` or `6.7s`.
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn or_not_kept(value: Option<u64>) -> String {
    value.map_or("not recorded".to_owned(), |v| v.to_string())
}

/// The terminal summary.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    let (passed, failed, never) = report.verdicts();
    let e = &report.exploration;
    let _ = writeln!(
        out,
        "REPORT  {} campaign dir(s), {} branches in {}, {} finding(s); properties: {passed} passed, {failed} failed, {never} never reached",
        report.campaigns.len(),
        e.branches,
        duration(e.wall_ms),
        report.findings.len()
    );
    for c in &report.campaigns {
        let limit = |v: Option<String>| v.unwrap_or_else(|| "no limit".to_owned());
        let _ = writeln!(
            out,
            "campaign {}: seed {}, slice {}, depth {}, {} branches (limit {}), wall {} (limit {})",
            c.dir.display(),
            c.spec.seed,
            c.spec.slice_ns,
            c.spec.max_depth,
            c.budget.branches,
            limit(c.budget.max_branches.map(|b| b.to_string())),
            duration(c.budget.wall_ms),
            limit(c.budget.max_wall.map(|w| w.to_string())),
        );
    }
    let _ = writeln!(out, "properties:");
    for p in &report.properties {
        let why = p
            .why
            .as_deref()
            .map_or(String::new(), |w| format!(" ({w})"));
        let _ = writeln!(
            out,
            "  {:<13} {} [{}] hits {}, passes {}, failures {}{}",
            p.verdict.word(),
            p.name,
            p.kind.word(),
            p.hits,
            p.passes,
            p.failures,
            why
        );
        for example in p.counterexamples.iter().take(3) {
            let _ = writeln!(out, "      counterexample at {}", example.moment);
        }
        for example in p.examples.iter().take(1) {
            let _ = writeln!(out, "      example at {}", example.moment);
        }
    }
    let _ = writeln!(out, "findings:");
    if report.findings.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for f in &report.findings {
        let triage = f
            .triage
            .as_ref()
            .map_or(String::new(), |t| format!(" [{}]", t.status));
        let _ = writeln!(out, "  {:04} {}{}: {}", f.number, f.key, triage, f.summary);
        let _ = writeln!(out, "      failed at {}", f.moment);
        let _ = writeln!(
            out,
            "      {} fault(s) after shrinking from {}{}",
            f.faults.len(),
            f.faults_found,
            if f.faults.is_empty() { "" } else { ":" }
        );
        for fault in &f.faults {
            let _ = writeln!(out, "        at {}: {}", fault.branch_at, fault.fault);
        }
        let _ = writeln!(out, "      replay: {}", f.replay);
        for copy in &f.also_in {
            let _ = writeln!(out, "      also found in {}", copy.dir.display());
        }
    }
    for p in &report.possibly_fixed {
        let _ = writeln!(out, "  possibly fixed {}  # {}", p.key, p.note);
    }
    let _ = writeln!(out, "exploration:");
    let _ = writeln!(
        out,
        "  {} branches, {} moments ({} stopped), depth {}, moments by depth {:?}",
        e.branches, e.moments, e.stopped, e.depth, e.moments_by_depth
    );
    let rate = |r: Option<f64>| r.map_or("not recorded".to_owned(), |r| format!("{r:.1}"));
    let _ = writeln!(
        out,
        "  branches per hour {}, per worker {}",
        rate(e.branches_per_hour),
        rate(e.branches_per_hour_per_worker)
    );
    match e.phases {
        Some(ph) => {
            let _ = writeln!(
                out,
                "  wall time by phase: boot to root {}, branches {} (worker time), shrinking {}",
                duration(ph.root_ms),
                duration(ph.branch_ms),
                duration(ph.shrink_ms)
            );
        }
        None => {
            let _ = writeln!(out, "  wall time by phase: not recorded");
        }
    }
    let _ = writeln!(
        out,
        "  checkpoints spilled {}, loaded {}, live {}; steps replayed {}",
        or_not_kept(e.spilled),
        or_not_kept(e.loaded),
        or_not_kept(e.live_checkpoints),
        or_not_kept(e.replayed_steps)
    );
    if !report.fault_kinds.is_empty() {
        let kinds: Vec<String> = report
            .fault_kinds
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "  fault kinds realised (stretches): {}",
            kinds.join(", ")
        );
    }
    out
}
