//! `intentfs notes`: the ledger's attribution of each commit as a git note (under
//! `refs/notes/intentfs` unless `--ref` says otherwise). Git is run here, in the backing
//! workspace, as the person running the command; the attribution is
//! [`crate::ledger::commits`].

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{anyhow, bail, Context};

use crate::ledger::commits::{attribute_commits, note_text, record, CommitInfo, FileDiff};
use crate::ledger::{changed_ranges, sha256_bytes};

/// `intentfs notes [--ref REF] [--ledger FILE] [--json] [REV-RANGE] [WORKSPACE]`
#[derive(Debug, clap::Args)]
#[command(after_long_help = "EXAMPLES:
  intentfs notes ./project                  # every commit since the ledger began
  intentfs notes HEAD~3..HEAD ./project     # these commits only
  git -C ./project notes --ref intentfs show HEAD
  git -C ./project log --notes=intentfs     # the attribution under each commit

Each note starts with a line per intent and agent (the files and line ranges of the commit
they wrote), then a blank line, then the commit's Agent Trace record as one line of JSON
(`git notes --ref intentfs show HEAD | tail -n1`). Commits none of whose changed lines come
from the ledger get no note. Re-running rewrites only notes whose content changed.
Share notes with `git push origin refs/notes/intentfs`.")]
pub struct NotesArgs {
    /// `[REV-RANGE] [WORKSPACE]`: the commits, as `git log` takes them (`main..HEAD`,
    /// `HEAD~3..`; one commit means it and its ancestors) [default: the commits of HEAD made
    /// since the ledger's first entry], and the workspace [default: the one the current
    /// directory is in].
    #[arg(num_args = 0..=2, value_name = "ARG")]
    pub args: Vec<String>,
    /// The notes ref (`intentfs` stands for `refs/notes/intentfs`).
    #[arg(
        long = "ref",
        value_name = "REF",
        default_value = "refs/notes/intentfs"
    )]
    pub notes_ref: String,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Print what would be written, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print a JSON report: per commit, the note written (or why not) and its record.
    #[arg(long)]
    pub json: bool,
}

/// `git -C WS ARGS`: stdout, or an error quoting git's stderr.
fn git(ws: &Path, args: &[&str], input: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(ws)
        // Reading and writing notes runs no hook; nothing in the repository's config may run
        // a program for us either.
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(["-c", "core.pager=cat", "-c", "core.quotepath=off"])
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| {
        anyhow!("cannot run git: {e}\nhint: install git (intentfs notes writes notes with it)")
    })?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(data).context("writing to git")?;
    }
    let out = child.wait_with_output().context("waiting for git")?;
    if !out.status.success() {
        bail!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn git_text(ws: &Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(String::from_utf8_lossy(&git(ws, args, None)?).into_owned())
}

/// `refs/notes/X` for `X` or `refs/notes/X`; anything else under `refs/` is refused.
fn notes_ref(r: &str) -> anyhow::Result<String> {
    let r = r.trim();
    if r.starts_with("refs/notes/") && r.len() > "refs/notes/".len() {
        return Ok(r.to_owned());
    }
    if r.is_empty() || r.starts_with("refs/") || r.starts_with('-') {
        bail!("--ref {r:?}: notes live under refs/notes/\nhint: --ref refs/notes/intentfs (or just --ref intentfs)");
    }
    Ok(format!("refs/notes/{r}"))
}

/// The regular files `rev` added or modified against `parent` (the empty tree for a root
/// commit): path, old blob, new blob.
fn changed_files(
    ws: &Path,
    parent: Option<&str>,
    rev: &str,
) -> anyhow::Result<Vec<(String, Option<String>, String)>> {
    let mut args = vec!["diff-tree", "-r", "-z", "--no-renames", "--raw"];
    match parent {
        Some(p) => args.push(p),
        None => args.push("--root"),
    }
    args.push(rev);
    let out = git(ws, &args, None)?;
    let mut fields = out.split(|&b| b == 0).filter(|f| !f.is_empty());
    let mut files = Vec::new();
    // `:old_mode new_mode old_oid new_oid status` NUL `path` NUL
    while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
        let meta = String::from_utf8_lossy(meta);
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [_, new_mode, old_oid, new_oid, status] = parts[..] else {
            continue;
        };
        if !matches!(new_mode, "100644" | "100755") || status.starts_with('D') {
            continue;
        }
        let old = (!old_oid.bytes().all(|b| b == b'0')).then(|| old_oid.to_owned());
        files.push((
            String::from_utf8_lossy(path).into_owned(),
            old,
            new_oid.to_owned(),
        ));
    }
    Ok(files)
}

