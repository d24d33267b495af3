//! `intentfs ledger verify` and `intentfs ledger export --agent-trace | --otlp`: the audit
//! commands over a ledger file. Argument parsing and printing only; the work is in
//! [`crate::ledger`].

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::ledger::reader::{verify_chain, verify_drift, DriftKind};

/// `intentfs ledger ...`
#[derive(Debug, clap::Args)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

/// The ledger subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Check the hash chain and, given a workspace, every file's last recorded hash
    /// against the disk (drift: edits made outside the mount). Exits 1 on any finding.
    Verify(VerifyArgs),
    /// Export the ledger in another format (JSON lines on stdout).
    Export(ExportArgs),
    /// Acknowledge files changed outside the mount (a human's edit): record them as they
    /// are on disk now, so `ledger verify` stops reporting their drift. The acknowledgement
    /// is an `ACK` entry naming who made it.
    #[command(after_long_help = "EXAMPLES:
  intentfs ledger ack src/auth/session.ts --note 'hotfix by alice'
  intentfs ledger ack ./project docs/a.md docs/b.md

With the workspace mounted, the daemon records it (over the control socket, as the
mount's owner or root); otherwise the ledger is appended to directly.")]
    Ack(AckArgs),
}

/// `intentfs ledger ack [WORKSPACE] PATH... [--note TEXT]`
#[derive(Debug, clap::Args)]
pub struct AckArgs {
    /// `[WORKSPACE] PATH...`: files (workspace-relative, or paths inside the workspace or
    /// its mount); the workspace defaults to the one the current directory is in.
    #[arg(required = true, num_args = 1..)]
    pub paths: Vec<PathBuf>,
    /// Why (recorded in the entry).
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
}

/// `intentfs ledger verify [WORKSPACE] [--ledger FILE] [--json]`
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The workspace (default: the current directory, unless --ledger is given).
    pub workspace: Option<PathBuf>,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `intentfs ledger export (--agent-trace | --otlp [ENDPOINT]) [WORKSPACE] [--ledger FILE]`
#[derive(Debug, clap::Args)]
#[command(after_long_help = "EXAMPLES:
  intentfs ledger export --agent-trace ./project > trace.jsonl
  intentfs ledger export --otlp=http://localhost:4318 ./project
  OTEL_EXPORTER_OTLP_ENDPOINT=https://otel.example:4318 \\
    OTEL_EXPORTER_OTLP_HEADERS='authorization=Bearer xyz' intentfs ledger export --otlp --since 1d

--otlp sends one OpenTelemetry log record per entry over OTLP/HTTP (docs/telemetry.md):
--otlp=ENDPOINT is the collector's base URL (/v1/logs is added), like OTEL_EXPORTER_OTLP_ENDPOINT;
without it the OTEL_EXPORTER_OTLP_* variables decide (default http://localhost:4318).
Exits 1 when the collector did not take every record.")]
#[command(group(clap::ArgGroup::new("format").required(true).multiple(false)))]
pub struct ExportArgs {
    /// Agent Trace records on stdout, one JSON object per WRITE entry.
    #[arg(long = "agent-trace", group = "format")]
    pub agent_trace: bool,
    /// Send every entry as an OpenTelemetry log record over OTLP/HTTP, to ENDPOINT (a base
    /// URL: `--otlp=http://host:4318`) or where the OTEL_EXPORTER_OTLP_* variables say.
    #[arg(
        long,
        value_name = "ENDPOINT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "",
        group = "format"
    )]
    pub otlp: Option<String>,
    /// With --otlp: only entries at or after TIME (RFC 3339, or 30s, 10m, 2h, 3d, 1w ago).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// With --otlp: print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The workspace (default: the current directory).
    pub workspace: Option<PathBuf>,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
}

/// Resolves `[WORKSPACE] [--ledger FILE]` the same way for every audit command:
/// the workspace is the one given, else the current directory; the ledger is the
/// one given, else the workspace's default. Returns (workspace, ledger, whether the
/// workspace was given or implied rather than absent because only --ledger was).
pub fn resolve(
    workspace: Option<PathBuf>,
    ledger: Option<PathBuf>,
) -> anyhow::Result<(PathBuf, PathBuf, bool)> {
    let explicit = workspace.is_some() || ledger.is_none();
    // A mountpoint (or a directory in a mount) stands for its workspace; with nothing
    // given, the workspace the current directory is in (in the mount or the workspace).
    let ws = match workspace {
        Some(w) => super::runtime::backing_path(&w),
        None => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            super::runtime::workspace_of(&cwd).unwrap_or(cwd)
        }
    };
    let ledger = ledger.unwrap_or_else(|| crate::ledger::default_ledger_path(&ws));
    settle_mounts_of(&ws);
    if !ledger.is_file() {
        anyhow::bail!(
            "no ledger at {:?} (give the workspace, or --ledger FILE)",
            ledger.display().to_string()
        );
    }
    Ok((ws, ledger, explicit))
}

