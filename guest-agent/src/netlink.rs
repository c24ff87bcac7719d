//! A minimal rtnetlink client: exactly the three requests the agent needs
//! (move a link to another network namespace, bring a link up, add an IPv4
//! address), each sent with `NLM_F_ACK` and answered synchronously by the
//! kernel. Hand-rolled instead of `rtnetlink` (async, tokio) or shelling out
//! to `ip` (busybox 1.35's has no netns support and the node image may have
//! no `ip` at all).
//!
//! A netlink socket talks to the network namespace it was created in, so
//! the caller opens one per namespace (see `agent.rs`).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::sys::{cstring, cvt, retry};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFLA_NET_NS_FD: u16 = 28;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 0x1;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;

/// Index of the interface `name` in the calling thread's network namespace.
pub fn link_index(name: &str) -> io::Result<u32> {
    let cname = cstring(name)?;
    // SAFETY: `cname` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no network interface {name:?}"),
        ));
    }
    Ok(index)
}

/// An rtnetlink socket bound to the namespace it was opened in.
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    pub fn open() -> io::Result<Self> {
        // SAFETY: socket has no memory effects.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })?;
        // SAFETY: `socket` returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, seq: 0 })
    }

    /// Moves link `index` into the network namespace `netns`.
    pub fn move_link_to_netns(&mut self, index: u32, netns: BorrowedFd<'_>) -> io::Result<()> {
        let mut body = ifinfomsg(index, 0, 0).to_vec();
        body.extend_from_slice(&attr(
            IFLA_NET_NS_FD,
            &(netns.as_raw_fd() as u32).to_ne_bytes(),
        ));
        self.request(RTM_NEWLINK, 0, &body)
    }

    /// Sets IFF_UP on link `index`.
    pub fn set_link_up(&mut self, index: u32) -> io::Result<()> {
        self.request(RTM_NEWLINK, 0, &ifinfomsg(index, IFF_UP, IFF_UP))
    }

    /// Adds `address/prefix_len` to link `index`.
    pub fn add_ipv4_address(
        &mut self,
        index: u32,
        address: Ipv4Addr,
        prefix_len: u8,
    ) -> io::Result<()> {
        self.request(
            RTM_NEWADDR,
            NLM_F_CREATE | NLM_F_EXCL,
            &ipv4_address_body(index, address, prefix_len),
        )
    }

    fn request(&mut self, msg_type: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let message = message(self.seq, msg_type, NLM_F_REQUEST | NLM_F_ACK | flags, body);
        let sent = retry(|| {
            // SAFETY: `message` is valid for reads of its length.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    message.as_ptr().cast(),
                    message.len(),
                    0,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        })?;
        if sent != message.len() {
            return Err(io::Error::other("short netlink send"));
        }
        let mut buffer = vec![0u8; 8192];
        loop {
            let n = retry(|| {
                // SAFETY: `buffer` is valid for writes of its length.
                let n = unsafe {
                    libc::recv(
                        self.fd.as_raw_fd(),
                        buffer.as_mut_ptr().cast(),
                        buffer.len(),
                        0,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            })?;
            if let Some(result) = parse_ack(&buffer[..n], self.seq)? {
                return result;
            }
        }
    }
}

/// struct nlmsghdr + body.
fn message(seq: u32, msg_type: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + body.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&msg_type.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: the kernel
    out.extend_from_slice(body);
    out
}

/// struct ifinfomsg { family, pad, type, index, flags, change }.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0] = AF_UNSPEC;
    out[4..8].copy_from_slice(&index.to_ne_bytes());
    out[8..12].copy_from_slice(&flags.to_ne_bytes());
    out[12..16].copy_from_slice(&change.to_ne_bytes());
    out
}

/// struct ifaddrmsg { family, prefixlen, flags, scope, index } + IFA_LOCAL
/// and IFA_ADDRESS (the same address: not a point-to-point link).
fn ipv4_address_body(index: u32, address: Ipv4Addr, prefix_len: u8) -> Vec<u8> {
    let mut out = vec![AF_INET, prefix_len, 0, 0];
    out.extend_from_slice(&index.to_ne_bytes());
    out.extend_from_slice(&attr(IFA_LOCAL, &address.octets()));
    out.extend_from_slice(&attr(IFA_ADDRESS, &address.octets()));
    out
}

