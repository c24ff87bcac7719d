//! The harness of the agent's end-to-end tests (tests/agent.rs,
//! tests/local_output.rs): the agent binary over a socketpair, node roots
//! from the static busybox.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use guest_agent::protocol::{
    encode_frame, AgentToHost, ErrorContext, ExitStatus, FrameDecoder, HostToAgent, NodeSpec,
    Stream, PROTOCOL_VERSION,
};

pub const TIMEOUT: Duration = Duration::from_secs(20);

pub fn agent_bin() -> PathBuf {
    std::env::var_os("DETVISOR_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_detvisor-agent")))
}

/// These tests need root (namespaces, mounts). Returns false (and says so)
/// when not root.
pub fn can_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("SKIPPED: the agent's end-to-end tests need root");
    }
    root
}

/// Either end of the channel: a socketpair end or a pty master.
pub enum Host {
    Socket(UnixStream),
    Pty(std::fs::File),
}

impl Host {
    pub fn write_all(&mut self, bytes: &[u8]) {
        match self {
            Host::Socket(s) => s.write_all(bytes).unwrap(),
            Host::Pty(f) => f.write_all(bytes).unwrap(),
        }
    }

    /// Waits up to `timeout` for bytes; empty on timeout.
    pub fn read_some(&mut self, timeout: Duration) -> Vec<u8> {
        let fd = match self {
            Host::Socket(s) => s.as_raw_fd(),
            Host::Pty(f) => f.as_raw_fd(),
        };
        let mut pollfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pollfd, 1, timeout.as_millis() as i32) };
        if n <= 0 {
            return Vec::new();
        }
        let mut buffer = vec![0u8; 256 << 10];
        let n = match self {
            Host::Socket(s) => s.read(&mut buffer),
            Host::Pty(f) => f.read(&mut buffer),
        }
        .unwrap_or(0);
        buffer.truncate(n);
        buffer
    }
}

pub struct AgentProcess {
    pub child: Child,
    pub host: Host,
    pub decoder: FrameDecoder,
    /// Every message received so far, in order.
    pub log: Vec<AgentToHost>,
    /// Which messages of `log` a `wait_for` has already returned.
    pub taken: Vec<bool>,
    /// Index in `log` of the message the last `wait_for` returned.
    pub last: usize,
    pub closed: bool,
}

