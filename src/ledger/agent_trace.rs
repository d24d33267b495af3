//! Export of the ledger as Agent Trace records (the open format for attributing
//! AI-written code): one record per WRITE entry, with its changed line ranges.
//!
//! Only the specification's top-level keys are emitted (`version`, `id`, `timestamp`,
//! `vcs`, `tool`, `files`, `metadata`); intentfs's own fields go under
//! `metadata["dev.intentfs"]`. Pure: ledger entries in, JSON values out.

use std::io::{self, Write};
use std::path::Path;

use serde_json::{json, Map, Value};

use super::entry::{Entry, MutationType};
use super::reader::{outcome_failed, read_entries};

/// The Agent Trace specification version written.
pub const AGENT_TRACE_VERSION: &str = "0.1.0";

/// The reverse-domain key of intentfs's metadata.
pub const METADATA_KEY: &str = "dev.intentfs";

/// The Agent Trace record for one entry; None for entries that are not successful
/// WRITEs.
pub fn record_for(e: &Entry) -> Option<Value> {
    if e.mutation_type != MutationType::Write || outcome_failed(&e.outcome) {
        return None;
    }
    let path = e.path.as_deref()?;
    let ranges: Vec<Value> = e
        .ranges
        .iter()
        .flatten()
        .map(|r| json!({ "start_line": r.start_line, "end_line": r.end_line }))
        .collect();
    let mut rec = Map::new();
    rec.insert("version".into(), json!(AGENT_TRACE_VERSION));
    // The entry id is a UUID v4 already, and keeps exports stable across runs.
    rec.insert("id".into(), json!(e.id));
    rec.insert("timestamp".into(), json!(e.timestamp));
    if let Some(v) = &e.vcs {
        rec.insert(
            "vcs".into(),
            json!({ "type": v.kind, "revision": v.revision }),
        );
    }
    rec.insert(
        "tool".into(),
        json!({ "name": "intentfs", "version": env!("CARGO_PKG_VERSION") }),
    );
    rec.insert(
        "files".into(),
        json!([{
            "path": path,
            "conversations": [{ "contributor": { "type": "ai" }, "ranges": ranges }],
        }]),
    );
    let mut meta = json!({
        "intent_id": e.intent_id,
        "agent": e.agent,
        "mutation_type": e.mutation_type,
        "mutation_class": e.mutation_class,
        "entry_id": e.id,
    });
    if let (Some(h), Some(m)) = (&e.content_hash, meta.as_object_mut()) {
        m.insert("content_hash".into(), json!(h));
    }
    if let (Some(b), Some(m)) = (&e.path_b64, meta.as_object_mut()) {
        m.insert("path_b64".into(), json!(b));
    }
    rec.insert("metadata".into(), json!({ METADATA_KEY: meta }));
    Some(Value::Object(rec))
}

/// Writes the ledger as JSON lines of Agent Trace records; returns how many.
pub fn export(ledger_path: &Path, out: &mut dyn Write) -> io::Result<u64> {
    let mut n = 0;
    for (_, e) in read_entries(ledger_path)? {
        if let Some(rec) = record_for(&e) {
            serde_json::to_writer(&mut *out, &rec)?;
            out.write_all(b"\n")?;
            n += 1;
        }
    }
    Ok(n)
}
