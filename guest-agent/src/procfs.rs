//! A process's row for `processes`, from the texts of its /proc files
//! (`stat`, `status`, `cmdline`): parsed here, without a `ps` in the image.

use guest_agent::protocol::{ProcessRow, MAX_PROCESS_COMMAND};

/// What `/proc/PID/stat` says: the name (`comm`), the state letter and the
/// parent's PID (in the reader's PID namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub name: String,
    pub state: char,
    pub ppid: i32,
}

/// Parses `/proc/PID/stat`: `PID (COMM) S PPID ...`. The name may hold
/// spaces and parentheses, so it ends at the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat, String> {
    let bad = || format!("unreadable /proc stat line {text:.80?}");
    let open = text.find('(').ok_or_else(bad)?;
    let close = text.rfind(')').ok_or_else(bad)?;
    if close < open {
        return Err(bad());
    }
    let name = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_ascii_whitespace();
    let mut letters = rest.next().ok_or_else(bad)?.chars();
    let state = letters.next().ok_or_else(bad)?;
    if letters.next().is_some() {
        return Err(bad());
    }
    let ppid = rest.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    Ok(Stat { name, state, ppid })
}

/// The process's PIDs from `/proc/PID/status`'s `NSpid:` line, outermost
/// (the reader's namespace) first, its own namespace's last.
pub fn parse_nspids(status: &str) -> Result<Vec<i32>, String> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .ok_or_else(|| "no NSpid line in /proc status".to_string())?;
    let pids: Vec<i32> = line
        .split_ascii_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("unreadable NSpid line {line:?}"))?;
    if pids.is_empty() {
        return Err("an empty NSpid line".to_string());
    }
    Ok(pids)
}

/// `/proc/PID/cmdline`'s arguments (NUL-separated, maybe NUL-terminated),
/// cut to [`MAX_PROCESS_COMMAND`] bytes in all (at a character boundary).
pub fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    let mut left = MAX_PROCESS_COMMAND;
    let mut args = Vec::new();
    for arg in bytes.split(|&b| b == 0) {
        if left == 0 {
            break;
        }
        let text = String::from_utf8_lossy(arg);
        let mut end = text.len().min(left);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        left -= end;
        args.push(text[..end].to_string());
        if end < text.len() {
            break;
        }
    }
    args
}

/// One row: its PID and its parent's as the namespace at `depth` sees them
/// (0: the reader's; a node's is one deeper), given the parent's `NSpid`s
/// (`None`: unknown or gone). A parent outside that namespace is PID 0.
pub fn process_row(
    stat: &Stat,
    nspids: &[i32],
    parent_nspids: Option<&[i32]>,
    depth: usize,
    cmdline: &[u8],
) -> Option<ProcessRow> {
    let pid = *nspids.get(depth)?;
    let ppid = parent_nspids
        .and_then(|pids| pids.get(depth).copied())
        .unwrap_or(0);
    Some(ProcessRow {
        pid,
        ppid,
        state: stat.state,
        name: stat.name.clone(),
        command: parse_cmdline(cmdline),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "412 (my (odd) name) S 398 412 412 0 -1 4194560 \
                        100 0 0 0 0 0 0 0 20 0 1 0 500 1 1";
    const STATUS: &str = "Name:\tsh\nUmask:\t0022\nState:\tT (stopped)\n\
                          Tgid:\t412\nNgid:\t0\nPid:\t412\nPPid:\t398\n\
                          NSpid:\t412\t3\nNSpgid:\t412\t3\n";

    #[test]
    fn test_a_stat_line_gives_name_state_and_parent() {
        assert_eq!(
            parse_stat(STAT).unwrap(),
            Stat {
                name: "my (odd) name".into(),
                state: 'S',
                ppid: 398
            }
        );
        for bad in [
            "",
            "412 sh S 1",
            "412 (sh) SS 1",
            "412 (sh) S x",
            "412 )sh( S 1",
        ] {
            assert!(parse_stat(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_the_nspid_line_lists_the_pid_per_namespace() {
        assert_eq!(parse_nspids(STATUS).unwrap(), [412, 3]);
        assert!(parse_nspids("Pid:\t1\n").is_err());
        assert!(parse_nspids("NSpid:\tx\n").is_err());
    }

    #[test]
    fn test_a_row_is_seen_from_the_node_namespace() {
        let stat = parse_stat(STAT).unwrap();
        let nspids = parse_nspids(STATUS).unwrap();
        let cmdline = b"sh\0-c\0sleep 5\0";
        // Its parent is the node's PID 1 (398 in the guest).
        let row = process_row(&stat, &nspids, Some(&[398, 1]), 1, cmdline).unwrap();
        assert_eq!(
            row,
            ProcessRow {
                pid: 3,
                ppid: 1,
                state: 'S',
                name: "my (odd) name".into(),
                command: vec!["sh".into(), "-c".into(), "sleep 5".into()],
            }
        );
        // A node's PID 1: its parent (the agent) is outside the node.
        let init = process_row(&stat, &[398, 1], Some(&[1]), 1, b"sh\0").unwrap();
        assert_eq!((init.pid, init.ppid), (1, 0));
        // Seen from the guest, the PIDs are the outer ones.
        let outer = process_row(&stat, &nspids, Some(&[398, 1]), 0, b"").unwrap();
        assert_eq!((outer.pid, outer.ppid, outer.command.len()), (412, 398, 0));
        // Not in a namespace that deep: no row.
        assert!(process_row(&stat, &[5], None, 1, b"").is_none());
    }

    #[test]
    fn test_a_long_command_line_is_cut() {
        let long = "é".repeat(MAX_PROCESS_COMMAND);
        let mut bytes = b"a\0".to_vec();
        bytes.extend_from_slice(long.as_bytes());
        bytes.extend_from_slice(b"\0never\0");
        let args = parse_cmdline(&bytes);
        assert_eq!(args.len(), 2);
        assert_eq!(args[0], "a");
        assert!(args[1].len() < MAX_PROCESS_COMMAND);
        assert!(args[1].len() >= MAX_PROCESS_COMMAND - 3);
        assert!(parse_cmdline(b"").is_empty());
    }
}
