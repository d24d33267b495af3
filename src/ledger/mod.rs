//! The append-only, hash-chained audit ledger: every completed mutation, denial and
//! approval as one JSON line of `.orchestration/agent_trace.jsonl`.
//!
//! - [`entry`]: the line schema (what a [`Draft`] becomes).
//! - [`writer`]: the writer thread (bounded queue, group commit, chain, torn-tail repair).
//! - [`reader`]: parse, verify the chain, drift against the workspace, queries.
//! - [`blame`]: per-line attribution from the recorded line ranges.
//! - [`vcs`]: the git revision, read from `.git` without running git.
//! - [`ranges`]: content hashes and changed line ranges.
//! - [`map`]: the intent map (`.orchestration/intent_map.md`).
//! - [`agent_trace`]: export as Agent Trace records.
//!
//! No FUSE knowledge here: the filesystem hands over [`Draft`]s and asks [`Ledger::health`].

pub mod agent_trace;
pub mod blame;
pub mod entry;
pub mod map;
pub mod ranges;
pub mod reader;
pub mod vcs;
pub mod writer;

#[cfg(test)]
mod tests;

pub use entry::{Agent, Draft, Entry, LineRange, MutationClass, MutationType, Vcs};
pub use map::{write_intent_map, IntentMapThread, IntentMapWriter};
pub use ranges::{changed_ranges, sha256_bytes, sha256_file};
pub use reader::{
    query, read_entries, verify_chain, verify_drift, Drift, DriftKind, Filter, Finding,
    FindingKind, VerifyReport,
};
pub use writer::{Ledger, LedgerError, LedgerOptions, OpenReport};

/// Where a workspace keeps its ledger unless `--ledger` says otherwise.
pub const DEFAULT_LEDGER: &str = ".orchestration/agent_trace.jsonl";
/// Where the intent map is regenerated.
pub const DEFAULT_INTENT_MAP: &str = ".orchestration/intent_map.md";

/// The default ledger path of a workspace.
pub fn default_ledger_path(workspace: &std::path::Path) -> std::path::PathBuf {
    workspace.join(DEFAULT_LEDGER)
}
