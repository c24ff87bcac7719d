//! MCP over streamable HTTP: a session per client (rmcp's session manager),
//! behind three checks on every request: the listener binds a loopback
//! address unless told otherwise; a request whose `Origin` is not the
//! server's own is refused (the MCP specification's rule against DNS
//! rebinding: a web page's script must not reach a local server); and a
//! request without the server's bearer token is refused. The token is made
//! by the server from the kernel's random bytes (or given in
//! `DETVISOR_SERVE_TOKEN`) and written to a file only its owner may read.

use crate::client::Shared;
use crate::handler::Handler;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable that gives the server its token.
pub const TOKEN_ENV: &str = "DETVISOR_SERVE_TOKEN";

/// Where and how the HTTP server listens.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// Listen on an address that is not loopback (told so).
    pub any_address: bool,
    /// Where the token is written.
    pub token_file: PathBuf,
    /// More origins allowed besides the server's own
    /// (`http://127.0.0.1:PORT`, `http://localhost:PORT`).
    pub allowed_origins: Vec<String>,
    /// The largest request body, bytes.
    pub max_request_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("--http {addr}: not a loopback address; a server others can reach needs --http-any-address (and a firewall)")]
    NotLoopback { addr: SocketAddr },
    #[error("{TOKEN_ENV}: a token of at least 16 characters, letters, digits, `-` and `_` only")]
    BadToken,
    #[error("reading random bytes for the token")]
    Random(#[source] std::io::Error),
    #[error("writing the token to {}", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving HTTP")]
    Serve(#[source] std::io::Error),
}

/// The token: given in [`TOKEN_ENV`], or 32 random bytes in hex.
fn token() -> Result<String, HttpError> {
    if let Ok(given) = std::env::var(TOKEN_ENV) {
        let fine = given.len() >= 16
            && given
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        return if fine {
            Ok(given)
        } else {
            Err(HttpError::BadToken)
        };
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(HttpError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `token` to `path`, readable by its owner only (mode 0600, also
/// when the file was there before).
fn write_token(path: &Path, token: &str) -> Result<(), HttpError> {
    let error = |source| HttpError::TokenFile {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(error)?;
    }
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(error)?;
    file.write_all(token.as_bytes()).map_err(error)?;
    file.write_all(b"\n").map_err(error)
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The checks every request passes before rmcp sees it.
#[derive(Clone)]
struct Gate {
    token: Arc<String>,
    origins: Arc<Vec<String>>,
}

impl Gate {
    fn refuse(status: StatusCode, why: &str) -> Response {
        (status, format!("detvisor serve: {why}\n")).into_response()
    }

    /// Refused: the status and why.
    fn check(&self, request: &Request) -> Result<(), (StatusCode, &'static str)> {
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            if !self.origins.iter().any(|o| o == origin) {
                return Err((
                    StatusCode::FORBIDDEN,
                    "this Origin may not call the server (DNS rebinding guard)",
                ));
            }
        }
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(given) if same(given.trim().as_bytes(), self.token.as_bytes()) => Ok(()),
            _ => Err((
                StatusCode::UNAUTHORIZED,
                "a bearer token is needed (Authorization: Bearer <the token file's contents>)",
            )),
        }
    }
}

async fn gate(
    axum::extract::State(gate): axum::extract::State<Gate>,
    request: Request,
    next: Next,
) -> Response {
    match gate.check(&request) {
        Ok(()) => {
            let ending_session = request.method() == axum::http::Method::DELETE;
            let mut response = next.run(request).await;
            // rmcp answers a session's end with 202 and no body; MCP
            // clients read 200 or 204 as ended (the Python SDK logs a 202
            // as "Session termination failed").
            if ending_session && response.status() == StatusCode::ACCEPTED {
                *response.status_mut() = StatusCode::NO_CONTENT;
            }
            response
        }
        Err((status, why)) => Gate::refuse(status, why),
    }
}

/// Serves until interrupted (SIGINT or SIGTERM).
pub async fn serve(shared: Arc<Shared>, options: &HttpOptions) -> Result<(), HttpError> {
    let addr = options.addr;
    if !addr.ip().is_loopback() && !options.any_address {
        return Err(HttpError::NotLoopback { addr });
    }
    let token = token()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Listen { addr, source })?;
    let bound = listener.local_addr().map_err(HttpError::Serve)?;
    write_token(&options.token_file, &token)?;
    let port = bound.port();
    let mut origins = vec![
        format!("http://127.0.0.1:{port}"),
        format!("http://localhost:{port}"),
        format!("http://[::1]:{port}"),
    ];
    if !bound.ip().is_loopback() {
        origins.push(format!("http://{bound}"));
    }
    origins.extend(options.allowed_origins.iter().cloned());
    let hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".into(),
        "::1".into(),
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ];
    let ct = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default();
    // Told to listen beyond loopback, clients name the host by whatever
    // address reaches it: the token and the Origin check guard it.
    let config = if options.any_address {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(hosts)
    };
    let config = config
        .with_allowed_origins(origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(options.max_request_bytes)
        .with_cancellation_token(ct.clone());
    let tools = Arc::new(crate::tools::all());
    let service = StreamableHttpService::new(
        move || Handler::new(shared.clone(), tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let gate_state = Gate {
        token: Arc::new(token),
        origins: Arc::new(origins),
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate_state, gate));
    eprintln!(
        "detvisor: serving MCP on http://{bound}/mcp; its bearer token is in {} (mode 0600)",
        options.token_file.display()
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown().await;
            ct.cancel();
        })
        .await
        .map_err(HttpError::Serve)
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
}
