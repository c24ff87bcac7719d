//! What the switch did with each frame, for observers such as a pcap
//! writer. Recording is off unless asked for ([`super::Switch::record_frames`])
//! and is never saved: it cannot change the run.

use super::PortId;
use crate::time::VirtNanos;

/// Why the switch dropped a frame on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The link was blocked (a partition, cut or topology), at submit or in flight.
    Blocked,
    /// The loss probability hit.
    Loss,
    /// The switch held `MAX_IN_FLIGHT` frames already.
    Full,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Blocked => "partition",
            DropReason::Loss => "loss",
            DropReason::Full => "full",
        }
    }
}

/// A frame's fate on one directed link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameEvent {
    /// Delivery time, or the time of the drop (submit, or the fault's time
    /// for a frame cut in flight).
    pub at: VirtNanos,
    pub from: PortId,
    pub to: PortId,
    /// `None`: delivered.
    pub dropped: Option<DropReason>,
    pub frame: Vec<u8>,
}

/// Receives the switch's frame events, in virtual-time order.
pub trait FrameTap: Send {
    fn frame(&mut self, event: &FrameEvent);
}
