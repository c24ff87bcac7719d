//! Tests of the conductor running a test composer's template: listing,
//! set-up, drivers and the faults held outside them.

use crate::composer::CommandKind;
use devices::VirtNanos;
use guest_agent::protocol::ExitStatus;
use std::collections::BTreeMap;

fn files(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The conductor's side: listing, set-up, faults held during `first_`,
/// the terminal phase stopping them, events of every start and end.
#[test]
fn test_the_conductor_runs_a_template_and_holds_faults_outside_drivers() {
    use super::conductor::tests::{boot, conductor, feed, started};
    use crate::conversation::{Conductor, Note};
    use crate::event::UpEvent;
    use crate::manifest::{SetupSignal, TemplatePlan, WorkloadPlan};
    use guest_agent::protocol::{AgentToHost, HostToAgent};
    let plan = WorkloadPlan::Template(TemplatePlan {
        template: "t".into(),
        node: "n1".into(),
        own_node: None,
        parallel_drivers: 2,
        setup: SetupSignal::Immediate,
        env: [("X".to_string(), "1".to_string())].into(),
    });
    let mut c: Conductor = conductor(Some(plan), &["at=1s pause n2"]);
    c.seed_composer(5);
    assert!(!c.faults_allowed());
    boot(&mut c);
    feed(&mut c, started("n1", 2));
    let (mut send, mut notes) = (Vec::new(), Vec::new());
    c.on_message(started("n2", 3), &mut send, &mut notes);
    assert_eq!(
        send,
        vec![HostToAgent::ListTemplate {
            node: "n1".into(),
            template: "t".into()
        }]
    );
    assert!(notes.contains(&Note::Event(UpEvent::SetupComplete)));
    let listed = AgentToHost::TemplateCommands {
        template: "t".into(),
        commands: files(&["eventually_c", "first_a", "helper_h", "parallel_driver_b"]),
    };
    assert!(feed(&mut c, listed).is_empty());
    let due = |c: &mut Conductor, secs: u64| {
        let (mut send, mut notes) = (Vec::new(), Vec::new());
        c.due(VirtNanos::from_secs(secs), &mut send, &mut notes);
        (send, notes)
    };
    // first_ alone; the pause due at 1 s waits.
    let (send, _) = due(&mut c, 5);
    assert_eq!(
        send,
        vec![HostToAgent::StartCommand {
            id: 1,
            node: "n1".into(),
            template: "t".into(),
            command: "first_a".into(),
            env: [("X".to_string(), "1".to_string())].into(),
        }]
    );
    assert!(!c.faults_allowed());
    let (mut send, mut notes) = (Vec::new(), Vec::new());
    c.on_message(
        AgentToHost::CommandStarted { id: 1, pid: 40 },
        &mut send,
        &mut notes,
    );
    assert_eq!(
        notes,
        vec![Note::Event(UpEvent::CommandStarted {
            command: "first_a".into(),
            kind: CommandKind::First,
            pid: 40
        })]
    );
    feed(
        &mut c,
        AgentToHost::CommandExited {
            id: 1,
            status: ExitStatus::Code(0),
        },
    );
    // Drivers: faults on, the held pause goes.
    let (send, _) = due(&mut c, 6);
    assert!(c.faults_allowed());
    assert!(
        matches!(&send[0], HostToAgent::StartCommand { command, .. } if command == "parallel_driver_b"),
        "{send:?}"
    );
    assert_eq!(send.last(), Some(&HostToAgent::Pause { node: "n2".into() }));
    feed(&mut c, AgentToHost::Paused { node: "n2".into() });
    // Past any deadline: drivers still running are killed, faults stop,
    // the paused node resumes.
    let (send, notes) = due(&mut c, 100);
    let kills: Vec<u32> = send
        .iter()
        .filter_map(|m| match m {
            HostToAgent::KillCommand { id } => Some(*id),
            _ => None,
        })
        .collect();
    assert!(!kills.is_empty(), "{send:?}");
    assert!(send.contains(&HostToAgent::Resume { node: "n2".into() }));
    assert!(notes.contains(&Note::Event(UpEvent::FaultsStopped)));
    assert!(notes.contains(&Note::StopNetworkFaults));
    assert!(!c.faults_allowed());
    for id in kills {
        let (mut send, mut notes) = (Vec::new(), Vec::new());
        c.on_message(
            AgentToHost::CommandExited {
                id,
                status: ExitStatus::Signal(9),
            },
            &mut send,
            &mut notes,
        );
        assert!(
            matches!(&notes[..], [Note::Event(UpEvent::CommandKilled { .. })]),
            "{notes:?}"
        );
    }
    let (send, _) = due(&mut c, 100);
    let [HostToAgent::StartCommand { id, command, .. }] = &send[..] else {
        panic!("eventually_ starts: {send:?}");
    };
    assert_eq!(command, "eventually_c");
    let exited = AgentToHost::CommandExited {
        id: *id,
        status: ExitStatus::Code(0),
    };
    feed(&mut c, exited);
    let (send, _) = due(&mut c, 101);
    assert_eq!(send, vec![HostToAgent::Shutdown]);
    assert_eq!(c.status(), Some(0));
    // The conductor's state (the composer's in it) round-trips.
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(serde_json::from_str::<Conductor>(&json).unwrap(), c);
}

#[test]
fn test_a_template_without_drivers_ends_the_run_with_a_clear_event() {
    use super::conductor::tests::{boot, conductor, feed, started};
    use crate::conversation::{Note, SETUP_FAILED};
    use crate::event::UpEvent;
    use crate::manifest::{SetupSignal, TemplatePlan, WorkloadPlan};
    use guest_agent::protocol::{AgentToHost, HostToAgent};
    let plan = WorkloadPlan::Template(TemplatePlan {
        template: "t".into(),
        node: "n1".into(),
        own_node: None,
        parallel_drivers: 1,
        setup: SetupSignal::Sdk,
        env: BTreeMap::new(),
    });
    let mut c = conductor(Some(plan), &[]);
    boot(&mut c);
    feed(&mut c, started("n1", 2));
    let (mut send, mut notes) = (Vec::new(), Vec::new());
    c.on_message(started("n2", 3), &mut send, &mut notes);
    // `sdk`: no set-up yet.
    assert!(!notes.contains(&Note::Event(UpEvent::SetupComplete)));
    let (mut send, mut notes) = (Vec::new(), Vec::new());
    c.on_message(
        AgentToHost::TemplateCommands {
            template: "t".into(),
            commands: files(&["first_a"]),
        },
        &mut send,
        &mut notes,
    );
    assert_eq!(send, vec![HostToAgent::Shutdown]);
    assert_eq!(c.status(), Some(SETUP_FAILED));
    assert!(
        notes.iter().any(
            |n| matches!(n, Note::Event(e @ UpEvent::TemplateRefused { .. })
            if e.to_string().contains("no driver or anytime_"))
        ),
        "{notes:?}"
    );
}
