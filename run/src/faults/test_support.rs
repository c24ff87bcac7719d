//! What the faults' tests share: parsing a fault text into its scheduled
//! actions or its error chain, and a network fault's trip to the switch
//! and back. The tests of the grammar, of `network` and of the parent use
//! it; it uses only the faults' own types.

use super::{Fault, FaultAction, FaultError, NetworkFault, ScheduledFault};
use devices::switch::Fault as SwitchFault;
use devices::{PortId, VirtNanos};

/// A fault text's actions from boot, as a run schedules them.
pub(super) fn parse_fault(text: &str) -> Result<Vec<ScheduledFault>, FaultError> {
    parse_fault_after(text, None)
}

/// A fault text's actions, `at=+` counted from `base`.
pub(super) fn parse_fault_after(
    text: &str,
    base: Option<VirtNanos>,
) -> Result<Vec<ScheduledFault>, FaultError> {
    text.parse::<Fault>()?.scheduled(base)
}

/// The whole error chain of a fault text that does not parse.
pub(super) fn parse_error(text: &str) -> String {
    format!("{:#}", anyhow::Error::from(parse_fault(text).unwrap_err()))
}

/// Each network fault text of `cases` is its switch fault, with nodes
/// n1, n2, n3 on ports 2, 3, 4, and the switch fault names it back.
pub(super) fn assert_to_switch_and_back(cases: &[(&str, SwitchFault)]) {
    let names = vec!["n1".to_string(), "n2".to_string(), "n3".to_string()];
    // NIC i (node i) sits on the switch port of its virtio slot.
    let ports = [PortId(2), PortId(3), PortId(4)];
    for (text, on_switch) in cases {
        let FaultAction::Network(fault) = text.parse::<FaultAction>().unwrap() else {
            panic!("{text} is the switch's");
        };
        assert_eq!(
            fault.to_switch(&names, &ports).unwrap(),
            *on_switch,
            "{text}"
        );
        assert_eq!(
            NetworkFault::from_switch(on_switch, &names, &ports),
            Some(fault),
            "{text}"
        );
    }
}
