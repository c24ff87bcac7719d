//! The `bench etcd` baseline: the same scenario under QEMU TCG with `-icount shift=0,sleep=off`.
//!
//! The guest is the same kernel (the cache's `bzImage`, built with the `vmlinux` detvisor
//! boots) and the same initrd bytes `detvisor up` assembles (the default guest image's
//! initramfs + the agent + every node's tree under `/nodes/<name>`), plus one more file:
//! `/detvisor/cmd`, which the default guest `/init` runs instead of an interactive shell. That
//! script ([`script`]) does by hand what the agent does for `detvisor up`, from the same node
//! requests (`NodeSpec`s) and workload:
//!
//! - a bridge `br0` stands in for detvisor's switch (no latency: the manifest's link
//!   latencies are not modelled here);
//! - per node, a holder process in fresh network, UTS and IPC namespaces (`unshare -n -u -i`);
//!   a veth pair whose one end joins the bridge and whose other end moves into the namespace
//!   with the node's NIC name and address (busybox `ip` names the peer `veth0` whatever
//!   `peer name` says, and has no `ip netns`: the script moves pairs one at a time and uses
//!   `nsenter -t PID -n`); `/proc`, `/dev` and a fresh `/tmp` mounted in the node's root;
//!   the node's command with exactly the node's environment (`env -i`, PATH defaulting as
//!   in the agent), `chroot`ed into the root, output to a log;
//! - the workload the same way, in its node's namespaces and root (or as a node of its own),
//!   with its output on the console; then a status line with the guest's uptime (the virtual
//!   time: with icount the guest clock follows instructions), every node's log, and the
//!   workload's status as the guest's exit status (port 0x610, as the default `/init` does).
//!
//! QEMU: `-accel tcg -icount shift=0,sleep=off -rtc clock=vm,base=<the manifest's rtc_epoch>`
//! `-M pc`, no network devices (the network is inside the guest), serial output to a file,
//! an `isa-debugcon` at 0x610 capturing the status byte, `-no-reboot` ending QEMU at the
//! init's `reboot -f` (`reboot=t`: a triple fault).

use anyhow::{bail, Context, Result};
use guest_agent::protocol::NodeSpec;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::etcd_worker::EtcdRun;
use crate::process::{last_lines, run_timed, Watch};
use crate::qemu::QEMU_MACHINE;
use crate::stats::{fnv1a, ms};
use helper_vm::{direct_boot_args, DirectBoot, GuestAccel};
use run::faults::{FaultAction, NetworkFault, ScheduledFault};
use run::guest::shell_quote;
use run::manifest::WorkloadPlan;

/// `PATH` of a command whose environment has none (as the agent does).
const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// The line the script prints when the workload has ended (then `status N uptime S`).
pub const DONE_MARK: &str = "etcd-bench: workload exited: ";
/// The file naming the clocksource the guest kernel uses; the script prints it first, in a
/// line `etcd-bench: clocksource NAME`.
pub const CLOCKSOURCE_FILE: &str =
    "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// `env -i K=V ...` words for a command's whole environment.
fn env_words(env: &BTreeMap<String, String>) -> String {
    let mut words = vec!["env".to_string(), "-i".to_string()];
    if !env.contains_key("PATH") {
        words.push(shell_quote(&format!("PATH={DEFAULT_PATH}")));
    }
    words.extend(env.iter().map(|(k, v)| shell_quote(&format!("{k}={v}"))));
    words.join(" ")
}

fn argv_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A shell variable name for node `index`.
fn var(prefix: &str, index: usize) -> String {
    format!("{prefix}{index}")
}

