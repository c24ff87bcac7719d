//! The stdio transport's lines, between this process's stdin and stdout
//! and the MCP library: a line that is not JSON, or longer than the
//! server takes, is answered here with a JSON-RPC error (`-32700` parse
//! error, `-32600` invalid request) instead of being skipped without a
//! word; every other line passes as it is, and the library's answers go
//! out whole, one line each.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// A JSON-RPC error for a request that could not be read (its id unknown).
fn error_line(code: i64, message: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    }))
    .expect("an error is JSON");
    line.push(b'\n');
    line
}

/// Reads one line of at most `max` bytes into `line` (without its
/// newline); a longer one is read to its end and dropped. `None` at the
/// end of input; `Some(false)` for a line that was too long.
async fn read_line<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut fits = true;
    let mut any = false;
    loop {
        let buffer = input.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(any.then_some(fits));
        }
        any = true;
        let (chunk, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..at], Some(at + 1)),
            None => (buffer, None),
        };
        if fits && line.len() + chunk.len() <= max {
            line.extend_from_slice(chunk);
        } else {
            fits = false;
            line.clear();
        }
        let used = done.unwrap_or(buffer.len());
        input.consume(used);
        if done.is_some() {
            return Ok(Some(fits));
        }
    }
}

/// Carries lines from `stdin` to the library (`to_rmcp`) and its answers
/// (`from_rmcp`) to `stdout`, answering unreadable lines itself.
pub async fn pump<I, O, R, W>(stdin: I, mut stdout: O, from_rmcp: R, mut to_rmcp: W, max: usize)
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (errors, mut error_lines) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let reader = tokio::spawn(async move {
        let mut input = BufReader::new(stdin);
        let mut line = Vec::new();
        while let Ok(Some(fits)) = read_line(&mut input, &mut line, max).await {
            if !fits {
                let _ = errors.send(error_line(
                    -32600,
                    &format!("request longer than the server's limit of {max} bytes"),
                ));
                continue;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if serde_json::from_slice::<serde_json::Value>(&line).is_err() {
                let _ = errors.send(error_line(-32700, "parse error: the line is not JSON"));
                continue;
            }
            line.push(b'\n');
            if to_rmcp.write_all(&line).await.is_err() {
                break;
            }
        }
        // The end of input ends the session.
        let _ = to_rmcp.shutdown().await;
    });
    let mut answers = BufReader::new(from_rmcp);
    let mut answer = Vec::new();
    loop {
        tokio::select! {
            read = answers.read_until(b'\n', &mut answer) => {
                match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if stdout.write_all(&answer).await.is_err() || stdout.flush().await.is_err() {
                            break;
                        }
                        answer.clear();
                    }
                }
            }
            Some(line) = error_lines.recv() => {
                if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                    break;
                }
            }
        }
    }
    reader.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<Option<String>> {
        let mut reader = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut out = Vec::new();
        while let Some(fits) = read_line(&mut reader, &mut line, max).await.unwrap() {
            out.push(fits.then(|| String::from_utf8(line.clone()).unwrap()));
        }
        out
    }

    /// Lines are read whole across the reader's buffer; one past the limit
    /// is dropped to its end (the next is read as it is); the last line
    /// needs no newline.
    #[test]
    fn test_lines_past_the_limit_are_dropped_whole() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let read = runtime.block_on(lines(b"short\nmuch too long a line\n\nlast", 10));
        assert_eq!(
            read,
            [
                Some("short".to_string()),
                None,
                Some(String::new()),
                Some("last".to_string())
            ]
        );
        assert_eq!(
            runtime.block_on(lines(b"", 10)),
            Vec::<Option<String>>::new()
        );
    }

    #[test]
    fn test_an_unreadable_request_is_answered_with_a_json_rpc_error() {
        let line = error_line(-32700, "parse error");
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value["error"]["code"], -32700);
        assert!(value["id"].is_null());
        assert_eq!(line.last(), Some(&b'\n'));
    }
}
