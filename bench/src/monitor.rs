//! What [`run_timed`](super::process::run_timed) can watch while a process runs: its memory
//! (sampled from /proc) and its VM's KVM statistics (debugfs).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Memory sampling interval of the extra memory run.
pub const MEM_SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// KVM statistics (L1 debugfs) recorded per run, as deltas.
const KVM_STATS: [&str; 5] = ["exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits"];
const DEBUGFS_KVM: &str = "/sys/kernel/debug/kvm";
/// How often the per-VM KVM statistics are looked for until the VM exists.
pub const KVM_POLL: Duration = Duration::from_millis(5);

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct MemoryPeak {
    pub samples: u32,
    pub interval_ms: u64,
    /// Last `VmHWM` read (the kernel's high-water mark of the RSS; a lower bound of the peak as
    /// the last <20 ms are not sampled).
    pub vm_hwm_kib: u64,
    /// Guest RAM configured.
    pub guest_ram_kib: u64,
    /// Resident part of the guest-RAM mapping at the sample with the largest RSS.
    pub guest_ram_resident_kib: u64,
    /// Largest (VmRSS - resident part of the guest-RAM mapping) over the samples: the process's
    /// own memory beyond guest RAM.
    pub beyond_guest_ram_kib: u64,
    /// How the guest-RAM mapping was found in smaps: "exact" (anonymous, exactly the RAM size),
    /// "approx" (smallest anonymous mapping at least that large), "not found".
    pub guest_mapping: String,
}

// ---------------------------------------------------------------------------------------------
// Memory sampling from /proc.

pub struct Sampler {
    pid: u32,
    peak: MemoryPeak,
    best_rss: u64,
}

impl Sampler {
    pub fn new(pid: u32, ram_bytes: u64) -> Self {
        Sampler {
            pid,
            peak: MemoryPeak {
                interval_ms: MEM_SAMPLE_INTERVAL.as_millis() as u64,
                guest_ram_kib: ram_bytes >> 10,
                guest_mapping: "not found".into(),
                ..MemoryPeak::default()
            },
            best_rss: 0,
        }
    }

    pub fn into_peak(self) -> MemoryPeak {
        self.peak
    }

    pub fn sample(&mut self) {
        let Ok(status) = fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return;
        };
        let field = |name: &str| -> Option<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        let (Some(hwm), Some(rss)) = (field("VmHWM:"), field("VmRSS:")) else {
            return; // exiting (a zombie has no memory fields)
        };
        let smaps = fs::read_to_string(format!("/proc/{}/smaps", self.pid)).unwrap_or_default();
        let (guest, how) = guest_mapping_rss(&smaps, self.peak.guest_ram_kib);
        self.peak.samples += 1;
        self.peak.vm_hwm_kib = self.peak.vm_hwm_kib.max(hwm);
        if let Some(guest) = guest {
            let beyond = rss.saturating_sub(guest);
            if beyond >= self.peak.beyond_guest_ram_kib {
                self.peak.beyond_guest_ram_kib = beyond;
            }
            if self.peak.guest_mapping != "exact" {
                self.peak.guest_mapping = how.into();
            }
        }
        if rss >= self.best_rss {
            self.best_rss = rss;
            self.peak.guest_ram_resident_kib = guest.unwrap_or(0);
        }
    }
}

/// The resident KiB of the guest-RAM mapping in an smaps text: the anonymous mapping of exactly
/// `ram_kib`, else the smallest anonymous one at least that large.
fn guest_mapping_rss(smaps: &str, ram_kib: u64) -> (Option<u64>, &'static str) {
    let mut exact = None;
    let mut approx: Option<(u64, u64)> = None;
    let mut current: Option<(bool, u64)> = None; // (anonymous, size)
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // start-end perms offset dev inode [path]
            let rest: Vec<&str> = parts.collect();
            let anonymous = rest.len() == 4 && rest[3] == "0";
            current = Some((anonymous, 0));
        } else if first == "Size:" {
            if let Some((_, size)) = &mut current {
                *size = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
        } else if first == "Rss:" {
            if let Some((true, size)) = current {
                let rss: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if size == ram_kib && exact.is_none() {
                    exact = Some(rss);
                } else if size > ram_kib && approx.is_none_or(|(s, _)| size < s) {
                    approx = Some((size, rss));
                }
            }
        }
    }
    match (exact, approx) {
        (Some(r), _) => (Some(r), "exact"),
        (None, Some((_, r))) => (Some(r), "approx"),
        _ => (None, "not found"),
    }
}

