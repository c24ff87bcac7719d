//! A check report as one self-contained HTML page (inline CSS, no script):
//! on a violation, the minimal sub-history drawn as a timeline per process.
//!
//! Time is drawn by rank, not to scale: the distinct call and return stamps
//! are spread evenly, which keeps the order of events (all that matters to
//! linearizability) readable whatever the gaps; the exact stamps are in each
//! bar's tooltip and in the table below.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::history::Operation;
use super::model::{KvModel, Model};
use super::report::{CheckReport, Verdict, Violation};

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

const STYLE: &str = "
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; }
.verdict-illegal { color: #b00020; }
.verdict-ok { color: #1b5e20; }
.verdict-unknown { color: #8a6d00; }
.timeline { border: 1px solid #ccc; padding: 0.5em 0; margin: 1em 0; }
.process { display: flex; align-items: stretch; border-bottom: 1px dotted #ddd; }
.process:last-child { border-bottom: none; }
.name { width: 8em; padding: 0.3em 0.6em; font-weight: bold; flex: none; }
.lanes { flex: 1; position: relative; }
.lane { position: relative; height: 2.4em; }
.bar { position: absolute; top: 0.3em; height: 1.8em; box-sizing: border-box;
       background: #dbe9fb; border: 1px solid #3f6fb5; border-radius: 3px;
       font: 0.85em monospace; line-height: 1.8em; padding: 0 0.3em;
       white-space: nowrap; overflow: visible; }
.bar.open { border-right: none; border-style: dashed; border-radius: 3px 0 0 3px;
            background: linear-gradient(to right, #fde3c8, #ffffff); border-color: #c76b00; }
table { border-collapse: collapse; margin-top: 1em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; font-size: 0.9em; }
td.num { text-align: right; font-family: monospace; }
.stats { color: #555; font-size: 0.9em; }
";

/// The report as an HTML page.
pub fn render_html(report: &CheckReport) -> String {
    let mut page = String::new();
    page.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n");
    let (title, class) = match &report.verdict {
        Verdict::Ok => ("Linearizable".to_owned(), "verdict-ok"),
        Verdict::Illegal(violation) => (
            format!("Not linearizable: key {}", violation.key),
            "verdict-illegal",
        ),
        Verdict::Unknown { reason, key } => (
            format!("Undecided ({reason:?}) at key {key}"),
            "verdict-unknown",
        ),
    };
    let _ = writeln!(page, "<title>{}</title>", escape(&title));
    let _ = writeln!(page, "<style>{STYLE}</style></head><body>");
    let _ = writeln!(page, "<h1 class=\"{class}\">{}</h1>", escape(&title));
    match &report.verdict {
        Verdict::Illegal(violation) => violation_section(&mut page, violation),
        Verdict::Ok => page.push_str(
            "<p>Every key's operations can be ordered, each taking effect between its call \
             and its return, so that they give the outputs the clients saw.</p>\n",
        ),
        Verdict::Unknown { .. } => page.push_str(
            "<p>The search ran out of time or steps before deciding; no key was found \
             non-linearizable so far.</p>\n",
        ),
    }
    let stats = &report.stats;
    let _ = writeln!(
        page,
        "<p class=\"stats\">{} operations in {} keys; {} searched, {} search steps, \
         {} cache entries, search {} µs; minimization {} checks, {} µs.</p>",
        stats.operations,
        stats.partitions,
        stats.operations_searched,
        stats.search_steps,
        stats.cache_entries,
        stats.search_us,
        stats.minimization_checks,
        stats.minimization_us
    );
    page.push_str("</body></html>\n");
    page
}

fn violation_section(page: &mut String, violation: &Violation) {
    let ops = &violation.operations;
    let minimal = if violation.minimal {
        "Dropping any one of them makes the rest linearizable."
    } else {
        "(The deadline cut the shrinking short: this set may not be minimal.)"
    };
    let _ = writeln!(
        page,
        "<p>No order of these {} operations on key <code>{}</code> (out of {} on that key) \
         explains what the clients saw, if each takes effect at one instant between its call \
         and its return; one without a return (dashed, open-ended) may take effect at any \
         point after its call, or never. {minimal}</p>",
        ops.len(),
        escape(&violation.key),
        violation.partition_operations
    );

    // Ranks of the distinct stamps; an open-ended bar runs to the right edge.
    let mut stamps: Vec<u64> = ops
        .iter()
        .flat_map(|op| std::iter::once(op.call.0).chain(op.ret.map(|t| t.0)))
        .collect();
    stamps.sort_unstable();
    stamps.dedup();
    let slots = stamps.len() + 1;
    let position = |stamp: u64| -> f64 {
        let rank = stamps.partition_point(|&s| s < stamp);
        100.0 * (rank as f64 + 0.5) / slots as f64
    };

    // One row per process, with lanes so that its own overlapping
    // operations (if any) do not hide each other.
    let mut by_process: BTreeMap<u64, Vec<Vec<&Operation>>> = BTreeMap::new();
    let mut in_order: Vec<&Operation> = ops.iter().collect();
    in_order.sort_by_key(|op| (op.call, op.process, op.op));
    for op in in_order {
        let lanes = by_process.entry(op.process).or_default();
        let free = lanes.iter_mut().find(|lane| {
            lane.last()
                .is_some_and(|last| last.ret.is_some_and(|ret| ret < op.call))
        });
        match free {
            Some(lane) => lane.push(op),
            None => lanes.push(vec![op]),
        }
    }

    page.push_str("<div class=\"timeline\">\n");
    for (process, lanes) in &by_process {
        let _ = writeln!(
            page,
            "<div class=\"process\"><div class=\"name\">process {process}</div><div class=\"lanes\">"
        );
        for lane in lanes {
            page.push_str("<div class=\"lane\">");
            for op in lane {
                let label = KvModel.describe_operation(op);
                let left = position(op.call.0);
                let (class, width) = match op.ret {
                    Some(ret) => ("bar", (position(ret.0) - left).max(1.0)),
                    None => ("bar open", 100.0 - left),
                };
                let tooltip = format!(
                    "op {} of process {}: {label}; call {} ns, {}",
                    op.op,
                    op.process,
                    op.call.0,
                    op.ret
                        .map_or("no return".to_owned(), |ret| format!("return {} ns", ret.0))
                );
                let _ = write!(
                    page,
                    "<div class=\"{class}\" style=\"left:{left:.2}%;width:{width:.2}%\" title=\"{}\">{}</div>",
                    escape(&tooltip),
                    escape(&label)
                );
            }
            page.push_str("</div>\n");
        }
        page.push_str("</div></div>\n");
    }
    page.push_str("</div>\n");

    page.push_str(
        "<table><tr><th>process</th><th>op</th><th>operation</th><th>call (ns)</th>\
         <th>return (ns)</th></tr>\n",
    );
    for op in ops {
        let _ = writeln!(
            page,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code></td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            op.process,
            op.op,
            escape(&KvModel.describe_operation(op)),
            op.call.0,
            op.ret.map_or("none".to_owned(), |ret| ret.0.to_string())
        );
    }
    page.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linearizability::{CheckStats, KvInput, KvOutput, TimeNs};

    #[test]
    fn escapes_every_text_and_draws_open_bars() {
        let op = |process, key: &str, input, output, call, ret: Option<u64>| Operation {
            process,
            op: 1,
            key: key.into(),
            input,
            output,
            call: TimeNs(call),
            ret: ret.map(TimeNs),
        };
        let key = "<k&\"'>";
        let report = CheckReport {
            verdict: Verdict::Illegal(Violation {
                key: key.into(),
                operations: vec![
                    op(
                        1,
                        key,
                        KvInput::Put {
                            value: "<b>v</b>".into(),
                        },
                        Some(KvOutput::Put),
                        10,
                        Some(20),
                    ),
                    op(
                        2,
                        key,
                        KvInput::Get,
                        Some(KvOutput::Get { value: None }),
                        30,
                        Some(40),
                    ),
                    op(3, key, KvInput::Delete, None, 15, None),
                ],
                partition_operations: 9,
                minimal: true,
            }),
            stats: CheckStats::default(),
        };
        let page = render_html(&report);
        assert!(
            !page.contains("<b>v</b>") && !page.contains("<k&"),
            "{page}"
        );
        assert!(
            page.contains("put(&lt;k&amp;&quot;&#39;&gt;, &lt;b&gt;v&lt;/b&gt;) -&gt; ok"),
            "{page}"
        );
        assert!(page.contains("class=\"bar open\""), "{page}");
        assert_eq!(page.matches("<div class=\"process\">").count(), 3);
        assert!(page.contains("no return"));
        assert!(!page.contains("<script"));
    }
}
