//! The MCP server of one client session (rmcp's `ServerHandler`): lists the
//! tools and runs each call on the client's own thread, off the async
//! runtime, telling its progress and stopping it when the client cancels.

use crate::client::{CallEnv, CallError, ClientState, Progress, Shared};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A call sent to the client's thread.
type Job = Box<dyn FnOnce(&mut ClientState) + Send>;

/// The client's thread: it holds the client's debugger sessions and runs
/// its calls one after the other; it closes them and ends when the
/// handler (the client's session) is dropped.
struct ClientThread {
    jobs: crossbeam_channel::Sender<Job>,
}

impl ClientThread {
    fn start(shared: Arc<Shared>) -> std::io::Result<ClientThread> {
        let (jobs, incoming) = crossbeam_channel::unbounded::<Job>();
        std::thread::Builder::new()
            .name("mcp-client".into())
            .stack_size(16 << 20)
            .spawn(move || {
                let mut state = ClientState::new(shared);
                for job in incoming {
                    job(&mut state);
                }
                state.close();
            })?;
        Ok(ClientThread { jobs })
    }
}

/// The server as one client sees it.
#[derive(Clone)]
pub struct Handler {
    thread: Arc<ClientThread>,
    tools: Arc<Vec<Tool>>,
}

/// What the server says of itself when a client connects.
const INSTRUCTIONS: &str = "detvisor's time-travel debugger. Start with `findings` (a campaign directory under the server's root) and `finding`; take the failure moment (FINDING@failure, or FINDING@-1s for one second before it); look with `events`, `processes`, `extract`, `exec` (nothing changes the recorded history); move with `rewind`, `branch`, `wait`; prove a fix with `verify`. Every result reports its budget.";

impl Handler {
    /// A handler for a new client session (its thread started).
    pub fn new(shared: Arc<Shared>, tools: Arc<Vec<Tool>>) -> std::io::Result<Handler> {
        Ok(Handler {
            thread: Arc::new(ClientThread::start(shared)?),
            tools,
        })
    }
}

/// The longest error text returned: an error may quote what it was given.
const MAX_ERROR_BYTES: usize = 4096;

fn tool_error(mut text: String) -> CallToolResult {
    if text.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("... (cut)");
    }
    CallToolResult::error(vec![ContentBlock::text(text)])
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("detvisor", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    /// Versions with sessions: a client's debugger sessions and budget
    /// live as long as its MCP session.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if !self.tools.iter().any(|t| t.name == name) {
            return Err(McpError::invalid_params(
                format!("no tool {name:?} (tools/list names them)"),
                None,
            ));
        }
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let cancel = Arc::new(AtomicBool::new(false));
        let (progress_tx, mut progress_rx) =
            tokio::sync::mpsc::unbounded_channel::<(f64, Option<f64>, String)>();
        let progress: Progress = Arc::new(move |done, total, message| {
            let _ = progress_tx.send((done, total, message));
        });
        let env = CallEnv {
            cancel: cancel.clone(),
            progress,
        };
        let (reply, answer) = tokio::sync::oneshot::channel::<Result<Value, CallError>>();
        let job: Job = Box::new(move |state: &mut ClientState| {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                state.call(&name, arguments, &env)
            }))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Err(CallError::Failed(format!("the call panicked: {what}")))
            });
            let _ = reply.send(result);
        });
        if self.thread.jobs.send(job).is_err() {
            return Err(McpError::internal_error(
                "the client's thread stopped",
                None,
            ));
        }
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        let mut answer = std::pin::pin!(answer);
        let mut told = 0f64;
        let result = loop {
            tokio::select! {
                result = &mut answer => break result,
                Some((done, total, message)) = progress_rx.recv() => {
                    if let Some(token) = &token {
                        // Progress only ever increases.
                        told = done.max(told);
                        let mut param = ProgressNotificationParam::new(token.clone(), told)
                            .with_message(message);
                        if let Some(total) = total {
                            param = param.with_total(total.max(told));
                        }
                        let _ = peer.notify_progress(param).await;
                    }
                }
                _ = context.ct.cancelled(), if !cancel.load(Ordering::SeqCst) => {
                    // The work stops between its slices; its answer is
                    // dropped (the client gave up on it).
                    cancel.store(true, Ordering::SeqCst);
                }
            }
        };
        let response = match result {
            Ok(Ok(value)) => {
                let text = serde_json::to_string(&value).expect("a result is JSON");
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(value);
                result
            }
            Ok(Err(error)) => tool_error(run::chain(&error)),
            Err(_) => tool_error("the call was dropped".into()),
        };
        Ok(response.into())
    }
}
