//! The identity of a distinct failure ([`FailureKey`]), by which a campaign
//! de-duplicates its findings: two histories that break the same property
//! (or make the same command fail, or trip the same checker on the same key)
//! are one finding with two witnesses. A baseline of triaged findings
//! ([`crate::triage`]) names them by it too, so a key stays the same across
//! builds of the system under test: a property's is its id, file and
//! function, never its line.
//!
//! Printed and parsed here only: a one-line [`Display`](fmt::Display) for
//! people (`detvisor findings`), and a stable slug ([`FailureKey::slug`],
//! [`FailureKey::from_slug`]) for the campaign's database, `finding.json`
//! and baselines (finding directories are named by number, not key).
//!
//! # Old keys
//!
//! Campaigns written before property keys left the line out hold
//! `property:<id>@<location>` slugs, the location `file:line` (or, without
//! a file, the function, else the class). They still parse, as
//! [`FailureKey::PropertyAtLine`], verbatim (their slug prints back the
//! same), and [`FailureKey::matches`] maps them: an old `file:line` key
//! matches a new key with the same id and file (whatever its function); an
//! old key without a file matches a new key with the same id, no file, and
//! that function (or class); an old empty location matches a new key with
//! neither. So a resumed old campaign does not find its old findings again,
//! `replay` and `verify` of an old finding recognise its failure, and an old
//! key in a baseline still marks tonight's finding.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What failed, independent of where and how often.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FailureKey {
    /// An SDK assertion: its `id` (the SDK's message), the source file that
    /// asserts it and the function (else the class, see
    /// [`run::records::sdk::Location::key_function`]), since two places may
    /// assert the same message; never the line, which any edit above it
    /// shifts.
    Property {
        id: String,
        file: String,
        function: String,
    },
    /// A test-composer command: it exited nonzero, or never exited 0.
    Command { name: String },
    /// A checker of recorded histories (e.g. `linearizability`) and what it
    /// found wrong (e.g. the key whose operations are not linearizable).
    Checker { checker: String, key: String },
    /// A property's key as campaigns wrote it before keys left the line
    /// out: its id and `location`, `file:line` (or the function, else the
    /// class, without a file). Read from old databases, findings and
    /// baselines only (no judge makes one); see the module's "Old keys" for
    /// how it [`matches`](FailureKey::matches) a [`FailureKey::Property`].
    PropertyAtLine { id: String, location: String },
}

/// Why a slug is not a [`FailureKey`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailureSlugError {
    #[error("failure key {slug:?}: expected property:<id>@<file>@<function>, command:<name> or checker:<checker>:<key>")]
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
    /// A stable one-word form: `property:<id>@<file>@<function>`,
    /// `command:<name>`, `checker:<checker>:<key>` (an old key,
    /// [`FailureKey::PropertyAtLine`]: `property:<id>@<location>`), each
    /// part with every character other than ASCII letters, digits and
    /// `-_.,+=` written as `%XX` (its UTF-8 bytes), so it is also a safe
    /// file name.
    pub fn slug(&self) -> String {
        match self {
            FailureKey::Property { id, file, function } => {
                format!(
                    "property:{}@{}@{}",
                    escape(id),
                    escape(file),
                    escape(function)
                )
            }
            FailureKey::PropertyAtLine { id, location } => {
                format!("property:{}@{}", escape(id), escape(location))
            }
            FailureKey::Command { name } => format!("command:{}", escape(name)),
            FailureKey::Checker { checker, key } => {
                format!("checker:{}:{}", escape(checker), escape(key))
            }
        }
    }

    /// The key whose [`FailureKey::slug`] is `slug` (a property's with one
    /// `@` is an old key, [`FailureKey::PropertyAtLine`]).
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
            "property" => match rest.split('@').collect::<Vec<_>>()[..] {
                [id, file, function] => Ok(FailureKey::Property {
                    id: part(id)?,
                    file: part(file)?,
                    function: part(function)?,
                }),
                [id, location] => Ok(FailureKey::PropertyAtLine {
                    id: part(id)?,
                    location: part(location)?,
                }),
                _ => Err(shape()),
            },
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

    /// Whether `self` and `other` name the same failure: equal, or one an
    /// old key ([`FailureKey::PropertyAtLine`]) that maps to the other (the
    /// module's "Old keys": the same id, and the same file if the old
    /// location is `file:line`, else no file and that function). Symmetric;
    /// two old keys match only if equal.
    pub fn matches(&self, other: &FailureKey) -> bool {
        match (self, other) {
            (FailureKey::PropertyAtLine { id, location }, FailureKey::Property { .. }) => {
                old_matches(id, location, other)
            }
            (FailureKey::Property { .. }, FailureKey::PropertyAtLine { id, location }) => {
                old_matches(id, location, self)
            }
            _ => self == other,
        }
    }
}

