//! The policy: what the human allows. Pure: YAML text in, a validated and compiled
//! [`Policy`] out, plus the compiled [`IntentIgnore`].
//!
//! - `schema.rs`: the YAML as written (serde structs, key spellings, resource budget).
//! - `compile.rs`: glob semantics and compiled matchers that report the deciding rule.
//! - `ignore.rs`: `.intentignore` (gitignore syntax).
//! - `error.rs`: [`PolicyError`] and the wording of every message.
//! - this file: validation (raw -> [`Policy`]) and the public API.
//!
//! This module knows nothing of FUSE, identities, the ledger or approvals: it answers
//! "is this path in this intent's scope / sensitive / ignored, and by which rule?".
//! It does no I/O beyond reading the policy file and `.intentignore`. The rule texts it
//! returns (`owned_scope "src/auth/**" of INT-001`, `.intentignore:3 "secrets/"`,
//! `sensitive default "*.pem"`) are meant to be quoted verbatim in the ledger and in
//! `last_error`.
//!
//! Paths given to the matchers are workspace-relative (`src/auth/x.ts`, no leading `/`;
//! the empty path is the workspace root) and are matched as bytes, so non-UTF-8 names
//! work. See `compile.rs` (or `policies/README.md`) for the glob semantics.

mod compile;
mod error;
pub mod git;
mod ignore;
mod schema;
#[cfg(test)]
mod tests;
pub mod versions;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_saphyr::{Location, Spanned};

pub use compile::SENSITIVE_DEFAULTS;
pub use error::{PolicyError, SourcePos};
pub use ignore::{IntentIgnore, INTENTIGNORE};
pub use versions::VersionPolicy;

use compile::{RuleSet, RuleSetBuilder};
use error::{did_you_mean, line_col_of_byte, quote, quote_verbatim};

/// An intent's lifecycle state. Only [`Status::InProgress`] can be selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// `IN_PROGRESS`: agents may select it and work in its scope.
    InProgress,
    /// `PAUSED`: listed, not selectable.
    Paused,
    /// `DONE`: listed, not selectable.
    Done,
}

impl Status {
    const NAMES: [&'static str; 3] = ["IN_PROGRESS", "PAUSED", "DONE"];

    /// The spelling used in the policy file, e.g. `IN_PROGRESS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "IN_PROGRESS",
            Status::Paused => "PAUSED",
            Status::Done => "DONE",
        }
    }

    fn parse(s: &str) -> Option<Status> {
        match s {
            "IN_PROGRESS" => Some(Status::InProgress),
            "PAUSED" => Some(Status::Paused),
            "DONE" => Some(Status::Done),
            _ => None,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `approval.out_of_scope`: what happens to a mutation outside the intent's scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutOfScope {
    /// Refuse it (`SCOPE_VIOLATION`). The default.
    Deny,
    /// Ask a human.
    Ask,
}

/// `approval.sensitive_read`: what happens when an agent reads a sensitive path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SensitiveRead {
    /// Refuse it (`SENSITIVE_READ`).
    Deny,
    /// Ask a human. The default.
    Ask,
    /// Allow it (still ledgered).
    Allow,
}

/// `approval.delete`: what happens to an in-scope delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteRule {
    /// Allow it. The default.
    Allow,
    /// Ask a human.
    Ask,
}

/// The `approval:` section. Validated here, enforced by the guard and approval broker.
#[derive(Clone, Debug)]
pub struct ApprovalPolicy {
    /// Mutations outside the scope (default [`OutOfScope::Deny`]).
    pub out_of_scope: OutOfScope,
    /// Reads of sensitive paths (default [`SensitiveRead::Ask`]).
    pub sensitive_read: SensitiveRead,
    /// Deletes inside the scope (default [`DeleteRule::Allow`]).
    pub delete: DeleteRule,
    /// Seconds a blocked request waits for a human before it is rejected; 1..=86400,
    /// default 60.
    pub timeout_s: u64,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            out_of_scope: OutOfScope::Deny,
            sensitive_read: SensitiveRead::Ask,
            delete: DeleteRule::Allow,
            timeout_s: 60,
        }
    }
}

