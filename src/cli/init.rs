//! `intentfs init AGENT`: write an agent's configuration for `intentfs mcp` (and, for
//! Claude Code, `intentfs hook`) into the workspace, merged into what is there.
//!
//! The files are written to the backing workspace (never through the mount, where they are
//! read-only for everyone: `guard::AGENT_CONFIG`), so run it as the workspace's owner;
//! pointed at a mount, it writes to that mount's workspace.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::agent::Governed;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    /// Claude Code: .mcp.json and the hooks in .claude/settings.json.
    ClaudeCode,
    /// Codex CLI: .codex/config.toml.
    Codex,
    /// Gemini CLI: .gemini/settings.json.
    Gemini,
    /// Any other MCP client: prints the `mcpServers` JSON most of them take.
    Generic,
}

#[derive(clap::Args, Debug)]
#[command(after_long_help = "EXAMPLES:
  intentfs init claude-code                 # in the workspace: .mcp.json, .claude/settings.json
  intentfs init codex --workspace ./project # .codex/config.toml
  intentfs init gemini --print              # show what would be written, write nothing
  intentfs init generic                     # the JSON snippet for any other MCP client

Existing files are merged into, never replaced: other MCP servers, hooks and settings stay;
running it again changes nothing. Agents can never change these files through the mount
(they are protected like .orchestration/), so an agent cannot switch its hooks off.
Then start the agent inside the mount in an identity of its own:
  intentfs run --intents all --agent claude --user agent -- claude")]
pub struct InitArgs {
    /// The agent to configure.
    #[arg(value_enum)]
    pub agent: Agent,
    /// The workspace (or its mountpoint) [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Print the files as they would be written, write nothing.
    #[arg(long)]
    pub print: bool,
    /// With --print (and for `generic`): print JSON, `{"files": [{"path", "content"}]}`.
    #[arg(long)]
    pub json: bool,
    /// The command the agent runs [default: `intentfs` when it is this binary on PATH,
    /// else this binary's absolute path].
    #[arg(long, value_name = "PATH")]
    pub command: Option<String>,
}

/// The command agents are configured to run.
fn default_command() -> String {
    let me = std::env::current_exe().ok();
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("intentfs"))
            .find(|c| c.is_file())
    });
    match (&me, on_path) {
        (Some(me), Some(p))
            if p.canonicalize().ok().as_ref() == me.canonicalize().ok().as_ref() =>
        {
            "intentfs".into()
        }
        (Some(me), _) => me.display().to_string(),
        (None, _) => "intentfs".into(),
    }
}

/// The MCP server entry.
fn mcp_entry(cmd: &str) -> Value {
    json!({ "command": cmd, "args": ["mcp"] })
}

/// The hook events and matchers `intentfs hook` answers (see `cli::hook`).
fn claude_hooks() -> [(&'static str, Option<&'static str>); 4] {
    [
        ("SessionStart", None),
        ("PreToolUse", Some("Write|Edit|MultiEdit|NotebookEdit|Bash")),
        ("PostToolUse", Some("Bash")),
        (
            "PostToolUseFailure",
            Some("Bash|Write|Edit|MultiEdit|NotebookEdit"),
        ),
    ]
}

/// A JSON object at `v[key]`, made if absent; an error if something else is there.
fn object<'a>(
    v: &'a mut Value,
    key: &str,
    file: &str,
) -> anyhow::Result<&'a mut serde_json::Map<String, Value>> {
    let o = v.as_object_mut().ok_or_else(|| {
        anyhow!("{file} is not a JSON object: fix or move it, then run init again")
    })?;
    o.entry(key).or_insert_with(|| json!({}));
    o.get_mut(key)
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("{file}: \"{key}\" is not an object: fix it, then run init again"))
}

/// `.mcp.json`, `.gemini/settings.json`: our server under `mcpServers`.
fn merge_mcp_servers(mut v: Value, entry: Value, file: &str) -> anyhow::Result<Value> {
    object(&mut v, "mcpServers", file)?.insert("intentfs".into(), entry);
    Ok(v)
}

