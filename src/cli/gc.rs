//! `intentfs gc`: apply retention to the content store. Argument parsing and printing
//! only; the decisions are [`crate::store::gc`]'s.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context};

use crate::policy::versions::{human_size, parse_duration, parse_size};
use crate::store::gc::{gc, Report, Retention, Why, GC_LOG};
use crate::store::Store;

/// Retention when neither the command line nor the policy says (`versions.keep`).
const DEFAULT_KEEP: &str = "30d";

/// `intentfs gc [WORKSPACE] [--keep DURATION] [--max-size SIZE] [--dry-run] [--json]`
#[derive(Debug, clap::Args)]
#[command(after_long_help = "EXAMPLES:
  intentfs gc ./project                     # keep what the last 30 days of entries name
  intentfs gc --keep 7d --dry-run ./project # what a week's retention would remove
  intentfs gc --max-size 2GiB ./project     # oldest versions first, down to 2 GiB
  intentfs gc --keep 30d --max-size 10GiB --json ./project

An object (one version of a file's content) is as old as the newest ledger entry naming
it. gc never removes one a recent-enough entry names, nor one written or reused in the
last 10 minutes; --max-size removes the oldest of the rest until the store fits. Safe
while the workspace is mounted. What each run removed is appended to gc.jsonl in the
store: `intentfs diff` and `restore` say so when a version is gone.

Defaults come from the policy's `versions:` section (`keep:`, `max_size:`), else --keep 30d.")]
pub struct GcArgs {
    /// The workspace (default: the one the current directory is in).
    pub workspace: Option<PathBuf>,
    /// Keep every version an entry this recent names (`30d`, `12h`, `2weeks`).
    #[arg(long, value_name = "DURATION")]
    pub keep: Option<String>,
    /// Remove the oldest versions until the store takes at most this much (`10GiB`,
    /// `500MB`); never one `--keep` protects.
    #[arg(long, value_name = "SIZE")]
    pub max_size: Option<String>,
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The content store (default: the one the workspace was last mounted with,
    /// else WORKSPACE/.orchestration/objects).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// The policy whose `versions:` section gives the defaults (default:
    /// WORKSPACE/.orchestration/active_intents.yaml, when present).
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

pub fn run(a: GcArgs) -> anyhow::Result<ExitCode> {
    let (ws, ledger, _) = super::ledger::resolve(a.workspace.clone(), a.ledger.clone())?;
    let versions = match &a.policy {
        Some(p) => Some(
            crate::policy::Policy::load(p)
                .map_err(|e| anyhow!("{e}"))?
                .versions()
                .clone(),
        ),
        None => {
            let p = ws.join(".orchestration/active_intents.yaml");
            // The default policy is optional here: gc needs only the ledger and the store.
            crate::policy::Policy::load(&p)
                .ok()
                .map(|p| p.versions().clone())
        }
    };
    let keep = match (&a.keep, versions.as_ref().and_then(|v| v.keep)) {
        (Some(k), _) => Some(
            parse_duration(k)
                .map_err(|e| anyhow!("--keep: {e}\nhint: a duration such as 30d, 12h or 2weeks"))?,
        ),
        (None, Some(k)) => Some(k),
        // A size budget alone protects nothing by age (but the last 10 minutes).
        (None, None) if a.max_size.is_some() => None,
        (None, None) => Some(parse_duration(DEFAULT_KEEP).map_err(|e| anyhow!(e))?),
    };
    let max_size = match (&a.max_size, versions.as_ref().and_then(|v| v.max_size)) {
        (Some(s), _) => Some(
            parse_size(s)
                .map_err(|e| anyhow!("--max-size: {e}\nhint: a size such as 10GiB or 500MB"))?,
        ),
        (None, m) => m,
    };
    let dir = a
        .store
        .clone()
        .unwrap_or_else(|| crate::store::dir_of(&ws, &ledger));
    let Some(store) = Store::open_existing(&dir)? else {
        anyhow::bail!(
            "no content store at {:?}: nothing to collect\nhint: the workspace keeps versions once it is mounted; give --store DIR if it was mounted with one",
            dir.display().to_string()
        );
    };
    let retention = Retention { keep, max_size };
    let report = gc(
        &store,
        &ledger,
        &retention,
        std::time::SystemTime::now(),
        a.dry_run,
    )
    .with_context(|| format!("collecting {}", dir.display()))?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", render(&report, &dir.join(GC_LOG)))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The report for people.
fn render(r: &Report, log: &std::path::Path) -> String {
    let mut s = String::new();
    let verb = if r.dry_run { "would remove" } else { "removed" };
    let why = |w: Why| r.removed.iter().filter(|x| x.why == w).count();
    let rule = match (r.retention.keep, r.retention.max_size) {
        (Some(k), Some(m)) => format!(
            "keep {}, at most {}",
            humantime::format_duration(k),
            human_size(m)
        ),
        (Some(k), None) => format!("keep {}", humantime::format_duration(k)),
        (None, Some(m)) => format!("at most {}", human_size(m)),
        (None, None) => "keep everything".into(),
    };
    let versions = |n: usize| if n == 1 { "version" } else { "versions" };
    s.push_str(&format!(
        "{verb} {} of {} {} ({} of {}; {} expired, {} over the budget) [{rule}]\n",
        r.removed.len(),
        r.objects_before,
        versions(r.objects_before),
        human_size(r.freed_bytes),
        human_size(r.bytes_before),
        why(Why::Expired),
        why(Why::OverBudget),
    ));
    s.push_str(&format!(
        "kept {} {} ({})\n",
        r.objects_after,
        versions(r.objects_after),
        human_size(r.bytes_after)
    ));
    if r.over_budget_bytes > 0 {
        s.push_str(&format!(
            "still {} over the size budget: what is left is younger than --keep (or written in the last 10 minutes)\n",
            human_size(r.over_budget_bytes)
        ));
    }
    if r.reprieved > 0 {
        s.push_str(&format!(
            "{} {} reused by the mount while gc ran stay\n",
            r.reprieved,
            versions(r.reprieved)
        ));
    }
    if r.packs_unpacked > 0 {
        s.push_str(&format!(
            "unpacked {} sealed {} into loose objects first\n",
            r.packs_unpacked,
            if r.packs_unpacked == 1 {
                "pack"
            } else {
                "packs"
            }
        ));
    }
    if !r.dry_run && !r.removed.is_empty() {
        s.push_str(&format!("on record in {}\n", log.display()));
    }
    s
}
