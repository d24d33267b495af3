//! `intentfs blame [WORKSPACE] PATH`: for each line of a file as it is now, which
//! intent and agent last changed it, or that it predates the ledger or was changed
//! outside the mount. Printing only; the replay is [`crate::ledger::blame`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::ledger::blame::{blame_with, BlameReport, Origin};

/// `intentfs blame [WORKSPACE] PATH [--ledger FILE] [--json]`
#[derive(Debug, clap::Args)]
pub struct BlameArgs {
    /// `[WORKSPACE] PATH`: the file (workspace-relative, or a path inside the
    /// workspace); the workspace defaults to the current directory.
    #[arg(value_name = "[WORKSPACE] PATH", num_args = 1..=2, required = true)]
    pub paths: Vec<PathBuf>,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Print the attribution as JSON.
    #[arg(long)]
    pub json: bool,
    /// The content store (default: the one the workspace was last mounted with).
    #[arg(long, value_name = "DIR")]
    pub store: Option<PathBuf>,
}

/// The path relative to the workspace: as given when it is relative and exists
/// there, else stripped of the workspace prefix (after canonicalizing both).
fn relative(ws: &Path, p: &Path) -> anyhow::Result<PathBuf> {
    // A path in the mount names the same file in the workspace.
    let mapped = super::runtime::backing_path(p);
    if mapped.starts_with(ws) && mapped.exists() {
        return Ok(mapped.strip_prefix(ws).unwrap_or(&mapped).to_path_buf());
    }
    if p.is_relative() && ws.join(p).exists() {
        return Ok(p.to_path_buf());
    }
    let full = p
        .canonicalize()
        .with_context(|| format!("no such file {:?}", p.display().to_string()))?;
    let ws_c = ws
        .canonicalize()
        .with_context(|| format!("no such workspace {:?}", ws.display().to_string()))?;
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

fn who(o: &Origin) -> String {
    match o {
        Origin::Ledger(c) => format!(
            "{} {}",
            c.intent_id.as_deref().unwrap_or("(no intent)"),
            c.agent.as_deref().unwrap_or("-")
        ),
        Origin::Unranged(c) => format!(
            "{} {} (?)",
            c.intent_id.as_deref().unwrap_or("(no intent)"),
            c.agent.as_deref().unwrap_or("-")
        ),
        Origin::PredatesLedger => "(predates the ledger)".to_owned(),
        Origin::ChangedOutside => "(unknown: changed outside the mount)".to_owned(),
    }
}

fn when(o: &Origin) -> &str {
    match o {
        Origin::Ledger(c) | Origin::Unranged(c) => c.timestamp.get(..10).unwrap_or(&c.timestamp),
        _ => "",
    }
}

/// Formats a blame for people: `LINE WHO DATE | text`.
pub fn render(r: &BlameReport) -> String {
    let whos: Vec<String> = r
        .lines
        .iter()
        .map(|l| super::visible(&who(&l.origin)))
        .collect();
    let w = whos.iter().map(|s| s.chars().count()).max().unwrap_or(0);
    let nw = r.lines.len().to_string().len();
    let mut s = String::new();
    for (l, who) in r.lines.iter().zip(&whos) {
        s.push_str(&format!(
            "{:>nw$} {:<w$} {:<10} | {}\n",
            l.line,
            who,
            when(&l.origin),
            l.text
        ));
    }
    // Why each unranged change has no line ranges, once per change.
    let mut said = Vec::new();
    for l in &r.lines {
        if let Origin::Unranged(c) = &l.origin {
            if said.contains(&c.entry_id) {
                continue;
            }
            said.push(c.entry_id.clone());
            let why = match c.mutation_type {
                crate::ledger::MutationType::Truncate => "a truncation records no lines",
                crate::ledger::MutationType::Create | crate::ledger::MutationType::Mknod => {
                    "a file created empty records no lines"
                }
                _ => "the file was binary or over 1 MiB then",
            };
            s.push_str(&format!(
                "(?): the {} of {} at {} recorded no line ranges ({why}); the line may predate it\n",
                c.mutation_type.as_str(),
                super::visible(c.agent.as_deref().unwrap_or("-")),
                c.timestamp
            ));
        }
    }
    s
}

/// Runs `intentfs blame`.
pub fn run(a: BlameArgs) -> anyhow::Result<ExitCode> {
    let (ws, path) = match a.paths.as_slice() {
        [p] => (None, p.clone()),
        [w, p] => (Some(w.clone()), p.clone()),
        _ => anyhow::bail!("give [WORKSPACE] PATH"),
    };
    let (ws, ledger, _) = super::ledger::resolve(ws, a.ledger)?;
    let rel = relative(&ws, &path)?;
    // The recorded versions: a file changed outside the mount is diffed against its last.
    let store = super::restore::open_store(&ws, &ledger, a.store.as_deref())?;
    let lookup = |h: &str| store.as_ref().and_then(|s| s.get(h).ok().flatten());
    let report = blame_with(&ledger, &ws, &rel, &lookup)
        .with_context(|| format!("cannot blame {:?}", rel.display().to_string()))?;
    if let Some(w) = &report.warning {
        eprintln!("warning: {w}");
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        out.write_all(render(&report).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::blame::{BlameLine, Change};
    use crate::ledger::MutationType;

    #[test]
    fn render_aligns_and_names_every_origin() {
        let c = Change {
            intent_id: Some("INT-A".into()),
            agent: Some("alice".into()),
            entry_id: "e1".into(),
            timestamp: "2025-01-31T12:00:00.000000Z".into(),
            mutation_type: MutationType::Write,
            content_hash: None,
        };
        let line = |n, origin| BlameLine {
            line: n,
            origin,
            text: format!("text {n}"),
        };
        let r = BlameReport {
            path: "a.rs".into(),
            current_hash: "sha256:x".into(),
            recorded_hash: None,
            warning: None,
            versions: vec![c.clone()],
            lines: vec![
                line(1, Origin::Ledger(c.clone())),
                line(2, Origin::PredatesLedger),
                line(3, Origin::Unranged(c)),
                line(4, Origin::ChangedOutside),
            ],
        };
        let out = render(&r);
        let rows: Vec<&str> = out.lines().collect();
        assert!(
            rows[0].starts_with("1 INT-A alice ") && rows[0].contains("2025-01-31 | text 1"),
            "{out}"
        );
        assert!(rows[1].contains("(predates the ledger)"));
        assert!(rows[2].contains("INT-A alice (?)"));
        assert!(rows[3].contains("(unknown: changed outside the mount)"));
        let bar = rows[0].find(" | ").unwrap();
        assert!(
            rows[..4].iter().all(|r| r.find(" | ") == Some(bar)),
            "aligned: {out}"
        );
        assert!(rows[4].starts_with("(?):"));
    }
}
