//! The Antithesis test-composer conventions, host side: which command of a
//! template (`/opt/antithesis/test/v1/<name>/`) starts or is killed when.
//!
//! A pure state machine owned by the [`crate::conversation::Conductor`]: fed with the
//! template's command list (the agent lists it), the set-up signal and the
//! commands' starts and exits, it answers with [`Action`]s at
//! [`Composer::due`], the one place where the virtual time moves it on.
//! Every choice (which drivers, how many at once, how many rounds, when
//! `eventually_` starts, when an `anytime_` command runs again) is drawn
//! from the seeded stream [`vmm::entropy::stream::TEST_COMPOSER`], kept in
//! the serde state (a snapshot holds it, a branch re-keys it).
//!
//! The timeline (see docs/campaigns.md):
//! 1. after set-up, every `first_` command, one at a time, in name order,
//!    no faults;
//! 2. drivers, faults on: either one `singleton_driver_` alone, or rounds,
//!    each one `serial_driver_` alone or a batch of 1..=max
//!    `parallel_driver_` runs at once; `anytime_` commands run again and
//!    again meanwhile;
//! 3. at a drawn deadline (or once the rounds are done) the terminal
//!    command drawn among `eventually_` and `finally_`: `eventually_` kills
//!    everything still running, faults stop, it runs alone; `finally_`
//!    waits for everything to end by itself and runs (faults stopped) only
//!    if no started command was killed. Its end ends the timeline (without
//!    a terminal command, the end of the last command does).

use devices::{Persist, VirtNanos};
use guest_agent::protocol::ExitStatus;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use vmm::entropy::{stream, EntropyStream, EntropyStreamState};

/// The kinds of test commands, by file-name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    First,
    ParallelDriver,
    SerialDriver,
    SingletonDriver,
    Anytime,
    Eventually,
    Finally,
}

impl CommandKind {
    pub const ALL: [CommandKind; 7] = [
        CommandKind::First,
        CommandKind::ParallelDriver,
        CommandKind::SerialDriver,
        CommandKind::SingletonDriver,
        CommandKind::Anytime,
        CommandKind::Eventually,
        CommandKind::Finally,
    ];

    /// The kind's name, as in the file-name prefix (without the `_`).
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::First => "first",
            CommandKind::ParallelDriver => "parallel_driver",
            CommandKind::SerialDriver => "serial_driver",
            CommandKind::SingletonDriver => "singleton_driver",
            CommandKind::Anytime => "anytime",
            CommandKind::Eventually => "eventually",
            CommandKind::Finally => "finally",
        }
    }

    /// The kind of command file `file` (`None`: no recognized prefix).
    pub fn of(file: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| {
            file.strip_prefix(kind.name())
                .is_some_and(|rest| rest.starts_with('_'))
        })
    }

    fn is_driver(self) -> bool {
        matches!(
            self,
            CommandKind::ParallelDriver | CommandKind::SerialDriver | CommandKind::SingletonDriver
        )
    }
}

impl std::fmt::Display for CommandKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Files starting with this are the template's helpers, never run.
pub const HELPER_PREFIX: &str = "helper_";

/// Why a template cannot be run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error(
        "template {template:?} has no driver or anytime_ command (a file named \
         parallel_driver_*, serial_driver_*, singleton_driver_* or anytime_*): nothing to run \
         (commands: {commands:?})"
    )]
    NoDriver {
        template: String,
        commands: Vec<String>,
    },
}

/// What the composer asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start template command `command` as run `id`.
    Start {
        id: u32,
        command: String,
        kind: CommandKind,
    },
    /// Kill run `id` (its exit is reported as killed, not judged).
    Kill { id: u32 },
    /// Faults end for good: the terminal command is about to run.
    StopFaults,
    /// The timeline is over; `status` is the run's (the first nonzero exit
    /// of a command not killed, else 0).
    Finish { status: i32 },
}

/// One run of a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandRun {
    pub command: String,
    pub kind: CommandKind,
    /// The composer killed it (its exit is no verdict on it).
    pub killed: bool,
}

