//! The control channel: requests read and decoded, each handled in order
//! and answered (or answered with an error naming it), and messages sent.

use std::io;
use std::os::fd::AsFd;

use guest_agent::protocol::{
    encode_frame, AgentToHost, ErrorContext, ExitStatus, HostToAgent, PROTOCOL_VERSION,
};

use super::Agent;
use crate::clock::ClockChange;
use crate::sys;

impl Agent {
    pub(super) fn read_channel(&mut self, buffer: &mut [u8]) {
        match sys::read(self.channel.as_fd(), buffer) {
            Ok(0) => {
                self.channel_open = false;
                self.begin_shutdown();
                return;
            }
            Ok(n) => self.decoder.push(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                eprintln!("detvisor-agent: reading the channel: {e}");
                self.channel_open = false;
                self.begin_shutdown();
                return;
            }
        }
        loop {
            match self.decoder.next_message::<HostToAgent>() {
                Ok(Some(message)) => self.handle(message),
                Ok(None) => break,
                Err(error) => {
                    let fatal = error.is_fatal();
                    self.send_error(ErrorContext::Channel, error.to_string());
                    if fatal {
                        // The framing is lost: nothing more can be understood.
                        self.begin_shutdown();
                        break;
                    }
                }
            }
        }
    }

    pub(super) fn send(&mut self, message: &AgentToHost) {
        if !self.channel_open {
            return;
        }
        let frame = match encode_frame(message) {
            Ok(frame) => frame,
            Err(error) => {
                let fallback = AgentToHost::Error {
                    context: ErrorContext::Encode,
                    message: error.to_string(),
                };
                encode_frame(&fallback).expect("a short error message encodes")
            }
        };
        if let Err(error) = sys::write_all(self.channel.as_fd(), &frame) {
            eprintln!("detvisor-agent: writing the channel: {error}");
            self.channel_open = false;
            self.begin_shutdown();
        }
    }

    pub(super) fn send_error(&mut self, context: ErrorContext, message: String) {
        self.send(&AgentToHost::Error { context, message });
    }

    fn handle(&mut self, message: HostToAgent) {
        let context = message.error_context();
        let failed_command = match &message {
            HostToAgent::StartCommand { id, .. } => Some(*id),
            _ => None,
        };
        let result = if self.shutting_down {
            Err("the agent is shutting down".to_string())
        } else if let HostToAgent::Hello { version } = message {
            self.hello(version)
        } else if let HostToAgent::Reseed { bytes } = &message {
            // The kernel's, not the nodes': fine before hello.
            sys::reseed_kernel_rng(bytes).map_err(|e| e.to_string())
        } else if !self.greeted {
            Err("expected hello first".to_string())
        } else {
            match message {
                HostToAgent::Hello { .. } => unreachable!("handled above"),
                HostToAgent::CreateNode(spec) => self.create_node(spec),
                HostToAgent::StartWorkload { node, command, env } => {
                    self.start_workload(node, &command, &env)
                }
                HostToAgent::Pause { node } => self.pause(&node, true),
                HostToAgent::Resume { node } => self.pause(&node, false),
                HostToAgent::Kill { node, signal } => self.kill(&node, signal),
                HostToAgent::Restart { node } => self.restart(&node),
                HostToAgent::Crash { node } => self.crash(&node),
                HostToAgent::MountDisk { node } => self.mount_disk(&node),
                HostToAgent::FillDisk { node } => self.fill_disk(&node),
                HostToAgent::FreeDisk { node } => self.free_disk(&node),
                HostToAgent::StepClock { node, by_ns } => {
                    self.change_clock(&node, ClockChange::Step(by_ns))
                }
                HostToAgent::DriftClock { node, ppm } => {
                    self.change_clock(&node, ClockChange::Rate(ppm))
                }
                HostToAgent::Shutdown => {
                    self.begin_shutdown();
                    Ok(())
                }
                HostToAgent::OpenShell {
                    node,
                    rows,
                    cols,
                    term,
                } => self.open_shell(node, rows, cols, term),
                HostToAgent::ShellInput { data } => self.shell_input(&data),
                HostToAgent::Reseed { .. } => unreachable!("handled above"),
                HostToAgent::Random { id, value } => {
                    if let Some(sdk) = &mut self.sdk {
                        sdk.answer_random(id, value);
                    }
                    Ok(())
                }
                HostToAgent::ListTemplate { node, template } => {
                    self.list_template(&node, &template)
                }
                HostToAgent::StartCommand {
                    id,
                    node,
                    template,
                    command,
                    env,
                } => self.start_command(id, &node, &template, &command, &env),
                HostToAgent::KillCommand { id } => self.kill_command(id),
                HostToAgent::Exec(spec) => self.exec(spec),
                HostToAgent::ReadFile {
                    id,
                    node,
                    path,
                    limit,
                } => self.read_file(id, node.as_deref(), &path, limit),
                HostToAgent::Processes { id, node } => self.processes(id, node.as_deref()),
            }
        };
        if let Err(message) = result {
            self.send_error(context, message);
            if let Some(id) = failed_command {
                // The host waits for every run's end: this one ends here.
                self.send(&AgentToHost::CommandExited {
                    id,
                    status: ExitStatus::Code(127),
                });
            }
        }
    }

    fn hello(&mut self, version: u32) -> Result<(), String> {
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "the host speaks protocol version {version}, the agent {PROTOCOL_VERSION}"
            ));
        }
        self.greeted = true;
        self.send(&AgentToHost::Ready {
            version: PROTOCOL_VERSION,
        });
        Ok(())
    }
}
