//! The payload archive: an uncompressed newc archive appended to the base initramfs, holding
//! the program (`/payload/detvisor`), its arguments, what the init should do (stdin, shares,
//! working directory, channel), the caller's files and the program's shared libraries.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use image_builder::{ImageError, NewcEntry, NewcWriter};

use crate::args::{encode_args_nul, encode_args_sh, NulInArgument};
use crate::libs::{shared_libraries, LibsError};
use crate::shares::share_tag;

/// A host file made available to the payload, at [`payload_path`]`(payload_name)`.
#[derive(Debug, Clone)]
pub struct PayloadFile {
    pub host_path: PathBuf,
    /// Relative path below `/payload/files/` (`/`-separated; no empty, `.` or `..` parts).
    pub payload_name: String,
}

/// The path under which the payload sees the [`PayloadFile`] named `payload_name`. Unless
/// [`crate::HelperVmConfig::workdir`] is set, the payload runs in `/payload/files`, so
/// `payload_name` also works as a relative path there.
pub fn payload_path(payload_name: &str) -> String {
    format!("/payload/files/{payload_name}")
}

/// Why the payload could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("helper VM payload program {} not found", path.display())]
    ProgramNotFound {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("helper VM payload program {} is not a regular file", .0.display())]
    ProgramNotAFile(PathBuf),
    #[error(transparent)]
    Argument(#[from] NulInArgument),
    #[error(
        "invalid payload file name {0:?}: need a relative path without empty, '.' or '..' parts"
    )]
    BadName(String),
    #[error("payload file {} (for {}) not found", host.display(), payload_path(name))]
    FileNotFound {
        host: PathBuf,
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("payload file {} is not a regular file", .0.display())]
    FileNotRegular(PathBuf),
    #[error("payload file name {0:?} given twice")]
    Duplicate(String),
    #[error("payload path /{0} is both a file and a directory")]
    FileAndDir(String),
    #[error(transparent)]
    Libraries(#[from] LibsError),
    #[error("unusable shared library path {}", .0.display())]
    LibraryPath(PathBuf),
    #[error("cannot open {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the helper VM initrd {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the helper VM payload archive")]
    Archive(#[source] ImageError),
}

/// Splits a payload name into its `/`-separated parts, rejecting anything that could leave
/// `/payload/files`.
fn payload_name_parts(name: &str) -> Result<Vec<&str>, PayloadError> {
    let parts: Vec<&str> = name.split('/').collect();
    if name.is_empty()
        || name.contains('\0')
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(PayloadError::BadName(name.to_string()));
    }
    Ok(parts)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    Dir,
    Bytes(Vec<u8>),
    HostFile(PathBuf),
}

/// One member of the payload archive. `name` has no leading `/`; `mode` holds permissions only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    name: String,
    mode: u32,
    content: Content,
}

/// What the payload archive says besides the program, its arguments and files.
#[derive(Debug, Default)]
pub(crate) struct PayloadOptions<'a> {
    /// `/payload/stdin` says `tty` rather than `null`.
    pub stdin_tty: bool,
    /// Shared directories in mount order (`checked_shares`): `/payload/mounts.sh`.
    pub shares: &'a [PathBuf],
    /// `/payload/workdir.sh`.
    pub workdir: Option<&'a Path>,
    /// `/payload/channel`: the name of the virtio-serial port the init links at
    /// `/dev/virtio-ports/<name>` before starting the payload.
    pub channel: Option<&'a str>,
}

