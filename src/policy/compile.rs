//! Globs: how a pattern written in the policy becomes a compiled matcher that answers
//! "does this workspace-relative path match, and which rule decided?".
//!
//! Semantics (the reference is `policies/README.md`):
//!
//! - Patterns are anchored at the workspace root exactly as written and use `/`.
//!   `*.md` matches `README.md` but not `docs/x.md`; write `**/*.md` for any depth.
//! - `*` (and `?`, `[...]`) never cross `/`; `**` does (globset `literal_separator`).
//!   `{a,b}` alternation works.
//! - A pattern ending in `/` means that directory and everything below it: `dir/` is
//!   compiled as both `dir` and `dir/**`. Note that `dir/**` alone matches what is inside
//!   `dir` but not `dir` itself.
//! - A leading `./` is dropped. A leading `/`, a `..` component, or an empty / `.`
//!   component in the middle is an error: such a pattern is either outside the workspace
//!   or can never match a normalized relative path.
//! - The empty path (the workspace root) matches only the pattern `**` (globset alone
//!   would also let `**/*` match it).
//!
//! Matching works on the path's bytes, so non-UTF-8 names match like any other.
//! This file knows nothing of YAML or intents; callers pass the rule text to report.

use std::borrow::Cow;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{Candidate, GlobBuilder, GlobSet, GlobSetBuilder};

use super::error::{quote, quote_verbatim};

/// The sensitive defaults. Each matches the file name at any depth (compiled as
/// `**/PATTERN`), case-insensitively.
pub const SENSITIVE_DEFAULTS: &[&str] = &[
    // dotenv files (`.env.example` and `.env.sample` are not: see `is_env_example`)
    ".env",
    ".env.*",
    // private keys and key stores
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "*.p12",
    "*.pfx",
    // credential files
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".aws/credentials",
    "credentials.json",
    ".docker/config.json",
];

/// Templates of dotenv files, meant to be read: `.env.example`, `.env.sample`,
/// `.env.template`.
pub fn is_env_example(rel: &Path) -> bool {
    rel.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        let n = n.to_ascii_lowercase();
        matches!(
            n.as_str(),
            ".env.example" | ".env.sample" | ".env.template" | ".env.dist"
        )
    })
}

/// What is wrong with a pattern, worded for [`super::PolicyError`].
#[derive(Debug)]
pub(crate) struct GlobProblem {
    pub message: String,
    pub hint: String,
}

/// Turns a pattern as written into the glob strings to compile (one, or two for a
/// trailing `/`). `key` names the list it came from, for messages.
pub(crate) fn expand(pattern: &str, key: &str) -> Result<Vec<String>, GlobProblem> {
    let problem = |message: String, hint: &str| GlobProblem {
        message,
        hint: hint.to_string(),
    };
    if pattern.starts_with('/') {
        return Err(problem(
            format!("{key} glob {} starts with \"/\"", quote(pattern)),
            "scope globs are relative to the workspace root; drop the leading /",
        ));
    }
    let mut body = pattern;
    while let Some(rest) = body.strip_prefix("./") {
        body = rest;
    }
    let is_dir = body.ends_with('/');
    let body = body.strip_suffix('/').unwrap_or(body);
    if body.trim().is_empty() {
        return Err(problem(
            format!("empty {key} glob {}", quote(pattern)),
            "write the path the glob should match, relative to the workspace root; \
             \"**\" matches the whole workspace",
        ));
    }
    for component in body.split('/') {
        if component == ".." {
            return Err(problem(
                format!("{key} glob {} contains a \"..\" component", quote(pattern)),
                "globs cannot reach outside the workspace or climb back up; \
                 write the path from the workspace root, e.g. \"src/auth/**\"",
            ));
        }
        if component.is_empty() || component == "." {
            return Err(problem(
                format!(
                    "{key} glob {} contains an empty or \".\" component",
                    quote(pattern)
                ),
                "paths are matched in normal form; remove the \"//\" or \"/./\"",
            ));
        }
    }
    let mut globs = vec![body.to_string()];
    if is_dir {
        globs.push(format!("{body}/**"));
    }
    Ok(globs)
}

