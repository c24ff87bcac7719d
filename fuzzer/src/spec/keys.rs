//! Where each key of a campaign file is: its line and its text as the user
//! wrote it, so that every error names the file, the key and the user's
//! line (the `[faults]` table included: it is read in place, never printed
//! back to TOML and read again).

use super::SpecError;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml_edit::{ImDocument, Item, TableLike};

/// A key of a campaign file and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub path: PathBuf,
    /// Dotted (`faults.network.duration`); an element of an array with its
    /// index (`faults.exclude[1]`).
    pub key: String,
    /// 1-based; `None`: the key is not in the file (its default applies).
    pub line: Option<usize>,
    /// The value as written (`"10s..20s"`), or the default's text; empty
    /// for a table (`[faults.network.weights]`), which is not repeated.
    pub value: String,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, key, value) = (self.path.display(), &self.key, &self.value);
        match (self.line, value.is_empty()) {
            (Some(line), false) => write!(f, "campaign file {path}, line {line}: {key} = {value}"),
            (Some(line), true) => write!(f, "campaign file {path}, line {line}: {key}"),
            (None, false) => write!(
                f,
                "campaign file {path}: {key} (not set: its default, {value})"
            ),
            (None, true) => write!(f, "campaign file {path}: {key} (not set)"),
        }
    }
}

/// The campaign file's text and its keys' spans.
#[derive(Debug)]
pub(super) struct Keys {
    path: PathBuf,
    text: String,
    /// `None` when the text is not TOML (then the TOML error says where).
    doc: Option<ImDocument<String>>,
}

impl Keys {
    pub(super) fn new(path: &Path, text: &str) -> Self {
        Keys {
            path: path.to_owned(),
            text: text.to_owned(),
            doc: ImDocument::parse(text.to_owned()).ok(),
        }
    }

    fn line_at(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }

    /// The key's span (or its value's) and its value's span.
    fn spans(&self, key: &str) -> Option<(Range<usize>, Option<Range<usize>>)> {
        let (dotted, index) = match key.strip_suffix(']').and_then(|k| k.split_once('[')) {
            Some((k, i)) => (k, Some(i.parse::<usize>().ok()?)),
            None => (key, None),
        };
        let mut table: &dyn TableLike = self.doc.as_ref()?.as_table();
        let mut parts = dotted.split('.').peekable();
        while let Some(part) = parts.next() {
            let (k, item) = table.get_key_value(part)?;
            if parts.peek().is_some() {
                table = item.as_table_like()?;
                continue;
            }
            let key_span = k.span().or_else(|| item.span());
            return match index {
                // A table's span is its header, not a value to repeat.
                None => Some((key_span?, item.as_value().and_then(|v| v.span()))),
                Some(i) => {
                    let element = item.as_array()?.get(i)?.span()?;
                    Some((element.clone(), Some(element)))
                }
            };
        }
        None
    }

    /// Whether the file sets `key`.
    pub(super) fn is_set(&self, key: &str) -> bool {
        self.spans(key).is_some()
    }

    /// `key` where it is, with its text as written, or `default` when the
    /// file does not set it.
    pub(super) fn place(&self, key: &str, default: &dyn fmt::Display) -> Place {
        let found = self.spans(key);
        let line = found.as_ref().map(|(k, _)| self.line_at(k.start));
        let value = match &found {
            Some((_, v)) => v
                .clone()
                .and_then(|v| self.text.get(v))
                .map(|t| t.trim().to_owned())
                .unwrap_or_default(),
            None => default.to_string(),
        };
        Place {
            path: self.path.clone(),
            key: key.to_owned(),
            line,
            value,
        }
    }

    /// `key` in a sentence about another key: `search.slice = "4s" (line
    /// 5)`, or `search.slice (not set: 5s)`.
    pub(super) fn mention(&self, key: &str, default: &dyn fmt::Display) -> String {
        let place = self.place(key, default);
        match place.line {
            Some(line) => format!("{key} = {} (line {line})", place.value),
            None => format!("{key} (not set: {})", place.value),
        }
    }

    /// A refusal of `key`'s value.
    pub(super) fn refuse(
        &self,
        key: &str,
        default: &dyn fmt::Display,
        reason: impl Into<String>,
    ) -> SpecError {
        SpecError::Value {
            place: self.place(key, default),
            reason: reason.into(),
        }
    }

    /// A TOML error (syntax, an unknown key, a value of the wrong type) at
    /// the user's line, with the key it is in.
    pub(super) fn toml_error(&self, error: &toml::de::Error) -> SpecError {
        let span = error.span();
        SpecError::Toml {
            path: self.path.clone(),
            line: span.as_ref().map(|s| self.line_at(s.start)),
            key: span.and_then(|s| self.key_at(s.start)),
            // One line, as every error of the CLI is.
            message: error.message().lines().collect::<Vec<_>>().join(": "),
        }
    }

    /// The deepest key whose name or value holds `offset`.
    fn key_at(&self, offset: usize) -> Option<String> {
        fn find(table: &dyn TableLike, offset: usize, prefix: &str) -> Option<String> {
            for (name, item) in table.iter() {
                let path = if prefix.is_empty() {
                    name.to_owned()
                } else {
                    format!("{prefix}.{name}")
                };
                if let Some(inner) = item.as_table_like() {
                    if let Some(found) = find(inner, offset, &path) {
                        return Some(found);
                    }
                }
                let key_span = table.get_key_value(name).and_then(|(k, _)| k.span());
                let holds = |span: Option<Range<usize>>| span.is_some_and(|s| s.contains(&offset));
                let value = match item {
                    Item::Value(_) => item.span(),
                    _ => None,
                };
                if holds(key_span) || holds(value) {
                    return Some(path);
                }
            }
            None
        }
        find(self.doc.as_ref()?.as_table(), offset, "")
    }
}
