//! `--trace FILE`: one JSON line per guest-caused exit of a run, written as
//! the run makes them (see [`vmm::trace`] for the line), and the report of
//! where a trace's exits went ([`report`]).
//!
//! The file is created (truncated) before the VM starts, so a path that
//! cannot be written is an error before anything runs. Lines go through a
//! buffer as the exits happen: nothing is held for the whole run. A trace
//! only observes: a run with `--trace` has the digest it has without.
//! Write errors after the start do not stop the run (the run cannot depend
//! on the host's disk); the first one is reported by [`TraceFile::finish`].
//!
//! A `run` traces from its first exit; a `branch` from the branch point on
//! (its first line is the exit after the restored moment); `up --runs N`
//! traces its first run only.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use vmm::record::ExitRecord;
use vmm::trace::report::{read_report, ReadError, TraceReport};
use vmm::trace::{ExitObserver, TraceLine};
use vmm::vm::Session;

/// Why a trace could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("creating the trace {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the trace {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening the trace")]
    Open(#[source] hostfile::ReadError),
    #[error("reading the trace {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: ReadError,
    },
}

/// The file, shared by the observer the session holds and the run that
/// finishes it.
struct Writer {
    path: PathBuf,
    out: BufWriter<File>,
    lines: u64,
    first_error: Option<std::io::Error>,
}

impl Writer {
    fn write(&mut self, record: &ExitRecord, device: Option<&str>) {
        if self.first_error.is_some() {
            return;
        }
        let line = TraceLine::new(record, device);
        let written = serde_json::to_writer(&mut self.out, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        match written {
            Ok(()) => self.lines += 1,
            Err(error) => self.first_error = Some(error),
        }
    }
}

fn lock(writer: &Mutex<Writer>) -> std::sync::MutexGuard<'_, Writer> {
    writer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the session holds: writes each record as a line.
struct Tap(Arc<Mutex<Writer>>);

impl ExitObserver for Tap {
    fn exit(&mut self, record: &ExitRecord, device: Option<&str>) {
        lock(&self.0).write(record, device);
    }
}

/// What a finished trace holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceWritten {
    pub path: PathBuf,
    pub lines: u64,
}

/// A trace being written; [`TraceFile::finish`] ends it.
pub struct TraceFile(Arc<Mutex<Writer>>);

impl TraceFile {
    /// Creates (or truncates) `path`; its directory must exist.
    pub fn create(path: &Path) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(TraceFile(Arc::new(Mutex::new(Writer {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 16, file),
            lines: 0,
            first_error: None,
        }))))
    }

    /// Creates the trace at `path` if one is asked for.
    pub fn create_if(path: Option<&Path>) -> Result<Option<Self>, TraceError> {
        path.map(TraceFile::create).transpose()
    }

    /// Writes every exit `session` makes from now on.
    pub fn attach(&self, session: &mut Session) {
        session.set_exit_observer(Some(Box::new(Tap(Arc::clone(&self.0)))));
    }

    /// Flushes the file; the first error of the whole trace, if any.
    pub fn finish(self) -> Result<TraceWritten, TraceError> {
        let mut writer = lock(&self.0);
        let error = match writer.first_error.take() {
            Some(error) => Err(error),
            None => writer.out.flush(),
        };
        error.map_err(|source| TraceError::Write {
            path: writer.path.clone(),
            source,
        })?;
        Ok(TraceWritten {
            path: writer.path.clone(),
            lines: writer.lines,
        })
    }
}

/// Where the exits of the trace at `path` went: by kind, by device, per
/// virtual second. Reads it a line at a time.
pub fn report(path: &Path) -> Result<TraceReport, TraceError> {
    // A regular file only: a FIFO would hang, a device never end.
    let file = hostfile::open_regular(path).map_err(TraceError::Open)?;
    read_report(BufReader::with_capacity(1 << 16, file)).map_err(|source| TraceError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::exit::ExitKind;
    use vmm::record::{NO_HASH, NO_VECTOR};
    use vmm::VirtNanos;

    fn record(index: u64) -> ExitRecord {
        ExitRecord {
            index,
            time: VirtNanos(index * 400_000_000),
            kind: if index.is_multiple_of(2) {
                ExitKind::IoOut
            } else {
                ExitKind::Hlt
            },
            address: if index.is_multiple_of(2) { 0x3f8 } else { 0 },
            data: index,
            size: 1,
            rip: 0xffff_ffff_8100_0000 + index,
            regs_hash: index * 31,
            injected: NO_VECTOR,
            device_hash: NO_HASH,
            memory_hash: NO_HASH,
        }
    }

    #[test]
    fn test_trace_file_writes_a_line_per_record_and_reports_them() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exits.jsonl");
        let trace = TraceFile::create(&path).unwrap();
        let mut tap = Tap(Arc::clone(&trace.0));

        // Act
        for index in 0..5u64 {
            let device = index.is_multiple_of(2).then_some("serial");
            tap.exit(&record(index), device);
        }
        let written = trace.finish().unwrap();

        // Assert
        assert_eq!(written.lines, 5);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<TraceLine> = text
            .lines()
            .map(|l| TraceLine::from_json(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[2].record(), record(2));
        assert_eq!(lines[2].device.as_deref(), Some("serial"));
        assert_eq!(lines[3].device, None);
        let report = report(&path).unwrap();
        assert_eq!(report.total.exits, 5);
        assert_eq!(report.total.by_device["serial"], 3);
        assert_eq!(report.total.by_kind["Hlt"], 2);
        // 0, 0.4, 0.8 s; 1.2 s; 1.6 s.
        let per_second: Vec<u64> = report.seconds.iter().map(|s| s.counts.exits).collect();
        assert_eq!(per_second, [3, 2]);
    }

    #[test]
    fn test_trace_file_in_a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir/exits.jsonl");
        let error = TraceFile::create(&path).err().expect("an error");
        let text = format!("{:#}", anyhow::Error::from(error));
        assert!(
            text.starts_with(&format!("creating the trace {}: ", path.display())),
            "{text}"
        );
    }

    #[test]
    fn test_report_of_a_file_that_is_no_trace_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-trace");
        std::fs::write(&path, "hello\n").unwrap();
        let text = format!("{:#}", anyhow::Error::from(report(&path).unwrap_err()));
        assert!(
            text.starts_with(&format!(
                "reading the trace {}: line 1 is not a trace line: ",
                path.display()
            )),
            "{text}"
        );
        let missing = dir.path().join("missing");
        let text = format!("{:#}", anyhow::Error::from(report(&missing).unwrap_err()));
        assert_eq!(
            text,
            format!(
                "opening the trace: {}: No such file or directory (os error 2)",
                missing.display()
            )
        );
        // A FIFO is refused, not waited on.
        let fifo = crate::test_files::fifo(dir.path(), "fifo");
        let text = format!("{:#}", anyhow::Error::from(report(&fifo).unwrap_err()));
        assert!(
            text.ends_with("fifo: not a regular file (a FIFO)"),
            "{text}"
        );
    }
}
