//! Undoing recorded work: a [`Plan`] is a list of steps, each the inverse of one ledger
//! entry (`rewind`) or the putting back of one version (`restore`), with what the path must
//! hold for the step to apply. [`apply`] runs a plan on a [`Tree`]: a step whose path no
//! longer holds what the undone entry left there was changed by someone else since, and is
//! skipped as a conflict (`--force` overwrites it; the version overwritten is kept in the
//! store). Every step applied is handed to the caller to be recorded.

use std::io;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::history::{detail_mode, detail_str, is_change, not_kept_reason, History};
use super::tree::{show, Node, Tree};
use crate::ledger::entry::{Agent, Draft, Entry, MutationType};
use crate::ledger::reader::Filter;
use crate::store::Store;

/// The hash of no bytes: always available, whatever the store kept.
pub fn empty_hash() -> String {
    crate::ledger::sha256_bytes(b"")
}

/// What a path must hold for a step to apply.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "is", rename_all = "snake_case")]
pub enum Expect {
    /// Nothing.
    Absent,
    /// A regular file, with this content when known.
    File { hash: Option<String> },
    /// A directory.
    Dir,
    /// A symlink to this target.
    Symlink { target: PathBuf },
    /// Anything but nothing.
    Exists,
    /// A file or directory with these permission bits.
    Mode { mode: u32 },
    /// Whatever is there (`restore` overwrites by design).
    Any,
}

/// What a step does.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Action {
    /// Put the content `content` (from the store) there, with `mode` (else the mode of the
    /// file replaced, else 0644).
    Put { content: String, mode: Option<u32> },
    /// Remove the file, symlink or special file.
    Remove,
    /// Remove the (empty) directory.
    Rmdir,
    /// Make a directory.
    Mkdir { mode: u32 },
    /// Make a symlink.
    Symlink { target: PathBuf },
    /// Rename it to `to` (which must not exist).
    Rename { to: PathBuf },
    /// Swap it with `with`.
    Exchange { with: PathBuf },
    /// Set its permission bits.
    Chmod { mode: u32 },
}

/// One step of a plan.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Step {
    /// The workspace-relative path it acts on.
    pub path: PathBuf,
    /// What must be there first.
    pub expect: Expect,
    /// What it does.
    #[serde(flatten)]
    pub action: Action,
    /// The entry it undoes (rewind) or whose version it puts back (restore).
    pub entry: String,
    /// That entry's ledger line.
    pub line: u64,
    /// For people: `undo WRITE by alice (INT-1) at 2025-...`.
    pub what: String,
}

/// Something the plan cannot do, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Skipped {
    /// The path.
    pub path: String,
    /// The entry concerned (its id), if any.
    pub entry: Option<String>,
    /// Its ledger line.
    pub line: Option<u64>,
    /// Why, for people.
    pub reason: String,
    /// A conflict: someone else changed the path since (`--force` overwrites).
    #[serde(default)]
    pub conflict: bool,
}

/// A plan: steps in the order they run, and what it already knows it cannot do.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub skipped: Vec<Skipped>,
    /// Paths where a change could not be undone (its version not kept...), with the number
    /// of steps planned before it: the steps after that at the path (earlier changes)
    /// would build on a state that is not there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<(PathBuf, usize)>,
}

fn who(e: &Entry) -> String {
    let agent = e.agent.as_ref().map(|a| a.name.as_str()).unwrap_or("-");
    match &e.intent_id {
        Some(i) => format!("{agent} ({i})"),
        None => agent.to_owned(),
    }
}

fn what(e: &Entry, verb: &str) -> String {
    format!(
        "{verb} {} by {} at {}",
        e.mutation_type.as_str(),
        who(e),
        e.timestamp.get(..19).unwrap_or(&e.timestamp)
    )
}

/// Whether the content `hash` can be put back, else why not (the entry's own reason when
/// the store said it did not keep it).
fn available(store: Option<&Store>, hash: &str, e: &Entry) -> Result<(), String> {
    if hash == empty_hash() || store.is_some_and(|s| s.has(hash)) {
        return Ok(());
    }
    Err(match not_kept_reason(e) {
        Some(r) => format!("version {hash} was not kept: {r}"),
        None => super::missing_reason(store, hash),
    })
}

