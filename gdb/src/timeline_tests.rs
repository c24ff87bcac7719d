//! The timeline's moves against a fake machine: positions, checkpoints and
//! replays are its logic; tests/gdb.rs runs it on a real guest with gdb.

use super::*;
use run::api::{Request, Response};
use std::collections::BTreeMap;

const BASE: u64 = 0xffff_ffff_8100_0000;

/// A machine whose interval after exit `n` has `5 + n % 3` steps before
/// its next exit, and whose RIP names its position.
#[derive(Default)]
struct Fake {
    at: InsnPosition,
    checkpoints: BTreeMap<u64, InsnPosition>,
    next: u64,
    /// Requests seen, by kind.
    resets: u64,
}

fn interval(exit: u64) -> u64 {
    5 + exit % 3
}

fn rip(at: InsnPosition) -> u64 {
    BASE + at.exit * 100 + at.steps
}

impl Fake {
    fn position(&self) -> Position {
        Position {
            exits: self.at.exit,
            virtual_ns: vmm::VirtNanos(self.at.exit * 1000),
            insn_steps: self.at.steps,
            stop: None,
        }
    }

    /// One instruction: `true` when it made the interval's exit.
    fn step(&mut self) -> bool {
        if self.at.steps < interval(self.at.exit) {
            self.at.steps += 1;
            false
        } else {
            self.at = InsnPosition {
                exit: self.at.exit + 1,
                steps: 0,
            };
            true
        }
    }
}

impl Runner for Fake {
    fn call(&mut self, request: Request) -> run::api::Reply {
        let run = RunId(1);
        Ok(match request {
            Request::Restore { .. } => {
                self.at = InsnPosition { exit: 10, steps: 0 };
                Response::Started {
                    run,
                    position: self.position(),
                }
            }
            Request::Checkpoint { .. } => {
                self.next += 1;
                self.checkpoints.insert(self.next, self.at);
                Response::Checkpoint {
                    checkpoint: CheckpointId(self.next),
                    position: self.position(),
                }
            }
            Request::Reset { checkpoint, .. } => {
                self.resets += 1;
                self.at = self.checkpoints[&checkpoint.0];
                Response::Position(self.position())
            }
            Request::DropCheckpoint { checkpoint, .. } => {
                self.checkpoints.remove(&checkpoint.0);
                Response::CheckpointMemory(vmm::vm::CheckpointMemory {
                    checkpoints: self.checkpoints.len() as u64,
                    nodes: 0,
                    pages: 0,
                    bytes: 0,
                    budget: None,
                })
            }
            Request::RunUntil {
                until: Until::Exit(n),
                ..
            } => {
                while self.at.exit < n {
                    self.step();
                }
                Response::Position(self.position())
            }
            Request::StepInsns {
                count,
                within_interval,
                ..
            } => {
                let (mut stepped, mut exits) = (0, 0);
                while stepped < count {
                    if self.step() {
                        exits += 1;
                        if within_interval {
                            break;
                        }
                    }
                    stepped += 1;
                }
                Response::Stepped {
                    position: self.position(),
                    stepped,
                    exits,
                }
            }
            Request::StepTo { address, max, .. } => {
                let mut reached = rip(self.at) == address;
                let mut stepped = 0;
                while !reached && stepped < max && !self.step() {
                    stepped += 1;
                    reached = rip(self.at) == address;
                }
                Response::SteppedTo {
                    position: self.position(),
                    reached,
                }
            }
            Request::RunToBreakpoint {
                breakpoints, until, ..
            } => {
                let start = self.at.exit;
                loop {
                    let done = match until {
                        Until::Exit(n) => self.at.exit >= n,
                        Until::Steps(s) => self.at.exit >= start + s,
                        _ => false,
                    };
                    if done {
                        break Response::Breakpoint {
                            position: self.position(),
                            ran: BreakpointRun::Ended { stop: None },
                        };
                    }
                    self.step();
                    if breakpoints.contains(&rip(self.at)) {
                        // As the VMM does: the step within the interval is
                        // not known to the caller.
                        let mut position = self.position();
                        position.insn_steps = 0;
                        break Response::Breakpoint {
                            position,
                            ran: BreakpointRun::Hit {
                                address: rip(self.at),
                            },
                        };
                    }
                }
            }
            Request::Close { .. } => Response::Closed,
            other => return Err(format!("the fake has no answer to {other:?}")),
        })
    }
}

