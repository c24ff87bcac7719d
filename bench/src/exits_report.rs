//! The `bench exits` report: each scenario's systems summarized, the ratios against the goals,
//! the tables and the final JSON line.

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

use super::{ExitsArgs, Scenario, System};
use crate::exits_worker::{Cell, ExitsRun, ExitsWorkerReport, ScenarioPlan, EXIT_PATH_SELECTABLE};
use crate::machine::HostLoad;
use crate::report::{run_failures, RunTimes, Session, Where, NOT_MEASURED};
use crate::stats::{fmt_s, median_u64, opt_count, opt_ratio, ratio};
use helper_vm::Placement;
use vmm::VirtNanos;

/// Issue 12's goals: at least this many times fewer exits with the new path on partition ...
pub const EXITS_GOAL: f64 = 3.0;
/// ... and detvisor (new path) at most this many times QEMU-KVM's wall time.
pub const WALL_GOAL: f64 = 1.2;

const NOT_SELECTABLE: &str = "the run library cannot select the exit path yet (no \
    `exit_path` in GuestSpec/UpOptions): \"old\" ran the library's default path, like \"new\"";

const BASELINE_DIFFERENCES: &str = "QEMU-KVM runs the same kernel (bzImage) and initrd bytes; \
    for the etcd scenarios with bench etcd's script in place of the agent (a bridge with veths \
    instead of detvisor's switch, no link latency; the partition is n1's bridge port down), for \
    boot with the same command; its guest time is real time, so virtual = wall";

#[derive(Serialize, Default, Debug)]
pub struct SystemSummary {
    pub system: Option<System>,
    pub name: String,
    #[serde(flatten)]
    pub times: RunTimes,
    /// Median exits of the successful runs (QEMU-KVM: none counted).
    pub exits: Option<u64>,
    pub exits_per_virtual_s: Option<f64>,
    /// Median of each kind over the successful runs.
    pub exits_by_kind: BTreeMap<String, u64>,
    /// Medians of the KVM statistics of the runs' VMs (`exits`, `io_exits`, ...; debugfs of the
    /// kernel the runs are on), when read.
    pub kvm: BTreeMap<String, u64>,
    /// `kvm["exits"]` per virtual second (QEMU-KVM's exit rate, the physical limit's).
    pub kvm_exits_per_virtual_s: Option<f64>,
    /// detvisor's `vm::run` (median, ms).
    pub inner_wall_ms: Option<u64>,
    /// Whether every successful run gave the same output (at least 2 of them).
    pub identical: Option<bool>,
    pub outputs: Vec<Option<String>>,
    /// The clocksource(s) the guest reported, `/`-joined when runs differ.
    pub clocksource: Option<String>,
    /// The kernel's messages about clocks of the first run that has some (QEMU).
    pub clock_log: Vec<String>,
    pub workload_tail: Option<String>,
    pub error: Option<String>,
    pub failures: Vec<String>,
    pub command: Vec<String>,
}

