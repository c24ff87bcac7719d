//! The `bench snapshot` report: one row per (cell, store), the definitions of what is
//! measured, the tables and the final JSON line.

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

use super::machine::HostLoad;
use super::report::{Session, Where};
use super::snapshot_cell::CellResult;
use super::snapshot_restore::ChildRestore;
use super::stats::{fmt_ms, fmt_stat, opt_ms, opt_rate1, opt_ratio, ratio, stat, Stat};

/// One row of the report per (cell, store).
#[derive(Serialize, Debug, Default)]
pub struct SnapRow {
    mem: String,
    dirty_pct: f64,
    store: String,
    fs: String,
    snapshot_ms: Stat,
    capture_ms: Stat,
    write_ms: Stat,
    full_copy_ms: Stat,
    snapshot_over_full_copy: Option<f64>,
    memcpy_ms: Stat,
    snapshot_over_memcpy: Option<f64>,
    zero_scan_ms: Stat,
    stored_pages: u64,
    disk_bytes: u64,
    state_bytes: u64,
    restore_ms: Stat,
    restore_read_ms: Stat,
    restore_map_ms: Stat,
    restore_resume_ms: Stat,
    restore_first_exit_ms: Stat,
    restore_teardown_ms: Stat,
    /// The first restore in the cell process (cold code), to the first exit.
    restore_cold_ms: Option<f64>,
    /// 9p only: restores that map memory.img over 9p without staging.
    direct_restore_ms: Stat,
    direct_map_ms: Stat,
    direct_first_exit_ms: Stat,
    direct_teardown_ms: Stat,
    /// Restore to first exit over the snapshot latency.
    restore_over_snapshot: Option<f64>,
    child_first_exit_ms: Stat,
    child_wall_ms: Stat,
    /// 1000 / median child wall: sequential child processes per second.
    child_forks_per_sec: Option<f64>,
    pub error: Option<String>,
}

pub fn snap_rows(cells: &[CellResult]) -> Vec<SnapRow> {
    let mut rows = Vec::new();
    for c in cells {
        for l in &c.locations {
            let snapshot_ms = stat(l.snapshot_ms.iter().copied());
            let full_copy_ms = stat(l.full_copy_ms.iter().copied());
            let memcpy_ms = stat(c.memcpy_ms.iter().copied());
            let restore_ms = stat(l.restores.iter().map(|r| r.total_ms));
            let ok_children: Vec<&ChildRestore> =
                l.child_restores.iter().filter(|c| c.ok).collect();
            let child_wall_ms = stat(ok_children.iter().map(|c| c.wall_ms));
            rows.push(SnapRow {
                mem: c.mem.clone(),
                dirty_pct: c.dirty_pct,
                store: l.name.clone(),
                fs: l.fs.clone(),
                snapshot_over_full_copy: ratio(snapshot_ms.median, full_copy_ms.median),
                snapshot_over_memcpy: ratio(snapshot_ms.median, memcpy_ms.median),
                restore_over_snapshot: ratio(restore_ms.median, snapshot_ms.median),
                snapshot_ms,
                capture_ms: stat(l.capture_ms.iter().copied()),
                write_ms: stat(l.write_ms.iter().copied()),
                full_copy_ms,
                memcpy_ms,
                zero_scan_ms: stat(c.zero_scan_ms.iter().copied()),
                stored_pages: l.stored_pages,
                disk_bytes: l.disk_bytes,
                state_bytes: l.state_bytes,
                restore_ms,
                restore_read_ms: stat(l.restores.iter().map(|r| r.read_ms)),
                restore_map_ms: stat(l.restores.iter().map(|r| r.map_ms)),
                restore_resume_ms: stat(l.restores.iter().map(|r| r.resume_ms)),
                restore_first_exit_ms: stat(l.restores.iter().map(|r| r.first_exit_ms)),
                restore_teardown_ms: stat(l.restores.iter().filter_map(|r| r.teardown_ms)),
                restore_cold_ms: l.cold_restore.as_ref().map(|r| r.total_ms),
                direct_restore_ms: stat(l.direct_restores.iter().map(|r| r.total_ms)),
                direct_map_ms: stat(l.direct_restores.iter().map(|r| r.map_ms)),
                direct_first_exit_ms: stat(l.direct_restores.iter().map(|r| r.first_exit_ms)),
                direct_teardown_ms: stat(l.direct_restores.iter().filter_map(|r| r.teardown_ms)),
                child_first_exit_ms: stat(ok_children.iter().filter_map(|c| c.to_first_exit_ms)),
                child_forks_per_sec: child_wall_ms
                    .median
                    .filter(|m| *m > 0.0)
                    .map(|m| 1000.0 / m),
                child_wall_ms,
                error: l.error.clone().or_else(|| l.full_copy_error.clone()),
            });
        }
    }
    rows
}

