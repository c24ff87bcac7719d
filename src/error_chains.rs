//! A check over the workspace's sources: no error prints its cause twice.
//!
//! The CLI prints an error with its chain of causes (anyhow's `{:#}`,
//! `a: b: c`), so a thiserror variant whose message formats its own
//! `#[source]`/`#[from]` field (or a field named `source`) prints that cause
//! twice: `Is a directory (os error 21): Is a directory (os error 21)`.

use std::path::{Path, PathBuf};

/// The text from `open` (an opening bracket) to its matching close, both
/// included, skipping string and char literals.
fn balanced(text: &str, open: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let (o, c) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        _ => return None,
    };
    let (mut depth, mut i, mut in_str) = (0usize, open, false);
    while i < bytes.len() {
        let b = bytes[i];
        if in_str {
            if b == b'\\' {
                i += 1;
            } else if b == b'"' {
                in_str = false;
            }
        } else if b == b'"' {
            in_str = true;
        } else if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return Some(&text[open..=i]);
            }
        }
        i += 1;
    }
    None
}

/// Splits at commas outside brackets.
fn top_level_fields(body: &str) -> Vec<&str> {
    let inner = &body[1..body.len() - 1];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, b) in inner.bytes().enumerate() {
        match b {
            b'(' | b'{' | b'[' | b'<' => depth += 1,
            b')' | b'}' | b']' | b'>' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The names a message formats: `{name}`, `{0}`, `{name:?}` and `.name` arguments.
fn formatted_names(attribute: &str) -> Vec<String> {
    let mut names = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = attribute;
    while let Some(at) = rest.find('{') {
        rest = &rest[at + 1..];
        if let Some(stripped) = rest.strip_prefix('{') {
            rest = stripped;
            continue;
        }
        let name = ident(rest.trim_start_matches('.'));
        if !name.is_empty() {
            names.push(name);
        }
    }
    // `.field` arguments after the format string.
    if let Some(end) = attribute.rfind('"') {
        for piece in attribute[end..].split('.').skip(1) {
            let name = ident(piece);
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

/// The fields of a variant that are its source: `#[source]`, `#[from]`, or named `source`.
fn source_fields(body: &str) -> Vec<String> {
    let tuple = body.starts_with('(');
    top_level_fields(body)
        .iter()
        .enumerate()
        .filter_map(|(i, field)| {
            let marked = field.contains("#[source]") || field.contains("#[from]");
            let name = if tuple {
                i.to_string()
            } else {
                let decl = field.rsplit(']').next().unwrap_or(field);
                decl.split(':').next().unwrap_or("").trim().to_owned()
            };
            (marked || (!tuple && name == "source")).then_some(name)
        })
        .collect()
}

/// Every variant in `text` whose message formats its source: (line, variant, field).
fn doubled_causes(text: &str) -> Vec<(usize, String, String)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[error(") {
        let start = from + at;
        from = start + 1;
        let Some(attribute) = balanced(text, start + "#[error".len()) else {
            continue;
        };
        if attribute
            .trim_start_matches('(')
            .trim_start()
            .starts_with("transparent")
        {
            continue;
        }
        // Past the attribute, other attributes and doc comments, to the variant.
        let mut rest = &text[start + "#[error".len() + attribute.len() + 1..];
        loop {
            rest = rest.trim_start();
            if rest.starts_with("///") || rest.starts_with("//") {
                rest = rest.split_once('\n').map_or("", |(_, r)| r);
            } else if rest.starts_with("#[") {
                rest = rest.split_once(']').map_or("", |(_, r)| r);
            } else {
                break;
            }
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        let offset = text.len() - after.len();
        let body = match after.chars().next() {
            Some('(' | '{') => balanced(text, offset).unwrap_or(""),
            _ => "",
        };
        if body.is_empty() {
            continue;
        }
        let sources = source_fields(body);
        for used in formatted_names(attribute) {
            if sources.contains(&used) {
                let line = text[..start].lines().count() + 1;
                found.push((line, name.clone(), used));
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with("target") {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn test_the_check_finds_a_message_that_formats_its_source() {
    let text = r#"
        #[error("{}: {source}", path.display())]
        A { path: PathBuf, source: std::io::Error },
        #[error("cannot read: {0}")]
        B(#[from] std::io::Error),
        #[error("manifest {}", .path.display())]
        C { path: PathBuf, #[source] source: Box<E> },
        #[error("{0}")]
        D(String),
        #[error(transparent)]
        E(#[from] std::io::Error),
    "#;
    let found: Vec<String> = doubled_causes(text)
        .into_iter()
        .map(|(_, v, _)| v)
        .collect();
    assert_eq!(found, ["A", "B"]);
}

#[test]
fn test_no_error_in_the_workspace_prints_its_cause_twice() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(root, &mut files);
    assert!(files.len() > 50, "the workspace's sources are found");
    let mut doubled = Vec::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if path.ends_with("src/error_chains.rs") {
            continue;
        }
        for (line, variant, field) in doubled_causes(&text) {
            doubled.push(format!(
                "{}:{line}: {variant} formats its source `{field}`, which the chain prints again",
                path.strip_prefix(root).unwrap_or(&path).display()
            ));
        }
    }
    assert!(doubled.is_empty(), "{}", doubled.join("\n"));
}
