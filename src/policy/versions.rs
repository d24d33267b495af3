//! The `versions:` section: what the content store keeps of each file's versions, and
//! the retention `intentfs gc` applies by default.
//!
//! ```yaml
//! versions:
//!   enabled: true            # false: no versions kept (entries say so)
//!   max_file_size: 64 MiB    # bigger files' versions are not kept
//!   exclude: ["dist/**", "*.log"]
//!   keep: 30d                # intentfs gc --keep
//!   max_size: 10 GiB         # intentfs gc --max-size
//! ```

use std::path::Path;
use std::time::Duration;

use serde_saphyr::Spanned;

use super::compile::RuleSet;
use super::error::{quote, PolicyError};
use super::schema::RawVersions;

/// Default `max_file_size`: a source tree's files are far below it; a video or a model
/// checkpoint above it would dominate the store.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 64 * 1024 * 1024;

/// The `versions:` section, defaults filled in.
#[derive(Clone, Debug)]
pub struct VersionPolicy {
    /// Whether versions are kept at all.
    pub enabled: bool,
    /// Largest file (bytes) whose versions are kept.
    pub max_file_size: u64,
    /// `exclude:` globs, each quoted with its line.
    pub(crate) exclude: RuleSet,
    /// Default retention for `intentfs gc`.
    pub keep: Option<Duration>,
    /// Default store budget for `intentfs gc`.
    pub max_size: Option<u64>,
}

impl Default for VersionPolicy {
    fn default() -> VersionPolicy {
        VersionPolicy {
            enabled: true,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            exclude: RuleSet::empty(),
            keep: None,
            max_size: None,
        }
    }
}

impl VersionPolicy {
    /// The `exclude:` rule that keeps `rel`'s versions out of the store, quoted
    /// (`versions.exclude "dist/**" (policy line 7)`), if any.
    pub fn excluded(&self, rel: &Path) -> Option<&str> {
        self.exclude.matched(rel)
    }

    /// Why a version of `rel`, `size` bytes long, is not kept, or None when it is.
    pub fn not_kept(&self, rel: &Path, size: Option<u64>) -> Option<String> {
        if !self.enabled {
            return Some("versions off (policy versions.enabled: false)".into());
        }
        if let Some(rule) = self.excluded(rel) {
            return Some(format!("excluded by {rule}"));
        }
        match size {
            Some(n) if n > self.max_file_size => Some(format!(
                "over the {} cap (versions.max_file_size): {n} bytes",
                human_size(self.max_file_size)
            )),
            _ => None,
        }
    }
}

/// `64 MiB`, `1.5 GiB`, `512 B` (a whole number of units without `.0`).
pub fn human_size(n: u64) -> String {
    bytesize::ByteSize::b(n)
        .display()
        .iec()
        .to_string()
        .replace(".0 ", " ")
}

/// A size as written in a policy or on the command line: `64 MiB`, `10GB`, `1048576`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("{} is not a size ({e})", quote(s)))
}

/// A duration as written in a policy or on the command line: `30d`, `12h`, `2weeks`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{} is not a duration ({e})", quote(s)))
}

/// Validates the raw section; `glob_rules` compiles the `exclude:` globs as the policy's
/// other glob lists are.
pub(super) fn build(
    raw: Option<Spanned<RawVersions>>,
    origin: &Path,
    glob_rules: impl Fn(Option<Vec<Spanned<String>>>, &str) -> Result<RuleSet, PolicyError>,
) -> Result<VersionPolicy, PolicyError> {
    let Some(raw) = raw else {
        return Ok(VersionPolicy::default());
    };
    let raw = raw.value;
    let at = |s: &Spanned<String>| (s.referenced.line(), s.referenced.column());
    let bad = |s: &Spanned<String>, key: &str, msg: String, example: &str| {
        let (line, column) = at(s);
        PolicyError::invalid(
            origin,
            line,
            column,
            format!("versions.{key}: {msg}"),
            format!("write it as e.g. `{key}: {example}`"),
        )
    };
    let mut v = VersionPolicy {
        enabled: raw.enabled.is_none_or(|b| b.value),
        exclude: glob_rules(raw.exclude, "versions.exclude")?,
        ..VersionPolicy::default()
    };
    if let Some(s) = &raw.max_file_size {
        v.max_file_size = parse_size(&s.value).map_err(|m| bad(s, "max_file_size", m, "64 MiB"))?;
    }
    if let Some(s) = &raw.keep {
        v.keep = Some(parse_duration(&s.value).map_err(|m| bad(s, "keep", m, "30d"))?);
    }
    if let Some(s) = &raw.max_size {
        v.max_size = Some(parse_size(&s.value).map_err(|m| bad(s, "max_size", m, "10 GiB"))?);
    }
    Ok(v)
}
