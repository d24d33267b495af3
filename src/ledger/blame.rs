//! Line-level attribution: for each line of a file as it is now, which intent and
//! agent last changed it, replayed from the line ranges the ledger recorded.
//!
//! The replay is honest about its limits. Ranges mark changed lines of each new
//! version, but not where lines were deleted, so lines are not shifted between
//! versions: an attribution stays on its line number. If the file on disk no longer
//! has the last recorded hash, it was changed outside the mount: with the recorded
//! version at hand (the content store, through [`blame_with`]'s lookup) the file is
//! diffed against it and every line still there keeps its attribution, only the lines
//! added or changed outside are "changed outside the mount"; without it, every line is.
//! Lines no recorded range covers "predate the ledger". Pure over the ledger, one file,
//! and the lookup.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::entry::{Entry, MutationType};
use super::ranges::sha256_bytes;
use super::reader::{outcome_failed, read_entries, rekey, remove_tree};

/// The entry a line (or version) is attributed to.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Change {
    /// The intent that made it.
    pub intent_id: Option<String>,
    /// The agent name.
    pub agent: Option<String>,
    /// The entry's id.
    pub entry_id: String,
    /// When.
    pub timestamp: String,
    /// Mutation type (`WRITE`, `TRUNCATE`, ...).
    pub mutation_type: MutationType,
    /// The content hash it recorded.
    pub content_hash: Option<String>,
}

/// Where one line comes from.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", tag = "origin")]
pub enum Origin {
    /// Last changed by this entry's recorded ranges.
    Ledger(Change),
    /// Changed by this entry, which recorded no line ranges (binary or > 1 MiB at the
    /// time): the line may or may not be its work.
    Unranged(Change),
    /// No recorded range covers it.
    PredatesLedger,
    /// The file changed outside the mount since its last entry.
    ChangedOutside,
}

/// One line of the blame.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct BlameLine {
    /// 1-based line number.
    pub line: u32,
    /// Attribution.
    #[serde(flatten)]
    pub origin: Origin,
    /// The line's text (lossy UTF-8, without the newline).
    pub text: String,
}

/// The result of [`blame`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct BlameReport {
    /// The workspace-relative path asked about.
    pub path: String,
    /// Hash of the file on disk now.
    pub current_hash: String,
    /// The last hash the ledger recorded for it.
    pub recorded_hash: Option<String>,
    /// Why the attribution is not exact, if it is not.
    pub warning: Option<String>,
    /// Every recorded version of the file, oldest first (following renames).
    pub versions: Vec<Change>,
    /// One per line of the file as it is now.
    pub lines: Vec<BlameLine>,
}

#[derive(Clone, Default)]
struct FileAttr {
    /// Per line, index into `changes` of its last change.
    lines: Vec<Option<usize>>,
    /// A change without ranges that touched lines not covered later.
    unranged: Option<usize>,
    /// Last recorded content hash.
    hash: Option<String>,
    /// Every version, as indexes into `changes`.
    versions: Vec<usize>,
}

impl FileAttr {
    /// The lines in `ranges` were last changed by change `idx`.
    fn mark(&mut self, ranges: &[super::LineRange], idx: usize) {
        for r in ranges {
            let (s, end) = (r.start_line.max(1) as usize, r.end_line as usize);
            if end < s {
                continue;
            }
            if self.lines.len() < end {
                self.lines.resize(end, None);
            }
            self.lines[s - 1..end].fill(Some(idx));
        }
    }
}

fn change_of(e: &Entry) -> Change {
    Change {
        intent_id: e.intent_id.clone(),
        agent: e.agent.as_ref().map(|a| a.name.clone()),
        entry_id: e.id.clone(),
        timestamp: e.timestamp.clone(),
        mutation_type: e.mutation_type,
        content_hash: e.content_hash.clone(),
    }
}

/// The attribution state of every path, entry after entry.
#[derive(Default)]
struct Replay {
    files: HashMap<PathBuf, FileAttr>,
    changes: Vec<Change>,
}

/// Replays `entries` and returns the attribution state of every path.
fn replay(entries: &[(u64, Entry)]) -> (HashMap<PathBuf, FileAttr>, Vec<Change>) {
    let mut r = Replay::default();
    for (_, e) in entries {
        r.apply(e);
    }
    (r.files, r.changes)
}

