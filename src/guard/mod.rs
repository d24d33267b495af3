//! The decision for one operation: which intent the caller works under, whether the path is
//! protected, ignored, in the intent's scope, sensitive to read.
//!
//! Pure over (identity, operation, path): no fuser, no syscalls on the workspace. The
//! filesystem core asks, and turns a [`Denial`] into `EACCES` plus `last_error`.

// A `Denial` is the refusal itself, built once on the refusal path and consumed by value:
// boxing it would cost every caller an indirection for nothing.
#![allow(clippy::result_large_err)]

pub mod identity;
pub mod op;
pub mod stale;
pub mod tracking;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

pub use crate::ledger::Code;
use crate::policy::{IntentIgnore, Policy};
pub use identity::{tick, Identity, Intents};
pub use op::Operation;
pub use tracking::Identities;

/// A refusal, as `.intentfs/last_error` shows it and the ledger records it.
#[derive(Clone, Debug, Serialize)]
pub struct Denial {
    /// The denial code.
    pub code: Code,
    /// Workspace-relative path the operation touched (lossy for display).
    #[serde(serialize_with = "ser_path")]
    pub path: PathBuf,
    /// The caller's intent, if one was selected.
    pub intent: Option<String>,
    /// What happened, for a person.
    pub message: String,
    /// What to do next, for an LLM.
    pub remedy: String,
    /// The rule that decided, quoted.
    pub rule: Option<String>,
    /// The operation refused (`write`, `unlink`, `rename`, ...).
    pub op: Operation,
    /// When (RFC 3339).
    pub time: String,
}

/// An intent's globs for a message: the first few, then how many more (a policy may have
/// thousands, and `.intentfs/context` lists them all).
fn scope_list(globs: &[String]) -> String {
    const SHOWN: usize = 12;
    let mut s = globs
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if globs.len() > SHOWN {
        s.push_str(&format!(
            ", … ({} more in .intentfs/context)",
            globs.len() - SHOWN
        ));
    }
    s
}

fn ser_path<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

impl Denial {
    pub fn new(
        code: Code,
        op: Operation,
        path: &Path,
        intent: Option<&str>,
        message: String,
        remedy: String,
    ) -> Denial {
        Denial {
            code,
            path: path.to_path_buf(),
            intent: intent.map(str::to_owned),
            message,
            remedy,
            rule: None,
            op,
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }

    pub fn with_rule(mut self, rule: Option<String>) -> Denial {
        self.rule = rule;
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }
}

fn show(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "/".into()
    } else {
        p.to_string_lossy().into_owned()
    }
}

/// The agents' configuration files `intentfs init` writes, always protected (a trailing
/// `/`: the whole directory): Claude Code's MCP servers, settings (hooks) and hook
/// scripts, Codex CLI's and Gemini CLI's project configuration.
pub const AGENT_CONFIG: &[&str] = &[
    ".mcp.json",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".claude/hooks/",
    ".codex/config.toml",
    ".gemini/settings.json",
];

/// Paths that are read-only through the mount whatever the intent.
#[derive(Clone, Debug)]
pub struct Protected {
    /// `(path, covers everything below)`.
    entries: Vec<(PathBuf, bool)>,
    /// Every entry is spelled plainly (see [`plain`]), so a plain path may be compared
    /// with them byte by byte.
    plain: bool,
}

impl Protected {
    /// The fixed set plus `extra` workspace-relative files (the policy and ledger when
    /// `--policy`/`--ledger` put them inside the workspace).
    pub fn new(extra: &[PathBuf]) -> Protected {
        let mut entries = vec![
            (PathBuf::from(".orchestration"), true),
            (PathBuf::from(".intentignore"), false),
            (PathBuf::from(".git/hooks"), true),
            (PathBuf::from(".git/config"), false),
        ];
        // The agents' own configuration (`intentfs init`): the MCP servers and hooks that
        // tell an agent it is governed. An agent that could edit them could switch them
        // off (Claude Code's `disableAllHooks`) or run its own program as a hook.
        for f in AGENT_CONFIG {
            entries.push((PathBuf::from(f.trim_end_matches('/')), f.ends_with('/')));
        }
        for e in extra {
            if !e.as_os_str().is_empty() {
                entries.push((e.clone(), false));
            }
        }
        let plain = entries.iter().all(|(p, _)| plain(p).is_some());
        Protected { entries, plain }
    }

