//! What the properties of a system under test say across a campaign's whole
//! tree of histories.
//!
//! A campaign explores a tree: each branch runs one *stretch* (the slice
//! from its branch point to its end), and a history is the concatenation
//! of the stretches on its path from the root. A record made before a
//! branch point belongs to every history below it, so the tally counts
//! each stretch of the tree once: [`PropertyTally::add_stretch`] takes the
//! observations of one stretch. **Contract:** the caller feeds each stretch
//! once, under its own [`StretchId`] (a second feeding of one id is refused);
//! the same records fed under two ids count twice, because they are then two
//! stretches of the tree (two histories that each did it).
//!
//! Verdicts are over the whole campaign (every history of the tree):
//!
//! | kind | fails in a stretch ([`FailureWhen::InStretch`]) | fails at the end ([`FailureWhen::AtEnd`]) |
//! |---|---|---|
//! | Always | a hit with a false condition | never hit |
//! | AlwaysOrUnreachable | a hit with a false condition | - |
//! | Sometimes | - | never a hit with a true condition |
//! | Reachable | - | never hit |
//! | Unreachable | any hit | - |
//! | command never exits nonzero | a nonzero exit | - |
//! | command exits 0 at least once | - | never exited 0 |
//!
//! Catalog entries (`hit: false`) make an assertion known before it fires,
//! so a must-hit assertion that never fired is reported at the end; a
//! command is known once it exits, or once the caller names it
//! ([`PropertyTally::expect_command`]). The two command properties share
//! the command's [`FailureKey`]: a command that never exited 0 either exited
//! nonzero (already a failure) or never finished at all. (A `sometimes`
//! without `must_hit`, which no SDK writes, fails at the end only if it was
//! hit and never true.)

use crate::failure::FailureKey;
use run::records::sdk::{
    AssertType, Assertion, AssertionKind, Guidance, GuidanceType, Location, SdkRecord,
    SdkRecordError,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One stretch of the campaign's tree (one branch's slice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StretchId(pub u64);

impl fmt::Display for StretchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stretch {}", self.0)
    }
}

/// One thing a stretch showed about the properties.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "observation")]
pub enum Observation {
    /// A record of an Antithesis SDK ([`SdkRecord::parse`]).
    Sdk(SdkRecord),
    /// A test-composer command finished with this exit status.
    CommandExited { command: String, status: i32 },
}

/// The SDK records among a stretch's guest records, as observations, and
/// the records that are not SDK records (with their index in `records`),
/// for the caller to report. Command exits are the caller's to add
/// ([`Observation::CommandExited`]), from the run's events.
pub fn sdk_observations(
    records: &[run::records::GuestRecord],
) -> (Vec<Observation>, Vec<(usize, SdkRecordError)>) {
    let mut observations = Vec::new();
    let mut malformed = Vec::new();
    for (index, record) in records.iter().enumerate() {
        if let run::records::RecordBody::Sdk { json } = &record.body {
            match SdkRecord::parse(json) {
                Ok(sdk) => observations.push(Observation::Sdk(sdk)),
                Err(e) => malformed.push((index, e)),
            }
        }
    }
    (observations, malformed)
}

/// When a property was found broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "when")]
pub enum FailureWhen {
    /// A violation seen in this stretch (a finding with a witness history).
    InStretch { stretch: StretchId },
    /// Only the whole campaign shows it: never hit, never true, never 0.
    AtEnd,
}

/// A broken property.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub key: FailureKey,
    /// The property's kind, for people (`Always`, `command exits 0`...).
    pub property: String,
    pub when: FailureWhen,
    /// What broke, in a line (the assertion's message, the exit status...).
    pub message: String,
    /// The SDK's details of the failing hit (`null` at the end).
    pub details: Value,
}

/// A guidance value better than any before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuidanceNews {
    pub id: String,
    pub value: f64,
    /// The best before (`None`: the first value).
    pub previous: Option<f64>,
}

