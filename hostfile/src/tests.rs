use super::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::sync::mpsc;
use std::time::Duration;

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Runs `f` on a thread and fails the test if it has not returned in 10 s
/// (a read of a FIFO without a writer would block for ever).
fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the read hung")
}

#[test]
fn test_a_fifo_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("state.bin");
    mkfifo(&fifo);
    let e = within_seconds(move || read_limited(&fifo, 1 << 20).unwrap_err());
    assert!(
        matches!(e, ReadError::NotRegular { kind: "FIFO", .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("state.bin: not a regular file (a FIFO)"),
        "{e}"
    );
}

#[test]
fn test_a_symlink_to_a_device_or_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("zero");
    symlink("/dev/zero", &link).unwrap();
    let e = read_limited(&link, 1 << 20).unwrap_err();
    assert!(
        matches!(
            e,
            ReadError::NotRegular {
                kind: "character device",
                ..
            }
        ),
        "{e}"
    );
    let e = read_limited(dir.path(), 1 << 20).unwrap_err();
    assert!(
        matches!(
            e,
            ReadError::NotRegular {
                kind: "directory",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn test_a_symlink_to_a_regular_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a");
    std::fs::write(&file, b"hello").unwrap();
    let link = dir.path().join("b");
    symlink(&file, &link).unwrap();
    assert_eq!(read_limited(&link, 5).unwrap(), b"hello");
    assert_eq!(read_text_limited(&link, 5).unwrap(), "hello");
}

#[test]
fn test_the_limit_is_enforced_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big");
    std::fs::write(&file, [0u8; 100]).unwrap();
    assert_eq!(read_limited(&file, 100).unwrap().len(), 100);
    let e = read_limited(&file, 99).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("big: larger than the limit of 99 bytes"),
        "{e}"
    );
}

#[test]
fn test_output_refuses_a_device_node_and_leaves_it() {
    let e = Output::create(Path::new("/dev/null")).err().unwrap();
    assert!(
        e.to_string()
            .starts_with("/dev/null: exists and is not a regular file (a character device)"),
        "{e}"
    );
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
}

#[test]
fn test_output_refuses_a_symlink_and_never_writes_through_a_partial_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    // An output that is a symlink is refused.
    let out = dir.path().join("out");
    symlink(&victim, &out).unwrap();
    assert!(matches!(
        Output::create(&out).err().unwrap(),
        WriteError::NotRegular {
            kind: "symbolic link",
            ..
        }
    ));
    // A symlink where an old fixed temporary name was is left alone.
    let out = dir.path().join("out2");
    symlink(&victim, dir.path().join("out2.partial")).unwrap();
    symlink(&victim, dir.path().join(".out2.partial")).unwrap();
    assert_eq!(write_atomic(&out, b"new").unwrap(), 3);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert_eq!(std::fs::read(&out).unwrap(), b"new");
}

#[test]
fn test_two_outputs_to_one_path_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("img");
    let mut a = Output::create(&out).unwrap();
    let mut b = Output::create(&out).unwrap();
    a.write_all(&[b'a'; 1000]).unwrap();
    b.write_all(&[b'b'; 10]).unwrap();
    assert_eq!(a.commit().unwrap(), 1000);
    assert_eq!(std::fs::read(&out).unwrap(), [b'a'; 1000]);
    assert_eq!(b.commit().unwrap(), 10);
    assert_eq!(std::fs::read(&out).unwrap(), [b'b'; 10]);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn test_an_output_dropped_uncommitted_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("img");
    let mut a = Output::create(&out).unwrap();
    a.write_all(b"x").unwrap();
    drop(a);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn test_an_output_has_the_mode_file_create_gives() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::File::create(&plain).unwrap();
    let out = dir.path().join("out");
    write_atomic(&out, b"x").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&out), mode(&plain));
}