/// The steps that undo every entry `filter` selects, latest first.
pub fn rewind(entries: &[(u64, Entry)], filter: &Filter, store: Option<&Store>) -> Plan {
    let mut plan = Plan::default();
    // Paths the selected work made (first line): their owners, attributes and xattrs go
    // with them when the making is undone.
    let mut made: std::collections::HashMap<PathBuf, u64> = std::collections::HashMap::new();
    for (line, e) in entries {
        let makes = matches!(
            e.mutation_type,
            MutationType::Create
                | MutationType::Mknod
                | MutationType::Mkdir
                | MutationType::Symlink
                | MutationType::Link
        ) || (e.mutation_type == MutationType::Write && e.created);
        if makes && filter.matches(e) && is_change(e) {
            if let Some(p) = e.path_buf() {
                made.entry(p).or_insert(*line);
            }
        }
    }
    for (line, e) in entries.iter().rev() {
        if !filter.matches(e) {
            continue;
        }
        // A git ref moved through the mount: git's own state, which rewind does not edit.
        if e.mutation_type == MutationType::Ref && is_change_ok(e) {
            let (r, old, new) = (
                detail_str(e, "ref").unwrap_or("?"),
                detail_str(e, "old").unwrap_or("(none)"),
                detail_str(e, "new").unwrap_or("(none)"),
            );
            plan.skipped.push(Skipped {
                path: e.path.clone().unwrap_or_default(),
                entry: Some(e.id.clone()),
                line: Some(*line),
                reason: format!(
                    "git moved {r} from {old} to {new}: git's refs and index are not rewound (git checkout / git update-ref moves it back)"
                ),
                conflict: false,
            });
            continue;
        }
        // An output burst is a governance summary of files no entry names one by one.
        if e.mutation_type == MutationType::Output && is_change_ok(e) {
            plan.skipped.push(Skipped {
                path: e.path.clone().unwrap_or_default(),
                entry: Some(e.id.clone()),
                line: Some(*line),
                reason: "build output is summarized, not recorded file by file: not undone (your build's clean removes it)".into(),
                conflict: false,
            });
            continue;
        }
        if !is_change(e) {
            continue;
        }
        let Some(path) = e.path_buf() else { continue };
        let step = |expect: Expect, action: Action, at: &Path| Step {
            path: at.to_path_buf(),
            expect,
            action,
            entry: e.id.clone(),
            line: *line,
            what: what(e, "undo"),
        };
        // Something not undone: what was before it at the path cannot be put back on top.
        let skip = |plan: &mut Plan, reason: String| {
            plan.skipped.push(Skipped {
                path: show(&path),
                entry: Some(e.id.clone()),
                line: Some(*line),
                reason,
                conflict: false,
            });
            plan.blocked.push((path.clone(), plan.steps.len()));
        };
        match e.mutation_type {
            MutationType::Write | MutationType::Truncate => {
                // A truncation through a write handle: its WRITE at close undoes both.
                if e.mutation_type == MutationType::Truncate && detail_str(e, "handle").is_some() {
                    continue;
                }
                let before = e
                    .prev_content_hash
                    .clone()
                    .or_else(|| e.created.then(empty_hash));
                let Some(before) = before else {
                    skip(
                        &mut plan,
                        format!(
                        "the {} recorded no earlier content (written before versions were kept)",
                        e.mutation_type.as_str()
                    ),
                    );
                    continue;
                };
                if let Err(r) = available(store, &before, e) {
                    skip(&mut plan, r);
                    continue;
                }
                plan.steps.push(step(
                    Expect::File {
                        hash: e.content_hash.clone(),
                    },
                    Action::Put {
                        content: before,
                        mode: None,
                    },
                    &path,
                ));
            }
            MutationType::Create => {
                // The creating handle's WRITE, undone just before (its file emptied): one
                // removal of the file as that WRITE left it does both.
                let last = plan.steps.iter().rposition(|s| s.path == path);
                let empty = Action::Put {
                    content: empty_hash(),
                    mode: None,
                };
                let mut st = step(
                    Expect::File {
                        hash: Some(e.content_hash.clone().unwrap_or_else(empty_hash)),
                    },
                    Action::Remove,
                    &path,
                );
                match last {
                    Some(j) if plan.steps[j].action == empty => {
                        st.expect = plan.steps[j].expect.clone();
                        st.what = format!("{} (and the WRITE that filled it)", st.what);
                        plan.steps[j] = st;
                    }
                    _ => plan.steps.push(st),
                }
            }
            MutationType::Mknod | MutationType::Link => {
                plan.steps.push(step(Expect::Exists, Action::Remove, &path))
            }
            MutationType::Symlink => {
                let expect = match detail_str(e, "target") {
                    Some(t) => Expect::Symlink { target: t.into() },
                    None => Expect::Exists,
                };
                plan.steps.push(step(expect, Action::Remove, &path))
            }
            MutationType::Mkdir => plan.steps.push(step(Expect::Dir, Action::Rmdir, &path)),
            MutationType::Rmdir => plan.steps.push(step(
                Expect::Absent,
                Action::Mkdir {
                    mode: detail_mode(e, "mode").unwrap_or(0o755),
                },
                &path,
            )),
            MutationType::Delete => {
                if let Some(t) = detail_str(e, "target") {
                    plan.steps.push(step(
                        Expect::Absent,
                        Action::Symlink { target: t.into() },
                        &path,
                    ));
                    continue;
                }
                let before = e
                    .prev_content_hash
                    .clone()
                    .or_else(|| (e.size == Some(0)).then(empty_hash));
                let Some(before) = before else {
                    skip(
                        &mut plan,
                        "the deletion recorded no content hash (made before versions were kept)"
                            .into(),
                    );
                    continue;
                };
                if let Err(r) = available(store, &before, e) {
                    skip(&mut plan, r);
                    continue;
                }
                plan.steps.push(step(
                    Expect::Absent,
                    Action::Put {
                        content: before,
                        mode: detail_mode(e, "mode"),
                    },
                    &path,
                ));
            }
            MutationType::Rename => {
                let Some(from) = e.from_buf() else { continue };
                let exchange = e
                    .detail
                    .as_ref()
                    .and_then(|d| d.get("exchange"))
                    .is_some_and(|v| v.as_bool() == Some(true));
                if exchange {
                    plan.steps
                        .push(step(Expect::Exists, Action::Exchange { with: from }, &path));
                    continue;
                }
                let expect = match &e.content_hash {
                    Some(h) => Expect::File {
                        hash: Some(h.clone()),
                    },
                    None => Expect::Exists,
                };
                plan.steps
                    .push(step(expect, Action::Rename { to: from }, &path));
                // What the rename replaced (`sed -i`, an editor's save, `mv -f`).
                if let Some(replaced) = &e.prev_content_hash {
                    match available(store, replaced, e) {
                        Ok(()) => plan.steps.push(step(
                            Expect::Absent,
                            Action::Put {
                                content: replaced.clone(),
                                mode: detail_mode(e, "replaced_mode"),
                            },
                            &path,
                        )),
                        Err(r) => skip(&mut plan, format!("the file it replaced: {r}")),
                    }
                }
            }
            MutationType::Chmod => {
                match (detail_mode(e, "mode_before"), detail_mode(e, "mode_after")) {
                    (Some(before), Some(after)) => plan.steps.push(step(
                        Expect::Mode { mode: after },
                        Action::Chmod { mode: before },
                        &path,
                    )),
                    _ => skip(&mut plan, "the chmod recorded no modes".into()),
                }
            }
            MutationType::Chown | MutationType::Xattr | MutationType::Utimes
                if made.get(&path).is_some_and(|l| l < line) => {}
            MutationType::Chown | MutationType::Xattr | MutationType::Utimes => {
                plan.skipped.push(Skipped {
                    path: show(&path),
                    entry: Some(e.id.clone()),
                    line: Some(*line),
                    reason: format!(
                    "{} is not undone (owners, extended attributes and times are not versioned)",
                    e.mutation_type.as_str()
                ),
                    conflict: false,
                })
            }
            _ => {}
        }
    }
    plan
}