/// Runs `intentfs notes`.
pub fn run(a: NotesArgs) -> anyhow::Result<ExitCode> {
    let nref = notes_ref(&a.notes_ref)?;
    // The last argument is the workspace when it is a directory.
    let mut args = a.args.clone();
    let ws_arg = match args.last() {
        Some(l) if Path::new(l).is_dir() => args.pop().map(PathBuf::from),
        _ => None,
    };
    let range = args.pop();
    if let Some(r) = &range {
        if r.starts_with('-') {
            bail!("{r:?} is not a revision range\nhint: e.g. HEAD, main..HEAD, HEAD~5..");
        }
    }
    let (ws, ledger, _) = super::ledger::resolve(ws_arg, a.ledger.clone())?;
    let top = git_text(&ws, &["rev-parse", "--show-toplevel"]).map_err(|e| {
        anyhow!(
            "{} is not a git repository: {e}\nhint: git notes annotate commits; run it on a workspace that is a git repository",
            ws.display()
        )
    })?;
    let top = PathBuf::from(top.trim());
    let entries = super::ledger::read_ledger(&ledger)?;
    // Paths in the ledger are relative to the workspace; git's to the repository's top.
    let prefix = ws
        .canonicalize()
        .ok()
        .and_then(|w| {
            w.strip_prefix(top.canonicalize().ok()?)
                .ok()
                .map(Path::to_path_buf)
        })
        .filter(|p| !p.as_os_str().is_empty());
    // The commits: the range given, or HEAD's since the ledger's first entry (older ones
    // cannot carry a write it recorded).
    let mut log = vec![
        "log".to_owned(),
        "--reverse".to_owned(),
        "--format=%H%x1f%P%x1f%cI".to_owned(),
    ];
    match &range {
        Some(r) => log.push(r.clone()),
        None => {
            let first = entries
                .first()
                .and_then(|(_, e)| chrono::DateTime::parse_from_rfc3339(&e.timestamp).ok());
            match first {
                // In the form git's date parser surely reads, a minute early for clock
                // rounding (an older commit is only listed, never attributed).
                Some(t) => log.push(format!(
                    "--since={}",
                    (t - chrono::Duration::minutes(1)).format("%Y-%m-%d %H:%M:%S %z")
                )),
                None => bail!(
                    "the ledger {} has no entries: nothing to attribute",
                    ledger.display()
                ),
            }
            log.push("HEAD".to_owned());
        }
    }
    log.push("--".to_owned());
    let log_args: Vec<&str> = log.iter().map(String::as_str).collect();
    let listing = git_text(&top, &log_args)?;
    let mut commits = Vec::new();
    for line in listing.lines().filter(|l| !l.is_empty()) {
        let mut f = line.split('\x1f');
        let (Some(rev), Some(parents), Some(date)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let parent = parents
            .split(' ')
            .find(|p| !p.is_empty())
            .map(str::to_owned);
        let mut files = Vec::new();
        for (path, old, new) in changed_files(&top, parent.as_deref(), rev)? {
            // A file outside the workspace's directory is not in its ledger.
            let rel = match &prefix {
                Some(p) => match Path::new(&path).strip_prefix(p) {
                    Ok(r) => r.to_string_lossy().into_owned(),
                    Err(_) => continue,
                },
                None => path,
            };
            let new_bytes = git(&top, &["cat-file", "blob", &new], None)?;
            let old_bytes = match &old {
                Some(o) => git(&top, &["cat-file", "blob", o], None)?,
                None => Vec::new(),
            };
            // Binary or very large: no lines to attribute.
            let Some(changed) = changed_ranges(&old_bytes, &new_bytes) else {
                continue;
            };
            files.push(FileDiff {
                path: rel,
                hash: sha256_bytes(&new_bytes),
                changed,
            });
        }
        commits.push(CommitInfo {
            revision: rev.to_owned(),
            parent,
            timestamp: date.to_owned(),
            files,
        });
    }
    let attributions = attribute_commits(&entries, &commits);
    let mut report = Vec::new();
    let (mut written, mut unchanged) = (0, 0);
    for at in &attributions {
        if !at.attributed() {
            report.push(serde_json::json!({
                "commit": at.revision, "status": "skipped",
                "reason": "none of its changed lines comes from the ledger",
            }));
            continue;
        }
        let text = note_text(at);
        let existing = git(&top, &["notes", "--ref", &nref, "show", &at.revision], None)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let status = if existing.as_deref() == Some(text.as_str()) {
            unchanged += 1;
            "unchanged"
        } else if a.dry_run {
            "would write"
        } else {
            let mut args = vec!["notes", "--ref", &nref];
            // Without an identity of their own, notes are committed as intentfs.
            let ident = identity_args(&top);
            let ident_refs: Vec<&str> = ident.iter().map(String::as_str).collect();
            let mut full: Vec<&str> = ident_refs.clone();
            full.append(&mut args);
            full.extend(["add", "-f", "-F", "-", &at.revision]);
            git(&top, &full, Some(text.as_bytes()))?;
            written += 1;
            "written"
        };
        report.push(serde_json::json!({
            "commit": at.revision,
            "status": status,
            "note": text,
            "record": record(at),
            "contributions": at.contributions,
            "unattributed": at.unattributed,
        }));
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let v = serde_json::json!({
            "ref": nref,
            "repository": top.display().to_string(),
            "ledger": ledger.display().to_string(),
            "dry_run": a.dry_run,
            "commits": report,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        for r in &report {
            let rev = r["commit"].as_str().unwrap_or_default();
            let short = rev.get(..12).unwrap_or(rev);
            match r["status"].as_str() {
                Some("skipped") => writeln!(out, "{short}  skipped (nothing from the ledger)")?,
                Some(s) => {
                    writeln!(out, "{short}  {s}")?;
                    let note = r["note"].as_str().unwrap_or_default();
                    for l in note.lines().skip(1).take_while(|l| !l.is_empty()) {
                        writeln!(out, "    {l}")?;
                    }
                }
                None => {}
            }
        }
        writeln!(
            out,
            "{} commit(s): {written} note(s) written, {unchanged} unchanged, under {nref}",
            report.len()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `-c user.name=intentfs -c user.email=...` when git has no committer identity (no config,
/// no environment): a notes commit needs one.
fn identity_args(top: &Path) -> Vec<String> {
    if git(top, &["var", "GIT_COMMITTER_IDENT"], None).is_ok() {
        return Vec::new();
    }
    vec![
        "-c".into(),
        "user.name=intentfs".into(),
        "-c".into(),
        "user.email=intentfs@localhost".into(),
    ]
}