/// One step of the drivers' plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Round {
    /// These `parallel_driver_` runs at once.
    Parallel(Vec<String>),
    /// One driver alone (`serial_driver_` or `singleton_driver_`).
    Alone(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// The commands or the set-up signal are not known yet.
    Waiting,
    /// `first_` commands; `next` is the index of the next one to start.
    First {
        next: usize,
    },
    /// Drivers and `anytime_` commands, until `deadline`.
    Drivers {
        deadline: VirtNanos,
    },
    /// Nothing new starts; what runs ends (by itself, or killed), then the
    /// terminal command (if any) starts.
    WindingDown,
    /// The terminal command runs.
    Terminal,
    Done,
}

/// The longest the drivers' phase lasts (drawn in 2 s + 0..this).
const DRIVERS_SPREAD_MS: u64 = 10_000;
/// An `anytime_` command runs again after 0..this.
const ANYTIME_PAUSE_MS: u64 = 2_000;
/// The most driver rounds of a timeline.
const MAX_ROUNDS: u64 = 4;

/// The composer of one timeline. Its own saved state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Composer {
    template: String,
    max_parallel: u32,
    /// The seeded draws (see the module documentation).
    rng: EntropyStreamState,
    /// The template's commands and kinds, in name order (once listed).
    commands: Option<Vec<(String, CommandKind)>>,
    setup_complete: bool,
    phase: Phase,
    next_id: u32,
    running: BTreeMap<u32, CommandRun>,
    rounds: VecDeque<Round>,
    /// The terminal command drawn at the drivers' start.
    terminal: Option<String>,
    /// When each `anytime_` command starts again (while drivers run).
    anytime_at: BTreeMap<String, VirtNanos>,
    /// Some run was killed (so `finally_` may not run).
    killed_any: bool,
    first_failure: Option<i32>,
    faults_stopped: bool,
}

impl Composer {
    pub fn new(template: &str, max_parallel: u32, seed: u64) -> Self {
        Composer {
            template: template.to_owned(),
            max_parallel: max_parallel.max(1),
            rng: EntropyStream::new(seed, stream::TEST_COMPOSER).save(),
            commands: None,
            setup_complete: false,
            phase: Phase::Waiting,
            next_id: 1,
            running: BTreeMap::new(),
            rounds: VecDeque::new(),
            terminal: None,
            anytime_at: BTreeMap::new(),
            killed_any: false,
            first_failure: None,
            faults_stopped: false,
        }
    }

    pub fn template(&self) -> &str {
        &self.template
    }

    /// Draws from the run's seed (a run starts at a seed of its own).
    pub fn seed(&mut self, seed: u64) {
        self.rng = EntropyStream::new(seed, stream::TEST_COMPOSER).save();
    }

    /// An alternate history from exit `exit` with `seed` (a branch): the
    /// draws from here on come from `branch_key(seed, exit, TEST_COMPOSER)`.
    pub fn rekey(&mut self, seed: u64, exit: u64) {
        // A stream named `<name>@exit<N>` is keyed as `branch_key` keys it.
        let name = format!("{}@exit{exit}", stream::TEST_COMPOSER);
        self.rng = EntropyStream::new(seed, &name).save();
    }

    /// A draw in `0..n` (`n` > 0).
    fn draw(&mut self, n: u64) -> u64 {
        let mut rng = EntropyStream::from_state(&self.rng);
        let value = rng.next_u64() % n.max(1);
        self.rng = rng.save();
        value
    }

    fn pick(&mut self, names: &[String]) -> String {
        let index = self.draw(names.len() as u64) as usize;
        names[index].clone()
    }

    /// The template's files (as the agent listed them): `helper_` files and
    /// files of no known prefix are left out; without a driver or an
    /// `anytime_` command the template cannot run.
    pub fn set_commands(&mut self, files: &[String]) -> Result<(), TemplateError> {
        let mut commands: Vec<(String, CommandKind)> = files
            .iter()
            .filter(|f| !f.starts_with(HELPER_PREFIX))
            .filter_map(|f| Some((f.clone(), CommandKind::of(f)?)))
            .collect();
        commands.sort();
        if !commands
            .iter()
            .any(|(_, kind)| kind.is_driver() || *kind == CommandKind::Anytime)
        {
            return Err(TemplateError::NoDriver {
                template: self.template.clone(),
                commands: files.to_vec(),
            });
        }
        self.commands = Some(commands);
        Ok(())
    }