fn is_change_ok(e: &Entry) -> bool {
    !crate::ledger::reader::outcome_failed(&e.outcome)
}

/// Which recorded version `restore` puts back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "point", content = "value", rename_all = "snake_case")]
pub enum Point {
    /// The last version on record (for a deleted file: the one deleted).
    Latest,
    /// The version entry (id or `#line`) left, or for a deletion the one it removed.
    Entry(String),
    /// The version the path held just before this time.
    Before(DateTime<Utc>),
}

/// The step that puts back the version of `path` `point` names.
pub fn restore(
    entries: &[(u64, Entry)],
    path: &Path,
    point: &Point,
    store: Option<&Store>,
) -> Result<Plan, String> {
    super::tree::check_rel(path).map_err(|e| e.to_string())?;
    let history = History::of(entries);
    let events = history.events(path);
    let p = show(path);
    if events.is_empty() {
        return Err(format!(
            "the ledger records no content of {p}\nhint: `intentfs log --path '{p}'` lists what it records"
        ));
    }
    let ev = match point {
        Point::Latest => events
            .iter()
            .rev()
            .find(|ev| ev.version().is_some())
            .ok_or_else(|| format!("the ledger records no content hash of {p}"))?,
        Point::Entry(key) => {
            let (line, _) = super::history::find_entry(entries, key)?;
            events.iter().find(|ev| ev.line == *line).ok_or_else(|| {
                format!(
                    "entry #{line} did not change {p}\nhint: `intentfs log --path '{p}'` lists the entries that did"
                )
            })?
        }
        Point::Before(t) => {
            let before: Vec<_> = events
                .iter()
                .filter(|ev| {
                    DateTime::parse_from_rfc3339(&ev.timestamp)
                        .is_ok_and(|et| et.with_timezone(&Utc) < *t)
                })
                .collect();
            let last: &super::history::Event = match before.last() {
                Some(e) => e,
                // Nothing recorded before then, but the first change after it recorded what
                // it replaced: that is what the path held at that time.
                None if events[0].before.is_some() => {
                    let first = &events[0];
                    let hash = first.before.clone().unwrap_or_default();
                    let entry = &entries
                        .iter()
                        .find(|(l, _)| *l == first.line)
                        .ok_or_else(|| "internal: event without entry".to_string())?
                        .1;
                    available(store, &hash, entry).map_err(|r| format!("{p}: {r}"))?;
                    return Ok(Plan {
                        steps: vec![Step {
                            path: path.to_path_buf(),
                            expect: Expect::Any,
                            action: Action::Put {
                                content: hash,
                                mode: None,
                            },
                            entry: entry.id.clone(),
                            line: first.line,
                            what: what(entry, "version before"),
                        }],
                        skipped: Vec::new(),
                        blocked: Vec::new(),
                    });
                }
                None => {
                    return Err(format!(
                        "the ledger records no version of {p} before {}: its first entry is at {}",
                        t.to_rfc3339(),
                        events[0].timestamp
                    ))
                }
            };
            if last.after.is_none() {
                return Err(format!(
                    "{p} held no file at {}: the {} at {} (#{}) left none\nhint: restore an earlier time, or `--to {}` for the version it removed",
                    t.to_rfc3339(),
                    last.mutation_type.as_str(),
                    last.timestamp,
                    last.line,
                    last.line
                ));
            }
            last
        }
    };
    let hash = ev.version().ok_or_else(|| {
        format!(
            "entry #{} recorded no content hash of {p}: nothing to put back",
            ev.line
        )
    })?;
    let entry = &entries
        .iter()
        .find(|(l, _)| *l == ev.line)
        .ok_or_else(|| "internal: event without entry".to_string())?
        .1;
    available(store, hash, entry).map_err(|r| format!("{p}: {r}"))?;
    // A deleted file comes back with the mode it had.
    let mode = if entry.mutation_type == MutationType::Delete {
        detail_mode(entry, "mode")
    } else {
        None
    };
    Ok(Plan {
        steps: vec![Step {
            path: path.to_path_buf(),
            expect: Expect::Any,
            action: Action::Put {
                content: hash.to_owned(),
                mode,
            },
            entry: entry.id.clone(),
            line: ev.line,
            what: what(entry, "version after"),
        }],
        skipped: Vec::new(),
        blocked: Vec::new(),
    })
}

