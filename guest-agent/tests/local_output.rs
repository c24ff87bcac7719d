//! The SDKs' fallback file (`ANTITHESIS_SDK_LOCAL_OUTPUT`) end to end on
//! this host, as root, no VM (see `common` for the harness): whichever
//! process the agent started sets the variable (a node, the workload in a
//! node or in the root namespaces, a test-composer command), what it wrote
//! up to its end arrives before the agent reports that end, also when the
//! file was on a /tmp that ended with the node.

mod common;

use common::*;
use guest_agent::protocol::{AgentToHost, HostToAgent};
use std::collections::BTreeMap;

const VARIABLE: &str = "ANTITHESIS_SDK_LOCAL_OUTPUT";

fn env_with(path: &str) -> BTreeMap<String, String> {
    [(VARIABLE.to_string(), path.to_string())].into()
}

/// The log's SDK records (`node json`, the root's as `- json`) and ends
/// (`exited NODE`, `workload exited`, `command exited ID`), in order.
fn records_and_ends(log: &[AgentToHost]) -> Vec<String> {
    log.iter()
        .filter_map(|m| match m {
            AgentToHost::Sdk { node, json } => {
                Some(format!("{} {json}", node.as_deref().unwrap_or("-")))
            }
            AgentToHost::Exited { node, .. } => Some(format!("exited {node}")),
            AgentToHost::WorkloadExited { .. } => Some("workload exited".to_string()),
            AgentToHost::CommandExited { id, .. } => Some(format!("command exited {id}")),
            _ => None,
        })
        .collect()
}

#[test]
fn test_a_nodes_tmp_file_written_just_before_its_end_arrives_before_its_exit() {
    if !can_run() {
        return;
    }
    // Arrange: no sleep, so the node may end before the agent ever reads
    // the file, and its /tmp (a tmpfs of its mount namespace) ends with it.
    // The second start writes a longer line into a new /tmp: read from its
    // start, not from where the first file ended.
    let dir = tempfile::tempdir().unwrap();
    let script = r#"n=$(($(cat /count 2>/dev/null || echo 0) + 1)); echo $n > /count
mkdir /tmp/out
if [ $n = 1 ]; then echo '{"run":1}'; else echo '{"run":2,"longer":"than the first"}'; fi > /tmp/out/sdk.jsonl"#;
    let mut spec = node("n1", &make_rootfs(dir.path(), "n1"), script);
    spec.env = env_with("/tmp/out/sdk.jsonl");
    let mut agent = AgentProcess::start();
    agent.hello();

    // Act
    agent.send(&HostToAgent::CreateNode(spec));
    agent.started("n1");
    agent.exited("n1");
    agent.send(&HostToAgent::Restart { node: "n1".into() });
    agent.started("n1");
    agent.exited("n1");
    let (status, log) = agent.shutdown();

    // Assert
    assert!(status.success());
    assert_eq!(
        records_and_ends(&log),
        [
            r#"n1 {"run":1}"#,
            "exited n1",
            r#"n1 {"run":2,"longer":"than the first"}"#,
            "exited n1"
        ]
    );
}

#[test]
fn test_a_workload_s_records_arrive_from_its_own_variable_or_its_node_s_before_its_exit() {
    if !can_run() {
        return;
    }
    // Arrange: n1's own file is on its /tmp; the workloads end right after
    // writing (the host shuts the run down at a workload's end).
    let dir = tempfile::tempdir().unwrap();
    let mut spec = node("n1", &make_rootfs(dir.path(), "n1"), "");
    spec.command = vec!["sleep".into(), "1000".into()];
    spec.env = env_with("/tmp/node.jsonl");
    let root_file = dir.path().join("root.jsonl").display().to_string();
    let workload = |node: Option<&str>, path: &str, json: &str| HostToAgent::StartWorkload {
        node: node.map(str::to_string),
        command: vec![
            "sh".into(),
            "-c".into(),
            format!("echo '{json}' > \"${VARIABLE}\""),
        ],
        env: env_with(path),
    };
    let mut agent = AgentProcess::start();
    agent.hello();
    agent.send(&HostToAgent::CreateNode(spec));
    agent.started("n1");
    let mut run = |message: HostToAgent| {
        agent.send(&message);
        agent.wait_for("workload_exited", |m| {
            matches!(m, AgentToHost::WorkloadExited { .. })
        });
    };

    // Act: the variable only in the workload's environment ([workload].env);
    // the node's own (a workload inherits its node's environment); a
    // workload in the agent's root namespaces.
    run(workload(Some("n1"), "/tmp/workload.jsonl", r#"{"own":1}"#));
    run(workload(Some("n1"), "/tmp/node.jsonl", r#"{"nodes":2}"#));
    run(workload(None, &root_file, r#"{"root":3}"#));
    let (status, log) = agent.shutdown();

    // Assert: each once (one reader per file), as its node's (like the
    // records a workload in a node sends through libvoidstar).
    assert!(status.success());
    assert_eq!(
        records_and_ends(&log),
        [
            r#"n1 {"own":1}"#,
            "workload exited",
            r#"n1 {"nodes":2}"#,
            "workload exited",
            r#"- {"root":3}"#,
            "workload exited",
            "exited n1"
        ]
    );
}

#[test]
fn test_a_template_command_s_records_arrive_before_its_exit() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let root = make_rootfs(dir.path(), "n1");
    let template = root.join("opt/antithesis/test/v1/basic");
    std::fs::create_dir_all(&template).unwrap();
    let command = template.join("singleton_driver_write.sh");
    std::fs::write(
        &command,
        format!("#!/bin/sh\necho '{{\"command\":1}}' > \"${VARIABLE}\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&command, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut spec = node("n1", &root, "");
    spec.command = vec!["sleep".into(), "1000".into()];
    let mut agent = AgentProcess::start();
    agent.hello();
    agent.send(&HostToAgent::CreateNode(spec));
    agent.started("n1");

    // Act
    agent.send(&HostToAgent::StartCommand {
        id: 1,
        node: "n1".into(),
        template: "basic".into(),
        command: "singleton_driver_write.sh".into(),
        env: env_with("/tmp/command.jsonl"),
    });
    agent.wait_for("command_exited 1", |m| {
        matches!(m, AgentToHost::CommandExited { id: 1, .. })
    });
    let (status, log) = agent.shutdown();

    // Assert
    assert!(status.success());
    assert_eq!(
        records_and_ends(&log),
        [r#"n1 {"command":1}"#, "command exited 1", "exited n1"]
    );
}
