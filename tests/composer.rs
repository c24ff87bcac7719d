//! `[workload] template = ...`, end to end: a test-composer template
//! directory (`/opt/antithesis/test/v1/basic/`) in a node's root, its
//! commands run by the agent as the host's seeded composer decides.

mod common;

use common::cluster::Cluster;
use common::*;

const MANIFEST: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]

[workload]
node = "n1"
template = "basic"
parallel_drivers = 3
"#;

/// The template: every command prints its name; the helper would leave a
/// trace if it ever ran.
const COMMANDS: &[(&str, &str)] = &[
    ("first_init.sh", "echo init; sleep 0.2"),
    ("parallel_driver_a.sh", "echo a; sleep 0.3"),
    ("serial_driver_b.sh", "echo b; sleep 0.2"),
    ("anytime_c.sh", "echo c; sleep 0.5"),
    ("eventually_check.sh", "echo check"),
    ("helper_lib.sh", "echo HELPER RAN"),
];

fn template_cluster(name: &str) -> Cluster {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::new(name, MANIFEST);
    let dir = cluster.dir.join("root/opt/antithesis/test/v1/basic");
    std::fs::create_dir_all(&dir).unwrap();
    for (file, body) in COMMANDS {
        let path = dir.join(file);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    cluster
}

/// The command events of a run, as printed (`[time] command ... started
/// (pid N)`, `... exited (status S)`, `... killed`), in order.
fn command_events(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("detvisor: [") && l.contains("] command "))
        .map(str::to_owned)
        .collect()
}

/// (command, what) of each event: what is `started`, `exited 0`, `killed`...
fn steps(events: &[String]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|l| {
            let rest = l.split("] command ").nth(1).unwrap();
            let (command, rest) = rest.split_once(' ').unwrap();
            let what = rest.split_once(") ").unwrap().1;
            (command.to_owned(), what.to_owned())
        })
        .collect()
}

fn check_rules(events: &[String]) {
    let steps = steps(events);
    assert!(!steps.is_empty(), "no command ran");
    // first_ runs first, alone, and ends before anything else starts.
    assert_eq!(steps[0].0, "first_init.sh", "{events:#?}");
    assert!(steps[0].1.starts_with("started"), "{events:#?}");
    assert_eq!(
        (steps[1].0.as_str(), steps[1].1.as_str()),
        ("first_init.sh", "exited (status 0)"),
        "{events:#?}"
    );
    // helper_ never runs.
    assert!(steps.iter().all(|(c, _)| !c.starts_with("helper_")));
    // eventually_ is last: it starts after every other command ended (by
    // itself or killed), and the run ends with it.
    let n = steps.len();
    assert_eq!(
        steps[n - 2],
        ("eventually_check.sh".into(), steps[n - 2].1.clone())
    );
    assert!(steps[n - 2].1.starts_with("started"), "{events:#?}");
    assert_eq!(
        steps[n - 1],
        ("eventually_check.sh".into(), "exited (status 0)".into()),
        "{events:#?}"
    );
    // Some driver ran.
    assert!(
        steps
            .iter()
            .any(|(c, w)| c.contains("_driver_") && w.starts_with("started")),
        "{events:#?}"
    );
    // Every run that started ended (exited or killed) before eventually_.
    let started = steps[..n - 2]
        .iter()
        .filter(|(_, w)| w.starts_with("started"))
        .count();
    let ended = steps[..n - 2]
        .iter()
        .filter(|(_, w)| w.starts_with("exited") || w == "killed")
        .count();
    assert_eq!(started, ended, "{events:#?}");
}

#[test]
fn test_a_template_runs_by_the_composer_rules_and_its_schedule_follows_the_seed() {
    let cluster = template_cluster("composer");
    let run = |seed: &str| {
        let out = cluster.up(&["--seed", seed, "--until", "60s"]);
        assert_eq!(out.status.code(), Some(0), "every command exited 0");
        let text = stderr(&out);
        assert!(
            text.contains(
                "template basic: anytime_c.sh eventually_check.sh first_init.sh \
                 parallel_driver_a.sh serial_driver_b.sh"
            ),
            "{text}"
        );
        assert!(text.contains("setup complete"), "{text}");
        assert!(text.contains("faults stopped"), "{text}");
        let events = command_events(&text);
        check_rules(&events);
        // Output goes under the command's name.
        assert!(
            stdout(&out).contains("first_init.sh | init\n"),
            "{}",
            stdout(&out)
        );
        assert!(!stdout(&out).contains("HELPER RAN"));
        events
    };
    let one = run("1");
    let two = run("2");
    assert_ne!(one, two, "two seeds, two schedules");
    assert_eq!(run("1"), one, "one seed, one schedule");
}
