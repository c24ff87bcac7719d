//! The debugger's verbs (`moments`, `events`, `properties`, `nodes`,
//! `exec`, `extract`, `processes`, `inspect`, `rewind`, `wait`): arguments
//! and printing. Everything they do is the `debugger` library's; see
//! docs/debugging.md.

use crate::{PlaceArgs, Stdin};
use anyhow::{Context, Result};
use clap::Args;
use debugger::budget::{Limits, Spent};
use debugger::inspect::{self, Command as GuestCommand};
use debugger::moment::MomentId;
use debugger::reading::{self, EventFilter};
use debugger::session::{At, Session, SessionOptions};
use debugger::source::Source;
use run::moment::When;
use serde::Serialize;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

/// What every debugger verb takes: where its runs happen and its budget.
#[derive(Args, Debug, Clone)]
pub struct DebugArgs {
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// The session's limits, a JSON object of docs/debugging.md's budget
    /// fields (those missing keep their defaults).
    #[arg(long, value_name = "FILE")]
    budget: Option<PathBuf>,
    /// Append each call's use here, a JSON line each (default:
    /// ${DETVISOR_CACHE:-~/.cache/detvisor}/debugger/usage.jsonl).
    #[arg(long, value_name = "FILE")]
    usage_log: Option<PathBuf>,
    #[command(flatten)]
    place: PlaceArgs,
}

/// `detvisor moments SOURCE`.
#[derive(Args, Debug)]
pub struct MomentsArgs {
    /// A finding's directory, a campaign's holding one finding, or a
    /// directory of snapshots.
    source: PathBuf,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor events SOURCE`.
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// A finding's directory or a moment (SOURCE[~ACTION]...@WHEN): the
    /// history whose events are listed.
    source: String,
    /// Up to this moment of the history (`@-1s`, `@failure`, `@12.5s`; a
    /// whole moment id also works). Default: its end.
    #[arg(long)]
    until: Option<String>,
    /// Only this node's records and output.
    #[arg(long)]
    node: Option<String>,
    /// Only records whose text contains this.
    #[arg(long)]
    text: Option<String>,
    /// Only this kind (event, sdk, history, output) or event name
    /// (node_paused, fault, ...).
    #[arg(long)]
    kind: Option<String>,
    /// Only this property's records (an assertion's id).
    #[arg(long)]
    property: Option<String>,
    /// Only the last N.
    #[arg(long, default_value_t = 0)]
    last: usize,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor properties SOURCE`.
#[derive(Args, Debug)]
pub struct PropertiesArgs {
    source: String,
    /// Up to this moment (as `events --until`).
    #[arg(long)]
    until: Option<String>,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor exec MOMENT -- COMMAND...`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Where: SOURCE[~ACTION]...@WHEN, e.g. nightly/findings/0001@-1s.
    moment: MomentId,
    /// Inside this node's namespaces (default: beside the nodes, in the
    /// guest).
    #[arg(long)]
    node: Option<String>,
    /// Run in a branch: the nodes and the fault schedule run on while the
    /// command runs, and the branch's end moment is printed. Default: in a
    /// throwaway fork with every node stopped (nothing changes).
    #[arg(long)]
    branch: bool,
    /// Virtual time the command may take before it is killed.
    #[arg(long, default_value = "30s")]
    timeout: VirtNanos,
    /// Bytes of stdout and of stderr kept.
    #[arg(long, default_value_t = inspect::DEFAULT_OUTPUT_LIMIT)]
    output_limit: u64,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor extract MOMENT PATH -o FILE`.
#[derive(Args, Debug)]
pub struct ExtractArgs {
    moment: MomentId,
    /// The file, as the node (or the guest) sees it.
    path: String,
    #[arg(long)]
    node: Option<String>,
    /// Where to write it (`-`: stdout).
    #[arg(short, long)]
    out: PathBuf,
    /// The most bytes read.
    #[arg(long, default_value_t = inspect::DEFAULT_EXTRACT_LIMIT)]
    limit: u64,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor processes MOMENT`.
#[derive(Args, Debug)]
pub struct ProcessesArgs {
    moment: MomentId,
    #[arg(long)]
    node: Option<String>,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor inspect MOMENT` / `detvisor rewind MOMENT`.
#[derive(Args, Debug)]
pub struct MomentArgs {
    moment: MomentId,
    #[command(flatten)]
    common: DebugArgs,
}

/// `detvisor wait MOMENT DURATION`.
#[derive(Args, Debug)]
pub struct WaitArgs {
    moment: MomentId,
    /// Virtual time to run on.
    duration: VirtNanos,
    #[command(flatten)]
    common: DebugArgs,
}

/// A session on the source of `source_dir`.
fn session(source_dir: &Path, common: &DebugArgs) -> Result<Session> {
    session_with_stdin(source_dir, common, Stdin::None)
}

fn session_with_stdin(source_dir: &Path, common: &DebugArgs, stdin: Stdin) -> Result<Session> {
    let source = Source::open(source_dir)?;
    let limits = match &common.budget {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--budget {}", path.display()))?;
            serde_json::from_str::<Limits>(&text)
                .with_context(|| format!("--budget {}", path.display()))?
        }
        None => Limits::default(),
    };
    let log = common
        .usage_log
        .clone()
        .unwrap_or_else(|| image_builder::cache_root().join("debugger/usage.jsonl"));
    let runner = common.place.runner(None, stdin);
    Ok(Session::new(
        source,
        Box::new(runner),
        SessionOptions {
            limits,
            log: Some(log),
            ..SessionOptions::default()
        },
    ))
}

/// A result with what the call spent.
#[derive(Serialize)]
struct WithSpent<'a, T: Serialize> {
    #[serde(flatten)]
    result: &'a T,
    budget: &'a Spent,
}

fn print_json<T: Serialize>(result: &T, spent: &Spent) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string(&WithSpent {
            result,
            budget: spent
        })?
    );
    Ok(())
}

