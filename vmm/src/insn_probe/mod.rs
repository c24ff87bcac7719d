//! What this host's KVM offers for counting guest instructions, found by
//! running a bare probe guest ([`guest`]): exact single-stepping
//! ([`step`]), hardware breakpoints and `INT3` reporting ([`breakpoints`]),
//! and a guest-only perf counter ([`pmu`]); and from those, which clocks a
//! run could use (`exit`, `step`, `pmu`) and the lines `detvisor check`
//! prints about them.
//!
//! Every probe is bounded (steps, wall time) and returns a result or the
//! reason it could not measure; none panics or waits on a guest forever.

pub mod breakpoints;
pub mod guest;
pub mod pmu;
pub mod step;

use breakpoints::{HwBreakpoints, Int3Report};
use guest::Cpl;
use kvm_ioctls::Kvm;
use pmu::PmuProbe;
use serde::{Deserialize, Serialize};
use step::{RepCount, StepExactness, StepRate};

/// One probe's result, or why it has none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probed<T> {
    Measured(T),
    Failed { reason: String },
}

impl<T> Probed<T> {
    pub fn failed(reason: &str) -> Probed<T> {
        Probed::Failed {
            reason: reason.to_string(),
        }
    }

    fn from_result(result: Result<T, String>) -> Probed<T> {
        match result {
            Ok(t) => Probed::Measured(t),
            Err(reason) => Probed::Failed { reason },
        }
    }

    pub fn measured(&self) -> Option<&T> {
        match self {
            Probed::Measured(t) => Some(t),
            Probed::Failed { .. } => None,
        }
    }
}

/// Everything the probes found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InsnProbes {
    /// Single-step exactness at CPL 0.
    pub step: Probed<StepExactness>,
    /// Steps per second, against the unstepped guest.
    pub step_rate: Probed<StepRate>,
    /// Single-step exactness at CPL 3.
    pub user_step: Probed<StepExactness>,
    pub hardware_breakpoints: Probed<HwBreakpoints>,
    pub int3: Probed<Int3Report>,
    pub pmu: PmuProbe,
}

/// Runs every probe on `kvm`.
pub fn run_probes(kvm: &Kvm, hardware_pmu: bool) -> InsnProbes {
    let step = Probed::from_result(step::probe_exactness(kvm, Cpl::Kernel));
    // The rate means something only where steps are steps.
    let step_rate = match &step {
        Probed::Measured(e) if e.exact() => Probed::from_result(step::probe_rate(kvm)),
        _ => Probed::Failed {
            reason: "not measured: single steps are not exact".into(),
        },
    };
    InsnProbes {
        step,
        step_rate,
        user_step: Probed::from_result(step::probe_exactness(kvm, Cpl::User)),
        hardware_breakpoints: Probed::from_result(breakpoints::probe_hw_breakpoints(kvm)),
        int3: Probed::from_result(breakpoints::probe_int3(kvm)),
        pmu: pmu::probe_pmu(kvm, hardware_pmu),
    }
}

/// Whether a run could use one clock here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockOffer {
    pub available: bool,
    /// For `step`: single steps per second measured here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_second: Option<u64>,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ClockOffer {
    fn yes() -> ClockOffer {
        ClockOffer {
            available: true,
            steps_per_second: None,
            reason: None,
        }
    }

    fn no(reason: String) -> ClockOffer {
        ClockOffer {
            available: false,
            steps_per_second: None,
            reason: Some(reason),
        }
    }
}

/// The clocks this host offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clocks {
    /// Virtual time per exit: always.
    pub exit: ClockOffer,
    /// Exact single-step counting.
    pub step: ClockOffer,
    /// A guest-only hardware counter.
    pub pmu: ClockOffer,
}

/// Why no clock but `exit` is offered on a KVM that cannot run guests.
pub const CANNOT_RUN_GUESTS: &str =
    "this KVM cannot run guests (see above; `check --host-vm always` probes the helper VM's)";

/// Why the step clock is not offered by an exactness result.
fn step_shortfall(e: &StepExactness) -> Option<String> {
    if e.stepped != e.expected {
        Some(format!(
            "single steps are not exact: {} steps where the guest ran {}",
            e.stepped, e.expected
        ))
    } else if let RepCount::Other(steps) = e.rep_count {
        Some(format!(
            "a REP of {} iterations took {steps} single steps",
            e.rep_iterations
        ))
    } else {
        None
    }
}

