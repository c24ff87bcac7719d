//! What a dynamically linked payload program needs to start in L1, which has no libc: its ELF
//! interpreter and the shared libraries `ldd` resolves on the host.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why the libraries of a program could not be found.
#[derive(Debug, thiserror::Error)]
pub enum LibsError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is dynamically linked and ldd (libc-bin) cannot be run", exe.display())]
    NoLdd {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("ldd {} failed: {stderr}", exe.display())]
    LddFailed { exe: PathBuf, stderr: String },
    #[error("{} cannot run in the helper VM: shared library {name} not found", exe.display())]
    NotFound { exe: PathBuf, name: String },
}

/// The ELF interpreter (`PT_INTERP`) of a 64-bit little-endian ELF file; `None` for a static
/// executable or a file that is not such an ELF (e.g. a `#!` script).
fn elf_interpreter(bytes: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? == 3 {
            let off = usize::try_from(u64_at(ph + 8)?).ok()?;
            let size = usize::try_from(u64_at(ph + 32)?).ok()?;
            let raw = bytes.get(off..off.checked_add(size)?)?;
            let raw = raw.split(|&b| b == 0).next()?;
            return Some(PathBuf::from(std::ffi::OsStr::from_bytes(raw)));
        }
    }
    None
}

/// Parses `ldd` output into the absolute paths of the libraries and the loader; `Err(name)`
/// names a library ldd could not find.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>, String> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim) {
        let target = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.trim_start().starts_with("not found") {
                    return Err(name.to_string());
                }
                rest
            }
            None => line,
        };
        let path = target.rsplit_once(" (0x").map_or(target, |(p, _)| p).trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The ELF interpreter (`PT_INTERP`) of `exe`; `None` for a static
/// executable or a file that is not a 64-bit ELF.
pub fn elf_interpreter_of(exe: &Path) -> Result<Option<PathBuf>, LibsError> {
    let read_err = |source| LibsError::Read {
        path: exe.to_path_buf(),
        source,
    };
    let mut head = Vec::new();
    File::open(exe)
        .map_err(read_err)?
        .take(1 << 20)
        .read_to_end(&mut head)
        .map_err(read_err)?;
    Ok(elf_interpreter(&head))
}

/// The files a dynamically linked `exe` needs to start where this host's
/// libc is not (the helper VM, a QEMU baseline's chroot): its interpreter
/// and the libraries `ldd` resolves. Empty for a static executable.
pub fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>, LibsError> {
    let Some(interp) = elf_interpreter_of(exe)? else {
        return Ok(Vec::new());
    };
    let out = Command::new("ldd")
        .arg(exe)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LibsError::NoLdd {
            exe: exe.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        return Err(LibsError::LddFailed {
            exe: exe.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let mut libs =
        parse_ldd(&String::from_utf8_lossy(&out.stdout)).map_err(|name| LibsError::NotFound {
            exe: exe.to_path_buf(),
            name,
        })?;
    if !libs.contains(&interp) {
        libs.push(interp);
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_parsing() {
        let out = "\tlinux-vdso.so.1 (0x00007ffc1b5f2000)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f2c0b9a0000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2c0b7bf000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2c0ba2b000)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err(),
            "libfoo.so.1"
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    #[test]
    fn elf_interpreter_of_this_test_binary() {
        // The test binary is linked like detvisor itself: dynamically, against glibc.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let interp = elf_interpreter(&me).expect("test binary has PT_INTERP");
        assert!(interp.is_absolute(), "{interp:?}");
        assert!(shared_libraries(&std::env::current_exe().unwrap())
            .unwrap()
            .contains(&interp));
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(b"\x7fELF\x02\x01"), None);
        assert_eq!(elf_interpreter(b""), None);
    }
}
