//! What an agent's commits contain. Git's internals stay writable so agents can commit, but
//! a commit can carry any tree: an agent could stage a blob for a file outside its scope
//! (`git update-index --cacheinfo`) and commit it, and the human's next `git checkout` or
//! `git reset --hard` would write it. So when a ref of the workspace's repository moves
//! through the mount (a loose ref renamed into place, or `packed-refs` rewritten), the
//! commits it brings that no ref had before are checked: every path such a commit changes
//! (against its parent; for a merge, what differs from every parent) must be in the
//! identity's scope, or the ref update is refused. Remote-tracking refs (`refs/remotes/`)
//! are what a fetch brought, not the agent's commits, and are not checked.
//!
//! The daemon reads the repository with `git` itself, as the mount's owner, reading only:
//! no configuration but the repository's own (which agents cannot write), no hooks, no
//! fsmonitor, no pager.

use crate::guard::Operation;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Caller, Fs, Result};
use crate::guard::{Code, Denial, Identity};

/// `git --git-dir=GITDIR ARGS`, reading only; its stdout, or `None` when git cannot say.
fn git(gitdir: &Path, args: &[&str]) -> Option<String> {
    git_with(gitdir, args, None)
}

/// [`git`] with `input` on its stdin.
fn git_with(gitdir: &Path, args: &[&str], input: Option<&str>) -> Option<String> {
    let mut child = Command::new("git")
        // (Not the serving thread's working directory, which is a workspace directory:
        // see `sys::dir_path`.)
        .current_dir("/")
        .arg("--git-dir")
        .arg(gitdir)
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(["-c", "core.pager=cat", "-c", "safe.directory=*"])
        // (The commit-graph is a file agents can write: a patched one would show the
        // check another tree than the commit's. Read the commits themselves.)
        .args(["-c", "core.commitGraph=false"])
        .args(args)
        .env_clear()
        // (After `env_clear`, which drops what was set before it.)
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        // (A short list; git reads it whole before answering.)
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The full id of the commit `rev` names in `gitdir` (`git rev-parse --verify`), if any.
fn resolve_commit(gitdir: &Path, rev: &str) -> Option<String> {
    git(gitdir, &["rev-parse", "--verify", "-q", rev])
        .map(|s| s.trim().to_string())
        .filter(|s| is_oid(s))
}

/// An object id (SHA-1 or SHA-256, hex).
fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a loose ref's first line points at, read the way git reads it: a symbolic ref
/// (`ref: …`), or an object id followed by the end or by whitespace (git ignores what
/// follows: `<oid> junk` is that oid). `None`: neither, a ref git takes for broken.
pub fn ref_target(line: &str) -> Option<RefTarget> {
    if let Some(to) = line.strip_prefix("ref:") {
        return Some(RefTarget::Symbolic(to.trim().to_string()));
    }
    let hex = line.bytes().take_while(u8::is_ascii_hexdigit).count();
    let rest = &line[hex..];
    let oid = match hex {
        40 | 64 => &line[..hex],
        // (A longer run of hex digits: git parses the first 40 or 64 and then finds no
        // whitespace after them.)
        _ => return None,
    };
    (rest.is_empty() || rest.starts_with(char::is_whitespace))
        .then(|| RefTarget::Oid(oid.to_ascii_lowercase()))
}

/// See [`ref_target`].
#[derive(Debug, PartialEq, Eq)]
pub enum RefTarget {
    Oid(String),
    Symbolic(String),
}

/// The refs of a `packed-refs` text: name -> object id (peeled `^` lines skipped).
pub fn parse_packed(text: &str) -> BTreeMap<String, String> {
    // As git reads a line: the id, one whitespace character of any kind (a tab too), the
    // name to the end of the line.
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
        .filter_map(|l| {
            let hex = l.bytes().take_while(u8::is_ascii_hexdigit).count();
            let sep = l[hex..]
                .chars()
                .next()
                .filter(|c| c.is_ascii_whitespace())?;
            let name = &l[hex + sep.len_utf8()..];
            is_oid(&l[..hex]).then(|| (name.trim().to_string(), l[..hex].to_ascii_lowercase()))
        })
        .collect()
}

/// The first name of a `packed-refs` text that is not after the one before it (a name
/// twice, or out of order), if any. Git writes the file sorted, and with the `sorted`
/// trait reads it by binary search, so of two entries of one name git may read another
/// than [`parse_packed`] keeps (an attack pass moved the current branch so).
pub fn packed_out_of_order(text: &str) -> Option<String> {
    let mut last: Option<&str> = None;
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
    {
        let hex = l.bytes().take_while(u8::is_ascii_hexdigit).count();
        let name = l.get(hex + 1..).unwrap_or("").trim();
        if last.is_some_and(|p| p.as_bytes() >= name.as_bytes()) {
            return Some(name.to_string());
        }
        last = Some(name);
    }
    None
}

/// The refs whose value differs between two `packed-refs` texts: (ref, old, new).
pub fn packed_changes(old: &str, new: &str) -> Vec<(String, Option<String>, Option<String>)> {
    let (a, b) = (parse_packed(old), parse_packed(new));
    let mut out = Vec::new();
    for (name, v) in &a {
        if b.get(name) != Some(v) {
            out.push((name.clone(), Some(v.clone()), b.get(name).cloned()));
        }
    }
    for (name, v) in &b {
        if !a.contains_key(name) {
            out.push((name.clone(), None, Some(v.clone())));
        }
    }
    out
}

impl Fs {
    /// The workspace repository's git directory, when `rel` is in it (not a nested one).
    pub(crate) fn root_gitdir(&self, rel: &Path) -> Option<PathBuf> {
        rel.starts_with(".git")
            .then(|| self.cfg.workspace.join(".git"))
    }

    /// The length of the workspace repository's object ids: 64 with
    /// `extensions.objectFormat = sha256` in its config, else 40.
    pub(crate) fn hexsz(&self, rel: &Path) -> usize {
        let sha256 = self.read_git_file(rel, "config", 1 << 20).is_some_and(|c| {
            c.lines().any(|l| {
                let l = l.trim().to_ascii_lowercase();
                l.starts_with("objectformat") && l.contains("sha256")
            })
        });
        if sha256 {
            64
        } else {
            40
        }
    }

    /// A small file of the workspace's repository (`packed-refs`, a loose ref), read
    /// without following a symlink or blocking on a FIFO.
    fn read_git_file(&self, rel: &Path, name: &str, limit: u64) -> Option<String> {
        use std::os::unix::fs::OpenOptionsExt;
        let gitdir = self.root_gitdir(rel)?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(gitdir.join(name))
            .ok()?;
        let bytes = super::hash::read_small(&f, limit)?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The value `packed-refs` of the repository holding `rel` gives ref `name`.
    pub(crate) fn packed_value(&self, rel: &Path, name: &str) -> Option<String> {
        parse_packed(&self.read_git_file(rel, "packed-refs", 64 << 20)?).remove(name)
    }

    /// The value of the loose ref `name` of the repository holding `rel`, if it has one.
    pub(crate) fn loose_value(&self, rel: &Path, name: &str) -> Option<String> {
        if name
            .split('/')
            .any(|c| c.is_empty() || c == ".." || c == ".")
        {
            return None;
        }
        let text = self.read_git_file(rel, name, 4096)?;
        Some(text.lines().next()?.trim().to_string())
    }

    /// Refuse a ref of the workspace's repository moving to `new` when a commit it brings
    /// changes a path outside `ident`'s scope (see the module doc).
    pub(crate) fn check_ref_move(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        refname: &str,
        new: Option<&str>,
    ) -> Result<usize> {
        let (Some(_), Some(new)) = (self.root_gitdir(rel), new) else {
            return Ok(0);
        };
        if !known_ref(refname) && !refname.starts_with("refs/replace/") {
            return Err(self.git_denial(
                ident,
                caller,
                Operation::Ref,
                rel,
                format!("{refname}: git makes no ref there, and one there would stand for a branch or tag of the same name"),
                "Use branches (refs/heads/…) and tags (refs/tags/…).",
                "git: refs only where git makes them",
            ));
        }
        // Notes name objects in their trees, not worktree paths; nothing checks them out.
        if refname.starts_with("refs/notes/") {
            return Ok(0);
        }
        // Replace refs change what every other object means to git (a tree or a blob
        // swapped under the same commit, which no commit check sees): not an agent's.
        if refname.starts_with("refs/replace/") {
            return Err(self.git_denial(
                    ident,
                    caller,
                    Operation::Ref,
                    rel,
                    format!("{refname}: a replace ref makes git show and check out another object in place of one that exists"),
                    "Do not use `git replace`; commit the change you want instead.",
                    "git: no replace refs",
                ));
        }
        // (Remote-tracking refs too: a name in a state file may resolve to one. A fetch of
        // others' commits that change paths outside the scope is refused; checking them
        // out through the mount would be.)
        let new = match ref_target(new) {
            Some(RefTarget::Oid(o)) => o,
            // A symbolic ref follows its target wherever it moves: only to a local branch
            // (whose every move is checked), as git's HEAD does.
            // (Only HEAD names a branch so: a branch naming another made a chain, HEAD →
            // x → main, through which an attack pass moved `main` as "another branch".)
            Some(RefTarget::Symbolic(to))
                if (refname == "HEAD" && to.starts_with("refs/heads/"))
                    || (refname.starts_with("refs/remotes/")
                        && to.starts_with("refs/remotes/")) =>
            {
                self.check_head_move(ident, caller, rel, refname, Some(new))?;
                return Ok(0);
            }
            Some(RefTarget::Symbolic(to)) => {
                return Err(self.git_denial(
                    ident,
                    caller,
                    Operation::Ref,
                    rel,
                    format!("{refname} would follow {to}: a symbolic ref points only at a local branch (refs/heads/…), whose moves are checked"),
                    "Point HEAD at a branch (`git switch NAME`); do not make symbolic refs to remote-tracking or other refs.",
                    "git: a symbolic ref points at a local branch",
                ));
            }
            None => {
                return Err(self.git_denial(
                    ident,
                    caller,
                    Operation::Ref,
                    rel,
                    format!("{refname} would hold {new:?}: neither an object id nor `ref: …`"),
                    "Move refs with git (`git update-ref`, `git branch`).",
                    "git: a ref holds an object id or a symbolic ref",
                ));
            }
        };
        let n = self.check_new_commits(
            ident,
            caller,
            rel,
            &format!("{refname} cannot move to"),
            &[&new],
        )?;
        self.check_head_move(ident, caller, rel, refname, Some(&new))?;
        Ok(n)
    }

    /// Refuse `refname` moving to `after` (its new first line: an id or `ref: …`; `None`:
    /// gone) when it moves HEAD's commit (HEAD itself, or the branch HEAD names), or another
    /// local branch, to one whose tree differs from the old one outside `ident`'s scope. A
    /// checkout or a hard reset through the mount writes that difference into the worktree,
    /// where it is checked; a soft move (`git reset --soft`, `symbolic-ref`, `update-ref`,
    /// `branch -f`, an orphan branch) would leave it for the human's next reset, abort,
    /// commit or checkout: an attack pass moved HEAD to an orphan branch to pass the check
    /// of what `git am --abort` resets to, and back after.
    pub(crate) fn check_head_move(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        refname: &str,
        after: Option<&str>,
    ) -> Result<()> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        let current = match self
            .loose_value(rel, "HEAD")
            .as_deref()
            .and_then(ref_target)
        {
            Some(RefTarget::Symbolic(to)) => Some(to),
            _ => None,
        };
        let head_move = refname == "HEAD" || current.as_deref() == Some(refname);
        let new_rev = match after.and_then(ref_target) {
            Some(RefTarget::Oid(o)) => Some(o),
            Some(RefTarget::Symbolic(to)) => Some(to),
            None => None,
        };
        // Another local branch: what the human's next checkout of it writes, from its old
        // tip, or (made) from HEAD's: a branch deleted and made again elsewhere was an
        // attack pass's way round the move. (Deleted: nothing to check out.)
        if !(head_move || refname.starts_with("refs/heads/") && new_rev.is_some()) {
            return Ok(());
        }
        let olds: &[&str] = if head_move {
            &["HEAD"]
        } else {
            &[refname, "HEAD"]
        };
        // One `diff-tree` of the two as git resolves them (the usual case); a side git
        // cannot resolve (an unborn branch, a ref made or gone) counts as the empty tree.
        // (`None`: the empty tree, whose id needs the repository's config, read only then.)
        let empty = std::cell::OnceCell::new();
        let tree = |r: Option<&str>| match r {
            Some(r) => r.to_string(),
            None => (*empty.get_or_init(|| empty_tree(self.hexsz(rel)))).to_string(),
        };
        let diff = |a: Option<&str>, b: Option<&str>| {
            let (a, b) = (tree(a), tree(b));
            git(&gitdir, &["diff-tree", "-r", "--name-only", "-z", &a, &b]).map(|d| (a, b, d))
        };
        let found = olds.iter().copied().map(Some).chain([None]).find_map(|o| {
            new_rev
                .as_deref()
                .map(Some)
                .into_iter()
                .chain([None])
                .find_map(|n| diff(o, n))
        });
        let Some((old, new, out)) = found else {
            return Err(self.git_denial(
                ident,
                caller,
                Operation::Ref,
                rel,
                format!("{refname} would move, and git could not compare its trees"),
                "Move HEAD and branches with git (`git checkout`, `git reset --hard`).",
                "git: HEAD moves only within the scope",
            ));
        };
        let short = |r: &str| {
            r.get(..12)
                .filter(|_| r.len() >= 40)
                .unwrap_or(r)
                .to_string()
        };
        let (o, n) = (short(&old), short(&new));
        self.paths_in_scope(ident, caller, rel, Operation::Ref, &[&out], |p, why, remedy| {
            (
                format!("{refname} would move from {o} to {n}, whose trees differ in {p}, which {why}"),
                format!(
                    "Move HEAD and branches only where the worktree may follow: a commit that differs \
                     outside your scope would leave that difference for the human's next reset or checkout. {remedy}"
                ),
            )
        })
    }

    /// Refuse when a commit `news` bring that no local ref has changes a path outside
    /// `ident`'s scope (`refname`: the message's lead, what would bring the commit).
    fn check_new_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        refname: &str,
        news: &[&str],
    ) -> Result<usize> {
        let commits = self.new_commits(rel, news);
        let commits: Vec<&str> = commits.iter().map(String::as_str).collect();
        self.check_commit_paths(ident, caller, rel, refname, &commits)
    }

    /// Refuse when a commit git would apply again — `named` (a todo's `pick`, a rebasing
    /// mail's `From <id>`), whether a ref reaches it or not, or one they bring that no
    /// local ref has — changes a path outside `ident`'s scope. (A `pick` of a human's
    /// out-of-scope commit from another branch, or of one reverted in history, would have
    /// the human's `git rebase --continue` apply it again: an attack pass.)
    fn check_applied_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        what: &str,
        named: &[&str],
    ) -> Result<()> {
        let mut commits = self.new_commits(rel, named);
        commits.extend(named.iter().map(|c| c.to_string()));
        commits.sort();
        commits.dedup();
        let commits: Vec<&str> = commits.iter().map(String::as_str).collect();
        self.check_commit_paths(ident, caller, rel, what, &commits)
            .map(drop)
    }

    /// The commits `news` bring that no local ref has (one `rev-list` for all of them):
    /// what only remote-tracking refs reach counts as new, since those that predate the
    /// mount (a human's fetch) were never checked.
    fn new_commits(&self, rel: &Path, news: &[&str]) -> Vec<String> {
        let Some(gitdir) = self.root_gitdir(rel).filter(|_| !news.is_empty()) else {
            return Vec::new();
        };
        let mut args = vec!["rev-list"];
        args.extend_from_slice(news);
        args.extend(["--not", "--exclude=refs/remotes/*", "--all"]);
        let Some(list) = git(&gitdir, &args) else {
            tracing::warn!(
                ?news,
                "git rev-list: git could not read the repository; commits not checked"
            );
            return Vec::new();
        };
        list.lines()
            .filter(|l| is_oid(l))
            .map(str::to_string)
            .collect()
    }

    /// Refuse when one of `commits` (full ids) changes a path outside the identity's scope:
    /// each against its parent (a merge against each of its parents).
    fn check_commit_paths(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        refname: &str,
        commits: &[&str],
    ) -> Result<usize> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(0);
        };
        if commits.is_empty() {
            return Ok(0);
        }
        // One `diff-tree` for all: each commit's id, then the paths it changes (a merge:
        // its id again before what it changes against each parent).
        let input: String = commits.iter().map(|c| format!("{c}\n")).collect();
        let Some(out) = git_with(
            &gitdir,
            &[
                "diff-tree",
                "--stdin",
                "-r",
                "--name-only",
                "-z",
                "--root",
                // (Against every parent: `--cc` lists only what differs from all of them,
                // and an attack pass's merge of HEAD and an old commit, taking an
                // out-of-scope file from the old one, showed no change at all.)
                "-m",
            ],
            Some(&input),
        ) else {
            return Ok(0);
        };
        let mut c = "";
        for p in out.split('\0').filter(|p| !p.is_empty()) {
            if let Some(id) = commits.iter().find(|id| **id == p) {
                c = id;
                continue;
            }
            let short = &c[..12.min(c.len())];
            self.in_scope(ident, caller, rel, Operation::Commit, p, |why, remedy| {
                (
                    format!("{refname} {short}: that commit changes {p}, which {why}"),
                    format!(
                        "Commit only files inside your scope: `git reset --soft HEAD~1`, unstage {p} \
                         (`git restore --staged {p}`), and commit again. {remedy}"
                    ),
                )
            })?;
        }
        Ok(commits.len())
    }

    /// Refuse `op` on `rel` because of `path`, a path it would have git change, when
    /// `ident` may not change that path (and it is no temporary of the identity's): the
    /// guard's refusal, worded by `say(why, remedy)` from the guard's own reason and remedy.
    fn in_scope(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        op: Operation,
        path: &str,
        say: impl FnOnce(&str, &str) -> (String, String),
    ) -> Result<()> {
        let intent = ident.intent();
        let Err(d) = self
            .gate
            .guard
            .check_write(intent.as_deref(), op, Path::new(path), false)
        else {
            return Ok(());
        };
        if self.gate.temps.covers(&ident.key, Path::new(path)) {
            return Ok(());
        }
        let (message, remedy) = say(d.message.trim_start_matches(path).trim_start(), &d.remedy);
        let denial = Denial::new(
            if d.code == Code::NoIntent {
                Code::NoIntent
            } else {
                Code::ScopeViolation
            },
            op,
            rel,
            intent.as_deref(),
            message,
            remedy,
        )
        .with_rule(d.rule);
        Err(self.gate.deny(ident, caller, denial))
    }

    /// [`Fs::in_scope`] for every path of `outs` (git's NUL-separated lists, each path
    /// judged once, in order), worded by `say(path, why, remedy)`.
    fn paths_in_scope(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        op: Operation,
        outs: &[&str],
        say: impl Fn(&str, &str, &str) -> (String, String),
    ) -> Result<()> {
        let mut paths: Vec<&str> = outs
            .iter()
            .flat_map(|o| o.split('\0'))
            .filter(|p| !p.is_empty())
            .collect();
        paths.sort_unstable();
        paths.dedup();
        for p in paths {
            self.in_scope(ident, caller, rel, op, p, |why, remedy| say(p, why, remedy))?;
        }
        Ok(())
    }
}

