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
        .arg("--git-dir")
        .arg(gitdir)
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(["-c", "core.pager=cat", "-c", "safe.directory=*"])
        .args(args)
        .env_clear()
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
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(oid, _)| is_oid(oid))
        .map(|(oid, name)| (name.trim().to_string(), oid.to_string()))
        .collect()
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
        // Replace refs change what every other object means to git (a tree or a blob
        // swapped under the same commit, which no commit check sees): not an agent's.
        if refname.starts_with("refs/replace/") {
            let d = Denial::new(
                Code::ProtectedPath,
                Operation::Ref,
                rel,
                ident.intent().as_deref(),
                format!("{refname}: a replace ref makes git show and check out another object in place of one that exists"),
                "Do not use `git replace`; commit the change you want instead.".into(),
            )
            .with_rule(Some("git: no replace refs".into()));
            return Err(self.gate.deny(ident, caller, d));
        }
        if refname.starts_with("refs/remotes/") {
            return Ok(0);
        }
        let new = match ref_target(new) {
            Some(RefTarget::Oid(o)) => o,
            Some(RefTarget::Symbolic(_)) => return Ok(0),
            None => {
                let d = Denial::new(
                    Code::ProtectedPath,
                    Operation::Ref,
                    rel,
                    ident.intent().as_deref(),
                    format!("{refname} would hold {new:?}: neither an object id nor `ref: …`"),
                    "Move refs with git (`git update-ref`, `git branch`).".into(),
                )
                .with_rule(Some(
                    "git: a ref holds an object id or a symbolic ref".into(),
                ));
                return Err(self.gate.deny(ident, caller, d));
            }
        };
        self.check_new_commits(
            ident,
            caller,
            rel,
            &format!("{refname} cannot move to"),
            &new,
        )
    }

    /// Refuse when a commit `new` brings that no checked ref has changes a path outside
    /// `ident`'s scope (`refname`: the message's lead, what would bring the commit).
    fn check_new_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        refname: &str,
        new: &str,
    ) -> Result<usize> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(0);
        };
        // The commits no checked ref has: remote-tracking refs are not checked when they
        // move (a fetch brings others' commits), so what only they reach counts as new
        // (else a commit parked on `refs/remotes/…` first would pass unchecked).
        let list = git(
            &gitdir,
            &[
                "rev-list",
                new,
                "--not",
                "--exclude=refs/remotes/*",
                "--all",
            ],
        );
        let Some(list) = list else {
            tracing::warn!(
                "git rev-list {new}: git could not read the repository; commit not checked"
            );
            return Ok(0);
        };
        let commits: Vec<&str> = list.lines().filter(|l| is_oid(l)).collect();
        let intent = ident.intent();
        for c in &commits {
            let parents =
                git(&gitdir, &["rev-list", "--parents", "-n", "1", c]).unwrap_or_default();
            let merge = parents.split_whitespace().count() > 2;
            // A merge: what differs from every parent (`--cc`); else against its parent.
            let how = if merge { "--cc" } else { "--root" };
            let args = [
                "diff-tree",
                "-r",
                "--no-commit-id",
                "--name-only",
                "-z",
                how,
                c,
            ];
            let Some(paths) = git(&gitdir, &args) else {
                continue;
            };
            for p in paths.split('\0').filter(|p| !p.is_empty() && !is_oid(p)) {
                let path = Path::new(p);
                if let Err(d) =
                    self.gate
                        .guard
                        .check_write(intent.as_deref(), Operation::Commit, path, false)
                {
                    if self.gate.temps.covers(&ident.key, path) {
                        continue;
                    }
                    let short = &c[..12.min(c.len())];
                    let denial = Denial::new(
                        if d.code == Code::NoIntent { Code::NoIntent } else { Code::ScopeViolation },
                        Operation::Commit,
                        rel,
                        intent.as_deref(),
                        format!(
                            "{refname} {short}: that commit changes {p}, which {}",
                            d.message.trim_start_matches(p).trim_start()
                        ),
                        format!(
                            "Commit only files inside your scope: `git reset --soft HEAD~1`, unstage {p} \
                             (`git restore --staged {p}`), and commit again. {}",
                            d.remedy
                        ),
                    )
                    .with_rule(d.rule);
                    return Err(self.gate.deny(ident, caller, denial));
                }
            }
        }
        Ok(commits.len())
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
    if !crate::policy::git::in_git_dir(rel) {
        return false;
    }
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = rel
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    is_rebase_todo(rel)
        || (matches!(parent, "rebase-merge" | "rebase-apply")
            && matches!(
                name,
                "autostash" | "orig-head" | "onto" | "stopped-sha" | "amend" | "done"
            ))
        || (parent == "sequencer" && matches!(name, "todo" | "done" | "head" | "abort-safety"))
        || (parent == ".git"
            && matches!(
                name,
                "MERGE_HEAD"
                    | "CHERRY_PICK_HEAD"
                    | "REVERT_HEAD"
                    | "ORIG_HEAD"
                    | "MERGE_AUTOSTASH"
                    | "AUTO_MERGE"
                    | "REBASE_HEAD"
                    | "BISECT_HEAD"
            ))
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

