//! The determinism soak: one configuration run many times with one seed,
//! every run's exits compared with a reference run's as they are made, each
//! run's verdict written down as soon as it is known.
//!
//! A soak is an audit whose reference is kept on disk, in a results
//! directory ([`SoakDir`]): run 1 is the reference (its summary and every
//! exit record of it); every later run streams its exit records against the
//! stored ones ([`stream`]), so memory stays flat however many exits a run
//! makes, and appends one [`RunResult`] line. An interrupted soak resumes:
//! [`soak`] runs only the runs the directory has no result for. The
//! directory names what it is a soak of ([`SoakIdentity`]); a soak of
//! anything else (another scenario, seed, configuration or build) is refused
//! there.

mod store;
mod stream;

pub use store::{Reference, SoakDir, StoreError};
pub use stream::{RecordComparator, RecordWriter, StreamError};

use crate::audit::{divergence_text, final_state_text};
use crate::driven::{Driven, DrivenError};
use crate::plain::{GuestSpec, PlainError};
use crate::up::{Initrd, OutputError, PreparedUp, UpError, UpOptions, UpOutput};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vmm::exit::Perturbation;
use vmm::record::RecordConfig;
use vmm::trace::ExitObserver;
use vmm::vm::{RunOutcome, Session, VmConfig};
use vmm::VirtNanos;

/// What a soak is of: its results directory holds this soak's results only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoakIdentity {
    /// The scenario's name, for people (`boot`, `etcd-partition-pause`).
    pub scenario: String,
    pub seed: u64,
    /// Hash of everything the guest is made of and run with ([`fingerprint`]).
    pub config: String,
    /// Which detvisor runs it (the caller's choice: e.g. a hash of its executable).
    pub build: String,
    /// Testing the soak itself: in run `.0` flip a bit of the first value
    /// the guest reads at or after exit `.1` (as [`crate::audit::AuditOptions::perturb`]).
    pub perturb: Option<(u32, u64)>,
}

impl fmt::Display for SoakIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scenario {}, seed {}, configuration {}, build {}",
            self.scenario, self.seed, self.config, self.build
        )?;
        if let Some((run, exit)) = self.perturb {
            write!(f, ", run {run} perturbed at exit {exit}")?;
        }
        Ok(())
    }
}

/// The guest a soak runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoakTarget {
    /// A plain run (as `detvisor run`/`audit`).
    Boot(GuestSpec),
    /// A multi-node run (as `detvisor up`); the options' seed, time limit,
    /// exit path and stall timeout apply (nothing is logged or captured).
    Up {
        prepared: Box<PreparedUp>,
        options: UpOptions,
    },
}

/// One run of a soak and its verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// 1-based; run 1 is the reference.
    pub run: u32,
    pub exits: u64,
    pub virtual_ns: VirtNanos,
    pub digest: String,
    /// The guest's exit status (an `up` run's: the workload's), if it has one.
    pub status: Option<u8>,
    pub wall_ms: u64,
    /// How the run differs from the reference (the first differing exit, or
    /// else which part of the final state); `None`: identical.
    pub divergence: Option<String>,
}

/// A soak: run `target` until `dir` holds `runs` runs' results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SoakRequest {
    pub target: SoakTarget,
    pub identity: SoakIdentity,
    pub dir: PathBuf,
    pub runs: u32,
}

/// Where a soak stands: the runs its directory holds results for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakReport {
    pub identity: SoakIdentity,
    pub dir: PathBuf,
    /// The runs asked for.
    pub runs: u32,
    /// Run 1, once it finished.
    pub reference: Option<RunResult>,
    /// The later runs, in the order they finished.
    pub results: Vec<RunResult>,
}

impl SoakReport {
    /// Runs that finished (the reference among them).
    pub fn done(&self) -> u32 {
        self.reference.iter().count() as u32 + self.results.len() as u32
    }

    /// Runs not yet run (of the runs asked for).
    pub fn missing(&self) -> Vec<u32> {
        missing_runs(self.reference.is_some(), &self.results, self.runs)
    }