/// `.claude/settings.json`: our hooks (once each), the project MCP server enabled, its tools
/// allowed without a prompt.
fn merge_claude_settings(mut v: Value, cmd: &str) -> anyhow::Result<Value> {
    let file = ".claude/settings.json";
    let command = format!("{} hook", shell_quote(cmd));
    let hooks = object(&mut v, "hooks", file)?;
    for (event, matcher) in claude_hooks() {
        let list = hooks.entry(event).or_insert_with(|| json!([]));
        let Some(list) = list.as_array_mut() else {
            bail!("{file}: hooks.{event} is not an array: fix it, then run init again");
        };
        let ours = |g: &Value| {
            g["hooks"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h["command"] == command.as_str()))
        };
        if list.iter().any(ours) {
            continue;
        }
        let mut group =
            json!({ "hooks": [{ "type": "command", "command": command, "timeout": 30 }] });
        if let Some(m) = matcher {
            group["matcher"] = json!(m);
        }
        list.push(group);
    }
    let o = v
        .as_object_mut()
        .ok_or_else(|| anyhow!("{file} is not a JSON object"))?;
    let enabled = o
        .entry("enabledMcpjsonServers")
        .or_insert_with(|| json!([]));
    if let Some(a) = enabled.as_array_mut() {
        if !a.iter().any(|s| s == "intentfs") {
            a.push(json!("intentfs"));
        }
    }
    let perms = object(&mut v, "permissions", file)?;
    let allow = perms.entry("allow").or_insert_with(|| json!([]));
    if let Some(a) = allow.as_array_mut() {
        if !a.iter().any(|s| s == "mcp__intentfs") {
            a.push(json!("mcp__intentfs"));
        }
    }
    Ok(v)
}

/// `.codex/config.toml`: `[mcp_servers.intentfs]`, the rest of the file kept as written
/// (comments and order included).
fn merge_codex(text: &str, cmd: &str) -> anyhow::Result<String> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .context(".codex/config.toml is not valid TOML: fix it, then run init again")?;
    let servers = doc
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        })
        .as_table_mut()
        .ok_or_else(|| anyhow!(".codex/config.toml: mcp_servers is not a table"))?;
    let mut t = toml_edit::Table::new();
    t.insert("command", toml_edit::value(cmd));
    let mut args = toml_edit::Array::new();
    args.push("mcp");
    t.insert("args", toml_edit::value(args));
    // request_approval waits for a human (the policy's approval.timeout_s, 60 s by
    // default): longer than Codex's default tool timeout.
    t.insert("tool_timeout_sec", toml_edit::value(600));
    servers.insert("intentfs", toml_edit::Item::Table(t));
    Ok(doc.to_string())
}

/// `cmd` as one word for a shell (hook commands are run by a shell).
fn shell_quote(cmd: &str) -> String {
    if cmd
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@".contains(c))
    {
        cmd.to_string()
    } else {
        format!("'{}'", cmd.replace('\'', r"'\''"))
    }
}

/// Read a JSON file (`{}` when absent).
fn read_json(p: &Path, shown: &str) -> anyhow::Result<Value> {
    match std::fs::read_to_string(p) {
        Ok(t) if t.trim().is_empty() => Ok(json!({})),
        Ok(t) => serde_json::from_str(&t)
            .with_context(|| format!("{shown} is not valid JSON: fix it, then run init again")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", p.display())),
    }
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The files for `agent` in `ws`: `(workspace-relative path, new content)`.
pub fn files(agent: Agent, ws: &Path, cmd: &str) -> anyhow::Result<Vec<(String, String)>> {
    let j = |rel: &str| read_json(&ws.join(rel), rel);
    Ok(match agent {
        Agent::ClaudeCode => vec![
            (
                ".mcp.json".into(),
                pretty(&merge_mcp_servers(
                    j(".mcp.json")?,
                    mcp_entry(cmd),
                    ".mcp.json",
                )?),
            ),
            (
                ".claude/settings.json".into(),
                pretty(&merge_claude_settings(j(".claude/settings.json")?, cmd)?),
            ),
        ],
        Agent::Codex => {
            let rel = ".codex/config.toml";
            let text = match std::fs::read_to_string(ws.join(rel)) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(e).with_context(|| format!("cannot read {rel}")),
            };
            vec![(rel.into(), merge_codex(&text, cmd)?)]
        }
        Agent::Gemini => {
            let rel = ".gemini/settings.json";
            let mut entry = mcp_entry(cmd);
            // Milliseconds; request_approval waits for a human.
            entry["timeout"] = json!(600_000);
            vec![(rel.into(), pretty(&merge_mcp_servers(j(rel)?, entry, rel)?))]
        }
        Agent::Generic => vec![(
            "mcp.json (for your client)".into(),
            pretty(&json!({ "mcpServers": { "intentfs": mcp_entry(cmd) } })),
        )],
    })
}

/// The workspace to write to: `dir`, or, when `dir` is inside an intentfs mount, the
/// same place in that mount's workspace (the files are read-only through the mount).
fn workspace(dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("no directory {}", dir.display()))?;
    if let Ok(g) = Governed::find(&dir) {
        let st = g.status()?;
        let ws = st["mount"]["workspace"]
            .as_str()
            .ok_or_else(|| anyhow!("the mount's status names no workspace"))?;
        let rel = dir.strip_prefix(&g.root).unwrap_or(Path::new(""));
        return Ok(Path::new(ws).join(rel));
    }
    Ok(dir)
}