/// What a stretch added, for scoring its novelty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StretchNews {
    /// Properties hit (or commands run) for the first time in the campaign.
    pub first_hits: Vec<FailureKey>,
    /// Properties that were true (or commands that exited 0) for the first
    /// time: a Sometimes satisfied, a Reachable reached.
    pub first_passes: Vec<FailureKey>,
    /// Violations seen in this stretch, one per property; `new` is whether
    /// it is the first stretch that broke it.
    pub failures: Vec<StretchFailure>,
    /// Guidance values beyond the best so far, in their `maximize` direction.
    pub guidance: Vec<GuidanceNews>,
}

/// A failure of a stretch, and whether the campaign knew it already.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StretchFailure {
    pub failure: Failure,
    pub new: bool,
}

impl StretchNews {
    /// Whether the stretch added nothing.
    pub fn is_empty(&self) -> bool {
        self.first_hits.is_empty()
            && self.first_passes.is_empty()
            && self.failures.is_empty()
            && self.guidance.is_empty()
    }
}

/// Why a stretch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TallyError {
    #[error("{stretch} was already counted (each stretch of the tree is fed once)")]
    StretchAgain { stretch: StretchId },
}

/// The first hit of one outcome: where, and the SDK's details.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Witness {
    pub stretch: StretchId,
    pub details: Value,
}

/// One assertion's counts over the campaign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssertionTally {
    pub id: String,
    pub location: Location,
    pub message: String,
    pub assert_type: AssertType,
    pub must_hit: bool,
    /// A catalog entry (`hit: false`) was seen.
    pub catalogued: bool,
    pub hits: u64,
    pub true_hits: u64,
    pub false_hits: u64,
    pub first_pass: Option<Witness>,
    pub first_failure: Option<Witness>,
    /// Stretches in which it broke (Always false, Unreachable hit).
    pub failed_stretches: u64,
}

impl AssertionTally {
    pub fn kind(&self) -> AssertionKind {
        AssertionKind::of(self.assert_type, self.must_hit)
    }

    pub fn key(&self) -> FailureKey {
        FailureKey::Property {
            id: self.id.clone(),
            file: self.location.file.clone(),
            function: self.location.key_function().to_owned(),
        }
    }

    /// Whether a hit with this condition breaks the property at once.
    fn breaks(&self, condition: bool) -> bool {
        match self.kind() {
            AssertionKind::Always | AssertionKind::AlwaysOrUnreachable => !condition,
            AssertionKind::Unreachable => true,
            AssertionKind::Sometimes | AssertionKind::Reachable => false,
        }
    }

    /// Whether a hit with this condition satisfies the property.
    fn satisfies(&self, condition: bool) -> bool {
        match self.kind() {
            AssertionKind::Sometimes => condition,
            AssertionKind::Reachable => true,
            _ => false,
        }
    }

    /// Why the campaign as a whole breaks it, if it does only at the end.
    fn fails_at_end(&self) -> Option<&'static str> {
        match self.kind() {
            AssertionKind::Always if self.hits == 0 => Some("never reached"),
            AssertionKind::Reachable if self.hits == 0 => Some("never reached"),
            AssertionKind::Sometimes if self.true_hits == 0 && (self.must_hit || self.hits > 0) => {
                Some(if self.hits == 0 {
                    "never reached"
                } else {
                    "never true"
                })
            }
            _ => None,
        }
    }
}

/// One guidance id's values over the campaign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuidanceTally {
    pub id: String,
    pub location: Location,
    pub guidance_type: GuidanceType,
    pub maximize: bool,
    pub hits: u64,
    pub max: Option<f64>,
    pub min: Option<f64>,
    /// Where the best value (max if `maximize`, else min) was first seen.
    pub best_stretch: Option<StretchId>,
}

impl GuidanceTally {
    pub fn best(&self) -> Option<f64> {
        if self.maximize {
            self.max
        } else {
            self.min
        }
    }
}

/// One command's exits over the campaign.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommandTally {
    pub runs: u64,
    pub zero_exits: u64,
    pub nonzero_exits: u64,
    pub first_zero: Option<StretchId>,
    /// The first nonzero exit: where, and its status.
    pub first_nonzero: Option<(StretchId, i32)>,
}

