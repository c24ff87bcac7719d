//! `detvisor gdb` end to end, with Debian's gdb as the client (scripted
//! with `gdb -batch`), on the default guest's vmlinux (symbols, no KASLR),
//! through real KVM (the helper VM on hosts whose KVM cannot run guests).

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// gdb's output between two `echo @@NAME` markers.
fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("@@{name}\n"))
        .unwrap_or_else(|| panic!("no section {name} in:\n{out}"))
        + name.len()
        + 3;
    let end = out[start..].find("@@").map_or(out.len(), |i| start + i);
    &out[start..end]
}

/// `monitor position`'s `exit:N+insn:K` in a section.
fn position(text: &str) -> String {
    text.lines()
        .find_map(|l| l.split(' ').find(|w| w.starts_with("exit:")))
        .unwrap_or_else(|| panic!("no position in {text:?}"))
        .to_owned()
}

/// `info registers`'s lines for the general registers, RIP and flags.
fn registers(text: &str) -> Vec<&str> {
    let regs: Vec<&str> = text
        .lines()
        .filter(|l| {
            let name = l.split_whitespace().next().unwrap_or("");
            matches!(
                name,
                "rax"
                    | "rbx"
                    | "rcx"
                    | "rdx"
                    | "rsi"
                    | "rdi"
                    | "rbp"
                    | "rsp"
                    | "r8"
                    | "r9"
                    | "r10"
                    | "r11"
                    | "r12"
                    | "r13"
                    | "r14"
                    | "r15"
                    | "rip"
                    | "eflags"
                    | "cs"
            )
        })
        .collect();
    assert_eq!(regs.len(), 19, "{text}");
    regs
}

