//! Unified diffs of recorded versions: of one entry, of a path over a time range, of
//! everything an agent or intent changed (per path, from the content before its first
//! change to the content after its last). A side whose bytes were not kept says why, in the
//! words the entry recorded (`detail.version.reason`).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::Serialize;
use similar::{ChangeTag, TextDiff};

use super::history::{find_entry, not_kept_reason, Event, History};
use super::tree::show;
use crate::ledger::entry::{Entry, MutationType};
use crate::ledger::reader::Filter;
use crate::store::Store;

/// Files larger than this are compared by hash only.
const MAX_TEXT: usize = 16 << 20;

/// An entry a diff covers.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EntryRef {
    pub line: u64,
    pub id: String,
    pub mutation_type: MutationType,
    pub agent: String,
    pub intent: Option<String>,
    pub timestamp: String,
}

impl From<&Event> for EntryRef {
    fn from(e: &Event) -> EntryRef {
        EntryRef {
            line: e.line,
            id: e.id.clone(),
            mutation_type: e.mutation_type,
            agent: e.agent.clone(),
            intent: e.intent.clone(),
            timestamp: e.timestamp.clone(),
        }
    }
}

/// The diff of one path between two recorded versions.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FileDiff {
    /// The path (after).
    pub path: String,
    /// Its name before, for a rename.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_path: Option<String>,
    /// The entries between the two versions, oldest first.
    pub entries: Vec<EntryRef>,
    /// Content hash before (None: no file).
    pub before: Option<String>,
    /// Content hash after (None: no file).
    pub after: Option<String>,
    /// Lines added and removed (0 when not compared as text).
    pub added: usize,
    pub removed: usize,
    /// Either side is not text (or too large to compare line by line).
    pub binary: bool,
    /// Why a side could not be shown (a version not kept, and the reason recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
    /// The unified diff (`--- a/PATH`, `+++ b/PATH`, hunks), when both sides are text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// The bytes of a version: `Ok(None)` for no file, `Err(why)` when not available.
fn content(
    hash: Option<&str>,
    store: Option<&Store>,
    entries: &[(u64, Entry)],
    refs: &[EntryRef],
) -> Result<Option<Vec<u8>>, String> {
    let Some(h) = hash else { return Ok(None) };
    if h == super::plan::empty_hash() {
        return Ok(Some(Vec::new()));
    }
    if let Some(s) = store {
        match s.get(h) {
            Ok(Some(d)) => return Ok(Some(d)),
            Ok(None) => {}
            Err(e) => return Err(format!("{h}: cannot read it from the store: {e}")),
        }
    }
    // The reason the entry that named it recorded.
    let reason = refs
        .iter()
        .filter_map(|r| entries.iter().find(|(l, _)| *l == r.line))
        .filter(|(_, e)| {
            e.content_hash.as_deref() == Some(h) || e.prev_content_hash.as_deref() == Some(h)
        })
        .find_map(|(_, e)| not_kept_reason(e));
    Err(match reason {
        Some(r) => format!("version {h} not kept: {r}"),
        None => super::missing_reason(store, h),
    })
}

fn is_text(d: &[u8]) -> bool {
    d.len() <= MAX_TEXT && !d.contains(&0) && std::str::from_utf8(d).is_ok()
}

