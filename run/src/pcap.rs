//! `--pcap DIR`: every directed link's frames as a pcapng file,
//! `DIR/<from>.to.<to>.pcapng` (node names under `up`, `eth<i>` under
//! `run`; names hold no `.`), with virtual timestamps. The encoding is
//! [`devices::pcap`]; this is the writing. It only observes the switch
//! (see [`devices::FrameTap`]): a run with `--pcap` has the digest it has
//! without.
//!
//! A file is created when its link carries its first frame, so a link
//! that never carried one has no file. Write errors do not stop the run
//! (the run cannot depend on the host's disk); the first one is reported
//! by [`PcapRecorder::finish`].

use devices::pcap;
use devices::{FrameEvent, FrameTap, PortId};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Why the capture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error("creating the capture directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the capture {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the capture needs a network (no switch is attached)")]
    NoNetwork(#[source] devices::SwitchError),
}

/// The files of one capture, shared between the tap the devices hold and
/// the run that finishes it.
struct Files {
    dir: PathBuf,
    /// Each port's name, for file and interface names.
    names: BTreeMap<PortId, String>,
    open: BTreeMap<(PortId, PortId), (PathBuf, BufWriter<File>)>,
    first_error: Option<PcapError>,
}

impl Files {
    fn name(&self, port: PortId) -> String {
        self.names
            .get(&port)
            .cloned()
            .unwrap_or_else(|| format!("port{}", port.0))
    }

    fn record(&mut self, event: &FrameEvent) {
        if self.first_error.is_some() {
            return;
        }
        if let Err(error) = self.write(event) {
            self.first_error = Some(error);
        }
    }

    fn write(&mut self, event: &FrameEvent) -> Result<(), PcapError> {
        let link = (event.from, event.to);
        if !self.open.contains_key(&link) {
            let link_name = format!("{}.to.{}", self.name(event.from), self.name(event.to));
            let path = self.dir.join(format!("{link_name}.pcapng"));
            let write_error = |source| PcapError::Write {
                path: path.clone(),
                source,
            };
            let mut file = BufWriter::new(File::create(&path).map_err(write_error)?);
            file.write_all(&pcap::section_header())
                .and_then(|()| file.write_all(&pcap::interface(&link_name)))
                .map_err(write_error)?;
            self.open.insert(link, (path, file));
        }
        if let Some((path, file)) = self.open.get_mut(&link) {
            file.write_all(&pcap::packet(event))
                .map_err(|source| PcapError::Write {
                    path: path.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PcapError> {
        for (path, file) in self.open.values_mut() {
            file.flush().map_err(|source| PcapError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

fn lock(files: &Mutex<Files>) -> std::sync::MutexGuard<'_, Files> {
    files.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the devices hold: writes each event into its link's file.
struct Tap(Arc<Mutex<Files>>);

impl FrameTap for Tap {
    fn frame(&mut self, event: &FrameEvent) {
        lock(&self.0).record(event);
    }
}

/// A capture being written; [`PcapRecorder::finish`] ends it.
pub struct PcapRecorder(Arc<Mutex<Files>>);

impl PcapRecorder {
    /// Starts capturing `devices`' switch into `dir` (created if missing);
    /// `names[i]` names the NIC of [`devices::Devices::nic_ports`]`[i]`.
    pub fn attach(
        devices: &mut devices::Devices,
        dir: &Path,
        names: &[String],
    ) -> Result<Self, PcapError> {
        std::fs::create_dir_all(dir).map_err(|source| PcapError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let names = devices
            .nic_ports()
            .into_iter()
            .zip(names.iter().cloned())
            .collect();
        let files = Arc::new(Mutex::new(Files {
            dir: dir.to_path_buf(),
            names,
            open: BTreeMap::new(),
            first_error: None,
        }));
        devices
            .set_frame_tap(Some(Box::new(Tap(Arc::clone(&files)))))
            .map_err(PcapError::NoNetwork)?;
        Ok(PcapRecorder(files))
    }

    /// Flushes every file; the first error of the whole capture, if any.
    pub fn finish(self) -> Result<(), PcapError> {
        let mut files = lock(&self.0);
        if let Some(error) = files.first_error.take() {
            return Err(error);
        }
        files.flush()
    }
}

/// The names `run`'s NICs have in the guest: `eth0`, `eth1`, ...
pub fn plain_nic_names(nics: u8) -> Vec<String> {
    (0..nics).map(|i| format!("eth{i}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::switch::DropReason;
    use devices::VirtNanos;

    fn files(dir: &Path) -> Arc<Mutex<Files>> {
        Arc::new(Mutex::new(Files {
            dir: dir.to_path_buf(),
            names: [(PortId(2), "n1".into()), (PortId(3), "n2".into())].into(),
            open: BTreeMap::new(),
            first_error: None,
        }))
    }

    fn event(at: u64, from: usize, to: usize, dropped: Option<DropReason>) -> FrameEvent {
        FrameEvent {
            at: VirtNanos(at),
            from: PortId(from),
            to: PortId(to),
            dropped,
            frame: vec![at as u8; 60],
        }
    }

    #[test]
    fn test_pcap_one_file_per_directed_link_in_event_order() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();
        let files = files(dir.path());
        let mut tap = Tap(Arc::clone(&files));

        // Act
        tap.frame(&event(1, 2, 3, None));
        tap.frame(&event(2, 3, 2, Some(DropReason::Blocked)));
        tap.frame(&event(3, 2, 3, None));
        PcapRecorder(files).finish().unwrap();

        // Assert
        let forward = std::fs::read(dir.path().join("n1.to.n2.pcapng")).unwrap();
        let back = std::fs::read(dir.path().join("n2.to.n1.pcapng")).unwrap();
        let header = [pcap::section_header(), pcap::interface("n1.to.n2")].concat();
        let expected = [
            header,
            pcap::packet(&event(1, 2, 3, None)),
            pcap::packet(&event(3, 2, 3, None)),
        ]
        .concat();
        assert_eq!(forward, expected);
        assert!(back.ends_with(&pcap::packet(&event(2, 3, 2, Some(DropReason::Blocked)))));
    }

    #[test]
    fn test_pcap_write_error_is_kept_for_finish() {
        // Arrange: the directory is gone before the first frame.
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let files = files(&gone);
        let mut tap = Tap(Arc::clone(&files));

        // Act
        tap.frame(&event(1, 2, 3, None));
        tap.frame(&event(2, 2, 3, None));
        let error = PcapRecorder(files).finish().unwrap_err();

        // Assert
        assert!(
            error.to_string().contains("gone/n1.to.n2.pcapng"),
            "{error}"
        );
    }
}
