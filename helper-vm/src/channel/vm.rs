//! [`HelperVm`]: the helper VM with a long-lived payload behind the channel.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::frame::FrameError;
use super::host::{CallError, Client, HandshakeError, ShutdownError, StartError, StdinSource};
use super::PORT_NAME;
use crate::launch::{LaunchSpec, Running};
use crate::qemu::VmFailed;
use crate::stdio::{poll_pair, Target};
use crate::{HelperVmConfig, PayloadFile};

/// How long [`HelperVm::start`] waits for the payload to open the channel (L1 boots in
/// 5-12 s under TCG; a loaded host is much slower).
pub const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long [`HelperVm::shutdown`] (and drop, and a failed call) waits for QEMU to exit
/// before killing it.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// A running helper VM whose payload serves calls over the channel.
///
/// The payload's own stdout and stderr (ttyS0, ttyS1: what it writes outside the channel,
/// e.g. a panic message) are not forwarded; their last lines are in the errors that report
/// its end. Its stdin is `/dev/null`.
pub struct HelperVm {
    /// `None` once stopped (after a failed call or shutdown).
    vm: Option<(Running, Client)>,
}

/// Ends `running` (waiting up to [`SHUTDOWN_TIMEOUT`]) and says what happened, after
/// `context`.
fn ended(running: Running, context: &str) -> VmFailed {
    let ended = running.end(Some(SHUTDOWN_TIMEOUT));
    let what = match ended.status {
        Some(code) => format!("the payload exited with status {code}"),
        None => ended.why,
    };
    ended.left.failure(format!("{context}: {what}"))
}

/// `e` and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl HelperVm {
    /// Boots the helper VM running `exe` with `args` (a program that calls
    /// [`super::serve`]; `files` as for [`crate::run`]) and waits until it has opened the
    /// channel (at most [`START_TIMEOUT`]).
    pub fn start(
        config: &HelperVmConfig,
        exe: &Path,
        args: &[OsString],
        files: &[PayloadFile],
    ) -> Result<HelperVm, StartError> {
        let spec = LaunchSpec {
            config,
            exe,
            args,
            files,
            forward_stdin: false,
            channel: Some(PORT_NAME),
            out: Target::Discard,
            err: Target::Discard,
        };
        let mut running = Running::start(&spec)?;
        let deadline = Instant::now() + START_TIMEOUT;
        let socket = running.socket.clone().unwrap_or_default();
        // QEMU creates the socket early in its start; until then connecting fails.
        let stream = loop {
            match UnixStream::connect(&socket) {
                Ok(stream) => break stream,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                    ) && !running.has_exited()
                        && Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(20));
                }
                Err(_) if running.has_exited() => {
                    return Err(ended(running, "QEMU ended before its channel was ready").into())
                }
                Err(source) => {
                    let _ = running.end(Some(Duration::ZERO));
                    return Err(StartError::Connect {
                        path: socket,
                        source,
                    });
                }
            }
        };
        // The hello comes once L1 has booted and the payload runs serve.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = left.min(Duration::from_secs(1)).as_millis() as i32;
            match poll_pair(stream.as_raw_fd(), -1, step) {
                Ok(Some(_)) => break,
                Ok(None) if !left.is_zero() => {}
                Ok(None) => {
                    let why = format!(
                        "the payload did not open the channel within {} s",
                        START_TIMEOUT.as_secs()
                    );
                    let ended = running.end(Some(Duration::ZERO));
                    return Err(ended.left.failure(why).into());
                }
                Err(source) => {
                    let _ = running.end(Some(Duration::ZERO));
                    return Err(StartError::Connect {
                        path: socket,
                        source,
                    });
                }
            }
        }
        match Client::handshake(stream) {
            Ok(client) => Ok(HelperVm {
                vm: Some((running, client)),
            }),
            Err(HandshakeError::Frame(FrameError::Closed)) => Err(ended(
                running,
                "the helper VM ended before the payload opened the channel",
            )
            .into()),
            Err(e) => {
                let _ = running.end(Some(Duration::ZERO));
                Err(e.into())
            }
        }
    }

    /// Sends `req` to the payload's handler, writes its output to `stdout` and `stderr` as it
    /// comes, feeds it `stdin` (none: it reads EOF at once), and returns its response. When
    /// the channel breaks (the payload or QEMU ended, a bad frame), the helper VM is stopped:
    /// the error says why, with the tails of everything that came back, and later calls fail
    /// with [`CallError::Stopped`].
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        req: &Req,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
        stdin: Option<StdinSource<'_>>,
    ) -> Result<Resp, CallError> {
        let (_, client) = self.vm.as_mut().ok_or(CallError::Stopped)?;
        match client.call(req, stdout, stderr, stdin) {
            Ok(resp) => Ok(resp),
            // The sinks or our stdin failed: the channel is still in step.
            Err(e @ (CallError::Output(_) | CallError::Stdin(_))) => Err(e),
            Err(e) => {
                let Some((running, _)) = self.vm.take() else {
                    return Err(e);
                };
                let context = match &e {
                    CallError::Receive(FrameError::Closed) => {
                        "the channel closed during a call".to_string()
                    }
                    other => format!("the channel broke during a call ({})", chain(other)),
                };
                Err(ended(running, &context).into())
            }
        }
    }

    /// Asks the payload to return from `serve`, waits for the helper VM to power off (killing
    /// QEMU after [`SHUTDOWN_TIMEOUT`]) and returns the payload's exit status.
    pub fn shutdown(mut self) -> Result<i32, ShutdownError> {
        let (running, client) = self.vm.take().ok_or(ShutdownError::Stopped)?;
        let _ = client.send_shutdown();
        drop(client);
        Ok(running.finish(Some(SHUTDOWN_TIMEOUT))?)
    }
}

impl Drop for HelperVm {
    /// As [`HelperVm::shutdown`], ignoring the outcome.
    fn drop(&mut self) {
        if let Some((running, client)) = self.vm.take() {
            let _ = client.send_shutdown();
            drop(client);
            let _ = running.end(Some(SHUTDOWN_TIMEOUT));
        }
    }
}