pub fn summarize(cell: &Cell) -> SystemSummary {
    let ok: Vec<&ExitsRun> = cell.runs.iter().filter(|r| r.ok).collect();
    let times = RunTimes::of(cell.runs.iter().map(|r| (r.ok, r.wall_ms, r.virtual_ns)));
    let exits = median_u64(ok.iter().filter_map(|r| r.exits));
    let virtual_s = times.virtual_s;
    let medians = |maps: Vec<&BTreeMap<String, u64>>| -> BTreeMap<String, u64> {
        let keys: std::collections::BTreeSet<&String> =
            maps.iter().flat_map(|m| m.keys()).collect();
        keys.into_iter()
            .filter_map(|k| {
                median_u64(maps.iter().map(|m| m.get(k).copied().unwrap_or(0)))
                    .map(|v| (k.clone(), v))
            })
            .collect()
    };
    let exits_by_kind = medians(ok.iter().map(|r| &r.exits_by_kind).collect());
    let kvm = medians(ok.iter().filter_map(|r| r.kvm.as_ref()).collect());
    let outputs: Vec<&String> = ok.iter().filter_map(|r| r.output.as_ref()).collect();
    let mut sources: Vec<&str> = ok.iter().filter_map(|r| r.clocksource.as_deref()).collect();
    sources.dedup();
    let mut error = cell.error.clone();
    if error.is_none() && !cell.runs.is_empty() && ok.is_empty() {
        error = Some("every run failed".into());
    }
    SystemSummary {
        system: Some(cell.system),
        name: cell.system.name().into(),
        times,
        exits,
        exits_per_virtual_s: ratio(exits.map(|e| e as f64), virtual_s),
        exits_by_kind,
        kvm_exits_per_virtual_s: ratio(kvm.get("exits").map(|&e| e as f64), virtual_s),
        kvm,
        inner_wall_ms: median_u64(ok.iter().filter_map(|r| r.inner_wall_ms)),
        identical: (outputs.len() >= 2).then(|| outputs.iter().all(|o| *o == outputs[0])),
        outputs: cell.runs.iter().map(|r| r.output.clone()).collect(),
        clocksource: (!sources.is_empty()).then(|| sources.join("/")),
        clock_log: cell
            .runs
            .iter()
            .map(|r| r.clock_log.clone())
            .find(|l| !l.is_empty())
            .unwrap_or_default(),
        workload_tail: ok
            .first()
            .copied()
            .or(cell.runs.first())
            .and_then(|r| r.workload_tail.clone()),
        error,
        failures: run_failures(cell.runs.iter().map(|r| r.error.as_ref())),
        command: cell.command.clone(),
    }
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Ratios {
    pub exits_old_over_new: Option<f64>,
    pub wall_old_over_new: Option<f64>,
    pub new_over_qemu_kvm_wall: Option<f64>,
    /// Exits old/new against [`EXITS_GOAL`] (partition only).
    pub exits_goal_met: Option<bool>,
    /// detvisor new / QEMU-KVM against [`WALL_GOAL`].
    pub wall_goal_met: Option<bool>,
}

pub fn ratios(
    scenario: Scenario,
    new: &SystemSummary,
    old: &SystemSummary,
    kvm: &SystemSummary,
) -> Ratios {
    let exits_old_over_new = ratio(old.exits.map(|e| e as f64), new.exits.map(|e| e as f64));
    let new_over_qemu_kvm_wall = ratio(new.times.median_s, kvm.times.median_s);
    Ratios {
        exits_old_over_new,
        wall_old_over_new: ratio(old.times.median_s, new.times.median_s),
        new_over_qemu_kvm_wall,
        exits_goal_met: (scenario == Scenario::Partition)
            .then_some(exits_old_over_new)
            .flatten()
            .map(|r| r >= EXITS_GOAL),
        wall_goal_met: new_over_qemu_kvm_wall.map(|r| r <= WALL_GOAL),
    }
}

#[derive(Serialize, Debug)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    pub what: &'static str,
    pub mem: String,
    pub systems: Vec<SystemSummary>,
    pub ratios: Ratios,
}

#[derive(Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    pub runs: u32,
    pub seed: u64,
    /// As `--until` reads it back (`300s`).
    #[serde(serialize_with = "crate::report::as_text")]
    pub until: VirtNanos,
    pub cmdline: String,
    pub qemu_cmdline: String,
    pub qemu_cpu: String,
    /// "debugfs" when the runs' KVM statistics were read, else why not.
    pub kvm_stats: Option<String>,
    #[serde(flatten)]
    pub place: Where,
    pub caveat: Option<String>,
    /// Whether "old" really ran the old exit path.
    pub exit_path_selectable: bool,
    pub clock: &'static str,
    pub baseline_differences: &'static str,
    pub goals: String,
    pub scenarios: Vec<ScenarioReport>,
    pub helper_vm: Option<Session>,
    pub worker_error: Option<String>,
    #[serde(flatten)]
    pub host: HostLoad,
    pub all_ok: bool,
}

pub struct Inputs<'a> {
    pub args: &'a ExitsArgs,
    pub cmdline: &'a str,
    pub qemu_cmdline: &'a str,
    pub placement: &'a Placement,
    pub scenarios: &'a [ScenarioPlan],
    /// `None`: the helper VM session failed.
    pub worker: Option<ExitsWorkerReport>,
    pub session: Option<Session>,
    pub loadavg_before: Option<[f64; 3]>,
}

