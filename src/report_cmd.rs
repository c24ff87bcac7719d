//! `detvisor report`: one or more campaign directories (shards) read and
//! merged by the `campaign-report` library, written as HTML, JSON and JUnit
//! XML, or printed as a terminal summary.

use crate::progress::{Mode, Reporter};
use anyhow::Result;
use campaign_report::{read, text, Outputs};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
#[command(
    after_help = "Without --html, --json or --junit the summary is printed. Several directories (the shards of one campaign) are merged: tallies add, a finding found by two is one (see docs/campaigns.md, \"Reports\"). Exit status: 0 when written, 2 on an error."
)]
pub struct ReportArgs {
    /// Campaign directories (one, or the shards of one campaign).
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Write one self-contained HTML page here.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Write the report as JSON (versioned) here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write JUnit XML here: one test case per property, failures carrying
    /// their findings' replay commands.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Mark each finding new, known or ignored by this baseline (see
    /// `detvisor triage`), and list its entries no finding has as possibly
    /// fixed.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// No progress lines while reading several directories.
    #[arg(long)]
    pub quiet: bool,
}

pub fn cmd_report(args: ReportArgs) -> Result<u8> {
    let outputs = Outputs {
        html: args.html,
        json: args.json,
        junit: args.junit,
    };
    outputs.check()?;
    let baseline = match &args.baseline {
        Some(path) => Some(fuzzer::triage::Baseline::load(path)?),
        None => None,
    };
    let mut report = read_shards(&args.dirs, Mode::detect(args.quiet))?;
    if let Some(baseline) = &baseline {
        campaign_report::triage::apply(&mut report, baseline)?;
    }
    if outputs.is_empty() {
        print!("{}", text::summary(&report));
    } else {
        outputs.write(&report)?;
        for path in [&outputs.html, &outputs.json, &outputs.junit]
            .into_iter()
            .flatten()
        {
            eprintln!("detvisor: wrote {}", path.display());
        }
    }
    Ok(0)
}

/// The directories read one by one, with a display of how many are read
/// (on a terminal; a line each otherwise) when there are several, then
/// merged.
fn read_shards(dirs: &[PathBuf], mode: Mode) -> Result<campaign_report::Report> {
    if dirs.len() < 2 {
        return Ok(read(dirs)?);
    }
    let mut progress = Reporter::new(mode);
    progress.start(Some(dirs.len() as u64), 0, true);
    let report = campaign_report::read::read_each(dirs, |i, dir| {
        progress.update(i as u64 + 1, format!("read {}", dir.display()));
        progress.event(&format!(
            "detvisor: read {} of {} campaign directories: {}",
            i + 1,
            dirs.len(),
            dir.display()
        ));
    })?;
    progress.finish();
    Ok(report)
}

/// The summary of the campaign in `dir`, as `report DIR` prints it, at
/// the end of a campaign; a directory that does not read is said on
/// stderr (the campaign's own lines stand).
pub fn print_summary(dir: &Path) {
    match read(&[dir.to_owned()]) {
        Ok(report) => print!("{}", text::summary(&report)),
        Err(e) => eprintln!("detvisor: WARNING: no report of {}: {e}", dir.display()),
    }
}
