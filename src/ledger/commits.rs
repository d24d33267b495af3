//! Attribution of git commits from the ledger: for each commit, which intents and agents
//! wrote the lines it changed, as an Agent Trace record for the commit (the format of
//! [`super::agent_trace`], with `vcs.revision` the commit) and as a short text for people.
//! `intentfs notes` stores both as the commit's git note.
//!
//! A file's committed content is found in the ledger by its hash: the last successful entry
//! at that path whose `content_hash` is the SHA-256 of the committed blob (at or before the
//! commit's time when there is one) recorded that version. Its lines are attributed by the
//! same replay as `intentfs blame` ([`super::blame::attribute_at`]), and each line the commit
//! changed (against its first parent) goes to the intent and agent of the change that last
//! touched it. Lines no ledger change accounts for (a human's edit, content from before the
//! ledger, a version the mount never saw) are listed as not from the ledger, with contributor
//! type `unknown`. Pure: entries and the commits' diffs in, records out; git is run by the
//! command.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::{json, Value};

use super::agent_trace::{AGENT_TRACE_VERSION, METADATA_KEY};
use super::blame::{attribute_at, Change};
use super::entry::{Entry, MutationType};
use super::reader::outcome_failed;

/// A file as one commit changed it.
#[derive(Clone, Debug)]
pub struct FileDiff {
    /// Repository-relative path.
    pub path: String,
    /// `sha256:<hex>` of the committed content.
    pub hash: String,
    /// The lines of the committed content the commit changed (1-based, inclusive).
    pub changed: Vec<(u32, u32)>,
}

/// One commit, as git describes it.
#[derive(Clone, Debug)]
pub struct CommitInfo {
    /// The commit id.
    pub revision: String,
    /// Its first parent (None for a root commit).
    pub parent: Option<String>,
    /// The committer date, RFC 3339.
    pub timestamp: String,
    /// The regular text files it added or modified.
    pub files: Vec<FileDiff>,
}

/// The lines of one file an (intent, agent) pair wrote in a commit.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Contribution {
    pub path: String,
    pub intent_id: Option<String>,
    pub agent: Option<String>,
    /// Merged line ranges of the committed file.
    #[serde(serialize_with = "ser_ranges")]
    pub ranges: Vec<(u32, u32)>,
    /// The ledger entries the lines come from.
    pub entry_ids: Vec<String>,
}

/// Lines of one file a commit changed that the ledger does not account for.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Unattributed {
    pub path: String,
    #[serde(serialize_with = "ser_ranges")]
    pub ranges: Vec<(u32, u32)>,
}

/// Ranges as the ledger and Agent Trace write them: `{"start_line": 1, "end_line": 3}`.
fn ser_ranges<S: serde::Serializer>(r: &[(u32, u32)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        r.iter()
            .map(|&(start_line, end_line)| super::entry::LineRange {
                start_line,
                end_line,
            }),
    )
}

/// What the ledger says about a commit.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CommitAttribution {
    pub revision: String,
    pub parent: Option<String>,
    pub timestamp: String,
    /// By path, then intent and agent.
    pub contributions: Vec<Contribution>,
    /// Changed lines the ledger does not account for.
    pub unattributed: Vec<Unattributed>,
}

impl CommitAttribution {
    /// Whether any changed line comes from the ledger.
    pub fn attributed(&self) -> bool {
        !self.contributions.is_empty()
    }
}

/// (intent, agent): who a line is attributed to.
type Who = (Option<String>, Option<String>);

/// Merges sorted line numbers into inclusive ranges.
fn to_ranges(lines: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &l in lines {
        match out.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => out.push((l, l)),
        }
    }
    out
}

/// Whether this entry put content at its path that a later commit could carry.
fn carries_content(e: &Entry) -> bool {
    !outcome_failed(&e.outcome)
        && e.content_hash.is_some()
        && matches!(
            e.mutation_type,
            MutationType::Write
                | MutationType::Rename
                | MutationType::Truncate
                | MutationType::Create
                | MutationType::Link
        )
}

