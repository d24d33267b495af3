//! `intentfs diff`: what a change did, as unified diffs of the versions the content store
//! kept: one entry, one path over a time range, or everything an agent or intent changed.
//! Printing only; the comparisons are [`crate::versions::diff`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use chrono::Utc;

use crate::ledger::reader::Filter;
use crate::versions::diff::{of_entry, of_path, of_selection, render, stat};

/// `intentfs diff [WORKSPACE] [ENTRY] [--path PATH] [--agent NAME] [--intent ID] ...`
#[derive(Debug, clap::Args)]
#[command(after_help = "EXAMPLES:
  intentfs diff '#42'                      # what entry #42 changed (`intentfs log` shows #)
  intentfs diff 3f2a9c1e                   # the same by (a prefix of) its id
  intentfs diff --path src/lib.rs --since 1h
  intentfs diff --agent claude --stat      # everything claude changed, per file
  intentfs diff ./ws --intent INT-002 --json

A version the store did not keep (over the size cap, excluded, versions off, removed by gc)
is named with the reason its entry recorded, instead of a diff.")]
pub struct DiffArgs {
    /// `[WORKSPACE] [ENTRY]`: the entry is a ledger line (`#42`), an id or a unique id
    /// prefix; the workspace defaults to the current directory's.
    #[arg(value_name = "[WORKSPACE] [ENTRY]", num_args = 0..=2)]
    pub args: Vec<String>,
    /// The diff of this file (workspace-relative, or a path in the workspace or its mount).
    #[arg(long, value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Everything this agent changed (name or identity).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Everything changed under this intent.
    #[arg(long, value_name = "ID")]
    pub intent: Option<String>,
    /// Only changes at or after TIME: RFC 3339 or relative (30s, 10m, 2h, 3d).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only changes at or before TIME.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Lines added and removed per file instead of the diffs.
    #[arg(long)]
    pub stat: bool,
    /// Print the diffs as JSON (hashes, entries, counts, the unified text).
    #[arg(long)]
    pub json: bool,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// The content store (default: the one the workspace was last mounted with).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// Runs `intentfs diff`.
pub fn run(a: DiffArgs) -> anyhow::Result<ExitCode> {
    // One positional is the workspace when it is a directory, else the entry.
    let (ws, entry) = match a.args.as_slice() {
        [] => (None, None),
        [x] if PathBuf::from(x).is_dir() => (Some(PathBuf::from(x)), None),
        [x] => (None, Some(x.clone())),
        [w, e] => (Some(PathBuf::from(w)), Some(e.clone())),
        _ => anyhow::bail!("give [WORKSPACE] [ENTRY]"),
    };
    let (ws, ledger, _) = super::ledger::resolve(ws, a.ledger.clone())?;
    let store = super::restore::open_store(&ws, &ledger, a.store.as_deref())?;
    let entries = super::ledger::read_ledger(&ledger)?;
    let now = Utc::now();
    let since = a
        .since
        .as_deref()
        .map(|s| super::log::parse_time(s, now))
        .transpose()?;
    let until = a
        .until
        .as_deref()
        .map(|s| super::log::parse_time(s, now))
        .transpose()?;
    let diffs = match (&entry, &a.path) {
        (Some(_), Some(_)) => anyhow::bail!("give an ENTRY or --path, not both"),
        (Some(e), None) => {
            of_entry(&entries, e, store.as_ref()).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        (None, Some(p)) => {
            let rel = super::restore::rel_path(&ws, p)?;
            of_path(&entries, &rel, since, until, store.as_ref())
                .map_err(|e| anyhow::anyhow!("{e}"))?
        }
        (None, None) => {
            if a.agent.is_none() && a.intent.is_none() && since.is_none() {
                anyhow::bail!(
                    "diff what? give an ENTRY (#N or an id, as `intentfs log` shows), --path PATH, --agent NAME, --intent ID or --since TIME"
                );
            }
            of_selection(
                &entries,
                &Filter {
                    agent: a.agent.clone(),
                    intent: a.intent.clone(),
                    since,
                    until,
                    ..Default::default()
                },
                store.as_ref(),
            )
        }
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &diffs)?;
        writeln!(out)?;
    } else if diffs.is_empty() {
        writeln!(out, "no content changed")?;
    } else if a.stat {
        out.write_all(stat(&diffs).as_bytes())?;
    } else {
        out.write_all(render(&diffs).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}
