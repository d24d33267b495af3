//! The policy file as written: serde structs mirroring the YAML, every value wrapped in
//! [`Spanned`] so that validation errors can point at the offending line and column.
//!
//! This file owns the key names, their alternative spellings and the YAML resource
//! budget. It validates nothing beyond "is this key known and of the right shape":
//! turning these raw values into a usable [`super::Policy`] is `mod.rs`'s job.
//!
//! Unknown keys are rejected at every level (`deny_unknown_fields`): a typo such as
//! `owned_scop` must be an error, never a silently empty scope. serde's `alias` keeps
//! working together with `deny_unknown_fields` (the alias is simply one more known key;
//! a test covers it, including at the top level).
//!
//! Enumerated values (`status`, the approval modes) and `timeout_s` are read as strings
//! and checked by hand, so that a bad value gets a "did you mean" hint and its position,
//! rather than serde's generic "unknown variant".

use serde::Deserialize;
use serde_saphyr::Spanned;

/// Upper bound on the size of a policy file. Real policies are a few kilobytes; this
/// stops an accidental `--policy /dev/zero` or a huge file before the parser sees it.
pub(crate) const MAX_POLICY_BYTES: usize = 4 * 1024 * 1024;

/// The whole file. Every key is optional: an empty file is a valid policy with no intents.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    /// The intents. `active_intents` is the other spelling found in the wild.
    #[serde(default, alias = "active_intents")]
    pub intents: Option<Vec<Spanned<RawIntent>>>,
    /// Extra sensitive globs, added to the built-in defaults.
    #[serde(default)]
    pub sensitive: Option<Vec<Spanned<String>>>,
    /// Approval settings.
    #[serde(default)]
    pub approval: Option<Spanned<RawApproval>>,
    /// Where `intentfs run --verify` lessons go (workspace-relative; default `CLAUDE.md`).
    #[serde(default)]
    pub lessons_file: Option<Spanned<String>>,
    /// Build output globs (`target/`, `node_modules/`): governed as usual, ledgered as
    /// summaries per identity, directory and burst.
    #[serde(default)]
    pub output: Option<Vec<Spanned<String>>>,
    /// What the content store keeps (file versions) and for how long.
    #[serde(default)]
    pub versions: Option<Spanned<RawVersions>>,
    /// `writable` (default) | `read-only`: may agents write git's internals (commit)?
    #[serde(default)]
    pub git: Option<Spanned<String>>,
}

/// The `versions:` mapping as written. Sizes and durations are strings (`64 MiB`, `30d`)
/// checked by hand, so a bad one gets its position and an example.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVersions {
    /// `false` turns version capture off (entries then say so).
    #[serde(default)]
    pub enabled: Option<Spanned<bool>>,
    /// Largest file whose versions are kept (default 64 MiB).
    #[serde(default)]
    pub max_file_size: Option<Spanned<String>>,
    /// Globs whose files' versions are not kept (build output, logs).
    #[serde(default)]
    pub exclude: Option<Vec<Spanned<String>>>,
    /// `intentfs gc`'s default `--keep` (e.g. `30d`).
    #[serde(default)]
    pub keep: Option<Spanned<String>>,
    /// `intentfs gc`'s default `--max-size` (e.g. `10 GiB`).
    #[serde(default)]
    pub max_size: Option<Spanned<String>>,
}

/// One intent as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIntent {
    /// Unique id, e.g. `INT-001`. Required; optional here so that a missing id is
    /// reported at the intent's own position (serde reports where the mapping ended).
    #[serde(default)]
    pub id: Option<Spanned<String>>,
    /// Human-readable name. Optional (empty when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// `IN_PROGRESS`, `PAUSED` or `DONE`. Required (selectability must never be
    /// guessed); optional here for the same reason as `id`.
    #[serde(default)]
    pub status: Option<Spanned<String>>,
    /// Scope globs. `scope` is the other spelling found in the wild.
    #[serde(default, alias = "scope")]
    pub owned_scope: Option<Vec<Spanned<String>>>,
    /// Free-text constraints, passed to the agent in `<intent_context>`.
    #[serde(default)]
    pub constraints: Option<Vec<String>>,
    /// Free-text acceptance criteria, passed to the agent in `<intent_context>`.
    #[serde(default)]
    pub acceptance_criteria: Option<Vec<String>>,
}

/// The `approval:` mapping as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    /// `deny` | `ask`.
    #[serde(default)]
    pub out_of_scope: Option<Spanned<String>>,
    /// `deny` | `ask` | `allow`.
    #[serde(default)]
    pub sensitive_read: Option<Spanned<String>>,
    /// `allow` | `ask`.
    #[serde(default)]
    pub delete: Option<Spanned<String>>,
    /// Seconds, 1..=86400. Read as a string so that `60s` or `-1` get our own message.
    #[serde(default)]
    pub timeout_s: Option<Spanned<String>>,
}

/// Keys with two accepted spellings: (primary, alternative).
const SPELLINGS: &[(&str, &str)] = &[("intents", "active_intents"), ("owned_scope", "scope")];

/// The primary spelling of `key` if it is one of the two spellings of a key.
pub(crate) fn primary_spelling(key: &str) -> Option<&'static str> {
    SPELLINGS
        .iter()
        .find(|(p, a)| *p == key || *a == key)
        .map(|(p, _)| *p)
}

/// The alternative spelling of a primary key, if it has one.
pub(crate) fn alternative_spelling(key: &str) -> Option<&'static str> {
    SPELLINGS.iter().find(|(p, _)| *p == key).map(|(_, a)| *a)
}

/// Names the mapping a list of known keys belongs to, for messages.
pub(crate) fn context_of(expected: &[&str]) -> &'static str {
    if expected.contains(&"owned_scope") {
        "in an intent"
    } else if expected.contains(&"timeout_s") {
        "in approval"
    } else if expected.contains(&"max_file_size") {
        "in versions"
    } else if expected.contains(&"intents") {
        "at the top level"
    } else {
        "here"
    }
}

/// Parses the YAML text with a conservative resource budget.
///
/// Why these numbers: a real policy is a few hundred nodes and uses no aliases at all.
/// serde-saphyr's defaults (1M events, 250k nodes) let a "billion laughs" file run for
/// over a second in a debug build before being refused; these limits refuse it in
/// milliseconds, and still leave room for thousands of intents. Alias replay is capped
/// separately (total replayed events and nesting), which is what actually bounds
/// exponential expansion.
pub(crate) fn parse_raw(text: &str) -> Result<RawPolicy, serde_saphyr::Error> {
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 200_000,
            max_nodes: 100_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_depth: 32,
            max_documents: 1,
            max_total_scalar_bytes: MAX_POLICY_BYTES,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 10_000,
            max_replay_stack_depth: 16,
        },
        // We render our own messages (file:line:col + hint); no snippet needed.
        with_snippet: false,
    };
    // First pass: walk every node, aliases replayed, without building anything. Our
    // typed schema alone would already stop most alias bombs (a nested list is not a
    // string), but with a type error ("expected string scalar") rather than a clear
    // "resource limit" message; and a future field of a looser type must not reopen the
    // hole. Cost: parsing a few kilobytes twice.
    let _: Option<serde::de::IgnoredAny> =
        serde_saphyr::from_str_with_options(text, options.clone())?;
    // `Option` so that an empty document (empty file, only comments, `~`) is `None`.
    let raw: Option<RawPolicy> = serde_saphyr::from_str_with_options(text, options)?;
    Ok(raw.unwrap_or_default())
}
