//! History lines in a process's stdout: lines that look like
//! `{"detvisor_history":{..}}` (a JSON object naming that key) are passed to
//! the host as well as printed, which parses them and keeps the valid ones.
//!
//! Output arrives in chunks that cut lines anywhere, so each stdout keeps
//! its unfinished line. A line longer than [`MAX_HISTORY_LINE`] bytes is not
//! a history line: it is skipped up to its newline (it is still printed).

/// Longest history line (without its newline) the agent passes on.
pub const MAX_HISTORY_LINE: usize = 64 << 10;

const KEY: &[u8] = b"\"detvisor_history\"";

/// One stream's unfinished line.
#[derive(Debug, Default)]
pub struct HistoryLines {
    partial: Vec<u8>,
    /// The current line grew past the limit: skip to its end.
    overlong: bool,
}

impl HistoryLines {
    /// The history lines `chunk` completes, without their newlines.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(end);
            if !self.overlong && self.partial.len() + head.len() <= MAX_HISTORY_LINE {
                self.partial.extend_from_slice(head);
                if let Some(line) = history_line(&self.partial) {
                    lines.push(line);
                }
            }
            self.partial.clear();
            self.overlong = false;
            rest = &tail[1..];
        }
        if !self.overlong {
            if self.partial.len() + rest.len() > MAX_HISTORY_LINE {
                self.partial.clear();
                self.overlong = true;
            } else {
                self.partial.extend_from_slice(rest);
            }
        }
        lines
    }
}

/// `line` if it may be a history line: UTF-8, an object mentioning the key.
fn history_line(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let trimmed = line.trim_ascii();
    if !trimmed.starts_with(b"{") || !trimmed.windows(KEY.len()).any(|w| w == KEY) {
        return None;
    }
    String::from_utf8(trimmed.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"detvisor_history":{"process":1,"op":2,"type":"invoke","f":"get","key":"k","value":null,"time_ns":5}}"#;

    #[test]
    fn test_lines_split_anywhere_come_out_whole_and_others_are_ignored() {
        let text = format!("hello\n{LINE}\nnot {{\"detvisor_history\"}}\n{LINE}\r\n{LINE}");
        for split in 0..text.len() {
            let mut lines = HistoryLines::default();
            let mut got = lines.push(&text.as_bytes()[..split]);
            got.extend(lines.push(&text.as_bytes()[split..]));
            // The last line has no newline yet.
            assert_eq!(got, vec![LINE.to_string(), LINE.to_string()], "{split}");
            assert_eq!(lines.push(b"\n"), vec![LINE.to_string()]);
        }
    }

    #[test]
    fn test_an_overlong_line_is_skipped_to_its_end() {
        let mut lines = HistoryLines::default();
        let long = format!(
            "{{\"detvisor_history\":\"{}\"}}",
            "x".repeat(MAX_HISTORY_LINE)
        );
        for chunk in long.as_bytes().chunks(4096) {
            assert!(lines.push(chunk).is_empty());
        }
        assert_eq!(
            lines.push(format!("\n{LINE}\n").as_bytes()),
            vec![LINE.to_string()]
        );
    }
}
