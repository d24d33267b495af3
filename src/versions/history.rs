//! What was at each path, entry by entry: the ledger replayed into one timeline per path
//! (`Event`: the content before and after one entry), the lookup of an entry by the id or
//! line `intentfs log` shows, and the reason a version was not kept. Pure over entries.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ledger::entry::{Entry, MutationType};
use crate::ledger::reader::outcome_failed;

/// One change at one path: what the path held before and after an entry.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Event {
    /// The ledger line of the entry (1-based).
    pub line: u64,
    /// The entry's id.
    pub id: String,
    /// When (RFC 3339).
    pub timestamp: String,
    /// The entry's type.
    pub mutation_type: MutationType,
    /// Agent name, `-` when none.
    pub agent: String,
    /// Intent id, if any.
    pub intent: Option<String>,
    /// Content hash before; None when the path held no regular file the ledger knows.
    pub before: Option<String>,
    /// Content hash after; None when the path holds no regular file after it (deleted,
    /// renamed away, or a content the entry did not hash).
    pub after: Option<String>,
    /// The other name of a rename (its source at the destination, its destination at the
    /// source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other: Option<PathBuf>,
}

impl Event {
    /// The version this event leaves, or for a deletion the one it removed: what
    /// `restore --to` this entry puts back.
    pub fn version(&self) -> Option<&str> {
        self.after.as_deref().or(self.before.as_deref())
    }
}

/// Whether an entry changed the workspace (not a governance event, not refused, not a write
/// whose file lost its name before it closed).
pub fn is_change(e: &Entry) -> bool {
    if e.mutation_type.is_governance() || outcome_failed(&e.outcome) {
        return false;
    }
    let flagged = |k: &str| {
        e.detail
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    !(flagged("detached") || flagged("superseded"))
}

/// `detail.<key>` as a string.
pub fn detail_str<'a>(e: &'a Entry, key: &str) -> Option<&'a str> {
    e.detail.as_ref()?.get(key)?.as_str()
}

/// An octal mode in `detail.<key>` (`"644"`).
pub fn detail_mode(e: &Entry, key: &str) -> Option<u32> {
    u32::from_str_radix(detail_str(e, key)?, 8).ok()
}

/// Why the content an entry names was not kept, as the store wrote it
/// (`detail.version.reason`).
pub fn not_kept_reason(e: &Entry) -> Option<String> {
    let v = e.detail.as_ref()?.get("version")?;
    if v.get("kept").and_then(|k| k.as_bool()) == Some(false) {
        Some(
            v.get("reason")
                .and_then(|r| r.as_str())
                .unwrap_or("not kept")
                .to_owned(),
        )
    } else {
        None
    }
}

/// Timelines of every path the ledger names, in ledger order.
#[derive(Default)]
pub struct History {
    /// Events per path, oldest first.
    pub paths: HashMap<PathBuf, Vec<Event>>,
}

impl History {
    /// Replays `entries`.
    pub fn of(entries: &[(u64, Entry)]) -> History {
        let mut h = History::default();
        for (line, e) in entries {
            if !is_change(e) {
                continue;
            }
            let Some(path) = e.path_buf() else { continue };
            let ev =
                |before: Option<String>, after: Option<String>, other: Option<PathBuf>| Event {
                    line: *line,
                    id: e.id.clone(),
                    timestamp: e.timestamp.clone(),
                    mutation_type: e.mutation_type,
                    agent: e
                        .agent
                        .as_ref()
                        .map(|a| a.name.clone())
                        .unwrap_or_else(|| "-".into()),
                    intent: e.intent_id.clone(),
                    before,
                    after,
                    other,
                };
            match e.mutation_type {
                MutationType::Write
                | MutationType::Truncate
                | MutationType::Create
                | MutationType::Mknod => {
                    // A truncation through a write handle: its WRITE at close says it all.
                    if e.mutation_type == MutationType::Truncate
                        && detail_str(e, "handle").is_some()
                    {
                        continue;
                    }
                    let before = e.prev_content_hash.clone().or_else(|| {
                        if e.created || e.mutation_type == MutationType::Create {
                            None
                        } else {
                            h.current(&path)
                        }
                    });
                    h.push(&path, ev(before, e.content_hash.clone(), None));
                }
                MutationType::Delete => {
                    let before = e.prev_content_hash.clone().or_else(|| h.current(&path));
                    h.push(&path, ev(before, None, None));
                }
                MutationType::Rename => {
                    let Some(from) = e.from_buf() else { continue };
                    // The content moved: as recorded at the source, else as the entry hashed it.
                    let moved = h.current(&from).or_else(|| e.content_hash.clone());
                    let exchange = detail_str(e, "exchange").is_some()
                        || e.detail
                            .as_ref()
                            .and_then(|d| d.get("exchange"))
                            .is_some_and(|v| v.as_bool() == Some(true));
                    let replaced = e.prev_content_hash.clone().or_else(|| h.current(&path));
                    let content = e.content_hash.clone().or(moved.clone());
                    h.push(
                        &from,
                        ev(
                            moved,
                            if exchange { replaced.clone() } else { None },
                            Some(path.clone()),
                        ),
                    );
                    h.push(&path, ev(replaced, content, Some(from.clone())));
                }
                MutationType::Symlink | MutationType::Link => {
                    let after = if e.mutation_type == MutationType::Link {
                        e.from_buf().and_then(|f| h.current(&f))
                    } else {
                        None
                    };
                    h.push(&path, ev(None, after, e.from_buf()));
                }
                _ => {}
            }
        }
        h
    }

