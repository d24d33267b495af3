//! Policy errors: the one error type of the policy module, and the helpers that turn
//! a YAML, glob or validation problem into a message a human can act on.
//!
//! Every message has the same shape, in the ripgrep/globset style:
//!
//! ```text
//! .orchestration/active_intents.yaml:7:5: unknown key "owned_scop" in an intent
//! hint: did you mean "owned_scope"? known keys here: id, name, status, owned_scope (or scope), constraints, acceptance_criteria
//! ```
//!
//! lower-case, the user's input quoted (Rust `{:?}` quoting, so control characters are
//! escaped and cannot garble a terminal or a log line), and a hint line on how to fix it.
//! This file owns the wording; it knows nothing of globs, FUSE or the ledger.

use std::fmt;
use std::path::{Path, PathBuf};

/// The reference every hint can point at.
pub(crate) const REFERENCE: &str = "policies/README.md";

/// A position in a source file. `line` and `column` are 1-based; 0 means "unknown", and
/// the [`fmt::Display`] form then leaves that part out (`file:line` or just `file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcePos {
    /// The file as the user named it (the policy file or `.intentignore`).
    pub file: PathBuf,
    /// 1-based line, 0 when unknown.
    pub line: u64,
    /// 1-based column in characters, 0 when unknown.
    pub column: u64,
}

impl SourcePos {
    pub(crate) fn new(file: &Path, line: u64, column: u64) -> SourcePos {
        SourcePos {
            file: file.to_path_buf(),
            line,
            column,
        }
    }
}

impl fmt::Display for SourcePos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
            if self.column > 0 {
                write!(f, ":{}", self.column)?;
            }
        }
        Ok(())
    }
}

/// Why a policy file or `.intentignore` could not be used.
///
/// `Display` is the complete text to show a human: `FILE:LINE:COL: message` then a
/// `hint: ...` line. Callers (check-policy, the reload watcher, desktop notices) print it
/// as is.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read (missing, permissions, a directory, too large...).
    #[error("{}: cannot read {what}: {}\nhint: {hint}", path.display(), lower_first(&source.to_string()))]
    Read {
        /// The path we tried to read.
        path: PathBuf,
        /// What the file is for ("policy file", ".intentignore").
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
        /// How to fix it.
        hint: String,
    },
    /// The file was read but its content is not a valid policy / ignore file.
    #[error("{at}: {message}\nhint: {hint}")]
    Invalid {
        /// Where the problem is.
        at: SourcePos,
        /// What is wrong, lower-case, quoting the user's input.
        message: String,
        /// How to fix it.
        hint: String,
    },
}

impl PolicyError {
    /// Where the problem is, when it is inside a file's content.
    pub fn position(&self) -> Option<&SourcePos> {
        match self {
            PolicyError::Read { .. } => None,
            PolicyError::Invalid { at, .. } => Some(at),
        }
    }

    /// The hint line's text (without `hint: `).
    pub fn hint(&self) -> &str {
        match self {
            PolicyError::Read { hint, .. } | PolicyError::Invalid { hint, .. } => hint,
        }
    }

    pub(crate) fn invalid(
        file: &Path,
        line: u64,
        column: u64,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> PolicyError {
        PolicyError::Invalid {
            at: SourcePos::new(file, line, column),
            message: message.into(),
            hint: hint.into(),
        }
    }

    pub(crate) fn read(path: &Path, what: &'static str, source: std::io::Error) -> PolicyError {
        let hint = match source.kind() {
            std::io::ErrorKind::NotFound => {
                format!("create it (see policies/example.yaml and {REFERENCE}) or point --policy at an existing file")
            }
            std::io::ErrorKind::PermissionDenied => {
                "make the file readable by the user running intentfs".to_string()
            }
            std::io::ErrorKind::FileTooLarge => {
                "a policy file is a few kilobytes; check that the path names the right file"
                    .to_string()
            }
            _ => "check that the path names a readable regular file".to_string(),
        };
        PolicyError::Read {
            path: path.to_path_buf(),
            what,
            source,
            hint,
        }
    }
}

/// Lower-cases the first character (OS error texts start with a capital).
pub(crate) fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Quotes user input for a message: `"like this"`, with control characters escaped, and
/// clipped to [`QUOTE_MAX`] characters so that a megabyte-long value in a hostile or
/// broken policy cannot make a megabyte-long log line or desktop notice.
pub(crate) fn quote(s: &str) -> String {
    format!("{:?}", clip(s))
}

/// Quotes a rule's own text verbatim (unclipped): rule texts are quoted in the ledger and
/// in `last_error` and must name the rule exactly.
pub(crate) fn quote_verbatim(s: &str) -> String {
    format!("{s:?}")
}

/// Most characters of user input quoted in a message.
pub(crate) const QUOTE_MAX: usize = 120;

/// `s`, or its first [`QUOTE_MAX`] characters followed by `...`.
fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(QUOTE_MAX) {
        None => s.into(),
        Some((i, _)) => format!("{}...", &s[..i]).into(),
    }
}

