//! Errors of the device models. Guest accesses never fail (a guest can send
//! anything); only restoring a saved state that cannot describe a real device
//! does.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DevicesError {
    #[error(
        "serial state holds {len} bytes in its receive FIFO, more than the {capacity} it can hold"
    )]
    SerialFifoOverflow { len: usize, capacity: usize },
    #[error("RTC state has {len} bytes of CMOS RAM, expected {expected}")]
    CmosRamLength { len: usize, expected: usize },
    #[error("HPET state has {len} timers, expected {expected}")]
    HpetTimerCount { len: usize, expected: usize },
}
