//! The inspection requests on the agent binary on this host, as root, no
//! VM (see `agent.rs` for how): `exec` inside a node (output kept up to its
//! limit and counted, a timeout killing it, a missing command failing, live
//! or freezing the nodes), `read_file` inside a node's root, `processes` as
//! the node's PID namespace sees them.

mod common;

use common::*;
use guest_agent::protocol::{AgentToHost, ErrorContext, ExecSpec, ExitStatus, HostToAgent, Stream};

fn exec(id: u64, argv: &[&str], freeze: bool, timeout_ns: u64, output_limit: u64) -> HostToAgent {
    HostToAgent::Exec(ExecSpec {
        id,
        node: Some("n1".into()),
        command: argv.iter().map(|a| a.to_string()).collect(),
        env: Default::default(),
        freeze,
        timeout_ns,
        output_limit,
    })
}

/// What exec `id` printed on `stream`, once it ended, and its end.
fn exec_result(agent: &mut AgentProcess, id: u64) -> (Vec<u8>, Vec<u8>, AgentToHost) {
    let exited = agent.wait_for(
        "exec exited",
        |m| matches!(m, AgentToHost::ExecExited { id: i, .. } if *i == id),
    );
    let mut out = (Vec::new(), Vec::new());
    for message in &agent.log {
        if let AgentToHost::ExecOutput {
            id: i,
            stream,
            data,
        } = message
        {
            if *i == id {
                match stream {
                    Stream::Stdout => out.0.extend_from_slice(data),
                    Stream::Stderr => out.1.extend_from_slice(data),
                }
            }
        }
    }
    (out.0, out.1, exited)
}

const SECOND: u64 = 1_000_000_000;

