//! `detvisor serve-channel` (hidden): what runs inside the helper VM. One
//! long-lived process answers the run library's requests arriving on the
//! helper VM's channel, holding live runs between them; each request's
//! output goes back as the channel's stdout and stderr frames of that call.

use anyhow::Result;
use helper_vm::channel::{CallIo, OutputWriter};
use run::api::{Controller, Reply, Request};
use run::streams::{Input, Streams};
use std::cell::RefCell;

/// One call's streams: its output frames and its stdin.
struct CallStreams {
    stdout: OutputWriter,
    stderr: OutputWriter,
    stdin: RefCell<Option<Input>>,
}

impl Streams for CallStreams {
    fn stdout(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(self.stdout.clone())
    }
    fn stderr(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(self.stderr.clone())
    }
    fn stdin(&self) -> Option<Input> {
        self.stdin.borrow_mut().take()
    }
}

/// Serves requests until the host shuts the channel down.
pub fn serve() -> Result<u8> {
    // This process is detvisor's own: once the first guest is set up, the
    // seccomp filter covers every thread of it (the channel's reader
    // among them), for every later request too. `Request::Seccomp` turns
    // it off before that, for `--no-seccomp`.
    vmm::seccomp::set_scope(vmm::seccomp::Scope::Process);
    let mut controller = Controller::new();
    helper_vm::channel::serve(|request: Request, io: &mut CallIo| -> Reply {
        let input = io.stdin.take_receiver();
        // A fork's shell ends at Ctrl-D, as on the host.
        let input = match request {
            Request::Shell(_) => run::streams::until_eot(input),
            _ => input,
        };
        let streams = CallStreams {
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            stdin: RefCell::new(Some(input)),
        };
        controller
            .handle(request, &streams)
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    })?;
    Ok(0)
}
