//! `detvisor bench nodes`: issue 30's "nodes per guest". One `up` guest with 3, 9, 27 and 64
//! nodes of a small busybox service (each node serves a page with busybox `httpd` and fetches
//! its next peer's every second with `wget`), run for a fixed virtual time: exits per virtual
//! second, wall time per virtual second, and the guest's memory in use (`MemTotal -
//! MemAvailable` of the guest's /proc/meminfo, printed by the workload at the end, with how
//! many peers answered it). Stops at the first count that fails, saying where (manifest, boot,
//! run, workload) and why.

use crate::campaign_run::{is_full, Common, Lines};
use crate::say;
use anyhow::{bail, Context, Result};
use clap::Args;
use fuzzer::campaign::Place;
use run::api::{Request, Until};
use run::client::Calls;
use run::records::RecordBody;
use run::up::UpOptions;
use std::path::Path;
use std::time::{Duration, Instant};
use vmm::VirtNanos;

/// The node counts.
const FULL_COUNTS: [u32; 4] = [3, 9, 27, 64];
/// The wall limit per count.
const FULL_WALL: &str = "10m";

#[derive(Args, Debug, Clone)]
pub struct NodesArgs {
    /// Node counts, in order (stops at the first that fails).
    #[arg(long, value_delimiter = ',', default_value = "3,9,27,64")]
    pub counts: Vec<u32>,
    /// Virtual time each guest runs after its boot (the workload then checks its peers and
    /// prints the guest's memory).
    #[arg(long, default_value = "60s")]
    pub virtual_time: VirtNanos,
    /// Most wall time per count (the issue's: 10m); a count over it failed. A shorter one (or
    /// other counts) is a smoke run, whose results are not written to bench/ unless --results
    /// says where.
    #[arg(long, short = 'b', default_value = FULL_WALL)]
    pub budget: VirtNanos,
    /// Guest RAM of each guest.
    #[arg(long, default_value = "512M")]
    pub mem: String,
    #[command(flatten)]
    pub common: Common,
}

/// The busybox applets the nodes use.
const APPLETS: [&str; 10] = [
    "sh", "mkdir", "echo", "httpd", "wget", "sleep", "grep", "seq", "cat", "true",
];

/// A busybox root filesystem in `dir/root` (from the host's static busybox).
fn busybox_root(dir: &Path) -> Result<()> {
    let bin = dir.join("root/bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    std::fs::copy("/bin/busybox", bin.join("busybox"))
        .context("copying /bin/busybox (Debian's busybox-static)")?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .with_context(|| format!("linking {applet}"))?;
    }
    Ok(())
}

fn address(i: u32) -> String {
    format!("10.0.{}.{}", i / 250, i % 250 + 1)
}

/// The manifest of `count` nodes; the workload, in node `n1`, waits `wait_s`, fetches every
/// node's page and prints how many answered and the guest's memory.
fn manifest(count: u32, mem: &str, wait_s: u64) -> String {
    let mut m = format!("[machine]\nmem = {mem:?}\n\n[network]\nlatency = \"1ms\"\n");
    for i in 0..count {
        let peer = address((i + 1) % count);
        let command = format!(
            "mkdir -p /www && echo n{} > /www/index.html && httpd -f -p 80 -h /www & \
             while true; do wget -q -O /dev/null http://{peer}/; sleep 1; done",
            i + 1
        );
        m.push_str(&format!(
            "\n[[node]]\nname = \"n{}\"\nrootfs = \"root\"\naddress = \"{}/16\"\ncommand = [\"sh\", \"-c\", {command:?}]\n",
            i + 1,
            address(i)
        ));
    }
    let all: Vec<String> = (0..count).map(address).collect();
    let workload = format!(
        "sleep {wait_s}; ok=0; for ip in {}; do wget -q -O /dev/null http://$ip/ && ok=$((ok+1)); done; \
         echo \"bench: answered $ok of {count}\"; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo",
        all.join(" ")
    );
    m.push_str(&format!(
        "\n[workload]\nnode = \"n1\"\ncommand = [\"sh\", \"-c\", {workload:?}]\n"
    ));
    m
}

/// What one count gave.
struct Count {
    nodes: u32,
    /// Where and why it broke, if it did.
    broke: Option<String>,
    virtual_s: f64,
    exits: u64,
    boot_wall_s: f64,
    run_wall_s: f64,
    answered: Option<(u32, u32)>,
    mem_used_kib: Option<u64>,
    mem_total_kib: Option<u64>,
}

impl Count {
    fn exits_per_virtual_s(&self) -> f64 {
        self.exits as f64 / self.virtual_s.max(1e-9)
    }

