//! A finding's `logs/`: the output of every node, the workload and each
//! test-composer command along the finding's path (boot to the root, then
//! the path's steps), one file per log as `up --logs` names them
//! (`<name>.log`, stdout and stderr interleaved as they arrived), rebuilt
//! from the path's [`RecordBody::Output`] records. Where a stretch kept only
//! a log's last bytes ([`run::records::OUTPUT_CAP_BYTES`]), a marker line
//! says how many went.

use run::records::{GuestRecord, RecordBody, OUTPUT_CAP_BYTES};
use std::collections::BTreeMap;
use std::path::Path;

/// The directory of a finding's logs.
pub const LOGS_DIR: &str = "logs";

/// A log's file name: its name, made safe to be one path component (names
/// are nodes and command file names, but the guest reports them).
fn file_name(log: &str) -> String {
    let safe: String = log
        .chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect();
    let safe = if safe.is_empty() || safe.starts_with('.') {
        format!("_{safe}")
    } else {
        safe
    };
    format!("{safe}.log")
}

/// Each log's text along `records` (in order).
pub fn logs(records: &[GuestRecord]) -> BTreeMap<String, String> {
    let mut logs: BTreeMap<String, String> = BTreeMap::new();
    for record in records {
        match &record.body {
            RecordBody::Output { log, text, .. } => {
                logs.entry(file_name(log)).or_default().push_str(text)
            }
            RecordBody::OutputDropped { log, bytes } => {
                let text = logs.entry(file_name(log)).or_default();
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&format!(
                    "[detvisor: {bytes} bytes of this log dropped here; a stretch keeps the last {} KiB]\n",
                    OUTPUT_CAP_BYTES / 1024
                ));
            }
            _ => {}
        }
    }
    logs
}

/// Writes `dir/logs/<name>.log` for each log of `records`.
pub fn write(dir: &Path, records: &[GuestRecord]) -> std::io::Result<()> {
    let logs_dir = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs_dir)?;
    for (name, text) in logs(records) {
        std::fs::write(logs_dir.join(name), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::records::GuestRecord;

    fn out(log: &str, text: &str) -> GuestRecord {
        serde_json::from_value(serde_json::json!({
            "exit": 0, "virtual_ns": 0, "node": null,
            "body": {"kind": "output", "log": log, "stream": "stdout", "text": text},
        }))
        .expect("an output record")
    }

    #[test]
    fn test_each_log_gets_its_chunks_in_order_and_a_line_where_some_went() {
        let records = vec![
            out("n1", "a\n"),
            out("workload", "w"),
            GuestRecord {
                body: RecordBody::OutputDropped {
                    log: "n1".into(),
                    bytes: 7,
                },
                ..out("n1", "")
            },
            out("n1", "b\n"),
            out("../x", "y"),
        ];
        let logs = logs(&records);
        assert_eq!(logs["workload.log"], "w");
        assert!(logs["n1.log"].starts_with("a\n[detvisor: 7 bytes of this log dropped here"));
        assert!(logs["n1.log"].ends_with("]\nb\n"));
        assert_eq!(logs["_.._x.log"], "y");
    }
}