/// The line every verb that stands at a moment prints for people.
fn stands_at(at: &At) {
    eprintln!(
        "detvisor: at {} (exit {}, virtual time {}), digest {}",
        at.moment, at.exits, at.virtual_ns, at.digest
    );
}

/// A history named by `text` (a directory, or a moment whose `@WHEN` is
/// ignored) and an optional `--until` (`@WHEN` on that history, or a
/// whole moment).
fn history_until(text: &str, until: Option<&str>) -> Result<MomentId> {
    let base: MomentId = match text.parse::<MomentId>() {
        Ok(moment) => moment,
        Err(_) => MomentId::of_source(text, When::Latest),
    };
    Ok(match until {
        None => base,
        Some(when) if when.starts_with('@') => base.at(When::parse_in(when, &when[1..])?),
        Some(moment) => moment
            .parse()
            .with_context(|| format!("--until {moment}"))?,
    })
}

pub fn cmd_moments(args: MomentsArgs) -> Result<u8> {
    let mut session = session(&args.source, &args.common)?;
    let (moments, spent) = session.call("moments", |s| Ok(reading::moments(s)))?;
    if args.common.json {
        print_json(&serde_json::json!({ "moments": moments }), &spent)?;
    } else {
        for m in &moments {
            println!(
                "{:>14}  {:<16} {}  {}",
                m.virtual_ns.to_string(),
                m.kind,
                m.moment,
                m.what
            );
        }
    }
    Ok(0)
}

pub fn cmd_events(args: EventsArgs) -> Result<u8> {
    let moment = history_until(&args.source, args.until.as_deref())?;
    let mut session = session(&moment.source, &args.common)?;
    let filter = EventFilter {
        node: args.node,
        text: args.text,
        kind: args.kind,
        property: args.property,
        last: args.last,
    };
    let (events, spent) = session.call("events", |s| reading::events(s, &moment, &filter))?;
    if args.common.json {
        print_json(
            &serde_json::json!({ "until": moment, "events": events }),
            &spent,
        )?;
    } else {
        for e in &events {
            let node = e.node.as_deref().unwrap_or("-");
            let name = e.name.as_deref().unwrap_or("");
            println!(
                "{:>14} exit {:>10}  {node:<10} {:<7} {name:<14} {}",
                e.virtual_ns.to_string(),
                e.exit,
                e.kind,
                e.text.trim_end()
            );
        }
    }
    session.close()?;
    Ok(0)
}