/// Compares two versions of `path`.
pub fn compare(
    path: &Path,
    from_path: Option<&Path>,
    before: Option<String>,
    after: Option<String>,
    refs: Vec<EntryRef>,
    store: Option<&Store>,
    entries: &[(u64, Entry)],
) -> FileDiff {
    let mut d = FileDiff {
        path: show(path),
        from_path: from_path.map(show),
        entries: refs,
        before,
        after,
        added: 0,
        removed: 0,
        binary: false,
        missing: None,
        diff: None,
    };
    let old = content(d.before.as_deref(), store, entries, &d.entries);
    let new = content(d.after.as_deref(), store, entries, &d.entries);
    let (old, new) = match (old, new) {
        (Ok(o), Ok(n)) => (o, n),
        (o, n) => {
            let why: Vec<String> = [o.err(), n.err()].into_iter().flatten().collect();
            d.missing = Some(why.join("; "));
            return d;
        }
    };
    let (o, n) = (old.unwrap_or_default(), new.unwrap_or_default());
    if !is_text(&o) || !is_text(&n) {
        d.binary = d.before != d.after;
        return d;
    }
    let (os, ns) = (
        String::from_utf8_lossy(&o).into_owned(),
        String::from_utf8_lossy(&n).into_owned(),
    );
    let td = TextDiff::from_lines(&os, &ns);
    for c in td.iter_all_changes() {
        match c.tag() {
            ChangeTag::Insert => d.added += 1,
            ChangeTag::Delete => d.removed += 1,
            ChangeTag::Equal => {}
        }
    }
    if d.added + d.removed > 0 {
        let a = match (&d.before, &d.from_path) {
            (None, _) => "/dev/null".to_owned(),
            (_, Some(f)) => format!("a/{f}"),
            _ => format!("a/{}", d.path),
        };
        let b = if d.after.is_none() {
            "/dev/null".to_owned()
        } else {
            format!("b/{}", d.path)
        };
        d.diff = Some(
            td.unified_diff()
                .context_radius(3)
                .header(&a, &b)
                .to_string(),
        );
    }
    d
}

/// The diff of one entry: every path it changed.
pub fn of_entry(
    entries: &[(u64, Entry)],
    key: &str,
    store: Option<&Store>,
) -> Result<Vec<FileDiff>, String> {
    let (line, e) = find_entry(entries, key)?;
    let h = History::of(entries);
    let at = |p: &Path| h.events(p).iter().find(|ev| ev.line == *line).cloned();
    let Some(path) = e.path_buf() else {
        return Err(format!(
            "entry #{line} ({}) names no path",
            e.mutation_type.as_str()
        ));
    };
    let Some(ev) = at(&path) else {
        return Err(format!(
            "entry #{line} is a {} of {}: it changes no file's content, so there is no diff{}",
            e.mutation_type.as_str(),
            show(&path),
            if e.mutation_type.is_governance() {
                ""
            } else {
                " (directories, modes and symlinks are listed by `intentfs log`)"
            }
        ));
    };
    let mut out = Vec::new();
    if e.mutation_type == MutationType::Rename {
        let from = e.from_buf();
        let moved = from.as_deref().and_then(at);
        // A rename over a file is an edit of it (`sed -i`, an editor's save): the diff is
        // from the file it replaced. A plain rename compares the content it moved.
        let (before, from) = match &ev.before {
            Some(b) => (Some(b.clone()), None),
            None => (moved.and_then(|m| m.before), from),
        };
        out.push(compare(
            &path,
            from.as_deref(),
            before,
            ev.after.clone(),
            vec![EntryRef::from(&ev)],
            store,
            entries,
        ));
    } else {
        out.push(compare(
            &path,
            None,
            ev.before.clone(),
            ev.after.clone(),
            vec![EntryRef::from(&ev)],
            store,
            entries,
        ));
    }
    Ok(out)
}

fn in_range(ev: &Event, since: Option<DateTime<Utc>>, until: Option<DateTime<Utc>>) -> bool {
    let Ok(t) = DateTime::parse_from_rfc3339(&ev.timestamp) else {
        return false;
    };
    let t = t.with_timezone(&Utc);
    since.is_none_or(|s| t >= s) && until.is_none_or(|u| t <= u)
}

/// The diff of `path` over a time range: from the content before its first change in the
/// range to the content after its last.
pub fn of_path(
    entries: &[(u64, Entry)],
    path: &Path,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    store: Option<&Store>,
) -> Result<Vec<FileDiff>, String> {
    let h = History::of(entries);
    let evs: Vec<&Event> = h
        .events(path)
        .iter()
        .filter(|ev| in_range(ev, since, until))
        .collect();
    let (Some(first), Some(last)) = (evs.first(), evs.last()) else {
        return Err(format!(
            "the ledger records no change of the content of {} in that range\nhint: `intentfs log --path '{}'` lists what it records",
            show(path),
            show(path)
        ));
    };
    Ok(vec![compare(
        path,
        None,
        first.before.clone(),
        last.after.clone(),
        evs.iter().map(|e| EntryRef::from(*e)).collect(),
        store,
        entries,
    )])
}

