//! Encoding the payload's arguments (and the init's other word lists) for L1's busybox sh:
//! exact bytes, any byte but NUL.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// An argument the init cannot pass on: it contains a NUL byte.
#[derive(Debug, thiserror::Error)]
#[error("argument {0:?} contains a NUL byte")]
pub struct NulInArgument(pub OsString);

fn check(a: &OsString) -> Result<&[u8], NulInArgument> {
    let bytes = a.as_bytes();
    if bytes.contains(&0) {
        return Err(NulInArgument(a.clone()));
    }
    Ok(bytes)
}

/// `args` as NUL-terminated byte strings: `/payload/args`.
pub(crate) fn encode_args_nul(args: &[OsString]) -> Result<Vec<u8>, NulInArgument> {
    let mut out = Vec::new();
    for a in args {
        out.extend_from_slice(check(a)?);
        out.push(0);
    }
    Ok(out)
}

/// `args` as one POSIX sh line `set -- 'a' 'b' ...\n`: `/payload/args.sh`. Inside single quotes
/// every byte but `'` is literal (newlines included); `'` becomes `'\''`.
pub(crate) fn encode_args_sh(args: &[OsString]) -> Result<Vec<u8>, NulInArgument> {
    let mut out = b"set --".to_vec();
    for a in args {
        out.extend_from_slice(b" '");
        for &b in check(a)? {
            if b == b'\'' {
                out.extend_from_slice(b"'\\''");
            } else {
                out.push(b);
            }
        }
        out.push(b'\'');
    }
    out.push(b'\n');
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tempdir::new_temp_dir;
    use std::path::Path;
    use std::process::Command;

    pub(crate) fn os(v: &[&[u8]]) -> Vec<OsString> {
        v.iter()
            .map(|b| std::ffi::OsStr::from_bytes(b).to_os_string())
            .collect()
    }

    pub(crate) fn tricky_args() -> Vec<OsString> {
        os(&[
            b"run",
            b"",
            b"a b",
            b"it's",
            b"\"double\" 'single'",
            b"line1\nline2\n",
            b"$HOME `id` $(id) \\ \\n * ? [a] ~ ; & | < > # !",
            b"  leading and trailing  ",
            b"-",
            b"--",
            b"\t\r\x01\x7f",
            b"\x81\x82\x83\x84\x85\x86\x87\x88\xff\xfe caf\xc3\xa9",
            b"'",
            b"''",
        ])
    }

    #[test]
    fn nul_encoding_is_exact() {
        let args = tricky_args();
        let enc = encode_args_nul(&args).unwrap();
        let back: Vec<&[u8]> = enc[..enc.len() - 1].split(|&b| b == 0).collect();
        assert_eq!(back.len(), args.len());
        for (a, b) in args.iter().zip(back) {
            assert_eq!(a.as_bytes(), b);
        }
        assert!(encode_args_nul(&os(&[b"a\0b"])).is_err());
        assert_eq!(encode_args_nul(&[]).unwrap(), b"");
    }

    #[test]
    fn sh_encoding_shape() {
        assert_eq!(encode_args_sh(&[]).unwrap(), b"set --\n");
        assert_eq!(
            encode_args_sh(&os(&[b"a b", b"it's", b""])).unwrap(),
            b"set -- 'a b' 'it'\\''s' ''\n"
        );
        assert!(encode_args_sh(&os(&[b"\0"])).is_err());
    }

    /// Feeds args.sh to a real POSIX shell (busybox sh when present, as in the helper VM) and
    /// checks that "$@" comes back byte for byte.
    #[test]
    fn sh_encoding_round_trips_through_a_shell() {
        let args = tricky_args();
        let script = encode_args_sh(&args).unwrap();
        let dir = new_temp_dir().unwrap();
        let file = dir.path().join("args.sh");
        std::fs::write(&file, &script).unwrap();
        let mut shells = vec![vec!["/bin/sh"]];
        if Path::new("/bin/busybox").exists() {
            shells.push(vec!["/bin/busybox", "sh"]);
        }
        for shell in shells {
            let out = Command::new(shell[0])
                .args(&shell[1..])
                .arg("-c")
                .arg(". \"$1\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done")
                .arg("sh")
                .arg(&file)
                .output()
                .unwrap();
            assert!(out.status.success(), "{shell:?}: {out:?}");
            assert_eq!(
                out.stdout,
                encode_args_nul(&args).unwrap(),
                "{shell:?} got {:?}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}
