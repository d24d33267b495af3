//! `intentfs report`: the audit report of a workspace, as one self-contained HTML page
//! (`--html FILE`) or JSON (`--json`). Gathering and rendering are
//! [`crate::versions::report`]; the chain check and drift are `intentfs ledger verify`'s.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::ledger::{verify_chain, verify_drift};
use crate::versions::report::{build, html, Verification};

/// `intentfs report [--html FILE | --json] [WORKSPACE]`
#[derive(Debug, clap::Args)]
#[command(after_help = "EXAMPLES:
  intentfs report --html audit.html ./ws   # open audit.html in any browser, offline
  intentfs report --json ./ws | jq '.refusals'
  intentfs report ./ws                     # a summary, and where to look next

The page has a timeline per identity and per intent, every file changed with its diff (from
the content store), refusals, approvals with who decided them, lessons, restores, and the
chain's verification. It loads nothing from anywhere: inline CSS and a few lines of inline
JavaScript (a filter box), so it can be mailed or archived as it is.")]
pub struct ReportArgs {
    /// The workspace (default: the current directory's).
    pub workspace: Option<PathBuf>,
    /// Write the HTML page to FILE (`-` for standard output).
    #[arg(long, value_name = "FILE", conflicts_with = "json")]
    pub html: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// The content store (default: the one the workspace was last mounted with).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// Runs `intentfs report`.
pub fn run(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let (ws, ledger, _) = super::ledger::resolve(a.workspace.clone(), a.ledger.clone())?;
    let store = super::restore::open_store(&ws, &ledger, a.store.as_deref())?;
    let entries = super::ledger::read_ledger(&ledger)?;
    let chain = verify_chain(&ledger)
        .with_context(|| format!("cannot verify {:?}", ledger.display().to_string()))?;
    let drift = verify_drift(&ledger, &ws)
        .with_context(|| format!("cannot check drift in {:?}", ws.display().to_string()))?;
    let report = build(
        &ws,
        &ledger,
        &entries,
        Verification {
            intact: chain.intact(),
            entries: chain.entries,
            findings: chain.findings,
            drift,
        },
        store.as_ref(),
    );
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    match &a.html {
        Some(f) if f.as_os_str() == "-" => out.write_all(html(&report).as_bytes())?,
        Some(f) => {
            std::fs::write(f, html(&report))
                .with_context(|| format!("cannot write {:?}", f.display().to_string()))?;
            writeln!(
                out,
                "wrote {} ({} entries, {} file(s) changed, chain {})",
                f.display(),
                report.verification.entries,
                report.files.len(),
                if report.verification.intact {
                    "intact"
                } else {
                    "BROKEN"
                }
            )?;
        }
        None => {
            writeln!(
                out,
                "{}: {} entries ({} to {}), chain {}, {} file(s) changed outside the mount\n\
                 {} identit(ies), {} intent(s), {} file(s) changed, {} refusal(s), {} approval decision(s), {} lesson(s), {} restore step(s)\n\
                 hint: `intentfs report --html FILE` writes the page; `--json` prints it all",
                ws.display(),
                report.verification.entries,
                report.first.as_deref().unwrap_or("-"),
                report.last.as_deref().unwrap_or("-"),
                if report.verification.intact { "intact" } else { "BROKEN" },
                report.verification.drift.len(),
                report.identities.len(),
                report.intents.len(),
                report.files.len(),
                report.refusals.len(),
                report.approvals.len(),
                report.lessons.len(),
                report.restores.len()
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
