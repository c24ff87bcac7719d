//! End-to-end tests of the agent binary on this host, as root, no VM:
//! the test drives `detvisor-agent --mode test` over a socketpair (or a
//! pty) and builds tiny node root directories from the static busybox.
//!
//! Nothing here touches the host's mounts or network: nodes get their own
//! mount namespaces (made private before anything is mounted), and the
//! agent in test mode moves itself into a network namespace of its own
//! before it reads the channel; the veth pair a test moves into nodes is
//! created inside that namespace (with `nsenter`).
//!
//! `DETVISOR_AGENT_BIN` overrides the binary under test (e.g. the static
//! build from `agent/build.sh`).

mod common;

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use guest_agent::protocol::{
    encode_frame, frame_payload, AgentToHost, ErrorContext, ExitStatus, HostToAgent, Stream,
    PROTOCOL_VERSION,
};

#[test]
fn test_two_nodes_get_their_hostname_pid_1_env_and_exit_status() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let script = "hostname; echo pid $$; echo \"env $GREETING $PATH\"; \
                  echo oops >&2; ls /proc/self/ >/dev/null && echo proc; \
                  test -c /dev/null && echo devnull; ls /dev/pts/ptmx >/dev/null && echo pts; \
                  cat /proc/mounts | grep -c ' / ' >/dev/null; exit $EXIT";
    let mut specs = Vec::new();
    for (name, exit) in [("n1", "0"), ("n2", "3")] {
        let mut spec = node(name, &make_rootfs(dir.path(), name), script);
        spec.env = [
            ("GREETING".to_string(), format!("hello-{name}")),
            ("EXIT".to_string(), exit.to_string()),
        ]
        .into();
        specs.push(spec);
    }

    // Act
    for spec in &specs {
        agent.send(&HostToAgent::CreateNode(spec.clone()));
    }
    let pid1 = agent.started("n1");
    let pid2 = agent.started("n2");
    let status1 = agent.exited("n1");
    let status2 = agent.exited("n2");

    // Assert
    assert!(pid1 > 1 && pid2 > 1 && pid1 != pid2);
    assert_eq!(status1, ExitStatus::Code(0));
    assert_eq!(status2, ExitStatus::Code(3));
    for name in ["n1", "n2"] {
        assert_eq!(
            agent.output(Some(name), Stream::Stdout),
            format!(
                "{name}\npid 1\nenv hello-{name} /usr/sbin:/usr/bin:/sbin:/bin\nproc\ndevnull\npts\n"
            )
        );
        assert_eq!(agent.output(Some(name), Stream::Stderr), "oops\n");
    }
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_output_comes_before_exited_and_rootfs_is_isolated() {
    if !can_run() {
        return;
    }
    // Arrange: the node cannot see the host's files, only its own root.
    let dir = tempfile::tempdir().unwrap();
    let rootfs = make_rootfs(dir.path(), "n1");
    std::fs::write(rootfs.join("marker"), "inside\n").unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();

    // Act
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &rootfs,
        "cat /marker; ls /; head -c 200000 /dev/zero | tr '\\0' x; echo",
    )));
    agent.started("n1");
    let status = agent.exited("n1");

    // Assert
    let exited_at = agent.last;
    let last_output = agent
        .log
        .iter()
        .rposition(|m| matches!(m, AgentToHost::Output { .. }))
        .unwrap();
    assert!(last_output < exited_at);
    assert_eq!(status, ExitStatus::Code(0));
    let stdout = agent.output(Some("n1"), Stream::Stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("inside"));
    let listing: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with('x')).collect();
    assert_eq!(
        listing,
        // usr: the mount points of the SDK shim and detvisor-assert.
        ["bin", "dev", "marker", "proc", "run", "sys", "tmp", "usr"]
    );
    assert_eq!(stdout.matches('x').count(), 200000);
    let chunks = agent
        .log
        .iter()
        .filter(|m| matches!(m, AgentToHost::Output { .. }))
        .count();
    assert!(
        chunks < 200000 / 1000,
        "output is sent in chunks, not bytes"
    );
}

