//! Versions: what the ledger and the content store say about each change, turned into
//! something a person can read or undo.
//!
//! - [`history`]: a timeline per path (content before and after each entry), entry lookup.
//! - [`diff`]: unified diffs of an entry, a path over time, an agent's or intent's work.
//! - [`plan`]: `restore` and `rewind` as steps that check what is there before acting.
//! - [`tree`]: where steps land: the workspace on disk (no symlink followed) or a dry run.
//! - [`report`]: the audit report (JSON, and a self-contained HTML page).
//!
//! Pure over the ledger, the store and the workspace: the daemon (`fs`) and the command
//! line (`cli`) both drive it. Nothing here knows FUSE.

pub mod diff;
pub mod history;
pub mod plan;
pub mod report;
pub mod tree;

use chrono::{DateTime, Utc};

use crate::approval::RestoreRequest;
use crate::ledger::entry::Entry;
use crate::ledger::reader::Filter;
use crate::store::Store;

/// Why the store has no `hash` though an entry named it and recorded no reason: a `gc` run
/// removed it (when, and why), or it was never kept.
pub fn missing_reason(store: Option<&Store>, hash: &str) -> String {
    let Some(s) = store else {
        return format!("version {hash}: this workspace has no content store");
    };
    match crate::store::gc::removal_of(s, hash) {
        Ok(Some((when, r))) => format!(
            "version {hash} was removed by `intentfs gc` at {when} ({})",
            match r.why {
                crate::store::gc::Why::Expired => "older than the retention",
                crate::store::gc::Why::OverBudget => "the store was over its size budget",
            }
        ),
        _ => format!(
            "version {hash} is not in the content store (recorded before versions were kept)"
        ),
    }
}

fn time(s: &str, what: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{what}: {s:?} is not an RFC 3339 time: {e}"))
}

/// The plan a request asks for: `restore` (one path, one version) or `rewind` (the work of
/// an agent, an intent, or everything since a time).
pub fn plan_request(
    entries: &[(u64, Entry)],
    req: &RestoreRequest,
    store: Option<&Store>,
) -> Result<plan::Plan, String> {
    match req.command.as_str() {
        "restore" => {
            let path = req
                .path
                .as_deref()
                .ok_or_else(|| "restore: no path given".to_string())?;
            let point = match (&req.to, &req.before) {
                (Some(_), Some(_)) => return Err("give --to or --before, not both".into()),
                (Some(e), None) => plan::Point::Entry(e.clone()),
                (None, Some(t)) => plan::Point::Before(time(t, "--before")?),
                (None, None) => plan::Point::Latest,
            };
            plan::restore(entries, std::path::Path::new(path), &point, store)
        }
        "rewind" => {
            if req.agent.is_none() && req.intent.is_none() && req.since.is_none() {
                return Err("rewind what? give --agent NAME, --intent ID or --since TIME".into());
            }
            let filter = Filter {
                intent: req.intent.clone(),
                agent: req.agent.clone(),
                since: req
                    .since
                    .as_deref()
                    .map(|s| time(s, "--since"))
                    .transpose()?,
                ..Default::default()
            };
            let plan = plan::rewind(entries, &filter, store);
            if plan.steps.is_empty() && plan.skipped.is_empty() {
                return Err(format!(
                    "the ledger records no change{}{}{}: nothing to rewind\nhint: `intentfs log` lists who changed what",
                    req.agent.as_deref().map(|a| format!(" by agent {a:?}")).unwrap_or_default(),
                    req.intent.as_deref().map(|i| format!(" under intent {i}")).unwrap_or_default(),
                    req.since.as_deref().map(|s| format!(" since {s}")).unwrap_or_default(),
                ));
            }
            Ok(plan)
        }
        other => Err(format!("unknown command {other:?} (restore or rewind)")),
    }
}
