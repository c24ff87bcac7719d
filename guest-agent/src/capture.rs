//! What an `exec` keeps of a stream: its first `limit` bytes, and how many
//! it wrote in all.

/// One stream's kept bytes and whole size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    limit: u64,
    total: u64,
}

impl Capture {
    pub fn new(limit: u64) -> Self {
        Capture { limit, total: 0 }
    }

    /// Counts `chunk` and returns the part of it within the limit (to send).
    pub fn keep<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let room = self.limit.saturating_sub(self.total);
        let kept = usize::try_from(room).unwrap_or(usize::MAX).min(chunk.len());
        self.total = self.total.saturating_add(chunk.len() as u64);
        &chunk[..kept]
    }

    /// Bytes written in all.
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_first_limit_bytes_are_kept_and_all_counted() {
        let mut capture = Capture::new(5);
        assert_eq!(capture.keep(b"abc"), b"abc");
        assert_eq!(capture.keep(b"defg"), b"de");
        assert_eq!(capture.keep(b"hij"), b"");
        assert_eq!(capture.total(), 10);
        let mut none = Capture::new(0);
        assert_eq!(none.keep(b"x"), b"");
        assert_eq!(none.total(), 1);
        let mut all = Capture::new(u64::MAX);
        assert_eq!(all.keep(b"xyz"), b"xyz");
    }
}