#[test]
fn test_workload_in_root_and_in_node() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let mut spec = node("n1", &make_rootfs(dir.path(), "n1"), "");
    spec.command = vec!["sleep".into(), "1000".into()];
    agent.send(&HostToAgent::CreateNode(spec));
    let node_pid = agent.started("n1");

    // Act: a workload in the agent's own namespaces...
    agent.send(&HostToAgent::StartWorkload {
        node: None,
        command: vec!["sh".into(), "-c".into(), "echo root $W; exit 7".into()],
        env: [("W".to_string(), "w1".to_string())].into(),
    });
    agent.wait_for("workload_started", |m| {
        matches!(m, AgentToHost::WorkloadStarted { node: None, .. })
    });
    let root_status = agent.wait_for("workload_exited", |m| {
        matches!(m, AgentToHost::WorkloadExited { .. })
    });
    let root_output = agent.output(None, Stream::Stdout);
    // ...then one inside the node (it sees the node's /tmp, hostname, PIDs).
    agent.send(&HostToAgent::StartWorkload {
        node: Some("n1".into()),
        command: vec![
            "sh".into(),
            "-c".into(),
            "hostname; echo $(ls /); cat /proc/1/comm; test $$ != 1 && echo not-pid-1".into(),
        ],
        env: BTreeMap::new(),
    });
    agent.wait_for(
        "workload_started",
        |m| matches!(m, AgentToHost::WorkloadStarted { node: Some(n), .. } if n == "n1"),
    );
    let node_status = agent.wait_for("workload_exited", |m| {
        matches!(m, AgentToHost::WorkloadExited { .. })
    });
    let (status, log) = agent.shutdown();

    // Assert
    assert_eq!(
        root_status,
        AgentToHost::WorkloadExited {
            status: ExitStatus::Code(7)
        }
    );
    assert_eq!(root_output, "root w1\n");
    assert_eq!(
        node_status,
        AgentToHost::WorkloadExited {
            status: ExitStatus::Code(0)
        }
    );
    let node_output = &AgentProcess::output_of(&log, None)[root_output.len()..];
    assert_eq!(
        node_output,
        // usr: the mount points of the SDK shim and detvisor-assert.
        "n1\nbin dev proc run sys tmp usr\nsleep\nnot-pid-1\n"
    );
    assert!(log.contains(&AgentToHost::Exited {
        node: "n1".into(),
        status: ExitStatus::Signal(9)
    }));
    assert!(status.success());
    assert!(!Path::new(&format!("/proc/{node_pid}")).exists() || process_state(node_pid) == 'Z');
}