/// Words of `text` that may name an object (7 to 64 hex digits).
fn oid_words(text: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = String::from_utf8_lossy(text)
        .split(|c: char| c.is_whitespace() || c == ':' || c == '^' || c == '~')
        .filter(|w| (7..=64).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Is `rel` a git directory's `rebase-merge` (where git reads the todo list from)? A
/// symlink of that name would make git read a todo list the checks never see.
pub fn is_rebase_dir(rel: &Path) -> bool {
    crate::policy::git::in_git_dir(rel) && rel.file_name().is_some_and(|n| n == "rebase-merge")
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
        let d = Denial::new(
            Code::ProtectedPath,
            Operation::Write,
            rel,
            ident.intent().as_deref(),
            format!(
                "{} would run commands (`exec` lines), or be a link or another name of a file whose writes are not checked: whoever continues the rebase (`git rebase --continue`) would run them",
                rel.display()
            ),
            "Rebase without `exec`/`-x` steps; run the commands yourself between commits. Leave the todo list a plain file git writes.".into(),
        )
        .with_rule(Some("git: a rebase todo list may not run commands".into()));
        self.gate.deny(ident, caller, d)
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
    ) -> Result<()> {
        if !is_commit_list(rel) {
            return Ok(());
        }
        let st = super::sys::stat_at(dir, name)?;
        let text = match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => return Ok(()),
            libc::S_IFREG if st.st_nlink <= 1 => super::sys::open_read_at(dir, name)
                .ok()
                .and_then(|f| super::hash::read_small(&f, 16 << 20))
                .unwrap_or_default(),
            _ => return Err(self.todo_denial(ident, caller, rel)),
        };
        if is_rebase_todo(rel) && todo_runs_commands(&text) {
            return Err(self.todo_denial(ident, caller, rel));
        }
        self.check_named_commits(ident, caller, rel, &text)
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
        let d = Denial::new(
            Code::ProtectedPath,
            op,
            to,
            ident.intent().as_deref(),
            format!(
                "{} is open for writing: as {}, its later writes would change a git ref, state file or object unchecked",
                from.display(),
                to.display()
            ),
            "Close the file before putting it into place (as git does with its lock and temporary files).".into(),
        )
        .with_rule(Some("git: refs, state files and objects are put into place closed".into()));
        self.gate.deny(ident, caller, d)
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
        let d = Denial::new(
            Code::ProtectedPath,
            Operation::Rename,
            rel,
            ident.intent().as_deref(),
            format!(
                "{} is not the git object {oid} its name says: git would check out its content as that object's",
                rel.display()
            ),
            "Let git write its objects (`git hash-object -w`, `git add`, `git commit`).".into(),
        )
        .with_rule(Some("git: a loose object holds the object its name says".into()));
        Err(self.gate.deny(ident, caller, d))
    }

    /// Refuse a git state file (see [`is_commit_list`]) whose content names a commit that
    /// brings changes outside `ident`'s scope (what a ref moved to it would be refused for).
    pub(crate) fn check_named_commits(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        text: &[u8],
    ) -> Result<()> {
        let Some(gitdir) = self.root_gitdir(rel) else {
            return Ok(());
        };
        let words = oid_words(text);
        if words.is_empty() {
            return Ok(());
        }
        // Which words are commits (abbreviated ids resolved); one git for all of them.
        let Some(found) = git_with(
            &gitdir,
            &["cat-file", "--batch-check=%(objectname) %(objecttype)"],
            Some(&(words.join("\n") + "\n")),
        ) else {
            return Ok(());
        };
        let what = format!("{} would have git apply", rel.display());
        for line in found.lines() {
            if let Some((oid, "commit")) = line.split_once(' ') {
                self.check_new_commits(ident, caller, rel, &what, oid)?;
            }
        }
        Ok(())
    }

    /// Before a write through a handle of a rebase todo list: refuse when the file, with
    /// `data` written at `offset`, would run commands.
    pub(crate) fn check_todo_write(
        &self,
        h: &super::FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let mut text = super::hash::read_small(&h.file, 16 << 20).unwrap_or_default();
        let end = offset as usize + data.len();
        if text.len() < end {
            text.resize(end, b' ');
        }
        text[offset as usize..end].copy_from_slice(data);
        let rel = self.display_rel(&h.node);
        if todo_runs_commands(&text) && is_rebase_todo(&rel) {
            return Err(self.todo_denial(&h.identity, &h.caller, &rel));
        }
        self.check_named_commits(&h.identity, &h.caller, &rel, &text)
    }
}

fn show_dir(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        "the workspace root".into()
    } else {
        p.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