/// Everything the payload archive holds, directories first (parents before children).
pub(crate) fn payload_entries(
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
    options: &PayloadOptions<'_>,
) -> Result<Vec<Entry>, PayloadError> {
    let meta = fs::metadata(exe).map_err(|source| PayloadError::ProgramNotFound {
        path: exe.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(PayloadError::ProgramNotAFile(exe.to_path_buf()));
    }
    let mut dirs: BTreeSet<String> = ["payload", "payload/files"].map(String::from).into();
    let mut regular: BTreeMap<String, (u32, Content)> = BTreeMap::new();
    let mut text = |name: &str, bytes: Vec<u8>| {
        regular.insert(format!("payload/{name}"), (0o644, Content::Bytes(bytes)));
    };
    text("args", encode_args_nul(args)?);
    text("args.sh", encode_args_sh(args)?);
    let stdin_mode: &[u8] = if options.stdin_tty {
        b"tty\n"
    } else {
        b"null\n"
    };
    text("stdin", stdin_mode.to_vec());
    if !options.shares.is_empty() {
        let mut words = Vec::with_capacity(2 * options.shares.len());
        for (i, dir) in options.shares.iter().enumerate() {
            words.push(OsString::from(share_tag(i)));
            words.push(dir.as_os_str().to_os_string());
        }
        text("mounts.sh", encode_args_sh(&words)?);
    }
    if let Some(dir) = options.workdir {
        text("workdir.sh", encode_args_sh(&[dir.as_os_str().into()])?);
    }
    if let Some(port) = options.channel {
        text("channel", format!("{port}\n").into_bytes());
    }
    regular.insert(
        "payload/detvisor".into(),
        (0o755, Content::HostFile(exe.to_path_buf())),
    );

    for f in files {
        let parts = payload_name_parts(&f.payload_name)?;
        let meta = fs::metadata(&f.host_path).map_err(|source| PayloadError::FileNotFound {
            host: f.host_path.clone(),
            name: f.payload_name.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(PayloadError::FileNotRegular(f.host_path.clone()));
        }
        add_parents(&mut dirs, "payload/files", &parts);
        let name = format!("payload/files/{}", f.payload_name);
        let mode = meta.permissions().mode() & 0o777;
        let prev = regular.insert(name, (mode, Content::HostFile(f.host_path.clone())));
        if prev.is_some() {
            return Err(PayloadError::Duplicate(f.payload_name.clone()));
        }
    }

    for lib in shared_libraries(exe)? {
        let Some(rel) = lib.to_str().and_then(|s| s.strip_prefix('/')) else {
            return Err(PayloadError::LibraryPath(lib));
        };
        let parts = payload_name_parts(rel).map_err(|_| PayloadError::LibraryPath(lib.clone()))?;
        add_parents(&mut dirs, "", &parts);
        regular
            .entry(rel.to_string())
            .or_insert((0o755, Content::HostFile(lib.clone())));
    }

    if let Some(clash) = regular.keys().find(|f| dirs.contains(*f)) {
        return Err(PayloadError::FileAndDir(clash.clone()));
    }
    let mut entries: Vec<Entry> = dirs
        .into_iter()
        .map(|name| Entry {
            name,
            mode: 0o755,
            content: Content::Dir,
        })
        .collect();
    entries.extend(regular.into_iter().map(|(name, (mode, content))| Entry {
        name,
        mode,
        content,
    }));
    Ok(entries)
}

/// Adds the directories leading to the file whose path below `base` is `parts`.
fn add_parents(dirs: &mut BTreeSet<String>, base: &str, parts: &[&str]) {
    let mut dir = String::from(base);
    for p in &parts[..parts.len() - 1] {
        if !dir.is_empty() {
            dir.push('/');
        }
        dir.push_str(p);
        dirs.insert(dir.clone());
    }
}

/// Writes `entries` as a newc archive (with trailer) to `w`, through image's [`NewcWriter`].
fn write_newc<W: Write>(entries: &[Entry], w: W) -> Result<W, PayloadError> {
    let mut newc = NewcWriter::new(w);
    for (i, e) in entries.iter().enumerate() {
        // Fewer entries than u32::MAX: every one of them is a file in memory or on the host.
        let ino = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let appended = match &e.content {
            Content::Dir => newc.append(&NewcEntry::dir(&e.name, ino, e.mode), 0, &mut io::empty()),
            Content::Bytes(bytes) => newc.append(
                &NewcEntry::file(&e.name, ino, e.mode),
                bytes.len() as u64,
                &mut &bytes[..],
            ),
            Content::HostFile(path) => {
                let open_err = |source| PayloadError::Open {
                    path: path.clone(),
                    source,
                };
                let mut file = File::open(path).map_err(open_err)?;
                let len = file.metadata().map_err(open_err)?.len();
                newc.append(&NewcEntry::file(&e.name, ino, e.mode), len, &mut file)
            }
        };
        appended.map_err(PayloadError::Archive)?;
    }
    newc.finish().map_err(PayloadError::Archive)
}

/// Writes the helper VM's initrd to `out`: `base` (the compressed initramfs), zero padding to a
/// 4-byte boundary (where the kernel looks for the next archive), the payload archive.
pub(crate) fn write_initrd(base: &Path, entries: &[Entry], out: &Path) -> Result<(), PayloadError> {
    let mut base_file = File::open(base).map_err(|source| PayloadError::Open {
        path: base.to_path_buf(),
        source,
    })?;
    let write_err = |source| PayloadError::Write {
        path: out.to_path_buf(),
        source,
    };
    let out_file = File::create(out).map_err(write_err)?;
    let mut w = BufWriter::new(out_file);
    let n = io::copy(&mut base_file, &mut w).map_err(write_err)?;
    let pad = ((4 - n % 4) % 4) as usize;
    w.write_all(&[0u8; 3][..pad]).map_err(write_err)?;
    let mut w = write_newc(entries, w)?;
    w.flush().map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::tests::tricky_args;
    use crate::tempdir::new_temp_dir;
    use std::io::Read;

    /// Reads back a newc stream: (name, mode, data) per entry, until the trailer.
    fn read_newc(mut r: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut reader = cpio::NewcReader::new(r).unwrap();
            if reader.entry().is_trailer() {
                break;
            }
            let name = reader.entry().name().to_string();
            let mode = reader.entry().mode();
            let mut data = Vec::new();
            reader.read_to_end(&mut data).unwrap();
            out.push((name, mode, data));
            r = reader.finish().unwrap();
        }
        out
    }

    #[test]
    fn payload_names() {
        assert_eq!(payload_path("kernel"), "/payload/files/kernel");
        assert_eq!(payload_path("a/b.img"), "/payload/files/a/b.img");
        assert!(payload_name_parts("a/b").is_ok());
        for bad in [
            "", "/abs", "a//b", "a/", "..", "a/../b", "./a", "a/.", "a\0b",
        ] {
            assert!(payload_name_parts(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn payload_archive_parses_back() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o700)).unwrap();
        let img = dir.path().join("disk.img");
        fs::write(&img, vec![0xa5u8; 1001]).unwrap();
        fs::set_permissions(&img, fs::Permissions::from_mode(0o640)).unwrap();
        let args = tricky_args();
        let files = [
            PayloadFile {
                host_path: img.clone(),
                payload_name: "disk.img".into(),
            },
            PayloadFile {
                host_path: exe.clone(),
                payload_name: "sub/dir/tool".into(),
            },
        ];
        let entries = payload_entries(&exe, &args, &files, &PayloadOptions::default()).unwrap();

        // Base "initramfs" of odd length: the payload must start 4-byte aligned.
        let base = b"\x1f\x8b-not-really-gzip".to_vec();
        assert_ne!(base.len() % 4, 0);
        let (base_path, initrd) = (dir.path().join("base"), dir.path().join("initrd"));
        fs::write(&base_path, &base).unwrap();
        write_initrd(&base_path, &entries, &initrd).unwrap();
        let image = fs::read(&initrd).unwrap();
        assert_eq!(&image[..base.len()], &base[..]);
        let start = base.len().next_multiple_of(4);
        assert!(image[base.len()..start].iter().all(|&b| b == 0));
        assert_eq!(image.len() % 4, 0);

        let got = read_newc(&image[start..]);
        let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "payload",
                "payload/files",
                "payload/files/sub",
                "payload/files/sub/dir",
                "payload/args",
                "payload/args.sh",
                "payload/detvisor",
                "payload/files/disk.img",
                "payload/files/sub/dir/tool",
                "payload/stdin",
            ]
        );
        let find = |n: &str| got.iter().find(|(name, _, _)| name == n).unwrap();
        assert_eq!(find("payload").1, 0o040755);
        assert_eq!(find("payload/files/sub/dir").1, 0o040755);
        let prog = find("payload/detvisor");
        assert_eq!(prog.1, 0o100755);
        assert_eq!(prog.2, b"#!/bin/sh\necho hi\n");
        assert_eq!(find("payload/args").2, encode_args_nul(&args).unwrap());
        assert_eq!(find("payload/args.sh").2, encode_args_sh(&args).unwrap());
        assert_eq!(find("payload/stdin").2, b"null\n");
        let disk = find("payload/files/disk.img");
        assert_eq!(disk.1, 0o100640);
        assert_eq!(disk.2, vec![0xa5u8; 1001]);
        assert_eq!(find("payload/files/sub/dir/tool").1, 0o100700);
    }

    #[test]
    fn payload_rejects_bad_input() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"x").unwrap();
        let file = |name: &str| PayloadFile {
            host_path: exe.clone(),
            payload_name: name.into(),
        };
        let entries = |exe: &Path, files: &[PayloadFile]| {
            payload_entries(exe, &[], files, &PayloadOptions::default())
        };
        assert!(matches!(
            entries(&dir.path().join("missing"), &[]),
            Err(PayloadError::ProgramNotFound { .. })
        ));
        assert!(matches!(
            entries(dir.path(), &[]),
            Err(PayloadError::ProgramNotAFile(_))
        ));
        assert!(matches!(
            entries(&exe, &[file("../x")]),
            Err(PayloadError::BadName(_))
        ));
        assert!(matches!(
            entries(&exe, &[file("a"), file("a")]),
            Err(PayloadError::Duplicate(_))
        ));
        assert!(matches!(
            entries(&exe, &[file("a"), file("a/b")]),
            Err(PayloadError::FileAndDir(_))
        ));
        let missing = PayloadFile {
            host_path: dir.path().join("nope"),
            payload_name: "n".into(),
        };
        let err = entries(&exe, &[missing]).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        let with = |options: &PayloadOptions<'_>| payload_entries(&exe, &[], &[], options).unwrap();
        let stdin = with(&PayloadOptions {
            stdin_tty: true,
            ..PayloadOptions::default()
        });
        let e = stdin.iter().find(|e| e.name == "payload/stdin").unwrap();
        assert_eq!(e.content, Content::Bytes(b"tty\n".to_vec()));
        let channel = with(&PayloadOptions {
            channel: Some("detvisor.0"),
            ..PayloadOptions::default()
        });
        let e = channel
            .iter()
            .find(|e| e.name == "payload/channel")
            .unwrap();
        assert_eq!(e.content, Content::Bytes(b"detvisor.0\n".to_vec()));
    }

    #[test]
    fn payload_mounts_and_workdir() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"x").unwrap();
        let plain = payload_entries(&exe, &[], &[], &PayloadOptions::default()).unwrap();
        assert!(!plain.iter().any(|e| e.name == "payload/mounts.sh"
            || e.name == "payload/workdir.sh"
            || e.name == "payload/channel"));

        let shares = [PathBuf::from("/h/it's"), PathBuf::from("/h/it's/x y")];
        let options = PayloadOptions {
            shares: &shares,
            workdir: Some(Path::new("/h/it's")),
            ..PayloadOptions::default()
        };
        let entries = payload_entries(&exe, &[], &[], &options).unwrap();
        let content = |name: &str| {
            let e = entries.iter().find(|e| e.name == name).unwrap();
            assert_eq!(e.mode, 0o644);
            e.content.clone()
        };
        assert_eq!(
            content("payload/mounts.sh"),
            Content::Bytes(b"set -- 'share0' '/h/it'\\''s' 'share1' '/h/it'\\''s/x y'\n".to_vec())
        );
        assert_eq!(
            content("payload/workdir.sh"),
            Content::Bytes(b"set -- '/h/it'\\''s'\n".to_vec())
        );
    }
}