    /// Wall seconds per virtual second, the boot included.
    fn wall_per_virtual_s(&self) -> f64 {
        (self.boot_wall_s + self.run_wall_s) / self.virtual_s.max(1e-9)
    }
}

/// The numbers the workload printed: (answered, of), MemTotal, MemAvailable (KiB).
fn parse_output(text: &str) -> (Option<(u32, u32)>, Option<u64>, Option<u64>) {
    let mut answered = None;
    let (mut total, mut available) = (None, None);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("bench: answered ") {
            let mut words = rest.split(" of ");
            if let (Some(a), Some(b)) = (words.next(), words.next()) {
                answered = a.trim().parse().ok().zip(b.trim().parse().ok());
            }
        }
        let kib = |l: &str| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        };
        if line.starts_with("MemTotal:") {
            total = kib(line);
        }
        if line.starts_with("MemAvailable:") {
            available = kib(line);
        }
    }
    (answered, total, available)
}

/// Runs one guest of `count` nodes; a failure is a [`Count`] with `broke` set.
fn one(args: &NodesArgs, place: Place, dir: &Path, count: u32) -> Result<Count> {
    let mut c = Count {
        nodes: count,
        broke: None,
        virtual_s: 0.0,
        exits: 0,
        boot_wall_s: 0.0,
        run_wall_s: 0.0,
        answered: None,
        mem_used_kib: None,
        mem_total_kib: None,
    };
    let wait_s = args.virtual_time.0 / 1_000_000_000;
    let path = dir.join(format!("nodes-{count}.toml"));
    std::fs::write(&path, manifest(count, &args.mem, wait_s.max(1)))?;
    let manifest = match run::manifest::load(&path) {
        Ok(m) => m,
        Err(e) => {
            c.broke = Some(format!(
                "the manifest was refused: {:#}",
                anyhow::Error::from(e)
            ));
            return Ok(c);
        }
    };
    let prepared = match run::up::prepare(&manifest, &[], None, None) {
        Ok(p) => p,
        Err(e) => {
            c.broke = Some(format!("preparing the run: {:#}", anyhow::Error::from(e)));
            return Ok(c);
        }
    };
    let started = Instant::now();
    let deadline = started + Duration::from_nanos(args.budget.0);
    let (mut runners, there) = fuzzer::campaign::start_runners(place, &prepared, 1, &[dir])?;
    let mut calls = Calls::new(&mut runners[0]);
    let booting = Instant::now();
    let run = match calls.start(Request::BootUp {
        prepared: there,
        options: UpOptions::new(1),
    }) {
        Ok((run, _)) => run,
        Err(e) => {
            c.broke = Some(format!("booting the guest: {:#}", anyhow::Error::from(e)));
            return Ok(c);
        }
    };
    calls.collect_records(run)?;
    // The boot: to the first second of virtual time.
    let mut at = VirtNanos::from_secs(1);
    let mut position = calls.run_until(run, Until::Time(at))?;
    c.boot_wall_s = booting.elapsed().as_secs_f64();
    let running = Instant::now();
    // A second at a time, to the workload's end (it prints after `virtual_time`) or a little
    // past it, within the wall limit.
    let end = args.virtual_time + VirtNanos::from_secs(10 + u64::from(count) * 2);
    while position.stop.is_none() && at < end {
        if Instant::now() >= deadline {
            c.broke = Some(format!(
                "the run: the wall limit ({}) ended it at {} of virtual time",
                args.budget, position.virtual_ns
            ));
            break;
        }
        at = at + VirtNanos::from_secs(1);
        position = calls.run_until(run, Until::Time(at))?;
        say!(
            "bench: nodes {count}: {} of virtual time, {} exits, {:.0} s",
            position.virtual_ns,
            position.exits,
            started.elapsed().as_secs_f64()
        );
    }
    c.run_wall_s = running.elapsed().as_secs_f64();
    c.virtual_s = position.virtual_ns.0 as f64 / 1e9;
    c.exits = position.exits;
    let text: String = calls
        .take_records(run)?
        .into_iter()
        .filter_map(|r| match r.body {
            RecordBody::Output { log, text, .. } if log == "workload" => Some(text),
            _ => None,
        })
        .collect();
    let summary = calls.outcome(run)?;
    calls.close(run)?;
    let (answered, total, available) = parse_output(&text);
    c.answered = answered;
    c.mem_total_kib = total;
    c.mem_used_kib = total.zip(available).map(|(t, a)| t.saturating_sub(a));
    if c.broke.is_none() {
        c.broke = match (position.stop.is_some(), answered) {
            (_, Some((ok, of))) if ok < of => Some(format!(
                "the service: {ok} of {of} nodes answered the workload"
            )),
            (_, Some(_)) if summary.exit_status.unwrap_or(0) != 0 => {
                Some(format!("the workload exited {:?}", summary.exit_status))
            }
            (_, Some(_)) => None,
            (true, None) => Some(format!(
                "the run stopped ({:?}) at {} before the workload's report",
                position.stop, position.virtual_ns
            )),
            (false, None) => Some(format!(
                "the workload reported nothing by {} of virtual time",
                position.virtual_ns
            )),
        };
    }
    Ok(c)
}

