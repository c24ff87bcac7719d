//! The channel end to end: the toy protocol over a socket pair (a thread plays the payload),
//! and on the real helper VM (one boot, several calls).

mod toy;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread;
use std::time::Instant;

use helper_vm::channel::{
    serve_on, write_frame, CallError, Client, Frame, FrameError, HandshakeError, HelperVm,
    StdinSource, PROTOCOL_VERSION,
};
use helper_vm::{ensure_assets, HelperVmConfig};
use toy::{Reply, ToyError, ToyReq, ToyResp};

/// A client talking to `toy::handle` served by a thread.
fn local_toy() -> (
    Client,
    thread::JoinHandle<Result<(), helper_vm::channel::ServeError>>,
) {
    let (host, guest) = UnixStream::pair().unwrap();
    let reader = guest.try_clone().unwrap();
    let server = thread::spawn(move || serve_on(reader, guest, toy::handle));
    (Client::handshake(host).unwrap(), server)
}

fn call(
    client: &mut Client,
    req: ToyReq,
    stdin: Option<StdinSource<'_>>,
) -> (Reply, Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let resp = client.call(&req, &mut out, &mut err, stdin).unwrap();
    (resp, out, err)
}

#[test]
fn toy_protocol_over_a_socket_pair() {
    let (mut c, server) = local_toy();
    assert_eq!(
        call(&mut c, ToyReq::Echo("hi".into()), None).0,
        Ok(ToyResp::Echo("hi".into()))
    );
    assert_eq!(call(&mut c, ToyReq::Add(2, 3), None).0, Ok(ToyResp::Sum(5)));
    assert_eq!(
        call(&mut c, ToyReq::Add(i64::MAX, 1), None).0,
        Err(ToyError::Overflow)
    );
    let (resp, out, err) = call(
        &mut c,
        ToyReq::Print {
            text: "line\n".into(),
            times: 3,
            err: "warn\n".into(),
        },
        None,
    );
    assert_eq!(resp, Ok(ToyResp::Printed(15)));
    assert_eq!(
        (out, err),
        (b"line\nline\nline\n".to_vec(), b"warn\n".to_vec())
    );

    // Stdin: bytes up front (more than one frame), none, one the handler ignores, a pipe.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let resp = call(&mut c, ToyReq::ReadStdin, Some(StdinSource::Bytes(&data))).0;
    assert_eq!(resp, Ok(toy::stdin_summary(&data)));
    let resp = call(&mut c, ToyReq::ReadStdin, None).0;
    assert_eq!(resp, Ok(toy::stdin_summary(b"")));
    let resp = call(&mut c, ToyReq::IgnoreStdin, Some(StdinSource::Bytes(&data))).0;
    assert_eq!(resp, Ok(ToyResp::Ignored));
    let (r, mut w) = std::io::pipe().unwrap();
    let writer = thread::spawn(move || w.write_all(b"piped"));
    let resp = call(&mut c, ToyReq::ReadStdin, Some(StdinSource::Fd(r.as_fd()))).0;
    writer.join().unwrap().unwrap();
    assert_eq!(resp, Ok(toy::stdin_summary(b"piped")));
    // A pipe that never ends: the call ends with the response anyway.
    let (r, _w) = std::io::pipe().unwrap();
    let resp = call(
        &mut c,
        ToyReq::IgnoreStdin,
        Some(StdinSource::Fd(r.as_fd())),
    )
    .0;
    assert_eq!(resp, Ok(ToyResp::Ignored));
    // Still in step after all that.
    assert_eq!(
        call(&mut c, ToyReq::Fail("no".into()), None).0,
        Err(ToyError::Refused("no".into()))
    );
    c.send_shutdown().unwrap();
    server.join().unwrap().unwrap();
}

/// A client whose "payload" is the returned stream, after a hello with `version`.
fn greeted(version: u32) -> (Result<Client, HandshakeError>, UnixStream) {
    let (host, mut guest) = UnixStream::pair().unwrap();
    write_frame(&mut guest, &Frame::<()>::Hello { version }).unwrap();
    (Client::handshake(host), guest)
}

