//! What in a git directory an agent may write. Pure path rules, from git's documentation
//! (gitrepository-layout(5), git-config(1), githooks(5), git-worktree(1)).
//!
//! Agents commit, branch, stash, rebase and merge, so git's state files stay writable:
//! objects, refs, logs, the index, `HEAD` and its siblings, lock files, rebase, merge and
//! sequencer state. What changes *which programs git runs* or *where git reads its
//! configuration* does not: whoever runs git next in the workspace (a human, as root) would
//! run the agent's code. In every git directory — `.git/` at any depth, and the git
//! directories of submodules and worktrees inside it:
//!
//! | path | why |
//! |---|---|
//! | `config`, `config.worktree`, `config.lock`, … (`config*`) | `core.fsmonitor`, `core.hooksPath`, `core.sshCommand`, aliases, filters, pagers, editors: all run programs |
//!
//! (One exception: `config.lock` directly in a repository's own `.git` may be written, as git
//! writes its configuration through it, and renamed onto `config` only when what it holds is
//! the configuration with `[branch "…"]` sections renamed or removed and nothing else
//! changed — `git branch -m` and `git branch -d` — see [`config_lock`] and
//! [`branch_sections_only`].)
//! | `hooks/` | run at commit, checkout, merge, push |
//! | `commondir`, `gitdir` | redirect git to another directory's config and hooks |
//! | `info/attributes` | selects filter and diff drivers for paths |
//! | `worktrees/` | each worktree's git dir: its own `config.worktree`, `commondir`, `gitdir` |
//! | `modules/*/` `config*`, `hooks/`, `commondir`, `info/attributes`, `worktrees/` | a submodule's git dir: the same, one level down |
//!
//! And a *file* (or symlink) named `.git` anywhere: a "gitdir file" points git at another
//! directory, which may hold its own config.

use std::path::{Component, Path};

/// The components of `rel` as strings (lossy: a non-UTF-8 name matches no rule).
/// Whether `.git` occurs in `rel` at all: the checks below are on every change's path, and
/// most paths have no `.git` in them (a cheap look before splitting the path).
fn mentions_git(rel: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    memchr::memmem::find(rel.as_os_str().as_bytes(), b".git").is_some()
}

fn parts(rel: &Path) -> Vec<std::borrow::Cow<'_, str>> {
    rel.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy()),
            _ => None,
        })
        .collect()
}

/// Is `rel` inside a git directory (below a `.git` component)? Such paths are git's
/// internals: not ledgered file by file and not stale-checked.
pub fn in_git_dir(rel: &Path) -> bool {
    if !mentions_git(rel) {
        return false;
    }
    let p = parts(rel);
    p.iter().rev().skip(1).any(|c| c == ".git")
}

/// Whether `rel` is `config.lock` directly in a repository's `.git` (the only `.git` in the
/// path: not a submodule's or a worktree's git directory): git writes its configuration
/// there and renames it onto `config`. Nobody reads it as configuration, so an agent may
/// write it; the rename onto `config` is allowed only for [`branch_sections_only`] changes.
pub fn config_lock(rel: &Path) -> bool {
    if !mentions_git(rel) || rel.file_name().is_none_or(|n| n != "config.lock") {
        return false;
    }
    let p = parts(rel);
    p.len() >= 2 && p[p.len() - 2] == ".git" && p.iter().filter(|c| *c == ".git").count() == 1
}

/// Whether `new` is the git configuration `old` with some `[branch "NAME"]` sections renamed
/// (to a plain branch name) or removed, and nothing else changed: what `git branch -m`
/// (which rewrites the file even when the branch has no section) and `git branch -d` write.
/// Every other line must be the same, in the same order: no key, value, include or section
/// of any other kind can be added, changed or moved. Anything git's parser might read
/// differently (a continued line, an old-style `[branch.name]`, an indented or commented
/// header) is left as it is, so a change touching it is refused.
pub fn branch_sections_only(old: &[u8], new: &[u8]) -> bool {
    let old: Vec<&[u8]> = old.split(|&b| b == b'\n').collect();
    let new: Vec<&[u8]> = new.split(|&b| b == b'\n').collect();
    // A line that may start a section, whatever came before (a removed section ends there).
    let opens = |l: &[u8]| l.trim_ascii_start().first() == Some(&b'[');
    // A header git would read as one: not the continuation of a value.
    let continued = |l: &[u8]| l.strip_suffix(b"\r").unwrap_or(l).last() == Some(&b'\\');
    let (mut i, mut j) = (0, 0);
    while i < old.len() {
        let header = i == 0 || !continued(old[i - 1]);
        if j < new.len() && old[i] == new[j] {
            i += 1;
            j += 1;
            continue;
        }
        let Some((name, rest)) = header.then(|| branch_header(old[i])).flatten() else {
            return false;
        };
        // Renamed: `[branch "NEW"]`, the rest of the line kept or dropped.
        if let Some((to, to_rest)) = new.get(j).and_then(|l| branch_header(l)) {
            if to != name && plain_branch(to) && (to_rest == rest || to_rest.is_empty()) {
                i += 1;
                j += 1;
                continue;
            }
        }
        // Removed: the header and every line up to the next one.
        // (Not one ending in a continued line: git reads the next line as part of the
        // removed section's last value, and removing it would give that line a meaning.)
        i += 1;
        while i < old.len() && !opens(old[i]) {
            i += 1;
        }
        if i < old.len() && continued(old[i - 1]) {
            return false;
        }
    }
    j == new.len()
}

