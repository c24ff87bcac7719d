//! Where a campaign's runs happen: a [`Runner`] answers the run library's
//! requests, in this process ([`InProcess`], on a host whose KVM runs
//! Linux) or in a helper VM (the CLI's runner). The campaign itself, its
//! database and its findings stay in the calling process either way.

use run::api::{CheckpointId, Controller, Position, Request, Response, RunId, Until};
use run::records::GuestRecord;
use run::RunSummary;
use std::sync::mpsc;

/// Why a request to a runner failed: the run library's error chain as text
/// (the same whether the run is here or in a helper VM).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("{request}: {message}")]
    Failed {
        request: &'static str,
        message: String,
    },
    #[error("{request}: unexpected answer {answer}")]
    Unexpected {
        request: &'static str,
        answer: String,
    },
}

/// Answers run requests, somewhere.
pub trait Runner {
    fn call(&mut self, request: Request) -> Result<Response, String>;
}

/// A borrowed runner (a campaign's only worker, its caller's).
impl<R: Runner + ?Sized> Runner for &mut R {
    fn call(&mut self, request: Request) -> Result<Response, String> {
        (**self).call(request)
    }
}

/// The run library in this process, on a thread of its own: a run's state
/// (its output callbacks among it) may not move between threads, and a
/// campaign's workers each call their runner from a thread of the
/// campaign's. The thread ends when the runner is dropped.
pub struct InProcess {
    requests: Option<mpsc::Sender<Request>>,
    replies: mpsc::Receiver<Result<Response, String>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The run library thread's stack: a guest's exits are handled on it, as
/// they would be on a main thread's (8 MiB), with room to spare.
const RUN_THREAD_STACK: usize = 32 << 20;

impl InProcess {
    pub fn new() -> Self {
        let (requests, incoming) = mpsc::channel::<Request>();
        let (outgoing, replies) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("run-library".into())
            .stack_size(RUN_THREAD_STACK)
            .spawn(move || {
                let mut controller = Controller::new();
                for request in incoming {
                    let reply = controller
                        .handle(request, &run::streams::Discard)
                        .map_err(|e| run::chain(&e));
                    if outgoing.send(reply).is_err() {
                        break;
                    }
                }
            })
            .expect("starting the run library's thread");
        InProcess {
            requests: Some(requests),
            replies,
            thread: Some(thread),
        }
    }
}

impl Default for InProcess {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop (its runs closed with it).
        drop(self.requests.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Runner for InProcess {
    fn call(&mut self, request: Request) -> Result<Response, String> {
        let lost = || "the run library's thread ended (it panicked)".to_string();
        self.requests
            .as_ref()
            .expect("open until dropped")
            .send(request)
            .map_err(|_| lost())?;
        self.replies.recv().map_err(|_| lost())?
    }
}

/// Typed calls over a [`Runner`]: each checks its answer's kind.
pub struct Calls<'a> {
    pub runner: &'a mut dyn Runner,
}

fn unexpected(request: &'static str, answer: Response) -> RunnerError {
    let mut answer = format!("{answer:?}");
    answer.truncate(200);
    RunnerError::Unexpected { request, answer }
}

impl Calls<'_> {
    fn call(&mut self, name: &'static str, request: Request) -> Result<Response, RunnerError> {
        self.runner
            .call(request)
            .map_err(|message| RunnerError::Failed {
                request: name,
                message,
            })
    }

    pub fn start(&mut self, request: Request) -> Result<(RunId, Position), RunnerError> {
        match self.call("starting the run", request)? {
            Response::Started { run, position } => Ok((run, position)),
            other => Err(unexpected("starting the run", other)),
        }
    }

    fn position(&mut self, name: &'static str, request: Request) -> Result<Position, RunnerError> {
        match self.call(name, request)? {
            Response::Position(position) => Ok(position),
            other => Err(unexpected(name, other)),
        }
    }

    pub fn run_until(&mut self, run: RunId, until: Until) -> Result<Position, RunnerError> {
        self.position("running", Request::RunUntil { run, until })
    }