    pub fn diverged(&self) -> u32 {
        self.results
            .iter()
            .filter(|r| r.divergence.is_some())
            .count() as u32
    }

    /// Runs identical to the reference (the reference itself counted).
    pub fn identical(&self) -> u32 {
        self.done() - self.diverged()
    }

    /// The diverged run with the lowest number.
    pub fn first_divergence(&self) -> Option<&RunResult> {
        self.results
            .iter()
            .filter(|r| r.divergence.is_some())
            .min_by_key(|r| r.run)
    }

    /// The median wall time of a run, in milliseconds.
    pub fn median_wall_ms(&self) -> Option<u64> {
        let mut walls: Vec<u64> = self
            .reference
            .iter()
            .chain(&self.results)
            .map(|r| r.wall_ms)
            .collect();
        walls.sort_unstable();
        walls.get(walls.len() / 2).copied()
    }

    /// The soak's figures in one line: `identical: ...` or `DIVERGED: ...`.
    pub fn verdict(&self) -> String {
        let word = if self.diverged() == 0 {
            "identical"
        } else {
            "DIVERGED"
        };
        let reference = self.reference.as_ref();
        format!(
            "{word}: {} {} of {} runs done, {} identical, {} diverged; {} exits per run (reference), wall {:.1} s per run (median); seed {}",
            self.identity.scenario,
            self.done(),
            self.runs,
            self.identical(),
            self.diverged(),
            reference.map(|r| r.exits).unwrap_or(0),
            self.median_wall_ms().unwrap_or(0) as f64 / 1000.0,
            self.identity.seed
        )
    }
}

/// The runs of `1..=runs` with no result yet.
fn missing_runs(reference: bool, results: &[RunResult], runs: u32) -> Vec<u32> {
    let done: BTreeSet<u32> = results.iter().map(|r| r.run).collect();
    (1..=runs)
        .filter(|run| {
            if *run == 1 {
                !reference
            } else {
                !done.contains(run)
            }
        })
        .collect()
}