/// `[branch "NAME"]REST` at the start of a line: `(NAME, REST)`.
fn branch_header(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let l = line.strip_prefix(b"[branch \"")?;
    let end = memchr::memmem::find(l, b"\"]")?;
    Some((&l[..end], &l[end + 2..]))
}

/// A branch name as `git branch` makes them, strictly: letters, digits and `._-/+@`, no
/// `..`, `//` or `@{`, not starting with `-`, `.` or `/`, not ending with `/`, `.` or
/// `.lock`. (Nothing a config parser could read as more than a name.)
fn plain_branch(n: &[u8]) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && n.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/+@".contains(b))
        && !matches!(n[0], b'-' | b'.' | b'/')
        && !matches!(n[n.len() - 1], b'/' | b'.')
        && !n.ends_with(b".lock")
        && memchr::memmem::find(n, b"..").is_none()
        && memchr::memmem::find(n, b"//").is_none()
        && memchr::memmem::find(n, b"@{").is_none()
}

/// Why writing `rel` would let an agent change what git executes or where it reads its
/// configuration (see the module doc), quoted as a rule; `None` when it would not.
/// `is_dir`: the entry is (or is made as) a directory.
pub fn exec_rule(rel: &Path, is_dir: bool) -> Option<String> {
    if !mentions_git(rel) {
        return None;
    }
    if !is_dir && config_lock(rel) {
        return None;
    }
    let p = parts(rel);
    let last = p.len().checked_sub(1)?;
    for (i, c) in p.iter().enumerate() {
        if c != ".git" {
            continue;
        }
        if i == last {
            if is_dir {
                return None;
            }
            return Some(
                "git: a file named .git (a gitdir link) points git at another directory".into(),
            );
        }
        let r = &p[i + 1..];
        if let Some(why) = gitdir_rule(r) {
            return Some(format!("git: {why} (in {})", p[..=i].join("/")));
        }
    }
    None
}

