//! The channel: one typed, bidirectional connection between the host and a long-lived payload
//! in the helper VM, so that many requests share one boot (~11 s under TCG).
//!
//! Transport: a virtio-serial port. QEMU gets `-device virtio-serial-pci` with one
//! `virtserialport` named [`PORT_NAME`] whose host side is a Unix socket QEMU listens on
//! (`-chardev socket,server=on,wait=off`, in the launcher's private temp dir); the launcher
//! connects to it. In L1, the init loads `virtio_console` and links the port at
//! [`GUEST_PORT_PATH`] (what udev would do) before starting the payload. vsock would need
//! `vhost-vsock` on the host, which a `kvm_pvm` host need not have; a serial port needs nothing.
//!
//! Protocol ([`frame`] has the wire format): the guest end sends a hello with
//! [`PROTOCOL_VERSION`]; then, per call, the host sends one request message, stdin frames and
//! exactly one end-of-stdin frame; the guest end sends stdout/stderr frames while the handler
//! runs, then one response message. A shutdown frame from the host ends [`serve`], the payload
//! exits, the init reports its status and powers off.
//!
//! * Host: [`HelperVm::start`] boots the payload (any program that calls [`serve`]; its
//!   arguments are the caller's), [`HelperVm::call`] as often as needed, then
//!   [`HelperVm::shutdown`] (or drop). [`Client`] is the same protocol over any Unix stream.
//! * Guest: [`serve`] (or [`serve_on`] over any reader and writer).

mod frame;
mod guest;
mod host;
mod vm;

pub use frame::{read_frame, write_frame, Frame, FrameError, MAX_DATA_LEN, MAX_FRAME_LEN};
pub use guest::{serve, serve_on, CallIo, CallStdin, OutputWriter, ServeError};
pub use host::{CallError, Client, HandshakeError, ShutdownError, StartError, StdinSource};
pub use vm::{HelperVm, SHUTDOWN_TIMEOUT, START_TIMEOUT};

/// The virtio-serial port's name.
pub const PORT_NAME: &str = "detvisor.0";
/// Where the payload finds the port in L1.
pub const GUEST_PORT_PATH: &str = "/dev/virtio-ports/detvisor.0";
/// Version of the protocol, sent in the guest end's hello.
pub const PROTOCOL_VERSION: u32 = 1;