#[test]
fn test_pause_stops_every_process_of_the_node_and_resume_continues() {
    if !can_run() {
        return;
    }
    // Arrange: PID 1 of the node and a background child both tick.
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &make_rootfs(dir.path(), "n1"),
        "(while :; do echo b; sleep 0.05; done) & while :; do echo a; sleep 0.05; done",
    )));
    let pid = agent.started("n1");
    agent.wait_for("output", |m| matches!(m, AgentToHost::Output { .. }));

    // Act
    agent.send(&HostToAgent::Pause { node: "n1".into() });
    agent.wait_for("paused", |m| matches!(m, AgentToHost::Paused { .. }));
    // SIGSTOP takes effect when a process is next scheduled (on a busy
    // host that can take a while); it runs no user code before that.
    let node_states = || -> Vec<char> {
        std::iter::once(pid)
            .chain(children_of(pid))
            .map(process_state)
            .collect()
    };
    let deadline = Instant::now() + TIMEOUT;
    let mut states = node_states();
    while !states.iter().all(|&s| s == 'T' || s == 'Z') && Instant::now() < deadline {
        agent.collect_for(Duration::from_millis(50));
        states = node_states();
    }
    agent.collect_for(Duration::from_millis(300));
    let before = agent.output(Some("n1"), Stream::Stdout).len();
    agent.collect_for(Duration::from_millis(700));
    let after_pause = agent.output(Some("n1"), Stream::Stdout).len();
    agent.send(&HostToAgent::Resume { node: "n1".into() });
    agent.wait_for("resumed", |m| matches!(m, AgentToHost::Resumed { .. }));
    agent.collect_for(Duration::from_millis(700));
    let resumed = agent.output(Some("n1"), Stream::Stdout);

    // Assert
    assert!(
        states.len() >= 2,
        "PID 1 and the background loop: {states:?}"
    );
    // Stopped; a child that had just exited stays a zombie (its stopped
    // parent cannot reap it).
    assert_eq!(states[0], 'T', "PID 1 stopped: {states:?}");
    assert!(
        states.iter().all(|&s| s == 'T' || s == 'Z'),
        "all stopped: {states:?}"
    );
    assert!(
        states.iter().filter(|&&s| s == 'T').count() >= 2,
        "{states:?}"
    );
    assert_eq!(after_pause, before, "no progress while paused");
    let new = &resumed[after_pause..];
    assert!(
        new.contains('a') && new.contains('b'),
        "both resumed: {new:?}"
    );
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_kill_and_restart_keep_the_root_directory_but_not_tmp() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let script = "echo runs $(cat /runs 2>/dev/null); echo x >> /runs; \
                  echo tmp $(ls /tmp); touch /tmp/old; echo pid $$; exec sleep 1000";
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &make_rootfs(dir.path(), "n1"),
        script,
    )));
    let first = agent.started("n1");
    agent.wait_for(
        "first run's output",
        |m| matches!(m, AgentToHost::Output { data, .. } if data.ends_with(b"pid 1\n")),
    );

    // Act: kill, restart a dead node, restart a running one.
    agent.send(&HostToAgent::Kill {
        node: "n1".into(),
        signal: libc::SIGKILL,
    });
    let killed = agent.exited("n1");
    agent.send(&HostToAgent::Kill {
        node: "n1".into(),
        signal: libc::SIGKILL,
    });
    let kill_dead = agent.error(ErrorContext::Kill { node: "n1".into() });
    agent.send(&HostToAgent::Restart { node: "n1".into() });
    let second = agent.started("n1");
    agent.wait_for(
        "second run's output",
        |m| matches!(m, AgentToHost::Output { data, .. } if data.ends_with(b"pid 1\n")),
    );
    agent.send(&HostToAgent::Restart { node: "n1".into() });
    let restarted = agent.exited("n1");
    let third = agent.started("n1");
    agent.wait_for(
        "third run's output",
        |m| matches!(m, AgentToHost::Output { data, .. } if data.ends_with(b"pid 1\n")),
    );

    // Assert
    assert_eq!(killed, ExitStatus::Signal(libc::SIGKILL));
    assert!(kill_dead.contains("not running"), "{kill_dead}");
    assert_eq!(restarted, ExitStatus::Signal(libc::SIGKILL));
    assert!(first != second && second != third);
    assert_eq!(
        agent.output(Some("n1"), Stream::Stdout),
        "runs\ntmp\npid 1\nruns x\ntmp\npid 1\nruns x x\ntmp\npid 1\n"
    );
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_nics_are_moved_addressed_and_nodes_reach_each_other() {
    if !can_run() {
        return;
    }
    // Arrange: a veth pair in the agent's own network namespace (it is in
    // it once it answers hello).
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("SKIPPED: needs iproute2's `ip` to create a veth pair");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let netns = format!("--net=/proc/{}/ns/net", agent.child.id());
    let created = Command::new("nsenter")
        .args([
            &netns, "ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
        ])
        .status()
        .unwrap();
    assert!(created.success());
    let mut n1 = node(
        "n1",
        &make_rootfs(dir.path(), "n1"),
        "ip -4 addr show dev veth0 | grep -o 'inet [0-9./]*'; ip link show lo | grep -o ,UP; \
         echo > /tmp/x; exec sleep 1000",
    );
    n1.nic = Some("veth0".into());
    n1.address = Some("192.0.2.1/24".into());
    let mut n2 = node(
        "n2",
        &make_rootfs(dir.path(), "n2"),
        "for i in 1 2 3 4 5 6 7 8 9 10; do \
           ping -c 1 -W 1 192.0.2.1 >/dev/null 2>&1 && echo reached && exit 0; done; exit 1",
    );
    n2.nic = Some("veth1".into());
    n2.address = Some("192.0.2.2/24".into());
    n2.hostname = Some("second".into());

    // Act
    agent.send(&HostToAgent::CreateNode(n1));
    agent.started("n1");
    agent.wait_output("n1", ",UP\n", 1);
    agent.send(&HostToAgent::CreateNode(n2));
    agent.started("n2");
    let n2_status = agent.exited("n2");
    let links = Command::new("nsenter")
        .args([&netns, "ip", "-o", "link", "show"])
        .output()
        .unwrap();
    // Restart keeps the node's network namespace, NIC and address.
    agent.send(&HostToAgent::Restart { node: "n1".into() });
    agent.exited("n1");
    agent.started("n1");
    agent.wait_output("n1", ",UP\n", 2);
    agent.send(&HostToAgent::StartWorkload {
        node: Some("n2".into()),
        command: vec!["hostname".into()],
        env: BTreeMap::new(),
    });
    let not_running = agent.error(ErrorContext::StartWorkload);

    // Assert
    assert_eq!(n2_status, ExitStatus::Code(0));
    assert_eq!(agent.output(Some("n2"), Stream::Stdout), "reached\n");
    assert_eq!(
        agent.output(Some("n1"), Stream::Stdout),
        "inet 192.0.2.1/24\n,UP\ninet 192.0.2.1/24\n,UP\n"
    );
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !links.contains("veth"),
        "moved out of the agent's netns: {links}"
    );
    assert!(not_running.contains("not running"), "{not_running}");
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_test_mode_agent_has_a_network_namespace_of_its_own() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let mut spec = node("n1", &make_rootfs(dir.path(), "n1"), "true");
    spec.nic = Some("detvisor-none0".into());

    // Act
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    let agents = std::fs::read_link(format!("/proc/{}/ns/net", agent.child.id())).unwrap();
    assert_ne!(
        ours, agents,
        "the agent must not be in the host's network namespace"
    );
    agent.send(&HostToAgent::CreateNode(spec));
    let message = agent.error(ErrorContext::CreateNode { node: "n1".into() });

    // Assert
    assert!(message.contains("no network interface"), "{message}");
}