pub fn build(i: Inputs) -> Report {
    let worker_error = i.worker.as_ref().and_then(|w| w.error.clone());
    let scenarios: Vec<ScenarioReport> = i
        .scenarios
        .iter()
        .map(|plan| {
            let systems: Vec<SystemSummary> = System::ALL
                .iter()
                .map(|&system| {
                    let cell = i.worker.as_ref().and_then(|w| {
                        w.cells
                            .iter()
                            .find(|c| c.scenario == plan.scenario && c.system == system)
                    });
                    match cell {
                        Some(c) => summarize(c),
                        None => summarize(&Cell {
                            scenario: plan.scenario,
                            system,
                            runs: Vec::new(),
                            command: Vec::new(),
                            error: Some(worker_error.clone().unwrap_or(NOT_MEASURED.into())),
                        }),
                    }
                })
                .collect();
            ScenarioReport {
                scenario: plan.scenario,
                what: plan.scenario.describe(),
                mem: plan.mem.clone(),
                ratios: ratios(plan.scenario, &systems[0], &systems[1], &systems[2]),
                systems,
            }
        })
        .collect();
    let all_ok = scenarios
        .iter()
        .flat_map(|s| &s.systems)
        .all(|s| s.error.is_none() && s.times.all_ok())
        && i.session.as_ref().is_none_or(|s| s.error.is_none())
        && worker_error.is_none();
    Report {
        benchmark: "exits",
        runs: i.args.runs,
        seed: i.args.seed,
        until: i.args.until,
        cmdline: i.cmdline.into(),
        qemu_cmdline: i
            .worker
            .as_ref()
            .map(|w| w.qemu_cmdline.clone())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| i.qemu_cmdline.into()),
        qemu_cpu: i.args.qemu_cpu.clone(),
        kvm_stats: i.worker.as_ref().map(|w| w.kvm_stats.clone()),
        place: Where::from(i.placement),
        caveat: i.placement.in_helper_vm().then(|| {
            "detvisor and QEMU-KVM run in nested KVM inside the helper VM, itself QEMU TCG \
             (this host's KVM cannot run guests): exits cost far more than on hardware"
                .to_string()
        }),
        exit_path_selectable: EXIT_PATH_SELECTABLE,
        clock: "wall time from just before spawn() to wait() returning (QEMU), from just before \
                the run's thread starts to the request's return (detvisor, in process), \
                CLOCK_MONOTONIC of the machine it runs on (L1's for the helper VM)",
        baseline_differences: BASELINE_DIFFERENCES,
        goals: format!(
            "exits old/new >= {EXITS_GOAL}x on partition; detvisor new / QEMU-KVM wall <= \
             {WALL_GOAL}x"
        ),
        scenarios,
        helper_vm: i.session,
        worker_error,
        host: HostLoad::since(i.loadavg_before),
        all_ok,
    }
}

/// Virtual seconds: milliseconds shown, microseconds below 0.1 s (a boot is ~0.2 ms of
/// detvisor's virtual time).
fn virtual_secs(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 0.1 => format!("{v:.6}"),
        Some(v) => format!("{v:.3}"),
    }
}

fn goal(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "n/a",
    }
}

