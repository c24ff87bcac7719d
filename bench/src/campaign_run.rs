//! What issue 30's campaign benches share: one campaign run through the fuzzer library (as
//! `detvisor campaign` runs it), with a wall budget, a worker count, optionally another campaign
//! seed and a stop at its first finding; its engine stats read back from its database; the
//! results written under `bench/` when a bench ran its full budget.

use crate::say;
use anyhow::{bail, Context, Result};
use clap::Args;
use fuzzer::budget::WallBudget;
use fuzzer::campaign::{BudgetOverride, Campaign, NewCampaign, Place};
use fuzzer::engine::{BranchReport, CampaignSummary, Progress};
use fuzzer::shard::Shard;
use fuzzer::stats::CampaignStats;
use fuzzer::store::Store;
use helper_vm::HostVmMode;
use run::api::Position;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;
use vmm::VirtNanos;

/// One campaign to run.
pub(crate) struct CampaignRun<'a> {
    /// What the progress lines call it.
    pub label: String,
    pub file: &'a Path,
    pub out: PathBuf,
    pub wall: VirtNanos,
    pub jobs: u32,
    pub place: Place,
    /// Another campaign seed than the file's `seed`.
    pub seed: Option<u64>,
    /// Stop once a finding is written (the wave it was found in ends first).
    pub stop_at_first_finding: bool,
}

/// What a campaign did.
pub(crate) struct Ran {
    pub summary: CampaignSummary,
    /// The engine's counters as the database keeps them.
    pub stats: CampaignStats,
    /// The campaign's own wall time (its budget's clock: from the boot to its end), s.
    pub campaign_s: f64,
}

impl Ran {
    /// Branches per hour of the campaign's wall time.
    pub fn branches_per_hour(&self) -> f64 {
        per_hour(self.summary.branches_this_run, self.campaign_s)
    }

    /// Branches per hour of the campaign's wall time less shrinking.
    pub fn branches_per_hour_searching(&self) -> f64 {
        per_hour(
            self.summary.branches_this_run,
            self.campaign_s - self.stats.shrink_ms as f64 / 1000.0,
        )
    }
}

/// `count` per hour of `seconds` (0 for no time).
pub(crate) fn per_hour(count: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    count as f64 * 3600.0 / seconds
}

/// Progress lines, and whether a finding was written.
struct Watch {
    label: String,
    started: Instant,
    found: Rc<Cell<bool>>,
}

impl Progress for Watch {
    fn root(&mut self, position: &Position, digest: &str) {
        say!(
            "bench: {}: root at {} (exit {}), digest {digest} ({:.0} s)",
            self.label,
            position.virtual_ns,
            position.exits,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn branch(&mut self, r: &BranchReport) {
        say!(
            "bench: {}: branch {} from moment {} (depth {}, {} fault(s), worker {}, {:.1} s) at {:.0} s",
            self.label,
            r.number,
            r.parent,
            r.depth,
            r.faults,
            r.worker,
            r.wall_ms as f64 / 1000.0,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn finding(&mut self, number: u32, key: &str, _summary: &str, dir: &Path) {
        say!(
            "bench: {}: FINDING {number:04} {key} ({}) at {:.0} s",
            self.label,
            dir.display(),
            self.started.elapsed().as_secs_f64()
        );
        self.found.set(true);
    }

    fn warning(&mut self, text: &str) {
        say!("bench: {}: WARNING: {text}", self.label);
    }
}

impl CampaignRun<'_> {
    /// Runs the campaign to its budget (or its first finding); `out` must not exist yet.
    pub fn run(&self) -> Result<Ran> {
        let started = Instant::now();
        let seeded;
        let file = match self.seed {
            Some(seed) => {
                seeded = seeded_copy(self.file, seed, &self.out)?;
                seeded.as_path()
            }
            None => self.file,
        };
        let new = NewCampaign {
            file: file.to_owned(),
            out: self.out.clone(),
            budget: BudgetOverride {
                wall: Some(WallBudget(Some(self.wall))),
                branches: None,
            },
            jobs: self.jobs,
            place: self.place,
            shard: Shard::WHOLE,
        };
        let found = Rc::new(Cell::new(false));
        let mut watch = Watch {
            label: self.label.clone(),
            started,
            found: found.clone(),
        };
        let stop_at_first = self.stop_at_first_finding;
        let stop = move || stop_at_first && found.get();
        let mut campaign = Campaign::start(&new, &mut watch)
            .with_context(|| format!("starting the campaign {}", file.display()))?;
        let campaign_started = Instant::now();
        let summary = campaign.run(&mut watch, &stop)?;
        let campaign_s = campaign_started.elapsed().as_secs_f64();
        drop(campaign);
        let stats = Store::open_read_only(&self.out)?
            .stats()?
            .unwrap_or_default();
        say!(
            "bench: {}: {} branches, {} finding(s), stopped by {} ({:.0} s)",
            self.label,
            summary.branches_this_run,
            summary.findings.len(),
            summary.stopped_by,
            started.elapsed().as_secs_f64()
        );
        Ok(Ran {
            summary,
            stats,
            campaign_s,
        })
    }
}

/// A copy of the campaign file `file` with its top-level `seed` set to `seed` (added when the
/// file has none) and its `manifest` made absolute, written next to `out` (a campaign's
/// directory must not exist before it starts).
fn seeded_copy(file: &Path, seed: u64, out: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the campaign file {}", file.display()))?;
    let base = file
        .canonicalize()
        .with_context(|| format!("{}", file.display()))?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let copy = seeded_text(&text, seed, &base)
        .with_context(|| format!("the campaign file {}", file.display()))?;
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "campaign".into());
    let path = out.with_file_name(format!("{name}.seed-{seed}.toml"));
    std::fs::write(&path, copy).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// [`seeded_copy`]'s text: the top-level keys before the first table header.
fn seeded_text(text: &str, seed: u64, base: &Path) -> Result<String> {
    let mut out = Vec::new();
    let mut top = true;
    let (mut seeded, mut manifest) = (false, false);
    for line in text.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        if line.trim_start().starts_with('[') {
            if top && !seeded {
                out.push(format!("seed = {seed}"));
                seeded = true;
            }
            top = false;
        }
        if top && key == "seed" {
            out.push(format!("seed = {seed}"));
            seeded = true;
        } else if top && key == "manifest" {
            let value = line.split_once('=').map(|(_, v)| v.trim()).unwrap_or("");
            let Some(relative) = value.strip_prefix('"').and_then(|v| v.split('"').next()) else {
                bail!("its manifest line is not `manifest = \"...\"`: {line}");
            };
            out.push(format!(
                "manifest = {:?}",
                base.join(relative).display().to_string()
            ));
            manifest = true;
        } else {
            out.push(line.to_owned());
        }
    }
    if !manifest {
        bail!("it has no top-level `manifest = \"...\"` line");
    }
    if !seeded {
        out.push(format!("seed = {seed}"));
    }
    Ok(out.join("\n") + "\n")
}

/// Where a bench's results go when it ran its full budget: `bench/NAME-results.txt` of this
/// source tree.
pub(crate) fn results_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("{name}-results.txt"))
}

