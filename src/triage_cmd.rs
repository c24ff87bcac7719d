//! `detvisor findings` (one campaign directory or several, against a
//! baseline) and `detvisor triage` (a finding marked known or ignored in a
//! baseline file): arguments and printing. Baselines and classification
//! are the `fuzzer` library's (`fuzzer::triage`).

use anyhow::{Context, Result};
use clap::Args;
use fuzzer::campaign::FindingLine;
use fuzzer::failure::FailureKey;
use fuzzer::triage::{self, Baseline, Entry, Mark, Status};
use std::path::PathBuf;

/// The exit status of `detvisor findings`, said in its help.
const FINDINGS_EXIT_STATUS: &str = "Exit status: without --baseline, 0 (2 on an error: a directory that is not a campaign, a damaged one). With --baseline, 1 when a finding is new (its key, or a key it maps to, is not in the baseline), 0 when every finding is known or ignored (possibly fixed entries included), 2 on an error (a bad baseline names its file and line). A CI job gates on it: `detvisor findings nightly/ --baseline triage.toml`.";

#[derive(Args, Debug)]
#[command(after_help = FINDINGS_EXIT_STATUS)]
pub struct FindingsArgs {
    /// Campaign directories (several: one listing, each finding named by
    /// its directory; with --baseline, merged by key).
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// A triage baseline (TOML, see docs/campaigns.md): each finding is
    /// new, known or ignored, each entry no finding has possibly fixed.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// One JSON object per finding, a line each (with --baseline, its
    /// `status` and `note`; then one per possibly fixed entry).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The entry is keyed by the finding's failure key; an entry of that key (or an old key that maps to it) is updated in place, the file's other entries and comments kept. FILE is created if missing."
)]
pub struct TriageArgs {
    /// A finding's directory (DIR/findings/NNNN).
    finding: PathBuf,
    /// Mark it known, with this note (e.g. "upstream #123").
    #[arg(
        long,
        value_name = "NOTE",
        conflicts_with = "ignore",
        required_unless_present = "ignore"
    )]
    known: Option<String>,
    /// Mark it ignored, with this note (why).
    #[arg(long, value_name = "NOTE")]
    ignore: Option<String>,
    /// The baseline file to add the entry to (or update it in).
    #[arg(long, value_name = "FILE")]
    into: PathBuf,
    /// Who triaged it, kept in the entry (`by`).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    /// When, kept in the entry (`date`; any text, e.g. `$(date -I)`).
    #[arg(long, value_name = "DATE")]
    date: Option<String>,
}

/// The findings of every directory, in the order given.
fn listing(dirs: &[PathBuf]) -> Result<Vec<FindingLine>> {
    let mut lines = Vec::new();
    for dir in dirs {
        lines.extend(fuzzer::campaign::findings(dir)?);
    }
    Ok(lines)
}

/// A finding's line of text: its number (its directory when several
/// campaigns are listed), key, summary and shrinking.
fn finding_text(line: &FindingLine, several: bool) -> String {
    let name = if several {
        line.dir.display().to_string()
    } else {
        format!("{:04}", line.number)
    };
    format!(
        "{name}  {}  {}  ({})",
        line.key,
        line.summary,
        line.shrunk()
    )
}

pub fn cmd_findings(args: FindingsArgs) -> Result<u8> {
    let several = args.dirs.len() > 1;
    let baseline = match &args.baseline {
        Some(path) => Some(Baseline::load(path)?),
        None => None,
    };
    let listed = listing(&args.dirs)?;
    let Some(baseline) = baseline else {
        for line in &listed {
            if args.json {
                println!("{}", serde_json::to_string(line)?);
            } else {
                println!("{}", finding_text(line, several));
            }
        }
        if listed.is_empty() && !args.json {
            println!("no findings");
        }
        return Ok(0);
    };
    let triage = triage::classify(&listed, &baseline);
    for line in &listed {
        let failure = triage
            .failures
            .iter()
            .find(|f| f.findings.iter().any(|l| l.dir == line.dir))
            .context("a finding the triage left out")?;
        if args.json {
            let mut value = serde_json::to_value(line)?;
            value["status"] = serde_json::to_value(failure.status)?;
            if let Some(entry) = &failure.entry {
                value["note"] = entry.note.as_str().into();
            }
            println!("{}", serde_json::to_string(&value)?);
        } else {
            let note = failure
                .entry
                .as_ref()
                .map_or_else(String::new, |e| format!("  # {}", one_line(&e.note)));
            println!(
                "{:<8} {}{note}",
                failure.status.to_string(),
                finding_text(line, several)
            );
        }
    }
    for fixed in &triage.possibly_fixed {
        if args.json {
            let value = serde_json::json!({
                "key": fixed.key,
                "note": fixed.entry.note,
                "status": Status::PossiblyFixed,
            });
            println!("{}", serde_json::to_string(&value)?);
        } else {
            println!(
                "{} {}  # {}",
                Status::PossiblyFixed,
                fixed.key,
                one_line(&fixed.entry.note)
            );
        }
    }
    if listed.is_empty() && triage.possibly_fixed.is_empty() && !args.json {
        println!("no findings");
    }
    Ok(u8::from(triage.any_new()))
}

/// A note on one line (a newline in it written `\n`).
fn one_line(note: &str) -> String {
    note.replace('\n', "\\n")
}

pub fn cmd_triage(args: TriageArgs) -> Result<u8> {
    let file = fuzzer::findings::read_file(&args.finding)?;
    let key = FailureKey::from_slug(&file.key).with_context(|| {
        format!(
            "{}",
            args.finding.join(fuzzer::findings::FINDING_FILE).display()
        )
    })?;
    let (status, note) = match (args.known, args.ignore) {
        (Some(note), _) => (Mark::Known, note),
        (None, Some(note)) => (Mark::Ignored, note),
        (None, None) => unreachable!("clap requires --known or --ignore"),
    };
    let entry = Entry {
        status,
        note,
        by: args.by,
        date: args.date,
    };
    triage::set_entry_in_file(&args.into, &key, &entry)?;
    println!(
        "{}: {} {}  # {}",
        args.into.display(),
        match status {
            Mark::Known => "known",
            Mark::Ignored => "ignored",
        },
        file.key,
        one_line(&entry.note)
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    fn parse(argv: &[&str]) -> Result<crate::Command, clap::Error> {
        crate::Cli::try_parse_from(argv).map(|cli| cli.command)
    }

    #[test]
    fn test_triage_takes_one_mark_and_a_file() {
        let ok = parse(&[
            "detvisor",
            "triage",
            "c/findings/0001",
            "--known",
            "upstream #1",
            "--into",
            "t.toml",
        ]);
        assert!(matches!(ok, Ok(crate::Command::Triage(_))), "{ok:?}");
        for bad in [
            &["detvisor", "triage", "f", "--into", "t.toml"][..],
            &[
                "detvisor", "triage", "f", "--known", "a", "--ignore", "b", "--into", "t.toml",
            ],
            &["detvisor", "triage", "f", "--known", "a"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let several = parse(&["detvisor", "findings", "a", "b", "--baseline", "t.toml"]);
        let Ok(crate::Command::Findings(args)) = several else {
            panic!("{several:?}");
        };
        assert_eq!(args.dirs.len(), 2);
        assert!(
            parse(&["detvisor", "findings"]).is_err(),
            "a directory at least"
        );
    }
}
