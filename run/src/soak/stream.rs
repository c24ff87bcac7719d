//! A run's exit records against the stored reference, as they are made: the
//! reference run writes each of its records to a file; a later run reads the
//! reference's records alongside its own and keeps only the first place
//! they differ. Neither keeps records in memory, so a run of a million exits
//! costs a buffered file, not a vector of them.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use vmm::record::{Divergence, ExitRecord, RECORD_BYTES};
use vmm::trace::ExitObserver;

/// Why records could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("reference records {}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("reference records {}: record {position} is no exit record", path.display())]
    BadRecord { path: PathBuf, position: u64 },
}

/// The state both observers share with their owner (the session holds the
/// observer; the soak reads the state back once the run ends).
fn lock<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Writing {
    path: PathBuf,
    out: BufWriter<File>,
    count: u64,
    error: Option<std::io::Error>,
}

/// Writes every record of the reference run to a file.
#[derive(Clone)]
pub struct RecordWriter(Arc<Mutex<Writing>>);

impl RecordWriter {
    pub fn create(path: &Path) -> Result<RecordWriter, StreamError> {
        let file = File::create(path).map_err(|source| StreamError::Io {
            path: path.to_path_buf(),
            what: "creating",
            source,
        })?;
        Ok(RecordWriter(Arc::new(Mutex::new(Writing {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            count: 0,
            error: None,
        }))))
    }

    pub fn observer(&self) -> Box<dyn ExitObserver> {
        Box::new(self.clone())
    }

    /// Flushes and syncs the file; how many records it holds.
    pub fn finish(self) -> Result<u64, StreamError> {
        let mut writing = lock(&self.0);
        let result = match writing.error.take() {
            Some(error) => Err(error),
            None => writing
                .out
                .flush()
                .and_then(|()| writing.out.get_ref().sync_data()),
        };
        result.map_err(|source| StreamError::Io {
            path: writing.path.clone(),
            what: "writing",
            source,
        })?;
        Ok(writing.count)
    }
}

impl ExitObserver for RecordWriter {
    fn exit(&mut self, record: &ExitRecord, _device: Option<&str>) {
        let mut writing = lock(&self.0);
        if writing.error.is_none() {
            if let Err(e) = writing.out.write_all(&record.to_bytes()) {
                writing.error = Some(e);
            }
        }
        writing.count += 1;
    }
}

struct Comparing {
    path: PathBuf,
    reference: BufReader<File>,
    /// Records of this run so far.
    count: u64,
    /// Records the reference holds.
    reference_count: u64,
    first: Option<Divergence>,
    error: Option<StreamError>,
}

impl Comparing {
    /// The reference's record at `self.count` (the next one unread).
    fn next_reference(&mut self) -> Result<Option<ExitRecord>, StreamError> {
        if self.count >= self.reference_count {
            return Ok(None);
        }
        let mut bytes = [0u8; RECORD_BYTES];
        self.reference
            .read_exact(&mut bytes)
            .map_err(|source| StreamError::Io {
                path: self.path.clone(),
                what: "reading",
                source,
            })?;
        ExitRecord::from_bytes(&bytes)
            .map(Some)
            .ok_or_else(|| StreamError::BadRecord {
                path: self.path.clone(),
                position: self.count,
            })
    }

    fn hear(&mut self, record: &ExitRecord) -> Result<(), StreamError> {
        if self.first.is_none() {
            match self.next_reference()? {
                Some(reference) if reference == *record => {}
                Some(reference) => {
                    self.first = Some(Divergence::Record {
                        position: self.count as usize,
                        left: reference,
                        right: *record,
                    })
                }
                // Longer than the reference: its length is known at the end.
                None => {
                    self.first = Some(Divergence::Length {
                        left: self.reference_count as usize,
                        right: 0,
                        next: Some(*record),
                    })
                }
            }
        }
        self.count += 1;
        Ok(())
    }
}

/// Compares every record of a run with the reference's, in order.
#[derive(Clone)]
pub struct RecordComparator(Arc<Mutex<Comparing>>);

impl RecordComparator {
    pub fn open(path: &Path) -> Result<RecordComparator, StreamError> {
        let io = |what| {
            let path = path.to_path_buf();
            move |source| StreamError::Io { path, what, source }
        };
        let file = File::open(path).map_err(io("opening"))?;
        let len = file.metadata().map_err(io("reading"))?.len();
        Ok(RecordComparator(Arc::new(Mutex::new(Comparing {
            path: path.to_path_buf(),
            reference: BufReader::with_capacity(1 << 20, file),
            count: 0,
            reference_count: len / RECORD_BYTES as u64,
            first: None,
            error: None,
        }))))
    }

    pub fn observer(&self) -> Box<dyn ExitObserver> {
        Box::new(self.clone())
    }

    /// The first place the run's records differ from the reference's, if
    /// they do, once the run ended.
    pub fn finish(self) -> Result<Option<Divergence>, StreamError> {
        let mut comparing = lock(&self.0);
        if let Some(error) = comparing.error.take() {
            return Err(error);
        }
        let count = comparing.count as usize;
        if let Some(Divergence::Length { right, .. }) = &mut comparing.first {
            *right = count;
        }
        if comparing.first.is_none() && comparing.count < comparing.reference_count {
            let next = comparing.next_reference()?;
            comparing.first = Some(Divergence::Length {
                left: comparing.reference_count as usize,
                right: count,
                next,
            });
        }
        Ok(comparing.first.take())
    }
}

impl ExitObserver for RecordComparator {
    fn exit(&mut self, record: &ExitRecord, _device: Option<&str>) {
        let mut comparing = lock(&self.0);
        if comparing.error.is_none() {
            if let Err(e) = comparing.hear(record) {
                comparing.error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::exit::ExitKind;
    use vmm::record::{first_divergence, NO_HASH, NO_VECTOR};
    use vmm::VirtNanos;

    fn record(index: u64) -> ExitRecord {
        ExitRecord {
            index,
            time: VirtNanos(index * 10),
            kind: ExitKind::IoIn,
            address: 0x61,
            data: index,
            size: 1,
            rip: 0x1000 + index,
            regs_hash: index * 3,
            injected: NO_VECTOR,
            device_hash: NO_HASH,
            memory_hash: NO_HASH,
        }
    }

    /// The streamed comparison of `run` with `reference` (written as a
    /// reference run writes it).
    fn streamed(reference: &[ExitRecord], run: &[ExitRecord]) -> Option<Divergence> {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("records");
        let writer = RecordWriter::create(&path).unwrap();
        let mut observer = writer.observer();
        reference.iter().for_each(|r| observer.exit(r, None));
        drop(observer);
        assert_eq!(writer.finish().unwrap(), reference.len() as u64);
        let comparator = RecordComparator::open(&path).unwrap();
        let mut observer = comparator.observer();
        run.iter().for_each(|r| observer.exit(r, None));
        drop(observer);
        comparator.finish().unwrap()
    }

    #[test]
    fn test_streaming_finds_what_comparing_in_memory_finds() {
        let reference: Vec<_> = (0..1000).map(record).collect();
        let mut changed = reference.clone();
        changed[700].data ^= 4;
        changed[900].rip = 0;
        let shorter = reference[..640].to_vec();
        let mut longer = reference.clone();
        longer.extend((1000..1003).map(record));
        for run in [reference.clone(), changed, shorter, longer] {
            assert_eq!(
                streamed(&reference, &run),
                first_divergence(&reference, &run),
                "a run of {} records",
                run.len()
            );
        }
        assert_eq!(streamed(&reference, &reference), None);
    }
}
