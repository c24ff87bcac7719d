//! Standard base64 (RFC 4648, padded) for `Vec<u8>` fields; strict on input.

use serde::{Deserialize, Deserializer, Serializer};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn value(c: u8) -> Option<u32> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    } as u32)
}

pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let input = text.as_bytes();
    if !input.len().is_multiple_of(4) {
        return Err(format!(
            "base64 length {} is not a multiple of 4",
            input.len()
        ));
    }
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let quads = input.len() / 4;
    for (index, quad) in input.chunks(4).enumerate() {
        let last = index + 1 == quads;
        let padding = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && !last) {
            return Err("misplaced base64 padding".to_string());
        }
        let mut n = 0u32;
        for &c in &quad[..4 - padding] {
            let v = value(c).ok_or_else(|| format!("invalid base64 character {c:#04x}"))?;
            n = (n << 6) | v;
        }
        n <<= 6 * padding as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = 3 - padding;
        // Canonical form only: the bits that padding drops must be zero.
        if bytes[keep..].iter().any(|&b| b != 0) {
            return Err("non-canonical base64 (trailing bits set)".to_string());
        }
        out.extend_from_slice(&bytes[..keep]);
    }
    Ok(out)
}

pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&encode(bytes))
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    decode(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_base64_matches_rfc4648_vectors_and_round_trips() {
        // Arrange
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        let all: Vec<u8> = (0..=255).chain((0..=255).rev()).collect();

        // Act + Assert
        for (plain, encoded) in vectors {
            assert_eq!(encode(plain.as_bytes()), encoded);
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes());
        }
        for len in 0..all.len() {
            assert_eq!(decode(&encode(&all[..len])).unwrap(), &all[..len]);
        }
    }

    #[test]
    fn test_base64_rejects_invalid_input() {
        for bad in [
            "Zg=", "Zg=a", "Z===", "Zh==", "Zm9v!A==", "Zg==Zg==", "Zm 9",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