/// A name `git am --abort` reads to decide where it resets the worktree: `ORIG_HEAD`, or a
/// file whose existence makes an am session (`rebase-apply/next`, `last`), in the
/// workspace's own repository (see [`Fs::check_am_abort`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmAbortName {
    OrigHead,
    Marker,
}

/// See [`AmAbortName`].
pub fn am_abort_name(rel: &Path) -> Option<AmAbortName> {
    use std::os::unix::ffi::OsStrExt;
    let b = rel.as_os_str().as_bytes();
    if !b.starts_with(b".git/") {
        return None;
    }
    match b {
        b".git/ORIG_HEAD" => Some(AmAbortName::OrigHead),
        b".git/rebase-apply/next" | b".git/rebase-apply/last" => Some(AmAbortName::Marker),
        _ => None,
    }
}

/// Whether a request naming `name` may change what `git am --abort` reads (so it runs
/// under `Fs::am_state`): one of those names, or the directory holding the markers.
pub fn am_lock_name(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    matches!(
        name.as_bytes(),
        b"ORIG_HEAD" | b"next" | b"last" | b"rebase-apply"
    )
}

/// The state files naming the commit a human's abort resets the worktree to: `ORIG_HEAD`
/// (`git am --abort`), a rebase's `orig-head` (`git rebase --abort`), the sequencer's `head`
/// (`git cherry-pick --abort`, `revert --abort`), `BISECT_START` (`git bisect reset`); and
/// any other upper-case file at the top (see [`ListKind::RootRef`]).
pub fn is_reset_target(rel: &Path) -> bool {
    let (parent, name) = parent_and_name(rel);
    matches!(
        (parent, name),
        (".git", "ORIG_HEAD" | "BISECT_START")
            | ("rebase-merge" | "rebase-apply", "orig-head")
            | ("sequencer", "head")
    ) || commit_list_kind(rel) == Some(ListKind::RootRef)
}

/// The state files naming a stash a human's git applies to the worktree when what was left
/// ends (`rebase --continue`/`--abort`, `merge --abort`): a rebase's `autostash`,
/// `MERGE_AUTOSTASH`.
pub fn is_autostash(rel: &Path) -> bool {
    let (parent, name) = parent_and_name(rel);
    matches!(
        (parent, name),
        (".git", "MERGE_AUTOSTASH") | ("rebase-merge" | "rebase-apply", "autostash")
    )
}

/// The name of `rel`'s directory and its own (`""` where there is none, or not UTF-8).
fn parent_and_name(rel: &Path) -> (&str, &str) {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = rel
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    (parent, name)
}

/// A reflog of notes (`logs/refs/notes/…`): their refs move unjudged (see
/// [`Fs::check_ref_move`]).
fn notes_reflog(rel: &Path) -> bool {
    let p: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    p.windows(3)
        .any(|w| w[0] == "logs" && w[1] == "refs" && w[2] == "notes")
}

/// The ref namespaces git itself makes refs in (and `refs/stash`). A ref elsewhere would
/// shadow a branch of the same name (`refs/main` comes before `refs/heads/main` when git
/// resolves `main`: a fourth pass had the human's `git reset --hard main` take an old
/// commit so).
pub fn known_ref(refname: &str) -> bool {
    refname == "HEAD"
        || refname == "refs/stash"
        || [
            "refs/heads/",
            "refs/tags/",
            "refs/remotes/",
            "refs/notes/",
            "refs/rewritten/",
            "refs/bisect/",
            "refs/prefetch/",
            "refs/worktree/",
            "refs/original/",
        ]
        .iter()
        .any(|ns| refname.starts_with(ns))
}

/// Git's empty tree, for a repository whose ids are `hexsz` long.
fn empty_tree(hexsz: usize) -> &'static str {
    if hexsz == 64 {
        "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321"
    } else {
        "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    }
}

/// Does a rebase todo list run commands (`exec`/`x` lines)? A human's `git rebase
/// --continue` would run them.
pub fn todo_runs_commands(text: &[u8]) -> bool {
    String::from_utf8_lossy(text).lines().any(|l| {
        let l = l.trim_start();
        let cmd = l.split_whitespace().next().unwrap_or("");
        matches!(cmd, "exec" | "x")
    })
}