/// Attributes each commit's changed lines to the ledger's intents and agents.
pub fn attribute_commits(
    entries: &[(u64, Entry)],
    commits: &[CommitInfo],
) -> Vec<CommitAttribution> {
    // (path, hash) -> the indexes of the entries that recorded it, in ledger order.
    let mut by_version: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, (_, e)) in entries.iter().enumerate() {
        if let (true, Some(p), Some(h)) = (carries_content(e), &e.path, &e.content_hash) {
            by_version
                .entry((p.as_str(), h.as_str()))
                .or_default()
                .push(i);
        }
    }
    let time = |s: &str| chrono::DateTime::parse_from_rfc3339(s).ok();
    // Each (commit, file) whose version the ledger recorded: the entry that recorded it.
    let mut targets = Vec::new();
    let mut slots = Vec::new();
    for (ci, c) in commits.iter().enumerate() {
        // The commit can only carry what was written before it (a second of slack: git's
        // dates have whole seconds).
        let limit = time(&c.timestamp).map(|t| t + chrono::Duration::seconds(2));
        for (fi, f) in c.files.iter().enumerate() {
            let Some(idxs) = by_version.get(&(f.path.as_str(), f.hash.as_str())) else {
                continue;
            };
            let before =
                idxs.iter()
                    .rev()
                    .find(|&&i| match (limit, time(&entries[i].1.timestamp)) {
                        (Some(l), Some(t)) => t <= l,
                        _ => true,
                    });
            if let Some(&i) = before.or(idxs.last()) {
                slots.push((ci, fi, targets.len()));
                targets.push((i, PathBuf::from(&f.path)));
            }
        }
    }
    let versions = attribute_at(entries, &targets);
    let mut found: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (ci, fi, t) in slots {
        found.insert((ci, fi), t);
    }
    commits
        .iter()
        .enumerate()
        .map(|(ci, c)| {
            let mut contributions = Vec::new();
            let mut unattributed = Vec::new();
            for (fi, f) in c.files.iter().enumerate() {
                let v = found.get(&(ci, fi)).map(|&t| &versions[t]);
                // (intent, agent) -> (lines, entry ids), in the order first met.
                let mut groups: Vec<(Who, Vec<u32>, Vec<String>)> = Vec::new();
                let mut none = Vec::new();
                for &(s, e) in &f.changed {
                    for l in s..=e {
                        let change: Option<&Change> = v.and_then(|v| {
                            v.lines
                                .get(l as usize - 1)
                                .and_then(Option::as_ref)
                                .or(v.unranged.as_ref())
                        });
                        let Some(ch) = change else {
                            none.push(l);
                            continue;
                        };
                        let key = (ch.intent_id.clone(), ch.agent.clone());
                        let g = match groups.iter().position(|g| g.0 == key) {
                            Some(i) => &mut groups[i],
                            None => {
                                groups.push((key, Vec::new(), Vec::new()));
                                let n = groups.len() - 1;
                                &mut groups[n]
                            }
                        };
                        g.1.push(l);
                        if !g.2.contains(&ch.entry_id) {
                            g.2.push(ch.entry_id.clone());
                        }
                    }
                }
                for ((intent_id, agent), lines, entry_ids) in groups {
                    contributions.push(Contribution {
                        path: f.path.clone(),
                        intent_id,
                        agent,
                        ranges: to_ranges(&lines),
                        entry_ids,
                    });
                }
                if !none.is_empty() {
                    unattributed.push(Unattributed {
                        path: f.path.clone(),
                        ranges: to_ranges(&none),
                    });
                }
            }
            CommitAttribution {
                revision: c.revision.clone(),
                parent: c.parent.clone(),
                timestamp: c.timestamp.clone(),
                contributions,
                unattributed,
            }
        })
        .collect()
}

fn ranges_json(r: &[(u32, u32)]) -> Vec<Value> {
    r.iter()
        .map(|(s, e)| json!({ "start_line": s, "end_line": e }))
        .collect()
}