#[derive(Serialize)]
pub struct SnapBenchReport {
    pub benchmark: &'static str,
    pub runs: u32,
    pub mem: Vec<String>,
    pub dirty_pct: Vec<f64>,
    pub forks: u32,
    pub resets: u32,
    pub burst_pages: u64,
    pub guest_command: String,
    pub cmdline: String,
    #[serde(flatten)]
    pub place: Where,
    pub clock: &'static str,
    pub definitions: BTreeMap<&'static str, &'static str>,
    pub anchors: [&'static str; 4],
    pub stores: Vec<(String, String)>,
    pub l1_mem_total_kib: Option<u64>,
    pub rows: Vec<SnapRow>,
    pub cells: Vec<CellResult>,
    pub helper_vm: Option<Session>,
    pub error: Option<String>,
    /// The host's load averages before and after, and its CPU count.
    #[serde(flatten)]
    pub host: HostLoad,
    pub all_ok: bool,
}

pub const SNAP_ANCHORS: [&str; 4] = [
    "Firecracker restores a snapshot from disk in under 8 ms (2 vCPU, 512 MiB guest)",
    "detvisor's goal: an in-memory fork in under 1 ms at 1 GiB RAM / 1% dirty, on hardware KVM",
    "kAFL: up to 17,000 executions/s",
    "detvisor's goal: 20,000 resets/s at 100 dirty pages, on hardware KVM",
];

pub fn snap_definitions() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        (
            "snapshot",
            "after one untimed warm-up snapshot and full copy per store: Session::capture (vCPU, \
             devices, clock, records) + snapshot::write_snapshot into a new directory of the \
             store: scan of all RAM for non-zero pages, pwrite of those pages into a sparse \
             memory.img, CRC-64 over them, memory.idx and state.bin, fsync of each file and the \
             directory, rename, fsync of the root",
        ),
        (
            "full_copy",
            "baseline: all of guest RAM (every byte of the mapping, zero pages included) written \
             to one new file in the same store with 8 MiB sequential write(2)s, then fsync; the \
             file is removed afterwards, untimed",
        ),
        (
            "memcpy",
            "baseline: all of guest RAM copied into a pre-faulted buffer of the same size in the \
             same process (no file system)",
        ),
        (
            "zero_scan",
            "the zero-page scan of all RAM alone (write_snapshot's first step, same algorithm)",
        ),
        (
            "restore",
            "from the call to snapshot::read_snapshot to the first guest exit after resume \
             handled, in one process, as snapshots::restore does it: read_snapshot, memory_file, \
             memory_chain, (9p: copy the stored pages into a memfd), memory_from_file \
             (MAP_PRIVATE, pages fault in lazily), Session::resume (new KVM VM), \
             run_until(+1 exit)",
        ),
        (
            "child",
            "a restore as a caller of the run library makes one (branch, a seeds worker): a \
             fresh thread with a Controller of its own, Request::Restore of DIR, RunUntil one \
             more exit, Close; from just before the thread starts to the first exit handled, and \
             until the thread ends (Close: VM teardown)",
        ),
        (
            "forks_per_sec",
            "in-process: N sequential (restore to the first exit + teardown) in one process, N / \
             total time; child: 1000 / median child wall (sequential child restores)",
        ),
        (
            "resets_per_sec",
            "in-process loop from the first store: restore (full Session::resume: new KVM VM \
             over a fresh MAP_PRIVATE mapping) + a burst of K exits + teardown; K is the fewest \
             exits after resume whose copy-on-write pages (/proc/self/pagemap) reach \
             --burst-pages; each reset is a full restore (the baseline for \"in place\")",
        ),
        (
            "in_place",
            "the same loop with Session::reset_to: one restore and Session::checkpoint (copy \
             of the pages written since the restore only), then per iteration the burst and an \
             in-place reset (of the pages KVM's dirty log and the VMM's bitmap saw written, \
             those the checkpoint keeps are copied back; the others are returned to the \
             snapshot file's page with MADV_DONTNEED and kept from then on; vCPU, devices, \
             clock, records restored; no new VM); in place/s = resets / total time; reset, \
             copied/fetched = medians; \
             ratio = in place/s over resets/s; identical = two more bursts after resets end \
             with the same run digest",
        ),
        (
            "memory_revert",
            "host-side memory part of an in-place reset, no KVM: write one byte to each of \
             --burst-pages stored pages of a MAP_PRIVATE mapping of memory.img (copy-on-write \
             faults), then madvise(MADV_DONTNEED) each of them",
        ),
        (
            "pages",
            "written: pages of non-zero data the guest command wrote; resident: guest RAM pages \
             the host backed at the snapshot (mincore; touched since boot, THP may round up); \
             stored: pages in memory.idx (the non-zero pages); disk: st_blocks of the snapshot's \
             files",
        ),
    ])
}

