//! Moving through histories: rewinding to a moment, branching from one
//! (a new seed, faults), waiting a while or until something happens. Each
//! names the moment it ended at, so it can be returned to; nothing changes
//! the history it started from (a branch is a new history whose id carries
//! what it did).

use crate::moment::{Action, MomentId};
use crate::reading::EventFilter;
use crate::session::{At, Result, Session};
use run::faults::Fault;
use run::moment::When;
use serde::Serialize;
use vmm::VirtNanos;

/// Goes to `moment` (any moment of any history of the source): where it
/// stands there.
pub fn rewind(session: &mut Session, moment: &MomentId) -> Result<At> {
    session.reach(moment)
}

/// Goes `by` before `moment`, on its history.
pub fn rewind_by(session: &mut Session, moment: &MomentId, by: VirtNanos) -> Result<At> {
    let at = session.reach(moment)?;
    let time = VirtNanos(at.virtual_ns.0.saturating_sub(by.0));
    session.reach(&moment.at(When::Time(time)))
}

/// A branch from `from`: every seeded stream re-keyed from `seed` (when
/// given) and `faults` added (`at=+` from the branch point). Its first
/// moment.
pub fn branch(
    session: &mut Session,
    from: &MomentId,
    seed: Option<u64>,
    faults: &[Fault],
) -> Result<At> {
    let start = session.reach(from)?;
    let t = start.virtual_ns;
    let mut actions: Vec<Action> = Vec::new();
    if let Some(seed) = seed {
        actions.push(Action::Seed { at: t, seed });
    }
    actions.extend(faults.iter().map(|fault| Action::Fault {
        at: t,
        fault: fault.clone(),
    }));
    let mut moment = from.at(When::Time(t));
    // Every moment a branch passes through is of its own history.
    moment.actions.extend(actions);
    let siblings = session.siblings_of(&moment);
    session
        .budget
        .check_branches(1, siblings, moment.depth() as u64, session.branches_alive())?;
    let at = session.reach(&moment)?;
    session.budget.branched(1);
    session.note_branch(&moment);
    Ok(at)
}

/// Runs `from`'s history on for `duration`.
pub fn wait(session: &mut Session, from: &MomentId, duration: VirtNanos) -> Result<At> {
    let start = session.reach(from)?;
    let end = VirtNanos(start.virtual_ns.0 + duration.0);
    session.reach(&from.at(When::Time(end)))
}

/// What [`wait_until`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Waited {
    /// Where the history stands: at the matching record, or at the cap.
    pub at: At,
    /// The record that matched, as listed by `events`.
    pub event: Option<crate::reading::EventRow>,
}

/// Runs `from`'s history on until a record `filter` keeps arrives, for at
/// most `cap` of virtual time.
pub fn wait_until(
    session: &mut Session,
    from: &MomentId,
    filter: &EventFilter,
    cap: VirtNanos,
) -> Result<Waited> {
    let start = session.reach(from)?;
    let limit = VirtNanos(start.virtual_ns.0 + cap.0);
    let history = from.at(When::Latest);
    let found = session.run_until_record(limit, &|record| filter.matches(&history, record))?;
    match found {
        Some(record) => {
            let at = session.reach(&from.at(When::Time(record.virtual_ns)))?;
            Ok(Waited {
                event: Some(crate::reading::event_row(&history, &record)),
                at,
            })
        }
        None => Ok(Waited {
            at: session.reach(&from.at(When::Time(limit)))?,
            event: None,
        }),
    }
}
