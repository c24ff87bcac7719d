//! The identity of a distinct failure ([`FailureKey`]), by which a campaign
//! de-duplicates its findings: two histories that break the same property
//! (or make the same command fail, or trip the same checker on the same key)
//! are one finding with two witnesses.
//!
//! Printed and parsed here only: a one-line [`Display`](fmt::Display) for
//! people (`detvisor findings`), and a stable slug ([`FailureKey::slug`],
//! [`FailureKey::from_slug`]) for the campaign's database and directory
//! names.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What failed, independent of where and how often.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FailureKey {
    /// An SDK assertion: its `id` (the SDK's message) and where it is in the
    /// source (`file:line`, see [`run::records::sdk::Location::key_text`]),
    /// since two places may assert the same message.
    Property { id: String, location: String },
    /// A test-composer command: it exited nonzero, or never exited 0.
    Command { name: String },
    /// A checker of recorded histories (e.g. `linearizability`) and what it
    /// found wrong (e.g. the key whose operations are not linearizable).
    Checker { checker: String, key: String },
}

/// Why a slug is not a [`FailureKey`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailureSlugError {
    #[error("failure key {slug:?}: expected property:<id>@<location>, command:<name> or checker:<checker>:<key>")]
    Shape { slug: String },
    #[error("failure key {slug:?}: bad escape (a % is followed by two hex digits)")]
    Escape { slug: String },
}

/// The characters a slug escapes as `%XX`: its separators, `%` itself,
/// and anything outside printable ASCII or unsafe in a file name.
fn needs_escape(c: char) -> bool {
    !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ',' | '+' | '='))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if needs_escape(c) {
            let mut buf = [0u8; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unescape(part: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2)?;
            let hex = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

impl FailureKey {
    /// A stable one-word form: `property:<id>@<location>`,
    /// `command:<name>`, `checker:<checker>:<key>`, each part with every
    /// character other than ASCII letters, digits and `-_.,+=` written as
    /// `%XX` (its UTF-8 bytes), so it is also a safe file name.
    pub fn slug(&self) -> String {
        match self {
            FailureKey::Property { id, location } => {
                format!("property:{}@{}", escape(id), escape(location))
            }
            FailureKey::Command { name } => format!("command:{}", escape(name)),
            FailureKey::Checker { checker, key } => {
                format!("checker:{}:{}", escape(checker), escape(key))
            }
        }
    }

    /// The key whose [`FailureKey::slug`] is `slug`.
    pub fn from_slug(slug: &str) -> Result<Self, FailureSlugError> {
        let shape = || FailureSlugError::Shape {
            slug: slug.to_owned(),
        };
        let part = |p: &str| {
            unescape(p).ok_or_else(|| FailureSlugError::Escape {
                slug: slug.to_owned(),
            })
        };
        let (kind, rest) = slug.split_once(':').ok_or_else(shape)?;
        match kind {
            "property" => {
                let (id, location) = rest.split_once('@').ok_or_else(shape)?;
                Ok(FailureKey::Property {
                    id: part(id)?,
                    location: part(location)?,
                })
            }
            "command" if !rest.contains(':') => Ok(FailureKey::Command { name: part(rest)? }),
            "checker" => {
                let (checker, key) = rest.split_once(':').ok_or_else(shape)?;
                Ok(FailureKey::Checker {
                    checker: part(checker)?,
                    key: part(key)?,
                })
            }
            _ => Err(shape()),
        }
    }
}

/// Serde of a [`FailureKey`] as its slug, for `#[serde(with = ...)]`: the
/// form a failure's key has in what a campaign writes (`finding.json`, the
/// database's findings), where the key's own serde form (a tagged object,
/// kept in the saved tallies) would be another text.
pub mod as_slug {
    use super::*;
    use serde::de::Error;

    pub fn serialize<S: Serializer>(key: &FailureKey, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&key.slug())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<FailureKey, D::Error> {
        let slug = String::deserialize(deserializer)?;
        FailureKey::from_slug(&slug).map_err(D::Error::custom)
    }
}

/// One line: names are quoted (so a newline in one stays on the line).
impl fmt::Display for FailureKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKey::Property { id, location } if location.is_empty() => {
                write!(f, "property {id:?}")
            }
            FailureKey::Property { id, location } => write!(f, "property {id:?} at {location}"),
            FailureKey::Command { name } => write!(f, "command {name:?}"),
            FailureKey::Checker { checker, key } => write!(f, "checker {checker}: {key:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn property(id: &str, location: &str) -> FailureKey {
        FailureKey::Property {
            id: id.into(),
            location: location.into(),
        }
    }

    #[test]
    fn test_slugs_and_lines_of_each_kind() {
        let cases = [
            (
                property("counter never negative", "src/main.rs:42"),
                "property:counter%20never%20negative@src%2Fmain.rs%3A42",
                "property \"counter never negative\" at src/main.rs:42",
            ),
            (
                FailureKey::Command {
                    name: "parallel_driver_put".into(),
                },
                "command:parallel_driver_put",
                "command \"parallel_driver_put\"",
            ),
            (
                FailureKey::Checker {
                    checker: "linearizability".into(),
                    key: "k2".into(),
                },
                "checker:linearizability:k2",
                "checker linearizability: \"k2\"",
            ),
            (property("x", ""), "property:x@", "property \"x\""),
        ];
        for (key, slug, line) in cases {
            assert_eq!(key.slug(), slug);
            assert_eq!(FailureKey::from_slug(slug).unwrap(), key);
            assert_eq!(key.to_string(), line);
        }
        // A newline stays on the line.
        assert_eq!(
            property("a\nb", "f:1").to_string(),
            "property \"a\\nb\" at f:1"
        );
    }

    #[test]
    fn test_bad_slugs_name_the_problem() {
        for bad in [
            "",
            "property",
            "property:x",
            "bogus:x",
            "checker:x",
            "command:a:b",
        ] {
            let err = FailureKey::from_slug(bad).unwrap_err();
            assert!(
                matches!(err, FailureSlugError::Shape { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains(&format!("{bad:?}")));
        }
        for bad in ["command:%4", "command:%zz", "command:%FF"] {
            assert!(matches!(
                FailureKey::from_slug(bad).unwrap_err(),
                FailureSlugError::Escape { .. }
            ));
        }
    }

    fn key() -> impl Strategy<Value = FailureKey> {
        let text = || any::<String>();
        prop_oneof![
            (text(), text()).prop_map(|(id, location)| FailureKey::Property { id, location }),
            text().prop_map(|name| FailureKey::Command { name }),
            (text(), text()).prop_map(|(checker, key)| FailureKey::Checker { checker, key }),
        ]
    }

    proptest! {
        #[test]
        fn prop_slug_round_trips_and_is_a_file_name(key in key()) {
            let slug = key.slug();
            prop_assert!(slug.chars().all(|c| c.is_ascii_graphic() && c != '/'), "{}", slug);
            prop_assert_eq!(FailureKey::from_slug(&slug).unwrap(), key.clone());
            prop_assert!(!key.to_string().contains('\n'));
            let json = serde_json::to_string(&key).unwrap();
            prop_assert_eq!(serde_json::from_str::<FailureKey>(&json).unwrap(), key);
        }
    }
}
