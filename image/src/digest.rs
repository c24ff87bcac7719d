//! Content digests (`sha256:<hex>`): parsing and incremental hashing.

use sha2::Digest as _;

use crate::ImageError;

/// An incremental hasher for one of the digest algorithms OCI uses.
pub(crate) enum Hasher {
    Sha256(sha2::Sha256),
    Sha384(sha2::Sha384),
    Sha512(sha2::Sha512),
}

impl Hasher {
    /// A hasher for the algorithm of `digest` (`alg:hex`), checking the hex part's form.
    pub(crate) fn for_digest(digest: &str) -> Result<Self, ImageError> {
        let bad = || ImageError::UnsupportedDigest {
            digest: digest.to_owned(),
        };
        let (alg, hex) = digest.split_once(':').ok_or_else(bad)?;
        let (hasher, len) = match alg {
            "sha256" => (Hasher::Sha256(sha2::Sha256::new()), 64),
            "sha384" => (Hasher::Sha384(sha2::Sha384::new()), 96),
            "sha512" => (Hasher::Sha512(sha2::Sha512::new()), 128),
            _ => return Err(bad()),
        };
        if hex.len() != len || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad());
        }
        Ok(hasher)
    }

    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha384(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// The digest in `alg:hex` form.
    pub(crate) fn finish(self) -> String {
        match self {
            Hasher::Sha256(h) => format!("sha256:{}", hex(&h.finalize())),
            Hasher::Sha384(h) => format!("sha384:{}", hex(&h.finalize())),
            Hasher::Sha512(h) => format!("sha512:{}", hex(&h.finalize())),
        }
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_empty() {
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut h = Hasher::for_digest(&sha256_digest(b"")).unwrap();
        h.update(b"");
        assert_eq!(h.finish(), sha256_digest(b""));
    }

    #[test]
    fn rejects_malformed_digests() {
        for d in [
            "sha256",
            "md5:d41d8cd98f00b204e9800998ecf8427e",
            "sha256:../../etc/passwd",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
        ] {
            assert!(matches!(
                Hasher::for_digest(d),
                Err(ImageError::UnsupportedDigest { .. })
            ));
        }
    }
}