    /// The protected entry covering `rel`, quoted.
    pub fn matched(&self, rel: &Path) -> Option<String> {
        let fast = plain(rel).filter(|_| self.plain);
        for (p, subtree) in &self.entries {
            let hit = match fast {
                // (Byte comparisons: every request that changes a file asks, and comparing
                // `Path`s component by component was 2% of the daemon in `tar x`.)
                Some(r) => {
                    let p = p.as_os_str().as_bytes();
                    r == p || (*subtree && under(r, p))
                }
                None => rel == p || (*subtree && rel.starts_with(p)),
            };
            if hit {
                return Some(format!(
                    "always protected \"{}{}\"",
                    p.display(),
                    if *subtree { "/" } else { "" }
                ));
            }
        }
        None
    }

    /// The protected entry that lies strictly below `rel` (moving or removing `rel` would
    /// move it), quoted. The workspace root contains them all.
    pub fn below(&self, rel: &Path) -> Option<String> {
        let fast = plain(rel).filter(|_| self.plain);
        self.entries
            .iter()
            .find(|(p, _)| match fast {
                Some(r) => r.is_empty() || under(p.as_os_str().as_bytes(), r),
                None => p != rel && p.starts_with(rel),
            })
            .map(|(p, _)| format!("always protected \"{}\" lies below", p.display()))
    }
}

/// `rel`'s bytes when comparing them is comparing its components: no empty, `.` or `..`
/// component, no leading or trailing `/` (how the daemon spells every path it reads back),
/// `None` otherwise. The protected entries are spelled so too (`Protected::new`).
fn plain(rel: &Path) -> Option<&[u8]> {
    let b = rel.as_os_str().as_bytes();
    (b.is_empty()
        || b.split(|&c| c == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".."))
    .then_some(b)
}

/// Whether the plain path `a` lies strictly below the plain path `dir`.
fn under(a: &[u8], dir: &[u8]) -> bool {
    a.len() > dir.len() && a.starts_with(dir) && a[dir.len()] == b'/'
}

/// Everything a decision needs, swapped as a whole when the policy reloads.
pub struct Rules {
    pub policy: Policy,
    pub ignore: IntentIgnore,
    pub protected: Protected,
}

/// The decision maker for one mount.
pub struct Guard {
    rules: RwLock<Arc<Rules>>,
    /// Bumped at every reload: open write handles re-check their authorization.
    generation: std::sync::atomic::AtomicU64,
    /// The last reload error, shown in `.intentfs/status` until a reload succeeds.
    reload_error: Mutex<Option<String>>,
}

impl Guard {
    pub fn new(rules: Rules) -> Guard {
        Guard {
            rules: RwLock::new(Arc::new(rules)),
            generation: std::sync::atomic::AtomicU64::new(0),
            reload_error: Mutex::new(None),
        }
    }

