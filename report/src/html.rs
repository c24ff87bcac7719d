//! The report as one self-contained HTML page: inline CSS, inline SVG
//! plots, each finding's `checker.html` embedded in a sandboxed frame
//! (`srcdoc`, no scripts allowed), no script of its own, no external asset
//! and nothing fetched.

use crate::model::*;
use crate::plots::{self, PlotError};
use crate::text::duration;
use std::fmt::Write;

/// Text made safe inside HTML elements and quoted attributes (the
/// checker's view escapes with the same).
pub use fuzzer::linearizability::escape_html as escape;

const STYLE: &str = r#"
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin-bottom: 0.3em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; font-size: 0.9em; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-family: monospace; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.85em; }
pre { background: #f6f6f6; padding: 0.5em; overflow-x: auto; margin: 0.3em 0; }
.passed { color: #1b5e20; font-weight: bold; }
.failed { color: #b00020; font-weight: bold; }
.never_reached { color: #8a6d00; font-weight: bold; }
.summary span { margin-right: 1.5em; }
.finding { border: 1px solid #ddd; border-left: 4px solid #b00020; padding: 0.3em 1em 0.8em; margin: 1em 0; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plots figure { margin: 0; border: 1px solid #eee; }
.replay { background: #fff8e1; padding: 0.3em 0.5em; display: inline-block; }
iframe.checker { width: 100%; height: 420px; border: 1px solid #ccc; }
.muted { color: #666; }
li code, td code { white-space: pre-wrap; word-break: break-all; }
"#;

/// The page.
pub fn html(report: &Report) -> Result<String, PlotError> {
    let mut out = String::new();
    let (passed, failed, never) = report.verdicts();
    let e = &report.exploration;
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>detvisor campaign report</title>\n<style>{STYLE}</style></head><body>\n"
    );
    let _ = writeln!(out, "<h1>Campaign report</h1>");
    let _ = writeln!(
        out,
        "<p class=\"summary\"><span>{} campaign director{}</span><span>{} branches in {}</span><span>{} finding(s)</span><span class=\"passed\">{passed} passed</span><span class=\"failed\">{failed} failed</span><span class=\"never_reached\">{never} never reached</span></p>",
        report.campaigns.len(),
        if report.campaigns.len() == 1 { "y" } else { "ies" },
        e.branches,
        duration(e.wall_ms),
        report.findings.len()
    );
    campaigns(&mut out, report);
    properties(&mut out, report);
    findings(&mut out, report)?;
    exploration(&mut out, report)?;
    let _ = writeln!(
        out,
        "<p class=\"muted\">Report format version {}; the same data is in <code>detvisor report --json</code>.</p>\n</body></html>",
        report.version
    );
    Ok(out)
}

fn campaigns(out: &mut String, report: &Report) {
    let _ = writeln!(out, "<h2 id=\"campaigns\">Campaigns: spec and budget</h2>");
    let _ = writeln!(out, "<table><tr><th>directory</th><th>manifest</th><th>seed</th><th>slice</th><th>depth</th><th>live checkpoints</th><th>checker</th><th>branches (limit)</th><th>wall (limit)</th><th>workers</th></tr>");
    for c in &report.campaigns {
        let limit = |v: Option<String>| v.unwrap_or_else(|| "none".to_owned());
        let _ = writeln!(
            out,
            "<tr><td><code>{}</code></td><td><code>{}</code></td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{} ({})</td><td>{} ({})</td><td class=\"num\">{}</td></tr>",
            escape(&c.dir.display().to_string()),
            escape(&c.spec.manifest.display().to_string()),
            c.spec.seed,
            c.spec.slice_ns,
            c.spec.max_depth,
            c.spec.live_checkpoints,
            serde_json::to_value(c.spec.checker)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            c.budget.branches,
            limit(c.budget.max_branches.map(|b| b.to_string())),
            duration(c.budget.wall_ms),
            limit(c.budget.max_wall.map(|w| w.to_string())),
            c.stats.as_ref().map_or("not recorded".to_owned(), |s| s.workers.to_string()),
        );
    }
    let _ = writeln!(out, "</table>");
    for c in &report.campaigns {
        let spec = serde_json::to_string_pretty(&c.spec).unwrap_or_default();
        let _ = writeln!(
            out,
            "<details><summary>The whole spec of <code>{}</code></summary><pre>{}</pre></details>",
            escape(&c.dir.display().to_string()),
            escape(&spec)
        );
    }
}

fn examples(out: &mut String, what: &str, examples: &[Example]) {
    if examples.is_empty() {
        return;
    }
    let _ = writeln!(out, "<div>{what}:<ul>");
    for x in examples {
        let node = x
            .node
            .as_deref()
            .map_or(String::new(), |n| format!(" in {}", escape(n)));
        let details = if x.details.is_null() {
            String::new()
        } else {
            format!(
                " <code>{}</code>",
                escape(&shorten(&x.details.to_string(), 300))
            )
        };
        let _ = writeln!(
            out,
            "<li><code>{}</code> (exit {}){node}{details}</li>",
            escape(&x.moment),
            x.exit
        );
    }
    let _ = writeln!(out, "</ul></div>");
}

fn shorten(text: &str, most: usize) -> String {
    if text.chars().count() <= most {
        text.to_owned()
    } else {
        let head: String = text.chars().take(most).collect();
        format!("{head}…")
    }
}

fn properties(out: &mut String, report: &Report) {
    let _ = writeln!(out, "<h2 id=\"properties\">Properties</h2>");
    if report.properties.is_empty() {
        let _ = writeln!(out, "<p>No property was seen.</p>");
        return;
    }
    let _ = writeln!(out, "<table class=\"properties\"><tr><th>verdict</th><th>property</th><th>kind</th><th>hits</th><th>passes</th><th>failures</th><th>findings</th></tr>");
    for p in &report.properties {
        let verdict = match p.verdict {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::NeverReached => "never_reached",
        };
        let why = p
            .why
            .as_deref()
            .map_or(String::new(), |w| format!(" ({})", escape(w)));
        let location = p.location.as_deref().map_or(String::new(), |l| {
            format!("<br><span class=\"muted\">{}</span>", escape(l))
        });
        let findings: Vec<String> = p
            .findings
            .iter()
            .map(|k| format!("<a href=\"#{}\">{}</a>", anchor(k), escape(k)))
            .collect();
        let _ = writeln!(
            out,
            "<tr><td class=\"{verdict}\">{}{why}</td><td>{}<br><span class=\"muted\">{}</span>{location}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            p.verdict.word(),
            escape(&p.name),
            escape(&p.message),
            p.kind.word(),
            p.hits,
            p.passes,
            p.failures,
            findings.join("<br>")
        );
    }
    let _ = writeln!(out, "</table>");
    for p in &report.properties {
        if p.examples.is_empty() && p.counterexamples.is_empty() {
            continue;
        }
        let _ = writeln!(out, "<h3>{}</h3>", escape(&p.name));
        examples(out, "Counterexamples", &p.counterexamples);
        examples(out, "Examples", &p.examples);
    }
}

/// An HTML id for a finding's key.
fn anchor(key: &str) -> String {
    let mut id = String::from("finding-");
    for c in key.chars() {
        id.push(if c.is_ascii_alphanumeric() { c } else { '-' });
    }
    id
}

fn findings(out: &mut String, report: &Report) -> Result<(), PlotError> {
    let _ = writeln!(out, "<h2 id=\"findings\">Findings</h2>");
    if report.findings.is_empty() {
        let _ = writeln!(out, "<p>No finding.</p>");
    }
    if !report.possibly_fixed.is_empty() {
        let _ = writeln!(
            out,
            "<p>Possibly fixed (in the baseline, not found tonight):</p><ul>"
        );
        for p in &report.possibly_fixed {
            let _ = writeln!(
                out,
                "<li><code>{}</code>: {}</li>",
                escape(&p.key),
                escape(&p.note)
            );
        }
        let _ = writeln!(out, "</ul>");
    }
    for f in &report.findings {
        let triage = f.triage.as_ref().map_or(String::new(), |t| {
            format!(
                " <span class=\"muted\">[{}{}]</span>",
                t.status,
                t.note
                    .as_deref()
                    .map_or(String::new(), |n| format!(": {}", escape(n)))
            )
        });
        let _ = writeln!(
            out,
            "<div class=\"finding\" id=\"{}\"><h3>{:04} <code>{}</code>{triage}</h3>",
            anchor(&f.key),
            f.number,
            escape(&f.key)
        );
        let _ = writeln!(out, "<p>{}</p>", escape(&f.summary));
        let _ = writeln!(
            out,
            "<p>Failed at <code>{}</code> (exit {}, {}); its path ends at exit {}, {} (digest <code>{}</code>).</p>",
            escape(&f.moment),
            f.failure.exit,
            f.failure.virtual_ns,
            f.exits,
            f.virtual_ns,
            escape(&f.digest)
        );
        let _ = writeln!(
            out,
            "<p>Replay: <code class=\"replay\">{}</code></p>",
            escape(&f.replay)
        );
        for copy in &f.also_in {
            let _ = writeln!(
                out,
                "<p class=\"muted\">Also found in <code>{}</code> as {:04} ({} faults): <code>{}</code></p>",
                escape(&copy.dir.display().to_string()),
                copy.number,
                copy.faults,
                escape(&copy.replay)
            );
        }
        let _ = writeln!(
            out,
            "<p>Minimized fault schedule: {} fault(s), shrunk from {}, over {} branch point(s).</p>",
            f.faults.len(),
            f.faults_found,
            f.steps
        );
        if !f.faults.is_empty() {
            let _ = writeln!(
                out,
                "<table class=\"faults\"><tr><th>branch point</th><th>fault</th></tr>"
            );
            for fault in &f.faults {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td><code>{}</code></td></tr>",
                    fault.branch_at,
                    escape(&fault.fault)
                );
            }
            let _ = writeln!(out, "</table>");
        }
        let _ = writeln!(out, "<figure>{}</figure>", plots::timeline(f)?);
        let _ = writeln!(out, "<details><summary>Timeline: {} notable moments</summary><table class=\"timeline\"><tr><th>virtual time</th><th>exit</th><th>kind</th><th>what</th><th>moment</th></tr>", f.timeline.len());
        for t in &f.timeline {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
                t.virtual_ns,
                t.exit.map_or(String::new(), |x| x.to_string()),
                escape(&t.kind),
                escape(&shorten(&t.what, 200)),
                escape(&t.moment)
            );
        }
        let _ = writeln!(out, "</table></details>");
        if let Some(checker) = &f.checker_html {
            let _ = writeln!(
                out,
                "<details open><summary>The checker's view (<code>checker.html</code>)</summary><iframe class=\"checker\" sandbox=\"\" title=\"checker view of {}\" srcdoc=\"{}\"></iframe></details>",
                escape(&f.key),
                escape(checker)
            );
        }
        if !f.logs.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>The last lines of its logs</summary>"
            );
            for (name, lines) in &f.logs {
                let _ = writeln!(
                    out,
                    "<div><b>{}</b><pre>{}</pre></div>",
                    escape(name),
                    escape(&lines.join("\n"))
                );
            }
            let _ = writeln!(out, "</details>");
        }
        let _ = writeln!(out, "</div>");
    }
    Ok(())
}

fn option(value: Option<u64>) -> String {
    value.map_or("not recorded".to_owned(), |v| v.to_string())
}

fn exploration(out: &mut String, report: &Report) -> Result<(), PlotError> {
    let e = &report.exploration;
    let _ = writeln!(out, "<h2 id=\"exploration\">Exploration</h2>");
    let rate = |r: Option<f64>| r.map_or("not recorded".to_owned(), |r| format!("{r:.1}"));
    let rows: Vec<(&str, String)> = vec![
        ("branches", e.branches.to_string()),
        ("moments in the tree(s)", e.moments.to_string()),
        ("moments whose run stopped", e.stopped.to_string()),
        ("tree depth", e.depth.to_string()),
        ("moments by depth", format!("{:?}", e.moments_by_depth)),
        ("wall time", duration(e.wall_ms)),
        ("branches per hour", rate(e.branches_per_hour)),
        (
            "branches per hour per worker",
            rate(e.branches_per_hour_per_worker),
        ),
        (
            "wall time: boot to root",
            e.phases
                .map_or("not recorded".to_owned(), |p| duration(p.root_ms)),
        ),
        (
            "wall time: branches (summed over workers)",
            e.phases
                .map_or("not recorded".to_owned(), |p| duration(p.branch_ms)),
        ),
        (
            "wall time: shrinking",
            e.phases
                .map_or("not recorded".to_owned(), |p| duration(p.shrink_ms)),
        ),
        ("checkpoints live at the end", option(e.live_checkpoints)),
        ("checkpoints spilled to disk", option(e.spilled)),
        ("checkpoints loaded back", option(e.loaded)),
        ("steps replayed", option(e.replayed_steps)),
    ];
    let _ = writeln!(out, "<table class=\"exploration\">");
    for (what, value) in rows {
        let _ = writeln!(out, "<tr><th>{what}</th><td>{}</td></tr>", escape(&value));
    }
    let _ = writeln!(out, "</table>");
    if !report.fault_combinations.is_empty() {
        let _ = writeln!(out, "<table class=\"combinations\"><tr><th>fault kinds begun in a stretch</th><th>stretches</th></tr>");
        for (combination, n) in &report.fault_combinations {
            let name = if combination.is_empty() {
                "(none)"
            } else {
                combination
            };
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"num\">{n}</td></tr>",
                escape(name)
            );
        }
        let _ = writeln!(out, "</table>");
    }
    let _ = writeln!(out, "<h2 id=\"plots\">Plots</h2><div class=\"plots\">");
    for svg in [
        plots::findings_over_time(report)?,
        plots::branches_per_hour(report)?,
        plots::property_hits(report)?,
        plots::fault_kinds(report)?,
    ] {
        let _ = writeln!(out, "<figure>{svg}</figure>");
    }
    let _ = writeln!(out, "</div>");
    Ok(())
}