/// Is `rel` a rebase todo list (`rebase-merge/git-rebase-todo`, its lock or backup) in a
/// git directory?
pub fn is_rebase_todo(rel: &Path) -> bool {
    crate::policy::git::in_git_dir(rel)
        && rel
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "rebase-merge")
        && rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("git-rebase-todo"))
}

/// Is `rel` a git state file naming commits that git applies, or resets the worktree to,
/// when someone continues or aborts what was left (`git rebase --continue`/`--abort`,
/// `cherry-pick --continue`, `merge --abort`, a commit with `MERGE_HEAD`): a rebase or
/// sequencer todo list, an autostash, the head a rebase started from or goes onto,
/// `*_HEAD`. An agent could name a commit there that changes files outside its scope,
/// which the human's git would then write. So what such a file names is checked like a
/// ref move (see [`Fs::check_named_commits`]).
pub fn is_commit_list(rel: &Path) -> bool {
    commit_list_kind(rel).is_some()
}

/// How a git state file names commits (see [`is_commit_list`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// A todo list: `pick <id>`, `fixup -C <id>`, `reset <label>`, `merge -C <id> <label>`.
    Todo,
    /// One object id a line (`MERGE_HEAD` may hold several).
    Ids,
    /// `rebase-merge/update-refs`: a ref, its old and its new id, line after line.
    UpdateRefs,
    /// A reflog (`logs/refs/stash`): `<old> <new> <who> <when>\t<message>` lines.
    Reflog,
    /// `BISECT_START`: the branch to return to, or an id.
    BranchOrId,
    /// `rebase-merge/strategy`: one of git's built-in merge strategies.
    Strategy,
    /// `sequencer/opts`, `strategy_opts`: no `subtree` option, built-in strategies only.
    Options,
    /// `rebase-apply/0001`…, `rebase-apply/patch`: the patches `git am --continue` (and a
    /// `rebase --apply`) applies to the worktree. They name no commit; every path they
    /// change must be one the writer may change ([`patch_paths`]).
    Patch,
    /// `rebase-apply/apply-opt`: the options `git am` gives `git apply`. Only those that do
    /// not move where a patch lands ([`apply_opts_ok`]: no `-p`, no `--directory`). And
    /// `rebase-apply/threeway`: `f` only (see `Fs::check_patch`).
    ApplyOpts,
    /// `FETCH_HEAD`: `<id>\t<not-for-merge>\t<what>` lines, what a fetch brought (the
    /// human's `git merge FETCH_HEAD`, and any name git resolves through it): each id must
    /// be one a ref has, or a new commit within the scope.
    FetchHead,
    /// Any other file of upper-case name at the top of a git directory (`MERGE_MSG`,
    /// `BISECT_EXPECTED_REV`, …): git reads a revision name `NAME` as such a file when its
    /// first line is an id, so that id must be one an abort could reset to (an attack pass
    /// wrote a forged commit's id into such files and had names resolve to it).
    RootRef,
    /// `rebase-apply/rebasing`: `git am` then applies the commit each mail's `From <id>`
    /// line names, not the mail's diff (`git rebase --apply`), so every mail there must
    /// name an existing commit that may be applied ([`mail_commit`]).
    Rebasing,
}

/// The commit id a mail's first line names (`From <id> Mon Sep 17 00:00:00 2001`, as `git
/// format-patch` writes it).
/// `hexsz`: the repository's id length (40 for SHA-1, 64 for SHA-256). Read as git's
/// `get_oid_hex` reads it: the first `hexsz` characters after `From `, whatever follows
/// them (an attack pass named a ref `<40-hex id of one commit>aaaa…` that the check
/// resolved while `git am` applied the commit of the first 40 digits).
pub fn mail_commit(text: &[u8], hexsz: usize) -> Option<String> {
    let first = text.split(|&b| b == b'\n').next()?;
    let rest = first.strip_prefix(b"From ")?;
    let id = rest.get(..hexsz)?;
    id.iter()
        .all(u8::is_ascii_hexdigit)
        .then(|| String::from_utf8_lossy(id).to_ascii_lowercase())
}

