//! The records of the Antithesis SDKs, typed: one JSON object with one key
//! per record, as an unmodified SDK writes it (`antithesis_sdk`,
//! `antithesis_setup`, `antithesis_assert`, `antithesis_guidance`, or a
//! user event `{name: details}`). Parsed here only ([`SdkRecord::parse`]),
//! for the `up` conductor (which watches for `setup_complete`) and for a
//! campaign's judges alike; fields the SDKs may add later are ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// One SDK record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "record")]
pub enum SdkRecord {
    /// `antithesis_sdk`: the language and versions of the SDK.
    SdkInfo { info: Value },
    /// `antithesis_setup`: the system under test is ready (`status` is
    /// `"complete"`).
    Setup { status: String, details: Value },
    /// `antithesis_assert`: an assertion hit, or (with `hit: false`) its
    /// catalog entry.
    Assert(Assertion),
    /// `antithesis_guidance`: a value the search may steer towards.
    Guidance(Guidance),
    /// Any other key: a user event, `{name: details}`.
    Event { name: String, details: Value },
}

/// An `antithesis_assert` record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assertion {
    pub assert_type: AssertType,
    /// The SDK's name of the kind (`Always`, `AlwaysOrUnreachable`, ...);
    /// informative: the kind is `assert_type` with `must_hit`.
    #[serde(default)]
    pub display_type: String,
    pub condition: bool,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub location: Location,
    /// False: a catalog entry (the assertion exists; it was not evaluated).
    pub hit: bool,
    pub must_hit: bool,
    /// The property's name (the SDKs use the message).
    pub id: String,
    #[serde(default)]
    pub details: Value,
}

/// The SDKs' `assert_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssertType {
    Always,
    Sometimes,
    Reachability,
}

/// The five kinds of assertion, from `assert_type` and `must_hit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AssertionKind {
    /// True every time, and reached at least once.
    Always,
    /// True every time it is reached (possibly never).
    AlwaysOrUnreachable,
    /// True at least once.
    Sometimes,
    /// Reached at least once.
    Reachable,
    /// Never reached.
    Unreachable,
}

impl Assertion {
    /// The kind this record asserts. (`sometimes` without `must_hit`, which
    /// no SDK writes, is a Sometimes: see the fuzzer's `PropertyTally`.)
    pub fn kind(&self) -> AssertionKind {
        AssertionKind::of(self.assert_type, self.must_hit)
    }
}

impl AssertionKind {
    /// The kind of an `assert_type` with `must_hit`.
    pub fn of(assert_type: AssertType, must_hit: bool) -> AssertionKind {
        match (assert_type, must_hit) {
            (AssertType::Always, true) => AssertionKind::Always,
            (AssertType::Always, false) => AssertionKind::AlwaysOrUnreachable,
            (AssertType::Sometimes, _) => AssertionKind::Sometimes,
            (AssertType::Reachability, true) => AssertionKind::Reachable,
            (AssertType::Reachability, false) => AssertionKind::Unreachable,
        }
    }
}

impl fmt::Display for AssertionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AssertionKind::Always => "Always",
            AssertionKind::AlwaysOrUnreachable => "AlwaysOrUnreachable",
            AssertionKind::Sometimes => "Sometimes",
            AssertionKind::Reachable => "Reachable",
            AssertionKind::Unreachable => "Unreachable",
        })
    }
}

/// Where an assertion or guidance is in the source.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Location {
    #[serde(default)]
    pub class: String,
    #[serde(default)]
    pub function: String,
    #[serde(default)]
    pub file: String,
    #[serde(default)]
    pub begin_line: u64,
    #[serde(default)]
    pub begin_column: u64,
}

impl Location {
    /// The function as a property's failure key holds it (beside the file,
    /// never the line, so that a line shift keeps the key): the function,
    /// else the class; empty if the SDK gave neither.
    pub fn key_function(&self) -> &str {
        if self.function.is_empty() {
            &self.class
        } else {
            &self.function
        }
    }
}

/// An `antithesis_guidance` record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Guidance {
    pub guidance_type: GuidanceType,
    #[serde(default)]
    pub message: String,
    pub id: String,
    #[serde(default)]
    pub location: Location,
    /// Numeric: whether larger values are the interesting direction.
    #[serde(default)]
    pub maximize: bool,
    #[serde(default)]
    pub guidance_data: Value,
    /// False: a catalog entry.
    pub hit: bool,
}

/// The SDKs' `guidance_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuidanceType {
    Numeric,
    Boolean,
    Json,
}

