//! Where an `up` run's node output and events go: prefixed lines on one
//! stream, raw bytes in per-node logs, event lines with their virtual time.

use crate::event::UpEvent;
use devices::VirtNanos;
use guest_agent::protocol::Stream;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

/// Why node output could not be kept or printed.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("creating the log directory {}", dir.display())]
    LogDirectory {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating {}", path.display())]
    CreateLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing a node log")]
    WriteLog(#[source] std::io::Error),
    /// Printing node output.
    #[error(transparent)]
    Print(#[from] std::io::Error),
}

type Result<T, E = OutputError> = std::result::Result<T, E>;

/// The longest line of node output printed as one (64 KiB, newline
/// included): a longer one is printed in pieces of this size, each on a
/// line of its own. The node logs keep the raw bytes.
pub const MAX_LINE: usize = 64 << 10;

/// The most a node log under `--logs` holds: 1 GiB. A guest can print
/// without end; past this the log gets one line saying so and nothing more
/// (the output is still printed, and a campaign keeps its own capped copy).
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// Prints node output line by line with the node's name in front, and keeps
/// each node's raw output in `<logs>/<node>.log`.
pub struct OutputSink {
    width: usize,
    partial: BTreeMap<(String, bool), Vec<u8>>,
    logs: Option<PathBuf>,
    files: BTreeMap<String, NodeLog>,
    log_limit: u64,
    out: Box<dyn Write>,
}

/// One node's log file and how much of it is written.
struct NodeLog {
    file: std::fs::File,
    written: u64,
}

impl NodeLog {
    /// Appends `data`, up to `limit` bytes in all; the first write past it
    /// adds a line that says the log ends there.
    fn append(&mut self, node: &str, data: &[u8], limit: u64) -> std::io::Result<()> {
        if self.written > limit {
            return Ok(());
        }
        let room = usize::try_from(limit - self.written).unwrap_or(usize::MAX);
        if data.len() <= room {
            self.file.write_all(data)?;
            self.written += data.len() as u64;
            return Ok(());
        }
        self.file.write_all(&data[..room])?;
        writeln!(
            self.file,
            "\n[detvisor: this log reached its limit of {limit} bytes; the rest of {node}'s output is not kept here]"
        )?;
        self.written = limit + 1;
        Ok(())
    }
}

impl OutputSink {
    pub fn new(names: &[String], logs: Option<PathBuf>, out: Box<dyn Write>) -> Result<Self> {
        if let Some(dir) = &logs {
            std::fs::create_dir_all(dir).map_err(|source| OutputError::LogDirectory {
                dir: dir.clone(),
                source,
            })?;
        }
        Ok(OutputSink {
            width: names.iter().map(String::len).max().unwrap_or(0).max(8),
            partial: BTreeMap::new(),
            logs,
            files: BTreeMap::new(),
            log_limit: MAX_LOG_BYTES,
            out,
        })
    }

    /// The same sink with node logs cut at `limit` bytes instead of
    /// [`MAX_LOG_BYTES`].
    pub fn with_log_limit(mut self, limit: u64) -> Self {
        self.log_limit = limit;
        self
    }

    /// A sink that drops everything.
    pub fn discard() -> Self {
        Self::new(&[], None, Box::new(std::io::sink()))
            .expect("without a log directory nothing can fail")
    }

    pub fn output(&mut self, node: &str, stream: Stream, data: &[u8]) -> Result<()> {
        if let Some(dir) = &self.logs {
            if !self.files.contains_key(node) {
                let path = dir.join(format!("{node}.log"));
                let file = std::fs::File::create(&path)
                    .map_err(|source| OutputError::CreateLog { path, source })?;
                let log = NodeLog { file, written: 0 };
                self.files.insert(node.to_string(), log);
            }
            let log = self.files.get_mut(node).expect("inserted above");
            log.append(node, data, self.log_limit)
                .map_err(OutputError::WriteLog)?;
        }
        let key = (node.to_string(), stream == Stream::Stderr);
        let buffer = self.partial.entry(key).or_default();
        // Only the new bytes are scanned, and a line is cut at MAX_LINE:
        // the host's work and memory stay linear in what the guest prints.
        let mut rest = data;
        while !rest.is_empty() {
            let room = MAX_LINE - buffer.len();
            let window = &rest[..rest.len().min(room)];
            let (taken, complete) = match window.iter().position(|&b| b == b'\n') {
                Some(end) => (end + 1, true),
                None => (window.len(), window.len() == room),
            };
            buffer.extend_from_slice(&rest[..taken]);
            rest = &rest[taken..];
            if complete {
                write!(self.out, "{node:>width$} | ", width = self.width)?;
                self.out.write_all(buffer)?;
                if buffer.last() != Some(&b'\n') {
                    writeln!(self.out)?;
                }
                buffer.clear();
            }
        }
        Ok(())
    }

    /// Forgets lines not complete yet (they belong to a history being left).
    pub fn drop_partial_lines(&mut self) {
        self.partial.clear();
    }

    /// Prints what is left without a final newline.
    pub fn flush(&mut self) -> Result<()> {
        for ((node, _), rest) in std::mem::take(&mut self.partial) {
            if !rest.is_empty() {
                write!(self.out, "{node:>width$} | ", width = self.width)?;
                self.out.write_all(&rest)?;
                writeln!(self.out)?;
            }
        }
        self.out.flush()?;
        Ok(())
    }
}

/// Called with each event (node started, fault, ...) and its time.
pub type EventSink = Box<dyn FnMut(VirtNanos, &UpEvent)>;

/// Where an `up` run's node output and events go.
pub struct UpOutput {
    pub sink: OutputSink,
    pub events: EventSink,
}

impl UpOutput {
    /// Node output to `out` (prefixed lines, no logs); event lines to
    /// `events` when given.
    pub fn plain(
        node_names: &[String],
        out: Box<dyn Write>,
        events: Option<Box<dyn Write>>,
    ) -> Result<Self> {
        let mut events = events;
        Ok(UpOutput {
            sink: OutputSink::new(node_names, None, out)?,
            events: Box::new(move |at, event| {
                if let Some(w) = &mut events {
                    // Event lines are for people; a closed stream loses none of the run.
                    let _ = writeln!(w, "{}", event_line(at, event));
                }
            }),
        })
    }
}

/// An event as one line for people, with its virtual time.
pub fn event_line(at: VirtNanos, event: &UpEvent) -> String {
    format!("detvisor: [{at}] {event}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let dir = file.path().join("logs");
        let e = OutputSink::new(&[], Some(dir.clone()), Box::new(std::io::sink()))
            .err()
            .unwrap();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            format!(
                "creating the log directory {}: Not a directory (os error 20)",
                dir.display()
            )
        );
    }

    #[test]
    fn test_output_sink_prefixes_whole_lines_and_logs_raw_bytes() {
        let dir = std::env::temp_dir().join(format!("detvisor-sink-{}", std::process::id()));
        let shared = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = OutputSink::new(
            &["n1".into()],
            Some(dir.clone()),
            Box::new(Shared(shared.clone())),
        )
        .unwrap();
        sink.output("n1", Stream::Stdout, b"hel").unwrap();
        sink.output("n1", Stream::Stdout, b"lo\nwor").unwrap();
        sink.output("n1", Stream::Stderr, b"oops\n").unwrap();
        sink.flush().unwrap();
        let printed = String::from_utf8(shared.lock().unwrap().clone()).unwrap();
        assert_eq!(
            printed,
            "      n1 | hello\n      n1 | oops\n      n1 | wor\n"
        );
        assert_eq!(
            std::fs::read(dir.join("n1.log")).unwrap(),
            b"hello\nworoops\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A node that prints without end fills its log to the limit and no
    /// further; the log says where it ends; other nodes' logs go on.
    #[test]
    fn test_a_node_log_stops_at_its_limit_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["n1".to_string(), "n2".to_string()];
        let mut sink = OutputSink::new(&names, Some(dir.path().into()), Box::new(std::io::sink()))
            .unwrap()
            .with_log_limit(10);
        sink.output("n1", Stream::Stdout, b"0123456").unwrap();
        sink.output("n1", Stream::Stdout, b"789abc").unwrap();
        for _ in 0..1000 {
            sink.output("n1", Stream::Stderr, b"more and more\n")
                .unwrap();
        }
        sink.output("n2", Stream::Stdout, b"fine\n").unwrap();
        sink.flush().unwrap();
        let n1 = std::fs::read_to_string(dir.path().join("n1.log")).unwrap();
        assert_eq!(
            n1,
            "0123456789\n[detvisor: this log reached its limit of 10 bytes; \
             the rest of n1's output is not kept here]\n"
        );
        let n2 = std::fs::read_to_string(dir.path().join("n2.log")).unwrap();
        assert_eq!(n2, "fine\n");
        assert_eq!(MAX_LOG_BYTES, 1 << 30);
    }

    #[test]
    fn test_a_line_without_newline_is_cut_at_max_line_and_the_buffer_bounded() {
        #[derive(Clone, Default)]
        struct Lines(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
        impl Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.borrow_mut().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let printed = Lines::default();
        let mut sink = OutputSink::new(&["n1".into()], None, Box::new(printed.clone())).unwrap();
        // 3.5 lines' worth without a newline, in chunks that do not divide MAX_LINE.
        let total = 3 * MAX_LINE + MAX_LINE / 2;
        for _ in 0..total / 1000 {
            sink.output("n1", Stream::Stdout, &[b'x'; 1000]).unwrap();
            assert!(sink.partial.values().all(|b| b.len() < MAX_LINE));
        }
        sink.output("n1", Stream::Stdout, &vec![b'x'; total % 1000])
            .unwrap();
        sink.output("n1", Stream::Stdout, b"\n").unwrap();
        let text = String::from_utf8(printed.0.borrow().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        let prefix = "      n1 | ";
        for line in &lines[..3] {
            assert_eq!(line.len(), prefix.len() + MAX_LINE, "a full piece");
        }
        assert_eq!(lines[3].len(), prefix.len() + MAX_LINE / 2);
        assert_eq!(text.matches('x').count(), total);
        // A line of exactly MAX_LINE bytes with its newline is one line.
        let mut exact = vec![b'y'; MAX_LINE - 1];
        exact.push(b'\n');
        printed.0.borrow_mut().clear();
        sink.output("n1", Stream::Stdout, &exact).unwrap();
        assert_eq!(printed.0.borrow().len(), prefix.len() + MAX_LINE);
    }
}