// ---------------------------------------------------------------------------------------------
// KVM statistics (debugfs).

/// "debugfs" when the per-VM KVM statistics can be read (mounting debugfs first if `may_mount`),
/// else why not.
pub fn kvm_stats_available(may_mount: bool) -> String {
    let probe = Path::new(DEBUGFS_KVM).join("exits");
    if fs::read_to_string(&probe).is_ok() {
        return "debugfs".into();
    }
    if !may_mount {
        return format!("{} not readable", probe.display());
    }
    let out = Command::new("mount")
        .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(_) if fs::read_to_string(&probe).is_ok() => "debugfs".into(),
        Ok(o) => format!(
            "debugfs unavailable: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run mount: {e}"),
    }
}

/// The KVM statistics of one process's VM, from its per-VM debugfs directory
/// (`/sys/kernel/debug/kvm/<tid>-<fd>/`, `tid` the creating thread of the process; the global files only sum over live VMs). An open stat
/// file holds a reference on the VM, so files opened while it lives give its final counts after
/// the process has exited.
pub struct KvmGrab {
    pid: u32,
    files: Option<Vec<(String, fs::File)>>,
}

impl KvmGrab {
    pub fn new(pid: u32) -> Self {
        KvmGrab { pid, files: None }
    }

    /// The VM's stat files are open.
    pub fn grabbed(&self) -> bool {
        self.files.is_some()
    }

    pub fn try_grab(&mut self) {
        if self.files.is_some() {
            return;
        }
        let Ok(dir) = fs::read_dir(DEBUGFS_KVM) else {
            return;
        };
        // The directory is named after the thread that created the VM (`<tid>-<fd>`): the
        // process's main thread for QEMU, a thread of its own for an in-process run.
        let mut prefixes = vec![format!("{}-", self.pid)];
        if let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", self.pid)) {
            prefixes.extend(
                tasks
                    .flatten()
                    .filter_map(|t| t.file_name().to_str().map(|tid| format!("{tid}-"))),
            );
        }
        for entry in dir.flatten() {
            if !entry
                .file_name()
                .to_str()
                .is_some_and(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())))
            {
                continue;
            }
            let files: Vec<(String, fs::File)> = KVM_STATS
                .iter()
                .filter_map(|s| {
                    let f = fs::File::open(entry.path().join(s)).ok()?;
                    Some((s.to_string(), f))
                })
                .collect();
            if files.len() == KVM_STATS.len() {
                self.files = Some(files);
                return;
            }
        }
    }

    pub fn read(&self) -> Option<BTreeMap<String, u64>> {
        let mut map = BTreeMap::new();
        for (name, f) in self.files.as_ref()? {
            let mut buf = [0u8; 64];
            // The first read of a stat file (they are not seekable) gives its current value.
            let n = (&*f).read(&mut buf).ok()?;
            let value = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
            map.insert(name.clone(), value);
        }
        Some(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_mapping_is_found_in_smaps() {
        let smaps = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Rss:                  12 kB
7f0000000000-7f0010000000 rw-p 00000000 00:00 0 
Size:             262144 kB
Rss:               30720 kB
7f0010000000-7f0010200000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Size:               2048 kB
Rss:                1024 kB
";
        assert_eq!(guest_mapping_rss(smaps, 262144), (Some(30720), "exact"));
        assert_eq!(guest_mapping_rss(smaps, 200000), (Some(30720), "approx"));
        assert_eq!(guest_mapping_rss(smaps, 300000), (None, "not found"));
    }
}