/// Why a soak could not run.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error("a soak needs at least 2 runs to compare anything")]
    TooFewRuns,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("locating the running executable")]
    Executable(#[source] std::io::Error),
    #[error("reading {} for the soak's identity", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: hostfile::ReadError,
    },
    #[error(transparent)]
    Guest(#[from] crate::guest::GuestImageError),
    #[error(transparent)]
    Plain(#[from] PlainError),
    #[error(transparent)]
    Up(#[from] UpError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Driven(#[from] DrivenError),
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
}

/// What `dir` holds of the soak `identity` (created empty if missing;
/// refused if it holds another soak).
pub fn status(dir: &Path, identity: &SoakIdentity, runs: u32) -> Result<SoakReport, SoakError> {
    let store = SoakDir::open(dir, identity)?;
    report(&store, dir, identity, runs)
}

fn report(
    store: &SoakDir,
    dir: &Path,
    identity: &SoakIdentity,
    runs: u32,
) -> Result<SoakReport, SoakError> {
    Ok(SoakReport {
        identity: identity.clone(),
        dir: dir.to_path_buf(),
        runs,
        reference: store.reference()?.map(|r| r.result),
        // A soak asked for fewer runs than were made counts its own.
        results: store
            .results()?
            .into_iter()
            .filter(|r| r.run <= runs)
            .collect(),
    })
}

/// A hash of the running executable (16 hex digits): a soak's
/// [`SoakIdentity::build`] when the caller has no better name for its build.
pub fn executable_id() -> Result<String, SoakError> {
    let exe = std::env::current_exe().map_err(SoakError::Executable)?;
    let bytes = hostfile::read_limited(&exe, u64::MAX).map_err(|source| SoakError::Read {
        path: exe.clone(),
        source,
    })?;
    Ok(blake3::hash(&bytes).to_hex()[..16].to_string())
}

/// Hashes what `target`'s guest is made of and run with: its settings, the
/// kernel's and initramfs's bytes (host policy, the stall timeout, and
/// where files are left out).
pub fn fingerprint(target: &SoakTarget) -> Result<String, SoakError> {
    let read = |path: &Path| {
        hostfile::read_limited(path, crate::guest::MAX_INITRD_BYTES).map_err(|source| {
            SoakError::Read {
                path: path.to_path_buf(),
                source,
            }
        })
    };
    let mut hasher = blake3::Hasher::new();
    let mut add = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    match target {
        SoakTarget::Boot(spec) => {
            let image = spec.image_files()?;
            add(&read(&image.kernel)?);
            add(&crate::guest::initrd_with_command(
                &image.initrd,
                &spec.command,
            )?);
            let mut spec = spec.clone();
            spec.kernel = None;
            spec.initrd = None;
            spec.stall_timeout = Default::default();
            add(&serde_json::to_vec(&spec).expect("a guest spec is JSON"));
        }
        SoakTarget::Up { prepared, options } => {
            add(&read(&prepared.kernel)?);
            match &prepared.initrd {
                Initrd::Bytes(bytes) => add(bytes),
                Initrd::File(path) => add(&read(path)?),
            }
            let mut settings = prepared.as_ref().clone();
            settings.kernel = PathBuf::new();
            settings.initrd = Initrd::Bytes(Vec::new());
            add(&serde_json::to_vec(&settings).expect("a prepared up run is JSON"));
            add(
                &serde_json::to_vec(&(options.seed, options.until, options.exit_path))
                    .expect("options are JSON"),
            );
        }
    }
    Ok(hasher.finalize().to_hex()[..16].to_string())
}

/// Runs `request.target` until its directory holds `request.runs` runs'
/// results (resuming what is there), each appended as soon as the run
/// ends; `progress` gets a line per run. Returns where the soak stands.
pub fn soak(
    request: &SoakRequest,
    progress: &mut dyn FnMut(&str),
) -> Result<SoakReport, SoakError> {
    if request.runs < 2 {
        return Err(SoakError::TooFewRuns);
    }
    let store = SoakDir::open(&request.dir, &request.identity)?;
    let config = vm_config(&request.target)?;
    let total = request.runs;
    let perturbed = |run: u32| {
        let mut config = config.clone();
        if let Some((perturbed_run, at_exit)) = request.identity.perturb {
            if perturbed_run == run {
                config.perturbation = Some(Perturbation { at_exit });
            }
        }
        config
    };
    let reference = match store.reference()? {
        Some(reference) => reference,
        None => {
            let writer = RecordWriter::create(&store.partial_records())?;
            let (outcome, result) = run_once(&request.target, &perturbed(1), 1, writer.observer())?;
            writer.finish()?;
            let reference = Reference {
                result,
                digest_parts: outcome.digest_parts,
            };
            store.set_reference(&reference)?;
            progress(&run_line(&reference.result, total));
            reference
        }
    };
    let records = store.path(store::RECORDS);
    let missing = missing_runs(true, &store.results()?, total);
    for run in missing {
        let comparator = RecordComparator::open(&records)?;
        let (outcome, mut result) =
            run_once(&request.target, &perturbed(run), run, comparator.observer())?;
        result.divergence = match comparator.finish()? {
            Some(divergence) => Some(divergence_text(&divergence, run)),
            None => final_state_text(
                (&reference.result.digest, &reference.digest_parts),
                (&outcome.digest, &outcome.digest_parts),
                run,
            ),
        };
        store.append(&result)?;
        progress(&run_line(&result, total));
    }
    report(&store, &request.dir, &request.identity, total)
}

/// One run's line for people.
pub fn run_line(result: &RunResult, total: u32) -> String {
    let verdict = match (&result.divergence, result.run) {
        (None, 1) => "reference".to_string(),
        (None, _) => "identical".to_string(),
        (Some(text), _) => format!("DIVERGED: {text}"),
    };
    format!(
        "detvisor soak: run {}/{total}: {} exits, virtual {}, digest {}, wall {:.1} s: {verdict}",
        result.run,
        result.exits,
        result.virtual_ns,
        result.digest,
        result.wall_ms as f64 / 1000.0
    )
}

/// The VMM configuration every run of `target` starts from: no records
/// kept in memory (the observers see them), console and output discarded.
fn vm_config(target: &SoakTarget) -> Result<VmConfig, SoakError> {
    let record = RecordConfig::default();
    Ok(match target {
        SoakTarget::Boot(spec) => spec.vm_config(record)?,
        SoakTarget::Up { prepared, options } => {
            let options = UpOptions {
                runs: 1,
                ..options.clone()
            };
            let mut config = prepared.vm_config(&options)?;
            config.record = record;
            config
        }
    })
}

/// Runs `target` once from `config` with `observer` hearing every exit.
fn run_once(
    target: &SoakTarget,
    config: &VmConfig,
    run: u32,
    observer: Box<dyn ExitObserver>,
) -> Result<(RunOutcome, RunResult), SoakError> {
    let started = Instant::now();
    let mut driven = match target {
        SoakTarget::Boot(_) => {
            Driven::plain(Session::boot(config, Box::new(std::io::sink()), None)?)
        }
        SoakTarget::Up { prepared, .. } => {
            let output = UpOutput::plain(&prepared.node_names, Box::new(std::io::sink()), None)?;
            prepared.boot(config, output)?
        }
    };
    driven.session.set_exit_observer(Some(observer));
    let stop = driven.run_to_end()?;
    let status = driven.exit_status(stop);
    let outcome = driven.outcome(stop)?;
    // The observer goes with the session: its owner reads what it saw.
    drop(driven);
    let result = RunResult {
        run,
        exits: outcome.exits,
        virtual_ns: outcome.virtual_time,
        digest: outcome.digest.clone(),
        status,
        wall_ms: started.elapsed().as_millis() as u64,
        divergence: None,
    };
    Ok((outcome, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(run: u32, diverged: bool) -> RunResult {
        RunResult {
            run,
            exits: 10,
            virtual_ns: VirtNanos(5),
            digest: "d".into(),
            status: Some(0),
            wall_ms: 1000 * run as u64,
            divergence: diverged.then(|| format!("runs 1 and {run} diverge at exit 3")),
        }
    }

    fn report(reference: bool, results: Vec<RunResult>, runs: u32) -> SoakReport {
        SoakReport {
            identity: SoakIdentity {
                scenario: "boot".into(),
                seed: 7,
                config: "c".into(),
                build: "b".into(),
                perturb: None,
            },
            dir: PathBuf::from("/tmp/x"),
            runs,
            reference: reference.then(|| result(1, false)),
            results,
        }
    }

    #[test]
    fn test_resume_runs_only_what_is_missing() {
        assert_eq!(report(false, vec![], 3).missing(), vec![1, 2, 3]);
        let partial = report(true, vec![result(3, false)], 4);
        assert_eq!(partial.missing(), vec![2, 4]);
        assert_eq!(partial.done(), 2);
        // More runs asked for later: the soak extends.
        assert!(report(true, vec![result(2, false)], 2).missing().is_empty());
        assert_eq!(
            report(true, vec![result(2, false)], 5).missing(),
            vec![3, 4, 5]
        );
    }

    #[test]
    fn test_counts_and_the_first_divergence() {
        let r = report(
            true,
            vec![result(2, false), result(4, true), result(3, true)],
            4,
        );
        assert_eq!((r.identical(), r.diverged()), (2, 2));
        assert_eq!(r.first_divergence().map(|r| r.run), Some(3));
        assert!(
            r.verdict().starts_with("DIVERGED: boot 4 of 4 runs done"),
            "{}",
            r.verdict()
        );
        assert_eq!(r.median_wall_ms(), Some(3000));
        let ok = report(true, vec![result(2, false)], 2);
        assert!(ok
            .verdict()
            .starts_with("identical: boot 2 of 2 runs done, 2 identical, 0 diverged"));
    }
}