/// What one applied step changed, for its ledger entry.
#[derive(Debug)]
pub struct Change<'a> {
    /// The step (or, for a parent directory made on the way, a step of its own).
    pub step: &'a Step,
    /// What the path held before.
    pub before: Node,
    /// The bytes of the file replaced or removed, if it was one.
    pub old: Option<Vec<u8>>,
    /// The bytes put, for a `Put`.
    pub new: Option<Vec<u8>>,
    /// Applied over a conflict (`--force`).
    pub forced: bool,
}

/// How a step ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Done {
    /// The step.
    #[serde(flatten)]
    pub step: Step,
    /// Applied over a conflict (`--force`): the version overwritten is in the store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// The content hash of what it overwrote or removed, kept in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// What a run did: `restored` (put back, made, renamed back, modes reset), `removed`,
/// `skipped` (conflicts and what could not be done, with why).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    pub restored: Vec<Done>,
    pub removed: Vec<Done>,
    pub skipped: Vec<Skipped>,
    /// A dry run: nothing was changed.
    #[serde(default)]
    pub dry_run: bool,
}

/// Whether `n` is what `x` expects; `Err(forceable)` when not.
fn check(x: &Expect, n: &Node) -> Result<(), bool> {
    let ok = match (x, n) {
        (Expect::Any, _) => true,
        (Expect::Absent, Node::Absent) => true,
        // Something is there now: overwriting a file is forceable, anything else is not.
        (Expect::Absent, Node::File { .. }) => return Err(true),
        (Expect::File { hash: None }, Node::File { .. }) => true,
        (Expect::File { hash: Some(h) }, Node::File { hash, .. }) => {
            if h == hash {
                true
            } else {
                return Err(true);
            }
        }
        (Expect::Dir, Node::Dir { .. }) => true,
        (Expect::Symlink { target }, Node::Symlink { target: t }) => target == t,
        (Expect::Exists, n) => *n != Node::Absent,
        (Expect::Mode { mode }, Node::File { mode: m, .. } | Node::Dir { mode: m }) => {
            if mode == m {
                true
            } else {
                return Err(true);
            }
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(false)
    }
}

fn expected(x: &Expect) -> String {
    match x {
        Expect::Absent => "nothing".into(),
        Expect::File { hash: Some(h) } => format!("a file ({})", super::tree::short_hash(h)),
        Expect::File { hash: None } => "a file".into(),
        Expect::Dir => "a directory".into(),
        Expect::Symlink { target } => format!("a symlink to {}", target.display()),
        Expect::Exists => "something".into(),
        Expect::Mode { mode } => format!("mode {mode:o}"),
        Expect::Any => "anything".into(),
    }
}

/// Runs `plan` on `tree`. `record` is called after each change lands (the ledger entry);
/// its failure stops the run (fail closed: no change off the record), and the steps not
/// run are reported skipped.
pub fn apply(
    plan: &Plan,
    tree: &mut dyn Tree,
    store: Option<&Store>,
    force: bool,
    record: &mut dyn FnMut(&Change<'_>) -> Result<(), String>,
) -> Report {
    let mut report = Report {
        skipped: plan.skipped.clone(),
        ..Default::default()
    };
    // Paths left as they are (a conflict: someone else's change; or a change not undone),
    // from a step on: earlier changes there would build on a state that is not there.
    let mut blocked: Vec<(PathBuf, usize, bool)> = plan
        .blocked
        .iter()
        .map(|(p, from)| (p.clone(), *from, false))
        .collect();
    let mut stopped: Option<String> = None;
    for (i, step) in plan.steps.iter().enumerate() {
        let skip = |report: &mut Report, reason: String, conflict: bool| {
            report.skipped.push(Skipped {
                path: show(&step.path),
                entry: Some(step.entry.clone()),
                line: Some(step.line),
                reason,
                conflict,
            })
        };
        if let Some(why) = &stopped {
            skip(&mut report, format!("not attempted: {why}"), false);
            continue;
        }
        let targets: Vec<&Path> = match &step.action {
            Action::Rename { to } => vec![&step.path, to],
            Action::Exchange { with } => vec![&step.path, with],
            _ => vec![&step.path],
        };
        if let Some((b, _, conflict)) = blocked.iter().find(|(b, from, _)| {
            i >= *from && targets.iter().any(|t| t.starts_with(b) || b.starts_with(t))
        }) {
            let why = if *conflict {
                format!("{} was changed by someone else after this", show(b))
            } else {
                format!("a later change at {} could not be undone (above)", show(b))
            };
            skip(
                &mut report,
                format!("{}: left as it is, since {why}", step.what),
                *conflict,
            );
            continue;
        }
        match run_step(step, tree, store, force, record) {
            Ok(Some(done)) => {
                if matches!(step.action, Action::Remove | Action::Rmdir) {
                    report.removed.push(done);
                } else {
                    report.restored.push(done);
                }
            }
            Ok(None) => {}
            Err(StepError::Conflict(reason)) => {
                blocked.push((step.path.clone(), i, true));
                skip(&mut report, reason, true);
            }
            Err(StepError::Failed(reason)) => {
                blocked.push((step.path.clone(), i, false));
                skip(&mut report, reason, false);
            }
            Err(StepError::Unrecorded(reason)) => {
                skip(
                    &mut report,
                    format!(
                        "{}: made, but its ledger entry could not be written ({reason}); stopped here (`intentfs ledger verify` shows the path)",
                        step.what
                    ),
                    false,
                );
                stopped = Some(reason);
            }
        }
    }
    report
}

enum StepError {
    /// Someone else changed the path since.
    Conflict(String),
    /// It could not be done.
    Failed(String),
    /// It was done (or not) but the ledger could not take it: stop.
    Unrecorded(String),
}

fn io_fail(step: &Step, e: io::Error) -> StepError {
    StepError::Failed(format!("{}: {e}", step.what))
}

/// Makes the missing parent directories of `p` (mode 0755), each recorded.
fn parents(
    step: &Step,
    p: &Path,
    tree: &mut dyn Tree,
    record: &mut dyn FnMut(&Change<'_>) -> Result<(), String>,
) -> Result<(), StepError> {
    let mut missing = Vec::new();
    let mut cur = p.parent();
    while let Some(d) = cur.filter(|d| !d.as_os_str().is_empty()) {
        match tree.node(d).map_err(|e| io_fail(step, e))? {
            Node::Absent => missing.push(d.to_path_buf()),
            Node::Dir { .. } => break,
            other => {
                return Err(StepError::Conflict(format!(
                    "{}: {} is {} now, not a directory",
                    step.what,
                    show(d),
                    other.describe()
                )))
            }
        }
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        tree.mkdir(&d, 0o755).map_err(|e| io_fail(step, e))?;
        let made = Step {
            path: d.clone(),
            expect: Expect::Absent,
            action: Action::Mkdir { mode: 0o755 },
            entry: step.entry.clone(),
            line: step.line,
            what: format!("parent directory of {}", show(p)),
        };
        record(&Change {
            step: &made,
            before: Node::Absent,
            old: None,
            new: None,
            forced: false,
        })
        .map_err(StepError::Unrecorded)?;
    }
    Ok(())
}

fn run_step(
    step: &Step,
    tree: &mut dyn Tree,
    store: Option<&Store>,
    force: bool,
    record: &mut dyn FnMut(&Change<'_>) -> Result<(), String>,
) -> Result<Option<Done>, StepError> {
    let p = &step.path;
    let now = tree.node(p).map_err(|e| io_fail(step, e))?;
    let mut forced = false;
    if let Err(forceable) = check(&step.expect, &now) {
        // What --force may overwrite: a file, by putting a version over it, removing it,
        // renaming it back or resetting its mode; never a directory or a symlink.
        let forceable = forceable
            && matches!(
                step.action,
                Action::Put { .. } | Action::Remove | Action::Rename { .. } | Action::Chmod { .. }
            );
        if !(force && forceable) {
            return Err(StepError::Conflict(format!(
                "{}: {} holds {} now, not {}: changed by someone else since{}",
                step.what,
                show(p),
                now.describe(),
                expected(&step.expect),
                if forceable {
                    " (--force overwrites it; the version there is kept in the store)"
                } else {
                    ""
                }
            )));
        }
        if store.is_none() && matches!(now, Node::File { .. }) {
            return Err(StepError::Failed(format!(
                "{}: --force keeps the version it overwrites in the content store, and this workspace has none",
                step.what
            )));
        }
        forced = true;
    }
    // What is overwritten or removed is kept first: `prev_content_hash` resolves, and a
    // forced step can itself be undone.
    let keep = |tree: &dyn Tree| -> Result<(Option<Vec<u8>>, Option<String>), StepError> {
        if !matches!(now, Node::File { .. }) {
            return Ok((None, None));
        }
        let old = tree.read(p).map_err(|e| io_fail(step, e))?;
        let kept = match store {
            Some(s) => Some(s.put_bytes(&old).map_err(|e| {
                StepError::Failed(format!(
                    "{}: cannot keep the version of {} it replaces in the store: {e}",
                    step.what,
                    show(p)
                ))
            })?),
            None => None,
        };
        Ok((Some(old), kept))
    };
    let (old, kept) = match &step.action {
        Action::Put { content, mode } => {
            if let Node::File { hash, mode: m } = &now {
                if hash == content && mode.is_none_or(|x| x == *m) {
                    return Ok(None);
                }
            }
            let data = if *content == empty_hash() {
                Vec::new()
            } else {
                match store.map(|s| s.get(content)) {
                    Some(Ok(Some(d))) => d,
                    Some(Err(e)) => {
                        return Err(StepError::Failed(format!(
                            "{}: reading {content} from the store: {e}",
                            step.what
                        )))
                    }
                    _ => {
                        return Err(StepError::Failed(format!(
                            "{}: version {content} is not in the store",
                            step.what
                        )))
                    }
                }
            };
            if crate::ledger::sha256_bytes(&data) != *content {
                return Err(StepError::Failed(format!(
                    "{}: the store's copy of {content} does not hash to it (damaged): not restored",
                    step.what
                )));
            }
            let (old, kept) = keep(tree)?;
            parents(step, p, tree, record)?;
            let m = mode.or(now.mode()).unwrap_or(0o644);
            tree.put(p, &data, m).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: old.clone(),
                new: Some(data),
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (old, kept)
        }
        Action::Remove | Action::Rmdir => {
            let (old, kept) = keep(tree)?;
            let r = if step.action == Action::Rmdir {
                tree.rmdir(p)
            } else {
                tree.remove(p)
            };
            match r {
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                    return Err(StepError::Conflict(format!(
                        "{}: {} is not empty: it holds files made by others since",
                        step.what,
                        show(p)
                    )))
                }
                Err(e) => return Err(io_fail(step, e)),
                Ok(()) => {}
            }
            record(&Change {
                step,
                before: now.clone(),
                old: old.clone(),
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (old, kept)
        }
        Action::Mkdir { mode } => {
            parents(step, p, tree, record)?;
            tree.mkdir(p, *mode).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: None,
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (None, None)
        }
        Action::Symlink { target } => {
            parents(step, p, tree, record)?;
            tree.symlink(p, target).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: None,
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (None, None)
        }
        Action::Rename { to } => {
            let there = tree.node(to).map_err(|e| io_fail(step, e))?;
            if there != Node::Absent {
                return Err(StepError::Conflict(format!(
                    "{}: cannot rename {} back to {}: {} is there now",
                    step.what,
                    show(p),
                    show(to),
                    there.describe()
                )));
            }
            parents(step, to, tree, record)?;
            tree.rename(p, to).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: None,
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (None, None)
        }
        Action::Exchange { with } => {
            tree.exchange(p, with).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: None,
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (None, None)
        }
        Action::Chmod { mode } => {
            tree.chmod(p, *mode).map_err(|e| io_fail(step, e))?;
            record(&Change {
                step,
                before: now.clone(),
                old: None,
                new: None,
                forced,
            })
            .map_err(StepError::Unrecorded)?;
            (None, None)
        }
    };
    let _ = old;
    Ok(Some(Done {
        step: step.clone(),
        forced,
        kept,
    }))
}

/// The ledger entry of one applied change: the ordinary mutation type of what was done
/// (WRITE, DELETE, RENAME, MKDIR, ...), so every reader (drift, blame, log) follows it as
/// any other change, by `agent`, with `detail.restore` saying what it restored.
pub fn draft(c: &Change<'_>, agent: &Agent, command: &str, run: &str) -> Draft {
    let s = c.step;
    let mut restore = serde_json::json!({
        "command": command,
        "run": run,
        "entry": s.entry,
        "line": s.line,
    });
    if c.forced {
        restore["forced"] = true.into();
    }
    let mut detail = serde_json::json!({ "restore": restore });
    let mut d = Draft {
        agent: Some(agent.clone()),
        path: Some(s.path.clone()),
        ..Default::default()
    };
    let old_hash = match &c.before {
        Node::File { hash, .. } => Some(hash.clone()),
        _ => None,
    };
    match &s.action {
        Action::Put { content, mode } => {
            d.mutation_type = Some(MutationType::Write);
            d.content_hash = Some(content.clone());
            d.prev_content_hash = old_hash;
            d.created = !matches!(c.before, Node::File { .. });
            d.size = c.new.as_ref().map(|n| n.len() as u64);
            if let Some(new) = &c.new {
                d.ranges = crate::ledger::changed_ranges(c.old.as_deref().unwrap_or(b""), new);
            }
            let m = mode.or(c.before.mode()).unwrap_or(0o644);
            detail["mode"] = format!("{m:o}").into();
        }
        Action::Remove => {
            d.mutation_type = Some(MutationType::Delete);
            d.prev_content_hash = old_hash;
            d.size = c.old.as_ref().map(|o| o.len() as u64);
            if let Some(m) = c.before.mode() {
                detail["mode"] = format!("{m:o}").into();
            }
            if let Node::Symlink { target } = &c.before {
                detail["target"] = target.to_string_lossy().into_owned().into();
            }
        }
        Action::Rmdir => {
            d.mutation_type = Some(MutationType::Rmdir);
            if let Some(m) = c.before.mode() {
                detail["mode"] = format!("{m:o}").into();
            }
        }
        Action::Mkdir { mode } => {
            d.mutation_type = Some(MutationType::Mkdir);
            detail["mode"] = format!("{mode:o}").into();
        }
        Action::Symlink { target } => {
            d.mutation_type = Some(MutationType::Symlink);
            detail["target"] = target.to_string_lossy().into_owned().into();
        }
        Action::Rename { to } => {
            d.mutation_type = Some(MutationType::Rename);
            d.from = Some(s.path.clone());
            d.path = Some(to.clone());
            d.content_hash = old_hash;
        }
        Action::Exchange { with } => {
            d.mutation_type = Some(MutationType::Rename);
            d.from = Some(s.path.clone());
            d.path = Some(with.clone());
            detail["exchange"] = true.into();
        }
        Action::Chmod { mode } => {
            d.mutation_type = Some(MutationType::Chmod);
            if let Some(m) = c.before.mode() {
                detail["mode_before"] = format!("{m:o}").into();
            }
            detail["mode_after"] = format!("{mode:o}").into();
        }
    }
    d.detail = Some(detail);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::sha256_bytes;
    use crate::versions::history::tests::entry;
    use crate::versions::tree::Disk;

    fn by(mut e: (u64, Entry), agent: &str) -> (u64, Entry) {
        if let Some(a) = e.1.agent.as_mut() {
            a.name = agent.into();
        }
        e
    }

    /// Alice wrote `a` and `b`, made `d/f`, removed the symlink `l`; bob then wrote `b`.
    /// Rewinding alice puts `a` back, removes `d/f` and `d`, makes `l` again, and leaves
    /// `b` (bob's) alone as a conflict, with alice's earlier write there blocked too.
    #[test]
    fn rewind_undoes_in_reverse_and_leaves_others_changes_as_conflicts() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path();
        let store = Store::open(&ws.join("objects")).unwrap();
        let h = |s: &str| store.put_bytes(s.as_bytes()).unwrap();
        let (a0, a1, b0, b1, b2) = (h("a0\n"), h("a1\n"), h("b0\n"), h("b1\n"), h("b2\n"));
        std::fs::write(ws.join("a"), "a1\n").unwrap();
        std::fs::write(ws.join("b"), "b2\n").unwrap();
        std::fs::create_dir(ws.join("d")).unwrap();
        std::fs::write(ws.join("d/f"), "").unwrap();
        let mut es = Vec::new();
        let mut w = entry(1, MutationType::Write, "a");
        (w.1.prev_content_hash, w.1.content_hash) = (Some(a0.clone()), Some(a1));
        es.push(w);
        let mut w = entry(2, MutationType::Write, "b");
        (w.1.prev_content_hash, w.1.content_hash) = (Some(b0), Some(b1.clone()));
        es.push(w);
        es.push(entry(3, MutationType::Mkdir, "d"));
        let mut c = entry(4, MutationType::Create, "d/f");
        c.1.content_hash = Some(empty_hash());
        es.push(c);
        let mut d = entry(5, MutationType::Delete, "l");
        d.1.detail = Some(serde_json::json!({"target": "a"}));
        es.push(d);
        let mut w = by(entry(6, MutationType::Write, "b"), "bob");
        (w.1.prev_content_hash, w.1.content_hash) = (Some(b1), Some(b2));
        es.push(w);
        let filter = Filter {
            agent: Some("alice".into()),
            ..Default::default()
        };
        let plan = rewind(&es, &filter, Some(&store));
        let order: Vec<(u64, &str)> = plan
            .steps
            .iter()
            .map(|s| (s.line, s.path.to_str().unwrap()))
            .collect();
        assert_eq!(
            order,
            vec![(5, "l"), (4, "d/f"), (3, "d"), (2, "b"), (1, "a")]
        );
        let mut disk = Disk::open(ws).unwrap();
        let mut recorded = Vec::new();
        let r = apply(&plan, &mut disk, Some(&store), false, &mut |c| {
            recorded.push(c.step.path.clone());
            Ok(())
        });
        assert_eq!(std::fs::read_to_string(ws.join("a")).unwrap(), "a0\n");
        assert_eq!(std::fs::read_link(ws.join("l")).unwrap(), Path::new("a"));
        assert!(!ws.join("d").exists());
        assert_eq!(
            std::fs::read_to_string(ws.join("b")).unwrap(),
            "b2\n",
            "bob's stays"
        );
        assert_eq!(r.removed.len(), 2);
        assert_eq!(r.restored.len(), 2);
        let conflict: Vec<&Skipped> = r.skipped.iter().filter(|s| s.conflict).collect();
        assert_eq!(conflict.len(), 1, "{r:#?}");
        assert!(
            conflict[0].reason.contains("changed by someone else"),
            "{r:#?}"
        );
        assert_eq!(recorded.len(), 4, "one record per change");

        // A failing record stops the run: nothing after it is attempted.
        std::fs::write(ws.join("a"), "a1\n").unwrap();
        let plan = rewind(&es[..1], &filter, Some(&store));
        let r = apply(&plan, &mut disk, Some(&store), false, &mut |_| {
            Err("disk full".into())
        });
        assert!(
            r.restored.is_empty() && r.skipped[0].reason.contains("disk full"),
            "{r:#?}"
        );

        // --force overwrites bob's version, keeping it.
        let plan = rewind(&es, &filter, Some(&store));
        let r = apply(&plan, &mut disk, Some(&store), true, &mut |_| Ok(()));
        assert_eq!(std::fs::read_to_string(ws.join("b")).unwrap(), "b0\n");
        let forced = r.restored.iter().find(|d| d.forced).unwrap();
        assert_eq!(forced.kept.as_deref(), Some(sha256_bytes(b"b2\n").as_str()));
        assert!(store.has(&sha256_bytes(b"b2\n")));
    }

    /// A change that cannot be undone (its version was not kept) leaves the earlier changes
    /// at that path alone, saying why, instead of calling the path someone else's.
    #[test]
    fn a_change_not_undone_blocks_the_earlier_ones_at_its_path() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&t.path().join("objects")).unwrap();
        let c0 = store.put_bytes(b"c0").unwrap();
        let mut w = entry(1, MutationType::Write, "c");
        (w.1.prev_content_hash, w.1.content_hash) = (Some(c0), Some(sha256_bytes(b"c1")));
        let mut d = entry(2, MutationType::Delete, "c");
        d.1.prev_content_hash = Some(sha256_bytes(b"c1"));
        d.1.detail =
            Some(serde_json::json!({"version": {"kept": false, "reason": "over the cap"}}));
        let plan = rewind(&[w, d], &Filter::default(), Some(&store));
        assert_eq!(plan.skipped.len(), 1);
        assert!(
            plan.skipped[0].reason.contains("not kept: over the cap"),
            "{plan:#?}"
        );
        let mut disk = Disk::open(t.path()).unwrap();
        let r = apply(&plan, &mut disk, Some(&store), true, &mut |_| Ok(()));
        assert!(r.restored.is_empty(), "{r:#?}");
        let blocked = &r.skipped[1];
        assert!(
            !blocked.conflict && blocked.reason.contains("could not be undone"),
            "{r:#?}"
        );
        assert!(!t.path().join("c").exists());
    }
}
