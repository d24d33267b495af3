//! Retention: which objects a store keeps (`intentfs gc`).
//!
//! An object's age is the time of the newest ledger entry naming it (`content_hash` or
//! `prev_content_hash`), or, for an object no entry names (its entry not written yet, or
//! lost with a crash), its file's mtime. Objects younger than `keep` are never removed;
//! older ones are; then, while the store is over `max_size`, the oldest of the rest go
//! first (never one younger than `keep`, never one younger than [`GRACE`]).
//!
//! Running beside a mounted daemon: a put that finds its object present refreshes the
//! object's mtime ([`super::Store::touch`]) before the entry naming it is written, and gc
//! removes an object by renaming it aside first and looking at the mtime of what it
//! renamed: a refreshed one is put back. So an entry never names an object gc removed
//! under it. What each run removed is appended to `<store>/gc.jsonl` ([`GC_LOG`]), where
//! [`removal_of`] finds why a hash no longer resolves.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::{Object, Store};
use crate::ledger::read_entries;

/// The log of removals, in the store directory.
pub const GC_LOG: &str = "gc.jsonl";
/// An object written or reused this recently is never removed, whatever the retention
/// says: its entry may still be on its way to the ledger.
pub const GRACE: Duration = Duration::from_secs(600);
/// Temporaries older than this are leftovers of an interrupted put.
const TEMP_AGE: Duration = Duration::from_secs(3600);

/// What to keep.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Retention {
    /// Keep every object an entry this recent names (None: age protects nothing but
    /// [`GRACE`]).
    #[serde(with = "opt_secs")]
    pub keep: Option<Duration>,
    /// Remove the oldest objects until the store takes at most this many bytes.
    pub max_size: Option<u64>,
}

mod opt_secs {
    use serde::Serializer;
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&d.as_secs()),
            None => s.serialize_none(),
        }
    }
}

/// Why an object was removed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// No entry newer than `keep` names it.
    Expired,
    /// The store was over `max_size` and it was among the oldest.
    OverBudget,
}

/// One object removed (or, in a dry run, that would be).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Removed {
    pub hash: String,
    /// Bytes it took on disk.
    pub bytes: u64,
    /// The newest entry naming it (RFC 3339), or null when none does.
    pub last_referenced: Option<String>,
    pub why: Why,
}

/// What one gc run did.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub timestamp: String,
    pub dry_run: bool,
    /// Keep, in seconds, and the size budget.
    pub retention: Retention,
    pub objects_before: usize,
    pub bytes_before: u64,
    pub removed: Vec<Removed>,
    pub freed_bytes: u64,
    pub objects_after: usize,
    pub bytes_after: u64,
    /// Bytes still over `max_size` because every remaining object is protected.
    pub over_budget_bytes: u64,
    /// Objects a put reused while gc ran (put back, not removed).
    pub reprieved: usize,
    /// Leftover temporaries of interrupted puts removed.
    pub temps_removed: usize,
    /// Sealed packs unpacked into loose objects (then removed) before the retention ran.
    pub packs_unpacked: usize,
}

/// Apply `retention` to `store`, reading which objects are named from the ledger at
/// `ledger`. `dry_run`: decide and report, remove nothing, log nothing.
pub fn gc(
    store: &Store,
    ledger: &Path,
    retention: &Retention,
    now: SystemTime,
    dry_run: bool,
) -> io::Result<Report> {
    let last_ref = last_references(ledger)?;
    // Packed objects are judged as loose ones (a sealed pack's counted at what a loose copy
    // takes: gc unpacks what it keeps of them). One a daemon holds a pack of is never
    // removed.
    let objects = store.objects()?;
    let bytes_before: u64 = objects.iter().map(|o| o.disk).sum();
    let objects_before = objects.len();

    // (object, its age reference time, the newest entry's timestamp if any)
    let mut aged: Vec<(Object, SystemTime, Option<DateTime<Utc>>)> = objects
        .into_iter()
        .map(|o| {
            let r = last_ref.get(&o.hash).copied();
            let written = o.mtime.unwrap_or(now);
            // An entry's time, but never older than the object's own mtime: a put that
            // reused the object since counts as a use.
            let t = r.map_or(written, |r| SystemTime::from(r).max(written));
            (o, t, r)
        })
        .collect();
    // Oldest first (of the same age, by hash: a dry run says what the run does).
    aged.sort_by(|(a, ta, _), (b, tb, _)| ta.cmp(tb).then_with(|| a.hash.cmp(&b.hash)));

    let protected = |t: SystemTime| {
        let age = now.duration_since(t).unwrap_or(Duration::ZERO);
        age < GRACE || retention.keep.is_some_and(|k| age < k)
    };
    let mut removed = Vec::new();
    let mut remaining = bytes_before;
    for (o, t, r) in &aged {
        let why = if protected(*t) || o.in_use {
            continue;
        } else if retention.keep.is_some() {
            Why::Expired
        } else if retention.max_size.is_some_and(|m| remaining > m) {
            Why::OverBudget
        } else {
            continue;
        };
        removed.push((o, *r, why));
        remaining -= o.disk;
    }
    // With `keep`, expired objects go whatever the budget; then the budget removes the
    // oldest of what is left and unprotected (none: all that is left is younger than
    // `keep`). So the budget only ever removes what `keep` alone would not protect.

    let mut report = Report {
        timestamp: DateTime::<Utc>::from(now).to_rfc3339_opts(SecondsFormat::Secs, true),
        dry_run,
        retention: retention.clone(),
        objects_before,
        bytes_before,
        removed: Vec::new(),
        freed_bytes: 0,
        objects_after: objects_before,
        bytes_after: bytes_before,
        over_budget_bytes: 0,
        reprieved: 0,
        temps_removed: 0,
        packs_unpacked: 0,
    };
    // Sealed packs are unpacked, less the objects removed (left out of the loose copies),
    // before the loose objects go.
    let mut dropped = std::collections::HashSet::new();
    if !dry_run {
        let drop = removed
            .iter()
            .filter(|(o, _, _)| o.kind == super::Kind::Packed)
            .map(|(o, _, _)| o.hash.clone())
            .collect();
        (report.packs_unpacked, dropped) = store.unpack_sealed(&drop)?;
    }
    for (o, r, why) in removed {
        if o.kind == super::Kind::Packed {
            if !dry_run && !dropped.contains(&o.hash) {
                // (Its pack went meanwhile: another gc.)
                continue;
            }
        } else if !dry_run {
            match store.remove_unless_used(o, now)? {
                Removal::Removed => {}
                Removal::Reused => {
                    report.reprieved += 1;
                    continue;
                }
                Removal::Gone => continue,
            }
        }
        report.freed_bytes += o.disk;
        report.objects_after -= 1;
        report.removed.push(Removed {
            hash: o.hash.clone(),
            bytes: o.disk,
            last_referenced: r.map(|r| r.to_rfc3339_opts(SecondsFormat::Micros, true)),
            why,
        });
    }
    report.bytes_after = bytes_before - report.freed_bytes;
    if let Some(m) = retention.max_size {
        report.over_budget_bytes = report.bytes_after.saturating_sub(m);
    }
    if !dry_run {
        report.temps_removed = store.sweep_temps(TEMP_AGE)?;
        if !report.removed.is_empty() {
            append_log(store, &report)?;
        }
    }
    Ok(report)
}

