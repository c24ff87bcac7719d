//! Host side of `agent/test-qemu.sh`: drives the agent, running as PID 1 of
//! a QEMU guest, over the virtio console's chardev socket, with the same
//! protocol code the VMM will use.
//!
//! ```text
//! qemu_smoke SOCKET
//! ```
//! Scenario: two nodes on two virtio-net NICs connected by a QEMU hub; n2
//! pings n1; pause/resume and restart n1; a workload in n1 exits 3; then
//! shutdown (the agent writes 3 to port 0x610 and reboots). Exits 0 if
//! every answer was as expected; prints the conversation.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use guest_agent::protocol::{
    encode_frame, AgentToHost, ExitStatus, FrameDecoder, HostToAgent, NodeSpec, Stream,
    PROTOCOL_VERSION,
};

struct Host {
    socket: UnixStream,
    decoder: FrameDecoder,
    log: Vec<AgentToHost>,
    taken: Vec<bool>,
}

impl Host {
    fn send(&mut self, message: HostToAgent) {
        println!("-> {message:?}");
        self.socket
            .write_all(&encode_frame(&message).unwrap())
            .unwrap();
    }

    fn wait_for(&mut self, what: &str, predicate: impl Fn(&AgentToHost) -> bool) -> AgentToHost {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            // The first message not returned before that matches.
            self.taken.resize(self.log.len(), false);
            if let Some(index) =
                (0..self.log.len()).find(|&i| !self.taken[i] && predicate(&self.log[i]))
            {
                self.taken[index] = true;
                return self.log[index].clone();
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what}");
            }
            let n = match self.socket.read(&mut buffer) {
                Ok(0) => panic!("channel closed while waiting for {what}"),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("read: {e}"),
            };
            self.decoder.push(&buffer[..n]);
            while let Some(message) = self.decoder.next_message::<AgentToHost>().unwrap() {
                match &message {
                    AgentToHost::Output { node, stream, data } => println!(
                        "<- output {node:?} {stream:?} {:?}",
                        String::from_utf8_lossy(data)
                    ),
                    other => println!("<- {other:?}"),
                }
                self.log.push(message);
            }
        }
    }

    fn output(&self, node: &str) -> String {
        self.log
            .iter()
            .filter_map(|m| match m {
                AgentToHost::Output {
                    node: Some(n),
                    stream: Stream::Stdout,
                    data,
                } if n == node => Some(String::from_utf8_lossy(data).into_owned()),
                _ => None,
            })
            .collect()
    }
}

fn node(name: &str, nic: &str, address: &str, script: &str) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        rootfs: format!("/nodes/{name}"),
        hostname: None,
        nic: Some(nic.into()),
        address: Some(address.into()),
        env: BTreeMap::new(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        disk: None,
    }
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: qemu_smoke SOCKET");
    let deadline = Instant::now() + Duration::from_secs(30);
    let socket = loop {
        match UnixStream::connect(&path) {
            Ok(socket) => break socket,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("connect {path}: {e}"),
        }
    };
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut host = Host {
        socket,
        decoder: FrameDecoder::default(),
        log: Vec::new(),
        taken: Vec::new(),
    };

    // Nothing may be sent before the agent's first frame.
    host.wait_for("booted", |m| matches!(m, AgentToHost::Booted { .. }));
    host.send(HostToAgent::Hello {
        version: PROTOCOL_VERSION,
    });
    host.wait_for("ready", |m| matches!(m, AgentToHost::Ready { .. }));
    host.send(HostToAgent::CreateNode(node(
        "n1",
        "eth0",
        "192.0.2.1/24",
        "hostname; echo pid $$; ip -4 addr show dev eth0 | grep -o 'inet [0-9./]*'; \
         while :; do sleep 1; done",
    )));
    host.wait_for(
        "n1 started",
        |m| matches!(m, AgentToHost::NodeStarted { name, .. } if name == "n1"),
    );
    host.send(HostToAgent::CreateNode(node(
        "n2",
        "eth1",
        "192.0.2.2/24",
        "hostname; for i in 1 2 3 4 5 6 7 8 9 10; do \
           ping -c 1 -W 1 192.0.2.1 >/dev/null && echo reached && exit 0; done; exit 1",
    )));
    let n2 = host.wait_for(
        "n2 exited",
        |m| matches!(m, AgentToHost::Exited { node, .. } if node == "n2"),
    );
    assert_eq!(
        n2,
        AgentToHost::Exited {
            node: "n2".into(),
            status: ExitStatus::Code(0)
        }
    );
    host.wait_for("n1's address", |m| {
        matches!(m, AgentToHost::Output { node: Some(n), data, .. }
            if n == "n1" && data.ends_with(b"/24\n"))
    });
    assert_eq!(host.output("n2"), "n2\nreached\n");
    assert_eq!(host.output("n1"), "n1\npid 1\ninet 192.0.2.1/24\n");

    host.send(HostToAgent::Pause { node: "n1".into() });
    host.wait_for("paused", |m| matches!(m, AgentToHost::Paused { .. }));
    host.send(HostToAgent::Resume { node: "n1".into() });
    host.wait_for("resumed", |m| matches!(m, AgentToHost::Resumed { .. }));
    host.send(HostToAgent::Restart { node: "n1".into() });
    host.wait_for("n1 killed", |m| {
        matches!(m, AgentToHost::Exited { node, status: ExitStatus::Signal(9) } if node == "n1")
    });
    host.wait_for(
        "n1 restarted",
        |m| matches!(m, AgentToHost::NodeStarted { name, .. } if name == "n1"),
    );
    host.send(HostToAgent::StartWorkload {
        node: Some("n1".into()),
        command: vec!["sh".into(), "-c".into(), "hostname; exit 3".into()],
        env: BTreeMap::new(),
    });
    let workload = host.wait_for("workload exited", |m| {
        matches!(m, AgentToHost::WorkloadExited { .. })
    });
    assert_eq!(
        workload,
        AgentToHost::WorkloadExited {
            status: ExitStatus::Code(3)
        }
    );
    host.send(HostToAgent::Shutdown);
    host.wait_for(
        "n1 exited",
        |m| matches!(m, AgentToHost::Exited { node, .. } if node == "n1"),
    );
    println!("qemu_smoke: all answers as expected");
}