/// The worktree paths a patch changes, as git reads them: a mail of `git am`'s (`mail`:
/// `rebase-apply/0001`…) goes through `git mailinfo` first (which decodes base64 and
/// quoted-printable bodies and finds where the patch begins), once as is and once with
/// `--quoted-cr=strip` (the two ways `git am` may read it), and the patch through `git
/// apply --numstat -z -p1`, which names every path it would change (both names of a
/// rename or copy). A hand-written reading was bypassed four ways by an attack pass (an
/// encoded body, a header line between `---` and `+++`, `rename old`/`rename new`).
/// `Ok(None)`: git does not read it as a patch (a file still being written, or one the
/// human's `git am` would stop at the same way). `Err`: git could not be run.
pub fn patch_paths(text: &[u8], mail: bool) -> std::result::Result<Option<Vec<String>>, String> {
    // (An empty file, as a write starts it: nothing to apply.)
    if text.is_empty() {
        return Ok(None);
    }
    let dir = tempfile::Builder::new()
        .prefix("intentfs-patch-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let run = |args: &[&str], input: &[u8]| -> std::result::Result<Option<Vec<u8>>, String> {
        use std::io::Write;
        let mut child = Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CEILING_DIRECTORIES", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("git: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("git: no stdin")?;
        let input = input.to_vec();
        // (Fed from a thread: git may answer before it has read it all.)
        let feed = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().map_err(|e| format!("git: {e}"))?;
        let _ = feed.join();
        Ok(out.status.success().then_some(out.stdout))
    };
    let patch = dir.path().join("patch");
    let patch_arg = patch.to_string_lossy().into_owned();
    let mut patches: Vec<Vec<u8>> = Vec::new();
    if mail {
        // Read both ways `git am` may read it: `-n` (no charset conversion: `utf8` at `f`)
        // and `-u` (converted, the default), each with and without `--quoted-cr=strip`.
        // A mail `-n` cannot read is refused (an attack pass set `utf8` to `f` with a
        // charset `-u` cannot convert); one `-u` cannot read is one the human's converting
        // `git am` stops at. The two readings must find the same patch: mailinfo converts a
        // line before it asks whether the patch begins there, and an attack pass hid
        // `+AGQ-iff --git` (UTF-7 for `diff --git`) from an unconverted reading.
        for cr in [None, Some("--quoted-cr=strip")] {
            let reading = |conv: &str| -> std::result::Result<Option<Vec<u8>>, String> {
                let mut args = vec!["mailinfo", conv];
                args.extend(cr);
                args.extend(["/dev/null", patch_arg.as_str()]);
                if run(&args, text)?.is_none() {
                    return Ok(None);
                }
                Ok(Some(std::fs::read(&patch).unwrap_or_default()))
            };
            let Some(plain) = reading("-n")? else {
                return Err("git mailinfo cannot read it".into());
            };
            if let Some(converted) = reading("-u")? {
                if converted != plain {
                    return Err(
                        "its charset changes where git finds its patch (read with and without conversion)"
                            .into(),
                    );
                }
            }
            patches.push(plain);
        }
    } else {
        patches.push(text.to_vec());
    }
    let mut paths = Vec::new();
    let mut read = false;
    // `--numstat` names each change by its new name (its old one for a deletion); the same
    // patch reversed (`-R`) names it by its old one: both names of a rename or copy.
    for p in patches.iter().filter(|p| !p.is_empty()) {
        for reverse in [false, true] {
            let mut args = vec!["apply", "--numstat", "-z", "-p1"];
            if reverse {
                args.push("-R");
            }
            let Some(out) = run(&args, p)? else {
                if reverse {
                    // (Read forward but not reversed: its old names are not known.)
                    return Err("git read the patch but not its reverse".into());
                }
                break;
            };
            read = true;
            // `added\tdeleted\tpath\0` each.
            for f in out.split(|&b| b == 0).filter(|f| !f.is_empty()) {
                let name = f.splitn(3, |&b| b == b'\t').nth(2).unwrap_or_default();
                paths.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    if !read {
        return Ok(None);
    }
    paths.sort();
    paths.dedup();
    Ok(Some(paths))
}

/// Whether `apply-opt` (git's shell-quoted list of `git apply` options) holds only options
/// that leave the patch's paths as they are: whitespace and context handling, `--reject`,
/// `--include`/`--exclude` (which only narrow).
pub fn apply_opts_ok(text: &[u8]) -> bool {
    String::from_utf8_lossy(text)
        .split_whitespace()
        .map(|w| w.trim_matches('\''))
        .all(|w| {
            w.is_empty()
                || [
                    "--whitespace=",
                    "--ignore-whitespace",
                    "--ignore-space-change",
                    "--reject",
                    "--exclude=",
                    "--include=",
                ]
                .iter()
                .any(|o| w.starts_with(o))
                || (w.starts_with("-C") && w[2..].bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Git's built-in merge strategies (any other name is a program git looks for on `PATH`).
fn builtin_strategy(s: &str) -> bool {
    matches!(s, "ort" | "recursive" | "resolve" | "octopus" | "ours")
}

/// What kind of commit-naming state file `rel` is, if it is one.
pub fn commit_list_kind(rel: &Path) -> Option<ListKind> {
    if !crate::policy::git::in_git_dir(rel) {
        return None;
    }
    let (parent, name) = parent_and_name(rel);
    let state = matches!(parent, "rebase-merge" | "rebase-apply");
    if is_rebase_todo(rel) || (state && name == "done") {
        return Some(ListKind::Todo);
    }
    if parent == "sequencer" && matches!(name, "todo" | "done") {
        return Some(ListKind::Todo);
    }
    if state && name == "update-refs" {
        return Some(ListKind::UpdateRefs);
    }
    if state
        && matches!(
            name,
            "autostash" | "orig-head" | "head" | "onto" | "squash-onto" | "stopped-sha" | "amend"
        )
    {
        return Some(ListKind::Ids);
    }
    if parent == "sequencer" && matches!(name, "head" | "abort-safety") {
        return Some(ListKind::Ids);
    }
    // What `git bisect reset` checks out: a branch name, or an id.
    if parent == ".git" && name == "BISECT_START" {
        return Some(ListKind::BranchOrId);
    }
    // Merge strategies and their options (`-X subtree=…` applies a commit's changes under
    // another directory: an in-scope commit written outside the scope).
    if state && name == "strategy" {
        return Some(ListKind::Strategy);
    }
    if (parent == "sequencer" && name == "opts") || (state && name == "strategy_opts") {
        return Some(ListKind::Options);
    }
    // (A mail's name is `next` as `%04d`: `next` is the agent's to write, and a negative
    // one — or one that wraps to negative in git's `int` — names `-001`. Any name of digits,
    // signed or not, is judged as a mail.)
    let digits = name.strip_prefix('-').unwrap_or(name);
    if parent == "rebase-apply"
        && (name == "patch" || (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())))
    {
        return Some(ListKind::Patch);
    }
    if parent == "rebase-apply" && matches!(name, "apply-opt" | "threeway") {
        return Some(ListKind::ApplyOpts);
    }
    if parent == "rebase-apply" && name == "rebasing" {
        return Some(ListKind::Rebasing);
    }
    if parent == ".git"
        && matches!(
            name,
            "MERGE_HEAD"
                | "CHERRY_PICK_HEAD"
                | "REVERT_HEAD"
                | "ORIG_HEAD"
                | "MERGE_AUTOSTASH"
                | "REBASE_HEAD"
                | "BISECT_HEAD"
        )
    {
        return Some(ListKind::Ids);
    }
    if parent == ".git" && name == "FETCH_HEAD" {
        return Some(ListKind::FetchHead);
    }
    // (`AUTO_MERGE` holds a tree, which no checkout or reset takes; names that would
    // resolve through it are refused where they are written.)
    if parent == ".git"
        && crate::policy::git::root_ref_syntax(name)
        && !matches!(name, "HEAD" | "AUTO_MERGE")
    {
        return Some(ListKind::RootRef);
    }
    // Reflogs: git resolves `@{-1}`, `-`, `@{n}` and `branch@{n}` through them, and `git
    // stash pop` moves `refs/stash` to the entry below the top.
    let p: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    if let Some(i) = p.iter().rposition(|c| *c == ".git") {
        let r = &p[i + 1..];
        if r.first() == Some(&"logs")
            && (r.get(1) == Some(&"HEAD") && r.len() == 2
                || r.get(1) == Some(&"refs") && r.len() > 2)
        {
            return Some(ListKind::Reflog);
        }
    }
    None
}

/// A word a todo's `reset` or `merge` may name as a label: one the rebase makes, or any
/// name git could make a label of (`refs/rewritten/<word>`: no `/`, no revision syntax).
/// Git resolves it as `refs/rewritten/<word>` (made by a `label` step, a checked ref
/// move), else as any revision of that name: remote-tracking refs are checked as they
/// move, and files at the top of a git directory that git does not write are refused, so
/// whatever that name finds was checked or is the human's.
fn label_word(w: &str, known: &[&str]) -> bool {
    known.contains(&w)
        || (!w.is_empty()
            // (Git resolves an upper-case name as a file at the top of the git directory:
            // `reset FETCH_HEAD` would reset to whatever that file names.)
            && !crate::policy::git::root_ref_syntax(w)
            && w.len() <= 200
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && !w.starts_with('.')
            && !w.ends_with(".lock"))
}

/// The largest git state file the checks read (a rebase of some 15,000 commits): a larger
/// one is refused rather than read in part.
pub const STATE_MAX: u64 = 1 << 20;

/// Hex digits, 4 to 64 of them (an object id, full or abbreviated, as git accepts it).
fn hex_id(w: &str) -> bool {
    (4..=64).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The objects a commit-naming state file names, as git reads them, or why it is not one
/// git could have written (a name instead of an id, a line git would read differently):
/// `Err(line)`. `complete`: the text is the whole file (else a last line without its
/// newline may be cut short and is skipped).
pub fn named_objects(
    kind: ListKind,
    text: &[u8],
    complete: bool,
    known_labels: &[String],
) -> std::result::Result<Vec<String>, String> {
    let text = String::from_utf8_lossy(text);
    let mut lines: Vec<&str> = text.split('\n').collect();
    // (After the last newline: nothing, or a line still being written.)
    let last = lines.pop().unwrap_or("");
    if complete && !last.trim().is_empty() {
        lines.push(last);
    }
    let mut ids = Vec::new();
    // Labels: `onto` and the new root, those made by the list itself and by the part of
    // the rebase already done (`known_labels`); git finds them as `refs/rewritten/<label>`.
    let mut labels: Vec<&str> = vec!["onto", "[new root]"];
    labels.extend(known_labels.iter().map(String::as_str));
    match kind {
        ListKind::Todo => {
            // Labels the list makes itself may be reset to or merged.
            for l in &lines {
                let mut w = l.split_whitespace();
                if matches!(w.next(), Some("label" | "l")) {
                    labels.extend(w.next());
                }
            }
            for l in &lines {
                let l = l.trim();
                if l.is_empty() || l.starts_with('#') {
                    continue;
                }
                let mut w = l.split_whitespace().peekable();
                let cmd = w.next().unwrap_or("");
                match cmd {
                    "pick" | "p" | "reword" | "r" | "edit" | "e" | "squash" | "s" | "fixup"
                    | "f" | "drop" | "d" | "revert" => {
                        // (`fixup -C <id>`, `fixup -c <id>`.)
                        while w.peek().is_some_and(|a| a.starts_with('-')) {
                            w.next();
                        }
                        let id = w.next().unwrap_or("");
                        if !hex_id(id) {
                            return Err(l.to_string());
                        }
                        ids.push(id.to_string());
                    }
                    "merge" | "m" => {
                        let mut arg = w.next();
                        if matches!(arg, Some("-C" | "-c")) {
                            let id = w.next().unwrap_or("");
                            if !hex_id(id) {
                                return Err(l.to_string());
                            }
                            ids.push(id.to_string());
                            arg = w.next();
                        }
                        // The parents: labels, or ids.
                        for a in arg.into_iter().chain(w).take_while(|a| !a.starts_with('#')) {
                            if hex_id(a) {
                                ids.push(a.to_string());
                            } else if !label_word(a, &labels) {
                                return Err(l.to_string());
                            }
                        }
                    }
                    "reset" | "t" => {
                        let a = l[cmd.len()..].split('#').next().unwrap_or("").trim();
                        if hex_id(a) {
                            ids.push(a.to_string());
                        } else if !label_word(a, &labels) {
                            return Err(l.to_string());
                        }
                    }
                    "label" | "l" | "break" | "b" | "noop" | "update-ref" | "u" => {}
                    // (`exec` is refused on its own; any other word git rejects.)
                    _ => {}
                }
            }
        }
        ListKind::Ids => {
            for l in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                if !is_oid(l) {
                    return Err(l.to_string());
                }
                ids.push(l.to_string());
            }
        }
        ListKind::UpdateRefs => {
            for l in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                if is_oid(l) {
                    ids.push(l.to_string());
                } else if !l.starts_with("refs/") {
                    return Err(l.to_string());
                }
            }
        }
        ListKind::BranchOrId => {
            for l in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                if is_oid(l) {
                    ids.push(l.to_string());
                } else if !label_word(l, &[]) {
                    return Err(l.to_string());
                } else {
                    // (`git bisect reset` checks out the branch of that name: it must be
                    // one, judged as what the worktree is reset to.)
                    ids.push(format!("refs/heads/{l}"));
                }
            }
        }
        ListKind::Strategy => {
            for l in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
                if !builtin_strategy(l) {
                    return Err(l.to_string());
                }
            }
        }
        ListKind::Options => {
            for l in &lines {
                let low = l.to_ascii_lowercase();
                let strategy = low
                    .split_once('=')
                    .filter(|(k, _)| k.trim() == "strategy")
                    .map(|(_, v)| v.trim().trim_matches('"').to_string());
                if low.contains("subtree") || strategy.is_some_and(|v| !builtin_strategy(&v)) {
                    return Err(l.to_string());
                }
            }
        }
        // (Judged by `Fs::check_patch`.)
        ListKind::Patch | ListKind::ApplyOpts | ListKind::Rebasing => {}
        ListKind::FetchHead => {
            for l in lines.iter().filter(|l| !l.trim().is_empty()) {
                match ref_target(l) {
                    Some(RefTarget::Oid(o)) => ids.push(o),
                    _ => return Err(l.to_string()),
                }
            }
        }
        ListKind::RootRef => {
            // As git reads a ref: its first line.
            match lines.first().map(|l| ref_target(l)) {
                Some(Some(RefTarget::Oid(o))) => ids.push(o),
                Some(Some(RefTarget::Symbolic(_))) => return Err(lines[0].to_string()),
                _ => {}
            }
        }
        ListKind::Reflog => {
            for l in lines.iter().filter(|l| !l.trim().is_empty()) {
                let mut w = l.split(' ');
                let (old, new) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
                if !is_oid(old) || !is_oid(new) {
                    return Err(l.to_string());
                }
                ids.push(old.to_string());
                ids.push(new.to_string());
                // `git checkout -` (`@{-1}`) reads where HEAD came from out of the message:
                // `checkout: moving from <from> to <to>`.
                let msg = l.split_once('\t').map_or("", |(_, m)| m);
                if let Some(rest) = msg.split_once("moving from ").map(|(_, r)| r) {
                    for word in rest.split_whitespace().filter(|w| *w != "to") {
                        if hex_id(word) {
                            ids.push(word.to_string());
                        }
                    }
                }
            }
        }
    }
    ids.retain(|i| i.bytes().any(|b| b != b'0'));
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// What `git checkout -` (`@{-1}`, `@{-N}`) would switch to, by the lines of a reflog
/// `text`: the name or id between `checkout: moving from ` and ` to ` in each message.
pub fn reflog_switch_sources(text: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(text);
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let msg = l.split_once('\t')?.1;
            let rest = msg.split_once("moving from ")?.1;
            let from = rest.split_once(" to ").map_or(rest, |(f, _)| f).trim();
            (!from.is_empty()).then(|| from.to_string())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Does `file` hold the loose object `oid`: zlib data of `<type> <size>\0<content>` whose
/// SHA-1 (a 40-digit id) or SHA-256 (64) is `oid`? Git does not check a blob's hash when
/// it checks the blob out, so a file put under an existing object's name with other
/// content would be written into the worktree by the human's next checkout.
pub fn loose_object_matches(file: &std::fs::File, oid: &str) -> bool {
    use sha1::Digest as _;
    use std::io::Read;
    let mut z = flate2::read::ZlibDecoder::new(std::io::BufReader::new(file));
    let mut buf = vec![0u8; 64 << 10];
    let mut s1 = sha1::Sha1::new();
    let mut s2 = sha2::Sha256::new();
    loop {
        match z.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if oid.len() == 40 {
                    s1.update(&buf[..n]);
                } else {
                    s2.update(&buf[..n]);
                }
            }
            Err(_) => return false,
        }
    }
    let got = if oid.len() == 40 {
        hex::encode(s1.finalize())
    } else {
        hex::encode(s2.finalize())
    };
    got == oid
}

/// Names that complete a bare repository's layout (`HEAD`, `objects/`, `refs/`): with all
/// three, git takes any directory for a git directory and reads its `config`.
const GITDIR_MARKS: [&str; 3] = ["HEAD", "objects", "refs"];

/// Names in a git directory that decide what git runs (see `policy::git`).
fn exec_name(name: &str) -> bool {
    name.starts_with("config") || matches!(name, "commondir" | "gitdir" | "hooks" | "worktrees")
}

/// Whether `check_git_layout` has anything to check for this name (a cheap filter for
/// changes of existing files).
pub(crate) fn special_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| GITDIR_MARKS.contains(&n) || exec_name(n) || n.starts_with("attributes"))
}

/// Does the directory behind `dir` look like a git directory to git (`HEAD`, `objects`,
/// `refs` all there)?
fn git_dir_like(dir: std::os::fd::BorrowedFd<'_>) -> bool {
    GITDIR_MARKS
        .iter()
        .all(|m| super::sys::stat_at(dir, std::ffi::OsStr::new(m)).is_ok())
}

impl Fs {
    /// Refuse an entry `name` made, renamed in, or changed in the directory `dir` (at
    /// `dir_rel`) when it would make that directory a git directory (the last of `HEAD`,
    /// `objects/`, `refs/`), or when the directory already is one outside any `.git` and
    /// `name` is what decides what git runs there (`config*`, `hooks/`, `commondir`, …, and
    /// `info/attributes`, `hooks/*` one level down). A bare repository made in scope would
    /// otherwise be a way to run code as whoever runs git there next.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_git_layout(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        dir: std::os::fd::BorrowedFd<'_>,
        dir_rel: &Path,
        name: &std::ffi::OsStr,
    ) -> Result<()> {
        let rel = dir_rel.join(name);
        if crate::policy::git::in_git_dir(&rel) {
            return Ok(());
        }
        let Some(n) = name.to_str() else {
            return Ok(());
        };
        let why = if GITDIR_MARKS.contains(&n) {
            let others = GITDIR_MARKS
                .iter()
                .filter(|m| **m != n)
                .all(|m| super::sys::stat_at(dir, std::ffi::OsStr::new(m)).is_ok());
            others.then(|| {
                format!(
                    "{} would hold HEAD, objects/ and refs/: git takes it for a git directory",
                    show_dir(dir_rel)
                )
            })
        } else if exec_name(n) && git_dir_like(dir) {
            Some(format!(
                "{} is laid out as a git directory, and git reads {n} there",
                show_dir(dir_rel)
            ))
        } else {
            let parent = dir_rel.file_name().and_then(|p| p.to_str()).unwrap_or("");
            let down = matches!(parent, "hooks" | "worktrees")
                || (parent == "info" && n.starts_with("attributes"));
            (down
                && super::sys::open_path(dir, std::ffi::OsStr::new(".."))
                    .is_ok_and(|up| git_dir_like(std::os::fd::AsFd::as_fd(&up))))
            .then(|| {
                format!(
                    "{} is in a directory laid out as a git directory",
                    rel.display()
                )
            })
        };
        let Some(why) = why else { return Ok(()) };
        let d = Denial::new(
            Code::ProtectedPath,
            op,
            &rel,
            ident.intent().as_deref(),
            format!("{} is protected: {why}, whose config and hooks decide what git runs", rel.display()),
            "Do not build or change git directories outside .git: work in the repository as it is, and ask \
             the human if the task needs another repository."
                .into(),
        )
        .with_rule(Some("git: a directory laid out as a git directory (HEAD, objects/, refs/)".into()));
        Err(self.gate.deny(ident, caller, d))
    }
}

