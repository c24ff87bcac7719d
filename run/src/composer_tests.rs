//! Tests of the test composer (`super`) and of the conductor running it.

use super::*;

const T: &[&str] = &[
    "anytime_c.sh",
    "eventually_check.sh",
    "first_init.sh",
    "helper_lib.sh",
    "parallel_driver_a.sh",
    "serial_driver_b.sh",
    "README",
];

fn files(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Runs a timeline where every command takes `took` and exits 0
/// (commands named in `fail` exit 1): the starts and kills, in order,
/// as `start <command> @ms` / `kill <command> @ms`.
fn timeline(names: &[&str], seed: u64, fail: &[&str]) -> (Vec<String>, i32) {
    let mut c = Composer::new("t", 3, seed);
    c.set_commands(&files(names)).unwrap();
    let mut log = Vec::new();
    let mut now = VirtNanos(0);
    let mut out = Vec::new();
    c.due(now, &mut out);
    assert!(out.is_empty(), "nothing before set-up: {out:?}");
    assert!(!c.faults_allowed());
    c.set_setup_complete();
    // Running runs and when each ends by itself.
    let mut ends: BTreeMap<u32, VirtNanos> = BTreeMap::new();
    let took = VirtNanos(700_000_000);
    for _ in 0..10_000 {
        c.due(now, &mut out);
        for action in out.drain(..) {
            match action {
                Action::Start { id, command, kind } => {
                    assert_eq!(CommandKind::of(&command), Some(kind));
                    let faults = c.faults_allowed();
                    log.push(format!(
                        "start {command} faults={faults} @{}",
                        now.0 / 1_000_000
                    ));
                    ends.insert(id, now + took);
                }
                Action::Kill { id } => {
                    let run = c.run(id).unwrap().clone();
                    log.push(format!("kill {} @{}", run.command, now.0 / 1_000_000));
                    ends.insert(id, now);
                }
                Action::StopFaults => log.push("stop faults".into()),
                Action::Finish { status } => return (log, status),
            }
        }
        // The next thing to happen: an end or the composer's wakeup.
        let next_end = ends
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(id, at)| (*id, *at));
        match (next_end, c.next_wakeup()) {
            (Some((id, at)), wake) if wake.is_none_or(|w| at <= w) => {
                now = now.max(at);
                ends.remove(&id);
                let run = c.run(id).unwrap().clone();
                let status = if run.killed {
                    ExitStatus::Signal(9)
                } else if fail.contains(&run.command.as_str()) {
                    ExitStatus::Code(1)
                } else {
                    ExitStatus::Code(0)
                };
                assert_eq!(c.on_exited(id, status), Some(run));
            }
            (_, Some(wake)) => now = now.max(wake),
            (Some(_), None) => unreachable!("the first arm takes it"),
            (None, None) => panic!("stuck: {log:?}"),
        }
    }
    panic!("no end: {log:?}")
}

#[test]
fn test_kinds_by_prefix() {
    assert_eq!(CommandKind::of("first_x"), Some(CommandKind::First));
    assert_eq!(
        CommandKind::of("parallel_driver_x.sh"),
        Some(CommandKind::ParallelDriver)
    );
    assert_eq!(
        CommandKind::of("singleton_driver_"),
        Some(CommandKind::SingletonDriver)
    );
    assert_eq!(CommandKind::of("finally_check"), Some(CommandKind::Finally));
    assert_eq!(CommandKind::of("firstx"), None);
    assert_eq!(CommandKind::of("helper_x"), None);
    for kind in CommandKind::ALL {
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{kind}\""));
        assert_eq!(serde_json::from_str::<CommandKind>(&json).unwrap(), kind);
    }
}

#[test]
fn test_first_runs_alone_before_drivers_without_faults_and_eventually_last() {
    for seed in 0..20 {
        let (log, status) = timeline(T, seed, &[]);
        assert_eq!(status, 0);
        assert_eq!(log[0], "start first_init.sh faults=false @0", "{log:?}");
        assert!(
            log[1].starts_with("start ") && log[1].contains("@700"),
            "first_ ends before anything else starts: {log:?}"
        );
        // Drivers and anytime_ run with faults on.
        for line in log
            .iter()
            .filter(|l| l.contains("driver_") || l.contains("anytime_"))
        {
            if line.starts_with("start") {
                assert!(line.contains("faults=true"), "{line} in {log:?}");
            }
        }
        let last = log.last().unwrap();
        assert!(
            last.starts_with("start eventually_check.sh faults=false"),
            "{log:?}"
        );
        assert_eq!(log.iter().filter(|l| l.contains("eventually_")).count(), 1);
        assert!(log
            .iter()
            .all(|l| !l.contains("helper_") && !l.contains("README")));
        // Faults stop before eventually_ starts, after every kill.
        let stop = log.iter().position(|l| l == "stop faults").unwrap();
        assert_eq!(stop, log.len() - 2, "{log:?}");
    }
}

#[test]
fn test_two_seeds_give_two_schedules_and_one_seed_the_same() {
    let (a, _) = timeline(T, 1, &[]);
    assert_eq!(timeline(T, 1, &[]).0, a);
    let differ = (2..6).filter(|&s| timeline(T, s, &[]).0 != a).count();
    assert!(differ >= 3, "seeds 2..6 mostly differ from seed 1: {a:?}");
    assert_ne!(timeline(T, 2, &[]).0, a, "seeds 1 and 2");
}