/// The campaign's properties: fed stretch by stretch, saved with the
/// campaign (serde) and reloaded to resume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PropertyTally {
    stretches: BTreeSet<StretchId>,
    /// In the order first seen.
    assertions: Vec<AssertionTally>,
    guidance: Vec<GuidanceTally>,
    commands: BTreeMap<String, CommandTally>,
}

impl PropertyTally {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names a command the campaign runs, so "exits 0 at least once" fails
    /// at the end even if it never finished.
    pub fn expect_command(&mut self, name: &str) {
        self.commands.entry(name.to_owned()).or_default();
    }

    /// Counts the observations of stretch `stretch` (see the module's
    /// contract), and says what was new.
    pub fn add_stretch(
        &mut self,
        stretch: StretchId,
        observations: &[Observation],
    ) -> Result<StretchNews, TallyError> {
        if !self.stretches.insert(stretch) {
            return Err(TallyError::StretchAgain { stretch });
        }
        let mut news = StretchNews::default();
        // Properties this stretch broke already (one failure each per stretch).
        let mut broken: BTreeSet<FailureKey> = BTreeSet::new();
        for observation in observations {
            match observation {
                Observation::Sdk(SdkRecord::Assert(a)) => {
                    self.assertion(stretch, a, &mut news, &mut broken)
                }
                Observation::Sdk(SdkRecord::Guidance(g)) => self.guidance(stretch, g, &mut news),
                Observation::Sdk(_) => {}
                Observation::CommandExited { command, status } => {
                    self.command(stretch, command, *status, &mut news, &mut broken)
                }
            }
        }
        Ok(news)
    }

    fn assertion(
        &mut self,
        stretch: StretchId,
        a: &Assertion,
        news: &mut StretchNews,
        broken: &mut BTreeSet<FailureKey>,
    ) {
        let index = match self
            .assertions
            .iter()
            .position(|t| t.id == a.id && t.location == a.location)
        {
            Some(index) => index,
            None => {
                self.assertions.push(AssertionTally {
                    id: a.id.clone(),
                    location: a.location.clone(),
                    message: a.message.clone(),
                    assert_type: a.assert_type,
                    must_hit: a.must_hit,
                    catalogued: false,
                    hits: 0,
                    true_hits: 0,
                    false_hits: 0,
                    first_pass: None,
                    first_failure: None,
                    failed_stretches: 0,
                });
                self.assertions.len() - 1
            }
        };
        let t = &mut self.assertions[index];
        if !a.hit {
            t.catalogued = true;
            return;
        }
        let key = t.key();
        if t.hits == 0 {
            news.first_hits.push(key.clone());
        }
        t.hits += 1;
        if a.condition {
            t.true_hits += 1;
        } else {
            t.false_hits += 1;
        }
        let witness = || Witness {
            stretch,
            details: a.details.clone(),
        };
        if t.satisfies(a.condition) && t.first_pass.is_none() {
            news.first_passes.push(key.clone());
        }
        if a.condition && t.first_pass.is_none() {
            t.first_pass = Some(witness());
        }
        if t.breaks(a.condition) {
            let new = t.first_failure.is_none();
            if new {
                t.first_failure = Some(witness());
            }
            if broken.insert(key.clone()) {
                t.failed_stretches += 1;
                news.failures.push(StretchFailure {
                    failure: Failure {
                        key,
                        property: t.kind().to_string(),
                        when: FailureWhen::InStretch { stretch },
                        message: t.message.clone(),
                        details: a.details.clone(),
                    },
                    new,
                });
            }
        }
    }

    fn guidance(&mut self, stretch: StretchId, g: &Guidance, news: &mut StretchNews) {
        let index = match self
            .guidance
            .iter()
            .position(|t| t.id == g.id && t.location == g.location)
        {
            Some(index) => index,
            None => {
                self.guidance.push(GuidanceTally {
                    id: g.id.clone(),
                    location: g.location.clone(),
                    guidance_type: g.guidance_type,
                    maximize: g.maximize,
                    hits: 0,
                    max: None,
                    min: None,
                    best_stretch: None,
                });
                self.guidance.len() - 1
            }
        };
        let t = &mut self.guidance[index];
        if !g.hit {
            return;
        }
        t.hits += 1;
        let Some(value) = g.value() else { return };
        let previous = t.best();
        t.max = Some(t.max.map_or(value, |m| m.max(value)));
        t.min = Some(t.min.map_or(value, |m| m.min(value)));
        let better = match previous {
            None => true,
            Some(p) if t.maximize => value > p,
            Some(p) => value < p,
        };
        if better {
            t.best_stretch = Some(stretch);
            news.guidance.push(GuidanceNews {
                id: t.id.clone(),
                value,
                previous,
            });
        }
    }

