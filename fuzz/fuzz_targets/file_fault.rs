//! `file_fault`: fault strings (`--fault`, a manifest's `faults`, a
//! campaign's saved faults) and the unit texts inside them: durations
//! (`VirtNanos`), sizes (`ByteSize`) and latencies.
//!
//! Input: UTF-8 text (anything else is skipped); the first 8 bytes also
//! give a value for the print-then-parse checks.
//!
//! Invariants asserted:
//! - no panic, no hang, whatever the text;
//! - a refusal is a typed error whose message is not empty and does not
//!   repeat its cause's message;
//! - a `Fault` that parses prints back to a text that parses to the same
//!   fault, and serialises to JSON as that text and back unchanged: one
//!   concept, one representation;
//! - scheduled, it gives one action, or two with `for=` (the undoing one
//!   later than the first: `for=0s` is refused); no time of them is past
//!   `MAX_VIRTUAL_TIME` after the branch point but an undo's (at most twice
//!   it); each prints without `for=`, its time in the one duration
//!   printer's text, and the printed text schedules back to the same
//!   action; a scheduled fault serialises to JSON and back unchanged;
//! - a time since boot schedules the same with a branch point or without,
//!   and `check_until` refuses it with an `--until` at its time and accepts
//!   it with one just after; a relative time (`at=+`) is refused without a
//!   branch point and counts from it with one;
//! - a `FaultAction` text that parses prints back to a text that parses to
//!   the same action;
//! - a fault and the one its `for=` writes never overlap on a lane: a text
//!   whose faults name known nodes is scheduled alone; a list of texts
//!   (one a line) is scheduled in time order with no two faults of one lane
//!   overlapping, or refused with a typed error, an overlap naming both
//!   faults and the lane (`run::faults::check_lanes`);
//! - durations, sizes and latencies that parse print back to texts that
//!   parse to the same value; every u64 printed as a duration or a size
//!   parses back to itself.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use devices::VirtNanos;
use files::check_error;
use libfuzzer_sys::fuzz_target;
use run::faults::{
    check_lanes, check_until, parse_faults, schedule, Fault, FaultAction, FaultError, FaultTime,
    ScheduledFault,
};
use run::units::{parse_latency, ByteSize, MAX_VIRTUAL_TIME};
use std::fmt::{Debug, Display};
use std::str::FromStr;

fn check_faults(text: &str) {
    match text.parse::<Fault>() {
        Ok(written) => check_written(text, &written),
        Err(e) => {
            check_error(&e);
        }
    }
    match text.parse::<FaultAction>() {
        Ok(action) => {
            let printed = action.to_string();
            let again: FaultAction = printed
                .parse()
                .unwrap_or_else(|e| panic!("{printed:?} (from {text:?}) does not parse: {e}"));
            assert_eq!(again, action, "{text:?} -> {printed:?}");
        }
        Err(e) => {
            check_error(&e);
        }
    }
}