pub fn cmd_properties(args: PropertiesArgs) -> Result<u8> {
    let moment = history_until(&args.source, args.until.as_deref())?;
    let mut session = session(&moment.source, &args.common)?;
    let (rows, spent) = session.call("properties", |s| reading::properties(s, &moment))?;
    if args.common.json {
        print_json(&serde_json::json!({ "properties": rows }), &spent)?;
    } else {
        for row in &rows {
            println!(
                "{} ({}): {} passed, {} failed{}",
                row.id,
                row.kind,
                row.passed,
                row.failed,
                row.failing
                    .first()
                    .map(|e| format!("; first failure at {}", e.moment))
                    .unwrap_or_default()
            );
        }
    }
    session.close()?;
    Ok(0)
}

pub fn cmd_nodes(args: PropertiesArgs) -> Result<u8> {
    let moment = history_until(&args.source, args.until.as_deref())?;
    let mut session = session(&moment.source, &args.common)?;
    let (rows, spent) = session.call("nodes", |s| reading::nodes(s, &moment))?;
    if args.common.json {
        print_json(&serde_json::json!({ "nodes": rows }), &spent)?;
    } else {
        for row in &rows {
            println!(
                "{:<12} {}",
                row.name,
                row.last_event.as_deref().unwrap_or("-")
            );
        }
    }
    session.close()?;
    Ok(0)
}