    pub fn collect_records(&mut self, run: RunId) -> Result<Position, RunnerError> {
        self.position("collecting records", Request::CollectRecords { run })
    }

    pub fn take_records(&mut self, run: RunId) -> Result<Vec<GuestRecord>, RunnerError> {
        match self.call("taking records", Request::TakeRecords { run })? {
            Response::Records { records } => Ok(records),
            other => Err(unexpected("taking records", other)),
        }
    }

    pub fn checkpoint(&mut self, run: RunId) -> Result<(CheckpointId, Position), RunnerError> {
        match self.call("checkpointing", Request::Checkpoint { run })? {
            Response::Checkpoint {
                checkpoint,
                position,
            } => Ok((checkpoint, position)),
            other => Err(unexpected("checkpointing", other)),
        }
    }

    pub fn reset(&mut self, run: RunId, checkpoint: CheckpointId) -> Result<Position, RunnerError> {
        self.position("resetting", Request::Reset { run, checkpoint })
    }

    pub fn rekey(&mut self, run: RunId, seed: u64) -> Result<Position, RunnerError> {
        self.position("re-keying", Request::Rekey { run, seed })
    }

    pub fn inject(
        &mut self,
        run: RunId,
        fault: run::faults::Fault,
    ) -> Result<Position, RunnerError> {
        self.position("injecting a fault", Request::InjectFault { run, fault })
    }

    pub fn outcome(&mut self, run: RunId) -> Result<RunSummary, RunnerError> {
        match self.call("reading the outcome", Request::Outcome { run })? {
            Response::Summary(summary) => Ok(summary),
            other => Err(unexpected("reading the outcome", other)),
        }
    }

    /// Lets a checkpoint go (its pages are freed in the runner); what the
    /// run's checkpoints hold after.
    pub fn drop_checkpoint(
        &mut self,
        run: RunId,
        checkpoint: CheckpointId,
    ) -> Result<vmm::vm::CheckpointMemory, RunnerError> {
        match self.call(
            "dropping a checkpoint",
            Request::DropCheckpoint { run, checkpoint },
        )? {
            Response::CheckpointMemory(memory) => Ok(memory),
            other => Err(unexpected("dropping a checkpoint", other)),
        }
    }

    /// How much the run's checkpoints hold.
    pub fn checkpoint_memory(
        &mut self,
        run: RunId,
    ) -> Result<vmm::vm::CheckpointMemory, RunnerError> {
        match self.call(
            "reading checkpoint memory",
            Request::CheckpointMemory { run },
        )? {
            Response::CheckpointMemory(memory) => Ok(memory),
            other => Err(unexpected("reading checkpoint memory", other)),
        }
    }

    /// Writes the run's present moment to disk (see `Request::Spill`).
    pub fn spill(
        &mut self,
        run: RunId,
        dir: &std::path::Path,
        id: &str,
        parent: Option<String>,
    ) -> Result<run::snapshots::SnapshotRow, RunnerError> {
        let request = Request::Spill {
            run,
            dir: dir.to_owned(),
            id: id.to_owned(),
            parent,
        };
        match self.call("spilling a moment", request)? {
            Response::Snapshot(row) => Ok(row),
            other => Err(unexpected("spilling a moment", other)),
        }
    }

    /// Loads a spilled moment back into the run, in place.
    pub fn load_in_place(
        &mut self,
        run: RunId,
        dir: &std::path::Path,
    ) -> Result<(Position, vmm::vm::LoadStats), RunnerError> {
        let request = Request::LoadInPlace {
            run,
            dir: dir.to_owned(),
        };
        match self.call("loading a spilled moment", request)? {
            Response::Loaded { position, stats } => Ok((position, stats)),
            other => Err(unexpected("loading a spilled moment", other)),
        }
    }

    pub fn close(&mut self, run: RunId) -> Result<(), RunnerError> {
        match self.call("closing the run", Request::Close { run })? {
            Response::Closed => Ok(()),
            other => Err(unexpected("closing the run", other)),
        }
    }
}
