//! Faults against the run's end: one due at or after `--until` would never
//! happen, and a run that says nothing of it looks like one the fault did
//! not break.

use super::{Fault, FaultError};
use devices::VirtNanos;

/// Refuses the first of `faults` (as `--fault` and the manifest's `faults`
/// give them: times since boot) that is due at or after `until`. Only the
/// action written counts: a `for=` whose undoing falls after the end is
/// fine (the fault happened).
pub fn check_until(faults: &[Fault], until: VirtNanos) -> Result<(), FaultError> {
    for fault in faults {
        let at = fault.since_boot(None)?;
        if at >= until {
            return Err(FaultError::NeverFires {
                fault: Box::new(fault.clone()),
                at,
                until,
            });
        }
    }
    Ok(())
}

/// `up --until`'s faults: a `--fault` (`typed`) past the end was typed
/// for this run and is refused; the manifest's are the scenario's, and a
/// shorter run looks at its beginning, so each one it will not reach is
/// returned, for the caller to say once.
pub fn check_run_end(
    typed: &[Fault],
    manifest: &[Fault],
    until: VirtNanos,
) -> Result<Vec<FaultError>, FaultError> {
    check_until(typed, until)?;
    let mut unreached = Vec::new();
    for fault in manifest {
        match check_until(std::slice::from_ref(fault), until) {
            Err(never @ FaultError::NeverFires { .. }) => unreached.push(never),
            other => other?,
        }
    }
    Ok(unreached)
}

#[cfg(test)]
mod tests {
    use super::super::parse_faults;
    use super::*;

    #[test]
    fn test_a_fault_due_after_the_run_ends_is_refused() {
        let faults = |t: &[&str]| parse_faults(t).unwrap();
        let until = VirtNanos::from_secs(1);
        check_until(&faults(&["at=500ms pause n1 for=10s"]), until).unwrap();
        let err = check_until(&faults(&["at=100ms heal", "at=50s pause n1"]), until)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "fault \"at=50s pause n1\": the run ends at 1s (--until), before at=50s: it would never happen"
        );
        assert!(check_until(&faults(&["at=1s heal"]), until).is_err());
        let relative = check_until(&faults(&["at=+1s heal"]), until).unwrap_err();
        assert!(matches!(relative, FaultError::Time { .. }), "{relative}");
    }

    /// The manifest's faults past the end are returned to be said; a
    /// `--fault` past it is refused.
    #[test]
    fn test_the_manifests_faults_past_the_end_are_said_and_typed_ones_refused() {
        let faults = |t: &[&str]| parse_faults(t).unwrap();
        let until = VirtNanos::from_secs(1);
        let said = check_run_end(
            &faults(&["at=500ms heal"]),
            &faults(&["at=50s pause n1", "at=200ms heal", "at=2s heal"]),
            until,
        )
        .unwrap();
        let said: Vec<String> = said.iter().map(ToString::to_string).collect();
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[0].starts_with("fault \"at=50s pause n1\": the run ends at 1s"));
        let refused = check_run_end(&faults(&["at=5s heal"]), &[], until).unwrap_err();
        assert!(
            matches!(refused, FaultError::NeverFires { .. }),
            "{refused}"
        );
    }
}