/// Prints `report` and, when `write` (a full run) or `to` names a file, writes it there too.
fn publish(report: &str, name: &str, write: bool, to: Option<&Path>) -> Result<()> {
    print!("{report}");
    let path = match to {
        Some(path) => path.to_owned(),
        None if write => results_path(name),
        None => return Ok(()),
    };
    std::fs::write(&path, report).with_context(|| format!("writing {}", path.display()))?;
    say!("bench: results written to {}", path.display());
    Ok(())
}

/// The machine a bench ran on, for its results: where the guests ran, cores, load.
fn machine_line(host_vm: helper_vm::HostVmMode) -> String {
    let place = match helper_vm::placement(host_vm) {
        helper_vm::Placement::Host => "the host's KVM".to_string(),
        helper_vm::Placement::HelperVm { reason } => {
            format!("helper VMs (QEMU TCG, one per worker: {reason})")
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = crate::machine::loadavg()
        .map(|l| format!("{:.1} {:.1} {:.1}", l[0], l[1], l[2]))
        .unwrap_or_else(|| "?".into());
    format!("guests ran in {place}; {cores} cores; load average at the start {load}")
}

/// The options of every campaign bench besides its budget.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Write the results here (default: bench/NAME-results.txt, after a run with the issue's
    /// budget only).
    #[arg(long, value_name = "FILE")]
    pub results: Option<PathBuf>,
    /// Keep the scratch directory of the runs (its path is printed).
    #[arg(long)]
    pub keep: bool,
    /// Where the runs happen.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
}

/// What a bench starts from: where its runs go, the machine's line, its scratch directory.
pub(crate) struct Setup {
    pub place: Place,
    pub machine: String,
    pub dir: PathBuf,
}

impl Common {
    /// Checks `budget` and makes the bench `name`'s scratch directory.
    pub(crate) fn setup(&self, name: &str, budget: VirtNanos) -> Result<Setup> {
        if budget == VirtNanos::ZERO {
            bail!("--budget must be above 0");
        }
        Ok(Setup {
            place: Place {
                host_vm: self.host_vm,
                seccomp: true,
            },
            machine: machine_line(self.host_vm),
            dir: scratch(name)?,
        })
    }

    /// Publishes `report` (written to bench/ when `full`, see [`publish`]) and removes the
    /// scratch directory unless `--keep`.
    pub(crate) fn finish(
        &self,
        setup: &Setup,
        name: &str,
        report: &Lines,
        full: bool,
    ) -> Result<u8> {
        publish(&report.0, name, full, self.results.as_deref())?;
        if self.keep {
            say!("bench: kept {}", setup.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&setup.dir);
        }
        Ok(0)
    }
}

/// Whether `budget` is the issue's `full` one (a full run, whose results go to bench/).
pub(crate) fn is_full(budget: VirtNanos, full: &str) -> bool {
    full.parse::<VirtNanos>().is_ok_and(|full| full == budget)
}

/// A bench's results, a line at a time.
#[derive(Default)]
pub(crate) struct Lines(String);

impl Lines {
    pub fn line(&mut self, line: impl AsRef<str>) {
        self.0.push_str(line.as_ref());
        self.0.push('\n');
    }
}

/// A fresh scratch directory for a bench's runs.
fn scratch(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("detvisor-bench-{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_seeded_text_sets_the_seed_and_makes_the_manifest_absolute() {
        let text = "# c\nmanifest = \"m.toml\"\nseed = 1\n\n[root]\nat = \"1s\"\nseed = 9\n";
        let out = seeded_text(text, 7, Path::new("/x/y")).unwrap();
        assert_eq!(
            out,
            "# c\nmanifest = \"/x/y/m.toml\"\nseed = 7\n\n[root]\nat = \"1s\"\nseed = 9\n"
        );
        // Without a seed, one is added before the first table.
        let out = seeded_text("manifest = \"m.toml\"\n[root]\n", 3, Path::new("/b")).unwrap();
        assert_eq!(out, "manifest = \"/b/m.toml\"\nseed = 3\n[root]\n");
        assert!(seeded_text("[root]\n", 3, Path::new("/b")).is_err());
    }

    #[test]
    fn test_per_hour() {
        assert_eq!(per_hour(10, 1800.0), 20.0);
        assert_eq!(per_hour(10, 0.0), 0.0);
    }
}
