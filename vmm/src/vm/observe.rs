//! Handing each exit record to the session's observer, if it has one (a
//! trace, see [`crate::trace`]), with the name of the device the exit hit.
//! Only read: nothing here changes the run or its digest.

use super::Session;
use crate::record::ExitRecord;
use crate::trace::{exit_device, ExitObserver};

impl Session {
    /// Sets (or removes) what hears of every exit record from now on, with
    /// the device each exit hit; returns the one set before. A run with an
    /// observer has the history and digest it has without.
    pub fn set_exit_observer(
        &mut self,
        observer: Option<Box<dyn ExitObserver>>,
    ) -> Option<Box<dyn ExitObserver>> {
        self.recorder.set_observer(observer)
    }

    /// Tells the observer, if any, of `record`.
    pub(super) fn observe(&mut self, record: &ExitRecord) {
        if let Some(observer) = self.recorder.observer_mut() {
            let device = exit_device(&self.machine.devices, record.kind, record.address);
            observer.exit(record, device.as_deref());
        }
    }
}