/// Edit distance between two strings, counted in characters. Small inputs only (keys,
/// enum values), so the plain O(n*m) two-row algorithm is fine.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `input` (case-insensitively), if it is close enough to be a
/// plausible typo: at most 2 edits, or a third of the input's length for long words.
pub(crate) fn closest<'a>(input: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let len = input.chars().count();
    let limit = 2.max(len / 3);
    // The distance is at least the difference in length: skip the O(n*m) computation
    // for candidates that cannot be close (a megabyte-long key or value in a broken
    // policy would otherwise take seconds).
    let candidates: Vec<&'a str> = candidates
        .iter()
        .copied()
        .filter(|c| len.abs_diff(c.chars().count()) <= limit)
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let lowered = input.to_lowercase();
    candidates
        .iter()
        .map(|c| (levenshtein(&lowered, &c.to_lowercase()), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `did you mean "x"? <known>` or just `<known>` when nothing is close.
pub(crate) fn did_you_mean(input: &str, candidates: &[&str], known: &str) -> String {
    match closest(input, candidates) {
        Some(c) => format!("did you mean {}? {known}", quote(c)),
        None => known.to_string(),
    }
}

/// 1-based (line, column-in-characters) of a byte offset in `text`.
pub(crate) fn line_col_of_byte(text: &str, byte: usize) -> (u64, u64) {
    let byte = byte.min(text.len());
    let before = &text.as_bytes()[..byte];
    let line = before.iter().filter(|b| **b == b'\n').count() as u64 + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |p| p + 1);
    // Count characters, not bytes; a lossy view is fine for a column number.
    let col = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count() as u64
        + 1;
    (line, col)
}

/// Best-effort position of the `nth` (0-based) line that starts a mapping key spelled as
/// one of `keys` (`key:` after optional indentation and an optional `- `). Used only when
/// the YAML parser could not tell us where a problem is.
pub(crate) fn find_key(text: &str, keys: &[&str], nth: usize) -> Option<(u64, u64)> {
    let mut seen = 0;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let trimmed = trimmed.strip_prefix("- ").map_or(trimmed, str::trim_start);
        let indent = line.len() - trimmed.len();
        for key in keys {
            let unquoted = trimmed.strip_prefix(key);
            let quoted = trimmed
                .strip_prefix('"')
                .and_then(|t| t.strip_prefix(key))
                .and_then(|t| t.strip_prefix('"'));
            if let Some(rest) = unquoted.or(quoted) {
                if rest.trim_start().starts_with(':') {
                    if seen == nth {
                        return Some((i as u64 + 1, indent as u64 + 1));
                    }
                    seen += 1;
                }
            }
        }
    }
    None
}

/// Describes the keys of a mapping for a hint, listing alternative spellings as
/// `owned_scope (or scope)`.
pub(crate) fn known_keys(expected: &[&str]) -> String {
    let mut out: Vec<String> = Vec::new();
    for key in expected {
        if let Some(primary) = super::schema::primary_spelling(key) {
            if primary != *key {
                continue; // listed with its primary spelling
            }
        }
        match super::schema::alternative_spelling(key) {
            Some(alt) => out.push(format!("{key} (or {alt})")),
            None => out.push((*key).to_string()),
        }
    }
    format!("known keys here: {}", out.join(", "))
}

const LIST_HINT: &str = "write a list: one `- item` per line, or `[\"a\", \"b\"]` on one line";
const SHAPE_HINT: &str = "check the shape and indentation: the file and each intent are mappings \
                          (`key: value`), and owned_scope, constraints, acceptance_criteria and \
                          sensitive are lists of plain text values";