/// Waits until `ready` holds (a process's state changes when it next runs
/// in the kernel, a child execs when it is scheduled: soon, not at once).
fn eventually(what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "not {what} within {TIMEOUT:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn test_exec_runs_in_a_node_keeps_its_output_up_to_the_limit_and_times_out() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let root = make_rootfs(dir.path(), "n1");
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &root,
        "while :; do sleep 0.05; done",
    )));
    let pid = agent.started("n1");

    // Act + Assert: live, the node untouched; stdout cut at 10 bytes.
    let script = "hostname; echo err >&2; head -c 100000 /dev/zero | tr '\\0' a; exit 3";
    agent.send(&exec(1, &["sh", "-c", script], false, 10 * SECOND, 10));
    let (stdout, stderr, exited) = exec_result(&mut agent, 1);
    assert_eq!(stdout, b"n1\naaaaaaa");
    assert_eq!(stderr, b"err\n");
    assert_eq!(
        exited,
        AgentToHost::ExecExited {
            id: 1,
            status: ExitStatus::Code(3),
            stdout_bytes: 100_003,
            stderr_bytes: 4,
            timed_out: false,
        }
    );
    assert_ne!(
        process_state(pid),
        'T',
        "a live exec leaves the node running"
    );
    assert!(!agent
        .log
        .iter()
        .any(|m| matches!(m, AgentToHost::Paused { .. })));

    // A command past its timeout: its whole process group is killed.
    agent.send(&exec(
        2,
        &["sh", "-c", "sleep 100 & sleep 100"],
        false,
        SECOND / 5,
        10,
    ));
    let (_, _, exited) = exec_result(&mut agent, 2);
    assert!(
        matches!(
            exited,
            AgentToHost::ExecExited {
                status: ExitStatus::Signal(9),
                timed_out: true,
                ..
            }
        ),
        "{exited:?}"
    );

    // Frozen: the node is paused first.
    agent.send(&exec(3, &["true"], true, SECOND, 10));
    agent.wait_for("paused", |m| matches!(m, AgentToHost::Paused { .. }));
    let (_, _, exited) = exec_result(&mut agent, 3);
    assert!(matches!(
        exited,
        AgentToHost::ExecExited {
            status: ExitStatus::Code(0),
            ..
        }
    ));
    eventually("stopped", || process_state(pid) == 'T');

    // A missing command, an empty one and an unknown node fail by id.
    agent.send(&exec(4, &["no-such-command"], true, SECOND, 10));
    let missing = agent.error(ErrorContext::Exec { id: 4 });
    assert!(missing.contains("no-such-command"), "{missing}");
    agent.send(&exec(5, &[], true, SECOND, 10));
    assert_eq!(
        agent.error(ErrorContext::Exec { id: 5 }),
        "exec: empty command"
    );
    let mut elsewhere = exec(6, &["true"], true, SECOND, 10);
    if let HostToAgent::Exec(spec) = &mut elsewhere {
        spec.node = Some("n9".into());
    }
    agent.send(&elsewhere);
    assert_eq!(agent.error(ErrorContext::Exec { id: 6 }), "no node \"n9\"");

    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_read_file_and_processes_see_the_node_as_it_sees_itself() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let root = make_rootfs(dir.path(), "n1");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/motd"), b"inside n1\n").unwrap();
    std::os::unix::fs::symlink("/etc/motd", root.join("motd-link")).unwrap();
    let script = "sleep 1000 & while :; do sleep 0.05; done";
    agent.send(&HostToAgent::CreateNode(node("n1", &root, script)));
    let pid = agent.started("n1");
    // Its `sleep` runs before anything freezes the node (a child stopped
    // between its fork and its exec would stay `sh`). An exec installs the
    // new arguments before it renames the task, so both are waited for: a
    // child seen between the two has `sleep 1000` for its command line and
    // its parent's name.
    eventually("sleeping", || {
        children_of(pid).iter().any(|child| {
            std::fs::read(format!("/proc/{child}/cmdline")).is_ok_and(|c| c == b"sleep\x001000\0")
                && std::fs::read(format!("/proc/{child}/comm")).is_ok_and(|c| c == b"sleep\n")
        })
    });
    let read = |agent: &mut AgentProcess, id: u64, path: &str, limit: u64| {
        agent.send(&HostToAgent::ReadFile {
            id,
            node: Some("n1".into()),
            path: path.into(),
            limit,
        });
    };

    // Act + Assert: `..` and absolute links resolve inside the node's root.
    read(&mut agent, 1, "/../../etc/motd", 100);
    let size = agent.wait_for("file read", |m| {
        matches!(m, AgentToHost::FileRead { id: 1, .. })
    });
    assert_eq!(size, AgentToHost::FileRead { id: 1, size: 10 });
    read(&mut agent, 2, "/motd-link", 6);
    agent.wait_for("file read", |m| {
        matches!(m, AgentToHost::FileRead { id: 2, .. })
    });
    let chunks: Vec<(u64, Vec<u8>)> = agent
        .log
        .iter()
        .filter_map(|m| match m {
            AgentToHost::FileChunk { id, data } => Some((*id, data.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        chunks,
        [(1, b"inside n1\n".to_vec()), (2, b"inside".to_vec())]
    );
    read(&mut agent, 3, "/etc/none", 100);
    assert_eq!(
        agent.error(ErrorContext::ReadFile { id: 3 }),
        "\"/etc/none\": No such file or directory (os error 2)"
    );
    read(&mut agent, 4, "/etc", 100);
    assert_eq!(
        agent.error(ErrorContext::ReadFile { id: 4 }),
        "\"/etc\" is a directory"
    );
    read(&mut agent, 5, "/dev/zero", 100);
    let device = agent.error(ErrorContext::ReadFile { id: 5 });
    assert!(device.contains("not a regular file"), "{device}");
    agent.wait_for("paused", |m| matches!(m, AgentToHost::Paused { .. }));
    eventually("frozen for the read", || process_state(pid) == 'T');

    agent.send(&HostToAgent::Processes {
        id: 6,
        node: Some("n1".into()),
    });
    let listed = agent.wait_for("processes", |m| {
        matches!(m, AgentToHost::ProcessesListed { id: 6, .. })
    });
    let rows: Vec<_> = agent
        .log
        .iter()
        .filter_map(|m| match m {
            AgentToHost::ProcessRows { id: 6, rows } => Some(rows.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        listed,
        AgentToHost::ProcessesListed {
            id: 6,
            count: rows.len() as u64
        }
    );
    let init = &rows[0];
    assert_eq!((init.pid, init.ppid, init.state), (1, 0, 'T'), "{rows:?}");
    assert_eq!(init.command, ["sh", "-c", script]);
    let sleeper = rows
        .iter()
        .find(|r| r.command == ["sleep", "1000"])
        .expect("the node's sleep");
    assert_eq!(sleeper.ppid, 1);
    assert_eq!(sleeper.name, "sleep");
    assert!(rows.windows(2).all(|w| w[0].pid < w[1].pid));

    // Beside the nodes: the guest's PIDs, the node's PID 1 among them.
    agent.send(&HostToAgent::Processes { id: 7, node: None });
    agent.wait_for("processes", |m| {
        matches!(m, AgentToHost::ProcessesListed { id: 7, .. })
    });
    let all: Vec<i32> = agent
        .log
        .iter()
        .filter_map(|m| match m {
            AgentToHost::ProcessRows { id: 7, rows } => Some(rows.iter().map(|r| r.pid)),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(all.contains(&pid), "{all:?}");

    let (status, _) = agent.shutdown();
    assert!(status.success());
}