/// A set of rules, each compiled from one or more globs, that reports the first rule
/// (in declaration order) matching a path.
///
/// Globs are grouped by their literal leading directories (`src/auth` for
/// `src/auth/**`, `pkg/p1` for `pkg/p1/*.rs`): a path can only match a glob whose leading
/// components it starts with, so a check runs the small set of each directory prefix of
/// the path (a hash lookup per component) plus the globs that start with a wildcard,
/// instead of every glob of the policy. With 1,000 globs in one `GlobSet`, a check cost
/// about 10 µs (`cargo bench --bench governance -- policy`), most of it in the regex set.
#[derive(Clone, Debug)]
pub(crate) struct RuleSet {
    /// Globs with literal leading directories, by those directories (bytes, `/`-joined,
    /// no trailing `/`).
    anchored: HashMap<Vec<u8>, Group>,
    /// Globs whose first component has a wildcard (`**/x`, `*.md`), single-component
    /// literals, and every glob of a case-insensitive rule (a byte lookup would miss
    /// another case).
    floating: Group,
    /// Rule texts as reported to callers, e.g. `owned_scope "src/**" of INT-001`.
    rules: Vec<String>,
    /// The first rule with a glob that is exactly `**`: the only kind that matches the
    /// workspace root (the empty path).
    root_rule: Option<usize>,
}

/// Some globs of a [`RuleSet`], compiled together.
#[derive(Clone, Debug)]
struct Group {
    set: GlobSet,
    /// For each glob of `set`, the index of its rule (non-decreasing: globs are added in
    /// rule order, so the first glob that matches belongs to the first rule that does).
    rule_of_glob: Vec<usize>,
}

impl Group {
    fn empty() -> Group {
        Group {
            set: GlobSet::empty(),
            rule_of_glob: Vec::new(),
        }
    }

    /// The first rule of this group matching `candidate`.
    fn first(&self, candidate: &Candidate<'_>) -> Option<usize> {
        // Most checks do not match (or match once); only collect the indices when there
        // is something to report.
        if !self.set.is_match_candidate(candidate) {
            return None;
        }
        if let [only] = self.rule_of_glob[..] {
            // (One glob: it is the one that matched, no second pass to say which.)
            return Some(only);
        }
        let first = self.set.matches_candidate(candidate).into_iter().min()?;
        Some(self.rule_of_glob[first])
    }
}

impl RuleSet {
    /// A set that matches nothing.
    pub(crate) fn empty() -> RuleSet {
        RuleSet {
            anchored: HashMap::new(),
            floating: Group::empty(),
            rules: Vec::new(),
            root_rule: None,
        }
    }

    /// The rule text of the first rule matching `rel`, if any.
    pub(crate) fn matched(&self, rel: &Path) -> Option<&str> {
        let rel = normalize_rel(rel);
        if rel.as_os_str().is_empty() {
            return self.root_rule.map(|r| self.rules[r].as_str());
        }
        let candidate = Candidate::new(rel.as_ref());
        let mut best = self.floating.first(&candidate);
        if !self.anchored.is_empty() {
            // Every prefix of the path that ends before a `/`, and the whole path (`dir/**`
            // is asked about `dir` too, and answers as globset does).
            let bytes = rel.as_os_str().as_bytes();
            let ends = bytes
                .iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'/')
                .map(|(i, _)| i)
                .chain(std::iter::once(bytes.len()));
            for end in ends {
                if let Some(g) = self.anchored.get(&bytes[..end]) {
                    if let Some(r) = g.first(&candidate) {
                        best = Some(best.map_or(r, |b| b.min(r)));
                    }
                }
            }
        }
        best.map(|r| self.rules[r].as_str())
    }
}

/// The literal leading directories of a glob: its components up to the first one with a
/// glob metacharacter, never including the last component. Empty when the first
/// component has one (or the glob is a single component).
/// Whether a glob component (or path) has a glob metacharacter.
pub(crate) fn has_meta(c: &str) -> bool {
    c.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

pub(crate) fn literal_dirs(glob: &str) -> &str {
    let is_meta = has_meta;
    let (mut start, mut end) = (0, 0);
    for (slash, _) in glob.match_indices('/') {
        if is_meta(&glob[start..slash]) {
            break;
        }
        (start, end) = (slash + 1, slash);
    }
    &glob[..end]
}

/// Drops what a caller might accidentally leave in front of a workspace-relative path
/// (`/`, `./`), so that a sensitive or ignored path is never missed because of it.
fn normalize_rel(rel: &Path) -> Cow<'_, Path> {
    let mut bytes = rel.as_os_str().as_bytes();
    loop {
        if let Some(rest) = bytes.strip_prefix(b"/") {
            bytes = rest;
        } else if let Some(rest) = bytes.strip_prefix(b"./") {
            bytes = rest;
        } else {
            break;
        }
    }
    if bytes == b"." {
        bytes = b"";
    }
    if bytes.len() == rel.as_os_str().len() {
        Cow::Borrowed(rel)
    } else {
        Cow::Borrowed(Path::new(std::ffi::OsStr::from_bytes(bytes)))
    }
}