/// One validated intent.
#[derive(Clone, Debug)]
pub struct Intent {
    /// Unique, non-empty, without whitespace or control characters.
    pub id: String,
    /// Human-readable name (may be empty).
    pub name: String,
    /// Lifecycle state.
    pub status: Status,
    /// Scope globs exactly as written in the policy.
    pub owned_scope: Vec<String>,
    /// Free-text constraints for the agent.
    pub constraints: Vec<String>,
    /// Free-text acceptance criteria for the agent.
    pub acceptance_criteria: Vec<String>,
    /// `owned_scope`, compiled.
    scope: RuleSet,
}

impl Intent {
    /// Whether an agent may select this intent (status `IN_PROGRESS`).
    pub fn selectable(&self) -> bool {
        self.status == Status::InProgress
    }

    /// The deciding rule, e.g. `owned_scope "src/auth/**" of INT-001`, when the
    /// workspace-relative `rel` is inside this intent's scope. When several globs match,
    /// the first one written wins. The workspace root (empty path) is only inside `**`.
    pub fn scope_match(&self, rel: &Path) -> Option<String> {
        self.scope.matched(rel).map(str::to_owned)
    }

    /// Directories this intent's globs name before their first wildcard, and their
    /// parents (`crate` and `crate/src` for `crate/src/**`, `src` and `src/middleware` for
    /// `src/middleware/jwt.ts`): making them is part of working in the scope, though the
    /// globs may not match the directories themselves.
    pub fn implies_dir(&self, dir: &Path) -> bool {
        !dir.as_os_str().is_empty()
            && self.owned_scope.iter().any(|g| {
                let g = g.trim_start_matches("./");
                let lit = match g.strip_suffix('/') {
                    Some(d) if !compile::has_meta(d) => d,
                    _ => compile::literal_dirs(g),
                };
                Path::new(lit).starts_with(dir)
            })
    }

    /// Whether `dir` may hold a tool's temporary or companion file next to something in
    /// this intent's scope: the directory an in-scope file is in (`src/middleware` for
    /// `src/middleware/jwt.ts`, `docs` for `docs/*.md`, the root for `README.md`), the
    /// parent of an in-scope directory (the root for `target/`: cargo makes `target7NaLVN`
    /// and renames it), or a directory a glob's wildcards may reach.
    pub fn companion_dir(&self, dir: &Path) -> bool {
        self.owned_scope.iter().any(|g| {
            let g = g.trim_start_matches("./");
            if let Some(d) = g.strip_suffix('/').filter(|d| !compile::has_meta(d)) {
                // `X/`: X and everything below are in scope; a sibling of X goes in its parent.
                return Path::new(d).parent() == Some(dir);
            }
            let lit = compile::literal_dirs(g);
            let rest = g[lit.len()..].trim_start_matches('/');
            let lit = Path::new(lit);
            if rest.starts_with("**") {
                return dir.starts_with(lit);
            }
            if rest.contains('/') {
                return dir.starts_with(lit);
            }
            dir == lit
        })
    }