fn echo(c: &mut Client) -> Result<Reply, CallError> {
    c.call(
        &ToyReq::Echo("x".into()),
        &mut Vec::new(),
        &mut Vec::new(),
        None,
    )
}

#[test]
fn a_closed_or_garbled_channel_is_an_error_not_a_hang() {
    // The payload went away before answering.
    let (c, guest) = greeted(PROTOCOL_VERSION);
    let mut c = c.unwrap();
    drop(guest);
    let err = echo(&mut c);
    assert!(
        matches!(err, Err(CallError::Receive(_)) | Err(CallError::Send(_))),
        "{err:?}"
    );

    // Garbage instead of a response.
    let (c, mut guest) = greeted(PROTOCOL_VERSION);
    let mut c = c.unwrap();
    guest.write_all(b"\xff\xff\xff\x7fgarbage").unwrap();
    let err = echo(&mut c).unwrap_err();
    assert!(
        matches!(err, CallError::Receive(FrameError::BadLength { .. })),
        "{err:?}"
    );

    // A wrong protocol version.
    let (c, _guest) = greeted(999);
    assert!(matches!(c, Err(HandshakeError::Version { got: 999, .. })));
}

/// The payload that serves the toy protocol (this crate's `toy_payload` bin).
fn toy_payload() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_toy_payload"))
}

/// One helper VM, several calls: `cargo test -p helper-vm --test channel -- --nocapture`.
#[test]
fn one_helper_vm_many_calls() {
    let config = HelperVmConfig {
        assets_dir: ensure_assets(None).expect("helper VM assets"),
        memory_mib: 512,
        ..HelperVmConfig::default()
    };
    let t0 = Instant::now();
    let mut vm = HelperVm::start(&config, &toy_payload(), &["serve".into()], &[]).unwrap();
    let booted = t0.elapsed();
    let mut call = |req: ToyReq, stdin: Option<StdinSource<'_>>| {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let t = Instant::now();
        let resp: Reply = vm.call(&req, &mut out, &mut err, stdin).unwrap();
        let mut what = format!("{req:?}");
        what.truncate(60);
        eprintln!("{what}: {:.3} s", t.elapsed().as_secs_f64());
        (resp, out, err)
    };
    assert_eq!(
        call(ToyReq::Echo("hello".into()), None).0,
        Ok(ToyResp::Echo("hello".into()))
    );
    assert_eq!(call(ToyReq::Add(40, 2), None).0, Ok(ToyResp::Sum(42)));
    let (resp, out, err) = call(
        ToyReq::Print {
            text: "0123456789abcdef".repeat(64),
            times: 1024,
            err: "to stderr\n".into(),
        },
        None,
    );
    assert_eq!(resp, Ok(ToyResp::Printed(1 << 20)));
    assert_eq!(out, "0123456789abcdef".repeat(64 * 1024).into_bytes());
    assert_eq!(err, b"to stderr\n");
    assert_eq!(
        call(ToyReq::Fail("nope".into()), None).0,
        Err(ToyError::Refused("nope".into()))
    );
    let data = b"stdin through the channel".repeat(1000);
    let resp = call(ToyReq::ReadStdin, Some(StdinSource::Bytes(&data))).0;
    assert_eq!(resp, Ok(toy::stdin_summary(&data)));
    let t = Instant::now();
    let status = vm.shutdown().unwrap();
    assert_eq!(status, 0);
    eprintln!(
        "boot to channel open {:.2} s, shutdown {:.2} s, total {:.2} s",
        booted.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );

    // A payload that dies during a call: the error says so, with its stderr.
    let mut vm = HelperVm::start(&config, &toy_payload(), &["serve".into()], &[]).unwrap();
    let err = vm
        .call::<_, Reply>(&ToyReq::Exit(9), &mut Vec::new(), &mut Vec::new(), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("the payload exited with status 9"), "{err}");
    assert!(err.contains("exiting with 9 as asked"), "{err}");
    let again = vm.call::<_, Reply>(&ToyReq::Add(1, 1), &mut Vec::new(), &mut Vec::new(), None);
    assert!(matches!(again, Err(CallError::Stopped)), "{again:?}");
}