/// The file of an old property location, `file:line` (the text after the
/// last `:` all digits); `None` for a location without a line.
fn file_of_old_location(location: &str) -> Option<&str> {
    let (file, line) = location.rsplit_once(':')?;
    (!line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())).then_some(file)
}

/// Whether the old key `(old_id, location)` maps to `new` (a
/// [`FailureKey::Property`]).
fn old_matches(old_id: &str, location: &str, new: &FailureKey) -> bool {
    let FailureKey::Property { id, file, function } = new else {
        return false;
    };
    id == old_id
        && match file_of_old_location(location) {
            Some(old_file) => old_file == file,
            None => file.is_empty() && function == location,
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
            FailureKey::Property { id, file, function } => {
                write!(f, "property {id:?}")?;
                if !file.is_empty() {
                    write!(f, " at {}", file.escape_debug())?;
                }
                if !function.is_empty() {
                    write!(f, " in {}", function.escape_debug())?;
                }
                Ok(())
            }
            FailureKey::PropertyAtLine { id, location } if location.is_empty() => {
                write!(f, "property {id:?}")
            }
            FailureKey::PropertyAtLine { id, location } => {
                write!(f, "property {id:?} at {}", location.escape_debug())
            }
            FailureKey::Command { name } => write!(f, "command {name:?}"),
            FailureKey::Checker { checker, key } => write!(f, "checker {checker}: {key:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn property(id: &str, file: &str, function: &str) -> FailureKey {
        FailureKey::Property {
            id: id.into(),
            file: file.into(),
            function: function.into(),
        }
    }

    fn old(id: &str, location: &str) -> FailureKey {
        FailureKey::PropertyAtLine {
            id: id.into(),
            location: location.into(),
        }
    }

    #[test]
    fn test_slugs_and_lines_of_each_kind() {
        let cases = [
            (
                property("counter never negative", "src/main.rs", "app::count"),
                "property:counter%20never%20negative@src%2Fmain.rs@app%3A%3Acount",
                "property \"counter never negative\" at src/main.rs in app::count",
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
            (property("x", "", ""), "property:x@@", "property \"x\""),
            (
                property("x", "", "f"),
                "property:x@@f",
                "property \"x\" in f",
            ),
            (
                property("x", "a.go", ""),
                "property:x@a.go@",
                "property \"x\" at a.go",
            ),
            // Old keys, as campaigns wrote them before: verbatim.
            (
                old("counter never negative", "src/main.rs:42"),
                "property:counter%20never%20negative@src%2Fmain.rs%3A42",
                "property \"counter never negative\" at src/main.rs:42",
            ),
            (old("x", ""), "property:x@", "property \"x\""),
        ];
        for (key, slug, line) in cases {
            assert_eq!(key.slug(), slug);
            assert_eq!(FailureKey::from_slug(slug).unwrap(), key);
            assert_eq!(key.to_string(), line);
        }
        // A newline stays on the line.
        assert_eq!(
            property("a\nb", "f\n", "g").to_string(),
            "property \"a\\nb\" at f\\n in g"
        );
    }

    #[test]
    fn test_a_property_s_key_leaves_the_line_out() {
        use run::records::sdk::Location;
        let at = |line: u64| Location {
            class: "App".into(),
            function: "app::put".into(),
            file: "src/app.rs".into(),
            begin_line: line,
            begin_column: 3,
        };
        let tally = |location: Location| crate::properties::AssertionTally {
            id: "no stale read".into(),
            location,
            message: String::new(),
            assert_type: run::records::sdk::AssertType::Always,
            must_hit: true,
            catalogued: true,
            hits: 1,
            true_hits: 0,
            false_hits: 1,
            first_pass: None,
            first_failure: None,
            failed_stretches: 1,
        };
        let key = tally(at(10)).key();
        assert_eq!(key, property("no stale read", "src/app.rs", "app::put"));
        assert_eq!(tally(at(97)).key(), key, "a line shift keeps the key");
        // Without a function, the class stands for it.
        let classy = Location {
            function: String::new(),
            ..at(10)
        };
        assert_eq!(
            tally(classy).key(),
            property("no stale read", "src/app.rs", "App")
        );
    }

    #[test]
    fn test_old_keys_match_new_keys_by_id_and_file() {
        let new = property("no stale read", "src/app.rs", "app::get");
        // An old `file:line` key: the same id and file, whatever the line
        // and the function.
        let old_key =
            FailureKey::from_slug("property:no%20stale%20read@src%2Fapp.rs%3A42").unwrap();
        assert_eq!(old_key, old("no stale read", "src/app.rs:42"));
        assert!(old_key.matches(&new) && new.matches(&old_key));
        assert!(old_key.matches(&property("no stale read", "src/app.rs", "app::put")));
        assert!(!old_key.matches(&property("no stale read", "src/other.rs", "app::get")));
        assert!(!old_key.matches(&property("stale read", "src/app.rs", "app::get")));
        // A file name with a colon: the line is after the last one.
        assert!(old("p", "C:/x.go:7").matches(&property("p", "C:/x.go", "main")));
        // An old key without a file held the function (else the class).
        assert!(old("p", "main.main").matches(&property("p", "", "main.main")));
        assert!(!old("p", "main.main").matches(&property("p", "main.go", "main.main")));
        assert!(!old("p", "main.main").matches(&property("p", "", "main.other")));
        assert!(old("p", "").matches(&property("p", "", "")));
        assert!(!old("p", "").matches(&property("p", "a.go", "")));
        // Old keys match only themselves; other kinds only if equal.
        assert!(old_key.matches(&old_key.clone()));
        assert!(!old_key.matches(&old("no stale read", "src/app.rs:43")));
        let command = FailureKey::Command { name: "a".into() };
        assert!(command.matches(&command.clone()));
        assert!(!command.matches(&old("a", "")));
        assert!(new.matches(&new.clone()));
        assert!(!new.matches(&property("no stale read", "src/app.rs", "app::put")));
    }

    #[test]
    fn test_bad_slugs_name_the_problem() {
        for bad in [
            "",
            "property",
            "property:x",
            "property:x@a@b@c",
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
        for bad in [
            "command:%4",
            "command:%zz",
            "command:%FF",
            "property:x@%4@f",
        ] {
            assert!(matches!(
                FailureKey::from_slug(bad).unwrap_err(),
                FailureSlugError::Escape { .. }
            ));
        }
    }

    fn key() -> impl Strategy<Value = FailureKey> {
        let text = || any::<String>();
        prop_oneof![
            (text(), text(), text()).prop_map(|(id, file, function)| FailureKey::Property {
                id,
                file,
                function
            }),
            (text(), text()).prop_map(|(id, location)| FailureKey::PropertyAtLine { id, location }),
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
            prop_assert!(key.matches(&key));
            let json = serde_json::to_string(&key).unwrap();
            prop_assert_eq!(serde_json::from_str::<FailureKey>(&json).unwrap(), key);
        }
    }
}
