//! `intentfs restore` and `intentfs rewind`: put recorded versions back. While the
//! workspace is mounted the daemon does it (over the control socket), so the mount's caches
//! see each change and the ledger it holds records it; unmounted, this process does the
//! same on the workspace and its ledger. `--dry-run` plans and checks without changing
//! anything. The planning and the checks are [`crate::versions`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;

use crate::approval::RestoreRequest;
use crate::ledger::Agent;
use crate::store::Store;
use crate::versions::plan::{apply, draft, Report};
use crate::versions::tree::{Disk, Sim};

/// `intentfs restore [WORKSPACE] PATH [--to ENTRY | --before TIME]`
#[derive(Debug, clap::Args)]
#[command(after_help = "EXAMPLES:
  intentfs restore src/lib.rs                 # the last version on record (a deleted file comes back)
  intentfs restore src/lib.rs --to '#42'      # the version entry #42 left (`intentfs log` shows #)
  intentfs restore ./ws src/lib.rs --before 10m
  intentfs restore src/lib.rs --dry-run --json

While the workspace is mounted, the daemon puts the version back (the mount sees it at once)
and records a WRITE by `operator` with detail.restore naming the entry. The version it
overwrites is kept in the content store first, so a restore can itself be undone.")]
pub struct RestoreArgs {
    /// `[WORKSPACE] PATH`: the file (workspace-relative, or a path in the workspace or its
    /// mount); the workspace defaults to the current directory's.
    #[arg(value_name = "[WORKSPACE] PATH", num_args = 1..=2, required = true)]
    pub paths: Vec<PathBuf>,
    /// The version this entry left (its id, a unique id prefix, or its line `#N` as
    /// `intentfs log` shows it); for a deletion, the version it deleted.
    #[arg(long, value_name = "ENTRY", conflicts_with = "before")]
    pub to: Option<String>,
    /// The version the file held just before TIME: RFC 3339 or relative (30s, 10m, 2h, 3d).
    #[arg(long, value_name = "TIME")]
    pub before: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

/// `intentfs rewind [WORKSPACE] --agent NAME | --intent ID | --since TIME`
#[derive(Debug, clap::Args)]
#[command(after_help = "EXAMPLES:
  intentfs rewind --agent claude --dry-run    # what would be undone, and what conflicts
  intentfs rewind --agent claude              # undo all of claude's changes, latest first
  intentfs rewind --intent INT-002 --since 1h
  intentfs rewind ./ws --since 2025-01-31T14:00:00Z --force

Each change is undone in reverse order: writes get their earlier content back, created files,
directories and symlinks are removed, deleted ones come back (with their modes, symlinks
with their targets), renames are renamed back, modes are reset. A path someone else changed
after the change being undone is not touched: it is listed as a conflict (skipped), as is
every earlier change there. --force overwrites it; the version overwritten is kept in the
content store. Every step is a ledger entry by `operator` with detail.restore naming the entry
it undoes.

EXIT STATUS: 0 when everything was undone, 1 when something was skipped, 2 on error.")]
pub struct RewindArgs {
    /// The workspace (default: the current directory's).
    pub workspace: Option<PathBuf>,
    /// Undo this agent's changes (its name, or identity like `run:123`).
    #[arg(long, value_name = "NAME", required_unless_present_any = ["intent", "since"])]
    pub agent: Option<String>,
    /// Undo the changes made under this intent.
    #[arg(long, value_name = "ID")]
    pub intent: Option<String>,
    /// Only changes at or after TIME (alone: everyone's): RFC 3339 or relative (10m, 2h).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Overwrite paths others changed since (the versions overwritten are kept).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub common: Common,
}

/// Options `restore` and `rewind` share.
#[derive(Debug, clap::Args)]
pub struct Common {
    /// Plan and check only: say what would be restored, removed and skipped.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the outcome as JSON (`restored`, `removed`, `skipped`).
    #[arg(long)]
    pub json: bool,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// The content store (default: the one the workspace was last mounted with).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// `path` as a workspace-relative path: as given when relative, else (a path in the
/// workspace or in its mount) stripped of the workspace. The file need not exist.
pub fn rel_path(ws: &Path, p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_relative() && !p.starts_with(".") && !p.starts_with("..") {
        // Relative to the current directory when that is inside the workspace or mount.
        let cwd = std::env::current_dir().unwrap_or_default();
        let cwd_b = super::runtime::backing_path(&cwd);
        let ws_c = ws.canonicalize().unwrap_or(ws.to_path_buf());
        if let Ok(sub) = cwd_b.strip_prefix(&ws_c) {
            if !sub.as_os_str().is_empty() {
                return Ok(sub.join(p));
            }
        }
        return Ok(p.to_path_buf());
    }
    let mapped = super::runtime::backing_path(p);
    let parent = mapped.parent().and_then(|x| x.canonicalize().ok());
    let full = match (parent, mapped.file_name()) {
        (Some(d), Some(n)) => d.join(n),
        _ => mapped.clone(),
    };
    let ws_c = ws.canonicalize().unwrap_or(ws.to_path_buf());
    full.strip_prefix(&ws_c)
        .map(Path::to_path_buf)
        .map_err(|_| {
            anyhow::anyhow!(
                "{:?} is not inside the workspace {:?}",
                p.display().to_string(),
                ws.display().to_string()
            )
        })
}

/// The store of a workspace (`--store`, else the one it was last mounted with, else the
/// default), if it exists.
pub fn open_store(ws: &Path, ledger: &Path, given: Option<&Path>) -> anyhow::Result<Option<Store>> {
    let dir = given
        .map(Path::to_path_buf)
        .unwrap_or_else(|| crate::store::dir_of(ws, ledger));
    Store::open_existing(&dir).with_context(|| {
        format!(
            "cannot open the content store {:?}",
            dir.display().to_string()
        )
    })
}

/// The mountpoint of `ws`, if it is mounted.
fn mount_of(ws: &Path) -> Option<PathBuf> {
    let ws_c = ws.canonicalize().ok()?;
    super::runtime::mounts_with_sources()
        .into_iter()
        .find(|(_, w)| w.canonicalize().ok().as_ref() == Some(&ws_c))
        .map(|(mp, _)| mp)
}

/// Runs a request: by the daemon when mounted, here otherwise; planned only for a dry run.
fn execute(
    ws: &Path,
    ledger: &Path,
    req: RestoreRequest,
    common: &Common,
) -> anyhow::Result<Report> {
    let store = open_store(ws, ledger, common.store.as_deref())?;
    // Planned here for a dry run, and for a run on an unmounted workspace (a mounted one
    // is planned by its daemon).
    let plan_here = |req: &RestoreRequest| -> anyhow::Result<_> {
        let entries = super::ledger::read_ledger(ledger)?;
        crate::versions::plan_request(&entries, req, store.as_ref())
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    if common.dry_run {
        let plan = plan_here(&req)?;
        let disk = Disk::open(ws).with_context(|| ws.display().to_string())?;
        let mut sim = Sim::new(&disk);
        let mut report = apply(&plan, &mut sim, store.as_ref(), req.force, &mut |_| Ok(()));
        report.dry_run = true;
        return Ok(report);
    }
    if let Some(mp) = mount_of(ws) {
        if common.store.is_some() {
            anyhow::bail!(
                "--store applies when the workspace is not mounted: the daemon of {} uses its own store",
                mp.display()
            );
        }
        let sock = super::approvals::socket_for(&mp)?;
        let r = super::approvals::talk(&sock, &crate::approval::socket::Request::Restore(req))?;
        let v = r
            .restored
            .ok_or_else(|| anyhow::anyhow!("the daemon answered without a report"))?;
        return serde_json::from_value(v).context("the daemon's report");
    }
    let plan = plan_here(&req)?;
    let (l, _) = crate::ledger::Ledger::open(ledger, crate::ledger::LedgerOptions::default())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut disk = Disk::open(ws).with_context(|| ws.display().to_string())?;
    let agent = Agent {
        name: "operator".into(),
        identity: "operator".into(),
        pid: std::process::id(),
        uid: nix::unistd::geteuid().as_raw(),
        process: "intentfs".into(),
    };
    let run = uuid::Uuid::new_v4().to_string();
    let report = apply(&plan, &mut disk, store.as_ref(), req.force, &mut |c| {
        l.record(draft(c, &agent, &req.command, &run))
            .map_err(|e| format!("the ledger cannot be written: {e}"))
    });
    l.shutdown();
    Ok(report)
}

/// The outcome for people: one line per step, then the counts.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let verb = |v: &str| {
        if r.dry_run {
            format!("would be {v}")
        } else {
            v.to_owned()
        }
    };
    for d in &r.restored {
        let how = match &d.step.action {
            crate::versions::plan::Action::Rename { to } => {
                format!("{} -> {}", d.step.path.display(), to.display())
            }
            crate::versions::plan::Action::Exchange { with } => {
                format!("{} <-> {}", d.step.path.display(), with.display())
            }
            _ => d.step.path.display().to_string(),
        };
        s.push_str(&format!(
            "{:<10} {how}  ({}{})\n",
            if r.dry_run { "restore" } else { "restored" },
            d.step.what,
            if d.forced {
                "; forced, the version overwritten is kept"
            } else {
                ""
            }
        ));
    }
    for d in &r.removed {
        s.push_str(&format!(
            "{:<10} {}  ({})\n",
            if r.dry_run { "remove" } else { "removed" },
            d.step.path.display(),
            d.step.what
        ));
    }
    for k in &r.skipped {
        s.push_str(&format!(
            "{:<10} {}: {}\n",
            if k.conflict { "conflict" } else { "skipped" },
            k.path,
            k.reason
        ));
    }
    let conflicts = r.skipped.iter().filter(|k| k.conflict).count();
    s.push_str(&format!(
        "{} {}, {} {}, {} skipped{}\n",
        r.restored.len(),
        verb("restored"),
        r.removed.len(),
        verb("removed"),
        r.skipped.len(),
        if conflicts > 0 {
            format!(" ({conflicts} conflict(s): changed by someone else since; --force overwrites)")
        } else {
            String::new()
        }
    ));
    s
}

fn print(r: &Report, json: bool) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, r)?;
        writeln!(out)?;
    } else {
        out.write_all(render(r).as_bytes())?;
    }
    Ok(if r.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn abs_time(s: &str) -> anyhow::Result<String> {
    Ok(super::log::parse_time(s, Utc::now())?.to_rfc3339())
}

/// Runs `intentfs restore`.
pub fn run_restore(a: RestoreArgs) -> anyhow::Result<ExitCode> {
    let (ws, path) = match a.paths.as_slice() {
        [p] => (None, p.clone()),
        [w, p] => (Some(w.clone()), p.clone()),
        _ => anyhow::bail!("give [WORKSPACE] PATH"),
    };
    let (ws, ledger, _) = super::ledger::resolve(ws, a.common.ledger.clone())?;
    let rel = rel_path(&ws, &path)?;
    let req = RestoreRequest {
        command: "restore".into(),
        path: Some(rel.to_string_lossy().into_owned()),
        to: a.to.clone(),
        before: a.before.as_deref().map(abs_time).transpose()?,
        ..Default::default()
    };
    let r = execute(&ws, &ledger, req, &a.common)?;
    print(&r, a.common.json)
}

/// Runs `intentfs rewind`.
pub fn run_rewind(a: RewindArgs) -> anyhow::Result<ExitCode> {
    let (ws, ledger, _) = super::ledger::resolve(a.workspace.clone(), a.common.ledger.clone())?;
    let req = RestoreRequest {
        command: "rewind".into(),
        agent: a.agent.clone(),
        intent: a.intent.clone(),
        since: a.since.as_deref().map(abs_time).transpose()?,
        force: a.force,
        ..Default::default()
    };
    let r = execute(&ws, &ledger, req, &a.common)?;
    print(&r, a.common.json)
}