    fn command(
        &mut self,
        stretch: StretchId,
        name: &str,
        status: i32,
        news: &mut StretchNews,
        broken: &mut BTreeSet<FailureKey>,
    ) {
        let t = self.commands.entry(name.to_owned()).or_default();
        let key = FailureKey::Command {
            name: name.to_owned(),
        };
        if t.runs == 0 {
            news.first_hits.push(key.clone());
        }
        t.runs += 1;
        if status == 0 {
            t.zero_exits += 1;
            if t.first_zero.is_none() {
                t.first_zero = Some(stretch);
                news.first_passes.push(key);
            }
            return;
        }
        t.nonzero_exits += 1;
        let new = t.first_nonzero.is_none();
        if new {
            t.first_nonzero = Some((stretch, status));
        }
        if broken.insert(key.clone()) {
            news.failures.push(StretchFailure {
                failure: Failure {
                    key,
                    property: "command never exits nonzero".into(),
                    when: FailureWhen::InStretch { stretch },
                    message: format!("{name} exited with status {status}"),
                    details: Value::Null,
                },
                new,
            });
        }
    }

    /// The properties only the whole campaign breaks: must-hit assertions
    /// never hit (their catalog entries make them known), Sometimes never
    /// true, commands that never exited 0. Violations seen in a stretch are
    /// not repeated here (they were in that stretch's [`StretchNews`]; see
    /// [`PropertyTally::failures_in_stretches`]).
    pub fn end_of_campaign_failures(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        for t in &self.assertions {
            if let Some(why) = t.fails_at_end() {
                failures.push(Failure {
                    key: t.key(),
                    property: t.kind().to_string(),
                    when: FailureWhen::AtEnd,
                    message: format!("{}: {why}", t.message),
                    details: Value::Null,
                });
            }
        }
        for (name, t) in &self.commands {
            if t.zero_exits == 0 {
                failures.push(Failure {
                    key: FailureKey::Command { name: name.clone() },
                    property: "command exits 0 at least once".into(),
                    when: FailureWhen::AtEnd,
                    message: if t.runs == 0 {
                        format!("{name} never finished")
                    } else {
                        format!("{name} never exited 0 ({} nonzero exits)", t.runs)
                    },
                    details: Value::Null,
                });
            }
        }
        failures
    }

    /// Every property broken in some stretch, with the first stretch that
    /// broke it and that hit's details.
    pub fn failures_in_stretches(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        for t in &self.assertions {
            if let Some(w) = &t.first_failure {
                failures.push(Failure {
                    key: t.key(),
                    property: t.kind().to_string(),
                    when: FailureWhen::InStretch { stretch: w.stretch },
                    message: t.message.clone(),
                    details: w.details.clone(),
                });
            }
        }
        for (name, t) in &self.commands {
            if let Some((stretch, status)) = t.first_nonzero {
                failures.push(Failure {
                    key: FailureKey::Command { name: name.clone() },
                    property: "command never exits nonzero".into(),
                    when: FailureWhen::InStretch { stretch },
                    message: format!("{name} exited with status {status}"),
                    details: Value::Null,
                });
            }
        }
        failures
    }

    /// The assertions seen so far, in the order first seen.
    pub fn assertions(&self) -> &[AssertionTally] {
        &self.assertions
    }

    /// The guidance ids seen so far, in the order first seen.
    pub fn guidance_tallies(&self) -> &[GuidanceTally] {
        &self.guidance
    }

    /// The commands seen or expected, by name.
    pub fn commands(&self) -> &BTreeMap<String, CommandTally> {
        &self.commands
    }

    /// How many stretches were counted.
    pub fn stretch_count(&self) -> usize {
        self.stretches.len()
    }
}

#[cfg(test)]
mod tests;
