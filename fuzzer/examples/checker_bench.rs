//! Times the linearizability checker on realistic histories: a simulated
//! linearizable key-value store with concurrent clients (overlapping
//! operations, some without a return), and one history made
//! non-linearizable by a stale read, to time the violation path including
//! minimization.
//!
//! `cargo run --release -p fuzzer --example checker_bench`

use std::time::{Duration, Instant};

use fuzzer::linearizability::{check_kv, History, KvInput, KvOutput, Operation, TimeNs, Verdict};

/// splitmix64: a small deterministic generator, enough for a benchmark.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Workload {
    operations: usize,
    keys: usize,
    clients: u64,
    /// Percentage of operations that never return.
    unreturned_percent: u64,
    seed: u64,
}

/// Simulates a linearizable store: each operation takes effect at a random
/// instant of its interval (or, without a return, possibly never); outputs
/// come from applying them in that order.
fn simulate(workload: &Workload) -> History {
    let mut rng = Rng(workload.seed);
    let mut next_call: Vec<u64> = (0..workload.clients).map(|_| rng.below(1_000)).collect();
    let mut op_ids = vec![0u64; next_call.len()];
    let mut last_put: Vec<Option<String>> = vec![None; workload.keys];
    let mut ops = Vec::with_capacity(workload.operations);
    let mut effects: Vec<(u64, usize)> = Vec::new();
    let mut counter = 0u64;
    for index in 0..workload.operations {
        let client = (0..next_call.len())
            .min_by_key(|&c| next_call[c])
            .unwrap_or(0);
        let call = next_call[client];
        let duration = if rng.chance(5) {
            20_000 + rng.below(50_000)
        } else {
            200 + rng.below(3_000)
        };
        let key = rng.below(workload.keys as u64) as usize;
        let input = match rng.below(10) {
            0..=3 => KvInput::Get,
            4..=6 => {
                counter += 1;
                let value = format!("v{counter}");
                last_put[key] = Some(value.clone());
                KvInput::Put { value }
            }
            7 => KvInput::Delete,
            _ => {
                counter += 1;
                let from = match &last_put[key] {
                    Some(value) if rng.chance(70) => value.clone(),
                    _ => format!("v{}", rng.below(counter.max(1))),
                };
                let to = format!("v{counter}");
                last_put[key] = Some(to.clone());
                KvInput::Cas { from, to }
            }
        };
        let returned = !rng.chance(workload.unreturned_percent);
        if returned || rng.chance(50) {
            effects.push((call + rng.below(duration + 1), index));
        }
        ops.push(Operation {
            process: client as u64,
            op: op_ids[client],
            key: format!("k{key}"),
            input,
            output: None,
            call: TimeNs(call),
            ret: returned.then_some(TimeNs(call + duration)),
        });
        op_ids[client] += 1;
        next_call[client] = call + duration + rng.below(500);
    }
    effects.sort_unstable();
    let mut store: Vec<Option<String>> = vec![None; workload.keys];
    for (_, index) in effects {
        let op = &mut ops[index];
        let key: usize = op.key[1..].parse().unwrap_or(0);
        let register = &mut store[key];
        let output = match &op.input {
            KvInput::Get => KvOutput::Get {
                value: register.clone(),
            },
            KvInput::Put { value } => {
                *register = Some(value.clone());
                KvOutput::Put
            }
            KvInput::Delete => {
                *register = None;
                KvOutput::Delete
            }
            KvInput::Cas { from, to } => {
                let swapped = register.as_deref() == Some(from.as_str());
                if swapped {
                    *register = Some(to.clone());
                }
                KvOutput::Cas { swapped }
            }
        };
        if op.ret.is_some() {
            op.output = Some(output);
        }
    }
    History {
        operations: ops,
        failed: 0,
    }
}