pub fn run(a: InitArgs) -> anyhow::Result<ExitCode> {
    let cmd = a.command.clone().unwrap_or_else(default_command);
    let ws = match &a.workspace {
        Some(w) => workspace(w)?,
        None => workspace(&std::env::current_dir()?)?,
    };
    let files = files(a.agent, &ws, &cmd)?;
    if a.print || a.agent == Agent::Generic {
        if a.json {
            let list: Vec<Value> = files
                .iter()
                .map(|(p, c)| json!({ "path": p, "content": c }))
                .collect();
            println!("{}", pretty(&json!({ "files": list })).trim_end());
        } else {
            for (p, c) in &files {
                if files.len() > 1 || a.agent != Agent::Generic {
                    println!("# {p}");
                }
                print!("{c}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    for (rel, content) in &files {
        let p = ws.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        // Replaced whole (a temporary renamed over it): a reader never sees half a file.
        let tmp = p.with_extension("intentfs-init.tmp");
        std::fs::write(&tmp, content).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if a.json {
        let list: Vec<Value> = files
            .iter()
            .map(|(p, _)| json!({ "path": ws.join(p) }))
            .collect();
        println!("{}", json!({ "written": list }));
    } else {
        for (rel, _) in &files {
            println!("wrote {}", ws.join(rel).display());
        }
        eprintln!(
            "These files are read-only for agents through the mount. Start the agent inside the mount, e.g.\n  \
             intentfs run --intents all --agent {} --user agent -- {}",
            match a.agent {
                Agent::ClaudeCode => "claude",
                Agent::Codex => "codex",
                Agent::Gemini => "gemini",
                Agent::Generic => "agent",
            },
            match a.agent {
                Agent::ClaudeCode => "claude",
                Agent::Codex => "codex",
                Agent::Gemini => "gemini",
                Agent::Generic => "CMD",
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_settings_merge_keeps_others_and_is_idempotent() {
        let before = json!({
            "model": "opus",
            "hooks": { "PreToolUse": [{ "matcher": "Bash", "hooks": [{ "type": "command", "command": "mine" }] }] },
            "permissions": { "allow": ["Bash(ls:*)"] }
        });
        let once = merge_claude_settings(before, "intentfs").unwrap();
        let twice = merge_claude_settings(once.clone(), "intentfs").unwrap();
        assert_eq!(once, twice);
        assert_eq!(once["model"], "opus");
        let pre = once["hooks"]["PreToolUse"].as_array().unwrap();
        assert_eq!(pre.len(), 2);
        assert_eq!(pre[0]["hooks"][0]["command"], "mine");
        assert_eq!(pre[1]["hooks"][0]["command"], "intentfs hook");
        assert_eq!(
            once["permissions"]["allow"],
            json!(["Bash(ls:*)", "mcp__intentfs"])
        );
    }

    #[test]
    fn codex_merge_keeps_comments() {
        let t = "# mine\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"\n";
        let out = merge_codex(t, "/usr/bin/intentfs").unwrap();
        assert!(out.starts_with("# mine\nmodel = \"o3\""), "{out}");
        assert!(out.contains("[mcp_servers.other]"));
        assert!(out.contains("[mcp_servers.intentfs]"));
        assert_eq!(merge_codex(&out, "/usr/bin/intentfs").unwrap(), out);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/usr/bin/intentfs"), "/usr/bin/intentfs");
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
    }
}
