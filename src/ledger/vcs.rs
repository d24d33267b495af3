//! The workspace's git revision, read from `.git` directly (never by running git:
//! the writer asks once per batch and a process spawn would cost more than the fsync).
//!
//! Handles a `.git` directory or a `.git` file (`gitdir: ...`, as in worktrees and
//! submodules, with `commondir`), a detached `HEAD`, loose refs and `packed-refs`.
//! The answer is cached and re-read only when one of the files it came from changes
//! (inode, size or mtime), so a batch costs a few `stat`s.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::entry::Vcs;

/// Identity of a file version: (inode, size, mtime seconds, mtime nanoseconds).
type Stamp = Option<(u64, u64, i64, i64)>;

fn stamp(p: &Path) -> Stamp {
    fs::metadata(p)
        .ok()
        .map(|m| (m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The files an answer was read from (with their stamps), and the answer.
type Cached = (Vec<(PathBuf, Stamp)>, Option<String>);

/// How long the ledger's writer trusts an answer without looking at the files again
/// ([`GitHead::vcs_within`]): an entry made within this of a change of `HEAD` outside the
/// mount may name the revision before it. A change through the mount is seen at once (its
/// `REF` entry). Looking every entry cost one `stat` per file consulted (three or four in
/// a git workspace) for every entry: 1,164 `statx` calls in one run of the benchmark's
/// edit loop, in a workspace that is not even a repository.
pub const RECHECK: std::time::Duration = std::time::Duration::from_millis(2);

/// Cached reader of a workspace's `HEAD` revision.
#[derive(Debug)]
pub struct GitHead {
    /// The workspace root (where `.git` is looked for).
    workspace: PathBuf,
    /// The stamps the cached answer was computed from, and the answer.
    cache: Option<Cached>,
    /// When the cached answer was last checked against its files.
    checked: Option<std::time::Instant>,
}

impl GitHead {
    /// A reader for `workspace/.git`; nothing is read until [`GitHead::vcs`].
    pub fn new(workspace: &Path) -> GitHead {
        GitHead {
            workspace: workspace.to_path_buf(),
            cache: None,
            checked: None,
        }
    }

    /// The `vcs` field for an entry now: None when the workspace is not a git
    /// repository or `HEAD` does not resolve (unborn branch).
    pub fn vcs(&mut self) -> Option<Vcs> {
        self.revision().map(|revision| Vcs {
            kind: "git".to_owned(),
            revision,
        })
    }

    /// [`GitHead::vcs`], looking at the files again only when the answer is older than
    /// `max_age` or `now` says so (an entry that moved a ref: the next one names the
    /// revision after it).
    pub fn vcs_within(&mut self, max_age: std::time::Duration, now: bool) -> Option<Vcs> {
        let fresh =
            !now && self.cache.is_some() && self.checked.is_some_and(|t| t.elapsed() < max_age);
        if fresh {
            let answer = self.cache.as_ref().and_then(|(_, a)| a.clone());
            return answer.map(|revision| Vcs {
                kind: "git".to_owned(),
                revision,
            });
        }
        self.vcs()
    }

    /// The commit `HEAD` resolves to, cached by file stamps.
    pub fn revision(&mut self) -> Option<String> {
        self.checked = Some(std::time::Instant::now());
        if let Some((stamps, answer)) = &self.cache {
            if stamps.iter().all(|(p, s)| stamp(p) == *s) {
                return answer.clone();
            }
        }
        let mut watched = Vec::new();
        let answer = self.resolve(&mut watched);
        let stamps = watched.into_iter().map(|p| {
            let s = stamp(&p);
            (p, s)
        });
        self.cache = Some((stamps.collect(), answer.clone()));
        answer
    }

    /// Reads HEAD and the ref it names; every file consulted is pushed to `watched`
    /// (also the ones that do not exist: their appearance must invalidate the cache).
    fn resolve(&self, watched: &mut Vec<PathBuf>) -> Option<String> {
        let dot_git = self.workspace.join(".git");
        watched.push(dot_git.clone());
        let git_dir = git_dir(&dot_git)?;
        let common_dir = match fs::read_to_string(git_dir.join("commondir")) {
            Ok(c) => absolutize(&git_dir, c.trim()),
            Err(_) => git_dir.clone(),
        };
        let head_path = git_dir.join("HEAD");
        watched.push(head_path.clone());
        let head = fs::read_to_string(&head_path).ok()?;
        let head = head.trim();
        let Some(refname) = head.strip_prefix("ref:") else {
            return is_hex_oid(head).then(|| head.to_ascii_lowercase());
        };
        let refname = refname.trim();
        if refname.split('/').any(|c| c == ".." || c.is_empty()) {
            return None;
        }
        // Per-worktree refs live in the worktree's git dir, shared ones in the common dir.
        for dir in [&git_dir, &common_dir] {
            let loose = dir.join(refname);
            watched.push(loose.clone());
            if let Ok(s) = fs::read_to_string(&loose) {
                let s = s.trim();
                if is_hex_oid(s) {
                    return Some(s.to_ascii_lowercase());
                }
            }
            if git_dir == common_dir {
                break;
            }
        }
        let packed = common_dir.join("packed-refs");
        watched.push(packed.clone());
        let packed = fs::read_to_string(&packed).ok()?;
        packed.lines().find_map(|line| {
            let (oid, name) = line.split_once(' ')?;
            (name.trim() == refname && is_hex_oid(oid)).then(|| oid.to_ascii_lowercase())
        })
    }
}

/// The git directory for a `.git` entry: itself when a directory, the `gitdir:`
/// target when a file.
fn git_dir(dot_git: &Path) -> Option<PathBuf> {
    let meta = fs::metadata(dot_git).ok()?;
    if meta.is_dir() {
        return Some(dot_git.to_path_buf());
    }
    let text = fs::read_to_string(dot_git).ok()?;
    let target = text.lines().find_map(|l| l.strip_prefix("gitdir:"))?.trim();
    let base = dot_git.parent().unwrap_or(Path::new("."));
    Some(absolutize(base, target))
}

fn absolutize(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

fn is_hex_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";
    const C: &str = "3333333333333333333333333333333333333333";

    #[test]
    fn an_answer_is_trusted_for_its_age_unless_told() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        fs::create_dir_all(git.join("refs/heads")).unwrap();
        fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(git.join("refs/heads/main"), format!("{A}\n")).unwrap();
        let mut head = GitHead::new(dir.path());
        let day = std::time::Duration::from_secs(86_400);
        let rev = |v: Option<Vcs>| v.map(|v| v.revision);
        assert_eq!(rev(head.vcs_within(day, false)).as_deref(), Some(A));
        fs::write(git.join("refs/heads/main"), format!("{B}\n")).unwrap();
        assert_eq!(
            rev(head.vcs_within(day, false)).as_deref(),
            Some(A),
            "within its age"
        );
        assert_eq!(rev(head.vcs_within(day, true)).as_deref(), Some(B), "told");
        fs::write(git.join("refs/heads/main"), format!("{C}\n")).unwrap();
        assert_eq!(
            rev(head.vcs_within(std::time::Duration::ZERO, false)).as_deref(),
            Some(C),
            "older than its age"
        );
    }

    #[test]
    fn no_git_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GitHead::new(dir.path()).revision(), None);
    }

    #[test]
    fn loose_ref_packed_ref_detached_and_cache_invalidation() {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        fs::create_dir_all(git.join("refs/heads")).unwrap();
        fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let mut head = GitHead::new(dir.path());
        assert_eq!(head.revision(), None, "unborn branch");

        fs::write(
            git.join("packed-refs"),
            format!("# pack-refs with: peeled\n{B} refs/heads/main\n"),
        )
        .unwrap();
        assert_eq!(head.revision().as_deref(), Some(B), "packed ref");

        fs::write(git.join("refs/heads/main"), format!("{A}\n")).unwrap();
        assert_eq!(
            head.revision().as_deref(),
            Some(A),
            "loose ref wins, cache invalidated"
        );

        // A commit replaces the ref file (new inode) even within the same mtime tick.
        let tmp = git.join("refs/heads/main.lock");
        fs::write(&tmp, format!("{C}\n")).unwrap();
        fs::rename(&tmp, git.join("refs/heads/main")).unwrap();
        assert_eq!(head.revision().as_deref(), Some(C));

        fs::write(git.join("HEAD"), format!("{B}\n")).unwrap();
        assert_eq!(
            head.vcs(),
            Some(Vcs {
                kind: "git".into(),
                revision: B.into()
            }),
            "detached"
        );
    }

    #[test]
    fn gitdir_file_with_commondir() {
        let dir = tempfile::tempdir().unwrap();
        let main_git = dir.path().join("main/.git");
        let wt_git = main_git.join("worktrees/wt");
        fs::create_dir_all(main_git.join("refs/heads")).unwrap();
        fs::create_dir_all(&wt_git).unwrap();
        fs::write(main_git.join("refs/heads/feature"), format!("{A}\n")).unwrap();
        fs::write(wt_git.join("HEAD"), "ref: refs/heads/feature\n").unwrap();
        fs::write(wt_git.join("commondir"), "../..\n").unwrap();
        let wt = dir.path().join("wt");
        fs::create_dir_all(&wt).unwrap();
        fs::write(wt.join(".git"), format!("gitdir: {}\n", wt_git.display())).unwrap();
        assert_eq!(GitHead::new(&wt).revision().as_deref(), Some(A));
    }
}