impl Replay {
    /// Takes one more entry into the attribution.
    fn apply(&mut self, e: &Entry) {
        let Replay { files, changes } = self;
        if e.mutation_type.is_governance() || outcome_failed(&e.outcome) {
            return;
        }
        let Some(path) = e.path_buf() else { return };
        match e.mutation_type {
            MutationType::Delete | MutationType::Rmdir => remove_tree(files, &path),
            MutationType::Rename => {
                // A rename over a file that recorded its changed lines (`sed -i`, an editor,
                // `os.replace`) is an edit of the file it replaced: that file's attribution
                // stays for the lines it did not change.
                let replaced = e.ranges.as_ref().and_then(|_| files.get(&path).cloned());
                let mut known_source = false;
                if let Some(from) = e.from_buf() {
                    known_source = files.contains_key(&from);
                    remove_tree(files, &path);
                    rekey(files, &from, &path);
                }
                // Content whose writes were not ledgered line by line (written under
                // `.git/`, say) arrives here whole: the rename is its change.
                if !known_source && replaced.is_none() && e.content_hash.is_some() {
                    let idx = changes.len();
                    changes.push(change_of(e));
                    let attr = files.entry(path.clone()).or_default();
                    *attr = FileAttr::default();
                    attr.versions.push(idx);
                    attr.unranged = Some(idx);
                }
                if let (Some(mut attr), Some(ranges)) = (replaced, &e.ranges) {
                    let idx = changes.len();
                    changes.push(change_of(e));
                    attr.versions.push(idx);
                    attr.mark(ranges, idx);
                    files.insert(path.clone(), attr);
                }
            }
            MutationType::Link => {
                if let Some(attr) = e.from_buf().and_then(|f| files.get(&f).cloned()) {
                    files.insert(path.clone(), attr);
                }
            }
            // A truncation through a write handle: the handle's WRITE (at close) records the
            // lines changed since before its first change, this one included.
            MutationType::Truncate
                if e.detail.as_ref().is_some_and(|d| d.get("handle").is_some()) => {}
            MutationType::Write
            | MutationType::Truncate
            | MutationType::Mknod
            | MutationType::Create => {
                let idx = changes.len();
                changes.push(change_of(e));
                let attr = files.entry(path.clone()).or_default();
                if e.created
                    || e.mutation_type == MutationType::Mknod
                    || e.mutation_type == MutationType::Create
                {
                    *attr = FileAttr::default();
                }
                attr.versions.push(idx);
                match &e.ranges {
                    Some(ranges) => attr.mark(ranges, idx),
                    None => {
                        attr.lines.clear();
                        attr.unranged = Some(idx);
                    }
                }
            }
            _ => {}
        }
        if let Some(h) = &e.content_hash {
            if let Some(attr) = files.get_mut(&path) {
                attr.hash = Some(h.clone());
            }
        }
        // The file's other names (hard links) are the same file, lines and all.
        let aliases = super::reader::aliases_of(e);
        if let (false, Some(attr)) = (aliases.is_empty(), files.get(&path).cloned()) {
            for a in aliases {
                files.insert(a, attr.clone());
            }
        }
    }
}

/// One recorded version of a file, line by line: the change that last touched each line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VersionLines {
    /// Per line (index 0 is line 1), the change whose recorded ranges last covered it.
    pub lines: Vec<Option<Change>>,
    /// A change that recorded no line ranges (binary or large at the time): lines no range
    /// covers may be its work.
    pub unranged: Option<Change>,
}

/// For each `(index, path)` of `targets`, the attribution of `path` right after
/// `entries[index]` was replayed (the version that entry recorded). One pass over the
/// entries, whatever the number of targets.
pub fn attribute_at(entries: &[(u64, Entry)], targets: &[(usize, PathBuf)]) -> Vec<VersionLines> {
    let mut order: Vec<usize> = (0..targets.len()).collect();
    order.sort_by_key(|&t| targets[t].0);
    let mut out = vec![VersionLines::default(); targets.len()];
    let mut r = Replay::default();
    let mut next = order.iter().peekable();
    for (i, (_, e)) in entries.iter().enumerate() {
        if next.peek().is_none() {
            break;
        }
        r.apply(e);
        while let Some(&&t) = next.peek() {
            if targets[t].0 != i {
                break;
            }
            next.next();
            if let Some(attr) = r.files.get(&targets[t].1) {
                out[t] = VersionLines {
                    lines: attr
                        .lines
                        .iter()
                        .map(|c| c.map(|c| r.changes[c].clone()))
                        .collect(),
                    unranged: attr.unranged.map(|c| r.changes[c].clone()),
                };
            }
        }
    }
    out
}