/// Turns a serde-saphyr error into a [`PolicyError`] with file, line and column.
pub(crate) fn from_yaml(err: &serde_saphyr::Error, text: &str, file: &Path) -> PolicyError {
    use serde_saphyr::Error as E;
    use serde_saphyr::MessageFormatter;

    // Alias and snippet wrappers carry the real error inside; the location of the
    // wrapper is where the alias was *used*, which is what the user should look at.
    let mut inner = err;
    while let E::AliasError { error, .. } | E::WithSnippet { error, .. } = inner {
        inner = error;
    }
    let (line, column) = err
        .location()
        .or_else(|| inner.location())
        .map_or((0, 0), |l| (l.line(), l.column()));
    // The formatter's text may embed user input verbatim; escape control characters so
    // the message stays one line and cannot garble a terminal.
    let generic: String = lower_first(&serde_saphyr::DefaultMessageFormatter.format_message(inner))
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_debug().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    // The parser's own text may quote a whole scalar; keep the message readable.
    let generic = match generic.char_indices().nth(4 * QUOTE_MAX) {
        None => generic,
        Some((i, _)) => format!("{}...", &generic[..i]),
    };

    match inner {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            let context = super::schema::context_of(expected);
            PolicyError::invalid(
                file,
                line,
                column,
                format!("unknown key {} {context}", quote(field)),
                format!(
                    "{}; unknown keys are errors so that a typo never silently empties a scope",
                    did_you_mean(field, expected, &known_keys(expected))
                ),
            )
        }
        E::SerdeMissingField { field, .. } => PolicyError::invalid(
            file,
            line,
            column,
            format!("missing key {}", quote(field)),
            format!("add `{field}:`; see {REFERENCE}"),
        ),
        E::Unexpected { expected, .. } => {
            let (what, hint) = if expected.contains("sequence") {
                ("a list", LIST_HINT)
            } else if expected.contains("mapping") {
                ("a mapping (`key: value` lines)", SHAPE_HINT)
            } else {
                ("a plain text value", SHAPE_HINT)
            };
            PolicyError::invalid(file, line, column, format!("expected {what} here"), hint)
        }
        E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::AliasReplayCounterOverflow { .. } => PolicyError::invalid(
            file,
            line,
            column,
            format!("too many yaml alias expansions: {generic}"),
            "anchors and aliases (&name / *name) may only be used sparingly in a policy; \
             write the lists out plainly (this limit stops \"billion laughs\" alias bombs)",
        ),
        E::DuplicateMappingKey { key, .. } => PolicyError::invalid(
            file,
            line,
            column,
            match key {
                Some(k) => format!("duplicate key {}", quote(k)),
                None => "duplicate key".to_string(),
            },
            "each key may appear once per mapping; merge the two entries",
        ),
        E::MultipleDocuments { .. }
        | E::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Documents { .. },
            ..
        } => PolicyError::invalid(
            file,
            line,
            column,
            "more than one yaml document (a `---` separator) in the policy file",
            "put everything in one document: remove the `---` line",
        ),
        E::Budget { breach, .. } => PolicyError::invalid(
            file,
            line,
            column,
            format!("the policy exceeds the yaml resource limits ({breach:?})"),
            "a policy file needs no more than a few thousand entries and few aliases; \
             write the lists out plainly (this limit also stops \"billion laughs\" alias bombs)",
        ),
        E::Message { msg, .. } if msg.starts_with("duplicate field `") => {
            // serde reports a key given under two spellings (`intents` and
            // `active_intents`) without a position; find the second spelling ourselves.
            let key = msg
                .trim_start_matches("duplicate field `")
                .trim_end_matches('`')
                .to_string();
            let spellings: Vec<&str> = std::iter::once(key.as_str())
                .chain(super::schema::alternative_spelling(&key))
                .collect();
            let (line, column) = find_key(text, &spellings, 1).unwrap_or((line, column));
            PolicyError::invalid(
                file,
                line,
                column,
                format!("key {} is given twice", quote(&key)),
                if spellings.len() > 1 {
                    format!(
                        "{} are two spellings of the same key; keep only one",
                        spellings
                            .iter()
                            .map(|s| quote(s))
                            .collect::<Vec<_>>()
                            .join(" and ")
                    )
                } else {
                    "each key may appear once per mapping; merge the two entries".to_string()
                },
            )
        }
        E::SerdeInvalidType { expected, .. } if expected.contains("sequence") => {
            PolicyError::invalid(file, line, column, generic.clone(), LIST_HINT)
        }
        // The YAML scanner's own nesting guard (before our depth budget can see it).
        _ if generic.contains("recursion limit exceeded") => PolicyError::invalid(
            file,
            line,
            column,
            "the policy is nested too deeply (yaml recursion limit exceeded)",
            "a policy is at most a few levels deep (intents, then each intent's lists); \
             check for runaway brackets or indentation",
        ),
        _ => PolicyError::invalid(
            file,
            line,
            column,
            generic,
            format!("fix the yaml at this position; the format is described in {REFERENCE}"),
        ),
    }
}