    fn push(&mut self, p: &Path, ev: Event) {
        self.paths.entry(p.to_path_buf()).or_default().push(ev);
    }

    /// The content at `p` after the last event, as far as the ledger knows.
    pub fn current(&self, p: &Path) -> Option<String> {
        self.paths.get(p)?.last()?.after.clone()
    }

    /// The events at `p`, oldest first.
    pub fn events(&self, p: &Path) -> &[Event] {
        self.paths.get(p).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// The entry `key` names: a ledger line number (`#12` or `12`), or an id or a unique
/// prefix of one (at least 4 characters).
pub fn find_entry<'a>(entries: &'a [(u64, Entry)], key: &str) -> Result<&'a (u64, Entry), String> {
    let k = key.trim();
    let digits = k.strip_prefix('#').unwrap_or(k);
    if !digits.is_empty() && digits.len() < 12 && digits.bytes().all(|b| b.is_ascii_digit()) {
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("bad line number {key:?}"))?;
        return entries.iter().find(|(l, _)| *l == n).ok_or_else(|| {
            format!(
                "no entry on line {n} (the ledger has {} lines)\nhint: `intentfs log` shows each entry's line in its # column",
                entries.last().map(|(l, _)| *l).unwrap_or(0)
            )
        });
    }
    if k.len() < 4 {
        return Err(format!(
            "{key:?} is too short to name an entry: give its line (#N) or at least 4 characters of its id"
        ));
    }
    let hits: Vec<&(u64, Entry)> = entries
        .iter()
        .filter(|(_, e)| e.id.starts_with(k))
        .collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "no entry with id {key:?}\nhint: `intentfs log` shows each entry's line (#) and `intentfs log --json` its id"
        )),
        many => Err(format!(
            "{key:?} names {} entries (lines {}): give more of the id",
            many.len(),
            many.iter()
                .map(|(l, _)| l.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The entry with id `id`.
pub fn by_id<'a>(entries: &'a [(u64, Entry)], id: &str) -> Option<&'a Entry> {
    entries.iter().map(|(_, e)| e).find(|e| e.id == id)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ledger::entry::Agent;

    /// An entry by alice (INT-1) on `path`, at second `line` of a minute.
    pub(crate) fn entry(line: u64, mt: MutationType, path: &str) -> (u64, Entry) {
        (
            line,
            Entry {
                id: format!("{line:04}-id"),
                timestamp: format!("2025-01-31T12:00:{:02}.000000Z", line % 60),
                intent_id: Some("INT-1".into()),
                agent: Some(Agent {
                    name: "alice".into(),
                    identity: "run:1".into(),
                    pid: 1,
                    uid: 0,
                    process: "sh".into(),
                }),
                mutation_type: mt,
                mutation_class: None,
                path: Some(path.into()),
                path_b64: None,
                from: None,
                from_b64: None,
                content_hash: None,
                prev_content_hash: None,
                size: None,
                created: false,
                ranges: None,
                vcs: None,
                outcome: "ok".into(),
                code: None,
                rule: None,
                detail: None,
                prev: String::new(),
            },
        )
    }

    #[test]
    fn timelines_follow_writes_renames_and_deletes() {
        let mut w = entry(1, MutationType::Write, "a");
        w.1.content_hash = Some("h1".into());
        let mut w2 = entry(2, MutationType::Write, "a");
        w2.1.content_hash = Some("h2".into());
        w2.1.prev_content_hash = Some("h1".into());
        let mut r = entry(3, MutationType::Rename, "b");
        r.1.from = Some("a".into());
        let mut d = entry(4, MutationType::Delete, "b");
        d.1.prev_content_hash = Some("h2".into());
        let h = History::of(&[w, w2, r, d]);
        let a = h.events(Path::new("a"));
        assert_eq!(a.len(), 3);
        assert_eq!(a[2].before.as_deref(), Some("h2"));
        assert_eq!(a[2].after, None);
        let b = h.events(Path::new("b"));
        assert_eq!(
            b[0].after.as_deref(),
            Some("h2"),
            "the rename carries the content"
        );
        assert_eq!(
            b[1].version(),
            Some("h2"),
            "a deletion's version is what it removed"
        );
        assert_eq!(h.current(Path::new("b")), None);
    }

    #[test]
    fn entries_by_line_id_or_prefix() {
        let es = vec![
            entry(1, MutationType::Write, "a"),
            entry(2, MutationType::Write, "a"),
        ];
        assert_eq!(find_entry(&es, "#2").unwrap().0, 2);
        assert_eq!(find_entry(&es, "1").unwrap().0, 1);
        assert_eq!(find_entry(&es, "0002-id").unwrap().0, 2);
        assert!(find_entry(&es, "#9")
            .unwrap_err()
            .contains("no entry on line 9"));
        assert!(find_entry(&es, "ab").unwrap_err().contains("too short"));
        assert!(find_entry(&es, "000")
            .unwrap_err()
            .contains("no entry on line 0"));
        assert!(find_entry(&es, "000X")
            .unwrap_err()
            .contains("no entry with id"));
        // Digits are a line number, whatever ids start with them.
        assert_eq!(find_entry(&es, "0002").unwrap().0, 2);
    }
}