/// Attributes each line of `workspace/rel_path` as it is now (no recorded content at hand:
/// a file changed outside the mount is unknown line by line).
pub fn blame(ledger_path: &Path, workspace: &Path, rel_path: &Path) -> io::Result<BlameReport> {
    blame_with(ledger_path, workspace, rel_path, &|_| None)
}

/// For each line of the file now: the line of the last recorded version it is (None: added
/// or changed since).
fn lines_kept(recorded: &[u8], now: &[u8]) -> Vec<Option<usize>> {
    let (old, new) = (
        String::from_utf8_lossy(recorded),
        String::from_utf8_lossy(now),
    );
    let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
    let mut map = vec![None; new.split_inclusive('\n').count()];
    for op in diff.ops() {
        if let similar::DiffOp::Equal {
            old_index,
            new_index,
            len,
        } = *op
        {
            for k in 0..len {
                if let Some(m) = map.get_mut(new_index + k) {
                    *m = Some(old_index + k);
                }
            }
        }
    }
    map
}

/// [`blame`], with `recorded` giving the bytes of a recorded content hash when they were
/// kept: a file changed outside the mount is then diffed against its last recorded version,
/// and only the lines changed outside are attributed to no one.
pub fn blame_with(
    ledger_path: &Path,
    workspace: &Path,
    rel_path: &Path,
    recorded: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> io::Result<BlameReport> {
    let content = std::fs::read(workspace.join(rel_path))?;
    let current_hash = sha256_bytes(&content);
    let entries = read_entries(ledger_path)?;
    let (files, changes) = replay(&entries);
    let attr = files.get(rel_path).cloned().unwrap_or_default();
    let recorded_hash = attr.hash.clone();
    let outside = recorded_hash.as_ref().is_some_and(|h| *h != current_hash);
    // Line of the file now -> line of the last recorded version, when outside edits are
    // known line by line.
    let kept = outside
        .then(|| recorded_hash.as_deref().and_then(recorded))
        .flatten()
        .map(|old| lines_kept(&old, &content));
    let warning = if let Some(k) = &kept {
        let changed = k.iter().filter(|m| m.is_none()).count();
        Some(format!(
            "{} changed outside the mount since its last entry (recorded {}, now {}): {changed} line(s) added or changed there; the others keep their attribution",
            rel_path.display(),
            recorded_hash.as_deref().unwrap_or("-"),
            current_hash
        ))
    } else if outside {
        Some(format!(
            "{} changed outside the mount since its last entry (recorded {}, now {}): line attribution unknown (the recorded version is not in the content store)",
            rel_path.display(),
            recorded_hash.as_deref().unwrap_or("-"),
            current_hash
        ))
    } else if attr.versions.is_empty() {
        Some(format!(
            "{}: the ledger has no write to this file",
            rel_path.display()
        ))
    } else if recorded_hash.is_none() {
        Some(format!(
            "{}: the last write recorded no hash; attribution not checked against the disk",
            rel_path.display()
        ))
    } else {
        None
    };
    let lines = content
        .split_inclusive(|&b| b == b'\n')
        .enumerate()
        .map(|(i, l)| {
            // The line of the recorded version this line is.
            let at = match &kept {
                Some(k) => k.get(i).copied().flatten(),
                None if outside => None,
                None => Some(i),
            };
            let origin = match at {
                None => Origin::ChangedOutside,
                Some(i) => match (attr.lines.get(i).copied().flatten(), attr.unranged) {
                    (Some(c), _) => Origin::Ledger(changes[c].clone()),
                    (None, Some(c)) => Origin::Unranged(changes[c].clone()),
                    (None, None) => Origin::PredatesLedger,
                },
            };
            let l = l.strip_suffix(b"\n").unwrap_or(l);
            BlameLine {
                line: i as u32 + 1,
                origin,
                text: String::from_utf8_lossy(l).into_owned(),
            }
        })
        .collect();
    Ok(BlameReport {
        path: rel_path.to_string_lossy().into_owned(),
        current_hash,
        recorded_hash,
        warning,
        versions: attr.versions.iter().map(|&i| changes[i].clone()).collect(),
        lines,
    })
}

#[cfg(test)]
mod tests {
    use super::lines_kept;

    #[test]
    fn lines_kept_follow_insertions_and_edits() {
        let old = b"a\nb\nc\n";
        assert_eq!(
            lines_kept(old, b"a\nb\nc\nd\n"),
            vec![Some(0), Some(1), Some(2), None]
        );
        assert_eq!(
            lines_kept(old, b"new\na\nB\nc\n"),
            vec![None, Some(0), None, Some(2)]
        );
        assert_eq!(lines_kept(old, b""), Vec::<Option<usize>>::new());
    }
}