/// Makes a read in the middle return a value its key held long before.
fn add_stale_read(history: &mut History) {
    let middle = history.operations.len() / 2;
    let mut written: Vec<(String, String)> = Vec::new();
    for op in &history.operations[..middle] {
        if let KvInput::Put { value } = &op.input {
            written.push((op.key.clone(), value.clone()));
        }
    }
    for op in &mut history.operations[middle..] {
        if op.input == KvInput::Get && op.output.is_some() {
            let stale = written
                .iter()
                .find(|(key, _)| *key == op.key)
                .map(|(_, value)| value.clone());
            if let Some(stale) = stale {
                op.output = Some(KvOutput::Get { value: Some(stale) });
                return;
            }
        }
    }
}

fn run(name: &str, history: &History) {
    let keys = history
        .operations
        .iter()
        .map(|op| op.key.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let unreturned = history
        .operations
        .iter()
        .filter(|op| op.ret.is_none())
        .count();
    let start = Instant::now();
    let report = check_kv(history, Some(Duration::from_secs(30)));
    let elapsed = start.elapsed();
    let verdict = match &report.verdict {
        Verdict::Ok => "ok".to_owned(),
        Verdict::Illegal(violation) => format!(
            "illegal at {} ({} of {} ops kept, minimal: {})",
            violation.key,
            violation.operations.len(),
            violation.partition_operations,
            violation.minimal
        ),
        Verdict::Unknown { reason, key } => format!("unknown ({reason:?} at {key})"),
    };
    println!(
        "{name:<34} ops {:>6} (no return {:>4}) keys {keys:>3}: {verdict}; total {:>9.3} ms \
         (search {:.3} ms, {} steps, {} cache entries; minimize {:.3} ms, {} checks)",
        history.operations.len(),
        unreturned,
        elapsed.as_secs_f64() * 1e3,
        report.stats.search_us as f64 / 1e3,
        report.stats.search_steps,
        report.stats.cache_entries,
        report.stats.minimization_us as f64 / 1e3,
        report.stats.minimization_checks,
    );
}

fn main() {
    let only: Option<usize> = std::env::args().nth(1).and_then(|arg| arg.parse().ok());
    let cases = [
        (
            "10k ops, 1 key, 16 clients, none lost",
            Workload {
                operations: 10_000,
                keys: 1,
                clients: 16,
                unreturned_percent: 0,
                seed: 4,
            },
        ),
        (
            "10k ops, 1 key, 8 clients, none lost",
            Workload {
                operations: 10_000,
                keys: 1,
                clients: 8,
                unreturned_percent: 0,
                seed: 3,
            },
        ),
        (
            "1k ops, 10 keys, 8 clients",
            Workload {
                operations: 1_000,
                keys: 10,
                clients: 8,
                unreturned_percent: 1,
                seed: 1,
            },
        ),
        (
            "10k ops, 10 keys, 8 clients",
            Workload {
                operations: 10_000,
                keys: 10,
                clients: 8,
                unreturned_percent: 1,
                seed: 2,
            },
        ),
        (
            "10k ops, 1 key, 8 clients",
            Workload {
                operations: 10_000,
                keys: 1,
                clients: 8,
                unreturned_percent: 1,
                seed: 3,
            },
        ),
        (
            "10k ops, 1 key, 16 clients, 3% lost",
            Workload {
                operations: 10_000,
                keys: 1,
                clients: 16,
                unreturned_percent: 3,
                seed: 4,
            },
        ),
    ];
    for (index, (name, workload)) in cases.iter().enumerate() {
        if only.is_none_or(|only| only == index) {
            run(name, &simulate(workload));
        }
    }
    if only.is_some() {
        return;
    }
    let mut history = simulate(&Workload {
        operations: 10_000,
        keys: 10,
        clients: 8,
        unreturned_percent: 1,
        seed: 5,
    });
    add_stale_read(&mut history);
    run("10k ops, 10 keys, one stale read", &history);
    let mut history = simulate(&Workload {
        operations: 10_000,
        keys: 1,
        clients: 8,
        unreturned_percent: 1,
        seed: 6,
    });
    add_stale_read(&mut history);
    run("10k ops, 1 key, one stale read", &history);
}
