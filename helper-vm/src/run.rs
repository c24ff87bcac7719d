//! The one-shot run: boot the helper VM, run one program to its end, return its exit status.

use std::ffi::OsString;
use std::path::Path;

use crate::launch::{LaunchError, LaunchSpec, Running};
use crate::qemu::VmFailed;
use crate::stdio::{stdin_is_foreground_terminal, Target};
use crate::{HelperVmConfig, PayloadFile};

/// Why [`run`] has no exit status to return.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error(transparent)]
    Failed(#[from] VmFailed),
}

/// Runs `exe` with `args` inside the helper VM; streams its stdout to our stdout live and its
/// stderr to our stderr; returns its exit status (0..=255; a payload killed by signal N gives
/// 128+N; [`crate::STATUS_HELPER_FAILED`] when the helper VM could not start it, the reason
/// being on stderr). Errors name what went wrong on the host side: QEMU or the assets missing,
/// QEMU failing or killed, no exit status reported (with the tail of what came back).
pub fn run(
    config: &HelperVmConfig,
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
) -> Result<i32, RunError> {
    run_to(config, exe, args, files, Target::Stdout, Target::Stderr)
}

/// [`run`] with the payload's stdout and stderr sent to the given targets.
pub(crate) fn run_to(
    config: &HelperVmConfig,
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
    out: Target,
    err: Target,
) -> Result<i32, RunError> {
    let spec = LaunchSpec {
        config,
        exe,
        args,
        files,
        forward_stdin: config.forward_stdin_always || stdin_is_foreground_terminal(),
        channel: None,
        out,
        err,
    };
    Ok(Running::start(&spec)?.finish(None)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::tests::{os, tricky_args};
    use crate::assets::{BUILD_INFO_FILE, INITRAMFS_FILE, KERNEL_FILE};
    use crate::tempdir::new_temp_dir;
    use crate::{ensure_assets, STATUS_HELPER_FAILED};
    use std::fs::{self, File};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::{Arc, Mutex};

    #[test]
    fn missing_assets_and_qemu_are_named() {
        let dir = new_temp_dir().unwrap();
        let config = HelperVmConfig {
            assets_dir: dir.path().to_path_buf(),
            ..HelperVmConfig::default()
        };
        let exe = std::env::current_exe().unwrap();
        let err = run(&config, &exe, &[], &[]).unwrap_err();
        assert!(err.to_string().contains("assets missing"), "{err}");

        fs::write(dir.path().join(KERNEL_FILE), b"k").unwrap();
        fs::write(dir.path().join(INITRAMFS_FILE), b"i").unwrap();
        let config = HelperVmConfig {
            qemu: dir.path().join("no-such-qemu"),
            ..config
        };
        let err = run(&config, &exe, &[], &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("not found: install qemu-system-x86"),
            "{err}"
        );
    }

    #[test]
    fn shares_need_assets_that_support_them() {
        let dir = new_temp_dir().unwrap();
        fs::write(dir.path().join(KERNEL_FILE), b"k").unwrap();
        fs::write(dir.path().join(INITRAMFS_FILE), b"i").unwrap();
        fs::write(dir.path().join(BUILD_INFO_FILE), b"features kvm\n").unwrap();
        let share = fs::canonicalize(dir.path()).unwrap();
        let exe = std::env::current_exe().unwrap();
        for config in [
            HelperVmConfig {
                assets_dir: dir.path().to_path_buf(),
                shared_dirs: vec![share.clone()],
                ..HelperVmConfig::default()
            },
            HelperVmConfig {
                assets_dir: dir.path().to_path_buf(),
                workdir: Some(share.clone()),
                ..HelperVmConfig::default()
            },
        ] {
            let err = run(&config, &exe, &[], &[]).unwrap_err().to_string();
            assert!(
                err.contains("rebuild them with helper-vm/build.sh"),
                "{err}"
            );
        }
    }

    /// Boots the real helper VM: `cargo test -p helper-vm -- --ignored helper_vm_end_to_end
    /// --nocapture`. Also shares two host directories (one nested in the other, names with a
    /// space and a comma) with the working directory in the outer one, and prints the 9p write
    /// throughput of a 64 MiB `dd`.
    #[test]
    fn helper_vm_end_to_end() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let assets = ensure_assets(None).expect("helper VM assets");
        // busybox picks its applet from argv[0], so wrap it: /payload/detvisor is this script.
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("wrapper");
        fs::write(&exe, b"#!/bin/sh\nexec /bin/busybox \"$@\"\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        fs::write(&data, b"file contents\n").unwrap();
        let share = fs::canonicalize(dir.path()).unwrap().join("shared dir,1");
        let nested = share.join("nested");
        fs::create_dir_all(&nested).unwrap();
        fs::write(share.join("in.txt"), b"from the host\n").unwrap();
        let config = HelperVmConfig {
            assets_dir: assets,
            shared_dirs: vec![nested.clone(), share.clone()],
            workdir: Some(share.clone()),
            ..HelperVmConfig::default()
        };
        const SPARSE_LEN: u64 = 100 << 20;
        let script = format!(
            "echo \"a b\"; ls /dev/kvm; grep -c svm /proc/cpuinfo; \
             cat /payload/files/sub/data; pwd; cat in.txt; echo appended >>in.txt; \
             echo 'from L1' >out.txt; mkdir sub && echo deep >sub/f; echo inner >nested/n.txt; \
             printf X | dd of=sparse bs=1 seek={} conv=notrunc 2>/dev/null; \
             t0=$(cut -d' ' -f1 /proc/uptime); dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; \
             echo $t0 $(cut -d' ' -f1 /proc/uptime) >dd.times; \
             printf '%s|' \"$@\"; echo oops >&2; exit 7",
            SPARSE_LEN - 1
        );
        let mut args = os(&[b"sh", b"-c", script.as_bytes(), b"sh"]);
        args.extend(tricky_args());
        let files = [PayloadFile {
            host_path: data,
            payload_name: "sub/data".into(),
        }];
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let status = run_to(
            &config,
            &exe,
            &args,
            &files,
            Target::Buffer(out.clone()),
            Target::Buffer(err.clone()),
        )
        .unwrap();
        let mut expected = b"a b\n/dev/kvm\n1\nfile contents\n".to_vec();
        expected.extend_from_slice(share.as_os_str().as_bytes());
        expected.extend_from_slice(b"\nfrom the host\n");
        for a in tricky_args() {
            expected.extend_from_slice(a.as_bytes());
            expected.push(b'|');
        }
        let out = out.lock().unwrap().clone();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(out, expected);
        assert_eq!(*err.lock().unwrap(), b"oops\n");
        assert_eq!(status, 7);

        // What the payload wrote is on the host, as ordinary files of ours.
        assert_eq!(
            fs::read(share.join("in.txt")).unwrap(),
            b"from the host\nappended\n"
        );
        let created = share.join("out.txt");
        assert_eq!(fs::read(&created).unwrap(), b"from L1\n");
        let meta = fs::symlink_metadata(&created).unwrap();
        assert!(meta.is_file());
        // SAFETY: getuid/getgid only query this process's credentials.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert_eq!(fs::read(share.join("sub/f")).unwrap(), b"deep\n");
        assert_eq!(fs::read(nested.join("n.txt")).unwrap(), b"inner\n");
        let sparse = File::open(share.join("sparse")).unwrap();
        let meta = sparse.metadata().unwrap();
        assert_eq!(meta.len(), SPARSE_LEN);
        let mut last = [0u8; 2];
        assert_eq!(sparse.read_at(&mut last, SPARSE_LEN - 1).unwrap(), 1);
        assert_eq!(last[0], b'X');
        assert!(meta.blocks() * 512 < 1 << 20, "not sparse: {meta:?}");
        assert_eq!(fs::metadata(share.join("big")).unwrap().len(), 64 << 20);
        let times: Vec<f64> = fs::read_to_string(share.join("dd.times"))
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        let secs = (times[1] - times[0]).max(0.01); // /proc/uptime has 10 ms resolution
        eprintln!(
            "64 MiB dd bs=1M to a 9p share in L1: {secs:.2} s, {:.0} MiB/s",
            64.0 / secs
        );
    }

    /// A working directory that does not exist in L1 is reported, with status 125.
    #[test]
    fn helper_vm_missing_workdir() {
        let assets = ensure_assets(None).expect("helper VM assets");
        let dir = new_temp_dir().unwrap();
        let share = fs::canonicalize(dir.path()).unwrap();
        let config = HelperVmConfig {
            assets_dir: assets,
            shared_dirs: vec![share.clone()],
            workdir: Some(share.join("missing")),
            ..HelperVmConfig::default()
        };
        let exe = dir.path().join("wrapper");
        fs::write(&exe, b"#!/bin/sh\necho ran\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let status = run_to(
            &config,
            &exe,
            &[],
            &[],
            Target::Buffer(out.clone()),
            Target::Buffer(err.clone()),
        )
        .unwrap();
        assert_eq!(status, STATUS_HELPER_FAILED);
        assert!(out.lock().unwrap().is_empty());
        let err = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
        assert!(
            err.contains("cannot enter the working directory") && err.contains("missing"),
            "{err}"
        );
    }
}
