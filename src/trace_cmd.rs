//! The `detvisor trace FILE` command: where a trace's exits went (see
//! `run::trace`), as tables or as JSON.

use crate::terminal::StdStreams;
use anyhow::Result;
use clap::Args;
use run::client::{Calls, Local};
use std::collections::BTreeMap;
use std::path::PathBuf;
use vmm::trace::report::{Counts, TraceReport};
use vmm::VirtNanos;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A trace written by `run`, `up` or `branch` with `--trace FILE`.
    file: PathBuf,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Leave out the per-second tables (totals only).
    #[arg(long)]
    totals: bool,
}

pub fn cmd_trace(args: TraceArgs) -> Result<u8> {
    let mut here = Local::new(StdStreams::default());
    let report = Calls::new(&mut here)
        .trace_report(args.file.clone())
        .map_err(crate::failed)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", text(&args.file, &report, !args.totals));
    }
    Ok(0)
}

/// The report as tables: totals by kind and by device, then (with
/// `seconds`) a row per virtual second by kind and by device.
fn text(file: &std::path::Path, report: &TraceReport, seconds: bool) -> String {
    let total = &report.total;
    let mut out = match (report.first_index, report.last_index) {
        (Some(first), Some(last)) => format!(
            "{}: {} exits (exit {first} to {last}), up to virtual time {}\n",
            file.display(),
            total.exits,
            report.last_time_ns
        ),
        _ => format!("{}: no exits\n", file.display()),
    };
    if total.exits == 0 {
        return out;
    }
    let kinds = by_count(&total.by_kind);
    let devices = by_count(&total.by_device);
    for (title, names, counts) in [
        ("kind", &kinds, &total.by_kind),
        ("device", &devices, &total.by_device),
    ] {
        let rows = names
            .iter()
            .map(|name| {
                let n = counts[name.as_str()];
                let share = n as f64 * 100.0 / total.exits as f64;
                vec![name.clone(), n.to_string(), format!("{share:.1}")]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &[title.to_string(), "exits".into(), "%".into()],
            rows,
        ));
    }
    if seconds {
        out.push_str("\nper virtual second, by kind\n");
        out.push_str(&per_second(report, &kinds, |c| &c.by_kind));
        out.push_str("\nper virtual second, by device\n");
        out.push_str(&per_second(report, &devices, |c| &c.by_device));
    }
    out
}

/// A row per second: its exits, then a column per name.
fn per_second(
    report: &TraceReport,
    names: &[String],
    pick: fn(&Counts) -> &BTreeMap<String, u64>,
) -> String {
    let mut headers = vec!["second".to_string(), "exits".to_string()];
    headers.extend(names.iter().cloned());
    let rows = report
        .seconds
        .iter()
        .map(|second| {
            let counts = pick(&second.counts);
            let mut row = vec![
                VirtNanos(second.second * 1_000_000_000).to_string(),
                second.counts.exits.to_string(),
            ];
            row.extend(
                names
                    .iter()
                    .map(|name| counts.get(name).copied().unwrap_or(0).to_string()),
            );
            row
        })
        .collect();
    table(&headers, rows)
}

/// The names, most exits first (ties by name).
fn by_count(counts: &BTreeMap<String, u64>) -> Vec<String> {
    let mut names: Vec<(&String, u64)> = counts.iter().map(|(k, v)| (k, *v)).collect();
    names.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    names.into_iter().map(|(name, _)| name.clone()).collect()
}

/// Columns as wide as their widest cell: the first left-aligned, the rest
/// (numbers) right-aligned.
fn table(headers: &[String], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(String::len).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: &[String]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                text.push_str(&format!("{cell:<width$}"));
            } else {
                text.push_str(&format!("  {cell:>width$}"));
            }
        }
        text.push('\n');
        text
    };
    let mut out = line(headers);
    for row in &rows {
        out.push_str(&line(row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::exit::ExitKind;
    use vmm::record::{ExitRecord, NO_HASH, NO_VECTOR};

    #[test]
    fn test_trace_text_has_totals_and_a_row_per_second() {
        let mut report = TraceReport::new();
        for (index, (time, kind, device)) in [
            (5, ExitKind::IoOut, Some("serial")),
            (6, ExitKind::IoOut, Some("serial")),
            (1_500_000_000, ExitKind::Hlt, None),
        ]
        .into_iter()
        .enumerate()
        {
            let record = ExitRecord {
                index: index as u64,
                time: VirtNanos(time),
                kind,
                address: 0,
                data: 0,
                size: 0,
                rip: 0,
                regs_hash: 0,
                injected: NO_VECTOR,
                device_hash: NO_HASH,
                memory_hash: NO_HASH,
            };
            report.add(&record, device);
        }
        let text = text(std::path::Path::new("t.jsonl"), &report, true);
        let expected = "\
t.jsonl: 3 exits (exit 0 to 2), up to virtual time 1.5s

kind   exits     %
IoOut      2  66.7
Hlt        1  33.3

device  exits     %
serial      2  66.7
-           1  33.3

per virtual second, by kind
second  exits  IoOut  Hlt
0s          2      2    0
1s          1      0    1

per virtual second, by device
second  exits  serial  -
0s          2       2  0
1s          1       0  1
";
        assert_eq!(text, expected);
    }
}
