//! Build output (`output:` globs of the policy: `target/`, `node_modules/`, `.venv/`,
//! `dist/`): governed like everything else, but ledgered as summaries, one `OUTPUT` entry
//! per identity, output directory and burst (counts per mutation type, bytes, first and
//! last time, a few example paths) instead of one entry per file, so that a build adds a
//! handful of entries to the audit trail, not hundreds.
//!
//! A burst ends when its directory has been quiet for [`IDLE`], or after [`MAX_AGE`] (a long
//! build yields an entry every half minute), and at unmount. Unlike other mutations, a
//! build output change is acknowledged before its summary is on disk.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::ledger::{Agent, Draft, Ledger, MutationType};

/// Quiet time that ends a burst.
pub const IDLE: Duration = Duration::from_secs(1);
/// Longest a burst runs before it is written.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// Example paths kept per burst.
const EXAMPLES: usize = 5;

struct Burst {
    root: PathBuf,
    rule: String,
    intent: Option<String>,
    agent: Agent,
    counts: BTreeMap<&'static str, u64>,
    bytes: u64,
    examples: Vec<String>,
    first: String,
    started: Instant,
    last: Instant,
}

/// The bursts under way, by (identity, output directory).
#[derive(Default)]
pub struct Bursts {
    map: Mutex<HashMap<(String, PathBuf), Burst>>,
}

impl Bursts {
    /// Count one mutation of `rel` (under output `rule`, whose directory is `root`).
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        identity: &str,
        intent: Option<String>,
        agent: Agent,
        mt: MutationType,
        rel: &Path,
        root: PathBuf,
        rule: &str,
        bytes: Option<u64>,
    ) {
        let now = Instant::now();
        let mut map = self.map.lock();
        let b = map
            .entry((identity.to_string(), root.clone()))
            .or_insert_with(|| Burst {
                root,
                rule: rule.to_string(),
                intent: intent.clone(),
                agent: agent.clone(),
                counts: BTreeMap::new(),
                bytes: 0,
                examples: Vec::new(),
                first: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                started: now,
                last: now,
            });
        *b.counts.entry(mt.as_str()).or_default() += 1;
        if mt == MutationType::Write {
            b.bytes += bytes.unwrap_or(0);
        }
        if b.examples.len() < EXAMPLES {
            b.examples.push(rel.to_string_lossy().into_owned());
        }
        b.intent = intent;
        b.agent = agent;
        b.last = now;
    }

    /// Write the summaries of the bursts that ended (all of them with `all`). Returns how
    /// many were written.
    pub fn flush(&self, ledger: &Ledger, all: bool) -> usize {
        let now = Instant::now();
        let done: Vec<Burst> = {
            let mut map = self.map.lock();
            let keys: Vec<_> = map
                .iter()
                .filter(|(_, b)| {
                    all || now.duration_since(b.last) >= IDLE
                        || now.duration_since(b.started) >= MAX_AGE
                })
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter().filter_map(|k| map.remove(&k)).collect()
        };
        let n = done.len();
        for b in done {
            let total: u64 = b.counts.values().sum();
            let draft = Draft {
                intent_id: b.intent,
                agent: Some(b.agent),
                mutation_type: Some(MutationType::Output),
                path: Some(b.root),
                size: Some(b.bytes),
                rule: Some(b.rule),
                detail: Some(serde_json::json!({
                    "mutations": total,
                    "counts": b.counts,
                    "bytes_written": b.bytes,
                    "first": b.first,
                    "last": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "examples": b.examples,
                })),
                ..Default::default()
            };
            if let Err(e) = ledger.record(draft) {
                tracing::error!("ledger: cannot record a build output summary: {e}");
            }
        }
        n
    }

    pub fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
    }
}
