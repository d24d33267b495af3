//! `intentfs hook`: Claude Code's hook protocol (also spoken by other agents): one JSON
//! object on stdin, an answer as JSON on stdout, exit 0. Started by the agent's client as
//! one of the agent's processes, so it asks the control files for the agent's identity.
//!
//! - `SessionStart`: the identity's `<intent_context>`, or the intents to choose from, as
//!   `additionalContext`.
//! - `PreToolUse` of a file-editing tool (Write, Edit, MultiEdit, NotebookEdit): the target
//!   checked against the identity's scope (`.intentfs/check`); a refusal denies the tool
//!   call with the reason and the remedy before it runs. (When a human would be asked, the
//!   tool runs and the filesystem asks.)
//! - `PreToolUse` of a shell tool (Bash): the identity's `last_error` is noted, so that
//! - `PostToolUse` (and `PostToolUseFailure`) can tell a refusal that command caused from
//!   an older one, and hand it to the model (code, path, remedy) as `additionalContext`.
//!
//! Payload shapes: docs/agents.md, recorded in tests/fixtures/hooks/.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::agent::Governed;

#[derive(clap::Args, Debug)]
#[command(after_long_help = "SETUP:
  intentfs init claude-code      # writes the hooks into .claude/settings.json

The agent's client runs `intentfs hook` at each event with the event as JSON on stdin:
  SessionStart                   answers the intent context (or the intents to choose from)
  PreToolUse Write|Edit|MultiEdit|NotebookEdit
                                 denies an edit intentfs would refuse, with reason and remedy
  PreToolUse Bash                notes the agent's last refusal (nothing answered)
  PostToolUse Bash, PostToolUseFailure
                                 adds the refusal the command caused (code, path, remedy)

Try it by hand from inside the mount:
  echo '{\"hook_event_name\":\"SessionStart\",\"session_id\":\"s\",\"cwd\":\"'$PWD'\",\"source\":\"startup\"}' | intentfs hook")]
pub struct HookArgs {}

/// The tools that edit one file, and where their input names it.
const EDIT_TOOLS: &[(&str, &str)] = &[
    ("Write", "file_path"),
    ("Edit", "file_path"),
    ("MultiEdit", "file_path"),
    ("NotebookEdit", "notebook_path"),
];

/// The shell tools, whose refusals only the filesystem sees.
const SHELL_TOOLS: &[&str] = &["Bash"];

/// The answer with `hookSpecificOutput` for `event`.
fn specific(event: &str, fields: Value) -> Value {
    let mut o = json!({ "hookEventName": event });
    if let (Some(o), Value::Object(f)) = (o.as_object_mut(), fields) {
        o.extend(f);
    }
    json!({ "hookSpecificOutput": o })
}

/// A refusal (`last_error` or a `check` answer) in one paragraph for the model.
fn describe(v: &Value) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut out = format!("intentfs refused: {}", s("code"));
    if !s("op").is_empty() || !s("path").is_empty() {
        out.push_str(&format!(
            " ({} {})",
            v["op"].as_str().or(v["operation"].as_str()).unwrap_or(""),
            s("path")
        ));
    }
    out.push_str(&format!(": {}.", s("message").trim_end_matches('.')));
    if !s("remedy").is_empty() {
        out.push_str(&format!(" Remedy: {}", s("remedy")));
    }
    if !s("rule").is_empty() {
        out.push_str(&format!(" (rule: {})", s("rule")));
    }
    out
}

/// Where PreToolUse notes `last_error` for the PostToolUse of the same tool call: a
/// directory of the user's own, outside the workspace (`$XDG_RUNTIME_DIR`, else /tmp).
fn state_dir() -> anyhow::Result<PathBuf> {
    let uid = nix::unistd::getuid().as_raw();
    // `$XDG_RUNTIME_DIR` when it is this user's (an agent started with `run --user` may
    // have inherited the operator's).
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.uid() == uid))
        .map(|p| p.join("intentfs-hook"))
        .unwrap_or_else(|| std::env::temp_dir().join(format!("intentfs-hook-{uid}")));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let md = std::fs::symlink_metadata(&dir)?;
    if !md.is_dir() || md.uid() != uid || md.mode() & 0o077 != 0 {
        bail!(
            "{} is not a private directory of uid {uid}: remove it",
            dir.display()
        );
    }
    Ok(dir)
}

/// The note's file for one tool call of one session (hashed: the ids are the client's).
fn note_path(dir: &Path, session: &str, key: &str) -> PathBuf {
    let mut h = Sha256::new();
    h.update(session.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    dir.join(hex::encode(&h.finalize()[..16]))
}

fn write_note(p: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = p.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, p)?;
    Ok(())
}