/// Every mount of `ws` records the closes it still owes (`--record async`) before the
/// ledger is read: opening a mount's `.intentfs/status` waits for them. A mount that does
/// not answer within 5 s (a stopped daemon) is passed over: its ledger is read as it is.
fn settle_mounts_of(ws: &Path) {
    let ws = ws.canonicalize().unwrap_or_else(|_| ws.to_path_buf());
    for (mp, src) in super::runtime::mounts_with_sources() {
        if src != ws {
            continue;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("settle".into())
            .spawn(move || {
                let _ = std::fs::File::open(mp.join(".intentfs/status"));
                let _ = tx.send(());
            });
        if spawned.is_ok() {
            let _ = rx.recv_timeout(std::time::Duration::from_secs(5));
        }
    }
}

/// Every entry of the ledger at `ledger` (line number, entry), or an error naming the file.
pub fn read_ledger(ledger: &Path) -> anyhow::Result<Vec<(u64, crate::ledger::Entry)>> {
    crate::ledger::read_entries(ledger)
        .with_context(|| format!("cannot read {:?}", ledger.display().to_string()))
}

/// Runs `intentfs ledger ...`.
pub fn run(args: LedgerArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        LedgerCommand::Verify(a) => verify(a),
        LedgerCommand::Export(a) => export(a),
        LedgerCommand::Ack(a) => ack(a),
    }
}

