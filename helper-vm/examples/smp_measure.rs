//! Measures how a helper VM runs detvisor runs side by side (issue 13: the placement of a
//! campaign's workers): `smp_measure CPUS RUNS DETVISOR KERNEL INITRD -- GUEST-COMMAND...`
//! boots one helper VM with CPUS vCPUs (multi-threaded TCG beyond one) and starts RUNS
//! `detvisor run --seed 1` of the same guest command at once inside it; each run prints its
//! wall time (L1's /proc/uptime) and its summary line. Start several of these at once for
//! "one helper VM per worker".

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use helper_vm::{HelperVmConfig, PayloadFile};

/// The payload: a script (L1's busybox sh) that starts the runs in the background. detvisor
/// is started through its ELF interpreter, shipped alongside with its libraries: only the
/// payload program's own libraries are installed at their host paths.
const SCRIPT: &str = r#"#!/bin/sh
runs=$1; shift
f=/payload/files
i=0
while [ "$i" -lt "$runs" ]; do
	(
		s=$(cut -d' ' -f1 /proc/uptime)
		$f/ld.so --library-path $f $f/detvisor run --host-vm never --stall-timeout 30m \
			--kernel $f/vmlinux --initrd $f/initrd --seed 1 -- "$@" >/tmp/out$i 2>/tmp/err$i
		st=$?
		e=$(cut -d' ' -f1 /proc/uptime)
		echo "run $i: status $st, start $s, end $e (L1 uptime, s)"
		tail -n 3 /tmp/err$i; tail -c 600 /tmp/out$i
	) &
	i=$((i + 1))
done
wait
"#;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dash) = args.iter().position(|a| a == "--") else {
        eprintln!("usage: smp_measure CPUS RUNS DETVISOR KERNEL INITRD -- COMMAND...");
        std::process::exit(2);
    };
    let cpus: u32 = args[0].parse().expect("CPUS");
    let runs: u32 = args[1].parse().expect("RUNS");
    let dir = std::env::temp_dir().join(format!("smp-measure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("measure.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let file = |host: &str, name: &str| PayloadFile {
        host_path: PathBuf::from(host),
        payload_name: name.into(),
    };
    let files = vec![
        file(&args[2], "detvisor"),
        file(&args[3], "vmlinux"),
        file(&args[4], "initrd"),
        file("/lib64/ld-linux-x86-64.so.2", "ld.so"),
        file("/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6"),
        file("/lib/x86_64-linux-gnu/libgcc_s.so.1", "libgcc_s.so.1"),
        file("/lib/x86_64-linux-gnu/libm.so.6", "libm.so.6"),
    ];
    let config = HelperVmConfig {
        assets_dir: helper_vm::ensure_assets(None).unwrap(),
        cpus,
        memory_mib: 1024 + 1024 * runs,
        ..HelperVmConfig::default()
    };
    let mut payload_args: Vec<OsString> = vec![runs.to_string().into()];
    payload_args.extend(args[dash + 1..].iter().map(OsString::from));
    let started = Instant::now();
    let status = helper_vm::run(&config, &script, &payload_args, &files).unwrap();
    println!(
        "helper VM: {cpus} vCPU, {runs} runs: status {status}, {:.1} s on the host in all",
        started.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&dir).ok();
}