/// Builds a [`RuleSet`] rule by rule.
pub(crate) struct RuleSetBuilder {
    /// Per literal leading directories (empty: the floating group), the globs and their
    /// rule indices, in the order added.
    groups: HashMap<Vec<u8>, (GlobSetBuilder, Vec<usize>)>,
    rules: Vec<String>,
    root_rule: Option<usize>,
}

impl RuleSetBuilder {
    pub(crate) fn new() -> RuleSetBuilder {
        RuleSetBuilder {
            groups: HashMap::new(),
            rules: Vec::new(),
            root_rule: None,
        }
    }

    /// Adds one rule made of `globs` (already [`expand`]ed), reported as `rule`.
    /// `pattern` is the pattern as written, for messages.
    pub(crate) fn add(
        &mut self,
        pattern: &str,
        globs: &[String],
        rule: String,
        case_insensitive: bool,
    ) -> Result<(), GlobProblem> {
        let index = self.rules.len();
        for glob in globs {
            let compiled = GlobBuilder::new(glob)
                .literal_separator(true)
                .case_insensitive(case_insensitive)
                .build()
                .map_err(|e| GlobProblem {
                    message: format!("invalid glob {}: {}", quote(pattern), e.kind()),
                    hint: "`*` matches within one path component, `**` across components, \
                           `{a,b}` either, `[abc]` one of; write `[*]` for a literal `*`"
                        .to_string(),
                })?;
            let key = if case_insensitive {
                ""
            } else {
                literal_dirs(glob)
            };
            let (b, rule_of_glob) = self
                .groups
                .entry(key.as_bytes().to_vec())
                .or_insert_with(|| (GlobSetBuilder::new(), Vec::new()));
            b.add(compiled);
            rule_of_glob.push(index);
            if glob == "**" && self.root_rule.is_none() {
                self.root_rule = Some(index);
            }
        }
        self.rules.push(rule);
        Ok(())
    }

    pub(crate) fn build(self) -> Result<RuleSet, GlobProblem> {
        let mut anchored = HashMap::with_capacity(self.groups.len());
        let mut floating = Group::empty();
        for (key, (builder, rule_of_glob)) in self.groups {
            let set = builder.build().map_err(|e| GlobProblem {
                message: format!("cannot compile the globs: {e}"),
                hint: "simplify the patterns (fewer or shorter alternatives)".to_string(),
            })?;
            let group = Group { set, rule_of_glob };
            if key.is_empty() {
                floating = group;
            } else {
                anchored.insert(key, group);
            }
        }
        Ok(RuleSet {
            anchored,
            floating,
            rules: self.rules,
            root_rule: self.root_rule,
        })
    }
}