/// What the entries `filter` selects changed, per path (sorted), each from before its
/// first selected change to after its last.
pub fn of_selection(
    entries: &[(u64, Entry)],
    filter: &Filter,
    store: Option<&Store>,
) -> Vec<FileDiff> {
    let h = History::of(entries);
    let selected: std::collections::HashSet<u64> = entries
        .iter()
        .filter(|(_, e)| filter.matches(e))
        .map(|(l, _)| *l)
        .collect();
    let mut paths: Vec<(&PathBuf, Vec<&Event>)> = h
        .paths
        .iter()
        .map(|(p, evs)| {
            (
                p,
                evs.iter().filter(|e| selected.contains(&e.line)).collect(),
            )
        })
        .filter(|(_, evs): &(&PathBuf, Vec<&Event>)| !evs.is_empty())
        .collect();
    paths.sort_by(|a, b| a.0.cmp(b.0));
    paths
        .into_iter()
        .filter_map(|(p, evs)| {
            let (first, last) = (evs.first()?, evs.last()?);
            // A temporary made and renamed away (or removed) within the selection left
            // nothing of its own: its content shows at the name it went to.
            if first.before.is_none() && last.after.is_none() {
                return None;
            }
            Some(compare(
                p,
                None,
                first.before.clone(),
                last.after.clone(),
                evs.iter().map(|e| EntryRef::from(*e)).collect(),
                store,
                entries,
            ))
        })
        .collect()
}

/// `git diff --stat`-like lines: ` path | +3 -1`.
pub fn stat(diffs: &[FileDiff]) -> String {
    let w = diffs
        .iter()
        .map(|d| d.path.chars().count())
        .max()
        .unwrap_or(0);
    let mut s = String::new();
    let (mut add, mut del) = (0, 0);
    for d in diffs {
        let what = if let Some(m) = &d.missing {
            format!("(not shown: {m})")
        } else if d.binary {
            "binary".to_owned()
        } else if d.before.is_none() {
            format!("+{} (new)", d.added)
        } else if d.after.is_none() {
            format!("-{} (deleted)", d.removed)
        } else {
            format!("+{} -{}", d.added, d.removed)
        };
        add += d.added;
        del += d.removed;
        s.push_str(&format!(" {:<w$} | {what}\n", d.path));
    }
    s.push_str(&format!(
        " {} file(s) changed, {add} insertion(s)(+), {del} deletion(s)(-)\n",
        diffs.len()
    ));
    s
}

/// The diffs for people: a header per path naming the entries, then the unified diff.
pub fn render(diffs: &[FileDiff]) -> String {
    let mut s = String::new();
    for d in diffs {
        let who: Vec<String> = d
            .entries
            .iter()
            .map(|e| {
                format!(
                    "#{} {} by {}{} at {}",
                    e.line,
                    e.mutation_type.as_str(),
                    e.agent,
                    e.intent
                        .as_deref()
                        .map(|i| format!(" ({i})"))
                        .unwrap_or_default(),
                    e.timestamp.get(..19).unwrap_or(&e.timestamp)
                )
            })
            .collect();
        let name = match &d.from_path {
            Some(f) => format!("{f} -> {}", d.path),
            None => d.path.clone(),
        };
        s.push_str(&format!("=== {name}  ({})\n", who.join(", ")));
        if let Some(m) = &d.missing {
            s.push_str(&format!("(no diff: {m})\n"));
        } else if d.binary {
            s.push_str(&format!("Binary files a/{0} and b/{0} differ\n", d.path));
        } else if let Some(text) = &d.diff {
            s.push_str(text);
            if !text.ends_with('\n') {
                s.push('\n');
            }
        } else if d.from_path.is_some() {
            s.push_str("(renamed, content unchanged)\n");
        } else {
            s.push_str("(content unchanged)\n");
        }
    }
    s
}
