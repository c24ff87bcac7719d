//! A command ready for `execve`: its argv and environment as C strings and
//! the paths its program may be at (looked up in its `PATH` like `execvp`).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;

use crate::sys::cstring;

/// `PATH` for commands whose environment has none (also used for lookup).
const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// A command ready for `execve`.
#[derive(Debug)]
pub struct Command {
    pub(super) argv: Vec<CString>,
    pub(super) env: Vec<CString>,
    /// Paths to try in order (argv[0] itself if it has a `/`, else each
    /// `PATH` entry joined with it).
    pub(super) candidates: Vec<CString>,
    pub(super) program: String,
}

impl Command {
    pub fn new(argv: &[String], env: &BTreeMap<String, String>) -> io::Result<Self> {
        let Some(program) = argv.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
        };
        let mut env_strings = Vec::with_capacity(env.len() + 1);
        for (key, value) in env {
            if key.is_empty() || key.contains('=') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("invalid environment variable name {key:?}"),
                ));
            }
            env_strings.push(cstring(&format!("{key}={value}"))?);
        }
        let path = match env.get("PATH") {
            Some(path) => path.as_str(),
            None => {
                env_strings.push(cstring(&format!("PATH={DEFAULT_PATH}"))?);
                DEFAULT_PATH
            }
        };
        let candidates = if program.contains('/') {
            vec![cstring(program)?]
        } else if program.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty program name",
            ));
        } else {
            path.split(':')
                .map(|dir| {
                    let dir = if dir.is_empty() { "." } else { dir };
                    cstring(&format!("{}/{program}", dir.trim_end_matches('/')))
                })
                .collect::<io::Result<_>>()?
        };
        Ok(Self {
            argv: argv.iter().map(|a| cstring(a)).collect::<io::Result<_>>()?,
            env: env_strings,
            candidates,
            program: program.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(c: &[CString]) -> Vec<&str> {
        c.iter().map(|s| s.to_str().unwrap()).collect()
    }

    #[test]
    fn test_command_looks_program_up_in_path_and_adds_default_path() {
        // Act
        let command = Command::new(&["sh".into(), "-c".into()], &BTreeMap::new()).unwrap();

        // Assert
        assert_eq!(strings(&command.argv), ["sh", "-c"]);
        assert_eq!(strings(&command.env), [&format!("PATH={DEFAULT_PATH}")]);
        assert_eq!(
            strings(&command.candidates),
            ["/usr/sbin/sh", "/usr/bin/sh", "/sbin/sh", "/bin/sh"]
        );
    }

    #[test]
    fn test_command_with_slash_and_own_path() {
        // Arrange
        let env: BTreeMap<String, String> =
            [("PATH".into(), "/x:".into()), ("A".into(), "b c".into())].into();

        // Act
        let absolute = Command::new(&["/bin/true".into()], &env).unwrap();
        let looked_up = Command::new(&["prog".into()], &env).unwrap();

        // Assert
        assert_eq!(strings(&absolute.candidates), ["/bin/true"]);
        assert_eq!(strings(&absolute.env), ["A=b c", "PATH=/x:"]);
        assert_eq!(strings(&looked_up.candidates), ["/x/prog", "./prog"]);
    }

    #[test]
    fn test_command_rejects_bad_input() {
        let env: BTreeMap<String, String> = [("A=B".into(), "c".into())].into();
        assert!(Command::new(&[], &BTreeMap::new()).is_err());
        assert!(Command::new(&["".into()], &BTreeMap::new()).is_err());
        assert!(Command::new(&["a\0b".into()], &BTreeMap::new()).is_err());
        assert!(Command::new(&["sh".into()], &env).is_err());
    }
}