/// The answer to one event (`None`: nothing to say).
fn answer(input: &Value) -> anyhow::Result<Option<Value>> {
    let event = input["hook_event_name"].as_str().unwrap_or_default();
    let tool = input["tool_name"].as_str().unwrap_or_default();
    let cwd = match input["cwd"].as_str() {
        Some(c) if !c.is_empty() => PathBuf::from(c),
        _ => std::env::current_dir()?,
    };
    let g = Governed::find(&cwd)?;
    let session = input["session_id"].as_str().unwrap_or("none");
    match event {
        "SessionStart" => {
            let context = g.read("context")?;
            let selected = !g.read("intent")?.trim().is_empty();
            let text = if selected {
                format!(
                    "This workspace is governed by intentfs. You work under this intent; change only files in \
                     its owned_scope:\n{context}"
                )
            } else {
                let list: Vec<String> = g
                    .intents()?
                    .into_iter()
                    .map(|(id, name, globs)| {
                        format!("- {id}: {name} (owned_scope: {})", globs.join(" "))
                    })
                    .collect();
                format!(
                    "This workspace is governed by intentfs: no file can be changed before you select an intent \
                     (the intentfs MCP tool select_active_intent, or `echo ID > .intentfs/intent`), and then only \
                     within its owned_scope. The intents:\n{}\n{context}",
                    list.join("\n")
                )
            };
            Ok(Some(specific(
                "SessionStart",
                json!({ "additionalContext": text }),
            )))
        }
        "PreToolUse" => {
            if SHELL_TOOLS.contains(&tool) {
                // Note the refusal standing before the command runs.
                let key = input["tool_use_id"].as_str().unwrap_or("shell");
                let dir = state_dir()?;
                write_note(&note_path(&dir, session, key), &g.last_error().to_string())?;
                return Ok(None);
            }
            let Some((_, field)) = EDIT_TOOLS.iter().find(|(t, _)| *t == tool) else {
                return Ok(None);
            };
            let Some(path) = input["tool_input"][*field].as_str() else {
                return Ok(None);
            };
            // A path outside the mount is not intentfs's to judge.
            let Ok(rel) = g.rel(Path::new(path), &cwd) else {
                return Ok(None);
            };
            let op = if tool == "Write" && !g.root.join(&rel).exists() {
                "create"
            } else {
                "write"
            };
            let v = match g.query("check", &json!({ "path": rel, "operation": op }))? {
                Ok(v) => v,
                Err(r) => bail!(
                    "the daemon refused the check of {rel}: {}",
                    super::agent::errno_text(r.errno)
                ),
            };
            if v["decision"] != "deny" {
                return Ok(None);
            }
            Ok(Some(specific(
                "PreToolUse",
                json!({
                    "permissionDecision": "deny",
                    "permissionDecisionReason": describe(&v),
                }),
            )))
        }
        "PostToolUse" | "PostToolUseFailure" => {
            let dir = state_dir()?;
            let key = input["tool_use_id"].as_str().unwrap_or("shell");
            let note = note_path(&dir, session, key);
            let last_seen = note_path(&dir, session, "last-reported");
            let now = g.last_error();
            // Before: what PreToolUse noted for this call, else the last one reported in
            // this session (a tool whose PreToolUse is not hooked).
            let before = std::fs::read_to_string(&note)
                .or_else(|_| std::fs::read_to_string(&last_seen))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok());
            let _ = std::fs::remove_file(&note);
            if now.get("code").is_none() || before.as_ref() == Some(&now) {
                return Ok(None);
            }
            write_note(&last_seen, &now.to_string())?;
            if !SHELL_TOOLS.contains(&tool) && event == "PostToolUse" {
                // A file tool that succeeded was not refused; the refusal is another's.
                return Ok(None);
            }
            Ok(Some(specific(
                event,
                json!({ "additionalContext": format!(
                    "{} Read .intentfs/last_error (or call get_last_error) for details; do not retry the same \
                     operation.",
                    describe(&now)
                ) }),
            )))
        }
        _ => Ok(None),
    }
}

pub fn run(_a: HookArgs) -> anyhow::Result<ExitCode> {
    let mut raw = String::new();
    std::io::stdin()
        .read_to_string(&mut raw)
        .context("reading the hook's JSON from stdin")?;
    let input: Value = serde_json::from_str(&raw).context(
        "the hook's input is not JSON: `intentfs hook` reads one event object on stdin, as Claude Code sends it",
    )?;
    match answer(&input) {
        Ok(Some(v)) => {
            println!("{v}");
            Ok(ExitCode::SUCCESS)
        }
        Ok(None) => Ok(ExitCode::SUCCESS),
        // Not a blocking error (exit 2 would block the tool): the filesystem governs
        // anyway; the client shows this to the user.
        Err(e) => {
            eprintln!("intentfs hook: {e:#}");
            Ok(ExitCode::from(1))
        }
    }
}