/// The status a command's outcome gives this process: its exit code, 128
/// and the signal, or 124 when it timed out (as `timeout(1)`).
fn command_status(executed: &inspect::Executed) -> u8 {
    if executed.timed_out {
        return 124;
    }
    match (executed.status, executed.signal) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

pub fn cmd_exec(args: ExecArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let command = GuestCommand {
        node: args.node,
        command: args.command,
        timeout: args.timeout,
        output_limit: args.output_limit,
    };
    let (executed, spent) = session.call("exec", |s| {
        if args.branch {
            inspect::exec_in_branch(s, &args.moment, &command)
        } else {
            inspect::exec(s, &args.moment, &command)
        }
    })?;
    if args.common.json {
        print_json(&executed, &spent)?;
    } else {
        stands_at(&executed.at);
        print!("{}", executed.stdout);
        eprint!("{}", executed.stderr);
        if executed.timed_out {
            eprintln!(
                "detvisor: the command timed out after {} (virtual)",
                executed.took
            );
        }
        if let Some(end) = &executed.end {
            eprintln!(
                "detvisor: the branch ends at {} (digest {})",
                end.moment, end.digest
            );
        }
    }
    session.close()?;
    Ok(command_status(&executed))
}

pub fn cmd_extract(args: ExtractArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let (extracted, spent) = session.call("extract", |s| {
        inspect::extract(s, &args.moment, args.node.clone(), &args.path, args.limit)
    })?;
    if args.out == Path::new("-") {
        use std::io::Write;
        std::io::stdout().write_all(&extracted.bytes)?;
    } else {
        std::fs::write(&args.out, &extracted.bytes)
            .with_context(|| format!("writing {}", args.out.display()))?;
    }
    if args.common.json {
        print_json(&extracted, &spent)?;
    } else {
        stands_at(&extracted.at);
        eprintln!(
            "detvisor: {} bytes of {} ({} in all{})",
            extracted.bytes.len(),
            extracted.path,
            extracted.size,
            if extracted.truncated {
                ", truncated"
            } else {
                ""
            }
        );
    }
    session.close()?;
    Ok(0)
}

pub fn cmd_processes(args: ProcessesArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let (listed, spent) = session.call("processes", |s| {
        inspect::processes(s, &args.moment, args.node.clone())
    })?;
    if args.common.json {
        print_json(&listed, &spent)?;
    } else {
        stands_at(&listed.at);
        println!("{:>7} {:>7} S COMMAND", "PID", "PPID");
        for p in &listed.processes {
            println!(
                "{:>7} {:>7} {} {}",
                p.pid,
                p.ppid,
                p.state,
                p.command.join(" ")
            );
        }
    }
    session.close()?;
    Ok(0)
}

pub fn cmd_inspect(args: MomentArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let (inspected, spent) = session.call("inspect", |s| inspect::inspect(s, &args.moment))?;
    if args.common.json {
        print_json(&inspected, &spent)?;
    } else {
        stands_at(&inspected.at);
        println!("{}", serde_json::to_string_pretty(&inspected.machine)?);
    }
    session.close()?;
    Ok(0)
}

pub fn cmd_rewind(args: MomentArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let (at, spent) = session.call("rewind", |s| debugger::moving::rewind(s, &args.moment))?;
    print_at(&at, &spent, args.common.json)?;
    session.close()?;
    Ok(0)
}

pub fn cmd_wait(args: WaitArgs) -> Result<u8> {
    let mut session = session(&args.moment.source, &args.common)?;
    let (at, spent) = session.call("wait", |s| {
        debugger::moving::wait(s, &args.moment, args.duration)
    })?;
    print_at(&at, &spent, args.common.json)?;
    session.close()?;
    Ok(0)
}

fn print_at(at: &At, spent: &Spent, json: bool) -> Result<()> {
    if json {
        print_json(at, spent)
    } else {
        println!("{}", at.moment);
        stands_at(at);
        Ok(())
    }
}

/// `moment` as the debugger's, when its directory is a finding's or a
/// campaign's (whose moments the debugger reaches, not the snapshots').
pub fn finding_moment(moment: &run::moment::Moment) -> Option<MomentId> {
    let run::moment::Moment::At { .. } = moment else {
        return None;
    };
    let moment: MomentId = moment.to_string().parse().ok()?;
    is_finding_source(&moment.source).then_some(moment)
}

/// `detvisor branch` from a moment of a finding's history: re-keyed from
/// `seed` and with `faults` added there, run on to `until` when given;
/// prints the moment it ends at.
pub fn cmd_branch(
    from: MomentId,
    seed: Option<u64>,
    faults: &[run::faults::Fault],
    until: Option<VirtNanos>,
    json: bool,
    place: PlaceArgs,
) -> Result<u8> {
    let common = DebugArgs {
        json,
        budget: None,
        usage_log: None,
        place,
    };
    let mut session = session(&from.source, &common)?;
    let (at, spent) = session.call("branch", |s| {
        let start = debugger::moving::branch(s, &from, seed, faults)?;
        match until {
            Some(until) if until > start.virtual_ns => s.reach(&start.moment.at(When::Time(until))),
            _ => Ok(start),
        }
    })?;
    print_at(&at, &spent, json)?;
    session.close()?;
    Ok(0)
}

/// Whether `dir` is a finding or a campaign (whose moments the debugger
/// reaches), not a directory of snapshots.
pub fn is_finding_source(dir: &Path) -> bool {
    dir.join(fuzzer::findings::FINDING_FILE).is_file() || dir.join(fuzzer::store::DB_FILE).is_file()
}

/// `detvisor shell` at a moment of a finding's history (or a branch of it):
/// reached by the debugger, the shell in a fork of it.
pub fn cmd_shell(moment: MomentId, terminal: run::shell::Terminal, place: PlaceArgs) -> Result<u8> {
    let common = DebugArgs {
        json: false,
        budget: None,
        usage_log: None,
        place,
    };
    let mut session = session_with_stdin(&moment.source, &common, Stdin::UntilEot)?;
    let ((at, status), _) = session.call("shell", |s| inspect::shell(s, &moment, &terminal))?;
    stands_at(&at);
    session.close()?;
    Ok(status)
}