    /// The template's commands and kinds (once listed).
    pub fn commands(&self) -> Option<&[(String, CommandKind)]> {
        self.commands.as_deref()
    }

    /// The system under test said its set-up is complete.
    pub fn set_setup_complete(&mut self) {
        self.setup_complete = true;
    }

    /// Whether faults may happen now: while drivers run (not before the
    /// set-up is complete, during `first_`, nor once the terminal phase
    /// stopped them).
    pub fn faults_allowed(&self) -> bool {
        !self.faults_stopped && matches!(self.phase, Phase::Drivers { .. } | Phase::WindingDown)
    }

    /// Whether the faults were stopped for good.
    pub fn faults_stopped(&self) -> bool {
        self.faults_stopped
    }

    /// Run `id`, if it is running.
    pub fn run(&self, id: u32) -> Option<&CommandRun> {
        self.running.get(&id)
    }

    /// Run `id` ended: returns it (`killed` says whether the composer
    /// killed it). The next steps happen at [`Composer::due`].
    pub fn on_exited(&mut self, id: u32, status: ExitStatus) -> Option<CommandRun> {
        let run = self.running.remove(&id)?;
        if !run.killed && status != ExitStatus::Code(0) {
            self.first_failure.get_or_insert(status.shell_code());
        }
        if run.kind == CommandKind::Anytime {
            if let Phase::Drivers { .. } = self.phase {
                // Runs again later (drawn at the next `due`).
                self.anytime_at.remove(&run.command);
            }
        }
        Some(run)
    }

    /// The next virtual time at which [`Composer::due`] has something to do.
    pub fn next_wakeup(&self) -> Option<VirtNanos> {
        match &self.phase {
            Phase::Drivers { deadline } => self
                .anytime_at
                .values()
                .copied()
                .chain(std::iter::once(*deadline))
                .min(),
            _ => None,
        }
    }

    /// Moves the timeline on at `now`: what is to start, be killed, stop.
    pub fn due(&mut self, now: VirtNanos, out: &mut Vec<Action>) {
        // Each pass changes the phase or starts something; the loop ends
        // when a pass does nothing.
        loop {
            let before = (self.phase.clone(), self.running.len(), self.next_id);
            self.step(now, out);
            if (self.phase.clone(), self.running.len(), self.next_id) == before {
                return;
            }
        }
    }

    fn step(&mut self, now: VirtNanos, out: &mut Vec<Action>) {
        match self.phase.clone() {
            Phase::Waiting => {
                if self.setup_complete && self.commands.is_some() {
                    self.phase = Phase::First { next: 0 };
                }
            }
            Phase::First { next } => {
                if !self.running.is_empty() {
                    return;
                }
                let firsts = self.of_kind(CommandKind::First);
                match firsts.get(next) {
                    Some(command) => {
                        self.phase = Phase::First { next: next + 1 };
                        self.start(command.clone(), CommandKind::First, out);
                    }
                    None => self.begin_drivers(now),
                }
            }
            Phase::Drivers { deadline } => {
                if now >= deadline {
                    self.wind_down(out);
                    return;
                }
                let driver_running = self.running.values().any(|r| r.kind.is_driver());
                if !driver_running {
                    match self.rounds.pop_front() {
                        Some(Round::Parallel(commands)) => {
                            for command in commands {
                                self.start(command, CommandKind::ParallelDriver, out);
                            }
                        }
                        Some(Round::Alone(command)) => {
                            let kind = CommandKind::of(&command).expect("a driver's name");
                            self.start(command, kind, out);
                        }
                        None if self.has_drivers() => {
                            // Every round is done.
                            self.wind_down(out);
                            return;
                        }
                        None => {}
                    }
                }
                for command in self.of_kind(CommandKind::Anytime) {
                    if self.running.values().any(|r| r.command == command) {
                        continue;
                    }
                    match self.anytime_at.get(&command).copied() {
                        None => {
                            let pause = self.draw(ANYTIME_PAUSE_MS) * 1_000_000;
                            self.anytime_at
                                .insert(command, now.saturating_add(VirtNanos(pause)));
                        }
                        Some(at) if at <= now => {
                            self.anytime_at.remove(&command);
                            self.start(command, CommandKind::Anytime, out);
                        }
                        Some(_) => {}
                    }
                }
            }
            Phase::WindingDown => {
                if !self.running.is_empty() {
                    return;
                }
                let terminal = self.terminal.clone().filter(|t| {
                    CommandKind::of(t) == Some(CommandKind::Eventually) || !self.killed_any
                });
                match terminal {
                    Some(command) => {
                        let kind = CommandKind::of(&command).expect("a terminal's name");
                        self.phase = Phase::Terminal;
                        self.start(command, kind, out);
                    }
                    None => self.finish(out),
                }
            }
            Phase::Terminal => {
                if self.running.is_empty() {
                    self.finish(out);
                }
            }
            Phase::Done => {}
        }
    }