/// The newest entry time naming each content hash.
fn last_references(ledger: &Path) -> io::Result<HashMap<String, DateTime<Utc>>> {
    let entries = match read_entries(ledger) {
        Ok(e) => e,
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot read the ledger {} (gc needs it to know which objects are named): {e}",
                    ledger.display()
                ),
            ))
        }
    };
    let mut out: HashMap<String, DateTime<Utc>> = HashMap::new();
    for (_, e) in entries {
        let Ok(t) = DateTime::parse_from_rfc3339(&e.timestamp) else {
            continue;
        };
        let t = t.with_timezone(&Utc);
        for h in [e.content_hash, e.prev_content_hash].into_iter().flatten() {
            let slot = out.entry(h).or_insert(t);
            if *slot < t {
                *slot = t;
            }
        }
    }
    Ok(out)
}

/// What [`Store::remove_unless_used`] did.
pub enum Removal {
    Removed,
    /// A put reused the object since it was listed: put back.
    Reused,
    /// Already gone.
    Gone,
}

impl Store {
    /// Remove `o` unless a put refreshed it within [`GRACE`] of `now`: renamed aside
    /// first (a put after that finds it absent and writes it again), then its mtime read
    /// from the renamed file (a put before that refreshed it: renamed back).
    pub fn remove_unless_used(&self, o: &Object, now: SystemTime) -> io::Result<Removal> {
        // (A packed object goes when gc unpacks its pack without it: its path is the pack's.)
        if o.kind == super::Kind::Packed {
            return Ok(Removal::Reused);
        }
        // A temporary's name: a crash between the two steps leaves what `sweep_temps`
        // removes later.
        let aside = o.path.with_file_name(format!(
            "{}gc.{}",
            super::TMP_PREFIX,
            o.path.file_name().unwrap_or_default().to_string_lossy()
        ));
        match fs::rename(&o.path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Gone),
            Err(e) => return Err(e),
        }
        let fresh = fs::metadata(&aside)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_none_or(|age| age < GRACE);
        if fresh {
            // A put rewrote it meanwhile (then the new one stays) or refreshed it.
            if o.path.exists() {
                fs::remove_file(&aside)?;
            } else {
                fs::rename(&aside, &o.path)?;
            }
            return Ok(Removal::Reused);
        }
        fs::remove_file(&aside)?;
        Ok(Removal::Removed)
    }
}

fn append_log(store: &Store, report: &Report) -> io::Result<()> {
    let mut line = serde_json::to_vec(report).map_err(io::Error::other)?;
    line.push(b'\n');
    let path = store.dir().join(GC_LOG);
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))?;
    f.write_all(&line)?;
    f.sync_data()
}

/// Why `hash` is no longer in the store, if a gc run removed it: that run's timestamp
/// and its record of the object (for readers that show why a version cannot be shown).
pub fn removal_of(store: &Store, hash: &str) -> io::Result<Option<(String, Removed)>> {
    let text = match fs::read_to_string(store.dir().join(GC_LOG)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    #[derive(Deserialize)]
    struct Run {
        timestamp: String,
        removed: Vec<Removed>,
    }
    // The newest run that removed it (a hash can be stored and removed again).
    let mut found = None;
    for line in text.lines() {
        let Ok(run) = serde_json::from_str::<Run>(line) else {
            continue;
        };
        if let Some(r) = run.removed.into_iter().find(|r| r.hash == hash) {
            found = Some((run.timestamp, r));
        }
    }
    Ok(found)
}
