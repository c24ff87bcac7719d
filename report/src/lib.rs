//! A campaign's report, for the people who read it in the morning and the
//! CI job that gates on it: one or more campaign directories (shards of one
//! campaign) read without loss into a versioned model ([`model::Report`],
//! its JSON documented in docs/campaigns.md, "Reports"), and written as one
//! self-contained HTML page, as JSON, as JUnit XML and as a terminal
//! summary. The properties' examples and counterexamples, and each
//! finding's notable moments, are the debugger library's reading of the
//! findings' own histories (`debugger::reading`), named as the debugger
//! names moments; nothing is run.
//!
//! - [`model`]: the report, [`model::VERSION`];
//! - [`read`]: a campaign directory into a report (read only);
//! - [`merge`]: several reports as one, and the rule that keeps it lossless;
//! - [`triage`]: findings marked by a baseline (new, known, ignored,
//!   possibly fixed);
//! - [`html`], [`junit`], [`text`]: the outputs; [`plots`]: their SVG.

pub mod html;
pub mod junit;
pub mod merge;
pub mod model;
pub mod plots;
pub mod read;
pub mod text;
pub mod triage;

pub use model::{Report, VERSION};
pub use read::{read, ReadError};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Plot(#[from] plots::PlotError),
    #[error(transparent)]
    Junit(#[from] junit::JunitError),
    #[error(transparent)]
    File(#[from] hostfile::WriteError),
}

/// Where to write a report.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub html: Option<std::path::PathBuf>,
    pub json: Option<std::path::PathBuf>,
    pub junit: Option<std::path::PathBuf>,
}

impl Outputs {
    pub fn is_empty(&self) -> bool {
        self.html.is_none() && self.json.is_none() && self.junit.is_none()
    }

    /// Checks every output can be written, before anything is read.
    pub fn check(&self) -> Result<(), WriteError> {
        for path in [&self.html, &self.json, &self.junit].into_iter().flatten() {
            hostfile::check_output(path)?;
        }
        Ok(())
    }

    /// Writes `report` to each output (each atomically).
    pub fn write(&self, report: &Report) -> Result<(), WriteError> {
        if let Some(path) = &self.html {
            hostfile::write_atomic(path, html::html(report)?.as_bytes())?;
        }
        if let Some(path) = &self.json {
            let mut json = serde_json::to_string_pretty(report).expect("reports serialize");
            json.push('\n');
            hostfile::write_atomic(path, json.as_bytes())?;
        }
        if let Some(path) = &self.junit {
            hostfile::write_atomic(path, junit::junit(report)?.as_bytes())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