    fn finish(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Done;
        out.push(Action::Finish {
            status: self.first_failure.unwrap_or(0),
        });
    }

    fn has_drivers(&self) -> bool {
        self.commands
            .iter()
            .flatten()
            .any(|(_, kind)| kind.is_driver())
    }

    fn of_kind(&self, kind: CommandKind) -> Vec<String> {
        self.commands
            .iter()
            .flatten()
            .filter(|(_, k)| *k == kind)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Draws the drivers' plan, the terminal command and the deadline.
    fn begin_drivers(&mut self, now: VirtNanos) {
        let parallel = self.of_kind(CommandKind::ParallelDriver);
        let serial = self.of_kind(CommandKind::SerialDriver);
        let singleton = self.of_kind(CommandKind::SingletonDriver);
        let mut rounds = VecDeque::new();
        let others = !parallel.is_empty() || !serial.is_empty();
        if !singleton.is_empty() && (!others || self.draw(2) == 0) {
            rounds.push_back(Round::Alone(self.pick(&singleton)));
        } else if others {
            for _ in 0..1 + self.draw(MAX_ROUNDS) {
                let use_parallel = match (parallel.is_empty(), serial.is_empty()) {
                    (false, true) => true,
                    (true, false) => false,
                    _ => self.draw(2) == 0,
                };
                if use_parallel {
                    let count = 1 + self.draw(u64::from(self.max_parallel));
                    let batch = (0..count).map(|_| self.pick(&parallel)).collect();
                    rounds.push_back(Round::Parallel(batch));
                } else {
                    rounds.push_back(Round::Alone(self.pick(&serial)));
                }
            }
        }
        self.rounds = rounds;
        let mut terminals = self.of_kind(CommandKind::Eventually);
        terminals.extend(self.of_kind(CommandKind::Finally));
        terminals.sort();
        self.terminal = (!terminals.is_empty()).then(|| self.pick(&terminals));
        let spread = 2_000 + self.draw(DRIVERS_SPREAD_MS);
        self.phase = Phase::Drivers {
            deadline: now.saturating_add(VirtNanos(spread * 1_000_000)),
        };
    }

    /// The drivers' phase ends (at its deadline, or every round done).
    /// Before an `eventually_` command everything still running is killed;
    /// otherwise it is left to end by itself, nothing new starting.
    fn wind_down(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::WindingDown;
        self.anytime_at.clear();
        let eventually = self
            .terminal
            .as_deref()
            .is_some_and(|t| CommandKind::of(t) == Some(CommandKind::Eventually));
        if eventually {
            for (id, run) in self.running.iter_mut() {
                run.killed = true;
                self.killed_any = true;
                out.push(Action::Kill { id: *id });
            }
        }
        if self.terminal.is_some() {
            self.faults_stopped = true;
            out.push(Action::StopFaults);
        }
    }

    fn start(&mut self, command: String, kind: CommandKind, out: &mut Vec<Action>) {
        let id = self.next_id;
        self.next_id += 1;
        self.running.insert(
            id,
            CommandRun {
                command: command.clone(),
                kind,
                killed: false,
            },
        );
        out.push(Action::Start { id, command, kind });
    }
}

#[cfg(test)]
#[path = "composer_tests.rs"]
mod tests;
