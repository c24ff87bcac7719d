//! Facts about the machine a bench step runs on (uptime, load, memory, file system types), and
//! private temporary directories.

use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;

/// statfs f_type values.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const EXT4_MAGIC: i64 = 0xef53;

/// Seconds since boot (/proc/uptime).
pub fn uptime() -> Option<f64> {
    fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The 1/5/15-minute load averages.
pub fn loadavg() -> Option<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

pub fn mem_total_kib() -> Option<u64> {
    fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The host's 1/5/15-minute load averages before and after a benchmark (other work on the
/// machine makes the numbers noisy), and its CPU count: the same fields, in the same place, of
/// both benches' JSON reports.
#[derive(Serialize)]
pub struct HostLoad {
    pub host_loadavg_before: Option<[f64; 3]>,
    pub host_loadavg_after: Option<[f64; 3]>,
    pub host_cpus: usize,
}

impl HostLoad {
    /// The load now against `before`, and the CPU count.
    pub fn since(before: Option<[f64; 3]>) -> Self {
        HostLoad {
            host_loadavg_before: before,
            host_loadavg_after: loadavg(),
            host_cpus: thread::available_parallelism().map_or(0, |n| n.get()),
        }
    }

    /// The report's `host:` line.
    pub fn line(&self) -> String {
        let load = |l: &Option<[f64; 3]>| {
            l.map_or("?".into(), |l| {
                format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
            })
        };
        format!(
            "host: {} CPUs, load average {} before, {} after (other work on the host adds noise)",
            self.host_cpus,
            load(&self.host_loadavg_before),
            load(&self.host_loadavg_after)
        )
    }
}

/// The type of the file system holding `path`: the mount table's entry with the longest mount
/// point containing it (statfs is no help for 9p: with 9p2000.L its `f_type` is the host file
/// system's), else statfs's magic.
pub fn fs_type(path: &Path) -> String {
    if let Some(t) = mount_fs_type(path) {
        return t;
    }
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "?".into();
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?".into();
    }
    match st.f_type as i64 {
        TMPFS_MAGIC => "tmpfs".into(),
        EXT4_MAGIC => "ext4".into(),
        other => format!("{other:#x}"),
    }
}

fn mount_fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let _source = fields.next()?;
            let point = unescape_mount_field(fields.next()?);
            let fs_type = fields.next()?;
            Some((PathBuf::from(point), fs_type.to_string()))
        })
        .filter(|(point, _)| path.starts_with(point))
        // The last of the longest: a later mount on the same point hides the earlier.
        .max_by_key(|(point, _)| point.as_os_str().len())
        .map(|(_, t)| t)
}

/// Undoes the octal escapes (`\040` for a space, ...) of a /proc/self/mounts field.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub use helper_vm::TempDir;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(unescape_mount_field("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        assert_eq!(unescape_mount_field("/x\\"), "/x\\");
        assert_eq!(
            mount_fs_type(Path::new("/proc/self")).as_deref(),
            Some("proc")
        );
    }
}