/// `1-3,7`
fn ranges_text(r: &[(u32, u32)]) -> String {
    r.iter()
        .map(|&(s, e)| {
            if s == e {
                s.to_string()
            } else {
                format!("{s}-{e}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A stable record id for a commit's attribution (a UUID from its hash: re-running gives the
/// same record, so the same note).
fn record_id(a: &CommitAttribution) -> String {
    let digest =
        super::ranges::sha256_bytes(serde_json::to_string(a).unwrap_or_default().as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0);
    }
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The commit's Agent Trace record: one conversation per (intent, agent) per file, with
/// contributor `ai`, and one with contributor `unknown` for the lines not from the ledger;
/// `metadata["dev.intentfs"]` names each conversation's intent, agent and entries (in the
/// same order as the file's conversations).
pub fn record(a: &CommitAttribution) -> Value {
    // Per file: its conversations, and what the metadata says of each.
    type Files = Vec<(String, Vec<Value>, Vec<Value>)>;
    fn slot(files: &mut Files, path: &str) -> usize {
        match files.iter().position(|f| f.0 == path) {
            Some(i) => i,
            None => {
                files.push((path.to_owned(), Vec::new(), Vec::new()));
                files.len() - 1
            }
        }
    }
    let mut files: Files = Vec::new();
    for c in &a.contributions {
        let i = slot(&mut files, &c.path);
        files[i].1.push(json!({
            "contributor": { "type": "ai" },
            "ranges": ranges_json(&c.ranges),
        }));
        files[i].2.push(json!({
            "intent_id": c.intent_id,
            "agent": c.agent,
            "entry_ids": c.entry_ids,
        }));
    }
    for u in &a.unattributed {
        let (path, r) = (&u.path, &u.ranges);
        let i = slot(&mut files, path);
        files[i].1.push(json!({
            "contributor": { "type": "unknown" },
            "ranges": ranges_json(r),
        }));
        files[i]
            .2
            .push(json!({ "intent_id": null, "agent": null, "not_in_ledger": true }));
    }
    let meta_files: serde_json::Map<String, Value> = files
        .iter()
        .map(|(p, _, m)| (p.clone(), json!({ "conversations": m })))
        .collect();
    json!({
        "version": AGENT_TRACE_VERSION,
        "id": record_id(a),
        "timestamp": a.timestamp,
        "vcs": { "type": "git", "revision": a.revision },
        "tool": { "name": "intentfs", "version": env!("CARGO_PKG_VERSION") },
        "files": files
            .iter()
            .map(|(p, convs, _)| json!({ "path": p, "conversations": convs }))
            .collect::<Vec<_>>(),
        "metadata": { METADATA_KEY: { "parent": a.parent, "files": meta_files } },
    })
}

/// The note: a header people read (`git notes show`), a blank line, and the Agent Trace
/// record as one line of JSON (the note's last line).
pub fn note_text(a: &CommitAttribution) -> String {
    let mut s = format!("intentfs: attribution of {} from the ledger\n", a.revision);
    // One line per (intent, agent): its files and line ranges.
    type Items<'a> = ((Option<&'a str>, Option<&'a str>), Vec<String>);
    let mut who: Vec<Items> = Vec::new();
    for c in &a.contributions {
        let key = (c.intent_id.as_deref(), c.agent.as_deref());
        let item = format!("{}:{}", c.path, ranges_text(&c.ranges));
        match who.iter_mut().find(|w| w.0 == key) {
            Some(w) => w.1.push(item),
            None => who.push((key, vec![item])),
        }
    }
    for ((intent, agent), items) in who {
        s.push_str(&format!(
            "intent {} agent {}: {}\n",
            intent.unwrap_or("(none)"),
            agent.unwrap_or("(unknown)"),
            items.join(" ")
        ));
    }
    if !a.unattributed.is_empty() {
        let items: Vec<String> = a
            .unattributed
            .iter()
            .map(|u| format!("{}:{}", u.path, ranges_text(&u.ranges)))
            .collect();
        s.push_str(&format!("not in the ledger: {}\n", items.join(" ")));
    }
    s.push('\n');
    s.push_str(&record(a).to_string());
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::{Agent, LineRange};

    fn write(
        id: &str,
        ts: &str,
        intent: &str,
        agent: &str,
        path: &str,
        hash: &str,
        r: &[(u32, u32)],
    ) -> Entry {
        Entry {
            id: id.into(),
            timestamp: ts.into(),
            intent_id: Some(intent.into()),
            agent: Some(Agent {
                name: agent.into(),
                identity: agent.into(),
                pid: 1,
                uid: 0,
                process: "sh".into(),
            }),
            mutation_type: MutationType::Write,
            mutation_class: None,
            path: Some(path.into()),
            path_b64: None,
            from: None,
            from_b64: None,
            content_hash: Some(hash.into()),
            prev_content_hash: None,
            size: None,
            created: false,
            ranges: Some(
                r.iter()
                    .map(|&(s, e)| LineRange {
                        start_line: s,
                        end_line: e,
                    })
                    .collect(),
            ),
            vcs: None,
            outcome: "ok".into(),
            code: None,
            rule: None,
            detail: None,
            prev: String::new(),
        }
    }

    #[test]
    fn two_intents_one_file_and_a_human_line() {
        let entries: Vec<(u64, Entry)> = vec![
            write(
                "e1",
                "2026-01-01T10:00:00Z",
                "INT-1",
                "a",
                "f.rs",
                "sha256:v1",
                &[(1, 4)],
            ),
            write(
                "e2",
                "2026-01-01T10:01:00Z",
                "INT-2",
                "b",
                "f.rs",
                "sha256:v2",
                &[(3, 3)],
            ),
            // Written after the commit: not what it carries.
            write(
                "e3",
                "2026-01-01T11:00:00Z",
                "INT-3",
                "c",
                "f.rs",
                "sha256:v2",
                &[(1, 1)],
            ),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, e)| (i as u64 + 1, e))
        .collect();
        let commit = CommitInfo {
            revision: "c1".into(),
            parent: None,
            timestamp: "2026-01-01T10:02:00Z".into(),
            files: vec![
                FileDiff {
                    path: "f.rs".into(),
                    hash: "sha256:v2".into(),
                    changed: vec![(1, 5)],
                },
                FileDiff {
                    path: "g.rs".into(),
                    hash: "sha256:zz".into(),
                    changed: vec![(2, 3)],
                },
            ],
        };
        let a = &attribute_commits(&entries, &[commit])[0];
        assert_eq!(
            a.contributions,
            vec![
                Contribution {
                    path: "f.rs".into(),
                    intent_id: Some("INT-1".into()),
                    agent: Some("a".into()),
                    ranges: vec![(1, 2), (4, 4)],
                    entry_ids: vec!["e1".into()],
                },
                Contribution {
                    path: "f.rs".into(),
                    intent_id: Some("INT-2".into()),
                    agent: Some("b".into()),
                    ranges: vec![(3, 3)],
                    entry_ids: vec!["e2".into()],
                },
            ]
        );
        assert_eq!(
            a.unattributed,
            vec![
                Unattributed {
                    path: "f.rs".into(),
                    ranges: vec![(5, 5)]
                },
                Unattributed {
                    path: "g.rs".into(),
                    ranges: vec![(2, 3)]
                }
            ]
        );
        let text = note_text(a);
        assert!(
            text.contains("intent INT-1 agent a: f.rs:1-2,4\n"),
            "{text}"
        );
        assert!(text.contains("intent INT-2 agent b: f.rs:3\n"), "{text}");
        assert!(
            text.contains("not in the ledger: f.rs:5 g.rs:2-3\n"),
            "{text}"
        );
        let rec: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(rec["vcs"]["revision"], "c1");
        assert_eq!(
            rec["files"][0]["conversations"][1]["ranges"][0]["start_line"],
            3
        );
        assert_eq!(
            rec["metadata"]["dev.intentfs"]["files"]["f.rs"]["conversations"][1]["intent_id"],
            "INT-2"
        );
        assert_eq!(
            rec["files"][0]["conversations"][2]["contributor"]["type"],
            "unknown"
        );
        assert_eq!(
            note_text(a),
            text,
            "the same attribution gives the same note"
        );
        let json = serde_json::to_value(a).unwrap();
        assert_eq!(
            json["contributions"][0]["ranges"],
            json!([{"start_line": 1, "end_line": 2}, {"start_line": 4, "end_line": 4}])
        );
        assert_eq!(json["unattributed"][1]["path"], "g.rs");
    }
}