/// One scenario's table, exits by kind and ratios.
pub fn write_scenario(o: &mut dyn Write, s: &ScenarioReport) -> io::Result<()> {
    writeln!(o, "== {}: {} ({} RAM)", s.scenario.name(), s.what, s.mem)?;
    writeln!(
        o,
        "{:<26} {:>5} {:<22} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} clocksource",
        "system",
        "ok",
        "wall s per run",
        "median",
        "virtual",
        "exits",
        "exits/vs",
        "KVM exits",
        "identical",
    )?;
    for m in &s.systems {
        writeln!(
            o,
            "{:<26} {:>5} {:<22} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {}",
            m.name,
            m.times.tally(),
            m.times.per_run(),
            fmt_s(m.times.median_s),
            virtual_secs(m.times.virtual_s),
            opt_count(m.exits),
            m.exits_per_virtual_s
                .map_or("n/a".into(), |v| format!("{v:.0}")),
            opt_count(m.kvm.get("exits").copied()),
            match m.identical {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "n/a",
            },
            m.clocksource.as_deref().unwrap_or("-"),
        )?;
    }
    let (new, old) = (&s.systems[0], &s.systems[1]);
    let kinds: std::collections::BTreeSet<&String> = new
        .exits_by_kind
        .keys()
        .chain(old.exits_by_kind.keys())
        .collect();
    if !kinds.is_empty() {
        writeln!(o, "  exits by kind (median)       new        old")?;
        for k in kinds {
            let v = |m: &SystemSummary| opt_count(m.exits_by_kind.get(k).copied());
            writeln!(o, "    {k:<24} {:>9} {:>10}", v(new), v(old))?;
        }
    }
    let kvm_kinds: std::collections::BTreeSet<&String> =
        s.systems.iter().flat_map(|m| m.kvm.keys()).collect();
    if !kvm_kinds.is_empty() {
        writeln!(
            o,
            "  KVM statistics (median)      new        old   QEMU-KVM"
        )?;
        for k in kvm_kinds {
            let v = |m: &SystemSummary| opt_count(m.kvm.get(k).copied());
            writeln!(
                o,
                "    {k:<24} {:>9} {:>10} {:>10}",
                v(&s.systems[0]),
                v(&s.systems[1]),
                v(&s.systems[2])
            )?;
        }
        let rate = |m: &SystemSummary| {
            m.kvm_exits_per_virtual_s
                .map_or("n/a".into(), |v| format!("{v:.0}"))
        };
        writeln!(
            o,
            "    {:<24} {:>9} {:>10} {:>10}",
            "exits per virtual s",
            rate(&s.systems[0]),
            rate(&s.systems[1]),
            rate(&s.systems[2])
        )?;
    }
    for m in &s.systems {
        if !m.clock_log.is_empty() {
            writeln!(o, "  {}: the kernel on clocks:", m.name)?;
            for l in &m.clock_log {
                writeln!(o, "    {l}")?;
            }
        }
    }
    // What each system's workload said last: the same work done? (Fewer exits for less work is
    // no gain.)
    for m in &s.systems {
        if let Some(last) = m
            .workload_tail
            .as_deref()
            .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()))
        {
            writeln!(o, "  {:<26} ends: {}", m.name, last.trim())?;
        }
    }
    let r = &s.ratios;
    let exits_goal = if s.scenario == Scenario::Partition {
        format!(" (goal >= {EXITS_GOAL}x: {})", goal(r.exits_goal_met))
    } else {
        String::new()
    };
    writeln!(
        o,
        "  ratios: exits old/new {}{exits_goal}; wall old/new {}; detvisor new / QEMU-KVM wall \
         {} (goal <= {WALL_GOAL}x: {})",
        opt_ratio(r.exits_old_over_new),
        opt_ratio(r.wall_old_over_new),
        opt_ratio(r.new_over_qemu_kvm_wall),
        goal(r.wall_goal_met)
    )
}

/// Everything but the failures and the JSON line.
pub fn write_report(o: &mut dyn Write, r: &Report) -> io::Result<()> {
    writeln!(
        o,
        "detvisor bench exits: {} scenario(s), {} run(s) per system; detvisor seed {}, etcd \
         runs until {}; QEMU-KVM -cpu {}",
        r.scenarios.len(),
        r.runs,
        r.seed,
        r.until,
        r.qemu_cpu
    )?;
    if r.qemu_cmdline == r.cmdline {
        writeln!(o, "kernel cmdline (all): {}", r.cmdline)?;
    } else {
        writeln!(o, "kernel cmdline (detvisor): {}", r.cmdline)?;
        writeln!(o, "kernel cmdline (QEMU-KVM): {}", r.qemu_cmdline)?;
    }
    writeln!(o, "{}", r.host.line())?;
    if let Some(c) = &r.caveat {
        writeln!(o, "CAVEAT: {c}")?;
    }
    if !r.exit_path_selectable {
        writeln!(o, "CAVEAT: {NOT_SELECTABLE}")?;
    }
    writeln!(
        o,
        "wall = QEMU: process start to exit; detvisor: the request's call to its return (in \
         process); seconds on the clock of the machine running it ({}); virtual = guest time \
         at the end; exits/vs = exits per virtual second; ! = failed run",
        r.place.placement
    )?;
    for s in &r.scenarios {
        writeln!(o)?;
        write_scenario(o, s)?;
    }
    writeln!(o, "\ngoals: {}", r.goals)?;
    if let Some(s) = r.helper_vm.as_ref() {
        writeln!(
            o,
            "helper VM: boot {} s, shutdown {} s, whole session {} s (not in the wall times)",
            fmt_s(s.boot_ms.map(|v| v / 1000.0)),
            fmt_s(s.shutdown_ms.map(|v| v / 1000.0)),
            fmt_s(Some(s.total_ms / 1000.0))
        )?;
    }
    writeln!(o, "QEMU-KVM: {}", r.baseline_differences)?;
    writeln!(
        o,
        "KVM exits: the KVM statistics of each run's VM ({}), counted by the kernel the runs \
         are on (for detvisor besides its own exits: KVM also exits for itself)",
        r.kvm_stats.as_deref().unwrap_or("not read")
    )?;
    Ok(())
}