    /// How many times the rules were replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The rules in force (a cheap `Arc` clone; never held across a syscall).
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().clone()
    }

    /// Install newly loaded rules.
    pub fn replace(&self, rules: Rules) {
        *self.rules.write() = Arc::new(rules);
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        *self.reload_error.lock() = None;
    }

    /// Remember a failed reload (the last good rules stay in force).
    pub fn set_reload_error(&self, err: Option<String>) {
        *self.reload_error.lock() = err;
    }

    pub fn reload_error(&self) -> Option<String> {
        self.reload_error.lock().clone()
    }

    /// May the caller, working under `intent`, change `rel`? `Ok(rule)` quotes the scope rule
    /// that allowed it.
    pub fn check_write(
        &self,
        intent: Option<&str>,
        op: Operation,
        rel: &Path,
        is_dir: bool,
    ) -> Result<String, Denial> {
        let rules = self.rules();
        if let Some(rule) = rules.protected.matched(rel) {
            return Err(Denial::new(
                Code::ProtectedPath,
                op,
                rel,
                intent,
                format!("{} is protected: it is read-only through the mount whatever the intent", show(rel)),
                "Do not modify governance files (.orchestration/, .intentignore, .git/hooks, .git/config) or \
                 the agents' configuration (.mcp.json, .claude/settings*.json, .claude/hooks/, .codex/config.toml, \
                 .gemini/settings.json). Ask the human to change them if the task requires it."
                    .into(),
            )
            .with_rule(Some(rule)));
        }
        if let Some(rule) = crate::policy::git::exec_rule(rel, is_dir) {
            return Err(Denial::new(
                Code::ProtectedPath,
                op,
                rel,
                intent,
                format!(
                    "{} is protected: git reads its configuration or runs programs from there, so no agent may write it",
                    show(rel)
                ),
                "Do not change git's configuration, hooks or gitdir links. Commit, branch, stash and merge work as \
                 usual; if the task needs a git setting, ask the human."
                    .into(),
            )
            .with_rule(Some(rule)));
        }
        // `git: read-only` in the policy: no agent writes any git directory.
        if rules.policy.git_read_only() && crate::policy::git::in_git_dir(rel) {
            return Err(protected(
                op,
                rel,
                intent,
                format!("{} is inside git's internals, which this workspace's policy keeps read-only (`git: read-only`)", show(rel)),
                "Read with git as you like (log, diff, status, blame); leave committing to the human, or ask them to set `git: writable`.",
                "policy git: read-only".into(),
            ));
        }
        // A ref written in place (or made, linked, truncated) would move a branch to any
        // commit, one that changes files outside the scope included, without the check a
        // ref move gets (`fs::gitrefs`) and without its REF entry. Git itself writes a
        // `.lock` file and renames it into place, which is checked; deleting a ref is too.
        if !is_dir
            && (writes_in_place(op) || op == Operation::Link)
            && crate::policy::git::is_ref_file(rel)
        {
            return Err(ref_write_denial(op, rel, intent));
        }
        // A loose object is written under a temporary name and linked or renamed into
        // place, where its content is checked (`fs::gitrefs::check_loose_object`); never
        // written in place.
        // A file at the top of a git directory that git does not keep there would stand for
        // a branch or label of that name (see `policy::git::unknown_git_file`).
        if !is_dir && (writes_in_place(op) || matches!(op, Operation::Link | Operation::Rename)) {
            if let Some(name) = crate::policy::git::unknown_git_file(rel) {
                return Err(protected(
                    op,
                    rel,
                    intent,
                    format!("{} is not a file git keeps at the top of its directory: git would read it as the revision {name:?}", show(rel)),
                    "Keep your own files out of .git; let git write its state.",
                    "git: only git's own files at the top of a git directory".into(),
                ));
            }
        }
        // `config.lock` is put onto `config` only as a file of one name (see
        // `Fs::check_config_content`): a hard link there would alias the configuration.
        if op == Operation::Link && crate::policy::git::config_lock(rel) {
            return Err(protected(
                op,
                rel,
                intent,
                format!("{} is where git writes its configuration: no other file may be linked there", show(rel)),
                "Let git write its configuration (git branch -m, git branch -d); ask the human for any other setting.",
                "git: config.lock holds only what git writes there".into(),
            ));
        }
        // Git makes no symlink in its own directory; one there (a fan-out directory of
        // objects, a state file) would have git read what no check saw.
        if op == Operation::Symlink && crate::policy::git::in_git_dir(rel) {
            return Err(protected(
                op,
                rel,
                intent,
                format!(
                    "{} is inside git's internals, where git makes no symlinks",
                    show(rel)
                ),
                "Leave git's directory to git.",
                "git: no symlinks in a git directory".into(),
            ));
        }
        if !is_dir
            && writes_in_place(op)
            && (crate::policy::git::loose_object_id(rel).is_some()
                || crate::policy::git::trusted_index(rel).is_some())
        {
            return Err(protected(
                op,
                rel,
                intent,
                format!(
                    "{} is a git object: it is never changed, and made only by git",
                    show(rel)
                ),
                "Let git write its objects (`git hash-object -w`, `git add`, `git commit`).",
                "git: a loose object holds the object its name says".into(),
            ));
        }
        if rel.as_os_str().is_empty() {
            return Err(Denial::new(
                Code::ProtectedPath,
                op,
                rel,
                intent,
                "the workspace root itself cannot be changed through the mount".into(),
                "Change files inside the workspace, not the workspace directory itself.".into(),
            ));
        }
        // A name above a protected path may only ever be a directory: a symlink, file or
        // device named `.claude` would put `.claude/settings.json` wherever it points
        // (directories are checked entry by entry when moved, see `fs::ops::rename`).
        if !is_dir && !matches!(op, Operation::Read) {
            if let Some(rule) = rules.protected.below(rel) {
                return Err(Denial::new(
                    Code::ProtectedPath,
                    op,
                    rel,
                    intent,
                    format!(
                        "{} can only be a directory: a protected path lies below it ({rule})",
                        show(rel)
                    ),
                    "Leave this name alone: it holds governance or agent configuration files. Ask the human if \
                     the task requires changing it."
                        .into(),
                )
                .with_rule(Some(rule)));
            }
        }
        let Some(id) = intent else {
            let ids: Vec<&str> = rules
                .policy
                .intents()
                .iter()
                .filter(|i| i.selectable())
                .map(|i| i.id.as_str())
                .collect();
            let remedy = match ids.first() {
                Some(first) => format!(
                    "Select an intent before changing files: read .intentfs/intents (selectable: {}), then write \
                     one id to .intentfs/intent (e.g. `echo {first} > .intentfs/intent`), and read \
                     .intentfs/context for its scope and constraints.",
                    ids.join(", ")
                ),
                None => "No intent of the policy can be selected now (none is IN_PROGRESS): stop and ask the \
                         human to set one IN_PROGRESS."
                    .into(),
            };
            return Err(Denial::new(
                Code::NoIntent,
                op,
                rel,
                None,
                format!("no intent is selected, so {} cannot be changed", show(rel)),
                remedy,
            ));
        };
        let Some(it) = rules.policy.intent(id) else {
            return Err(Denial::new(
                Code::NoIntent,
                op,
                rel,
                intent,
                format!("the selected intent {id} is no longer in the policy"),
                "Read .intentfs/intents and select an intent that exists by writing its id to .intentfs/intent."
                    .into(),
            ));
        };
        if !it.selectable() {
            return Err(Denial::new(
                Code::NoIntent,
                op,
                rel,
                intent,
                format!("the selected intent {id} is no longer IN_PROGRESS"),
                "Stop changing files for this intent. Read .intentfs/intents and select an IN_PROGRESS intent, \
                 or ask the human to resume this one."
                    .into(),
            ));
        }
        // The rest of `.git/` stays writable for every intent so agents can commit (hooks
        // and config were refused above as always protected).
        if rel.starts_with(".git") && rel != Path::new(".git") {
            return Ok("git internals (.git/) are writable by every intent".into());
        }
        if let Some(rule) = rules.ignore.matched(rel, is_dir) {
            return Err(Denial::new(
                Code::ProtectedPath,
                op,
                rel,
                intent,
                format!("{} is listed in .intentignore: no intent may write it", show(rel)),
                "Leave this path alone; it is excluded from every intent. If the task truly needs it, stop and \
                 ask the human."
                    .into(),
            )
            .with_rule(Some(rule)));
        }
        match it.scope_match(rel) {
            Some(rule) => Ok(rule),
            None => Err(Denial::new(
                Code::ScopeViolation,
                op,
                rel,
                intent,
                format!("{} is outside the scope of intent {id} ({})", show(rel), scope_list(&it.owned_scope)),
                format!(
                    "Only change files matching the owned_scope of {id}: {}. Read .intentfs/context. If this \
                     change is really needed, stop and ask the human to extend the scope or select another intent.",
                    scope_list(&it.owned_scope)
                ),
            )),
        }
    }

    /// May `rel` be read without asking? A sensitive path is refused here; whether a human
    /// is asked (policy `approval.sensitive_read`) is the filesystem's business.
    pub fn check_read(&self, intent: Option<&str>, rel: &Path) -> Result<(), Denial> {
        let rules = self.rules();
        let Some(rule) = rules.policy.sensitive_match(rel) else {
            return Ok(());
        };
        Err(Denial::new(
            Code::SensitiveRead,
            Operation::Read,
            rel,
            intent,
            format!("{} is sensitive: reading it needs a human's approval", show(rel)),
            "Do not read secrets. Work without this file's content, or ask the human to provide what you need."
                .into(),
        )
        .with_rule(Some(rule)))
    }
}

