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
//! - `parse_fault` gives one fault, or two with `for=` (the undoing one
//!   later than the first: `for=0s` is refused); no time of them is past
//!   `MAX_VIRTUAL_TIME` but an undo's (at most twice it); each prints
//!   without `for=`, its time in the one duration printer's text, and the
//!   printed text parses (as a `Fault` and with `parse_fault`) back to the
//!   same fault: one concept, one representation;
//! - `check_until` refuses the text with an `--until` at its first fault's
//!   time, and accepts it with one just after;
//! - a fault serialises to JSON and back unchanged;
//! - `parse_fault_after` with a base gives the same faults as
//!   `parse_fault` for every text `parse_fault` accepts;
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
    check_lanes, check_until, parse_fault, parse_fault_after, schedule, Fault, FaultAction,
    FaultError,
};
use run::units::{parse_latency, ByteSize, MAX_VIRTUAL_TIME};
use std::fmt::{Debug, Display};
use std::str::FromStr;

fn check_faults(text: &str) {
    match parse_fault(text) {
        Ok(faults) => {
            assert!(matches!(faults.len(), 1 | 2), "{text:?} gave {faults:?}");
            assert!(faults[0].at <= MAX_VIRTUAL_TIME, "{text:?}: past the bound");
            if let [first, undo] = faults.as_slice() {
                assert!(undo.at > first.at, "{text:?}: undo not after the fault");
                assert!(
                    undo.at.0 - first.at.0 <= MAX_VIRTUAL_TIME.0,
                    "{text:?}: for= past the bound"
                );
            }
            let texts = [text.to_owned()];
            let at = faults[0].at;
            let refused = check_until(&texts, at).expect_err("a fault at the end never happens");
            check_error(&refused);
            check_until(&texts, VirtNanos(at.0 + 1)).expect("a fault before the end happens");
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
                assert_eq!(&again, fault, "{text:?} -> {printed:?}");
                assert_eq!(parse_fault(&printed).expect("parses"), vec![fault.clone()]);
                let json = serde_json::to_string(fault).expect("serialises");
                let back: Fault = serde_json::from_str(&json)
                    .unwrap_or_else(|e| panic!("{json} does not deserialise: {e}"));
                assert_eq!(&back, fault, "{json}");
            }
            let base = VirtNanos(7_000_000_000);
            let after = parse_fault_after(text, Some(base)).expect("a base only adds texts");
            assert_eq!(after, faults, "{text:?}");
        }
        Err(e) => {
            check_error(&e);
        }
    }
    match text.parse::<Fault>() {
        Ok(fault) => assert_eq!(
            parse_fault(text).expect("a fault is a fault string"),
            vec![fault]
        ),
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

/// The lane rule: see the invariants above.
fn check_lane_rule(text: &str) {
    let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    if let Ok(faults) = parse_fault(text) {
        if faults.iter().all(|f| f.check_nodes(&nodes).is_ok()) {
            if let Err(e) = schedule(&[text.to_owned()], &nodes) {
                panic!("{text:?} overlaps itself: {e}");
            }
        }
    }
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    match schedule(&lines, &nodes) {
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
