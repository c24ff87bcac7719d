//! A directory with an `up` manifest and a busybox root filesystem for
//! its nodes (tests/up.rs, tests/network.rs).

use super::detvisor;
use std::path::{Path, PathBuf};

/// A directory with a manifest and a busybox root filesystem for the nodes.
pub struct Cluster {
    /// Everything of this cluster is in here (removed on drop).
    pub dir: PathBuf,
}

impl Cluster {
    pub fn new(name: &str, manifest: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("detvisor-up-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bin = dir.join("root/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
        for applet in [
            "sh", "echo", "sleep", "ping", "nc", "cat", "cut", "hostname", "seq", "true", "awk",
            "head", "od", "date", "tr", "dd", "ls", "grep",
        ] {
            std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
        }
        std::fs::write(dir.join("cluster.toml"), manifest).unwrap();
        Cluster { dir }
    }

    pub fn manifest(&self) -> String {
        self.dir.join("cluster.toml").display().to_string()
    }

    pub fn logs(&self) -> String {
        self.dir.join("logs").display().to_string()
    }

    pub fn up(&self, extra: &[&str]) -> std::process::Output {
        let manifest = self.manifest();
        let logs = self.logs();
        let mut args = vec!["up", manifest.as_str(), "--logs", logs.as_str()];
        args.extend_from_slice(extra);
        detvisor(&args)
    }

    pub fn log(&self, node: &str) -> String {
        std::fs::read_to_string(Path::new(&self.logs()).join(format!("{node}.log")))
            .unwrap_or_else(|e| panic!("log of {node}: {e}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A manifest of busybox nodes `n1`, `n2`, ... (`192.0.2.<i>`) on links of
/// `latency`, node `i` running `sh -c commands[i]`, and a workload in node
/// `workload.0` running `sh -c workload.1`.
pub fn manifest(latency: &str, commands: &[String], workload: (&str, &str)) -> String {
    let mut manifest = format!("[network]\nlatency = {latency:?}\n");
    for (i, command) in commands.iter().enumerate() {
        // Rust's escapes of a string are TOML's too (quotes, backslashes).
        manifest.push_str(&format!(
            "\n[[node]]\nname = \"n{}\"\nrootfs = \"root\"\ncommand = [\"sh\", \"-c\", {command:?}]\n",
            i + 1
        ));
    }
    let (node, command) = workload;
    manifest.push_str(&format!(
        "\n[workload]\nnode = {node:?}\ncommand = [\"sh\", \"-c\", {command:?}]\n"
    ));
    manifest
}