pub fn print_snap_report(r: &SnapBenchReport) -> Result<()> {
    let mut o = io::stdout().lock();
    writeln!(
        o,
        "detvisor bench snapshot: default guest, RAM {}, dirty {}% of RAM; {} run(s) per \
         measurement",
        r.mem.join(", "),
        r.dirty_pct
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("%, "),
        r.runs
    )?;
    writeln!(
        o,
        "guests run in the {}{}",
        r.place.placement,
        r.place
            .placement_reason
            .as_deref()
            .map(|w| format!(" (QEMU TCG + nested SVM, because {w})"))
            .unwrap_or_default()
    )?;
    writeln!(
        o,
        "guest command (snapshot taken at the exit where its marker line appears): sh -c '{}'",
        r.guest_command
    )?;
    for (name, dir) in &r.stores {
        writeln!(o, "store {name}: {dir}")?;
    }
    if let Some(kib) = r.l1_mem_total_kib {
        writeln!(
            o,
            "memory of the machine running the guests: {} MiB",
            kib >> 10
        )?;
    }
    writeln!(o, "{}", r.host.line())?;
    writeln!(
        o,
        "times in ms on {}; median [min..max] over the runs",
        if r.place.in_helper_vm() {
            "L1's monotonic clock"
        } else {
            "the host's monotonic clock"
        }
    )?;

    writeln!(
        o,
        "\n1. snapshot latency = capture + write_snapshot (to disk, fsynced), against full-copy \
         baselines"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:<9} {:>9} {:>18} {:>18} {:>8} {:>9} {:>8} {:>9}",
        "RAM",
        "dirty",
        "store",
        "capture",
        "snapshot",
        "full copy (file)",
        "ratio",
        "memcpy",
        "ratio",
        "zero scan"
    )?;
    for row in &r.rows {
        writeln!(
            o,
            "{:<6} {:>5}% {:<9} {:>9} {:>18} {:>18} {:>8} {:>9} {:>8} {:>9}",
            row.mem,
            row.dirty_pct,
            row.store,
            fmt_ms(row.capture_ms.median),
            fmt_stat(&row.snapshot_ms),
            fmt_stat(&row.full_copy_ms),
            opt_ratio(row.snapshot_over_full_copy),
            fmt_ms(row.memcpy_ms.median),
            opt_ratio(row.snapshot_over_memcpy),
            fmt_ms(row.zero_scan_ms.median),
        )?;
    }
    writeln!(
        o,
        "  snapshot: {}\n  full copy: {}\n  memcpy: {}\n  zero scan: {}\n  ratio = snapshot / \
         baseline (below 1: the snapshot is faster)",
        snap_definitions()["snapshot"],
        snap_definitions()["full_copy"],
        snap_definitions()["memcpy"],
        snap_definitions()["zero_scan"]
    )?;

    writeln!(
        o,
        "\nmemory per snapshot against dirty pages (first snapshot of each cell)"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10} {:>9} {:>10}",
        "RAM",
        "dirty",
        "RAM pg",
        "written",
        "resident",
        "stored",
        "stored%",
        "stored/wr",
        "disk MiB",
        "state KiB",
        "store"
    )?;
    for c in &r.cells {
        for l in &c.locations {
            writeln!(
                o,
                "{:<6} {:>5}% {:>9} {:>9} {:>9} {:>9} {:>7.2}% {:>10} {:>10.1} {:>9.1} {:>10}",
                c.mem,
                c.dirty_pct,
                c.pages.ram,
                c.pages.written,
                c.pages.resident,
                l.stored_pages,
                if c.pages.ram > 0 {
                    100.0 * l.stored_pages as f64 / c.pages.ram as f64
                } else {
                    0.0
                },
                if c.pages.written > 0 {
                    format!("{:.2}x", l.stored_pages as f64 / c.pages.written as f64)
                } else {
                    "-".into()
                },
                l.disk_bytes as f64 / (1 << 20) as f64,
                l.state_bytes as f64 / 1024.0,
                l.name
            )?;
        }
    }
    writeln!(o, "  {}", snap_definitions()["pages"])?;

    writeln!(
        o,
        "\n2. restore latency = read_snapshot .. first guest exit after resume handled"
    )?;
    let line = |o: &mut io::StdoutLock, c: [&str; 15]| {
        writeln!(
            o,
            "{:<6} {:>6} {:<9} {:>6} {:>6} {:>6} {:>6} {:>15} {:>6} {:>8} {:>15} {:>15} {:>7} \
             {:>9} {:>8}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8],
            c[9],
            c[10],
            c[11],
            c[12],
            c[13],
            c[14]
        )
    };
    line(
        &mut o,
        [
            "RAM",
            "dirty",
            "store",
            "read",
            "map",
            "resume",
            "1st ex",
            "warm total",
            "cold",
            "teardown",
            "child->1st ex",
            "child wall",
            "",
            "forks/s",
            "child f/s",
        ],
    )?;
    for row in &r.rows {
        let forks = r
            .cells
            .iter()
            .find(|c| c.mem == row.mem && c.dirty_pct == row.dirty_pct)
            .and_then(|c| c.forks.as_ref())
            .filter(|f| f.store == row.store);
        let dirty = format!("{}%", row.dirty_pct);
        line(
            &mut o,
            [
                &row.mem,
                &dirty,
                &row.store,
                &fmt_ms(row.restore_read_ms.median),
                &fmt_ms(row.restore_map_ms.median),
                &fmt_ms(row.restore_resume_ms.median),
                &fmt_ms(row.restore_first_exit_ms.median),
                &fmt_stat(&row.restore_ms),
                &fmt_ms(row.restore_cold_ms),
                &fmt_ms(row.restore_teardown_ms.median),
                &fmt_stat(&row.child_first_exit_ms),
                &fmt_stat(&row.child_wall_ms),
                "",
                &forks.map_or("-".into(), |f| format!("{:.1}", f.per_sec)),
                &opt_rate1(row.child_forks_per_sec),
            ],
        )?;
        if row.direct_restore_ms.n > 0 {
            line(
                &mut o,
                [
                    "",
                    "",
                    " (direct)",
                    "",
                    &fmt_ms(row.direct_map_ms.median),
                    "",
                    &fmt_ms(row.direct_first_exit_ms.median),
                    &fmt_stat(&row.direct_restore_ms),
                    "",
                    &fmt_ms(row.direct_teardown_ms.median),
                    "",
                    "",
                    "",
                    "",
                    "",
                ],
            )?;
        }
    }
    writeln!(
        o,
        "  restore: {}\n  warm total: median [min..max] of the timed restores, which follow one \
         untimed restore in the same process; cold: that first restore (code not yet run in the \
         process)\n  map: on 9p it includes staging (copying the stored pages into a memfd); \
         \"(direct)\": restores that map memory.img over 9p without staging, page faults going \
         to 9p\n  child: {}\n  forks/s: {}",
        snap_definitions()["restore"],
        snap_definitions()["child"],
        snap_definitions()["forks_per_sec"]
    )?;

    writeln!(
        o,
        "\n3. resets (fuzzing-like loop: restore the same snapshot, run a short burst, repeat)"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:<9} {:>7} {:>11} {:>9} {:>9} {:>8} {:>9} {:>24}   {:>10} {:>8} {:>14} {:>7} {:>9}",
        "RAM",
        "dirty",
        "store",
        "burst",
        "dirty pages",
        "resets/s",
        "restore",
        "burst",
        "teardown",
        "memory-only revert",
        "in place/s",
        "reset",
        "copied/fetched",
        "ratio",
        "identical"
    )?;
    for c in &r.cells {
        let Some(s) = &c.resets else { continue };
        let revert = c.memory_revert.as_ref().map_or("-".into(), |m| {
            format!(
                "{:.0} us = {:.0}/s ({} pg)",
                m.per_reset_us, m.per_sec, m.pages
            )
        });
        let (in_place, reset, copied, ratio, identical) = match &s.in_place {
            Some(p) => (
                format!("{:.1}", p.per_sec),
                fmt_ms(Some(p.reset_ms)),
                format!("{:.0}/{:.0}", p.pages_copied, p.pages_fetched),
                format!("{:.1}x", p.per_sec / s.per_sec.max(1e-9)),
                if p.identical { "yes" } else { "NO" }.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
        };
        writeln!(
            o,
            "{:<6} {:>5}% {:<9} {:>7} {:>11} {:>9.1} {:>9} {:>8} {:>9} {:>24}   {:>10} {:>8} {:>14} {:>7} {:>9}",
            c.mem,
            c.dirty_pct,
            s.store,
            format!("{} ex", s.burst_exits),
            match s.dirty_pages_check {
                Some(check) if check != s.dirty_pages => format!("{}/{check}", s.dirty_pages),
                _ => s.dirty_pages.to_string(),
            },
            s.per_sec,
            fmt_ms(Some(s.restore_ms)),
            fmt_ms(Some(s.burst_ms)),
            fmt_ms(Some(s.teardown_ms)),
            revert,
            in_place,
            reset,
            copied,
            ratio,
            identical
        )?;
    }
    writeln!(
        o,
        "  resets/s: {}\n  memory-only revert: {}\n  in place: {}",
        snap_definitions()["resets_per_sec"],
        snap_definitions()["memory_revert"],
        snap_definitions()["in_place"]
    )?;

    writeln!(
        o,
        "\nanchors, for context only (not claims about these numbers):"
    )?;
    for a in &r.anchors {
        writeln!(o, "  - {a}")?;
    }
    if r.place.in_helper_vm() {
        writeln!(
            o,
            "  everything above ran under nested virtualization on an emulated CPU (QEMU TCG), \
             orders of magnitude slower than hardware KVM: compare ratios against the in-run \
             baselines, not absolute numbers against the anchors"
        )?;
    }
    if let Some(s) = r.helper_vm.as_ref().filter(|s| s.boot_ms.is_some()) {
        writeln!(
            o,
            "\nhelper VM: start to payload serving {} ms, worker's reply to exit {} ms; \
             payload lasted {} ms on the host's clock, {} ms on L1's",
            opt_ms(s.boot_ms),
            opt_ms(s.shutdown_ms),
            opt_ms(s.payload_host_ms),
            opt_ms(s.payload_l1_ms)
        )?;
    }
    let mut failures = Vec::new();
    for c in &r.cells {
        let name = format!("{}/{}%", c.mem, c.dirty_pct);
        if let Some(e) = &c.error {
            failures.push(format!("{name}: {e}"));
        }
        for w in &c.warnings {
            failures.push(format!("{name} (warning): {w}"));
        }
        for l in &c.locations {
            if let Some(e) = l.error.as_ref().or(l.full_copy_error.as_ref()) {
                failures.push(format!("{name} {}: {e}", l.name));
            }
            for (i, ch) in l.child_restores.iter().enumerate() {
                if let Some(e) = &ch.error {
                    failures.push(format!("{name} {} child restore {}: {e}", l.name, i + 1));
                }
            }
        }
        if let Some(s) = &c.resets {
            if !s.reached_target {
                failures.push(format!(
                    "{name} (warning): the burst dirtied only {} pages within {} exits",
                    s.dirty_pages, s.burst_exits
                ));
            }
        }
        if let Some(p) = c.resets.as_ref().and_then(|s| s.in_place.as_ref()) {
            if !p.identical {
                failures.push(format!(
                    "{name}: bursts after in-place resets ended in different states"
                ));
            }
        }
        if let Some(m) = &c.memory_revert {
            if !m.content_restored {
                failures.push(format!(
                    "{name}: memory revert did not restore the page contents"
                ));
            }
        }
    }
    if let Some(e) = &r.error {
        failures.push(format!("helper VM: {e}"));
    }
    if !failures.is_empty() {
        writeln!(o, "\nfailures and warnings:")?;
        for f in failures {
            writeln!(o, "  {f}")?;
        }
    }
    writeln!(o)?;
    writeln!(o, "{}", serde_json::to_string(r)?)?;
    o.flush()?;
    Ok(())
}
