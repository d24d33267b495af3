//! The append-only, hash-chained audit ledger: every completed mutation, denial and
//! approval as one JSON line of `.orchestration/agent_trace.jsonl`.
//!
//! - [`entry`]: the line schema (what a [`Draft`] becomes).
//! - [`writer`]: the writer thread (bounded queue, group commit, chain, torn-tail repair).
//! - [`head`]: the head checkpoint the writer keeps and verify reads.
//! - [`reader`]: parse, verify the chain, drift against the workspace, queries.
//! - [`blame`]: per-line attribution from the recorded line ranges.
//! - [`vcs`]: the git revision, read from `.git` without running git.
//! - [`ranges`]: content hashes and changed line ranges.
//! - [`map`]: the intent map (`.orchestration/intent_map.md`).
//! - [`agent_trace`]: export as Agent Trace records.
//! - [`commits`]: attribution of git commits (the notes `intentfs notes` writes).
//!
//! No FUSE knowledge here: the filesystem hands over [`Draft`]s and asks [`Ledger::health`].

pub mod agent_trace;
pub mod blame;
pub mod code;
pub mod commits;
pub mod entry;
pub mod head;
pub mod map;
pub mod ranges;
pub mod reader;
pub mod vcs;
pub mod writer;

#[cfg(test)]
mod tests;

pub use code::Code;
pub use entry::{Agent, Draft, Entry, LineRange, MutationClass, MutationType, Outcome, Vcs};
pub use map::{write_intent_map, IntentMapThread, IntentMapWriter};
pub use ranges::{changed_ranges, sha256_bytes, sha256_file};
pub use reader::{
    query, read_entries, verify_chain, verify_drift, Drift, DriftKind, Filter, Finding,
    FindingKind, VerifyReport,
};
pub use writer::{BeforeSync, Ledger, LedgerError, LedgerOptions, OpenReport};

/// Where a workspace keeps its ledger unless `--ledger` says otherwise.
pub const DEFAULT_LEDGER: &str = ".orchestration/agent_trace.jsonl";
/// Where the intent map is regenerated.
pub const DEFAULT_INTENT_MAP: &str = ".orchestration/intent_map.md";

/// The `ACK` entries that record `paths` (workspace-relative) as they are on disk now:
/// each file's hash and size, or its deletion. `uid` is who acknowledged them.
pub fn ack_drafts(
    workspace: &std::path::Path,
    paths: &[String],
    note: Option<&str>,
    uid: u32,
) -> Result<Vec<Draft>, String> {
    let mut out = Vec::new();
    for p in paths {
        let rel = std::path::PathBuf::from(p);
        if rel.as_os_str().is_empty()
            || !rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!("{p:?} is not a workspace-relative path"));
        }
        let full = workspace.join(&rel);
        let (hash, size, deleted) = match std::fs::symlink_metadata(&full) {
            Ok(m) if m.is_file() => {
                let (h, n) = sha256_file(&full).map_err(|e| format!("{p}: {e}"))?;
                (Some(h), Some(n), false)
            }
            Ok(_) => return Err(format!("{p} is not a regular file")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None, true),
            Err(e) => return Err(format!("{p}: {e}")),
        };
        out.push(Draft {
            agent: Some(Agent {
                name: "operator".into(),
                identity: "operator".into(),
                pid: 0,
                uid,
                process: "intentfs".into(),
            }),
            mutation_type: Some(MutationType::Ack),
            path: Some(rel),
            content_hash: hash,
            size,
            detail: Some(serde_json::json!({ "note": note, "deleted": deleted })),
            ..Default::default()
        });
    }
    Ok(out)
}

/// The default ledger path of a workspace.
pub fn default_ledger_path(workspace: &std::path::Path) -> std::path::PathBuf {
    workspace.join(DEFAULT_LEDGER)
}