impl AgentProcess {
    /// Starts the agent over a socketpair.
    pub fn start() -> Self {
        let (host, agent_end) = UnixStream::pair().unwrap();
        let agent_fd = agent_end.as_raw_fd();
        let mut command = Command::new(agent_bin());
        command.args(["--mode", "test", "--channel-fd", "3"]);
        // SAFETY: between fork and exec the closure makes system calls only.
        unsafe {
            command.pre_exec(move || {
                if agent_fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0);
                } else if libc::dup2(agent_fd, 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.stdin(Stdio::null()).spawn().unwrap();
        drop(agent_end);
        let mut agent = Self::with(child, Host::Socket(host));
        let booted = agent.wait_for("booted", |_| true);
        assert_eq!(
            booted,
            AgentToHost::Booted {
                version: PROTOCOL_VERSION
            },
            "the agent's first frame"
        );
        agent
    }

    pub fn with(child: Child, host: Host) -> Self {
        Self {
            child,
            host,
            decoder: FrameDecoder::default(),
            log: Vec::new(),
            taken: Vec::new(),
            last: 0,
            closed: false,
        }
    }

    pub fn send(&mut self, message: &HostToAgent) {
        self.host.write_all(&encode_frame(message).unwrap());
    }

    pub fn hello(&mut self) {
        self.send(&HostToAgent::Hello {
            version: PROTOCOL_VERSION,
        });
        self.wait_for(
            "ready",
            |m| matches!(m, AgentToHost::Ready { version } if *version == PROTOCOL_VERSION),
        );
    }

    /// Reads more messages into the log; false on timeout or end of channel.
    pub fn receive(&mut self, timeout: Duration) -> bool {
        if self.closed {
            return false;
        }
        let bytes = self.host.read_some(timeout);
        if bytes.is_empty() {
            // Timeout, or EOF if the socket is readable with nothing in it.
            if let Ok(Some(_)) = self.child.try_wait() {
                self.closed = true;
            }
            return false;
        }
        self.decoder.push(&bytes);
        while let Some(message) = self.decoder.next_message().unwrap() {
            self.log.push(message);
        }
        true
    }

    /// The first message not returned before that satisfies `predicate`.
    /// Panics after [`TIMEOUT`].
    pub fn wait_for(
        &mut self,
        what: &str,
        predicate: impl Fn(&AgentToHost) -> bool,
    ) -> AgentToHost {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            self.taken.resize(self.log.len(), false);
            if let Some(index) =
                (0..self.log.len()).find(|&i| !self.taken[i] && predicate(&self.log[i]))
            {
                self.taken[index] = true;
                self.last = index;
                return self.log[index].clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero()
                || (!self.receive(left.min(Duration::from_millis(200))) && self.closed)
            {
                panic!(
                    "no {what} within {TIMEOUT:?}; messages:\n{}",
                    self.summary()
                );
            }
        }
    }

    /// The log, one line per message, output as text.
    pub fn summary(&self) -> String {
        self.log
            .iter()
            .map(|message| match message {
                AgentToHost::Output { node, stream, data } => {
                    format!(
                        "output {node:?} {stream:?} {:?}",
                        String::from_utf8_lossy(data)
                    )
                }
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until `node`'s stdout holds `count` copies of `text`.
    pub fn wait_output(&mut self, node: &str, text: &str, count: usize) {
        let deadline = Instant::now() + TIMEOUT;
        while self
            .output(Some(node), Stream::Stdout)
            .matches(text)
            .count()
            < count
        {
            assert!(
                Instant::now() < deadline,
                "no {count}x {text:?} from {node}; messages:\n{}",
                self.summary()
            );
            self.receive(Duration::from_millis(100));
        }
    }

    /// Collects messages for `duration`.
    pub fn collect_for(&mut self, duration: Duration) {
        let deadline = Instant::now() + duration;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if !self.receive(left) && self.closed {
                break;
            }
        }
    }

    /// All output of `node` (`None`: the workload) on `stream` so far.
    pub fn output(&self, node: Option<&str>, stream: Stream) -> String {
        let mut bytes = Vec::new();
        for message in &self.log {
            if let AgentToHost::Output {
                node: n,
                stream: s,
                data,
            } = message
            {
                if n.as_deref() == node && *s == stream {
                    bytes.extend_from_slice(data);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn exited(&mut self, node: &str) -> ExitStatus {
        match self.wait_for(
            &format!("exited {node}"),
            |m| matches!(m, AgentToHost::Exited { node: n, .. } if n == node),
        ) {
            AgentToHost::Exited { status, .. } => status,
            _ => unreachable!(),
        }
    }

    pub fn started(&mut self, node: &str) -> i32 {
        match self.wait_for(
            &format!("node_started {node}"),
            |m| matches!(m, AgentToHost::NodeStarted { name, .. } if name == node),
        ) {
            AgentToHost::NodeStarted { pid, .. } => pid,
            _ => unreachable!(),
        }
    }

    pub fn error(&mut self, context: ErrorContext) -> String {
        match self.wait_for(
            &format!("error {context}"),
            |m| matches!(m, AgentToHost::Error { context: c, .. } if *c == context),
        ) {
            AgentToHost::Error { message, .. } => message,
            _ => unreachable!(),
        }
    }

    /// Sends `shutdown` and waits for the agent to exit; returns its status.
    pub fn shutdown(mut self) -> (std::process::ExitStatus, Vec<AgentToHost>) {
        self.send(&HostToAgent::Shutdown);
        let status = self.wait_exit();
        self.collect_rest();
        (status, std::mem::take(&mut self.log))
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the agent did not exit");
            self.receive(Duration::from_millis(50));
        }
    }

    pub fn collect_rest(&mut self) {
        while self.receive(Duration::from_millis(100)) {}
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Nodes die with the agent (PR_SET_PDEATHSIG).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node root directory: the static busybox and a link per applet.
pub fn make_rootfs(parent: &Path, name: &str) -> PathBuf {
    let busybox = Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "/bin/busybox is missing: apt-get install busybox-static"
    );
    let root = parent.join(name);
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(busybox, bin.join("busybox")).unwrap();
    let list = Command::new(busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
    }
    root
}

pub fn node(name: &str, rootfs: &Path, script: &str) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        rootfs: rootfs.to_str().unwrap().to_string(),
        hostname: None,
        nic: None,
        address: None,
        env: BTreeMap::new(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        disk: None,
    }
}

pub fn process_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // "pid (comm) S ...": the state follows the last ')'.
    stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap()
}

pub fn children_of(pid: i32) -> Vec<i32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

impl AgentProcess {
    pub fn output_of(log: &[AgentToHost], node: Option<&str>) -> String {
        let mut bytes = Vec::new();
        for message in log {
            if let AgentToHost::Output {
                node: n,
                stream: Stream::Stdout,
                data,
            } = message
            {
                if n.as_deref() == node {
                    bytes.extend_from_slice(data);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
