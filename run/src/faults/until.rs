//! Faults against the run's end: one due at or after `--until` would never
//! happen, and a run that says nothing of it looks like one the fault did
//! not break.

use super::{parse_fault, FaultError};
use devices::VirtNanos;

/// Refuses the first of `texts` (fault strings, as `--fault` and the
/// manifest's `faults` give them) that is due at or after `until`. Only the
/// fault written counts: a `for=` whose undoing falls after the end is
/// fine (the fault happened). Each text is parsed, so a bad one is refused
/// here as by [`parse_fault`].
pub fn check_until(texts: &[String], until: VirtNanos) -> Result<(), FaultError> {
    for text in texts {
        let at = parse_fault(text)?[0].at;
        if at >= until {
            return Err(FaultError::NeverFires {
                text: text.clone(),
                at,
                until,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_fault_due_after_the_run_ends_is_refused() {
        let texts = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let until = VirtNanos::from_secs(1);
        check_until(&texts(&["at=500ms pause n1 for=10s"]), until).unwrap();
        let err = check_until(&texts(&["at=100ms heal", "at=50s pause n1"]), until)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "fault \"at=50s pause n1\": the run ends at 1s (--until), before at=50s: it would never happen"
        );
        assert!(check_until(&texts(&["at=1s heal"]), until).is_err());
        assert!(check_until(&texts(&["at=oops heal"]), until).is_err());
    }
}