#[test]
fn test_gdb_breaks_steps_and_runs_backward_in_the_default_guest() {
    // Arrange: a history of the default guest's boot, saved at exit 200.
    let dir = std::env::temp_dir().join(format!("detvisor-gdb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let snaps = dir.join("snaps").display().to_string();
    let free = boot_saved_at_exit(&snaps, 200, &[]);
    let vmlinux = run::guest::default_image().unwrap().kernel;
    let start = format!("{snaps}@exit:200");
    let mut server = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(["gdb", &start, "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut server_err = BufReader::new(server.stderr.take().unwrap());
    let mut said = String::new();
    let addr = loop {
        let mut line = String::new();
        assert!(server_err.read_line(&mut line).unwrap() > 0, "{said}");
        said += &line;
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split(' ').next().unwrap().to_owned();
        }
    };

    // Act: break in the scheduler, continue to two hits, five steps
    // forward and back, then back to the first hit.
    // `monitor digest` hashes all of guest RAM: longer than gdb's default
    // 2 s on a loaded machine (docs/debugging.md says to raise it).
    let mut script = vec![
        "set remotetimeout 60".to_string(),
        format!("target remote {addr}"),
        "break schedule".into(),
    ];
    fn mark(script: &mut Vec<String>, name: &str, commands: &[&str]) {
        script.push(format!("echo @@{name}\\n"));
        script.extend(commands.iter().map(|c| c.to_string()));
        script.extend(["monitor position".into(), "info registers".into()]);
    }
    mark(&mut script, "first", &["continue"]);
    mark(&mut script, "second", &["continue"]);
    mark(&mut script, "forward", &["stepi 5"]);
    mark(&mut script, "back", &["reverse-stepi 5"]);
    mark(&mut script, "previous", &["reverse-continue"]);
    script.extend(["monitor digest".into(), "monitor error".into()]);
    // A write watchpoint on the tick counter (the vmlinux has no debug
    // information: the symbol's type is given): two changes, then back to
    // the first.
    script.extend(["delete", "watch *(unsigned long *)&jiffies"].map(String::from));
    mark(&mut script, "changed", &["continue"]);
    mark(&mut script, "changed again", &["continue"]);
    mark(&mut script, "changed before", &["reverse-continue"]);
    // A register write: the present is a branch point, the start of what
    // reverse execution can reach.
    script.extend(
        [
            "set $rax = 0x1234",
            "monitor start",
            "echo @@written\\n",
            "info registers rax",
            "reverse-stepi",
            "monitor position",
            "echo @@end\\n",
        ]
        .map(String::from),
    );
    script.push("kill".into());
    let mut gdb = Command::new("gdb");
    gdb.args(["-batch", "-nx"]).arg(&vmlinux);
    for command in &script {
        gdb.args(["-ex", command]);
    }
    let out = gdb
        .output()
        .expect("Debian's gdb runs (scripts/test installs it)");
    // gdb writes what the server's `monitor` commands print to stderr,
    // the rest to stdout: each in order.
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let monitor = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("--- gdb's stdout:\n{text}\n--- its stderr:\n{monitor}");
    let mut positions = monitor
        .lines()
        .filter(|l| l.starts_with("exit:") || l == &"no error" || l.contains("error"));
    let mut next_position = || {
        positions
            .next()
            .unwrap_or_else(|| panic!("{monitor}"))
            .to_owned()
    };
    let status = server.wait().unwrap();
    std::io::Read::read_to_string(&mut server_err, &mut said).unwrap();
    eprintln!("--- detvisor gdb:\n{said}");

    // Assert: both hits stop in `schedule`, at two positions.
    assert!(status.success(), "{said}");
    let [first_at, second_at, forward_at, back_at, previous_at, digest, error, changed_at, again_at, before_at, branch_point, after_write] =
        std::array::from_fn(|_| next_position());
    let first = section(&text, "first");
    let second = section(&text, "second");
    for hit in [first, second] {
        assert!(hit.contains("Breakpoint 1, "), "{hit}");
        let rip = registers(hit)
            .into_iter()
            .find(|l| l.starts_with("rip"))
            .unwrap();
        assert!(rip.contains("<schedule+"), "{hit}");
    }
    assert_ne!(position(&first_at), position(&second_at));
    // Five steps on, five back: the second hit's registers again.
    assert_ne!(position(&forward_at), position(&second_at));
    assert_ne!(registers(section(&text, "forward")), registers(second));
    let back = section(&text, "back");
    assert_eq!(position(&back_at), position(&second_at));
    assert_eq!(registers(back), registers(second));
    // Back to the previous hit: the first, exactly.
    let previous = section(&text, "previous");
    assert!(previous.contains("Breakpoint 1, "), "{previous}");
    assert_eq!(position(&previous_at), position(&first_at));
    assert_eq!(registers(previous), registers(first));
    assert_eq!(error, "no error");
    // The machine there is the one a fresh replay reaches: no breakpoint
    // byte left behind, no step that showed.
    let at = position(&digest);
    assert_eq!(at, position(&first_at));
    let seek = detvisor(&["seek", &format!("{snaps}@{at}"), "--json"]);
    assert_eq!(seek.status.code(), Some(0), "{}", stderr(&seek));
    let memory = summary(&seek)["memory_hash"].as_str().unwrap().to_owned();
    assert!(
        digest.ends_with(&format!("memory {memory}")),
        "{digest} vs {memory}"
    );
    // The watchpoint: each stop is just after the write, which gdb saw
    // as the counter's old and new values; back is the first change.
    let changed = section(&text, "changed");
    assert!(changed.contains("Hardware watchpoint 2: "), "{changed}");
    let values = |text: &str| -> (u64, u64) {
        let value = |name: &str| {
            let line = text
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{text}"));
            line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        };
        (value("Old value = "), value("New value = "))
    };
    let (old, new) = values(changed);
    assert_eq!(new, old + 1, "{changed}");
    let again = section(&text, "changed again");
    assert_eq!(values(again), (new, new + 1), "{again}");
    assert_ne!(position(&again_at), position(&changed_at));
    assert_eq!(position(&before_at), position(&changed_at));
    // The write: the new start is where it was made, and nothing before
    // it is reached.
    assert!(
        branch_point.ends_with("(a branch point: a write made a new history here)"),
        "{branch_point}"
    );
    assert_eq!(position(&branch_point), position(&changed_at));
    let written = section(&text, "written");
    assert!(written.contains("0x1234"), "{written}");
    assert!(
        written.contains("No more reverse-execution history"),
        "{written}"
    );
    assert_eq!(position(&after_write), position(&changed_at));
    // And the history, run on from the start, is the free run's.
    let branch = detvisor(&["branch", &start, "--until", "1s", "--json"]);
    assert_eq!(branch.status.code(), Some(124), "{}", stderr(&branch));
    assert_eq!(summary(&branch)["digest"].as_str().unwrap(), free);
    let _ = std::fs::remove_dir_all(dir);
}