fn ack(a: AckArgs) -> anyhow::Result<ExitCode> {
    // A first argument that is a directory holding a ledger is the workspace.
    let (ws_arg, files) = match a.paths.split_first() {
        Some((first, rest))
            if !rest.is_empty()
                && crate::ledger::default_ledger_path(&super::runtime::backing_path(first))
                    .is_file() =>
        {
            (Some(first.clone()), rest.to_vec())
        }
        _ => (None, a.paths.clone()),
    };
    let (ws, ledger, _) = resolve(ws_arg, None)?;
    let ws_c = ws.canonicalize().unwrap_or(ws.clone());
    let mut rels = Vec::new();
    for f in &files {
        let mapped = super::runtime::backing_path(f);
        let rel = if f.is_relative()
            && ws.join(f).symlink_metadata().is_ok()
            && !mapped.starts_with(&ws_c)
        {
            f.clone()
        } else {
            let parent = mapped.parent().and_then(|p| p.canonicalize().ok());
            let full = match (parent, mapped.file_name()) {
                (Some(p), Some(n)) => p.join(n),
                _ => mapped.clone(),
            };
            full.strip_prefix(&ws_c)
                .map(Path::to_path_buf)
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{:?} is not inside the workspace {:?}",
                        f.display().to_string(),
                        ws.display().to_string()
                    )
                })?
        };
        rels.push(rel.to_string_lossy().into_owned());
    }
    let req = crate::approval::AckRequest {
        paths: rels.clone(),
        note: a.note.clone(),
    };
    // The mount of this workspace, if any, records it (its daemon holds the ledger).
    let mounted = super::runtime::mounts_with_sources()
        .into_iter()
        .find(|(_, w)| w.canonicalize().ok().as_ref() == Some(&ws_c));
    let n = match mounted {
        Some((mp, _)) => {
            let sock = super::approvals::socket_for(&mp)?;
            super::approvals::talk(&sock, &crate::approval::socket::Request::Ack(req))?
                .acked
                .unwrap_or(0)
        }
        None => {
            let uid = nix::unistd::geteuid().as_raw();
            let drafts = crate::ledger::ack_drafts(&ws, &rels, a.note.as_deref(), uid)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let (l, _) =
                crate::ledger::Ledger::open(&ledger, crate::ledger::LedgerOptions::default())
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            let n = drafts.len();
            for d in drafts {
                l.record(d).map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            l.shutdown();
            n
        }
    };
    println!(
        "acknowledged {n} file(s) as they are now: {}",
        rels.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(a: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (ws, ledger, check_drift) = resolve(a.workspace, a.ledger)?;
    let report = verify_chain(&ledger)
        .with_context(|| format!("cannot read {:?}", ledger.display().to_string()))?;
    let drift = if check_drift {
        Some(
            verify_drift(&ledger, &ws)
                .with_context(|| format!("cannot check drift in {:?}", ws.display().to_string()))?,
        )
    } else {
        None
    };
    let failed = !report.intact() || drift.as_ref().is_some_and(|d| !d.is_empty());
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = serde_json::json!({
            "ledger": ledger.display().to_string(),
            "entries": report.entries,
            "chain_intact": report.intact(),
            "findings": report.findings,
            "drift": drift,
            "ok": !failed,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        print_human(
            &mut out,
            &ledger,
            &report,
            drift.as_deref(),
            check_drift.then_some(ws.as_path()),
        )?;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_human(
    out: &mut dyn Write,
    ledger: &Path,
    report: &crate::ledger::VerifyReport,
    drift: Option<&[crate::ledger::Drift]>,
    ws: Option<&Path>,
) -> std::io::Result<()> {
    writeln!(out, "ledger: {}", ledger.display())?;
    if report.intact() {
        writeln!(out, "chain: {} entries, intact", report.entries)?;
    } else {
        writeln!(
            out,
            "chain: {} entries, {} finding(s):",
            report.entries,
            report.findings.len()
        )?;
        for f in &report.findings {
            writeln!(out, "  {}", f.message)?;
        }
    }
    match (drift, ws) {
        (Some([]), Some(ws)) => writeln!(
            out,
            "drift: none (every recorded file in {} matches)",
            ws.display()
        )?,
        (Some(d), _) => {
            writeln!(
                out,
                "drift: {} file(s) differ from their last ledger entry:",
                d.len()
            )?;
            for x in d {
                if let Some(u) = &x.unfinished_write {
                    writeln!(
                        out,
                        "  unfinished {}  (written through the mount by {} ({}, intent {}): its write began at \
                         ledger line {} and never completed: the daemon stopped or the file is still open)",
                        super::visible(&x.path),
                        super::visible(&u.agent),
                        super::visible(&u.identity),
                        u.intent.as_deref().unwrap_or("none"),
                        u.line
                    )?;
                    continue;
                }
                match &x.kind {
                    DriftKind::Modified { recorded, actual } => writeln!(
                        out,
                        "  modified  {}  (changed outside the mount; ledger line {}: {recorded}, now {actual})",
                        super::visible(&x.path),
                        x.line
                    )?,
                    DriftKind::Missing { recorded } => writeln!(
                        out,
                        "  missing   {}  (ledger line {}: {recorded})",
                        super::visible(&x.path),
                        x.line
                    )?,
                }
            }
        }
        (None, _) => writeln!(
            out,
            "drift: not checked (give the workspace to compare files with the disk)"
        )?,
    }
    Ok(())
}

fn export(a: ExportArgs) -> anyhow::Result<ExitCode> {
    if let Some(endpoint) = &a.otlp {
        return export_otlp(&a, endpoint);
    }
    if a.since.is_some() || a.json {
        anyhow::bail!("--since and --json go with --otlp\nhint: intentfs ledger export --otlp --since 1d --json");
    }
    let (_, ledger, _) = resolve(a.workspace, a.ledger)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    crate::ledger::agent_trace::export(&ledger, &mut out)
        .with_context(|| format!("cannot export {:?}", ledger.display().to_string()))?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `ledger export --otlp`: every entry (since `--since`) to the collector, and a report.
fn export_otlp(a: &ExportArgs, endpoint: &str) -> anyhow::Result<ExitCode> {
    let (ws, ledger, explicit) = resolve(a.workspace.clone(), a.ledger.clone())?;
    let since = a
        .since
        .as_deref()
        .map(|s| super::time::parse_time(s, chrono::Utc::now()))
        .transpose()?;
    let endpoint = (!endpoint.trim().is_empty()).then_some(endpoint);
    let cfg = crate::telemetry::Config::from_env(endpoint)?;
    let ws = explicit.then_some(ws.as_path());
    let r = crate::telemetry::export_file(&cfg, &ledger, ws, since)?;
    let ok = r.failed == 0 && r.exported == r.entries;
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["ledger"] = serde_json::json!(ledger.display().to_string());
        v["ok"] = serde_json::json!(ok);
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            out,
            "{} of {} entries exported to {} ({})",
            r.exported, r.entries, r.endpoint, r.protocol
        )?;
        if let Some(e) = &r.last_error {
            writeln!(
                out,
                "{} not taken: {e}\nhint: is a collector listening there? (OTLP/HTTP, usually port 4318)",
                r.failed
            )?;
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use crate::ledger::{
        sha256_file, Agent, Draft, Ledger, LedgerOptions, MutationType, DEFAULT_LEDGER,
    };

    fn draft(t: MutationType, path: &str) -> Draft {
        Draft {
            intent_id: Some("INT-1".into()),
            agent: Some(Agent {
                name: "claude".into(),
                identity: "s".into(),
                pid: 1,
                uid: 0,
                process: "sh".into(),
            }),
            mutation_type: Some(t),
            path: Some(PathBuf::from(path)),
            ..Draft::default()
        }
    }

    fn open(p: &Path) -> (Ledger, crate::ledger::OpenReport) {
        Ledger::open(p, LedgerOptions::default()).unwrap()
    }

    #[test]
    fn cli_definitions_are_valid() {
        use clap::{CommandFactory, Parser};
        #[derive(Parser)]
        enum Cli {
            Ledger(super::LedgerArgs),
            Log(crate::cli::log::LogArgs),
            Blame(crate::cli::blame::BlameArgs),
        }
        Cli::command().debug_assert();
        let Cli::Blame(b) =
            Cli::try_parse_from(["x", "blame", "ws", "src/a.rs", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            b.paths,
            vec![PathBuf::from("ws"), PathBuf::from("src/a.rs")]
        );
        let Cli::Blame(b) = Cli::try_parse_from(["x", "blame", "src/a.rs"]).unwrap() else {
            panic!()
        };
        assert_eq!(b.paths, vec![PathBuf::from("src/a.rs")]);
        assert!(Cli::try_parse_from(["x", "blame"]).is_err());
        assert!(
            Cli::try_parse_from(["x", "ledger", "export", "ws"]).is_err(),
            "a format is required"
        );
        assert!(
            Cli::try_parse_from(["x", "ledger", "export", "--agent-trace", "--otlp", "ws"])
                .is_err(),
            "one format"
        );
        let Cli::Ledger(l) =
            Cli::try_parse_from(["x", "ledger", "export", "--otlp", "--since", "1h", "ws"])
                .unwrap()
        else {
            panic!()
        };
        let super::LedgerCommand::Export(e) = l.command else {
            panic!()
        };
        assert_eq!(e.otlp.as_deref(), Some(""));
        assert_eq!(e.workspace, Some(PathBuf::from("ws")));
        assert!(Cli::try_parse_from(["x", "ledger", "export", "--agent-trace", "ws"]).is_ok());
        let Cli::Log(a) = Cli::try_parse_from([
            "x", "log", "--type", "write", "--since", "2h", "--path", "src/**",
        ])
        .unwrap() else {
            panic!()
        };
        let f = crate::cli::log::filter_of(&a, chrono::Utc::now()).unwrap();
        assert_eq!(f.mutation_type, Some(MutationType::Write));
        assert!(f.path.unwrap().is_match("src/a/b.rs"));
    }

    #[test]
    fn cli_verify_exit_code_and_log_table() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().to_path_buf();
        let lp = ws.join(DEFAULT_LEDGER);
        let (l, _) = open(&lp);
        std::fs::write(ws.join("a.txt"), "a\n").unwrap();
        let mut d = draft(MutationType::Write, "a.txt");
        d.content_hash = Some(sha256_file(&ws.join("a.txt")).unwrap().0);
        l.record(d).unwrap();
        let mut d = draft(MutationType::Denial, "secret.env");
        d.outcome = crate::ledger::Outcome::Denied;
        d.code = Some(crate::ledger::Code::ScopeViolation);
        l.record(d).unwrap();
        l.shutdown();
        let verify = |ws: &Path| {
            let args = super::LedgerArgs {
                command: super::LedgerCommand::Verify(super::VerifyArgs {
                    workspace: Some(ws.to_path_buf()),
                    ledger: None,
                    json: true,
                }),
            };
            format!("{:?}", super::run(args).unwrap())
        };
        assert_eq!(
            verify(&ws),
            format!("{:?}", std::process::ExitCode::SUCCESS)
        );
        std::fs::write(ws.join("a.txt"), "b\n").unwrap();
        assert_eq!(
            verify(&ws),
            format!("{:?}", std::process::ExitCode::from(1)),
            "drift fails verify"
        );

        let entries = crate::ledger::read_entries(&lp).unwrap();
        let table = crate::cli::log::table(&entries);
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 3);
        // Columns aligned: PATH starts at the same offset in every row.
        let col = rows[0].find("PATH").unwrap();
        assert_eq!(&rows[1][col..col + 5], "a.txt");
        assert_eq!(&rows[2][col..col + 10], "secret.env");
        assert!(rows[1].starts_with("#1 ") && rows[2].starts_with("#2 "));
        assert!(rows[2].ends_with("denied (SCOPE_VIOLATION)"));
    }
}