    /// Whether a new entry `name` in `dir` may be a tool's temporary for this intent: `dir`
    /// is a companion directory, and the name is one tools give temporaries — derived from
    /// an in-scope name there (`main.rs.bak`, `hello.tmpc8756b4`, `.jwt.ts.swp`, `#x#`,
    /// `x~`, `target7NaLVN` for `target/`), or, for a file, a random temporary name
    /// (`sedAb12Cd`, perl's `XXAb12Cd`, Python's `tmpab_12cd3`, vim's `4913`). An ordinary
    /// name (`other.ts`) is not, nor any other hidden name: `.npmrc`, `.cargo/` or `.envrc`
    /// next to the scope would be read by the human's tools while they exist.
    pub fn temp_name(&self, dir: &Path, name: &str, is_dir: bool) -> bool {
        if !self.companion_dir(dir) || name.is_empty() {
            return false;
        }
        let alnum =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_alphanumeric());
        let random = !is_dir
            && (name.bytes().all(|b| b.is_ascii_digit())
                || name.strip_prefix("sed").is_some_and(|r| alnum(r, 6))
                || name.strip_prefix("XX").is_some_and(|r| alnum(r, 6))
                || name.strip_prefix("tmp").is_some_and(|r| {
                    r.len() >= 6 && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                }));
        if random {
            return true;
        }
        let in_scope = |n: &str| !n.is_empty() && self.scope_match(&dir.join(n)).is_some();
        // `<in-scope name>` with a suffix (`.bak`, `.tmpXXXX`, `.12345`, `~`, `#`), and a
        // prefix (`.`, `#`, `.#`): editors' swap, backup and lock files.
        let core = name.trim_start_matches(['.', '#']);
        let derived = core
            .char_indices()
            .filter(|(i, c)| *i > 0 && matches!(c, '.' | '~' | '-' | '#'))
            .any(|(i, _)| in_scope(&core[..i]))
            || (core != name && in_scope(core.trim_end_matches('#')));
        // `<in-scope directory><6 random>`: a sibling made to be renamed onto it.
        let sibling = name.len() > 6
            && name.is_char_boundary(name.len() - 6)
            && alnum(&name[name.len() - 6..], 6)
            && in_scope(&name[..name.len() - 6]);
        derived || sibling
    }

    /// The `<intent_context>` block served by `.intentfs/context`, ready to paste into a
    /// prompt. Text is XML-escaped; characters XML 1.0 forbids become U+FFFD. Empty lists
    /// are written as empty elements (`<constraints/>`). Ends with a newline.
    pub fn context_xml(&self) -> String {
        let mut out = String::from("<intent_context>\n");
        let _ = writeln!(out, "  <id>{}</id>", xml_escape(&self.id));
        let _ = writeln!(out, "  <name>{}</name>", xml_escape(&self.name));
        let _ = writeln!(out, "  <status>{}</status>", self.status);
        xml_list(&mut out, "owned_scope", "glob", &self.owned_scope);
        xml_list(&mut out, "constraints", "constraint", &self.constraints);
        xml_list(
            &mut out,
            "acceptance_criteria",
            "criterion",
            &self.acceptance_criteria,
        );
        out.push_str(ON_REFUSAL);
        out.push_str("</intent_context>\n");
        out
    }
}

/// What `<intent_context>` tells the agent to do when an operation is refused.
pub const ON_REFUSAL: &str =
    "  <on_refusal>An operation refused with \"Permission denied\" (EACCES) or \
\"Operation not permitted\" was refused by intentfs: read .intentfs/last_error (JSON: code, path, \
message, remedy) and follow its remedy instead of retrying.</on_refusal>\n";

fn xml_list(out: &mut String, outer: &str, inner: &str, items: &[String]) {
    if items.is_empty() {
        let _ = writeln!(out, "  <{outer}/>");
        return;
    }
    let _ = writeln!(out, "  <{outer}>");
    for item in items {
        let _ = writeln!(out, "    <{inner}>{}</{inner}>", xml_escape(item));
    }
    let _ = writeln!(out, "  </{outer}>");
}