#[test]
fn test_protocol_errors_are_reported_and_the_agent_goes_on() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let rootfs = make_rootfs(dir.path(), "n1");
    let mut agent = AgentProcess::start();

    // Act + Assert
    agent.send(&HostToAgent::Pause { node: "n1".into() });
    assert_eq!(
        agent.error(ErrorContext::Pause { node: "n1".into() }),
        "expected hello first"
    );
    agent.send(&HostToAgent::Hello { version: 999 });
    assert!(agent.error(ErrorContext::Hello).contains("999"));
    agent.host.write_all(&frame_payload(b"{not json").unwrap());
    assert!(agent.error(ErrorContext::Channel).contains("malformed"));
    agent.hello();
    agent.send(&HostToAgent::Resume {
        node: "nope".into(),
    });
    assert!(agent
        .error(ErrorContext::Resume {
            node: "nope".into()
        })
        .contains("no node"));
    let mut missing = node("m", &dir.path().join("missing"), "true");
    agent.send(&HostToAgent::CreateNode(missing.clone()));
    assert!(agent
        .error(ErrorContext::CreateNode { node: "m".into() })
        .contains("missing"));
    missing.rootfs = rootfs.to_str().unwrap().into();
    missing.command = vec!["no-such-program".into()];
    agent.send(&HostToAgent::CreateNode(missing));
    let exec = agent.error(ErrorContext::CreateNode { node: "m".into() });
    assert!(exec.contains("exec \"no-such-program\""), "{exec}");
    agent.send(&HostToAgent::CreateNode(node("n1", &rootfs, "sleep 1000")));
    agent.started("n1");
    agent.send(&HostToAgent::CreateNode(node("n1", &rootfs, "true")));
    assert!(agent
        .error(ErrorContext::CreateNode { node: "n1".into() })
        .contains("exists"));
    agent.send(&HostToAgent::Kill {
        node: "n1".into(),
        signal: 0,
    });
    assert!(agent
        .error(ErrorContext::Kill { node: "n1".into() })
        .contains("invalid signal"));

    // An oversized length prefix loses the framing: error, then shutdown.
    agent.host.write_all(&(u32::MAX).to_le_bytes());
    assert!(agent.error(ErrorContext::Channel).contains("exceeds"));
    let status = agent.wait_exit();
    agent.collect_rest();
    assert!(status.success());
    assert!(agent.log.contains(&AgentToHost::Exited {
        node: "n1".into(),
        status: ExitStatus::Signal(9)
    }));
}