impl Clocks {
    /// The clocks `probes` allow; `cannot_run_guests` is why this KVM
    /// cannot run guests at all, if it cannot.
    pub fn from_probes(probes: &InsnProbes, cannot_run_guests: Option<&str>) -> Clocks {
        let cannot_run = || ClockOffer::no(CANNOT_RUN_GUESTS.to_string());
        let step = match (&probes.step, &probes.step_rate, cannot_run_guests) {
            (_, _, Some(_)) => cannot_run(),
            (Probed::Failed { reason }, _, _) => {
                ClockOffer::no(format!("the stepping probe failed: {reason}"))
            }
            (Probed::Measured(e), rate, None) => match step_shortfall(e) {
                Some(why) => ClockOffer::no(why),
                None => ClockOffer {
                    steps_per_second: rate.measured().map(StepRate::steps_per_second),
                    ..ClockOffer::yes()
                },
            },
        };
        // The counter's own reason first: it holds wherever the guest runs.
        let pmu = match (probes.pmu.why_unavailable(), cannot_run_guests) {
            (Some(why), _) => ClockOffer::no(why),
            (None, Some(_)) => cannot_run(),
            (None, None) => ClockOffer::yes(),
        };
        Clocks {
            exit: ClockOffer::yes(),
            step,
            pmu,
        }
    }
}

/// Whose KVM the probes ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbedOn {
    ThisHost,
    HelperVm,
}

fn line(label: &str, value: String) -> String {
    format!("{:<26}{value}", format!("{label}:"))
}

fn rep_words(rep: RepCount) -> &'static str {
    match rep {
        RepCount::PerIteration => "a REP counts one step per iteration",
        RepCount::WholeInstruction => "a REP counts one step in all",
        RepCount::Other(_) => "a REP counts neither per iteration nor as one",
    }
}

/// The lines `detvisor check` prints about clocks and debugging.
pub fn report_lines(probes: &InsnProbes, clocks: &Clocks, on: ProbedOn) -> Vec<String> {
    let offer = |c: &ClockOffer, detail: String| match (&c.reason, c.available) {
        (_, true) => format!("available{detail}"),
        (Some(r), false) => format!("no: {r}"),
        (None, false) => "no".into(),
    };
    let step_detail = match (&probes.step, &probes.step_rate) {
        (Probed::Measured(e), Probed::Measured(r)) => format!(
            ", {} steps/s (exact; {}; unstepped {} instructions/s)",
            r.steps_per_second(),
            rep_words(e.rep_count),
            r.free_instructions_per_second()
        ),
        (Probed::Measured(e), _) => format!(" (exact; {})", rep_words(e.rep_count)),
        _ => String::new(),
    };
    let hw = match &probes.hardware_breakpoints {
        Probed::Measured(h) if h.fire() => format!(
            "fire ({} of {} hits at the breakpoint's RIP)",
            h.hits, h.expected_hits
        ),
        Probed::Measured(h) => format!(
            "no: {} of {} hits{}{}",
            h.hits,
            h.expected_hits,
            h.misplaced
                .as_deref()
                .map(|m| format!("; {m}"))
                .unwrap_or_default(),
            match (h.guest_finished, h.hits) {
                (true, 0) => "; the guest ran past every breakpoint to its end",
                (true, _) => "",
                (false, _) => "; the guest did not finish",
            }
        ),
        Probed::Failed { reason } => format!("unknown: {reason}"),
    };
    let int3 = match &probes.int3 {
        Probed::Measured(i) if i.reported => {
            let at = match i.pc {
                Some(pc) if pc == i.int3_at => "at the int3's own address".to_string(),
                Some(pc) if pc == i.int3_at + 1 => "after the int3".to_string(),
                Some(pc) => format!("at {pc:#x}, the int3 is at {:#x}", i.int3_at),
                None => "at no address".to_string(),
            };
            format!(
                "yes (KVM_EXIT_DEBUG, exception 3, {at}{})",
                if i.resumed {
                    "; the guest resumed past it"
                } else {
                    "; the guest did not resume"
                }
            )
        }
        Probed::Measured(i) => format!(
            "no: the guest's int3 gave {}",
            i.instead.as_deref().unwrap_or("no exit")
        ),
        Probed::Failed { reason } => format!("unknown: {reason}"),
    };
    let user = match &probes.user_step {
        Probed::Measured(e) => match step_shortfall(e) {
            None => "exact (CPL 3)".to_string(),
            Some(why) => format!("not exact (CPL 3): {why}"),
        },
        Probed::Failed { reason } => format!("no: {reason}"),
    };
    let on = match on {
        ProbedOn::ThisHost => "this host's KVM",
        ProbedOn::HelperVm => "the helper VM's KVM (nested, under QEMU)",
    };
    vec![
        line(
            "clock exit",
            offer(&clocks.exit, " (virtual time per exit; the default)".into()),
        ),
        line("clock step", offer(&clocks.step, step_detail)),
        line("clock pmu", offer(&clocks.pmu, String::new())),
        line("hardware breakpoints", hw),
        line("INT3 reported to VMM", int3),
        line("user-level stepping", user),
        line("clocks probed on", on.to_string()),
    ]
}

#[cfg(test)]
mod tests;