/// Escapes text for an XML element body (and attributes, to be safe).
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A validated, compiled policy. Cheap to share behind an `Arc`; immutable (a reload
/// builds a new one, and a reload that fails keeps the old one).
#[derive(Clone, Debug)]
pub struct Policy {
    /// The intents, in file order.
    intents: Vec<Intent>,
    /// id -> index in `intents`.
    by_id: HashMap<String, usize>,
    /// The `approval:` section, defaults filled in.
    approval: ApprovalPolicy,
    /// The built-in sensitive patterns (secrets by kind).
    sensitive_defaults: RuleSet,
    /// The policy's `sensitive:` globs.
    sensitive: RuleSet,
    /// The file the policy came from (empty for [`Policy::empty`]).
    source: PathBuf,
    /// `lessons_file:`, when the policy names one.
    lessons_file: Option<PathBuf>,
    /// `output:` globs (build output, ledgered as summaries).
    output: RuleSet,
    /// `versions:`: what the content store keeps.
    versions: VersionPolicy,
    /// `git: read-only`: no agent writes any git directory (see [`Policy::git_read_only`]).
    git_read_only: bool,
}

impl Policy {
    /// Reads and parses the policy file at `path`.
    ///
    /// # Errors
    /// [`PolicyError::Read`] naming the path and the OS error when the file cannot be
    /// read (or is over 4 MiB); [`PolicyError::Invalid`] as for [`Policy::parse`].
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let what = "policy file";
        let file = std::fs::File::open(path).map_err(|e| PolicyError::read(path, what, e))?;
        let mut bytes = Vec::new();
        file.take(schema::MAX_POLICY_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| PolicyError::read(path, what, e))?;
        if bytes.len() > schema::MAX_POLICY_BYTES {
            return Err(too_large(path));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            let valid = e.utf8_error().valid_up_to();
            let (line, column) = line_col_of_byte(&String::from_utf8_lossy(e.as_bytes()), valid);
            PolicyError::invalid(
                path,
                line,
                column,
                "the policy file is not valid utf-8",
                "save it as utf-8 text",
            )
        })?;
        Policy::parse(&text, path)
    }

    /// Parses and validates policy `text`; `origin` names the file in messages.
    ///
    /// # Errors
    /// [`PolicyError::Invalid`] with file, line and column for YAML errors, unknown
    /// keys, bad values, duplicate ids, bad globs, and resource-limit breaches.
    pub fn parse(text: &str, origin: &Path) -> Result<Policy, PolicyError> {
        if text.len() > schema::MAX_POLICY_BYTES {
            return Err(too_large(origin));
        }
        // A file with no document at all is almost always a write caught half-way (an
        // editor's truncate-then-write) or a mistake; reading it as "no intents" would
        // silently refuse every write. A policy with no intents is `active_intents: []`.
        let blank = text.lines().all(|l| {
            let t = l.trim();
            t.is_empty() || t.starts_with('#') || t == "---" || t == "..."
        });
        if blank {
            return Err(PolicyError::invalid(
                origin,
                1,
                1,
                "the policy file is empty (no YAML document)",
                "write the policy (policies/example.yaml in the intentfs source shows one), or `active_intents: []` for a policy with no intents",
            ));
        }
        let raw = schema::parse_raw(text).map_err(|e| error::from_yaml(&e, text, origin))?;
        build(raw, origin)
    }

    /// No intents (nothing is selectable), default approval settings, default
    /// sensitive patterns.
    pub fn empty() -> Policy {
        Policy {
            intents: Vec::new(),
            by_id: HashMap::new(),
            approval: ApprovalPolicy::default(),
            sensitive_defaults: sensitive_defaults(),
            sensitive: RuleSet::empty(),
            source: PathBuf::new(),
            lessons_file: None,
            output: RuleSet::empty(),
            versions: VersionPolicy::default(),
            git_read_only: false,
        }
    }

    /// `git: read-only`: agents may read git's internals (log, diff, status, blame) but
    /// not write them: no commit, branch, stash or rebase through the mount. For an
    /// operator who commits the agents' work themselves and wants none of git's state in
    /// the agents' hands (see docs/security.md: what the checks of git's internals do not
    /// cover).
    pub fn git_read_only(&self) -> bool {
        self.git_read_only
    }

    /// All intents, in file order, whatever their status.
    pub fn intents(&self) -> &[Intent] {
        &self.intents
    }

    /// The intent with exactly this id.
    pub fn intent(&self, id: &str) -> Option<&Intent> {
        self.by_id.get(id).map(|&i| &self.intents[i])
    }

    /// The approval settings.
    pub fn approval(&self) -> &ApprovalPolicy {
        &self.approval
    }

    /// The `output:` glob that `rel` is build output under, quoted, if any: its mutations
    /// are governed as usual and ledgered as summaries.
    pub fn output_match(&self, rel: &Path) -> Option<&str> {
        self.output.matched(rel)
    }

    /// The `versions:` section (defaults when absent).
    pub fn versions(&self) -> &VersionPolicy {
        &self.versions
    }

    /// The lessons file the policy names (`lessons_file:`), if it names one.
    pub fn lessons_file(&self) -> Option<&Path> {
        self.lessons_file.as_deref()
    }

    /// The deciding rule when `rel` is sensitive (reading it needs a human's approval):
    /// `sensitive default "*.pem"` or `sensitive "config/prod/**" (policy line 12)`.
    /// Defaults match the file name at any depth, case-insensitively; the policy's own
    /// globs are anchored at the workspace root and case-sensitive, like scope globs.
    pub fn sensitive_match(&self, rel: &Path) -> Option<String> {
        self.sensitive_defaults
            .matched(rel)
            .filter(|_| !compile::is_env_example(rel))
            .or_else(|| self.sensitive.matched(rel))
            .map(str::to_owned)
    }

    /// The file this policy came from (empty for [`Policy::empty`]).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// A plain-text table for `intentfs check-policy`: a header, then one row per
    /// intent with id, status, name and scope globs. Control characters are escaped.
    pub fn summary_table(&self) -> String {
        if self.intents.is_empty() {
            return "no intents: nothing can be selected, every mutation will be refused\n"
                .to_string();
        }
        let header = ["ID", "STATUS", "NAME", "SCOPE"];
        let rows: Vec<[String; 4]> = self
            .intents
            .iter()
            .map(|i| {
                let scope = if i.owned_scope.is_empty() {
                    "(empty: no writes)".to_string()
                } else {
                    i.owned_scope
                        .iter()
                        .map(|g| printable(g))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                [
                    printable(&i.id),
                    i.status.to_string(),
                    printable(&i.name),
                    scope,
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let mut line = |cells: [&str; 4]| {
            let mut l = String::new();
            for (k, cell) in cells.iter().enumerate() {
                if k == 3 {
                    l.push_str(cell); // last column: no padding
                } else {
                    let _ = write!(l, "{cell:<width$}  ", width = widths[k]);
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(header);
        for row in &rows {
            line([&row[0], &row[1], &row[2], &row[3]]);
        }
        out
    }
}

/// Escapes control characters so a policy cannot garble a terminal.
fn printable(s: &str) -> String {
    if s.chars().any(char::is_control) {
        s.chars().flat_map(char::escape_debug).collect()
    } else {
        s.to_string()
    }
}

fn too_large(origin: &Path) -> PolicyError {
    PolicyError::invalid(
        origin,
        0,
        0,
        format!(
            "the policy file is larger than {} MiB",
            schema::MAX_POLICY_BYTES >> 20
        ),
        "a policy file is a few kilobytes; check that the path names the right file",
    )
}

/// (line, column) of a value, or of `fallback` when the parser could not tell.
fn pos(loc: &Location, fallback: &Location) -> (u64, u64) {
    if loc.line() > 0 {
        (loc.line(), loc.column())
    } else {
        (fallback.line(), fallback.column())
    }
}

/// Validates the raw file and compiles its globs.
fn build(raw: schema::RawPolicy, origin: &Path) -> Result<Policy, PolicyError> {
    let err = |(line, column): (u64, u64), message: String, hint: String| {
        PolicyError::invalid(origin, line, column, message, hint)
    };

    let mut intents = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    let mut first_line: HashMap<String, u64> = HashMap::new();
    for Spanned {
        value: ri,
        referenced: at,
        ..
    } in raw.intents.unwrap_or_default()
    {
        let Some(Spanned {
            value: id,
            referenced: id_at,
            ..
        }) = ri.id
        else {
            return Err(err(
                pos(&at, &at),
                "intent has no \"id\" key".into(),
                "every intent needs a unique id, e.g. `id: INT-001`".into(),
            ));
        };
        let id_pos = pos(&id_at, &at);
        if id.is_empty() {
            return Err(err(
                id_pos,
                "empty intent id".into(),
                "give every intent a unique id, e.g. `id: INT-001`".into(),
            ));
        }
        if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err(
                id_pos,
                format!(
                    "intent id {} contains whitespace or control characters",
                    quote(&id)
                ),
                "ids are written to .intentfs/intent and quoted in the ledger; \
                 use letters, digits, '-', '_' or '.', e.g. `id: INT-001`"
                    .into(),
            ));
        }
        if let Some(first) = first_line.get(&id) {
            return Err(err(
                id_pos,
                format!("duplicate intent id {}", quote(&id)),
                format!(
                    "intent ids must be unique; {} is first used on line {first}",
                    quote(&id)
                ),
            ));
        }
        first_line.insert(id.clone(), id_pos.0);

        let Some(raw_status) = ri.status else {
            return Err(err(
                pos(&at, &at),
                format!("intent {id} has no \"status\" key"),
                "add `status: IN_PROGRESS` (selectable), `PAUSED` or `DONE`".into(),
            ));
        };
        let status =
            Status::parse(&raw_status.value).ok_or_else(|| {
                err(
                pos(&raw_status.referenced, &at),
                format!("unknown status {} for intent {id}", quote(&raw_status.value)),
                did_you_mean(
                    &raw_status.value,
                    &Status::NAMES,
                    "status is one of IN_PROGRESS, PAUSED, DONE (only IN_PROGRESS can be selected)",
                ),
            )
            })?;

        let mut scope = RuleSetBuilder::new();
        let mut owned_scope = Vec::new();
        for glob in ri.owned_scope.unwrap_or_default() {
            let glob_pos = pos(&glob.referenced, &at);
            let pattern = glob.value;
            let in_intent = |p: compile::GlobProblem| {
                err(glob_pos, format!("{} (intent {id})", p.message), p.hint)
            };
            let globs = compile::expand(&pattern, "owned_scope").map_err(in_intent)?;
            let rule = format!("owned_scope {} of {id}", quote_verbatim(&pattern));
            scope
                .add(&pattern, &globs, rule, false)
                .map_err(in_intent)?;
            owned_scope.push(pattern);
        }
        let scope = scope
            .build()
            .map_err(|p| err(pos(&at, &at), p.message, p.hint))?;

        by_id.insert(id.clone(), intents.len());
        intents.push(Intent {
            id,
            name: ri.name.unwrap_or_default(),
            status,
            owned_scope,
            constraints: ri.constraints.unwrap_or_default(),
            acceptance_criteria: ri.acceptance_criteria.unwrap_or_default(),
            scope,
        });
    }

    // The policy's own glob lists (`sensitive:`, `output:`): anchored, case-sensitive,
    // each rule quoted with its key and line.
    let glob_rules =
        |list: Option<Vec<Spanned<String>>>, key: &str| -> Result<RuleSet, PolicyError> {
            let mut b = RuleSetBuilder::new();
            for glob in list.unwrap_or_default() {
                let glob_pos = (glob.referenced.line(), glob.referenced.column());
                let pattern = glob.value;
                let problem = |p: compile::GlobProblem| err(glob_pos, p.message, p.hint);
                let globs = compile::expand(&pattern, key).map_err(problem)?;
                let rule = format!(
                    "{key} {} (policy line {})",
                    quote_verbatim(&pattern),
                    glob_pos.0
                );
                b.add(&pattern, &globs, rule, false).map_err(problem)?;
            }
            b.build().map_err(|p| err((0, 0), p.message, p.hint))
        };
    let sensitive = glob_rules(raw.sensitive, "sensitive")?;

    let approval = match raw.approval {
        None => ApprovalPolicy::default(),
        Some(Spanned {
            value: ra,
            referenced: at,
            ..
        }) => build_approval(ra, &at, origin)?,
    };

    let output = glob_rules(raw.output, "output")?;
    let versions = versions::build(raw.versions, origin, glob_rules)?;
    let git_read_only = match raw.git {
        None => false,
        Some(g) => match g.value.as_str() {
            "writable" => false,
            "read-only" => true,
            other => {
                return Err(err(
                    (g.referenced.line(), g.referenced.column()),
                    format!("unknown git value {}", quote(other)),
                    did_you_mean(
                        other,
                        &["writable", "read-only"],
                        "git is `writable` (agents may commit; the default) or `read-only` (agents read git's internals but write none)",
                    ),
                ))
            }
        },
    };
    let lessons_file = match raw.lessons_file {
        None => None,
        Some(l) => {
            let p = PathBuf::from(&l.value);
            let plain = !p.as_os_str().is_empty()
                && p.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain {
                return Err(err(
                    (l.referenced.line(), l.referenced.column()),
                    format!("lessons_file {} is not a workspace-relative path", quote(&l.value)),
                    "write a path relative to the workspace root, without `..`, e.g. `lessons_file: CLAUDE.md`".into(),
                ));
            }
            Some(p)
        }
    };

    Ok(Policy {
        intents,
        by_id,
        approval,
        sensitive_defaults: sensitive_defaults(),
        sensitive,
        source: origin.to_path_buf(),
        lessons_file,
        output,
        versions,
        git_read_only,
    })
}

/// The built-in sensitive patterns, compiled.
fn sensitive_defaults() -> RuleSet {
    let mut b = RuleSetBuilder::new();
    compile::add_sensitive_defaults(&mut b);
    b.build().unwrap_or_else(|_| RuleSet::empty())
}

/// Validates the `approval:` section.
fn build_approval(
    ra: schema::RawApproval,
    at: &Location,
    origin: &Path,
) -> Result<ApprovalPolicy, PolicyError> {
    /// Looks `value` up in `choices`, or explains what `key` accepts.
    fn choose<T: Copy>(
        key: &str,
        value: Option<Spanned<String>>,
        choices: &[(&str, T)],
        default: T,
        at: &Location,
        origin: &Path,
    ) -> Result<T, PolicyError> {
        let Some(value) = value else {
            return Ok(default);
        };
        if let Some((_, v)) = choices.iter().find(|(name, _)| *name == value.value) {
            return Ok(*v);
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let (line, column) = pos(&value.referenced, at);
        Err(PolicyError::invalid(
            origin,
            line,
            column,
            format!("unknown approval {key} value {}", quote(&value.value)),
            did_you_mean(
                &value.value,
                &names,
                &format!("approval {key} is one of {}", names.join(", ")),
            ),
        ))
    }
    let d = ApprovalPolicy::default();
    let out_of_scope = choose(
        "out_of_scope",
        ra.out_of_scope,
        &[("deny", OutOfScope::Deny), ("ask", OutOfScope::Ask)],
        d.out_of_scope,
        at,
        origin,
    )?;
    let sensitive_read = choose(
        "sensitive_read",
        ra.sensitive_read,
        &[
            ("deny", SensitiveRead::Deny),
            ("ask", SensitiveRead::Ask),
            ("allow", SensitiveRead::Allow),
        ],
        d.sensitive_read,
        at,
        origin,
    )?;
    let delete = choose(
        "delete",
        ra.delete,
        &[("allow", DeleteRule::Allow), ("ask", DeleteRule::Ask)],
        d.delete,
        at,
        origin,
    )?;
    let timeout_s = match ra.timeout_s {
        None => d.timeout_s,
        Some(t) => match t.value.trim().parse::<u64>() {
            Ok(n) if (1..=86_400).contains(&n) => n,
            _ => {
                let (line, column) = pos(&t.referenced, at);
                return Err(PolicyError::invalid(
                    origin,
                    line,
                    column,
                    format!(
                        "approval timeout_s must be a whole number of seconds from 1 to 86400, got {}",
                        quote(&t.value)
                    ),
                    "e.g. `timeout_s: 60`; when it expires the waiting request is rejected",
                ));
            }
        },
    };
    Ok(ApprovalPolicy {
        out_of_scope,
        sensitive_read,
        delete,
        timeout_s,
    })
}
