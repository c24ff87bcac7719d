//! What a long command shows while it works, and the `tracing` subscriber.
//!
//! Progress is drawn on stderr, where detvisor's progress always went
//! (stdout carries a command's results, which may be piped while a person
//! watches): on a terminal, an indicatif display redrawn in place (counts,
//! what is left of the budget, an ETA), with the lines that matter (a
//! finding, a warning) printed above it; when stderr is not a terminal
//! (a log file, CI), plain lines, one per event; with `--quiet`, nothing.
//! A verb drives a [`Reporter`] with its own counts ([`Reporter::update`])
//! and lines ([`Reporter::line`]).
//!
//! Diagnostics go through `tracing` (spans for a campaign's phases, events
//! for what it tells along the way), filtered by `RUST_LOG` (the
//! `tracing-subscriber` `EnvFilter` grammar, e.g. `RUST_LOG=fuzzer=debug`);
//! they are written above the display too.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::Duration;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

/// How a command shows its progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A display redrawn in place (stderr is a terminal).
    Display,
    /// One plain line per event (stderr is not a terminal).
    Lines,
    /// Nothing (`--quiet`).
    Quiet,
}

impl Mode {
    /// `--quiet` first, then whether stderr is a terminal.
    pub fn choose(quiet: bool, terminal: bool) -> Mode {
        match (quiet, terminal) {
            (true, _) => Mode::Quiet,
            (false, true) => Mode::Display,
            (false, false) => Mode::Lines,
        }
    }

    /// [`Mode::choose`] for this process's stderr.
    pub fn detect(quiet: bool) -> Mode {
        Mode::choose(quiet, std::io::stderr().is_terminal())
    }
}

/// Every display of this process, so that lines and `tracing` output are
/// written above them rather than through them.
fn displays() -> &'static MultiProgress {
    static DISPLAYS: OnceLock<MultiProgress> = OnceLock::new();
    DISPLAYS.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

/// Writes `bytes` to stderr above any display.
fn write_above(bytes: &[u8]) {
    displays().suspend(|| {
        let _ = std::io::stderr().write_all(bytes);
    });
}

/// The progress of one command.
pub struct Reporter {
    mode: Mode,
    display: Option<ProgressBar>,
}

impl Reporter {
    pub fn new(mode: Mode) -> Reporter {
        Reporter {
            mode,
            display: None,
        }
    }

    /// A line that matters (`detvisor: ...`): above the display, on its
    /// own without one, nowhere when quiet.
    pub fn line(&self, text: &str) {
        if self.mode != Mode::Quiet {
            write_above(format!("{text}\n").as_bytes());
        }
    }

    /// A line for plain-line mode only: on a terminal the display says it.
    pub fn event(&self, text: &str) {
        if self.mode == Mode::Lines {
            self.line(text);
        }
    }

    /// Starts (or restarts) the display at `position` of `total` (`None`:
    /// no known end, a spinner), with indicatif's ETA from the pace so far
    /// when `eta` (a caller that knows better says its own in the
    /// message); nothing but on a terminal.
    pub fn start(&mut self, total: Option<u64>, position: u64, eta: bool) {
        if self.mode != Mode::Display {
            return;
        }
        self.finish();
        let display = match total {
            Some(total) => ProgressBar::new(total).with_style(
                ProgressStyle::with_template(if eta {
                    "{spinner} [{bar:24}] {pos}/{len} ETA {eta} {wide_msg}"
                } else {
                    "{spinner} [{bar:24}] {pos}/{len} {wide_msg}"
                })
                .expect("a valid template")
                .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner().with_style(
                ProgressStyle::with_template("{spinner} {wide_msg}").expect("a valid template"),
            ),
        };
        display.set_position(position);
        let display = displays().add(display);
        display.enable_steady_tick(Duration::from_millis(250));
        self.display = Some(display);
    }

    /// The display's position and what it says.
    pub fn update(&self, position: u64, message: String) {
        if let Some(display) = &self.display {
            display.set_position(position);
            display.set_message(message);
        }
    }

    /// Clears the display (the command's closing lines follow).
    pub fn finish(&mut self) {
        if let Some(display) = self.display.take() {
            display.finish_and_clear();
            displays().remove(&display);
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A duration as people read it: `1h 02m`, `4m 05s`, `12s`.
pub fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m {:02}s", secs / 60, secs % 60),
        _ => format!("{}h {:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// What `tracing` shows without `RUST_LOG`: the campaign engine's notes
/// (e.g. `2 workers, a helper VM each`); nothing at all when quiet.
const DEFAULT_FILTER: &str = "fuzzer=info";

/// `tracing` output, written above any display.
struct AboveDisplays;

impl Write for AboveDisplays {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        write_above(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the process's `tracing` subscriber: `RUST_LOG`'s filter when
/// set (with the time since the start on each line, and a line at the
/// close of each span saying its busy and idle time: the phases' wall
/// time), else [`DEFAULT_FILTER`] (`quiet`: nothing). A `RUST_LOG`
/// that does not parse is said and ignored.
pub fn init_tracing(quiet: bool) {
    let from_env = std::env::var("RUST_LOG").ok().map(|text| {
        EnvFilter::try_new(&text).map_err(|e| format!("RUST_LOG={text:?}: {e}: ignored"))
    });
    let (filter, logging) = match from_env {
        Some(Ok(filter)) => (filter, true),
        other => {
            if let Some(Err(problem)) = other {
                eprintln!("detvisor: warning: {problem}");
            }
            let default = if quiet { "off" } else { DEFAULT_FILTER };
            (EnvFilter::new(default), false)
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| AboveDisplays);
    // A span's close says its busy and idle time only with a timer.
    let _ = if logging {
        builder
            .with_span_events(FmtSpan::CLOSE)
            .with_timer(tracing_subscriber::fmt::time::Uptime::default())
            .try_init()
    } else {
        builder.without_time().try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_quiet_then_the_terminal_chooses_the_mode() {
        assert_eq!(Mode::choose(true, true), Mode::Quiet);
        assert_eq!(Mode::choose(true, false), Mode::Quiet);
        assert_eq!(Mode::choose(false, true), Mode::Display);
        assert_eq!(Mode::choose(false, false), Mode::Lines);
    }

    #[test]
    fn test_durations_read_as_people_read_them() {
        assert_eq!(human(Duration::from_millis(12_900)), "12s");
        assert_eq!(human(Duration::from_secs(245)), "4m 05s");
        assert_eq!(human(Duration::from_secs(3720)), "1h 02m");
        assert_eq!(human(Duration::from_secs(8 * 3600)), "8h 00m");
    }

    /// Away from a terminal nothing is drawn: the display stays off.
    #[test]
    fn test_only_a_terminal_gets_a_display() {
        for mode in [Mode::Lines, Mode::Quiet] {
            let mut reporter = Reporter::new(mode);
            reporter.start(Some(10), 0, true);
            assert!(reporter.display.is_none(), "{mode:?}");
        }
    }
}
