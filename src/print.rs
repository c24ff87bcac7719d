//! How the CLI prints what the run library answers: one line for people on
//! stderr, or JSON on stdout with `--json`; and the process exit status.

use anyhow::Result;
use run::audit::AuditSummary;
use run::seeds::SeedsReport;
use run::snapshots::{SeekReport, SnapshotDetails, SnapshotRow};
use run::up::UpSummary;
use run::RunSummary;
use std::io::Write;

/// A run's summary (JSON on stdout after an empty line, or a line on
/// stderr); returns the process's exit status.
pub fn summary(summary: &RunSummary, json: bool) -> Result<u8> {
    if json {
        let mut out = std::io::stdout().lock();
        writeln!(out)?;
        writeln!(out, "{}", serde_json::to_string(summary)?)?;
        // Why a run stalled or was stopped is for people too, whatever
        // reads the JSON.
        stop_note(summary);
    } else {
        eprintln!("{}", summary.human());
    }
    Ok(summary.process_status())
}

/// On stderr: the stall's message, if the run stalled; the refused call,
/// if the seccomp filter stopped it.
fn stop_note(summary: &RunSummary) {
    let message = run::outcome::stall_message(&summary.stop);
    if !message.is_empty() {
        eprintln!("detvisor: stalled: {message}");
    }
    if let vmm::exit::StopReason::SeccompViolation { violation } = summary.stop {
        eprintln!("detvisor: stopped: {violation}");
    }
}

/// An `up` run's summary (its status is the workload's).
pub fn up(summary: &UpSummary, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
        stop_note(&summary.run);
    } else if matches!(summary.run.stop_kind(), "stalled" | "seccomp_violation") {
        eprintln!("{}", summary.run.human());
    } else {
        eprintln!(
            "detvisor: exit {}; {}",
            summary.status,
            summary.run.details()
        );
        if summary.runs > 1 {
            match &summary.divergence {
                None => println!(
                    "identical: {} runs, {} exits each, digest {}",
                    summary.runs, summary.run.exits, summary.run.digest
                ),
                Some(text) => println!("DIVERGED: {text}"),
            }
        }
    }
    Ok(summary.process_status())
}

pub fn audit(summary: &AuditSummary, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
    } else {
        println!("{}", summary.verdict());
    }
    Ok(if summary.identical { 0 } else { 1 })
}

/// `branch --seeds`: a table of outcomes (or JSON); 1 if any branch failed.
pub fn seeds(report: &SeedsReport, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!(
            "{:>8} {:>6} {:<14} {:>16} {:>10}  DIGEST",
            "SEED", "STATUS", "STOP", "VIRTUAL TIME", "EXITS"
        );
        for o in &report.branches {
            let dash = || "-".to_string();
            let summary = o.summary();
            println!(
                "{:>8} {:>6} {:<14} {:>16} {:>10}  {}",
                o.seed(),
                summary
                    .and_then(|s| s.exit_status)
                    .map_or_else(dash, |s| s.to_string()),
                summary.map_or("error", RunSummary::stop_kind),
                summary.map_or_else(dash, |s| s.virtual_ns.to_string()),
                summary.map_or_else(dash, |s| s.exits.to_string()),
                summary.map_or_else(
                    || o.error().unwrap_or_default().to_string(),
                    |s| { s.digest.clone() }
                )
            );
        }
        println!(
            "{} branches ({} at a time): {} distinct histories, {} distinct in control flow \
             (exits, virtual time), {} stalled, {} failed",
            report.branches.len(),
            report.jobs,
            report.distinct_histories,
            report.distinct_control_flows,
            report.stalled,
            report.failures
        );
    }
    Ok(if report.failures == 0 { 0 } else { 1 })
}

pub fn seek(report: &SeekReport, json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", report.human());
    }
    Ok(0)
}

pub fn snapshot_rows(rows: &[SnapshotRow], json: bool) -> Result<u8> {
    if json {
        println!("{}", serde_json::to_string(rows)?);
        return Ok(0);
    }
    println!(
        "{:<20} {:<20} {:>16} {:>12} {:>10} {:>8}",
        "ID", "PARENT", "VIRTUAL TIME", "EXIT", "DISK", "PAGES"
    );
    for row in rows {
        println!(
            "{:<20} {:<20} {:>16} {:>12} {:>9}K {:>8}",
            row.id,
            row.parent.as_deref().unwrap_or("-"),
            row.virtual_ns.to_string(),
            row.exit_index,
            row.disk_bytes / 1024,
            row.memory_pages_stored
        );
    }
    Ok(0)
}

pub fn snapshot_details(details: &SnapshotDetails) -> Result<u8> {
    println!("{}", serde_json::to_string_pretty(details)?);
    Ok(0)
}