/// Adds the sensitive defaults to `builder`.
pub(crate) fn add_sensitive_defaults(builder: &mut RuleSetBuilder) {
    for pattern in SENSITIVE_DEFAULTS {
        let glob = format!("**/{pattern}");
        let rule = format!("sensitive default {}", quote_verbatim(pattern));
        // The defaults are constants covered by tests; a failure here is a bug in them,
        // and skipping one rule is safer than panicking inside a running mount.
        if let Err(e) = builder.add(pattern, &[glob], rule, true) {
            tracing::error!(
                "built-in sensitive pattern {pattern:?} does not compile: {}",
                e.message
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn set(patterns: &[&str]) -> RuleSet {
        let mut b = RuleSetBuilder::new();
        for p in patterns {
            let globs = expand(p, "owned_scope").expect("valid pattern");
            b.add(p, &globs, format!("rule {p}"), false)
                .expect("compiles");
        }
        b.build().expect("builds")
    }

    fn bytes(b: &[u8]) -> &Path {
        Path::new(OsStr::from_bytes(b))
    }

    #[test]
    fn glob_rules_table() {
        // (pattern, path, expected match)
        let table: &[(&str, &[u8], bool)] = &[
            // `*` does not cross `/`
            ("src/*.ts", b"src/a.ts", true),
            ("src/*.ts", b"src/sub/a.ts", false),
            ("src/*", b"src/a", true),
            ("src/*", b"src/a/b", false),
            ("src/?.ts", b"src/a.ts", true),
            ("src/?.ts", b"src//.ts", false),
            // `**` does
            ("src/**", b"src/a/b/c.ts", true),
            ("src/**", b"src/a", true),
            ("src/**", b"src", false),
            ("src/**", b"srcx/a", false),
            ("src/**/*.rs", b"src/x.rs", true),
            ("src/**/*.rs", b"src/a/b/x.rs", true),
            ("src/**/*.rs", b"src/a/b/x.ts", false),
            ("**/*.md", b"docs/x.md", true),
            ("**/*.md", b"README.md", true),
            // trailing `/`: the directory and everything below
            ("docs/", b"docs", true),
            ("docs/", b"docs/a/b.md", true),
            ("docs/", b"docsx", false),
            ("docs/", b"doc", false),
            // `{a,b}`
            ("src/{auth,jwt}/**", b"src/jwt/x.ts", true),
            ("src/{auth,jwt}/**", b"src/auth/x.ts", true),
            ("src/{auth,jwt}/**", b"src/other/x.ts", false),
            ("src/*.{ts,tsx}", b"src/a.tsx", true),
            // anchored at the root exactly as written
            ("*.md", b"README.md", true),
            ("*.md", b"docs/x.md", false),
            ("README.md", b"README.md", true),
            ("README.md", b"docs/README.md", false),
            ("README.md", b"README.mdx", false),
            // leading ./ is dropped
            ("./src/**", b"src/a", true),
            ("././Makefile", b"Makefile", true),
            // case-sensitive as written
            ("src/**", b"SRC/a", false),
            // non-UTF-8 names
            ("src/auth/**", b"src/auth/\xff\xfe.ts", true),
            ("src/*.ts", b"src/\xff.ts", true),
            ("src/*.ts", b"other/\xff.ts", false),
            // the root itself: only `**`
            ("**", b"", true),
            ("**/*", b"", false),
            ("src/**", b"", false),
            ("**", b"a/b/c", true),
        ];
        for (pattern, path, expected) in table {
            let got = set(&[pattern]).matched(bytes(path)).is_some();
            assert_eq!(
                got,
                *expected,
                "pattern {pattern:?} path {:?}",
                String::from_utf8_lossy(path)
            );
        }
    }

    #[test]
    fn first_declared_rule_is_reported() {
        let s = set(&["src/**", "src/auth/**", "**"]);
        assert_eq!(s.matched(Path::new("src/auth/x")), Some("rule src/**"));
        assert_eq!(s.matched(Path::new("lib/x")), Some("rule **"));
        assert_eq!(s.matched(Path::new("")), Some("rule **"));
        let s = set(&["docs/", "docs/**"]);
        assert_eq!(s.matched(Path::new("docs")), Some("rule docs/"));
    }

    #[test]
    fn caller_prefixes_are_tolerated() {
        let s = set(&["src/**"]);
        assert_eq!(s.matched(Path::new("/src/a")), Some("rule src/**"));
        assert_eq!(s.matched(Path::new("./src/a")), Some("rule src/**"));
        assert_eq!(s.matched(Path::new(".")), None);
    }

    #[test]
    fn bad_patterns_are_rejected_with_hints() {
        let table: &[(&str, &str, &str)] = &[
            ("/src/**", "starts with \"/\"", "drop the leading /"),
            (
                "../other/**",
                "contains a \"..\" component",
                "outside the workspace",
            ),
            (
                "src/../../etc",
                "contains a \"..\" component",
                "outside the workspace",
            ),
            ("src//x", "empty or \".\" component", "\"//\""),
            ("src/./x", "empty or \".\" component", "\"/./\""),
            ("", "empty owned_scope glob", "\"**\""),
            ("./", "empty owned_scope glob", "\"**\""),
        ];
        for (pattern, message, hint) in table {
            let e = expand(pattern, "owned_scope").expect_err(pattern);
            assert!(e.message.contains(message), "{pattern:?}: {}", e.message);
            assert!(
                e.message.contains(&quote(pattern)),
                "{pattern:?}: {}",
                e.message
            );
            assert!(e.hint.contains(hint), "{pattern:?}: {}", e.hint);
        }
        let mut b = RuleSetBuilder::new();
        let e = b
            .add("src/[", &["src/[".to_string()], String::new(), false)
            .expect_err("bad");
        assert_eq!(
            e.message,
            "invalid glob \"src/[\": unclosed character class; missing ']'"
        );
        let e = b
            .add("{a,b", &["{a,b".to_string()], String::new(), false)
            .expect_err("bad");
        assert!(
            e.message
                .starts_with("invalid glob \"{a,b\": unclosed alternate group"),
            "{}",
            e.message
        );
    }

    #[test]
    fn sensitive_defaults_match_file_names_at_any_depth_case_insensitively() {
        let mut b = RuleSetBuilder::new();
        add_sensitive_defaults(&mut b);
        let s = b.build().expect("defaults compile");
        assert_eq!(
            s.rules.len(),
            SENSITIVE_DEFAULTS.len(),
            "every default compiled"
        );
        let table: &[(&[u8], Option<&str>)] = &[
            (b".env", Some("sensitive default \".env\"")),
            (b"config/.env", Some("sensitive default \".env\"")),
            (b"a/b/.env.production", Some("sensitive default \".env.*\"")),
            (b"deploy/server.key", Some("sensitive default \"*.key\"")),
            (b"certs/ca.PEM", Some("sensitive default \"*.pem\"")),
            (
                b"home/.ssh/id_rsa.pub",
                Some("sensitive default \"id_rsa*\""),
            ),
            (b"id_ed25519", Some("sensitive default \"id_ed25519*\"")),
            // Secrets by kind, not any name with a word in it.
            (b"SECRET.txt", None),
            (b"x/my_Credentials.json", None),
            (
                b"x/Credentials.json",
                Some("sensitive default \"credentials.json\""),
            ),
            (b"src/\xffsecret", None),
            (b"cargo-credential/src/secret.rs", None),
            (
                b"u/.aws/credentials",
                Some("sensitive default \".aws/credentials\""),
            ),
            (b"aws/credentials", None),
            (
                b"u/.docker/config.json",
                Some("sensitive default \".docker/config.json\""),
            ),
            (b"ks/app.PFX", Some("sensitive default \"*.pfx\"")),
            (b"src/main.rs", None),
            (b".envrc", None),
            (b"keys/readme.md", None),
            (b"secrets/plain.txt", None), // file name only; a directory needs an extra glob
            (b"", None),
        ];
        for (path, expected) in table {
            assert_eq!(
                s.matched(bytes(path)),
                *expected,
                "path {:?}",
                String::from_utf8_lossy(path)
            );
        }
    }

    #[test]
    fn literal_dirs_stop_at_the_first_wildcard_and_never_take_the_last_component() {
        for (glob, dirs) in [
            ("src/auth/**", "src/auth"),
            ("pkg/p1/*.rs", "pkg/p1"),
            ("docs/a/index.md", "docs/a"),
            ("src/{auth,jwt}/**", "src"),
            ("src/a\\*b/c", "src"),
            ("**/x.c", ""),
            ("*.md", ""),
            ("README.md", ""),
            ("{a/b,c}/d", ""),
            ("a/b", "a"),
        ] {
            assert_eq!(literal_dirs(glob), dirs, "glob {glob:?}");
        }
    }

    /// The grouped set answers exactly as one `GlobSet` of every glob would (first rule
    /// in declaration order), over generated patterns and paths of every shape the
    /// grouping treats differently: literal leading directories, wildcards in the first
    /// component, `**` at any place, alternations that contain `/`, escapes, and
    /// case-insensitive rules.
    #[test]
    fn grouping_by_literal_dirs_answers_as_one_globset() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        const LIT: &[&str] = &["a", "b", "src", "Src", "x.rs", "y.md", "a.b"];
        const META: &[&str] = &[
            "*", "**", "?", "*.rs", "[a-b]", "{a,b}", "{a/b,c}", "x\\*", "s*c", "[!a]*",
        ];
        for round in 0..300 {
            let mut b = RuleSetBuilder::new();
            let mut reference = GlobSetBuilder::new();
            let mut rule_of = Vec::new();
            let rules = 1 + next(12);
            for r in 0..rules {
                let ci = next(6) == 0;
                let parts = 1 + next(4);
                let glob: Vec<&str> = (0..parts)
                    .map(|_| {
                        if next(3) == 0 {
                            META[next(META.len())]
                        } else {
                            LIT[next(LIT.len())]
                        }
                    })
                    .collect();
                let glob = glob.join("/");
                let Ok(compiled) = GlobBuilder::new(&glob)
                    .literal_separator(true)
                    .case_insensitive(ci)
                    .build()
                else {
                    continue;
                };
                b.add(&glob, std::slice::from_ref(&glob), format!("{r}"), ci)
                    .expect("compiles");
                reference.add(compiled);
                rule_of.push(r);
            }
            let set = b.build().expect("builds");
            let reference = reference.build().expect("builds");
            for _ in 0..60 {
                let depth = 1 + next(5);
                let path: Vec<&str> = (0..depth).map(|_| LIT[next(LIT.len())]).collect();
                let path = path.join("/");
                let want = reference
                    .matches(&path)
                    .into_iter()
                    .min()
                    .map(|g| rule_of[g].to_string());
                assert_eq!(
                    set.matched(Path::new(&path)).map(str::to_owned),
                    want,
                    "round {round}: path {path:?}"
                );
            }
        }
    }
}