#[test]
fn test_channel_end_shuts_the_agent_down() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &make_rootfs(dir.path(), "n1"),
        "exec sleep 1000",
    )));
    let pid = agent.started("n1");

    // Act
    if let Host::Socket(socket) = &agent.host {
        socket.shutdown(std::net::Shutdown::Both).unwrap();
    }
    let status = agent.wait_exit();

    // Assert
    assert!(status.success());
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
}

/// A pty as the channel, like /dev/hvc0: the agent must put it in raw mode,
/// or frames whose bytes look like ^D, XOFF, CR, LF or ^C would be eaten,
/// translated or echoed.
#[test]
fn test_pty_channel_is_raw_in_both_directions() {
    if !can_run() {
        return;
    }
    // Arrange
    // SAFETY: plain libc pty calls; ptsname's result is copied at once.
    let (master, slave_path) = unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(fd))
            .to_str()
            .unwrap()
            .to_string();
        (std::fs::File::from(OwnedFd::from_raw_fd(fd)), name)
    };
    let child = Command::new(agent_bin())
        .args(["--mode", "test", "--channel", &slave_path])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut agent = AgentProcess::with(child, Host::Pty(master));
    // The host sends nothing before the agent's first frame (raw mode is
    // set by then).
    agent.wait_for("booted", |m| matches!(m, AgentToHost::Booted { .. }));

    // Act: hellos padded (JSON allows whitespace) to lengths whose prefix
    // bytes are ^D ^S (0x1304), LF CR (0x0d0a) and ^C ^Q (0x1103).
    for len in [0x1304usize, 0x0d0a, 0x1103] {
        let mut json = format!(r#"{{"type":"hello","version":{PROTOCOL_VERSION}}}"#).into_bytes();
        json.resize(len, b' ');
        agent.host.write_all(&frame_payload(&json).unwrap());
    }
    for _ in 0..3 {
        agent.wait_for("ready", |m| matches!(m, AgentToHost::Ready { .. }));
    }
    // An output frame whose length prefix has an LF byte (0x0a), which
    // output processing (ONLCR) would turn into CR LF.
    let size = (1000..6000)
        .find(|&n| {
            let frame = encode_frame(&AgentToHost::Output {
                node: None,
                stream: Stream::Stdout,
                data: vec![0; n],
            })
            .unwrap();
            frame[..4].contains(&0x0a)
        })
        .unwrap();
    agent.send(&HostToAgent::StartWorkload {
        node: None,
        command: vec![
            "head".into(),
            "-c".into(),
            size.to_string(),
            "/dev/zero".into(),
        ],
        env: BTreeMap::new(),
    });
    agent.wait_for("workload_exited", |m| {
        matches!(m, AgentToHost::WorkloadExited { .. })
    });

    // Assert
    assert_eq!(agent.output(None, Stream::Stdout), "\0".repeat(size));
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

#[test]
fn test_shell_pauses_the_nodes_and_runs_sh_on_a_terminal_inside_a_node() {
    if !can_run() {
        return;
    }
    // Arrange: a node whose PID 1 ticks.
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    agent.send(&HostToAgent::CreateNode(node(
        "n1",
        &make_rootfs(dir.path(), "n1"),
        "while :; do echo a; sleep 0.05; done",
    )));
    let pid = agent.started("n1");

    // Act: open a shell inside n1, wait for its prompt, type.
    agent.send(&HostToAgent::OpenShell {
        node: Some("n1".into()),
        rows: 30,
        cols: 100,
        term: None,
    });
    agent.wait_for("paused", |m| matches!(m, AgentToHost::Paused { .. }));
    agent.wait_for("shell opened", |m| {
        matches!(m, AgentToHost::ShellOpened { .. })
    });
    agent.send(&HostToAgent::OpenShell {
        node: None,
        rows: 0,
        cols: 0,
        term: None,
    });
    let second = agent.error(ErrorContext::OpenShell);
    let shell_output = |agent: &AgentProcess| -> String {
        agent
            .log
            .iter()
            .filter_map(|m| match m {
                AgentToHost::ShellOutput { data } => {
                    Some(String::from_utf8_lossy(data).into_owned())
                }
                _ => None,
            })
            .collect()
    };
    let deadline = Instant::now() + TIMEOUT;
    while !shell_output(&agent).contains("# ") && Instant::now() < deadline {
        agent.collect_for(Duration::from_millis(50));
    }
    // More than the terminal takes at once (4 KiB): the agent queues it.
    let mut typed = b": filler-line\n".repeat(1000);
    typed.extend_from_slice(b"echo via-$((6*7)); [ -t 0 ] && stty size; hostname\nexit 4\n");
    agent.send(&HostToAgent::ShellInput { data: typed });
    let exited = agent.wait_for("shell exited", |m| {
        matches!(m, AgentToHost::ShellExited { .. })
    });
    let text = shell_output(&agent);

    // Assert
    assert_eq!(second, "a shell is already open");
    assert_eq!(process_state(pid), 'T', "the node stays paused");
    assert!(text.contains("(fork) n1:/ # "), "{text}");
    assert!(text.contains("via-42\r\n"), "{text}");
    // A terminal, sized as asked.
    assert!(text.contains("30 100\r\n"), "{text}");
    assert!(text.contains("\r\nn1\r\n"), "{text}");
    assert_eq!(
        exited,
        AgentToHost::ShellExited {
            status: ExitStatus::Code(4)
        }
    );
    let (status, _) = agent.shutdown();
    assert!(status.success());
}

/// The test-composer requests: a template listed as the node sees its root
/// (sorted, `helper_` left out), commands started inside the node with
/// their output tagged by run id, a long one killed with its process
/// group, a missing one failing with an error and a 127 exit.
#[test]
fn test_template_commands_are_listed_started_and_killed_inside_a_node() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let root = make_rootfs(dir.path(), "n1");
    let template = root.join("opt/antithesis/test/v1/basic");
    std::fs::create_dir_all(&template).unwrap();
    for (file, body, mode) in [
        ("first_init.sh", "echo init $X $(hostname)", 0o755),
        ("parallel_driver_long.sh", "sleep 1000 & sleep 1000", 0o755),
        ("eventually_fail.sh", "echo bad >&2; exit 3", 0o755),
        ("helper_lib.sh", "echo helper", 0o644),
    ] {
        let path = template.join(file);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let broken = root.join("opt/antithesis/test/v1/broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("anytime_x"), "#!/bin/sh\n").unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let mut spec = node("n1", &root, "");
    spec.command = vec!["sleep".into(), "1000".into()];
    agent.send(&HostToAgent::CreateNode(spec));
    agent.started("n1");
    let start = |id: u32, command: &str| HostToAgent::StartCommand {
        id,
        node: "n1".into(),
        template: "basic".into(),
        command: command.into(),
        env: [("X".to_string(), "x1".to_string())].into(),
    };

    // Act + Assert: the listing.
    agent.send(&HostToAgent::ListTemplate {
        node: "n1".into(),
        template: "basic".into(),
    });
    assert_eq!(
        agent.wait_for("template_commands", |m| matches!(
            m,
            AgentToHost::TemplateCommands { .. }
        )),
        AgentToHost::TemplateCommands {
            template: "basic".into(),
            commands: vec![
                "eventually_fail.sh".into(),
                "first_init.sh".into(),
                "parallel_driver_long.sh".into()
            ],
        }
    );
    agent.send(&HostToAgent::ListTemplate {
        node: "n1".into(),
        template: "broken".into(),
    });
    let e = agent.error(ErrorContext::ListTemplate {
        template: "broken".into(),
    });
    assert!(
        e.contains("not executable") && e.contains("anytime_x"),
        "{e}"
    );

    // A command runs inside the node, with the environment given.
    agent.send(&start(1, "first_init.sh"));
    agent.wait_for("command_started 1", |m| {
        matches!(m, AgentToHost::CommandStarted { id: 1, .. })
    });
    let exited = |id: u32| move |m: &AgentToHost| matches!(m, AgentToHost::CommandExited { id: i, .. } if *i == id);
    assert_eq!(
        agent.wait_for("command_exited 1", exited(1)),
        AgentToHost::CommandExited {
            id: 1,
            status: ExitStatus::Code(0)
        }
    );
    // A long one (with a child in its group) is killed on request.
    agent.send(&start(2, "parallel_driver_long.sh"));
    let pid = match agent.wait_for("command_started 2", |m| {
        matches!(m, AgentToHost::CommandStarted { id: 2, .. })
    }) {
        AgentToHost::CommandStarted { pid, .. } => pid,
        _ => unreachable!(),
    };
    agent.send(&HostToAgent::KillCommand { id: 2 });
    assert_eq!(
        agent.wait_for("command_exited 2", exited(2)),
        AgentToHost::CommandExited {
            id: 2,
            status: ExitStatus::Signal(9)
        }
    );
    assert!(!Path::new(&format!("/proc/{pid}")).exists() || process_state(pid) == 'Z');
    // A failing one: its status; a missing one: an error, then 127.
    agent.send(&start(3, "eventually_fail.sh"));
    assert_eq!(
        agent.wait_for("command_exited 3", exited(3)),
        AgentToHost::CommandExited {
            id: 3,
            status: ExitStatus::Code(3)
        }
    );
    agent.send(&start(4, "nothing_here"));
    let e = agent.error(ErrorContext::StartCommand {
        command: "nothing_here".into(),
    });
    assert!(!e.is_empty());
    assert_eq!(
        agent.wait_for("command_exited 4", exited(4)),
        AgentToHost::CommandExited {
            id: 4,
            status: ExitStatus::Code(127)
        }
    );
    let (status, log) = agent.shutdown();
    assert!(status.success());
    let output = |id: u32, stream: Stream| -> String {
        log.iter()
            .filter_map(|m| match m {
                AgentToHost::CommandOutput {
                    id: i,
                    stream: s,
                    data,
                } if *i == id && *s == stream => Some(String::from_utf8_lossy(data).into_owned()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(output(1, Stream::Stdout), "init x1 n1\n");
    assert_eq!(output(3, Stream::Stderr), "bad\n");
}

#[test]
fn test_sdk_records_history_lines_random_and_local_output_reach_the_host() {
    if !can_run() {
        return;
    }
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start();
    agent.hello();
    let script = "test -s /usr/lib/libvoidstar.so && echo shim; \
                  detvisor-assert always 'in n1' --details '{\"k\":1}'; \
                  echo '{\"detvisor_history\":{\"op\":1}}'; \
                  echo \"random $(detvisor-assert random)\"; \
                  printf '{\"local\":1}\\n' > /local.jsonl; \
                  sleep 1";
    let root = make_rootfs(dir.path(), "n1");
    // detvisor-assert is the agent's binary: static in a guest, dynamic here.
    let ldd = Command::new("ldd").arg(agent_bin()).output().unwrap();
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let target = root.join(&lib[1..]);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(lib, target).unwrap();
    }
    let mut spec = node("n1", &root, script);
    spec.env = [(
        "ANTITHESIS_SDK_LOCAL_OUTPUT".to_string(),
        "/local.jsonl".to_string(),
    )]
    .into();

    // Act
    agent.send(&HostToAgent::CreateNode(spec));
    let request = agent.wait_for("random_request", |m| {
        matches!(m, AgentToHost::RandomRequest { .. })
    });
    let AgentToHost::RandomRequest { node, id } = request else {
        unreachable!()
    };
    assert_eq!(node.as_deref(), Some("n1"));
    agent.send(&HostToAgent::Random {
        id,
        value: 123_456_789,
    });
    agent.exited("n1");
    let (_, log) = agent.shutdown();

    // Assert
    let sdk: Vec<&str> = log
        .iter()
        .filter_map(|m| match m {
            AgentToHost::Sdk { node, json } if node.as_deref() == Some("n1") => Some(json.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(sdk.len(), 2, "{log:?}");
    let assert: serde_json::Value = serde_json::from_str(sdk[0]).unwrap();
    assert_eq!(assert["antithesis_assert"]["id"], "in n1");
    assert_eq!(assert["antithesis_assert"]["details"]["k"], 1);
    assert_eq!(sdk[1], "{\"local\":1}");
    assert!(log.iter().any(|m| matches!(m,
        AgentToHost::History { node: Some(n), json } if n == "n1" && json == "{\"detvisor_history\":{\"op\":1}}")));
    let stdout = AgentProcess::output_of(&log, Some("n1"));
    assert!(stdout.starts_with("shim\n"), "{stdout}");
    assert!(stdout.contains("random 123456789\n"), "{stdout}");
}