impl Fs {
    /// The refusal of a rebase todo list that runs commands.
    pub(crate) fn todo_denial(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
    ) -> super::FsError {
        self.git_denial(
            ident,
            caller,
            Operation::Write,
            rel,
            format!(
                "{} would run commands (`exec` lines), or be a link or another name of a file whose writes are not checked: whoever continues the rebase (`git rebase --continue`) would run them",
                rel.display()
            ),
            "Rebase without `exec`/`-x` steps; run the commands yourself between commits. Leave the todo list a plain file git writes.",
            "git: a rebase todo list may not run commands",
        )
    }

    /// An entry about to become a rebase todo list at `rel` (renamed there, alone or in a
    /// directory moved): refused if it is a symlink (git would read whatever it points
    /// at), a file with another name (writes through that name are not checked), or a
    /// list that runs commands.
    pub(crate) fn check_todo_entry(
        &self,
        ident: &Identity,
        caller: &Caller,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::OsStr,
        rel: &Path,
        from: &Path,
    ) -> Result<()> {
        match commit_list_kind(rel) {
            None => return Ok(()),
            Some(ListKind::Reflog) => {
                return self.check_reflog_arrival(ident, caller, dir, name, rel, from)
            }
            Some(_) => {}
        }
        let st = super::sys::stat_at(dir, name)?;
        let text = match st.st_mode & libc::S_IFMT {
            // (A directory counts as `rebasing` too: git asks only whether it is there.)
            libc::S_IFDIR if commit_list_kind(rel) != Some(ListKind::Rebasing) => return Ok(()),
            libc::S_IFREG if st.st_nlink <= 1 => super::sys::open_read_at(dir, name)
                .ok()
                .and_then(|f| super::hash::read_small(&f, STATE_MAX)),
            _ => None,
        };
        let Some(text) = text else {
            return Err(self.todo_denial(ident, caller, rel));
        };
        self.check_state_file(ident, caller, rel, &text, true)
    }

    /// Whether `node`, about to become a ref, a git state file or an object, has no write
    /// handle open (any identity's) — after waiting up to 200 ms: git closes its lock or
    /// temporary file before renaming or linking it, and the kernel's release of that
    /// handle may come a moment later (`--record async`: the release the recorder queued
    /// comes first). Writes through a handle kept open would change the file unchecked.
    pub(crate) fn writers_gone(&self, node: &super::inode::Node) -> bool {
        self.settled(node);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
        // (A release queued while this waits wakes the recorder, lingering or not.)
        let _w = self.recorder.get().map(|r| r.waker().waiting());
        while node.open_file_handles().iter().any(|h| h.writable) {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        true
    }

    /// A `PROTECTED_PATH` refusal about git's internals, quoting `rule`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn git_denial(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        message: String,
        remedy: &str,
        rule: &str,
    ) -> super::FsError {
        let d = Denial::new(
            Code::ProtectedPath,
            op,
            rel,
            ident.intent().as_deref(),
            message,
            remedy.into(),
        )
        .with_rule(Some(rule.into()));
        self.gate.deny(ident, caller, d)
    }