fn open() -> Timeline {
    let moment: Moment = "/fake@exit:10".parse().unwrap();
    Timeline::open(Box::new(Fake::default()), moment).unwrap()
}

fn here(timeline: &Timeline) -> InsnPosition {
    insn_position(&timeline.position())
}

fn at(exit: u64, steps: u64) -> InsnPosition {
    InsnPosition { exit, steps }
}

#[test]
fn test_reverse_steps_cross_back_into_the_interval_before_and_stop_at_the_start() {
    let mut timeline = open();
    timeline.goto(at(12, 2)).unwrap();
    assert_eq!(timeline.reverse_step().unwrap(), Stop::Step);
    assert_eq!(here(&timeline), at(12, 1));
    timeline.reverse_step().unwrap();
    timeline.reverse_step().unwrap();
    // Exit 11's interval has 5 + 11 % 3 = 7 steps: its last position.
    assert_eq!(here(&timeline), at(11, 7));
    timeline.goto(at(10, 1)).unwrap();
    assert_eq!(timeline.reverse_step().unwrap(), Stop::Step);
    assert_eq!(timeline.reverse_step().unwrap(), Stop::Start);
    assert_eq!(here(&timeline), at(10, 0));
}

#[test]
fn test_continue_locates_each_hit_and_reverse_continue_finds_the_one_before() {
    let mut timeline = open();
    // One address a position of exit 11's interval, one of exit 13's.
    let (first, second) = (rip(at(11, 3)), rip(at(13, 4)));
    timeline.breakpoints.extend([first, second]);
    let mut never = || false;
    assert_eq!(timeline.cont(&mut never).unwrap(), Stop::Breakpoint(first));
    assert_eq!(here(&timeline), at(11, 3));
    // gdb steps off a breakpoint before it continues.
    timeline.step().unwrap();
    assert_eq!(timeline.cont(&mut never).unwrap(), Stop::Breakpoint(second));
    assert_eq!(here(&timeline), at(13, 4));
    timeline.step().unwrap();
    timeline.step().unwrap();
    assert_eq!(timeline.reverse_cont().unwrap(), Stop::Breakpoint(second));
    assert_eq!(here(&timeline), at(13, 4));
    // From a hit, the hit before it (not itself).
    assert_eq!(timeline.reverse_cont().unwrap(), Stop::Breakpoint(first));
    assert_eq!(here(&timeline), at(11, 3));
    assert_eq!(timeline.reverse_cont().unwrap(), Stop::Start);
    assert_eq!(here(&timeline), at(10, 0));
}

#[test]
fn test_an_interrupt_between_runs_stops_continue_where_it_stands() {
    let mut timeline = open();
    let mut asked = || true;
    assert_eq!(timeline.cont(&mut asked).unwrap(), Stop::Interrupted);
    assert_eq!(here(&timeline), at(10, 0));
}

#[test]
fn test_a_place_before_the_start_is_refused() {
    let mut timeline = open();
    let error = timeline.goto(at(9, 0)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "exit:9 is before the start of this session (exit:10)"
    );
}

#[test]
fn test_two_hits_in_one_interval_are_told_apart_both_ways() {
    let mut timeline = open();
    let (first, second) = (rip(at(11, 2)), rip(at(11, 5)));
    timeline.breakpoints.extend([first, second]);
    let mut never = || false;
    assert_eq!(timeline.cont(&mut never).unwrap(), Stop::Breakpoint(first));
    timeline.step().unwrap();
    assert_eq!(timeline.cont(&mut never).unwrap(), Stop::Breakpoint(second));
    assert_eq!(here(&timeline), at(11, 5));
    // The checkpoint kept at the second hit is past the first: the first is
    // located from the one kept before its own run.
    assert_eq!(timeline.reverse_cont().unwrap(), Stop::Breakpoint(first));
    assert_eq!(here(&timeline), at(11, 2));
}