/// A `PROTECTED_PATH` refusal quoting `rule`.
fn protected(
    op: Operation,
    rel: &Path,
    intent: Option<&str>,
    message: String,
    remedy: &str,
    rule: String,
) -> Denial {
    Denial::new(Code::ProtectedPath, op, rel, intent, message, remedy.into()).with_rule(Some(rule))
}

/// An operation that puts content at `rel` itself (not by a rename or a link onto it).
fn writes_in_place(op: Operation) -> bool {
    matches!(
        op,
        Operation::Write
            | Operation::OpenWrite
            | Operation::Create
            | Operation::Truncate
            | Operation::Symlink
            | Operation::Mknod
    )
}

/// The refusal of a git ref written other than the way git writes it (see
/// [`Guard::check_write`]; also a directory of refs moved into place).
pub fn ref_write_denial(op: Operation, rel: &Path, intent: Option<&str>) -> Denial {
    protected(
        op,
        rel,
        intent,
        format!(
            "{} is a git ref: it moves only the way git moves it (a .lock file renamed into place), where the commits it brings are checked against your scope",
            show(rel)
        ),
        "Use git to move refs (`git commit`, `git branch`, `git update-ref`, `git reset`); do not write ref files \
         or packed-refs directly.",
        "git: refs are written through their lock file".into(),
    )
}

#[cfg(test)]
mod tests;