#[test]
fn test_parallel_drivers_run_together_up_to_the_maximum_and_serial_alone() {
    let names = ["parallel_driver_a", "parallel_driver_b", "serial_driver_s"];
    let mut saw_batch = false;
    for seed in 0..30 {
        let (log, _) = timeline(&names, seed, &[]);
        // Starts at one time form a batch.
        let mut by_time: BTreeMap<String, Vec<&String>> = BTreeMap::new();
        for line in log.iter().filter(|l| l.starts_with("start")) {
            by_time
                .entry(line.rsplit('@').next().unwrap().to_string())
                .or_default()
                .push(line);
        }
        for batch in by_time.values() {
            assert!(batch.len() <= 3, "{log:?}");
            if batch.iter().any(|l| l.contains("serial_driver")) {
                assert_eq!(batch.len(), 1, "serial runs alone: {log:?}");
            }
            saw_batch |= batch.len() > 1;
        }
        // Without a terminal command every round ends by itself.
        assert!(log.iter().all(|l| !l.starts_with("kill")), "{log:?}");
    }
    assert!(saw_batch, "some seed runs parallel drivers at once");
}

#[test]
fn test_a_singleton_driver_is_the_timelines_only_driver() {
    let names = ["singleton_driver_x", "parallel_driver_a"];
    let mut singleton_timelines = 0;
    for seed in 0..20 {
        let (log, _) = timeline(&names, seed, &[]);
        if log.iter().any(|l| l.contains("singleton_driver_x")) {
            singleton_timelines += 1;
            assert_eq!(log.len(), 1, "{log:?}");
        }
    }
    assert!(
        (1..20).contains(&singleton_timelines),
        "{singleton_timelines}"
    );
}

#[test]
fn test_eventually_kills_the_others_and_anytime_is_cancelled() {
    // A long-running anytime_ command is running when eventually_ comes.
    let names = ["anytime_c", "eventually_e"];
    let (log, status) = timeline(&names, 3, &[]);
    let kill = log.iter().position(|l| l.starts_with("kill anytime_c"));
    let eventually = log.iter().position(|l| l.starts_with("start eventually_e"));
    // Ends at 700 ms each, so at the deadline (>= 2 s) one may or may
    // not run; if it runs it is killed before eventually_ starts.
    assert!(eventually.is_some(), "{log:?}");
    if let Some(kill) = kill {
        assert!(kill < eventually.unwrap(), "{log:?}");
    }
    assert_eq!(status, 0, "killed runs are no failures");
    assert!(
        log.iter().any(|l| l.starts_with("start anytime_c")),
        "{log:?}"
    );
}

#[test]
fn test_finally_runs_only_if_every_started_command_completed() {
    let names = ["parallel_driver_a", "finally_f"];
    for seed in 0..10 {
        let (log, _) = timeline(&names, seed, &[]);
        assert!(log.iter().all(|l| !l.starts_with("kill")), "{log:?}");
        assert!(
            log.last()
                .unwrap()
                .starts_with("start finally_f faults=false"),
            "{log:?}"
        );
    }
    // A killed run (as eventually_ does) rules finally_ out.
    let mut c = Composer::new("t", 1, 0);
    c.set_commands(&files(&["parallel_driver_a", "finally_f"]))
        .unwrap();
    c.killed_any = true;
    c.set_setup_complete();
    let mut out = Vec::new();
    c.due(VirtNanos(0), &mut out);
    let mut now = VirtNanos(0);
    while !matches!(out.last(), Some(Action::Finish { .. })) {
        let ids: Vec<u32> = c.running.keys().copied().collect();
        for id in ids {
            c.on_exited(id, ExitStatus::Code(0));
        }
        now = now + VirtNanos::from_secs(1);
        c.due(now, &mut out);
    }
    assert!(
        out.iter()
            .all(|a| !matches!(a, Action::Start { command, .. } if command == "finally_f")),
        "{out:?}"
    );
}

#[test]
fn test_a_nonzero_exit_is_the_runs_status() {
    let (_, status) = timeline(T, 1, &["first_init.sh"]);
    assert_eq!(status, 1);
}

#[test]
fn test_no_driver_is_an_error_and_helpers_are_ignored() {
    let mut c = Composer::new("t", 1, 0);
    let e = c
        .set_commands(&files(&[
            "first_a",
            "eventually_b",
            "helper_parallel_driver_x",
        ]))
        .unwrap_err();
    assert!(e.to_string().contains("no driver or anytime_"), "{e}");
    assert!(c.set_commands(&files(&["anytime_x"])).is_ok());
    assert_eq!(
        c.commands().unwrap(),
        &[("anytime_x".to_string(), CommandKind::Anytime)]
    );
}

#[test]
fn test_state_round_trips_and_a_rekey_changes_the_draws() {
    let mut c = Composer::new("t", 3, 7);
    c.set_commands(&files(T)).unwrap();
    c.set_setup_complete();
    let mut out = Vec::new();
    c.due(VirtNanos(0), &mut out);
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Composer>(&json).unwrap(), c);
    let (mut a, mut b) = (c.clone(), c.clone());
    b.rekey(9, 100);
    let draws = |c: &mut Composer| (0..8).map(|_| c.draw(1000)).collect::<Vec<_>>();
    assert_ne!(draws(&mut a), draws(&mut b));
    let (mut d, mut e) = (c.clone(), c);
    d.rekey(9, 100);
    e.rekey(9, 100);
    assert_eq!(draws(&mut d), draws(&mut e));
}