    /// The commits mails in `rebase-apply/` name (see [`ListKind::Rebasing`]): each one
    /// that is a commit here is checked like a ref move; one that is not is refused when
    /// `must_exist` (git would apply it once it exists).
    fn check_mail_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        ids: &[String],
        must_exist: bool,
    ) -> Result<()> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        if ids.is_empty() {
            return Ok(());
        }
        // Each id as itself (an object of that name, never a ref that looks like one), then
        // peeled to its commit as `git am` peels it.
        let query: String = ids
            .iter()
            .map(|i| format!("{i}\n{i}^{{commit}}\n"))
            .collect();
        let found = git_with(
            &gitdir,
            &["cat-file", "--batch-check=%(objectname) %(objecttype)"],
            Some(&query),
        )
        .unwrap_or_default();
        let lines: Vec<&str> = found.lines().collect();
        let mut commits = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            let itself = lines
                .get(2 * k)
                .and_then(|l| l.split_once(' '))
                .map(|x| x.0);
            let peeled = lines.get(2 * k + 1).and_then(|l| l.split_once(' '));
            match peeled {
                Some((oid, "commit")) if is_oid(oid) && itself == Some(id.as_str()) => {
                    commits.push(oid.to_string())
                }
                _ if must_exist => {
                    return Err(self.git_denial(
                        ident,
                        caller,
                        Operation::Write,
                        rel,
                        format!("{}: {id} is not a commit in this repository (yet), and `git am` in a rebase applies the commit a mail names", rel.display()),
                        "Let git write its own state: `git rebase` and `git am` split and apply patches themselves.",
                        "git: state files name existing commits by id",
                    ))
                }
                _ => {}
            }
        }
        let commits: Vec<&str> = commits.iter().map(String::as_str).collect();
        let what = format!("{} would have git apply", rel.display());
        self.check_applied_commits(ident, caller, rel, &what, &commits)
    }

    /// May `from` (`<git dir>/config.lock`, `name` in `dir`, `src` its stat) be renamed onto
    /// `to`, the git directory's `config`? Only a regular file of one name holding the
    /// configuration now at `to` with `[branch "…"]` sections renamed or removed and nothing
    /// else changed ([`crate::policy::git::branch_sections_only`]): what `git branch -m` and
    /// `-d` write. (The rename also waits for its writers to close, and judges it again
    /// under its locks.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_config_content(
        &self,
        ident: &Identity,
        caller: &Caller,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::OsStr,
        to_dir: std::os::fd::BorrowedFd<'_>,
        src: &super::sys::Stat,
        from: &Path,
        to: &Path,
    ) -> Result<()> {
        let refuse = |why: String| {
            self.git_denial(
                ident,
                caller,
                Operation::Rename,
                to,
                why,
                "Git's configuration changes through the mount only as `git branch -m` and `git branch -d` change it (a branch's section renamed or removed); ask the human for any other setting.",
                "git: config changes only rename or remove [branch] sections",
            )
        };
        if src.st_mode & libc::S_IFMT != libc::S_IFREG || src.st_nlink != 1 {
            return Err(refuse(format!(
                "{} is not a plain file of one name: it cannot become {}",
                from.display(),
                to.display()
            )));
        }
        const LIMIT: u64 = 1 << 20;
        let read = |d: std::os::fd::BorrowedFd<'_>, n: &std::ffi::OsStr| {
            super::sys::open_read_at(d, n)
                .ok()
                .and_then(|f| super::hash::read_small(&f, LIMIT))
        };
        let Some(new) = read(dir, name) else {
            return Err(refuse(format!(
                "{} could not be read whole (over 1 MiB?): it cannot become {}",
                from.display(),
                to.display()
            )));
        };
        let old = read(to_dir, std::ffi::OsStr::new("config")).unwrap_or_default();
        if !crate::policy::git::branch_sections_only(&old, &new) {
            return Err(refuse(format!(
                "{} would change git's configuration beyond renaming or removing branch sections",
                to.display()
            )));
        }
        Ok(())
    }

    /// The refusal of a git state file (`rel`) made other than as git makes it — a file
    /// created and written — by `op`: a directory, a device, a FIFO or a symlink.
    pub(crate) fn state_shape_denial(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        rel: &Path,
    ) -> super::FsError {
        self.git_denial(
            ident,
            caller,
            op,
            rel,
            format!(
                "{} is a git state file: git makes it as a file and writes it, never as a directory, a device, a FIFO or a symlink",
                rel.display()
            ),
            "Let git write its own state (rebase, am, merge, cherry-pick).",
            "git: state files are made as git makes them",
        )
    }

    /// The refusal of a file still open for writing that would become a ref, a git state
    /// file or an object (`to`): writes through that handle would change it unchecked.
    pub(crate) fn still_open_denial(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        from: &Path,
        to: &Path,
    ) -> super::FsError {
        self.git_denial(
            ident,
            caller,
            op,
            to,
            format!(
                "{} is open for writing: as {}, its later writes would change a git ref, state file or object unchecked",
                from.display(),
                to.display()
            ),
            "Close the file before putting it into place (as git does with its lock and temporary files).",
            "git: refs, state files and objects are put into place closed",
        )
    }

    /// After a commit-graph, a pack index or the multi-pack index was put into place
    /// (`rel`): git verifies it against the objects (`commit-graph verify`, `verify-pack`,
    /// `multi-pack-index verify`), and one that does not match them is removed again and
    /// refused. Git trusts these files when it checks commits out.
    pub(crate) fn verify_trusted_index(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
    ) -> Result<()> {
        use crate::policy::git::TrustedIndex;
        let (Some(kind), Some(gitdir)) = (
            crate::policy::git::trusted_index(rel),
            self.root_gitdir(rel),
        ) else {
            return Ok(());
        };
        let path = self.cfg.workspace.join(rel);
        let ok = match kind {
            TrustedIndex::CommitGraph => git(
                &gitdir,
                &["-c", "core.commitGraph=true", "commit-graph", "verify"],
            )
            .is_some(),
            TrustedIndex::PackIndex => {
                git(&gitdir, &["verify-pack", &path.to_string_lossy()]).is_some()
            }
            TrustedIndex::MultiPackIndex => git(&gitdir, &["multi-pack-index", "verify"]).is_some(),
            // A pack's data (or a file beside it) arriving: its index, if there is one yet,
            // is verified against it (git renames the index into place last).
            TrustedIndex::PackData => {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
                let idx = path.with_file_name(format!("{stem}.idx"));
                !idx.exists() || git(&gitdir, &["verify-pack", &idx.to_string_lossy()]).is_some()
            }
        };
        if ok {
            return Ok(());
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::error!(path = %rel.display(), "removing a git index that does not match the objects: {e}");
        }
        Err(self.git_denial(
            ident,
            caller,
            Operation::Rename,
            rel,
            format!("{} does not match the objects it indexes (git verified it): git would check out other content than the commits'", rel.display()),
            "Let git write its indexes (`git gc`, `git commit-graph write`, `git repack`).",
            "git: indexes git trusts must match the objects",
        ))
    }

    /// A file arriving at a loose object's name (linked or renamed there, alone or in a
    /// directory moved): refused unless its content is that object.
    pub(crate) fn check_loose_object(
        &self,
        ident: &Identity,
        caller: &Caller,
        file: Option<&std::fs::File>,
        rel: &Path,
    ) -> Result<()> {
        let Some(oid) = crate::policy::git::loose_object_id(rel) else {
            return Ok(());
        };
        if file.is_some_and(|f| loose_object_matches(f, &oid)) {
            return Ok(());
        }
        Err(self.git_denial(
            ident,
            caller,
            Operation::Rename,
            rel,
            format!(
                "{} is not the git object {oid} its name says: git would check out its content as that object's",
                rel.display()
            ),
            "Let git write its objects (`git hash-object -w`, `git add`, `git commit`).",
            "git: a loose object holds the object its name says",
        ))
    }

    /// Refuse a git state file (see [`is_commit_list`]) whose content names a commit that
    /// brings changes outside `ident`'s scope (what a ref moved to it would be refused for),
    /// or names one otherwise than git writes it (a branch or remote name, which could be
    /// moved after this check), or an object that does not exist yet (made after the
    /// check), or one that is not a commit once peeled (a tag is peeled to its commit).
    /// `complete`: `text` is the whole file (see [`named_objects`]).
    pub(crate) fn check_named_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        text: &[u8],
        complete: bool,
    ) -> Result<()> {
        let (Some(gitdir), Some(kind)) = (self.root_gitdir(rel), commit_list_kind(rel)) else {
            return Ok(());
        };
        let refuse = |why: String| {
            self.git_denial(
                ident,
                caller,
                Operation::Write,
                rel,
                format!("{}: {why}", rel.display()),
                "Let git write its own state (rebase, merge, cherry-pick, stash); name commits by their ids.",
                "git: state files name existing commits by id",
            )
        };
        // (The labels the rebase's finished steps made: a `reset` or `merge` still to come
        // may name them.)
        let done = rel.parent().map(|p| p.join("done"));
        let known: Vec<String> = done
            .filter(|d| kind == ListKind::Todo && d.as_path() != rel)
            .and_then(|d| std::fs::read(self.cfg.workspace.join(d)).ok())
            .map(|t| {
                String::from_utf8_lossy(&t)
                    .lines()
                    .filter_map(|l| {
                        let mut w = l.split_whitespace();
                        matches!(w.next(), Some("label" | "l")).then(|| w.next())?
                    })
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let ids = named_objects(kind, text, complete, &known)
            .map_err(|l| refuse(format!("{l:?} is not how git names a commit there")))?;
        if ids.is_empty() {
            return Ok(());
        }
        // Each id peeled to its commit (abbreviated ids resolved); one git for all.
        let query: String = ids.iter().map(|i| format!("{i}^{{commit}}\n")).collect();
        let Some(found) = git_with(
            &gitdir,
            &["cat-file", "--batch-check=%(objectname) %(objecttype)"],
            Some(&query),
        ) else {
            return Err(refuse("git could not read the commits it names".into()));
        };
        let answers: Vec<&str> = found.lines().collect();
        let mut commits = Vec::with_capacity(ids.len());
        for (id, a) in ids.iter().zip(answers.iter().chain(std::iter::repeat(&""))) {
            match a.split_once(' ') {
                Some((oid, "commit")) if is_oid(oid) => commits.push(oid),
                _ => {
                    return Err(refuse(format!(
                        "{id} is not a commit in this repository (yet)"
                    )))
                }
            }
        }
        // What the human's `git checkout -` switches to: from HEAD, as an abort resets
        // (an attack pass added a line `moving from <an old commit>`, and the human's
        // `git checkout -` wrote the old version of a file outside the scope).
        if kind == ListKind::Reflog {
            for from in reflog_switch_sources(text) {
                // (A branch, as git writes it, or an id: a name resolved otherwise — a tag,
                // an upper-case file at the top — could be made to name something else
                // after this check; a third pass used both.)
                let rev = if hex_id(&from) {
                    format!("{from}^{{commit}}")
                } else {
                    format!("refs/heads/{from}^{{commit}}")
                };
                let Some(c) = resolve_commit(&gitdir, &rev) else {
                    return Err(refuse(format!(
                        "`checkout: moving from {from}` names no branch or commit here (the human's `git checkout -` would switch to whatever comes to hold that name)"
                    )));
                };
                self.check_reset_target(
                    ident,
                    caller,
                    rel,
                    "`git checkout -` would switch the worktree to",
                    &c,
                )?;
            }
        }
        // What the human's `git rebase --continue` moves other branches to (`--update-refs`:
        // a ref, its old and its new id, line after line): as any branch move (a third
        // pass moved a branch back to an old commit so).
        if kind == ListKind::UpdateRefs {
            let text = String::from_utf8_lossy(text);
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            for entry in lines.chunks(3) {
                if let [r, _, new] = entry {
                    if r.starts_with("refs/") && is_oid(new) && new.bytes().any(|b| b != b'0') {
                        self.check_head_move(ident, caller, rel, r, Some(new))?;
                    }
                }
            }
        }
        // What a human's abort resets the worktree to, or the stash it applies.
        let (reset, autostash) = (is_reset_target(rel), is_autostash(rel));
        for c in &commits {
            if reset {
                self.check_reset_target(
                    ident,
                    caller,
                    rel,
                    "a human's abort would reset the worktree to",
                    c,
                )?;
            }
            if autostash {
                self.check_stash_apply(ident, caller, rel, c)?;
            }
        }
        let what = format!("{} would have git apply", rel.display());
        // (A todo list's commits are applied again, their own changes on top of HEAD.)
        if kind == ListKind::Todo {
            return self.check_applied_commits(ident, caller, rel, &what, &commits);
        }
        // What a fetch brought: ids a ref has (a remote-tracking one too, judged as it
        // moved), or new commits judged as any.
        if kind == ListKind::FetchHead {
            let mut args = vec!["rev-list"];
            args.extend(commits.iter().copied());
            args.extend(["--not", "--all"]);
            let Some(list) = git(&gitdir, &args) else {
                return Err(refuse("git could not read the commits it names".into()));
            };
            let news: Vec<&str> = list.lines().filter(|l| is_oid(l)).collect();
            return self
                .check_commit_paths(ident, caller, rel, &what, &news)
                .map(drop);
        }
        // Notes' reflogs: notes name objects in their trees, not worktree paths, and
        // nothing checks them out (a fourth pass found `git notes add` always refused).
        if notes_reflog(rel) {
            return Ok(());
        }
        self.check_new_commits(ident, caller, rel, &what, &commits)
            .map(drop)
    }

    /// Before a write through a handle of a rebase todo list: refuse when the file, with
    /// `data` written at `offset`, would run commands.
    pub(crate) fn check_todo_write(
        &self,
        h: &super::FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let rel = self.display_rel(&h.node);
        // A reflog is judged by what is written into it, line by line (git appends whole
        // lines; one that rewrites part of a line is refused): it may grow large, and
        // what it held was judged as it came.
        if commit_list_kind(&rel) == Some(ListKind::Reflog) {
            return self.check_named_commits(&h.identity, &h.caller, &rel, data, true);
        }
        let end = offset.saturating_add(data.len() as u64);
        let Some(mut text) = self.state_text(h).filter(|_| end <= STATE_MAX) else {
            return Err(self.todo_denial(&h.identity, &h.caller, &rel));
        };
        let end = end as usize;
        if text.len() < end {
            text.resize(end, b' ');
        }
        text[offset as usize..end].copy_from_slice(data);
        // (Judged whole, its last line too: git writes such a file in one write, which
        // reaches the daemon in one request below the 1 MiB cap; a handle kept open with
        // a line held back must not wait for a close that may never come.)
        self.check_state_file(&h.identity, &h.caller, &rel, &text, true)
    }

    /// At the close of a handle of a git state file: the whole of what it leaves (its writes
    /// were checked as they came, but a last line without its newline, or an object named
    /// before it existed, is judged only now). Refused, the file is emptied: an empty state
    /// file is inert (git stops and says so).
    pub(crate) fn check_todo_close(&self, h: &super::FileHandle) -> Result<()> {
        let rel = self.display_rel(&h.node);
        if commit_list_kind(&rel) == Some(ListKind::Reflog) {
            return Ok(());
        }
        let r = match self.state_text(h) {
            Some(text) => self.check_state_file(&h.identity, &h.caller, &rel, &text, true),
            None => Err(self.todo_denial(&h.identity, &h.caller, &rel)),
        };
        if r.is_err() {
            if let Err(e) = h.file.set_len(0) {
                tracing::warn!(path = %rel.display(), "emptying a refused git state file: {e}");
            }
        }
        r
    }

    /// A git state file's content now (read through a descriptor of its own: the handle
    /// may be write-only).
    fn state_text(&self, h: &super::FileHandle) -> Option<Vec<u8>> {
        self.fd(&h.node)
            .ok()
            .and_then(|fd| {
                use std::os::fd::AsFd;
                super::sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()).ok()
            })
            .and_then(|f| super::hash::read_small(&f, STATE_MAX))
    }

    /// A file renamed onto a reflog: a reflog moved from elsewhere in `logs/` (a branch
    /// renamed), or one holding only lines the reflog there holds already (`git reflog
    /// expire`, `reflog delete`). Anything else could name any commit.
    fn check_reflog_arrival(
        &self,
        ident: &Identity,
        caller: &Caller,
        dir: std::os::fd::BorrowedFd<'_>,
        name: &std::ffi::OsStr,
        rel: &Path,
        from: &Path,
    ) -> Result<()> {
        if commit_list_kind(from) == Some(ListKind::Reflog) {
            return Ok(());
        }
        let new = super::sys::open_read_at(dir, name)
            .ok()
            .and_then(|f| super::hash::read_small(&f, 256 << 20));
        let old = std::fs::read(self.cfg.workspace.join(rel)).unwrap_or_default();
        let old: std::collections::HashSet<&[u8]> = old.split(|&b| b == b'\n').collect();
        match new {
            Some(new) if new.split(|&b| b == b'\n').all(|l| old.contains(l)) => Ok(()),
            _ => Err(self.git_denial(
                ident,
                caller,
                Operation::Rename,
                rel,
                format!("{} would hold reflog lines it does not hold now: git resolves `@{{n}}` and `-` through them", rel.display()),
                "Let git keep its reflogs (`git reflog expire`, `git reflog delete`).",
                "git: a reflog only grows by git's own lines",
            )),
        }
    }

    /// A todo list that runs commands, or a state file naming commits it may not.
    pub(crate) fn check_state_file(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        text: &[u8],
        complete: bool,
    ) -> Result<()> {
        if is_rebase_todo(rel) && todo_runs_commands(text) {
            return Err(self.todo_denial(ident, caller, rel));
        }
        if matches!(
            commit_list_kind(rel),
            Some(ListKind::Patch | ListKind::ApplyOpts | ListKind::Rebasing)
        ) {
            return self.check_patch(ident, caller, rel, text);
        }
        self.check_named_commits(ident, caller, rel, text, complete)
    }

    /// A patch `git am --continue` would apply (or the options it gives `git apply`): every
    /// path it changes must be one the writer may change, since the human's git writes
    /// them. (The workspace's own repository: its worktree is the workspace.)
    fn check_patch(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        text: &[u8],
    ) -> Result<()> {
        if self.root_gitdir(rel).is_none() {
            return Ok(());
        }
        let refuse = |why: String| {
            self.git_denial(
                ident,
                caller,
                Operation::Write,
                rel,
                format!("{}: {why}", rel.display()),
                "Let git write its own state: `git am` and `git rebase` split and apply patches themselves.",
                "git: patches git applies change only paths in scope",
            )
        };
        // `rebasing`: the commits the mails there name are what git applies.
        if commit_list_kind(rel) == Some(ListKind::Rebasing) {
            let hexsz = self.hexsz(rel);
            let dir = self
                .cfg
                .workspace
                .join(rel.parent().unwrap_or(Path::new("")));
            let mut ids = Vec::new();
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name();
                let mail = rel.with_file_name(&name);
                if commit_list_kind(&mail) == Some(ListKind::Patch) && name != "patch" {
                    let text = std::fs::File::open(e.path())
                        .ok()
                        .and_then(|f| super::hash::read_small(&f, STATE_MAX));
                    match text.as_deref().and_then(|t| mail_commit(t, hexsz)) {
                        Some(id) => ids.push(id),
                        None => {
                            return Err(refuse(format!(
                                "{} names no commit: git would apply it as a commit",
                                mail.display()
                            )))
                        }
                    }
                }
            }
            return self.check_mail_commits(ident, caller, rel, &ids, true);
        }
        // `threeway`: `git am -3` falls back to a merge whose rename detection can carry a
        // patch of an in-scope path onto any file with the content its `index` line names.
        // Agents apply patches without it.
        if rel.file_name().is_some_and(|n| n == "threeway") {
            if !matches!(text.trim_ascii(), b"" | b"f") {
                return Err(refuse(
                    "a three-way `git am` (-3) may carry a patch onto a file outside the scope through rename detection".into(),
                ));
            }
            return Ok(());
        }
        if commit_list_kind(rel) == Some(ListKind::ApplyOpts) {
            if !apply_opts_ok(text) {
                return Err(refuse(
                    "options that move where a patch applies (-p, --directory) are not allowed"
                        .into(),
                ));
            }
            return Ok(());
        }
        // (Judged as git reads what is there now, as the human's `git am` would.)
        let mail = rel.file_name().is_some_and(|n| n != "patch");
        // The commit a mail names: what `git am` applies instead of its diff once
        // `rebasing` is there (then it must exist; otherwise it is checked when it does).
        if mail {
            let rebasing = self
                .cfg
                .workspace
                .join(rel.with_file_name("rebasing"))
                .exists();
            if let Some(id) = mail_commit(text, self.hexsz(rel)) {
                self.check_mail_commits(ident, caller, rel, &[id], rebasing)?;
            } else if rebasing && !text.is_empty() && text.contains(&b'\n') {
                return Err(refuse(
                    "names no commit, and git applies the commit a mail names here (`rebasing`)"
                        .into(),
                ));
            }
        }
        let paths = match patch_paths(text, mail) {
            Ok(Some(paths)) => paths,
            // Not a patch git reads (yet): the human's git would stop at it just the same.
            Ok(None) => return Ok(()),
            Err(e) => return Err(refuse(format!("could not be read as git reads it ({e})"))),
        };
        // (A name git takes as a worktree path has no empty, `.` or `..` component; one
        // that did would be refused rather than matched against the scope as text.)
        if let Some(p) = paths
            .iter()
            .find(|p| p.is_empty() || p.split('/').any(|c| matches!(c, "" | "." | "..")))
        {
            return Err(refuse(format!("{p:?} is not a worktree path")));
        }
        for p in &paths {
            self.in_scope(ident, caller, rel, Operation::Write, p, |why, remedy| {
                (
                    format!("{}: the patch changes {p}, which {why}", rel.display()),
                    format!("Apply only patches that change files inside your scope. {remedy}"),
                )
            })?;
        }
        Ok(())
    }
}