pub fn print(r: &Report) -> Result<()> {
    let mut o = io::stdout().lock();
    write_report(&mut o, r)?;
    let names: Vec<String> = r
        .scenarios
        .iter()
        .flat_map(|s| {
            s.systems
                .iter()
                .map(move |m| format!("{} {}", s.scenario.name(), m.name))
        })
        .collect();
    let systems: Vec<(&str, Option<&String>, &[String])> = r
        .scenarios
        .iter()
        .flat_map(|s| &s.systems)
        .zip(&names)
        .map(|(m, n)| (n.as_str(), m.error.as_ref(), m.failures.as_slice()))
        .collect();
    let helper_error = r
        .helper_vm
        .as_ref()
        .and_then(|s| s.error.as_ref())
        .or(r.worker_error.as_ref());
    crate::boot_report::print_tail(&mut o, &systems, helper_error, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use helper_vm::HostVmMode;

    fn run(wall_s: f64, exits: u64, hlt: u64, digest: &str, source: &str) -> ExitsRun {
        ExitsRun {
            ok: true,
            wall_ms: wall_s * 1000.0,
            status: Some(0),
            virtual_ns: Some(VirtNanos(43_500_000_000)),
            exits: Some(exits),
            exits_by_kind: BTreeMap::from([
                ("Hlt".to_string(), hlt),
                ("IoOut".to_string(), exits - hlt),
            ]),
            output: Some(digest.into()),
            clocksource: Some(source.into()),
            kvm: Some(BTreeMap::from([("exits".to_string(), 2 * exits)])),
            ..ExitsRun::default()
        }
    }

    fn cell(system: System, runs: Vec<ExitsRun>) -> Cell {
        Cell {
            scenario: Scenario::Partition,
            system,
            runs,
            command: vec!["x".into()],
            error: None,
        }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ExitsArgs,
    }

    fn report() -> Report {
        let args = Cli::parse_from(["x", "--runs", "2", "--scenarios", "partition"]).args;
        assert_eq!(args.scenarios, [Scenario::Partition]);
        assert_eq!(args.host_vm, HostVmMode::Auto);
        let plan: ScenarioPlan = serde_json::from_value(serde_json::json!({
            "scenario": "partition", "mem": "1G", "ram_bytes": 1u64 << 30,
            "guest": {"Plain": {"kernel": "k", "initrd": "i"}},
            "bzimage": "b", "qemu_initrd": "q", "rtc_epoch": 0, "error": null, "qemu_error": null
        }))
        .unwrap();
        let mut kvm_fail = run(0.5, 1, 1, "f", "tsc");
        kvm_fail.ok = false;
        kvm_fail.error = Some("QEMU exited with status 1".into());
        let worker = ExitsWorkerReport {
            cells: vec![
                cell(
                    System::DetvisorNew,
                    vec![
                        run(100.0, 40_000, 30_000, "d1", "detvisor"),
                        run(110.0, 40_000, 30_000, "d1", "detvisor"),
                    ],
                ),
                cell(
                    System::DetvisorOld,
                    vec![
                        run(300.0, 160_000, 60_000, "d2", "hpet"),
                        run(320.0, 160_000, 60_000, "d3", "hpet"),
                    ],
                ),
                cell(System::QemuKvm, vec![kvm_run(), kvm_fail]),
            ],
            ..ExitsWorkerReport::default()
        };
        build(Inputs {
            args: &args,
            cmdline: "console=ttyS0",
            qemu_cmdline: "console=ttyS0",
            placement: &Placement::HelperVm {
                reason: "test".into(),
            },
            scenarios: &[plan],
            worker: Some(worker),
            session: None,
            loadavg_before: None,
        })
    }

    /// A system's summary is written as it always was (the JSON line of `bench exits`).
    #[test]
    fn a_summary_serializes_as_before() {
        let failed = ExitsRun {
            wall_ms: 500.0,
            error: Some("boom".into()),
            ..ExitsRun::default()
        };
        let summary = summarize(&cell(
            System::DetvisorNew,
            vec![run(2.0, 100, 40, "d1", "tsc"), failed],
        ));
        let json = r#"{"system":"detvisor-new","name":"detvisor new (clock page)","runs":2,"ok_runs":1,"wall_s":[2.0,0.5],"ok":[true,false],"median_s":2.0,"min_s":2.0,"max_s":2.0,"virtual_s":43.5,"exits":100,"exits_per_virtual_s":2.2988505747126435,"exits_by_kind":{"Hlt":40,"IoOut":60},"kvm":{"exits":200},"kvm_exits_per_virtual_s":4.597701149425287,"inner_wall_ms":null,"identical":null,"outputs":["d1",null],"clocksource":"tsc","clock_log":[],"workload_tail":null,"error":null,"failures":["run 2: boom"],"command":["x"]}"#;
        assert_eq!(serde_json::to_string(&summary).unwrap(), json);
    }

    fn kvm_run() -> ExitsRun {
        ExitsRun {
            ok: true,
            wall_ms: 90_000.0,
            virtual_ns: Some(VirtNanos(44_000_000_000)),
            output: Some("q1".into()),
            clocksource: Some("tsc".into()),
            kvm: Some(BTreeMap::from([
                ("exits".to_string(), 5000),
                ("halt_exits".to_string(), 700),
            ])),
            ..ExitsRun::default()
        }
    }

    #[test]
    fn ratios_and_goals() {
        let r = report();
        let s = &r.scenarios[0];
        let (new, old, kvm) = (&s.systems[0], &s.systems[1], &s.systems[2]);
        assert_eq!(new.times.median_s, Some(105.0));
        assert_eq!(new.exits, Some(40_000));
        assert_eq!(new.identical, Some(true));
        assert_eq!(old.identical, Some(false));
        assert_eq!(kvm.identical, None);
        assert_eq!((kvm.times.ok_runs, kvm.times.runs), (1, 2));
        assert_eq!(kvm.exits, None);
        assert_eq!(old.exits_by_kind["Hlt"], 60_000);
        assert_eq!(new.clocksource.as_deref(), Some("detvisor"));
        assert_eq!(
            s.ratios,
            Ratios {
                exits_old_over_new: Some(4.0),
                wall_old_over_new: Some(310.0 / 105.0),
                new_over_qemu_kvm_wall: Some(105.0 / 90.0),
                exits_goal_met: Some(true),
                wall_goal_met: Some(true),
            }
        );
        assert!(!r.all_ok);
        assert_eq!(virtual_secs(Some(0.000_169_2)), "0.000169");
        assert_eq!(virtual_secs(None), "-");
        let boot = ratios(Scenario::Boot, new, old, kvm);
        assert_eq!(boot.exits_goal_met, None);
    }

    #[test]
    fn the_table() {
        let r = report();
        let mut out = Vec::new();
        write_scenario(&mut out, &r.scenarios[0]).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "== partition: examples/etcd/partition.toml: 3 members, n1 cut off at 20 s for 10 s (1G RAM)"
        );
        assert_eq!(
            lines[1],
            "system                        ok wall s per run          median   virtual     exits  exits/vs KVM exits identical clocksource"
        );
        assert_eq!(
            lines[2],
            "detvisor new (clock page)    2/2 100.0 110.0              105.0    43.500     40000       920     80000       yes detvisor"
        );
        assert_eq!(
            lines[4],
            "QEMU -accel kvm              1/2 90.0 0.5!                 90.0    44.000       n/a       n/a      5000       n/a tsc"
        );
        assert_eq!(lines[5], "  exits by kind (median)       new        old");
        assert_eq!(
            lines[6],
            "    Hlt                          30000      60000"
        );
        assert_eq!(
            lines[8],
            "  KVM statistics (median)      new        old   QEMU-KVM"
        );
        assert_eq!(
            lines[10],
            "    halt_exits                     n/a        n/a        700"
        );
        assert_eq!(
            lines[11],
            "    exits per virtual s           1839       7356        114"
        );
        assert_eq!(
            lines[12],
            "  ratios: exits old/new 4.00x (goal >= 3x: met); wall old/new 2.95x; detvisor new / \
             QEMU-KVM wall 1.17x (goal <= 1.2x: met)"
        );
        let mut out = Vec::new();
        write_report(&mut out, &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().next().unwrap(),
            "detvisor bench exits: 1 scenario(s), 2 run(s) per system; detvisor seed 42, etcd \
             runs until 300s; QEMU-KVM -cpu host"
        );
        assert!(!text.contains("CAVEAT: the run library cannot select the exit path"));
        let mut r = r;
        r.exit_path_selectable = false;
        let mut out = Vec::new();
        write_report(&mut out, &r).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("CAVEAT: the run library cannot select the exit path yet"));
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["benchmark"], "exits");
        // `--until` as its text, as when the report held the flag's string.
        assert_eq!(json["until"], "300s");
        assert_eq!(json["scenarios"][0]["ratios"]["exits_old_over_new"], 4.0);
        assert_eq!(json["scenarios"][0]["systems"][2]["system"], "qemu-kvm");
    }
}
