//! The agent's part of the Antithesis test-composer conventions: listing a
//! template directory (`/opt/antithesis/test/v1/<name>/`) as a node sees
//! it. Which command runs when is the host's decision (run/src/composer.rs);
//! the agent only lists, starts and kills.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where templates live in an image.
pub const TEMPLATE_ROOT: &str = "/opt/antithesis/test/v1";

/// Files with this prefix are the template's own helpers, never run.
pub const HELPER_PREFIX: &str = "helper_";

/// The path of command `command` of template `template`, inside the node.
pub fn command_path(template: &str, command: &str) -> Result<String, String> {
    check_component("template", template)?;
    check_component("command", command)?;
    Ok(format!("{TEMPLATE_ROOT}/{template}/{command}"))
}

/// A template or command name must be one path component.
fn check_component(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(format!("{what} {name:?} is not a file name"));
    }
    Ok(())
}

/// The commands of template `template` under the root directory `root`
/// (a node's root, e.g. `/proc/<pid>/root`), sorted by name, `helper_`
/// files and directories left out. A regular file that is not executable
/// is an error naming it (Antithesis would not run it either: better told
/// than silently skipped). A symbolic link counts as a command (its target
/// is the node's to resolve).
pub fn list_template(root: &Path, template: &str) -> Result<Vec<String>, String> {
    check_component("template", template)?;
    let dir: PathBuf = root
        .join(TEMPLATE_ROOT.trim_start_matches('/'))
        .join(template);
    let shown = format!("{TEMPLATE_ROOT}/{template}");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("list {shown}: {e}"))?;
    let mut commands = Vec::new();
    let mut not_executable = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("list {shown}: {e}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(HELPER_PREFIX) {
            continue;
        }
        let meta = entry
            .metadata()
            .map_err(|e| format!("stat {shown}/{name}: {e}"))?;
        if meta.is_dir() {
            continue;
        }
        if meta.is_file() && meta.permissions().mode() & 0o111 == 0 {
            not_executable.push(name);
            continue;
        }
        commands.push(name);
    }
    if !not_executable.is_empty() {
        not_executable.sort();
        return Err(format!(
            "{shown}: not executable (chmod +x, or name it {HELPER_PREFIX}...): {}",
            not_executable.join(", ")
        ));
    }
    commands.sort();
    Ok(commands)
}

/// `list_template` for a running process's root (`/proc/<pid>/root`).
pub fn list_for_process(pid: libc::pid_t, template: &str) -> Result<Vec<String>, String> {
    list_template(Path::new(&format!("/proc/{pid}/root")), template)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, mode: u32) {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn test_lists_sorted_commands_without_helpers_or_directories() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("opt/antithesis/test/v1/t");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        write(&dir, "parallel_driver_a.sh", 0o755);
        write(&dir, "first_init.sh", 0o755);
        write(&dir, "helper_lib.sh", 0o644);
        write(&dir, "eventually_check.sh", 0o700);
        assert_eq!(
            list_template(root.path(), "t").unwrap(),
            vec![
                "eventually_check.sh",
                "first_init.sh",
                "parallel_driver_a.sh"
            ]
        );
    }

    #[test]
    fn test_a_non_executable_command_or_missing_template_is_named() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("opt/antithesis/test/v1/t");
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir, "parallel_driver_a.sh", 0o644);
        let e = list_template(root.path(), "t").unwrap_err();
        assert!(
            e.contains("not executable") && e.contains("parallel_driver_a.sh"),
            "{e}"
        );
        let e = list_template(root.path(), "none").unwrap_err();
        assert!(e.contains("/opt/antithesis/test/v1/none"), "{e}");
        assert!(list_template(root.path(), "../x").is_err());
        assert!(command_path("t", "../../bin/sh").is_err());
        assert_eq!(
            command_path("t", "first_a").unwrap(),
            "/opt/antithesis/test/v1/t/first_a"
        );
    }
}