fn show_dir(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "the workspace root".into()
    } else {
        p.display().to_string()
    }
}

impl Fs {
    /// Whether the workspace's repository holds an am session: `rebase-apply/next` or
    /// `last` (git asks for both; either counts here, the other may come next).
    pub(crate) fn am_session(&self) -> bool {
        let d = self.cfg.workspace.join(".git/rebase-apply");
        ["next", "last"]
            .iter()
            .any(|n| std::fs::symlink_metadata(d.join(n)).is_ok())
    }

    /// The lock a request that may change what `git am --abort` reads holds from its
    /// checks through its change (see [`am_lock_name`]), when one of `names` is such a
    /// name. Taken before any stale lock.
    pub(crate) fn am_lock(
        &self,
        names: &[&std::ffi::OsStr],
    ) -> Option<parking_lot::MutexGuard<'_, ()>> {
        names
            .iter()
            .any(|n| am_lock_name(n))
            .then(|| self.am_state.lock())
    }

    /// [`Fs::am_lock`] for a change of `node` by any of its names.
    pub(crate) fn node_am_lock(
        &self,
        node: &super::inode::Node,
    ) -> Option<parking_lot::MutexGuard<'_, ()>> {
        node.any_name(am_lock_name).then(|| self.am_state.lock())
    }

    /// Before `op` on a name `git am --abort` reads (see [`am_abort_name`]), under the am
    /// lock: while an am session is there, `ORIG_HEAD` does not change (git writes it
    /// before the markers); a marker is made, linked or renamed in (or out) only when
    /// `ORIG_HEAD` holds ([`Fs::check_am_abort`]), and never as a directory, device or
    /// symlink.
    pub(crate) fn check_am_name(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        rel: &Path,
    ) -> Result<()> {
        use Operation as O;
        match am_abort_name(rel) {
            None => Ok(()),
            Some(AmAbortName::OrigHead) => {
                let changes = matches!(
                    op,
                    O::Rename
                        | O::OpenWrite
                        | O::Write
                        | O::Truncate
                        | O::Create
                        | O::Unlink
                        | O::Mknod
                        | O::Mkdir
                        | O::Symlink
                        | O::Link
                );
                if changes && self.am_session() {
                    return Err(self.git_denial(
                        ident,
                        caller,
                        op,
                        rel,
                        format!(
                            "{}: an am session is in .git/rebase-apply, and the human's `git am --abort` resets the worktree to the commit ORIG_HEAD names (with none, it deletes the current branch and every tracked file)",
                            rel.display()
                        ),
                        "Finish or abort the am session first (`git am --continue`, `git am --abort`).",
                        "git: ORIG_HEAD stays while an am session does",
                    ));
                }
                Ok(())
            }
            Some(AmAbortName::Marker) => match op {
                O::Mknod | O::Mkdir | O::Symlink => {
                    Err(self.state_shape_denial(ident, caller, op, rel))
                }
                O::Create | O::Link | O::Rename => self.check_am_abort(ident, caller, op, rel),
                _ => Ok(()),
            },
        }
    }

    /// Before an am session can begin (`rel`, a marker, made or renamed in): the human's
    /// `git am --abort` resets the worktree to the commit `ORIG_HEAD` names, and with none
    /// (or one git cannot read: it then looks for a branch or tag named `ORIG_HEAD`) it
    /// deletes the current branch and resets to the empty tree, removing every tracked
    /// file as whoever runs it (an attack pass). So `ORIG_HEAD` must be a file of its own
    /// holding a full commit id, with no handle open to write it, and resetting to that
    /// commit from HEAD must change only paths in the scope. (`git am` writes `ORIG_HEAD`
    /// before the markers.)
    pub(crate) fn check_am_abort(
        &self,
        ident: &Identity,
        caller: &Caller,
        op: Operation,
        rel: &Path,
    ) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        let refuse = |why: &str| {
            self.git_denial(
                ident,
                caller,
                op,
                rel,
                format!(
                    "{}: {why}, and the human's `git am --abort` would then delete the current branch and every tracked file",
                    rel.display()
                ),
                "Let git start its own am session (`git am`, which writes ORIG_HEAD first). In a repository with no commit yet, make the first commit before `git am`.",
                "git: an am session needs ORIG_HEAD",
            )
        };
        let meta = std::fs::symlink_metadata(gitdir.join("ORIG_HEAD"));
        let Some(meta) = meta
            .ok()
            .filter(|m| m.file_type().is_file() && m.nlink() == 1)
        else {
            return Err(refuse("ORIG_HEAD is not a file of its own"));
        };
        let oid = match self
            .loose_value(rel, "ORIG_HEAD")
            .as_deref()
            .and_then(ref_target)
        {
            Some(RefTarget::Oid(o)) => o,
            _ => return Err(refuse("ORIG_HEAD holds no full commit id")),
        };
        let writer = self
            .table
            .by_backing(meta.dev(), meta.ino())
            .is_some_and(|n| n.open_file_handles().iter().any(|h| h.writable));
        if writer {
            return Err(refuse(
                "ORIG_HEAD is open for writing (it could change after this check)",
            ));
        }
        self.check_reset_target(
            ident,
            caller,
            rel,
            "`git am --abort` would reset the worktree to ORIG_HEAD",
            &oid,
        )
    }

    /// Refuse when resetting the worktree from HEAD, or from the index, to `target` (a
    /// commit a human's abort resets to, see [`is_reset_target`]) would change a path
    /// outside `ident`'s scope: the human's git would write it. (Git itself names HEAD
    /// there; HEAD itself moves only within the scope, see [`Fs::check_head_move`].)
    pub(crate) fn check_reset_target(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        what: &str,
        target: &str,
    ) -> Result<()> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        let refuse = |why: String| {
            self.git_denial(
                ident,
                caller,
                Operation::Write,
                rel,
                format!("{}: {what} {why}", rel.display()),
                "Let git write its own state; to go back to another commit, run `git reset` yourself (the worktree it changes is checked).",
                "git: an abort resets only within the scope",
            )
        };
        let Some(to) = resolve_commit(&gitdir, &format!("{target}^{{commit}}")) else {
            return Err(refuse(format!("{target}, which is not a commit here")));
        };
        let head = resolve_commit(&gitdir, "HEAD^{commit}")
            .unwrap_or_else(|| empty_tree(self.hexsz(rel)).to_string());
        // Against HEAD, and against the index: git's aborts reset from the index (an
        // attack pass left HEAD unborn on an orphan branch with the index full, and named
        // an empty commit: no change against HEAD, every tracked file deleted).
        let against_head = if head == to {
            Some(String::new())
        } else {
            git(
                &gitdir,
                &["diff-tree", "-r", "--name-only", "-z", &head, &to],
            )
        };
        let against_index = git(
            &gitdir,
            &["diff-index", "--cached", "--name-only", "-z", &to],
        );
        let (Some(a), Some(b)) = (against_head, against_index) else {
            return Err(refuse(format!(
                "{to}, which git could not compare with HEAD and the index"
            )));
        };
        let short = &to[..12];
        self.paths_in_scope(ident, caller, rel, Operation::Write, &[&a, &b], |p, why, remedy| {
            (
                format!("{}: {what} {short}, which changes {p} (against HEAD or the index), which {why}", rel.display()),
                format!("Let git write its own state; to go back to another commit, run `git reset` yourself. {remedy}"),
            )
        })
    }

    /// Refuse when applying the stash `stash` (an autostash, see [`is_autostash`]) would
    /// change a path outside `ident`'s scope: what it changes against its base, and the
    /// untracked files it holds (its third parent). Whether a ref keeps the stash or not (a
    /// human's own stash of other files, named by an agent, was applied by the human's
    /// abort).
    fn check_stash_apply(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        stash: &str,
    ) -> Result<()> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        let changed = git(
            &gitdir,
            &[
                "diff-tree",
                "-r",
                "--name-only",
                "-z",
                &format!("{stash}^1"),
                stash,
            ],
        );
        let Some(changed) = changed else {
            return Err(self.git_denial(
                ident,
                caller,
                Operation::Write,
                rel,
                format!("{}: {stash} is not a stash git could apply", rel.display()),
                "Let git write its own state (`git rebase --autostash`, `git merge --autostash`).",
                "git: an autostash changes only paths in the scope",
            ));
        };
        let untracked = git(
            &gitdir,
            &["ls-tree", "-r", "--name-only", "-z", &format!("{stash}^3")],
        )
        .unwrap_or_default();
        let short = &stash[..12.min(stash.len())];
        self.paths_in_scope(ident, caller, rel, Operation::Write, &[&changed, &untracked], |p, why, remedy| {
            (
                format!("{}: the stash {short} it names would be applied to the worktree, and it changes {p}, which {why}", rel.display()),
                format!("Let git write its own state (`git rebase --autostash`). {remedy}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_refs_out_of_order_or_twice_are_found() {
        let a = "a".repeat(40);
        let ok = format!("# pack-refs with: peeled fully-peeled sorted \n{a} refs/heads/a\n^{a}\n{a} refs/heads/b\n");
        assert_eq!(packed_out_of_order(&ok), None);
        let twice = format!("{a} refs/heads/keep\n{a} refs/heads/main\n{a} refs/heads/main\n");
        assert_eq!(
            packed_out_of_order(&twice).as_deref(),
            Some("refs/heads/main")
        );
        let unsorted = format!("{a} refs/heads/main\n{a} refs/heads/keep\n");
        assert_eq!(
            packed_out_of_order(&unsorted).as_deref(),
            Some("refs/heads/keep")
        );
    }

    #[test]
    fn reflog_switch_sources_are_what_checkout_dash_reads() {
        let z = "0".repeat(40);
        let log = format!(
            "{z} {z} a <a@x> 1 +0000\tcheckout: moving from main to feature\n\
             {z} {z} a <a@x> 1 +0000\tcommit: moving from here to there\n\
             {z} {z} a <a@x> 1 +0000\tcheckout: moving from 0123abcd to main\n\
             {z} {z} a <a@x> 1 +0000\treset: moving to HEAD~1\n"
        );
        assert_eq!(
            reflog_switch_sources(log.as_bytes()),
            vec!["0123abcd".to_string(), "here".into(), "main".into()]
        );
    }

    #[test]
    fn a_ref_is_read_as_git_reads_it() {
        let oid = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(ref_target(oid), Some(RefTarget::Oid(oid.into())));
        // Git ignores what follows the id after whitespace: still that id.
        assert_eq!(
            ref_target(&format!("{oid} junk")),
            Some(RefTarget::Oid(oid.into()))
        );
        assert_eq!(
            ref_target(&format!("{oid}\tx")),
            Some(RefTarget::Oid(oid.into()))
        );
        let long = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(ref_target(long), Some(RefTarget::Oid(long.into())));
        assert_eq!(
            ref_target("ref: refs/heads/main"),
            Some(RefTarget::Symbolic("refs/heads/main".into()))
        );
        // Broken for git: too short, glued text, a longer run of hex.
        assert_eq!(ref_target("0123abc"), None);
        assert_eq!(ref_target(&format!("{oid}x")), None);
        assert_eq!(ref_target(&format!("{oid}0")), None);
        assert_eq!(ref_target(""), None);
    }

    #[test]
    fn a_packed_ref_is_read_as_git_reads_it() {
        let t = format!(
            "# pack-refs\n{}\trefs/heads/main\n{} refs/heads/b\n",
            "a".repeat(40),
            "b".repeat(40)
        );
        let p = parse_packed(&t);
        assert_eq!(p.get("refs/heads/main"), Some(&"a".repeat(40)));
        assert_eq!(p.get("refs/heads/b"), Some(&"b".repeat(40)));
    }

    #[test]
    fn patches_are_read_for_the_paths_git_apply_changes() {
        let head = "From ff7745c266a4792cc57045a655cb1997dec1856d Mon Sep 17 00:00:00 2001\nFrom: h <h@x>\nSubject: [PATCH] p\n";
        let mail = |extra: &str, body: &str| format!("{head}{extra}\n{body}").into_bytes();
        let plain = "---\ndiff --git a/src/a.ts b/src/a.ts\nindex 1..2 100644\n--- a/src/a.ts\n+++ b/src/a.ts\n@@ -1 +1 @@\n-x\n+y\n\
diff --git a/old name.ts b/new.ts\nsimilarity index 100%\nrename from old name.ts\nrename to new.ts\n";
        assert_eq!(
            patch_paths(&mail("", plain), true).unwrap().unwrap(),
            ["new.ts", "old name.ts", "src/a.ts"]
        );
        assert_eq!(
            mail_commit(&mail("", plain), 40).as_deref(),
            Some("ff7745c266a4792cc57045a655cb1997dec1856d")
        );
        // As git's get_oid_hex reads it: the first 40 digits, whatever follows.
        assert_eq!(
            mail_commit(
                b"From ff7745c266a4792cc57045a655cb1997dec1856daaaaaaaaaaaaaaaaaaaaaaaa x\n",
                40
            )
            .as_deref(),
            Some("ff7745c266a4792cc57045a655cb1997dec1856d")
        );
        // A charset git cannot convert: read without conversion, as `git am` does with
        // `utf8` at `f`.
        let bogus = mail(
            "Content-Type: text/plain; charset=x-bogus-charset\n",
            "---\ndiff --git a/docs/index.md b/docs/index.md\n--- a/docs/index.md\n+++ b/docs/index.md\n@@ -1 +1 @@\n-# Docs\n+x\n",
        );
        assert_eq!(
            patch_paths(&bogus, true).unwrap().unwrap(),
            ["docs/index.md"]
        );
        // A line that becomes `diff --git` only once converted (UTF-7): the readings differ.
        let utf7 = mail(
            "Content-Type: text/plain; charset=UTF-7\n",
            "msg\n+AGQ-iff --git a/evil.txt b/evil.txt\nnew file mode 100644\nindex 0000000..e69de29\n",
        );
        assert!(patch_paths(&utf7, true).is_err());
        // The four ways an attack pass got a path past a hand-written reading: each is read
        // as git reads it.
        let out = "docs/index.md";
        let b64 = "LS0tCiBkb2NzL2luZGV4Lm1kIHwgMiArLQogMSBmaWxlIGNoYW5nZWQsIDEgaW5zZXJ0aW9uKCsp\n\
LCAxIGRlbGV0aW9uKC0pCgpkaWZmIC0tZ2l0IGEvZG9jcy9pbmRleC5tZCBiL2RvY3MvaW5kZXgu\n\
bWQKaW5kZXggZDBmYTYwZS4uMzU3ZmY3ZiAxMDA2NDQKLS0tIGEvZG9jcy9pbmRleC5tZAorKysg\n\
Yi9kb2NzL2luZGV4Lm1kCkBAIC0xICsxIEBACi0jIERvY3MKKyMgUFdORUQKLS0gCjIuNDcuMwoK\n";
        let mime = |enc: &str| {
            format!("MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: {enc}\n")
        };
        let qp = "---\ndiff --git a/do=\ncs/index.md b/do=\ncs/index.md\nindex d0fa60e..357ff7f 100644\n--- a/do=\ncs/index.md\n+++ b/do=\ncs/index.md\n@@ -1 +1 @@\n-# Docs\n+# PWNED\n";
        let between = "---\ndiff --git a/src/auth/q b/src/auth/z\n--- a/docs/index.md\nindex d0fa60e..357ff7f 100644\n+++ b/docs/index.md\n@@ -1 +1 @@\n-# Docs\n+# PWNED\n";
        let old_rename = "---\ndiff --git a/src/auth/s.ts b/src/auth/s.ts\nsimilarity index 100%\nrename old src/auth/s.ts\nrename new docs/index.md\n";
        for (what, m) in [
            ("base64", mail(&mime("base64"), b64)),
            ("quoted-printable", mail(&mime("quoted-printable"), qp)),
            ("a header line between --- and +++", mail("", between)),
            ("rename old/new", mail("", old_rename)),
        ] {
            let paths = patch_paths(&m, true).unwrap().unwrap_or_default();
            assert!(paths.iter().any(|p| p == out), "{what}: {paths:?}");
        }
        // A bare patch (`rebase-apply/patch`), and what git does not read as a patch (yet).
        assert_eq!(
            patch_paths(
                b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
                false
            )
            .unwrap()
            .unwrap(),
            ["x"]
        );
        assert_eq!(
            patch_paths(b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1", false).unwrap(),
            None
        );
        assert!(apply_opts_ok(b"'--whitespace=fix' '-C1' '--reject'"));
        assert!(apply_opts_ok(b""));
        for bad in [
            &b"'-p2'"[..],
            b"'--directory=src/other'",
            b"'--unsafe-paths'",
            b"-p0",
        ] {
            assert!(!apply_opts_ok(bad), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(
            commit_list_kind(Path::new(".git/rebase-apply/0001")),
            Some(ListKind::Patch)
        );
        assert_eq!(
            commit_list_kind(Path::new(".git/rebase-apply/patch")),
            Some(ListKind::Patch)
        );
        // (`next` at -2, or 4294967294, has git read `-001`.)
        for mail in ["-001", "12345", "7"] {
            assert_eq!(
                commit_list_kind(&Path::new(".git/rebase-apply").join(mail)),
                Some(ListKind::Patch),
                "{mail}"
            );
        }
        assert_eq!(
            commit_list_kind(Path::new(".git/rebase-apply/apply-opt")),
            Some(ListKind::ApplyOpts)
        );
        assert_eq!(commit_list_kind(Path::new(".git/rebase-apply/msg")), None);
    }

    #[test]
    fn state_files_name_commits_by_id_as_git_writes_them() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        let todo = format!(
            "pick 01234 one\nfixup -C {id} two\nlabel onto\nlabel x\nreset onto\nmerge -C abcd x # m\n\
             reset [new root]\n# pick ffff comment\nbreak\nupdate-ref refs/heads/f\n"
        );
        assert_eq!(
            named_objects(ListKind::Todo, todo.as_bytes(), true, &[]),
            Ok(vec![
                "01234".to_string(),
                id.to_string(),
                "abcd".to_string()
            ])
        );
        // A name git would resolve later, wherever it then points: refused.
        for bad in [
            "pick x/evil one\n",
            "pick HEAD@{1}\n",
            "reset origin/main\n",
            "merge -C abcd origin/x\n",
        ] {
            assert!(
                named_objects(ListKind::Todo, bad.as_bytes(), true, &[]).is_err(),
                "{bad}"
            );
        }
        // A last line still being written is left for the whole-file check.
        assert_eq!(
            named_objects(ListKind::Todo, b"pick 0123 a\npick x/ev", false, &[]),
            Ok(vec!["0123".into()])
        );
        assert!(named_objects(ListKind::Todo, b"pick 0123 a\npick x/ev", true, &[]).is_err());
        // One full id a line; a name, `ref:` or an abbreviation is not what git writes.
        assert_eq!(
            named_objects(ListKind::Ids, format!("{id}\n").as_bytes(), true, &[]),
            Ok(vec![id.to_string()])
        );
        for bad in ["x/s\n", "ref: refs/remotes/x/s\n", "01234\n"] {
            assert!(
                named_objects(ListKind::Ids, bad.as_bytes(), true, &[]).is_err(),
                "{bad}"
            );
        }
        let z = "0".repeat(40);
        let u = format!("refs/heads/f\n{z}\n{id}\n");
        assert_eq!(
            named_objects(ListKind::UpdateRefs, u.as_bytes(), true, &[]),
            Ok(vec![id.to_string()])
        );
        let r = format!("{z} {id} A <a@b> 1 +0000\tWIP\n");
        assert_eq!(
            named_objects(ListKind::Reflog, r.as_bytes(), true, &[]),
            Ok(vec![id.to_string()])
        );
        assert_eq!(
            commit_list_kind(Path::new(".git/logs/refs/stash")),
            Some(ListKind::Reflog)
        );
        assert_eq!(
            commit_list_kind(Path::new(".git/rebase-merge/update-refs")),
            Some(ListKind::UpdateRefs)
        );
        assert_eq!(
            commit_list_kind(Path::new(".git/rebase-merge/squash-onto")),
            Some(ListKind::Ids)
        );
        assert_eq!(commit_list_kind(Path::new("src/rebase-merge/onto")), None);
    }

    #[test]
    fn packed_refs_changes_are_found() {
        let a = "# pack-refs with: peeled fully-peeled sorted\n\
                 1111111111111111111111111111111111111111 refs/heads/main\n\
                 2222222222222222222222222222222222222222 refs/tags/v1\n\
                 ^3333333333333333333333333333333333333333\n";
        let b = "# pack-refs with: peeled fully-peeled sorted\n\
                 4444444444444444444444444444444444444444 refs/heads/main\n\
                 5555555555555555555555555555555555555555 refs/heads/new\n";
        let mut c = packed_changes(a, b);
        c.sort();
        assert_eq!(
            c,
            vec![
                (
                    "refs/heads/main".into(),
                    Some("1".repeat(40)),
                    Some("4".repeat(40))
                ),
                ("refs/heads/new".into(), None, Some("5".repeat(40))),
                ("refs/tags/v1".into(), Some("2".repeat(40)), None),
            ]
        );
    }
}
