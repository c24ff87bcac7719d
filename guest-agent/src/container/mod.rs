//! Starting processes: plain children (the workload in the root namespaces),
//! new containers (a node's PID 1) and processes entering a running node.
//!
//! # How a node's container is made
//! The agent keeps one network namespace per node (created with `unshare`,
//! held by a descriptor: see `agent::nodes`), so the NIC and its address
//! survive restarts. Every start of the node's command is a raw
//! `clone(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC)`; the
//! child (PID 1 of the new PID namespace) then, before `execve`:
//! 1. resets signal dispositions and the signal mask, starts a new session,
//!    asks for SIGKILL if the agent dies (`PR_SET_PDEATHSIG`), puts stdin on
//!    /dev/null and stdout/stderr on two pipes the agent reads;
//! 2. joins the node's network namespace and its time namespace (`setns`;
//!    the time namespace, the node's own realtime clock, is also kept
//!    across restarts: see `clock.rs`);
//! 3. makes the whole mount tree private (so nothing propagates back to the
//!    agent's namespace), bind-mounts the node's root directory onto itself
//!    and mounts, under it: the node's data disk (ext4, if it has one: in
//!    this namespace only, so the file system lives exactly as long as the
//!    node's processes, see `disk.rs`), `proc` (of the new PID namespace), `sysfs` (of
//!    the node's network namespace, read-only), a tmpfs `/dev` with bind
//!    mounts of null, zero, full, random, urandom and tty from the agent's
//!    /dev, a private `devpts` instance on /dev/pts (with /dev/ptmx), tmpfs
//!    /dev/shm, the /dev/fd and /dev/std* links, and fresh tmpfs on /tmp
//!    and /run (so a restart sees an empty /tmp, like a reboot; the rest of
//!    the root directory persists);
//! 4. **switches root with `MS_MOVE` + `chroot`, not `pivot_root`**: in the
//!    guest the agent's root is the initramfs (rootfs), on which
//!    `pivot_root` fails with EINVAL. It moves the bind mount onto `/` and
//!    chroots into it (what `runc --no-pivot` does). The old root stays in
//!    the namespace's mount table, covered and unreachable by path;
//!    isolation from a root process that tries hard to escape a chroot is
//!    not a goal (the nodes are the system under test, not adversaries);
//! 5. sets the hostname (new UTS namespace) and execs the command, looking
//!    `argv[0]` up in the node's `PATH` like `execvp`.
//!
//! Everything the child needs (C strings, pointer arrays) is built before
//! `clone`, so the child only makes system calls: no allocation, no locks.
//! A failing step writes `(step, errno)` to a close-on-exec pipe and exits
//! 127; the parent reads that pipe until EOF (exec succeeded) or the error.

mod command;
mod plan;
mod spawn;

pub use command::Command;
pub use plan::{NodePlan, SdkMounts};
pub use spawn::{spawn, spawn_then, NodeNamespaces, Setup};