/// A fault that parses: see the invariants above.
fn check_written(text: &str, written: &Fault) {
    let printed = written.to_string();
    let again: Fault = printed
        .parse()
        .unwrap_or_else(|e| panic!("{printed:?} (from {text:?}) does not parse: {e}"));
    assert_eq!(&again, written, "{text:?} -> {printed:?}");
    let json = serde_json::to_string(written).expect("serialises");
    assert_eq!(
        json,
        serde_json::to_string(&printed).unwrap(),
        "a fault is its text"
    );
    let back: Fault =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json} does not deserialise: {e}"));
    assert_eq!(&back, written, "{json}");
    let base = VirtNanos(7_000_000_000);
    let faults = match written.at {
        FaultTime::SinceBoot(_) => {
            let faults = written
                .scheduled(None)
                .expect("a time since boot needs no base");
            let after = written
                .scheduled(Some(base))
                .expect("a base only adds texts");
            assert_eq!(after, faults, "{text:?}");
            let written = std::slice::from_ref(written);
            let at = faults[0].at;
            let refused = check_until(written, at).expect_err("a fault at the end never happens");
            check_error(&refused);
            check_until(written, VirtNanos(at.0 + 1)).expect("a fault before the end happens");
            faults
        }
        FaultTime::AfterBranch(after) => {
            let refused = written
                .scheduled(None)
                .expect_err("a relative time needs a base");
            check_error(&refused);
            let faults = written
                .scheduled(Some(base))
                .expect("7s plus at most 365 days");
            assert_eq!(faults[0].at, VirtNanos(base.0 + after.0), "{text:?}");
            faults
        }
    };
    assert_eq!(
        faults.len(),
        1 + usize::from(written.lasting.is_some()),
        "{text:?}"
    );
    assert!(
        faults[0].at.0 <= base.0 + MAX_VIRTUAL_TIME.0,
        "{text:?}: past the bound"
    );
    if let [first, undo] = faults.as_slice() {
        assert!(undo.at > first.at, "{text:?}: undo not after the fault");
        assert!(
            undo.at.0 - first.at.0 <= MAX_VIRTUAL_TIME.0,
            "{text:?}: for= past the bound"
        );
    }
    for fault in &faults {
        let printed = fault.to_string();
        assert!(!printed.contains("for="), "{printed:?} prints for=");
        assert!(
            printed.starts_with(&format!("at={} ", fault.at)),
            "{printed:?}: not the one duration printer's text"
        );
        let again: Fault = printed
            .parse()
            .unwrap_or_else(|e| panic!("{printed:?} (from {text:?}) does not parse: {e}"));
        assert_eq!(
            again.scheduled(None).expect("since boot"),
            vec![fault.clone()]
        );
        let json = serde_json::to_string(fault).expect("serialises");
        let back: ScheduledFault = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("{json} does not deserialise: {e}"));
        assert_eq!(&back, fault, "{json}");
    }
}

/// The lane rule: see the invariants above.
fn check_lane_rule(text: &str) {
    let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    if let Ok(fault) = text.parse::<Fault>() {
        if matches!(fault.at, FaultTime::SinceBoot(_)) && fault.check_nodes(&nodes).is_ok() {
            if let Err(e) = schedule(std::slice::from_ref(&fault), &nodes) {
                panic!("{text:?} overlaps itself: {e}");
            }
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    match parse_faults(&lines).and_then(|faults| schedule(&faults, &nodes)) {
        Ok(faults) => {
            assert!(faults.windows(2).all(|w| w[0].at <= w[1].at), "{faults:?}");
            assert!(check_lanes(&faults).is_ok(), "{faults:?}");
        }
        Err(e) => {
            if let FaultError::Overlap {
                first,
                second,
                lane,
            } = &e
            {
                let message = e.to_string();
                for named in [first.to_string(), second.to_string(), lane.clone()] {
                    assert!(message.contains(&named), "{message:?} names no {named:?}");
                }
            }
            check_error(&e);
        }
    }
}

/// A text of `T` that parses prints back to a text that parses to the same
/// value; `value` printed parses back to itself.
fn round_trip<T>(text: &str, value: T)
where
    T: FromStr + Display + PartialEq + Debug,
    T::Err: std::error::Error + 'static,
{
    match text.parse::<T>() {
        Ok(parsed) => {
            let printed = parsed.to_string();
            assert_eq!(
                printed.parse::<T>().ok(),
                Some(parsed),
                "{text:?} -> {printed:?}"
            );
        }
        Err(e) => {
            check_error(&e);
        }
    }
    let printed = value.to_string();
    assert_eq!(printed.parse::<T>().ok(), Some(value), "{printed:?}");
}

fn check_units(text: &str, value: u64) {
    round_trip(text, VirtNanos(value));
    round_trip(text, ByteSize(value));
    if let Err(e) = parse_latency(text) {
        check_error(&e);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut word = [0u8; 8];
    let n = data.len().min(8);
    word[..n].copy_from_slice(&data[..n]);
    check_faults(text);
    check_lane_rule(text);
    check_units(text.trim(), u64::from_le_bytes(word));
});