impl Guidance {
    /// The number the search compares, if the record has one: numeric
    /// guidance is `left - right` (the SDKs' `{"left", "right"}`; a bare
    /// number is itself), boolean guidance the count of its true
    /// conditions. `None` for JSON guidance, catalog entries and values
    /// that are not finite numbers.
    pub fn value(&self) -> Option<f64> {
        let data = &self.guidance_data;
        let value = match self.guidance_type {
            GuidanceType::Numeric => match data {
                Value::Number(n) => n.as_f64()?,
                Value::Object(map) => map.get("left")?.as_f64()? - map.get("right")?.as_f64()?,
                _ => return None,
            },
            GuidanceType::Boolean => {
                let map = data.as_object()?;
                map.values().filter(|v| v.as_bool() == Some(true)).count() as f64
            }
            GuidanceType::Json => return None,
        };
        value.is_finite().then_some(value)
    }
}

/// Why a JSON value is not an SDK record.
#[derive(Debug, thiserror::Error)]
pub enum SdkRecordError {
    #[error("an SDK record is an object with exactly one key, not {found}")]
    Shape { found: String },
    #[error("antithesis_setup: expected {{\"status\": <string>, \"details\": ...}}")]
    Setup,
    #[error("antithesis_assert")]
    Assert(#[source] serde_json::Error),
    #[error("antithesis_guidance")]
    Guidance(#[source] serde_json::Error),
}

impl SdkRecord {
    /// Whether this is the SDKs' `setup_complete` (`antithesis_setup` with
    /// `status` `"complete"`).
    pub fn is_setup_complete(&self) -> bool {
        matches!(self, SdkRecord::Setup { status, .. } if status == "complete")
    }

    /// The record an SDK wrote as `json`.
    pub fn parse(json: &Value) -> Result<SdkRecord, SdkRecordError> {
        let shape = |found: String| SdkRecordError::Shape { found };
        let map = match json {
            Value::Object(map) => map,
            Value::Array(_) => return Err(shape("an array".into())),
            Value::Null => return Err(shape("null".into())),
            Value::Bool(_) | Value::Number(_) => return Err(shape(format!("{json}"))),
            Value::String(_) => return Err(shape("a string".into())),
        };
        let mut entries = map.iter();
        let (Some((key, body)), None) = (entries.next(), entries.next()) else {
            return Err(shape(format!("an object with {} keys", map.len())));
        };
        Ok(match key.as_str() {
            "antithesis_sdk" => SdkRecord::SdkInfo { info: body.clone() },
            "antithesis_setup" => {
                let status = body
                    .get("status")
                    .and_then(Value::as_str)
                    .ok_or(SdkRecordError::Setup)?;
                SdkRecord::Setup {
                    status: status.to_owned(),
                    details: body.get("details").cloned().unwrap_or(Value::Null),
                }
            }
            "antithesis_assert" => {
                SdkRecord::Assert(Assertion::deserialize(body).map_err(SdkRecordError::Assert)?)
            }
            "antithesis_guidance" => {
                SdkRecord::Guidance(Guidance::deserialize(body).map_err(SdkRecordError::Guidance)?)
            }
            name => SdkRecord::Event {
                name: name.to_owned(),
                details: body.clone(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An `antithesis_assert` record as the Rust SDK writes it.
    fn assert_json(
        assert_type: &str,
        display_type: &str,
        must_hit: bool,
        id: &str,
        hit: bool,
        condition: bool,
    ) -> Value {
        json!({"antithesis_assert": {
            "assert_type": assert_type, "display_type": display_type,
            "condition": condition, "message": id,
            "location": {"class": "app", "function": "app::f", "file": "src/app.rs",
                         "begin_line": 10, "begin_column": 5},
            "hit": hit, "must_hit": must_hit, "id": id, "details": {"n": 1}
        }})
    }

    #[test]
    fn test_the_five_kinds_parse_from_their_triples() {
        let cases = [
            ("always", "Always", true, AssertionKind::Always),
            (
                "always",
                "AlwaysOrUnreachable",
                false,
                AssertionKind::AlwaysOrUnreachable,
            ),
            ("sometimes", "Sometimes", true, AssertionKind::Sometimes),
            ("reachability", "Reachable", true, AssertionKind::Reachable),
            (
                "reachability",
                "Unreachable",
                false,
                AssertionKind::Unreachable,
            ),
        ];
        for (assert_type, display, must_hit, kind) in cases {
            let json = assert_json(assert_type, display, must_hit, "p", true, true);
            let SdkRecord::Assert(a) = SdkRecord::parse(&json).unwrap() else {
                panic!("{json} is an assertion");
            };
            assert_eq!(a.kind(), kind);
            assert_eq!(a.kind().to_string(), display);
            assert_eq!(a.location.key_function(), "app::f");
            assert_eq!(a.details, json!({"n": 1}));
        }
    }

    #[test]
    fn test_only_a_complete_setup_is_setup_complete() {
        let setup = |status: &str| {
            SdkRecord::parse(&json!({"antithesis_setup": {"status": status, "details": null}}))
                .unwrap()
        };
        assert!(setup("complete").is_setup_complete());
        assert!(!setup("starting").is_setup_complete());
        let event = json!({"complete": {"status": "complete"}});
        assert!(!SdkRecord::parse(&event).unwrap().is_setup_complete());
    }

    #[test]
    fn test_other_records_and_extra_fields() {
        let setup = json!({"antithesis_setup": {"status": "complete", "details": {"x": 1}}});
        assert_eq!(
            SdkRecord::parse(&setup).unwrap(),
            SdkRecord::Setup {
                status: "complete".into(),
                details: json!({"x": 1})
            }
        );
        let info =
            json!({"antithesis_sdk": {"language": {"name": "Rust"}, "protocol_version": "1.1.0"}});
        assert!(matches!(
            SdkRecord::parse(&info).unwrap(),
            SdkRecord::SdkInfo { .. }
        ));
        let event = json!({"leader_elected": {"term": 3}});
        assert_eq!(
            SdkRecord::parse(&event).unwrap(),
            SdkRecord::Event {
                name: "leader_elected".into(),
                details: json!({"term": 3})
            }
        );
        // Unknown extra fields are ignored; missing optional ones default.
        let mut extra = assert_json("always", "Always", true, "p", true, true);
        extra["antithesis_assert"]["future_field"] = json!(7);
        extra["antithesis_assert"]
            .as_object_mut()
            .unwrap()
            .remove("details");
        let SdkRecord::Assert(a) = SdkRecord::parse(&extra).unwrap() else {
            unreachable!()
        };
        assert_eq!(a.details, Value::Null);
    }

    #[test]
    fn test_malformed_records_are_typed_errors() {
        let chain = |json: Value| {
            let err = SdkRecord::parse(&json).unwrap_err();
            let mut text = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        };
        assert!(chain(json!([1])).contains("not an array"));
        assert!(chain(json!("x")).contains("not a string"));
        assert!(chain(json!(null)).contains("exactly one key, not null"));
        assert!(chain(json!({})).contains("an object with 0 keys"));
        assert!(chain(json!({"a": 1, "b": 2})).contains("an object with 2 keys"));
        assert!(chain(json!({"antithesis_setup": {"details": 1}})).contains("status"));
        let mut bad_type = assert_json("often", "Often", true, "p", true, true);
        assert!(chain(bad_type.clone()).contains("antithesis_assert: unknown variant `often`"));
        bad_type["antithesis_assert"]["assert_type"] = json!("always");
        bad_type["antithesis_assert"]["condition"] = json!("yes");
        assert!(chain(bad_type).contains("antithesis_assert: invalid type"));
        let no_id = json!({"antithesis_assert": {"assert_type": "always", "condition": true, "hit": true, "must_hit": true}});
        assert!(chain(no_id).contains("missing field `id`"));
        assert!(chain(json!({"antithesis_guidance": 3})).starts_with("antithesis_guidance: "));
    }

    #[test]
    fn test_guidance_values() {
        let guidance = |t: &str, data: Value| {
            let json = json!({"antithesis_guidance": {
                "guidance_type": t, "message": "g", "id": "g", "maximize": true,
                "guidance_data": data, "hit": true,
                "location": {"file": "src/g.rs", "begin_line": 3}
            }});
            let SdkRecord::Guidance(g) = SdkRecord::parse(&json).unwrap() else {
                panic!("{json} is guidance");
            };
            g.value()
        };
        assert_eq!(
            guidance("numeric", json!({"left": 10, "right": 3})),
            Some(7.0)
        );
        assert_eq!(guidance("numeric", json!(2.5)), Some(2.5));
        assert_eq!(guidance("numeric", json!({"left": 1})), None);
        assert_eq!(
            guidance("boolean", json!({"a": true, "b": false, "c": true})),
            Some(2.0)
        );
        assert_eq!(guidance("json", json!({"left": 1, "right": 0})), None);
        assert_eq!(guidance("numeric", Value::Null), None);
    }
}