fn report(args: &NodesArgs, counts: &[Count], machine: &str) -> Lines {
    let mut out = Lines::default();
    let mut line = |l: String| out.line(l);
    line(format!(
        "detvisor bench nodes: one up guest of N busybox httpd/wget nodes, {} of virtual time each, {} RAM, at most {} of wall time a count",
        args.virtual_time, args.mem, args.budget
    ));
    line(format!("machine: {machine}"));
    line(format!(
        "{:>6} {:>10} {:>10} {:>12} {:>13} {:>14} {:>13} {:>9}",
        "nodes",
        "virtual s",
        "exits",
        "exits/virt s",
        "boot wall s",
        "wall/virt s",
        "guest mem MiB",
        "answered"
    ));
    for c in counts {
        if c.virtual_s > 0.0 {
            line(format!(
                "{:>6} {:>10.1} {:>10} {:>12.0} {:>13.1} {:>14.2} {:>13} {:>9}",
                c.nodes,
                c.virtual_s,
                c.exits,
                c.exits_per_virtual_s(),
                c.boot_wall_s,
                c.wall_per_virtual_s(),
                c.mem_used_kib.map_or("-".into(), |k| format!(
                    "{} of {}",
                    k / 1024,
                    c.mem_total_kib.unwrap_or(0) / 1024
                )),
                c.answered.map_or("-".into(), |(a, b)| format!("{a}/{b}"))
            ));
        }
        if let Some(why) = &c.broke {
            line(format!("{:>6} BROKE: {why}", c.nodes));
        }
    }
    line(
        serde_json::json!({
            "bench": "nodes",
            "virtual_s": args.virtual_time.0 as f64 / 1e9,
            "mem": args.mem,
            "wall_limit_s": args.budget.0 as f64 / 1e9,
            "counts": counts.iter().map(|c| serde_json::json!({
                "nodes": c.nodes,
                "virtual_s": c.virtual_s,
                "exits": c.exits,
                "exits_per_virtual_s": c.exits_per_virtual_s(),
                "boot_wall_s": c.boot_wall_s,
                "run_wall_s": c.run_wall_s,
                "wall_per_virtual_s": c.wall_per_virtual_s(),
                "mem_used_kib": c.mem_used_kib,
                "mem_total_kib": c.mem_total_kib,
                "answered": c.answered.map(|(a, _)| a),
                "broke": c.broke,
            })).collect::<Vec<_>>(),
        })
        .to_string(),
    );
    out
}

pub fn orchestrate(args: &NodesArgs) -> Result<u8> {
    if args.counts.is_empty() || args.counts.contains(&0) {
        bail!("--counts needs node counts of at least 1");
    }
    if args.virtual_time < VirtNanos::from_secs(1) {
        bail!("--virtual-time must be at least 1s");
    }
    let setup = args.common.setup("nodes", args.budget)?;
    let (place, dir) = (setup.place, &setup.dir);
    busybox_root(dir)?;
    let mut counts = Vec::new();
    for &count in &args.counts {
        say!("bench: nodes: {count} nodes in one guest");
        let c = one(args, place, dir, count).with_context(|| format!("{count} nodes"))?;
        let broke = c.broke.clone();
        counts.push(c);
        if let Some(why) = broke {
            say!("bench: nodes: {count} nodes broke: {why}; stopping here");
            break;
        }
    }
    let text = report(args, &counts, &setup.machine);
    let full = args.counts == FULL_COUNTS && is_full(args.budget, FULL_WALL);
    args.common.finish(&setup, "nodes", &text, full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_workload_s_report_parses() {
        let text =
            "x\nbench: answered 8 of 9\nMemTotal:        500000 kB\nMemAvailable:    400000 kB\n";
        assert_eq!(
            parse_output(text),
            (Some((8, 9)), Some(500_000), Some(400_000))
        );
        assert_eq!(parse_output("nothing"), (None, None, None));
    }

    #[test]
    fn test_the_manifest_has_a_node_each_and_loads() {
        let m = manifest(3, "256M", 5);
        assert_eq!(m.matches("[[node]]").count(), 3);
        assert!(m.contains("http://10.0.0.1/"), "{m}");
        assert_eq!(address(250), "10.0.1.1");
    }
}
