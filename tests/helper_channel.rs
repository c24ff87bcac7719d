//! The one typed path into the helper VM, with the real detvisor on both
//! ends: one helper VM whose payload is `detvisor serve-channel` answers
//! several run requests, holds a live run between them, streams the guest's
//! console back and returns typed failures as text.

use helper_vm::{HelperVm, HelperVmConfig, PayloadFile};
use run::api::{Reply, Request, Response, Until};
use run::plain::GuestSpec;
use std::ffi::OsString;
use std::path::PathBuf;

fn call(vm: &mut HelperVm, request: &Request) -> (Reply, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let reply: Reply = vm.call(request, &mut out, &mut err, None).unwrap();
    (reply, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn test_one_helper_vm_answers_several_run_requests_and_holds_a_run_between_them() {
    let image = run::guest::default_image().expect("the default guest image");
    let files = [
        PayloadFile {
            host_path: image.kernel.clone(),
            payload_name: "vmlinux".into(),
        },
        PayloadFile {
            host_path: image.initrd.clone(),
            payload_name: "initrd".into(),
        },
    ];
    let config = HelperVmConfig {
        assets_dir: helper_vm::ensure_assets(None).unwrap(),
        memory_mib: 2048,
        ..HelperVmConfig::default()
    };
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_detvisor"));
    let args: [OsString; 1] = ["serve-channel".into()];
    let mut vm = HelperVm::start(&config, &exe, &args, &files).unwrap();

    let guest = |seed: u64, command: &str| GuestSpec {
        seed,
        kernel: Some(helper_vm::payload_path("vmlinux").into()),
        initrd: Some(helper_vm::payload_path("initrd").into()),
        command: vec!["sh".into(), "-c".into(), command.into()],
        ..GuestSpec::default()
    };
    let random = "echo start; head -c8 /dev/urandom | od -An -tx1";

    // Two plain runs, two seeds: each streams its console and sums up.
    let mut digests = Vec::new();
    for seed in [1, 2] {
        let request = Request::Run {
            guest: guest(seed, random),
            snapshots: None,
            pcap: None,
            trace: None,
        };
        match call(&mut vm, &request) {
            (Ok(Response::Summary(summary)), console) => {
                assert_eq!(summary.exit_status, Some(0));
                assert_eq!(summary.seed, seed);
                assert!(console.contains("start"), "{console}");
                digests.push(summary.digest);
            }
            other => panic!("run with seed {seed}: {other:?}"),
        }
    }
    assert_ne!(digests[0], digests[1]);

    // A live run: booted by one request, stepped by the next ones.
    let run = match call(
        &mut vm,
        &Request::Boot {
            guest: guest(1, random),
        },
    ) {
        (Ok(Response::Started { run, .. }), _) => run,
        other => panic!("boot: {other:?}"),
    };
    let steps = Request::RunUntil {
        run,
        until: Until::Steps(100),
    };
    match call(&mut vm, &steps) {
        (Ok(Response::Position(p)), _) => {
            assert_eq!(p.exits, 100);
            assert!(p.stop.is_none());
        }
        other => panic!("run until: {other:?}"),
    }
    let end = Request::RunUntil {
        run,
        until: Until::End,
    };
    assert!(matches!(
        call(&mut vm, &end),
        (Ok(Response::Position(_)), _)
    ));
    match call(&mut vm, &Request::Outcome { run }) {
        // Stepped in pieces, the same history as in one go.
        (Ok(Response::Summary(summary)), _) => assert_eq!(summary.digest, digests[0]),
        other => panic!("outcome: {other:?}"),
    }

    // A failure crosses as its causes, once each; the helper VM goes on.
    let missing = Request::SnapshotInfo {
        dir: "/no/such/snapshot".into(),
    };
    match call(&mut vm, &missing) {
        (Err(message), _) => assert!(message.contains("/no/such/snapshot"), "{message}"),
        other => panic!("a missing snapshot: {other:?}"),
    }
    assert!(matches!(
        call(&mut vm, &Request::Close { run }),
        (Ok(Response::Closed), _)
    ));
    assert_eq!(vm.shutdown().unwrap(), 0);
}