/// struct rtattr { len, type } + data, padded to 4 bytes.
fn attr(attr_type: u16, data: &[u8]) -> Vec<u8> {
    let len = 4 + data.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&attr_type.to_ne_bytes());
    out.extend_from_slice(data);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// Looks for the ack (NLMSG_ERROR) of request `seq` in a datagram:
/// `Some(Ok)` for success, `Some(Err)` for the kernel's error, `None` if
/// the datagram holds no answer to `seq`.
fn parse_ack(mut datagram: &[u8], seq: u32) -> io::Result<Option<io::Result<()>>> {
    let truncated = || io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message");
    while datagram.len() >= NLMSG_HDRLEN {
        let field = |at: usize| u32::from_ne_bytes(datagram[at..at + 4].try_into().unwrap());
        let len = field(0) as usize;
        let msg_type = u16::from_ne_bytes([datagram[4], datagram[5]]);
        let msg_seq = field(8);
        if len < NLMSG_HDRLEN || len > datagram.len() {
            return Err(truncated());
        }
        if msg_seq == seq && msg_type == NLMSG_ERROR {
            if len < NLMSG_HDRLEN + 4 {
                return Err(truncated());
            }
            let error = i32::from_ne_bytes(datagram[16..20].try_into().unwrap());
            return Ok(Some(if error == 0 {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(-error))
            }));
        }
        datagram = &datagram[len.next_multiple_of(4).min(datagram.len())..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_link_up_request_layout() {
        // Act
        let bytes = message(
            7,
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK,
            &ifinfomsg(3, 1, 1),
        );

        // Assert
        let mut expected = Vec::new();
        expected.extend_from_slice(&32u32.to_ne_bytes());
        expected.extend_from_slice(&16u16.to_ne_bytes());
        expected.extend_from_slice(&5u16.to_ne_bytes());
        expected.extend_from_slice(&7u32.to_ne_bytes());
        expected.extend_from_slice(&0u32.to_ne_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0]);
        expected.extend_from_slice(&3u32.to_ne_bytes());
        expected.extend_from_slice(&1u32.to_ne_bytes());
        expected.extend_from_slice(&1u32.to_ne_bytes());
        assert_eq!(bytes, expected);
    }

    #[test]
    fn test_address_body_has_padded_attributes() {
        // Act
        let body = ipv4_address_body(2, Ipv4Addr::new(192, 0, 2, 1), 24);

        // Assert
        assert_eq!(body.len(), 8 + 8 + 8);
        assert_eq!(&body[..4], &[AF_INET, 24, 0, 0]);
        assert_eq!(&body[8..16], &[8, 0, 2, 0, 192, 0, 2, 1][..]);
        assert_eq!(&body[16..24], &[8, 0, 1, 0, 192, 0, 2, 1][..]);
    }

    #[test]
    fn test_attr_pads_to_four_bytes() {
        assert_eq!(attr(1, &[9]), vec![5, 0, 1, 0, 9, 0, 0, 0]);
    }

    fn ack(seq: u32, error: i32) -> Vec<u8> {
        let mut body = error.to_ne_bytes().to_vec();
        body.extend_from_slice(&[0; 16]); // the echoed request header
        message(seq, NLMSG_ERROR, 0, &body)
    }

    #[test]
    fn test_parse_ack_finds_result_for_its_sequence_number() {
        // Arrange
        let mut datagram = ack(1, 0);
        datagram.extend_from_slice(&ack(2, -libc::EEXIST));

        // Act
        let first = parse_ack(&datagram, 1).unwrap();
        let second = parse_ack(&datagram, 2).unwrap();
        let none = parse_ack(&datagram, 3).unwrap();

        // Assert
        assert!(matches!(first, Some(Ok(()))));
        assert_eq!(
            second.unwrap().unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        assert!(none.is_none());
    }

    #[test]
    fn test_parse_ack_rejects_truncated_message() {
        let mut datagram = ack(1, 0);
        datagram[0] = 200;
        assert!(parse_ack(&datagram, 1).is_err());
    }
}