/// The rule for `r`, a path inside a git directory.
fn gitdir_rule(r: &[std::borrow::Cow<'_, str>]) -> Option<&'static str> {
    let first = r.first()?;
    if let Some(why) = exec_entry(r) {
        return Some(why);
    }
    match first.as_ref() {
        "worktrees" => Some("worktrees/ holds other worktrees' git directories"),
        "modules" => {
            // modules/<name…>/<git dir>: a submodule name may contain slashes, so look at
            // every component below until git's state directories begin.
            for j in 1..r.len() {
                if matches!(r[j].as_ref(), "refs" | "logs" | "objects") {
                    break;
                }
                if exec_entry(&r[j..]).is_some() || r[j] == "worktrees" {
                    return Some(
                        "a submodule's git directory (modules/) holds its config and hooks",
                    );
                }
            }
            None
        }
        _ => None,
    }
}

/// An entry at the top of a git directory that changes what git runs or reads.
fn exec_entry(r: &[std::borrow::Cow<'_, str>]) -> Option<&'static str> {
    let first = r.first()?;
    if first.starts_with("config") {
        return Some(
            "config* sets programs git runs (core.fsmonitor, core.hooksPath, aliases, filters)",
        );
    }
    match first.as_ref() {
        "hooks" => Some("hooks/ are run by git"),
        "commondir" | "gitdir" => Some("commondir and gitdir redirect git to another directory"),
        "info" if r.get(1).is_some_and(|n| n.starts_with("attributes")) => {
            Some("info/attributes selects filter and diff drivers")
        }
        "rr-cache" => Some(
            "rr-cache/ holds rerere's recorded resolutions, which git writes into conflicted files",
        ),
        "info" if r.get(1).is_some_and(|n| n.starts_with("grafts")) => {
            Some("info/grafts rewrites commits' parents: what git takes as already reachable")
        }
        "objects"
            if r.get(1).is_some_and(|n| n == "info")
                && r.get(2).is_some_and(|n| n.contains("alternates")) =>
        {
            Some("objects/info/alternates lends git objects from another directory, which no check sees")
        }
        _ => None,
    }
}

/// The ref a path inside a git directory names, when it is one git moves as work is
/// recorded: `HEAD` or `refs/…` (lock files are not refs).
pub fn ref_name(rel: &Path) -> Option<String> {
    if !mentions_git(rel) {
        return None;
    }
    let p = parts(rel);
    let i = p.iter().position(|c| c == ".git")?;
    let r = &p[i + 1..];
    if r.last()?.ends_with(".lock") {
        return None;
    }
    match r.first()?.as_ref() {
        "HEAD" if r.len() == 1 => Some("HEAD".into()),
        "refs" if r.len() > 1 => Some(r.join("/")),
        _ => None,
    }
}

/// The object id a loose object's final name gives (`objects/xx/<38 or 62 hex>` in a git
/// directory), if `rel` is one. Git writes a loose object under a temporary name and links
/// or renames it there; it never writes one in place, nor changes one.
pub fn loose_object_id(rel: &Path) -> Option<String> {
    if !in_git_dir(rel) {
        return None;
    }
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let name = rel.file_name()?.to_str()?;
    let dir = rel.parent()?;
    let fan = dir.file_name()?.to_str()?;
    let objects = dir.parent()?.file_name()?;
    (objects == "objects"
        && fan.len() == 2
        && hex(fan)
        && matches!(name.len(), 38 | 62)
        && hex(name))
    .then(|| format!("{fan}{name}").to_ascii_lowercase())
}

/// The upper-case files git keeps at the top of a git directory: its pseudo-refs and
/// messages. Git reads any upper-case name there as a ref (`git rev-parse EVIL` reads
/// `.git/EVIL`), so no other is made: an attack pass made `.git/EVIL` and `.git/AUTH_FIX`
/// (shadowing the branch `AUTH_FIX` in the human's `git merge AUTH_FIX`) name a forged
/// commit.
pub const GIT_ROOT_FILES: &[&str] = &[
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_RR",
    "MERGE_AUTOSTASH",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "REBASE_HEAD",
    "AUTO_MERGE",
    "BISECT_START",
    "BISECT_LOG",
    "BISECT_NAMES",
    "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK",
    "BISECT_HEAD",
    "BISECT_TERMS",
    "BISECT_RUN",
    "BISECT_FIRST_PARENT",
    "COMMIT_EDITMSG",
    "SQUASH_MSG",
    "TAG_EDITMSG",
    "NOTES_EDITMSG",
    "EDIT_DESCRIPTION",
    "NOTES_MERGE_PARTIAL",
    "NOTES_MERGE_REF",
];

/// A name git reads as a ref at the top of a git directory: upper case and `_` only.
pub fn root_ref_syntax(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
}

/// A file directly in a git directory whose name git does not write there, if `rel` is
/// one (`Some(name)`). Git reads a revision name `NAME` first as `$GIT_DIR/NAME`: a file
/// `.git/feature` would stand for the branch `feature` in the human's `git merge feature`,
/// and for a label a rebase's `reset` names. So only the files git itself keeps there may
/// be made or written: its pseudo-refs and messages ([`GIT_ROOT_FILES`], e.g.
/// `ORIG_HEAD`, `MERGE_MSG`), the index and its temporaries, `packed-refs`, `shallow`, `description`,
/// gc's files, lock files, and names git never reads as a revision (starting with `.`,
/// ending with `~`, an editor's swap file).
pub fn unknown_git_file(rel: &Path) -> Option<String> {
    if !mentions_git(rel) {
        return None;
    }
    let p = parts(rel);
    if p.len() < 2 || p[p.len() - 2] != ".git" {
        return None;
    }
    let name = p[p.len() - 1].as_ref();
    let known = name.ends_with(".lock")
        || name.starts_with('.')
        || name.ends_with('~')
        || GIT_ROOT_FILES.contains(&name)
        || matches!(
            name,
            "index"
                | "packed-refs"
                | "shallow"
                | "description"
                | "gc.pid"
                | "gc.log"
                | "gitk.cache"
                // `git rebase --apply`: the patches of the commits it replays.
                | "rebased-patches"
        )
        || name.starts_with("index.")
        || name.starts_with("sharedindex.")
        || name.starts_with("next-index-")
        || name.starts_with("packed-refs.")
        || name.ends_with(".patch")
        || name.ends_with(".diff");
    (!known).then(|| name.to_string())
}

/// An index git trusts without checking it against the objects, if `rel` is one: a
/// commit-graph (a commit's tree and parents are read from it), a pack index or the
/// multi-pack index (an object id is mapped to its bytes through it). A forged one makes
/// git check out other content than the commit's.
pub fn trusted_index(rel: &Path) -> Option<TrustedIndex> {
    if !mentions_git(rel) {
        return None;
    }
    let p = parts(rel);
    let i = p.iter().rposition(|c| c == ".git")?;
    let r: Vec<&str> = p[i + 1..].iter().map(|c| c.as_ref()).collect();
    match r.as_slice() {
        ["objects", "info", "commit-graph"] => Some(TrustedIndex::CommitGraph),
        // (Git writes the chain through its lock and each graph under a temporary name.)
        ["objects", "info", "commit-graphs", n]
            if *n == "commit-graph-chain" || (n.starts_with("graph-") && n.ends_with(".graph")) =>
        {
            Some(TrustedIndex::CommitGraph)
        }
        ["objects", "pack", "multi-pack-index"] => Some(TrustedIndex::MultiPackIndex),
        ["objects", "pack", n] if n.starts_with("pack-") && n.ends_with(".idx") => {
            Some(TrustedIndex::PackIndex)
        }
        // A pack's data and the files beside it: git checks a pack against its index's
        // trailer only, and reads trees and blobs from it without hashing them.
        ["objects", "pack", n]
            if n.starts_with("pack-")
                && [".pack", ".rev", ".bitmap", ".mtimes"]
                    .iter()
                    .any(|e| n.ends_with(e)) =>
        {
            Some(TrustedIndex::PackData)
        }
        _ => None,
    }
}

/// See [`trusted_index`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrustedIndex {
    CommitGraph,
    PackIndex,
    MultiPackIndex,
    PackData,
}

/// Is `rel` a ref file of a repository: a loose ref (`HEAD`, `refs/...`) or `packed-refs`
/// (not their `.lock` files)? Git writes these only through a lock file renamed into place.
pub fn is_ref_file(rel: &Path) -> bool {
    if !mentions_git(rel) {
        return false;
    }
    if ref_name(rel).is_some() {
        return true;
    }
    let p = parts(rel);
    p.len() >= 2 && p[p.len() - 1] == "packed-refs" && p[p.len() - 2] == ".git"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_git_executes_is_protected_in_every_git_directory() {
        for p in [
            ".git/config",
            ".git/config.worktree",
            ".git/config.lock.lock",
            ".git/modules/sub/config.lock",
            ".git/modules/sub/.git/config.lock",
            ".git/worktrees/wt/config.lock",
            "sub/.git/modules/x/config.lock",
            ".git/commondir",
            ".git/hooks/pre-commit",
            ".git/hooks",
            ".git/info/attributes",
            ".git/worktrees/wt/gitdir",
            ".git/worktrees/wt/HEAD",
            ".git/modules/sub/config",
            ".git/modules/sub/hooks/post-checkout",
            ".git/modules/a/b/commondir",
            ".git/modules/sub/info/attributes",
            "vendor/lib/.git/config",
            "sub/.git/hooks/x",
            "sub/.git",
            ".git",
        ] {
            assert!(
                exec_rule(Path::new(p), false).is_some(),
                "{p} must be protected"
            );
        }
        for p in [
            ".git/HEAD",
            ".git/config.lock",
            "vendor/lib/.git/config.lock",
            ".git/index",
            ".git/index.lock",
            ".git/COMMIT_EDITMSG",
            ".git/ORIG_HEAD",
            ".git/objects/ab/cdef",
            ".git/refs/heads/config",
            ".git/refs/heads/main.lock",
            ".git/logs/refs/heads/hooks",
            ".git/packed-refs",
            ".git/rebase-merge/done",
            ".git/sequencer/todo",
            ".git/info/exclude",
            ".git/modules/sub/objects/pack/x.pack",
            ".git/modules/sub/refs/heads/config",
            "src/config.rs",
            "hooks/x",
            "a/.gitignore",
        ] {
            assert!(
                exec_rule(Path::new(p), false).is_none(),
                "{p} must stay writable"
            );
        }
        // A directory named .git may be made (git init, a nested repository); a file not.
        assert!(exec_rule(Path::new("sub/.git"), true).is_none());
        // config.lock is a file git writes; a directory there only stops git's writes.
        assert!(exec_rule(Path::new(".git/config.lock"), true).is_some());
    }

    #[test]
    fn only_files_git_keeps_at_the_top_of_its_directory() {
        for ok in [
            ".git/ORIG_HEAD",
            ".git/index",
            ".git/rebased-patches",
            ".git/x.lock",
        ] {
            assert_eq!(unknown_git_file(Path::new(ok)), None, "{ok}");
        }
        for bad in [".git/feature", ".git/main", ".git/rebased"] {
            assert!(unknown_git_file(Path::new(bad)).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_config_may_only_have_branch_sections_renamed_or_removed() {
        let old = b"[core]\n\tbare = false\n[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n";
        let ok = |new: &[u8]| branch_sections_only(old, new);
        // git branch -m without a section, or any rewrite of the same bytes.
        assert!(ok(old));
        // git branch -m master main.
        assert!(ok(b"[core]\n\tbare = false\n[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n"));
        // git branch -d master.
        assert!(ok(
            b"[core]\n\tbare = false\n[remote \"origin\"]\n\turl = /x\n"
        ));
        // Anything else: a key added, changed or moved, a section of another kind renamed
        // or removed, a name git would read as more than a name.
        for bad in [
            &b"[core]\n\tbare = false\n\tfsmonitor = /tmp/x\n[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n"[..],
            b"[core]\n\tbare = false\n[branch \"main\"]\n\tremote = evil\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n",
            b"[core]\n\tbare = false\n[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n",
            b"[core]\n\tbare = false\n[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n[alias]\n\tst = !sh\n",
            b"[core]\n\tbare = false\n[branch \"ma\\\"ster\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n",
            b"[core]\n\tbare = false\n[branch \"main\"] editor = vi\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n",
            b"[core]\n\tbare = false\n[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n[branch \"x\"]\n",
            b"[branch \"master\"]\n\tremote = origin\n\tmerge = refs/heads/master\n[remote \"origin\"]\n\turl = /x\n",
            b"",
        ] {
            assert!(!ok(bad), "{}", String::from_utf8_lossy(bad));
        }
        // A branch section's removal stops at the next line that may open a section: it
        // cannot swallow what follows, nor end in a continued value (whose next line would
        // then be read as a section of its own).
        let old = b"[branch \"a\"]\n\tx = 1 \\\n[core]\n\tfsmonitor = /x\n";
        assert!(!branch_sections_only(old, b""));
        assert!(!branch_sections_only(old, b"[core]\n\tfsmonitor = /x\n"));
        let old = b"[branch \"a\"]\n\tx = 1\n[core]\n\tfsmonitor = false\n";
        assert!(branch_sections_only(old, b"[core]\n\tfsmonitor = false\n"));
        // A header written as a continued value's next line is not renamed.
        let old = b"[alias]\n\tx = !echo \\\n[branch \"a\"]\n";
        assert!(!branch_sections_only(
            old,
            b"[alias]\n\tx = !echo \\\n[branch \"b\"]\n"
        ));
        assert!(config_lock(Path::new(".git/config.lock")));
        assert!(!config_lock(Path::new(".git/modules/x/config.lock")));
        assert!(!config_lock(Path::new(".git/x/.git/config.lock")));
        assert!(!config_lock(Path::new("config.lock")));
    }

    #[test]
    fn refs_and_git_dirs() {
        assert_eq!(ref_name(Path::new(".git/HEAD")).as_deref(), Some("HEAD"));
        assert_eq!(
            ref_name(Path::new(".git/refs/heads/main")).as_deref(),
            Some("refs/heads/main")
        );
        assert_eq!(ref_name(Path::new(".git/refs/heads/main.lock")), None);
        assert_eq!(ref_name(Path::new(".git/index")), None);
        assert!(in_git_dir(Path::new(".git/index")));
        assert!(in_git_dir(Path::new("sub/.git/HEAD")));
        assert!(!in_git_dir(Path::new(".git")));
        assert!(!in_git_dir(Path::new("src/git.rs")));
    }
}