/// The guest script (`/detvisor/cmd`): the nodes of `specs`, then the workload, with `faults`
/// (the manifest's, in time order) carried out by a background job ([`fault_job`]).
pub fn script(
    specs: &[NodeSpec],
    workload: Option<&WorkloadPlan>,
    faults: &[ScheduledFault],
) -> Result<String> {
    let mut s = r#"# detvisor bench etcd: the QEMU TCG baseline's guest script (generated).
# Does what detvisor's agent does for `detvisor up`: one set of namespaces, one root and
# one NIC per node, a bridge between them, then the workload. Run by the default /init.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
B=/run/etcd-bench
mkdir -p "$B"
CHROOT=$(command -v chroot)
say() { echo "etcd-bench: $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "etcd-bench: clocksource $(cat CLOCKSOURCE_FILE)"
ip link add br0 type bridge 2>/dev/null || brctl addbr br0 || exit 90
ip link set br0 up || exit 90
# newns: a holder process in fresh network, UTS and IPC namespaces; sets HOLDER.
newns() {
    unshare -n -u -i sleep 1000000 &
    HOLDER=$!
    while [ "$(readlink /proc/$HOLDER/ns/net)" = "$(readlink /proc/self/ns/net)" ]; do
        sleep 0.01
    done
}
# nic HOLDER INDEX NAME ADDRESS: a veth pair, one end in br0, the other in the namespace.
nic() {
    ip link add "hv$2" type veth peer name veth0 || exit 91
    ip link set veth0 netns "$1" || exit 91
    nsenter -t "$1" -n ip link set veth0 name "$3" || exit 91
    nsenter -t "$1" -n ip link set lo up || exit 91
    if [ -n "$4" ]; then
        nsenter -t "$1" -n ip addr add "$4" dev "$3" || exit 91
    fi
    nsenter -t "$1" -n ip link set "$3" up || exit 91
    ip link set "hv$2" master br0 2>/dev/null || brctl addif br0 "hv$2" || exit 91
    ip link set "hv$2" up || exit 91
}
# root DIR: /proc, /dev and a fresh /tmp in a node's root.
root() {
    mkdir -p "$1/proc" "$1/dev" "$1/tmp"
    mount -t proc proc "$1/proc" || exit 92
    mount -o bind /dev "$1/dev" || exit 92
    mount -t tmpfs -o mode=1777 tmpfs "$1/tmp" || exit 92
}
"#
    .replace("CLOCKSOURCE_FILE", CLOCKSOURCE_FILE);
    let own_node = matches!(workload, Some(WorkloadPlan::OwnNode(_)));
    let node_count = specs.len() - usize::from(own_node);
    let index_of = |name: &str| specs.iter().position(|n| n.name == name);
    for (i, n) in specs.iter().enumerate() {
        let hostname = n.hostname.as_deref().unwrap_or(&n.name);
        let nic = n.nic.clone().unwrap_or_else(|| format!("eth{i}"));
        s.push_str(&format!(
            "\n# node {name}\nnewns; {h}=$HOLDER\nnic \"${h}\" {i} {nic} {addr}\n\
             nsenter -t \"${h}\" -u hostname {host} || exit 93\nroot {root}\n",
            name = n.name,
            h = var("H", i),
            nic = shell_quote(&nic),
            addr = shell_quote(n.address.as_deref().unwrap_or("")),
            host = shell_quote(hostname),
            root = shell_quote(&n.rootfs),
        ));
        if i < node_count {
            s.push_str(&format!(
                "nsenter -t \"${h}\" -n -u -i {env} \"$CHROOT\" {root} {argv} >\"$B/{name}.log\" 2>&1 &\n{p}=$!\n",
                h = var("H", i),
                env = env_words(&n.env),
                root = shell_quote(&n.rootfs),
                argv = argv_words(&n.command),
                name = n.name,
                p = var("P", i),
            ));
        }
    }
    s.push_str("\nsay \"all nodes started at $(uptime_s)\"\n");
    let job = fault_job(specs, faults)?;
    if let Some(job) = &job {
        s.push_str(job);
    }
    match workload {
        None => bail!("the manifest has no workload: the baseline needs one to end the run"),
        Some(WorkloadPlan::InNode { node, command, env }) => {
            let i = index_of(node).with_context(|| format!("workload node {node} not found"))?;
            // The node's environment (its image's, e.g. PATH with /usr/local/bin, and the
            // manifest's) under the workload's own, as `docker exec` would.
            let mut merged = specs[i].env.clone();
            merged.extend(env.clone());
            s.push_str(&format!(
                "nsenter -t \"${h}\" -n -u -i {env} \"$CHROOT\" {root} {argv}\n",
                h = var("H", i),
                env = env_words(&merged),
                root = shell_quote(&specs[i].rootfs),
                argv = argv_words(command),
            ));
        }
        Some(WorkloadPlan::Template(_)) => {
            bail!("the baseline runs a workload command, not a test-composer template")
        }
        Some(WorkloadPlan::OwnNode(_)) => {
            let i = specs.len() - 1;
            let n = &specs[i];
            s.push_str(&format!(
                "nsenter -t \"${h}\" -n -u -i {env} \"$CHROOT\" {root} {argv}\n",
                h = var("H", i),
                env = env_words(&n.env),
                root = shell_quote(&n.rootfs),
                argv = argv_words(&n.command),
            ));
        }
    }
    s.push_str(&format!(
        "status=$?\necho \"{DONE_MARK}status $status uptime $(uptime_s)\"\n"
    ));
    let mut pids: Vec<String> = (0..node_count)
        .map(|i| format!("${}", var("P", i)))
        .collect();
    pids.extend((0..specs.len()).map(|i| format!("${}", var("H", i))));
    if job.is_some() {
        pids.push("$FAULTS".into());
    }
    s.push_str(&format!(
        "kill -9 {} 2>/dev/null\nwait 2>/dev/null\n",
        pids.join(" ")
    ));
    for n in &specs[..node_count] {
        s.push_str(&format!(
            "echo '--- {name}.log'\nsed 's/^/{name} | /' \"$B/{name}.log\"\n",
            name = n.name
        ));
    }
    s.push_str("exit $status\n");
    Ok(s)
}

/// The background job that carries out `faults` at their times of guest uptime (`/proc/uptime`,
/// to the hundredth of a second), ending with `FAULTS=$!`; `None` without faults.
///
/// Only what a bridge can do exactly is modelled: a partition whose groups are all single nodes
/// but at most one (each single node's bridge port goes down, which cuts it off from everyone)
/// and `heal` (every port up again). Anything else is an error: the baseline cannot run the
/// scenario.
pub fn fault_job(specs: &[NodeSpec], faults: &[ScheduledFault]) -> Result<Option<String>> {
    if faults.is_empty() {
        return Ok(None);
    }
    let port = |name: &str| -> Result<String> {
        let i = specs
            .iter()
            .position(|n| n.name == name)
            .with_context(|| format!("a fault names {name}, which is no node"))?;
        Ok(format!("hv{i}"))
    };
    let all_up: Vec<String> = (0..specs.len()).map(|i| format!("hv{i}")).collect();
    let mut s = String::from(
        "# at CENTISECONDS: waits until the guest's uptime reaches it.\n\
         at() {\n    while [ \"$(cut -d' ' -f1 /proc/uptime | tr -d .)\" -lt \"$1\" ]; do sleep 0.05; done\n}\n\
         fault_job() {\n",
    );
    for f in faults {
        let down: Vec<String> = match &f.action {
            FaultAction::Network(NetworkFault::Heal) => Vec::new(),
            FaultAction::Network(NetworkFault::Partition(groups)) => {
                if groups.iter().filter(|g| g.len() > 1).count() > 1 {
                    bail!(
                        "fault {f}: the baseline models partitions that cut single nodes off \
                         only (bridge ports down)"
                    );
                }
                groups
                    .iter()
                    .filter(|g| g.len() == 1)
                    .map(|g| port(&g[0]))
                    .collect::<Result<_>>()?
            }
            _ => bail!("fault {f}: the baseline models partitions and heal only"),
        };
        let centis = f.at.as_nanos().div_ceil(10_000_000);
        s.push_str(&format!("    at {centis}\n"));
        for p in &all_up {
            s.push_str(&format!("    ip link set {p} up\n"));
        }
        for p in &down {
            s.push_str(&format!("    ip link set {p} down\n"));
        }
        s.push_str(&format!(
            "    say \"fault at $(uptime_s): {}\"\n",
            f.action.to_string().replace('"', "'")
        ));
    }
    s.push_str("}\nfault_job &\nFAULTS=$!\n");
    Ok(Some(s))
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) of a unix time, for `-rtc base=`.
pub fn rtc_base(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

pub struct Baseline<'a> {
    pub qemu: &'a Path,
    pub bzimage: &'a Path,
    pub initrd: &'a Path,
    pub cmdline: &'a str,
    pub mem: &'a str,
    pub rtc_base: String,
    pub scratch: &'a Path,
    pub limit: Duration,
}

impl Baseline<'_> {
    pub fn command(&self, index: u32) -> (Command, PathBuf, PathBuf) {
        let serial = self.scratch.join(format!("qemu-tcg-{index}.serial"));
        let status = self.scratch.join(format!("qemu-tcg-{index}.status"));
        let _ = fs::remove_file(&serial);
        let _ = fs::remove_file(&status);
        let mut cmd = Command::new(self.qemu);
        cmd.args(direct_boot_args(&DirectBoot {
            accel: GuestAccel::TcgIcount {
                rtc_base: Some(self.rtc_base.clone()),
            },
            machine: QEMU_MACHINE,
            memory: self.mem,
            firmware_dir: None,
            serial: &serial,
            status: &status,
            kernel: self.bzimage,
            initrd: self.initrd,
            append: self.cmdline,
        }));
        (cmd, serial, status)
    }

    /// One run: QEMU from spawn to exit.
    pub fn run(&self, index: u32) -> EtcdRun {
        let (cmd, serial_path, status_path) = self.command(index);
        let finished = match run_timed(cmd, self.limit, Watch::default()) {
            Ok(f) => f,
            Err(e) => return EtcdRun::failed(&e),
        };
        let serial = fs::read(&serial_path).unwrap_or_default();
        let status = fs::read(&status_path).unwrap_or_default();
        let text = String::from_utf8_lossy(&serial);
        let done = text.lines().find_map(|l| l.strip_prefix(DONE_MARK));
        let uptime = done
            .and_then(|d| d.split_whitespace().skip_while(|w| *w != "uptime").nth(1))
            .and_then(|u| u.parse::<f64>().ok());
        let upto: Vec<&str> = text
            .lines()
            .take_while(|l| !l.starts_with(DONE_MARK))
            .collect();
        let mut r = EtcdRun {
            wall_ms: ms(finished.wall),
            status: (status.len() == 1).then(|| status[0]),
            virtual_ns: uptime.map(|u| vmm::VirtNanos((u * 1e9).round() as u64)),
            output: Some(fnv1a(&serial)),
            output_bytes: Some(serial.len() as u64),
            workload_tail: Some(last_lines(&upto.join("\n"), 14)),
            ..EtcdRun::default()
        };
        r.error = crate::qemu::qemu_failure(&finished, &status, &serial, 20, self.limit);
        r.ok = r.error.is_none();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_tcg_icount_command_line() {
        let b = Baseline {
            qemu: Path::new("/q/qemu-system-x86_64"),
            bzimage: Path::new("/b/bzImage"),
            initrd: Path::new("/b/initrd,x"),
            cmdline: "console=ttyS0 reboot=t",
            mem: "1G",
            rtc_base: rtc_base(1_704_067_200),
            scratch: Path::new("/t,s"),
            limit: Duration::from_secs(1),
        };
        let (cmd, serial, status) = b.command(3);
        assert_eq!(
            (serial.as_path(), status.as_path()),
            (
                Path::new("/t,s/qemu-tcg-3.serial"),
                Path::new("/t,s/qemu-tcg-3.status")
            )
        );
        assert_eq!(
            crate::process::command_words(&cmd).join(" "),
            "/q/qemu-system-x86_64 -accel tcg -icount shift=0,sleep=off \
             -rtc clock=vm,base=2024-01-01T00:00:00 -M pc -m 1G \
             -nodefaults -no-user-config -display none -no-reboot \
             -chardev file,id=ser0,path=/t,,s/qemu-tcg-3.serial -serial chardev:ser0 \
             -chardev file,id=status,path=/t,,s/qemu-tcg-3.status \
             -device isa-debugcon,iobase=0x610,chardev=status \
             -kernel /b/bzImage -initrd /b/initrd,x -append console=ttyS0 reboot=t"
        );
    }

    #[test]
    fn rtc_base_formats_utc() {
        assert_eq!(rtc_base(0), "1970-01-01T00:00:00");
        assert_eq!(rtc_base(1_704_067_200), "2024-01-01T00:00:00");
        assert_eq!(rtc_base(951_825_661), "2000-02-29T12:01:01");
    }

    #[test]
    fn script_starts_every_node_and_runs_the_workload_inside_n1() {
        let spec = |i: usize| NodeSpec {
            name: format!("n{i}"),
            rootfs: format!("/nodes/n{i}"),
            hostname: None,
            nic: Some(format!("eth{}", i - 1)),
            address: Some(format!("192.0.2.{i}/24")),
            env: BTreeMap::from([("A".to_string(), "b c".to_string())]),
            command: vec!["etcd".into(), "--name".into(), format!("n{i}")],
            disk: None,
        };
        let specs: Vec<NodeSpec> = (1..=3).map(spec).collect();
        let w = WorkloadPlan::InNode {
            node: "n1".into(),
            command: vec!["etcd-smoke".into()],
            env: BTreeMap::new(),
        };
        let s = script(&specs, Some(&w), &[]).unwrap();
        assert!(s.contains("nic \"$H2\" 2 'eth2' '192.0.2.3/24'"));
        assert!(s.contains(
            "nsenter -t \"$H0\" -n -u -i env -i 'PATH=/usr/sbin:/usr/bin:/sbin:/bin' 'A=b c' \
             \"$CHROOT\" '/nodes/n1' 'etcd' '--name' 'n1' >\"$B/n1.log\" 2>&1 &"
        ));
        assert!(s.contains(
            "nsenter -t \"$H0\" -n -u -i env -i 'PATH=/usr/sbin:/usr/bin:/sbin:/bin' 'A=b c' \
             \"$CHROOT\" '/nodes/n1' 'etcd-smoke'\nstatus=$?"
        ));
        assert!(s.contains("kill -9 $P0 $P1 $P2 $H0 $H1 $H2"));
        assert!(script(&specs, None, &[]).is_err());
        assert!(s.contains("etcd-bench: clocksource $(cat /sys/devices/system/clocksource/"));
        assert!(!s.contains("fault_job"));
    }

    #[test]
    fn fault_job_cuts_single_nodes_off_by_their_bridge_ports() {
        let spec = |name: &str| NodeSpec {
            name: name.into(),
            rootfs: format!("/nodes/{name}"),
            hostname: None,
            nic: None,
            address: None,
            env: BTreeMap::new(),
            command: vec!["true".into()],
            disk: None,
        };
        let specs: Vec<NodeSpec> = ["n1", "n2", "n3", "workload"].map(spec).to_vec();
        let names: Vec<String> = specs.iter().map(|n| n.name.clone()).collect();
        let schedule = |texts: &[&str]| {
            run::faults::schedule(&run::faults::parse_faults(texts).unwrap(), &names)
        };
        let faults = schedule(&["at=20s partition n1 | n2,n3,workload for=10s"]).unwrap();
        let job = fault_job(&specs, &faults).unwrap().unwrap();
        let at20 = job.find("    at 2000\n").unwrap();
        let at30 = job.find("    at 3000\n").unwrap();
        assert!(at20 < at30);
        let (first, second) = job.split_at(at30);
        assert!(first.contains("    ip link set hv3 up\n    ip link set hv0 down\n"));
        assert!(!second.contains("down"));
        assert!(job.ends_with("fault_job &\nFAULTS=$!\n"));
        let w = WorkloadPlan::InNode {
            node: "n2".into(),
            command: vec!["true".into()],
            env: BTreeMap::new(),
        };
        let s = script(&specs, Some(&w), &faults).unwrap();
        assert!(s.contains(&job));
        assert!(s.contains(" $FAULTS 2>/dev/null\n"));
        assert!(fault_job(&specs, &[]).unwrap().is_none());
        let cut = schedule(&["at=1s partition n1,n2 | n3,workload"]).unwrap();
        assert!(fault_job(&specs, &cut).is_err());
        let pause = schedule(&["at=1s pause n2"]).unwrap();
        assert!(fault_job(&specs, &pause).is_err());
    }
}
