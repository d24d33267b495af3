//! Agents told they are governed (issue 21): `intentfs mcp` driven by the MCP SDK's own
//! client over stdio, `intentfs hook` fed Claude Code's recorded payloads, `intentfs init`'s
//! files parsed as each agent parses them and protected from the agent. Every agent runs
//! under another uid, in an identity `intentfs run` granted, on a real mount; outcomes are
//! asserted on the backing files and the ledger.
//!
//! These tests need root (another uid); each says why it skips otherwise.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::deploy::*;
use common::*;
use rmcp::model::{CallToolRequestParams, CallToolResult, ReadResourceRequestParams};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// INT-001 owns `src/auth/**`, INT-002 the docs; a human is asked about out-of-scope writes.
const POLICY_ASK: &str = "\
intents:
  - id: INT-001
    name: auth
    status: IN_PROGRESS
    owned_scope: [\"src/auth/**\"]
    constraints: [\"keep the session API\"]
  - id: INT-002
    name: docs
    status: IN_PROGRESS
    owned_scope: [\"docs/**\", \"README.md\"]
approval:
  out_of_scope: ask
  timeout_s: 60
";

/// The same intents, out-of-scope writes refused at once.
fn policy_deny() -> String {
    POLICY_ASK.replace("out_of_scope: ask", "out_of_scope: deny")
}

/// One intent owning everything: only the always-protected paths stop the agent.
const POLICY_ALL: &str = "\
intents:
  - id: ALL
    name: everything
    status: IN_PROGRESS
    owned_scope: [\"**\"]
approval:
  out_of_scope: deny
";

const FILES: &[(&str, &str)] = &[("README.md", "# Project\n")];

/// The recommended layout, the agent's uid owning the files (so only governance stops
/// it), or `None` (skipped) without root.
fn layout_with(policy: &str, files: &[(&str, &str)]) -> Option<Layout> {
    if skip_unless(is_root() && have("setpriv"), "needs root (another uid)") {
        return None;
    }
    let l = Layout::with(policy, files);
    chown_r(&l.ws, AGENT_UID);
    ok(
        sh_in(
            &l.ws,
            &format!("git -c safe.directory='*' update-index -q --refresh; chown {AGENT_UID}:{AGENT_UID} .git/index"),
        ),
        "refresh the index",
    );
    Some(l)
}

fn ws_text(l: &Layout, rel: &str) -> String {
    std::fs::read_to_string(l.ws.join(rel)).unwrap_or_else(|e| panic!("ws/{rel}: {e}"))
}

/// `intentfs ARGS` as the operator; its stdout.
fn operator(args: &[&str]) -> String {
    let mut c = intentfs();
    c.args(args);
    ok(
        run_timeout(c, Duration::from_secs(30)),
        &format!("intentfs {args:?}"),
    )
}

// ----- intentfs mcp ---------------------------------------------------------------------

/// A tool call's JSON answer (structured content), and whether it is an error.
fn answer(r: &CallToolResult) -> (Value, bool) {
    let v = r.structured_content.clone().unwrap_or_else(|| {
        let t = r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        serde_json::from_str(&t).unwrap_or(Value::String(t))
    });
    (v, r.is_error == Some(true))
}

fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

fn call(name: &'static str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap_or_default())
}

/// `intentfs approvals --json` until a request for `path` waits (20 s at most).
fn wait_pending(l: &Layout, path: &str) -> Value {
    let mnt = l.mnt.to_str().unwrap();
    let mut got = Value::Null;
    let found = wait_until(Duration::from_secs(20), || {
        let list: Value = serde_json::from_str(&operator(&["approvals", "--json", mnt])).unwrap();
        match list.as_array().unwrap().iter().find(|p| p["path"] == path) {
            Some(p) => {
                got = p.clone();
                true
            }
            None => false,
        }
    });
    assert!(found, "no pending approval for {path}");
    got
}

/// The MCP server as the agent's client starts it: `intentfs mcp` inside the mount, in the
/// agent's identity (granted by `intentfs run`, under another uid). Next to it, in the same
/// identity, a shell runs the scripts the test drops in `meet/` (`stepN.sh` once `goN`
/// exists; exit status in `rcN`): the agent's own file operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_server_speaks_for_the_agent_identity() {
    let Some(l) = layout_with(POLICY_ASK, FILES) else {
        return;
    };
    let _m = l.mount(&["--allow-other", "--approver", "cli"]).0;
    let meet = l.meeting_dir();
    let runner = format!(
        "(for i in 1 2; do while [ ! -e {m}/go$i ]; do sleep 0.05; done; \
           sh {m}/step$i.sh >/dev/null 2>{m}/err$i; echo $? > {m}/rc$i; done) </dev/null >/dev/null 2>&1 & \
         exec {bin} mcp",
        m = meet.display(),
        bin = BIN
    );
    let cmd = agent_cmd(&l, &["--intents", "all", "--agent", "claude"], &runner);
    let transport =
        TokioChildProcess::new(tokio::process::Command::from(cmd)).expect("spawning intentfs mcp");
    let client = ().serve(transport).await.expect("MCP initialize");

    // initialize: the server says who it is and how to use it.
    let info = client.peer_info().expect("server info");
    assert_eq!(info.server_info.as_ref().unwrap().name, "intentfs");
    assert!(info
        .instructions
        .as_deref()
        .unwrap_or_default()
        .contains("select_active_intent"));

    let tools: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    for t in [
        "list_intents",
        "select_active_intent",
        "get_last_error",
        "get_status",
        "check_path",
        "request_approval",
        "get_lessons",
    ] {
        assert!(tools.contains(&t.to_string()), "no tool {t}: {tools:?}");
    }
    let resources: Vec<String> = client
        .list_all_resources()
        .await
        .unwrap()
        .iter()
        .map(|r| r.uri.clone())
        .collect();
    assert!(
        resources.contains(&"intentfs://intents/INT-001".to_string()),
        "{resources:?}"
    );

    // The intents, for this identity.
    let (v, err) = answer(
        &client
            .call_tool(call("list_intents", json!({})))
            .await
            .unwrap(),
    );
    assert!(!err, "{v:#}");
    assert_eq!(v["agent"], "claude");
    assert_eq!(v["selected"], Value::Null);
    assert_eq!(v["intents"].as_array().unwrap().len(), 2, "{v:#}");

    // An unknown intent: a structured error listing those it may select.
    let (v, err) = answer(
        &client
            .call_tool(call(
                "select_active_intent",
                json!({ "intent_id": "INT-999" }),
            ))
            .await
            .unwrap(),
    );
    assert!(err, "{v:#}");
    assert_eq!(v["code"], "INVALID_INTENT", "{v:#}");
    assert_eq!(v["selectable"], json!(["INT-001", "INT-002"]), "{v:#}");
    assert!(v["remedy"].as_str().unwrap().contains("INT-001"), "{v:#}");

    // Selecting answers the intent's context; the switch is on the ledger as this agent's.
    let r = client
        .call_tool(call(
            "select_active_intent",
            json!({ "intent_id": "INT-002" }),
        ))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true));
    let ctx = text_of(&r);
    assert!(
        ctx.contains("<intent_context>") && ctx.contains("<id>INT-002</id>"),
        "{ctx}"
    );
    let e = l.wait_ledger("the INTENT switch", |e| {
        e["mutation_type"] == "INTENT" && e["intent_id"] == "INT-002"
    });
    assert_eq!(e["agent"]["uid"], AGENT_UID, "{e:#}");
    assert_eq!(e["agent"]["name"], "claude", "{e:#}");
    let res = client
        .read_resource(ReadResourceRequestParams::new("intentfs://intents/INT-002"))
        .await
        .unwrap();
    assert!(format!("{:?}", res.contents).contains("INT-002"));

    // check_path: in scope, out of scope (a human would be asked), protected; nothing
    // recorded for any of them.
    let before = l.ledger().len();
    let (v, _) = answer(
        &client
            .call_tool(call("check_path", json!({ "path": "docs/new.md" })))
            .await
            .unwrap(),
    );
    assert_eq!(v["decision"], "allow", "{v:#}");
    let (v, _) = answer(
        &client
            .call_tool(call(
                "check_path",
                json!({ "path": format!("{}/src/auth/session.ts", l.mnt.display()) }),
            ))
            .await
            .unwrap(),
    );
    assert_eq!(v["decision"], "ask", "{v:#}");
    assert_eq!(v["code"], "SCOPE_VIOLATION", "{v:#}");
    assert_eq!(v["path"], "src/auth/session.ts", "{v:#}");
    let (v, _) = answer(
        &client
            .call_tool(call(
                "check_path",
                json!({ "path": ".mcp.json", "operation": "create" }),
            ))
            .await
            .unwrap(),
    );
    assert_eq!(v["decision"], "deny", "{v:#}");
    assert_eq!(v["code"], "PROTECTED_PATH", "{v:#}");
    let (v, err) = answer(
        &client
            .call_tool(call("check_path", json!({ "path": "/etc/passwd" })))
            .await
            .unwrap(),
    );
    assert!(err && v["code"] == "OUTSIDE_MOUNT", "{v:#}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(l.ledger().len(), before, "check_path recorded something");

    // The agent is refused (a protected path); the server reads the refusal back.
    std::fs::write(meet.join("step1.sh"), "echo '{}' > .mcp.json\n").unwrap();
    std::fs::write(meet.join("go1"), "").unwrap();
    assert!(wait_until(Duration::from_secs(20), || meet
        .join("rc1")
        .exists()));
    assert_ne!(
        std::fs::read_to_string(meet.join("rc1")).unwrap().trim(),
        "0"
    );
    let (v, err) = answer(
        &client
            .call_tool(call("get_last_error", json!({})))
            .await
            .unwrap(),
    );
    assert!(!err, "{v:#}");
    assert_eq!(v["code"], "PROTECTED_PATH", "{v:#}");
    assert_eq!(v["path"], ".mcp.json", "{v:#}");
    assert!(!v["remedy"].as_str().unwrap().is_empty());
    assert!(!l.ws.join(".mcp.json").exists());

    // request_approval: parked until a human answers with `intentfs approve`, which the
    // agent itself cannot do.
    let peer = client.clone();
    let asking = tokio::spawn(async move {
        peer.call_tool(call(
            "request_approval",
            json!({ "path": "src/auth/session.ts", "reason": "the docs example\nneeds the new session API" }),
        ))
        .await
    });
    let p = tokio::task::block_in_place(|| wait_pending(&l, "src/auth/session.ts"));
    assert_eq!(
        p["reason"], "the docs example needs the new session API",
        "{p:#}"
    );
    assert_eq!(p["agent"], "claude", "{p:#}");
    let id = p["id"].as_u64().unwrap().to_string();
    // A second request meanwhile is not filed: one waits at a time.
    let (v, err) = answer(
        &client
            .call_tool(call(
                "request_approval",
                json!({ "path": "src/other.ts", "operation": "create", "reason": "also" }),
            ))
            .await
            .unwrap(),
    );
    assert!(err && v["status"] == "busy", "{v:#}");
    // The agent cannot approve itself: its uid cannot reach the control socket.
    let self_approve = tokio::task::block_in_place(|| {
        run_agent(
            &l,
            &["--intents", "all", "--agent", "claude"],
            &format!("{BIN} approve {id} --mount {}", l.mnt.display()),
        )
    });
    assert!(!self_approve.status.success(), "the agent approved itself");
    tokio::task::block_in_place(|| {
        assert_eq!(wait_pending(&l, "src/auth/session.ts")["id"], p["id"]);
        operator(&["approve", &id, "--mount", l.mnt.to_str().unwrap()]);
    });
    let (v, err) = answer(&asking.await.unwrap().unwrap());
    assert!(!err, "{v:#}");
    assert_eq!(v["status"], "approved", "{v:#}");
    assert_eq!(v["grant"], "once", "{v:#}");
    let e = l.wait_ledger("the approval", |e| {
        e["mutation_type"] == "APPROVAL" && e["path"] == "src/auth/session.ts"
    });
    assert_eq!(e["outcome"], "approved", "{e:#}");
    assert_eq!(
        e["detail"]["reason"],
        "the docs example needs the new session API"
    );
    assert_eq!(e["agent"]["uid"], AGENT_UID, "{e:#}");

    // The once grant lets the agent's next write through, without asking again.
    std::fs::write(
        meet.join("step2.sh"),
        "echo '// new API' >> src/auth/session.ts\n",
    )
    .unwrap();
    std::fs::write(meet.join("go2"), "").unwrap();
    assert!(wait_until(Duration::from_secs(20), || meet
        .join("rc2")
        .exists()));
    assert_eq!(
        std::fs::read_to_string(meet.join("rc2")).unwrap().trim(),
        "0",
        "{}",
        std::fs::read_to_string(meet.join("err2")).unwrap_or_default()
    );
    assert_eq!(
        ws_text(&l, "src/auth/session.ts"),
        "export const session = 1;\n// new API\n"
    );

    // Rejected: an error with the code and the remedy, a refusal on the ledger.
    let peer = client.clone();
    let asking = tokio::spawn(async move {
        peer.call_tool(call(
            "request_approval",
            json!({ "path": "src/auth/keys.ts", "operation": "create", "reason": "rotate keys" }),
        ))
        .await
    });
    let p = tokio::task::block_in_place(|| wait_pending(&l, "src/auth/keys.ts"));
    operator(&[
        "reject",
        &p["id"].as_u64().unwrap().to_string(),
        "--mount",
        l.mnt.to_str().unwrap(),
    ]);
    let (v, err) = answer(&asking.await.unwrap().unwrap());
    assert!(err, "{v:#}");
    assert_eq!(v["status"], "rejected", "{v:#}");
    assert_eq!(v["code"], "APPROVAL_REJECTED", "{v:#}");
    assert!(!v["remedy"].as_str().unwrap().is_empty());
    l.wait_ledger("the rejection", |e| {
        e["mutation_type"] == "DENIAL"
            && e["code"] == "APPROVAL_REJECTED"
            && e["path"] == "src/auth/keys.ts"
    });
    assert!(!l.ws.join("src/auth/keys.ts").exists());

    // What no human can approve is answered at once, asking nobody.
    let (v, err) = answer(
        &client
            .call_tool(call(
                "request_approval",
                json!({ "path": ".claude/settings.json", "reason": "turn the hooks off" }),
            ))
            .await
            .unwrap(),
    );
    assert!(
        err && v["status"] == "refused" && v["code"] == "PROTECTED_PATH",
        "{v:#}"
    );
    let (v, _) = answer(
        &client
            .call_tool(call("get_status", json!({})))
            .await
            .unwrap(),
    );
    assert_eq!(v["status"]["pending_approvals"], json!([]), "{v:#}");
    let (v, err) = answer(
        &client
            .call_tool(call("get_lessons", json!({})))
            .await
            .unwrap(),
    );
    assert!(!err && v["lessons_file"] == "CLAUDE.md", "{v:#}");
    client.cancel().await.unwrap();
}

/// Outside a mount, `intentfs mcp` says where it looked and how to start it.
#[test]
fn mcp_outside_a_mount_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = intentfs();
    c.arg("mcp").current_dir(dir.path());
    let out = run_timeout(c, Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("not inside an intentfs mount") && err.contains("hint:"),
        "{err}"
    );
}

// ----- intentfs hook ----------------------------------------------------------------------

/// A recorded payload (tests/fixtures/hooks/), `/workspace` replaced by the mountpoint.
fn fixture(name: &str, mnt: &Path) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hooks")
        .join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .replace("/workspace", mnt.to_str().unwrap())
}

/// Run `script` as the agent (identity `args`), with the payloads written to `meet/` for
/// it; its `name.out` / `name.rc` files back.
fn replay(l: &Layout, args: &[&str], payloads: &[&str], script: &str) -> (PathBuf, String) {
    let meet = l.meeting_dir();
    for p in payloads {
        std::fs::write(meet.join(p), fixture(p, &l.mnt)).unwrap();
    }
    let mut c = agent_cmd(l, args, script);
    c.env("M", &meet)
        .env("H", format!("{BIN} hook"))
        .env_remove("XDG_RUNTIME_DIR");
    let out = run_timeout(c, Duration::from_secs(60));
    (
        meet,
        format!("{}\n{}", text(&out.stdout), text(&out.stderr)),
    )
}

/// The hook's answer to one payload (`None`: it answered nothing), and its exit status.
fn hook_answer(meet: &Path, name: &str) -> (Option<Value>, String) {
    let out = std::fs::read_to_string(meet.join(format!("{name}.out"))).unwrap_or_default();
    let rc = std::fs::read_to_string(meet.join(format!("{name}.rc"))).unwrap_or_default();
    let v = (!out.trim().is_empty()).then(|| {
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {out}"))
    });
    (v, rc.trim().to_string())
}

/// Claude Code's payloads replayed in a real mount as an agent: the session starts with the
/// intents to choose from (nothing selected) or the intent's context; an edit out of scope
/// or of the agent's own configuration is denied before it runs, with reason and remedy;
/// an edit in scope passes untouched; a shell command's refusal reaches the model once.
#[test]
fn hook_answers_claude_code_payloads() {
    let Some(l) = layout_with(&policy_deny(), FILES) else {
        return;
    };
    let _m = l.mount(&["--allow-other", "--approver", "deny"]).0;

    // No intent selected: the list to choose from.
    let (meet, ctx) = replay(
        &l,
        &["--intents", "all", "--agent", "claude"],
        &["session_start.json"],
        "$H < $M/session_start.json > $M/free.out; echo $? > $M/free.rc",
    );
    let (v, rc) = hook_answer(&meet, "free");
    assert_eq!(rc, "0", "{ctx}");
    let v = v.unwrap_or_else(|| panic!("no answer: {ctx}"));
    assert_eq!(v["hookSpecificOutput"]["hookEventName"], "SessionStart");
    let add = v["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap();
    assert!(
        add.contains("select an intent") && add.contains("INT-001") && add.contains("INT-002"),
        "{add}"
    );

    // Locked to INT-002 (the docs).
    let payloads = [
        "session_start.json",
        "pre_tool_use_write.json",
        "pre_tool_use_edit.json",
        "pre_tool_use_multiedit.json",
        "pre_tool_use_notebookedit.json",
        "pre_tool_use_bash.json",
        "post_tool_use_bash.json",
        "post_tool_use_failure_bash.json",
    ];
    let script = "\
        cd docs && $H < $M/session_start.json > $M/start.out; echo $? > $M/start.rc; cd ..
        $H < $M/pre_tool_use_write.json > $M/write.out; echo $? > $M/write.rc
        $H < $M/pre_tool_use_edit.json > $M/edit.out; echo $? > $M/edit.rc
        $H < $M/pre_tool_use_multiedit.json > $M/multi.out; echo $? > $M/multi.rc
        $H < $M/pre_tool_use_notebookedit.json > $M/nb.out; echo $? > $M/nb.rc
        $H < $M/pre_tool_use_bash.json > $M/prebash.out; echo $? > $M/prebash.rc
        sed -i 's/1/2/' src/auth/session.ts; echo $? > $M/sed.rc
        $H < $M/post_tool_use_bash.json > $M/postbash.out; echo $? > $M/postbash.rc
        $H < $M/post_tool_use_failure_bash.json > $M/again.out; echo $? > $M/again.rc
    ";
    let (meet, ctx) = replay(
        &l,
        &["--intent", "INT-002", "--agent", "claude"],
        &payloads,
        script,
    );

    let (v, rc) = hook_answer(&meet, "start");
    assert_eq!(rc, "0", "{ctx}");
    let add = v.unwrap()["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        add.contains("<id>INT-002</id>") && add.contains("docs/**"),
        "{add}"
    );

    // In scope: nothing to say, the tool runs.
    let (v, rc) = hook_answer(&meet, "write");
    assert_eq!((v, rc.as_str()), (None, "0"), "{ctx}");

    // Out of scope: denied before the tool runs, with the reason and the remedy.
    let (v, rc) = hook_answer(&meet, "edit");
    assert_eq!(rc, "0", "{ctx}");
    let o = &v.unwrap()["hookSpecificOutput"];
    assert_eq!(o["hookEventName"], "PreToolUse");
    assert_eq!(o["permissionDecision"], "deny");
    let why = o["permissionDecisionReason"].as_str().unwrap();
    assert!(
        why.contains("SCOPE_VIOLATION")
            && why.contains("src/auth/session.ts")
            && why.contains("Remedy:"),
        "{why}"
    );

    // The agent's own hook configuration (a relative path from docs/) and a notebook out
    // of scope.
    let (v, _) = hook_answer(&meet, "multi");
    let o = &v.unwrap()["hookSpecificOutput"];
    assert_eq!(o["permissionDecision"], "deny");
    assert!(o["permissionDecisionReason"]
        .as_str()
        .unwrap()
        .contains("PROTECTED_PATH"));
    let (v, _) = hook_answer(&meet, "nb");
    let o = &v.unwrap()["hookSpecificOutput"];
    assert_eq!(o["permissionDecision"], "deny");
    assert!(o["permissionDecisionReason"]
        .as_str()
        .unwrap()
        .contains("src/analysis.ipynb"));

    // Bash: nothing before; the refusal the command caused after, once.
    let (v, rc) = hook_answer(&meet, "prebash");
    assert_eq!((v, rc.as_str()), (None, "0"), "{ctx}");
    assert_ne!(
        std::fs::read_to_string(meet.join("sed.rc")).unwrap().trim(),
        "0"
    );
    let (v, rc) = hook_answer(&meet, "postbash");
    assert_eq!(rc, "0", "{ctx}");
    let o = &v.unwrap_or_else(|| panic!("no PostToolUse answer: {ctx}"))["hookSpecificOutput"];
    assert_eq!(o["hookEventName"], "PostToolUse");
    let add = o["additionalContext"].as_str().unwrap();
    assert!(
        add.contains("SCOPE_VIOLATION") && add.contains("src/auth/") && add.contains("Remedy:"),
        "{add}"
    );
    let (v, rc) = hook_answer(&meet, "again");
    assert_eq!(
        (v, rc.as_str()),
        (None, "0"),
        "an old refusal was reported again: {ctx}"
    );

    // The hook changed nothing itself; the refused sed left the file alone.
    assert_eq!(
        ws_text(&l, "src/auth/session.ts"),
        "export const session = 1;\n"
    );
    assert!(!l.ws.join("docs/guide.md").exists());
}

/// Garbage on stdin: a clear error, exit 2 (not the protocol's blocking code path).
#[test]
fn hook_rejects_input_that_is_not_json() {
    let mut c = intentfs();
    c.arg("hook").stdin(std::process::Stdio::piped());
    let mut child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"not json").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not JSON"),
        "{}",
        text(&out.stderr)
    );
}

// ----- intentfs init ----------------------------------------------------------------------

/// Each agent's files, merged into what is there, load in the agent's own format; a
/// second run changes nothing; `--print` writes nothing.
#[test]
fn init_writes_each_agents_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    put(
        &ws.join(".claude/settings.json"),
        r#"{"model": "opus", "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "mine"}]}]}}"#,
    );
    put(
        &ws.join(".mcp.json"),
        r#"{"mcpServers": {"db": {"command": "db-mcp"}}}"#,
    );
    put(
        &ws.join(".codex/config.toml"),
        "# my settings\nmodel = \"o3\"\n",
    );
    let init = |args: &[&str]| {
        let mut c = intentfs();
        c.arg("init")
            .args(args)
            .arg("--workspace")
            .arg(ws)
            .args(["--command", "/opt/bin/intentfs"]);
        ok(
            run_timeout(c, Duration::from_secs(10)),
            &format!("init {args:?}"),
        )
    };

    let printed = init(&["claude-code", "--print", "--json"]);
    let printed: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(printed["files"].as_array().unwrap().len(), 2);
    assert!(
        !ws_has(ws, ".claude/settings.json", "/opt/bin/intentfs"),
        "--print wrote"
    );

    init(&["claude-code"]);
    let mcp: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".mcp.json")).unwrap()).unwrap();
    assert_eq!(mcp["mcpServers"]["db"]["command"], "db-mcp");
    assert_eq!(
        mcp["mcpServers"]["intentfs"],
        json!({ "command": "/opt/bin/intentfs", "args": ["mcp"] })
    );
    let settings_text = std::fs::read_to_string(ws.join(".claude/settings.json")).unwrap();
    let s: Value = serde_json::from_str(&settings_text).unwrap();
    assert_eq!(s["model"], "opus");
    for (event, matcher) in [
        ("SessionStart", None),
        ("PreToolUse", Some("Write|Edit|MultiEdit|NotebookEdit|Bash")),
        ("PostToolUse", Some("Bash")),
    ] {
        let groups = s["hooks"][event]
            .as_array()
            .unwrap_or_else(|| panic!("no {event}: {s:#}"));
        let ours = groups
            .iter()
            .find(|g| g["hooks"][0]["command"] == "/opt/bin/intentfs hook")
            .unwrap_or_else(|| panic!("no intentfs hook for {event}: {s:#}"));
        assert_eq!(ours["hooks"][0]["type"], "command");
        assert_eq!(ours.get("matcher").and_then(Value::as_str), matcher);
    }
    assert_eq!(s["hooks"]["PreToolUse"][0]["hooks"][0]["command"], "mine");
    assert_eq!(s["enabledMcpjsonServers"], json!(["intentfs"]));
    init(&["claude-code"]);
    assert_eq!(
        std::fs::read_to_string(ws.join(".claude/settings.json")).unwrap(),
        settings_text
    );

    init(&["codex"]);
    let codex_text = std::fs::read_to_string(ws.join(".codex/config.toml")).unwrap();
    assert!(codex_text.starts_with("# my settings\n"), "{codex_text}");
    let codex: toml::Table = toml::from_str(&codex_text).unwrap();
    assert_eq!(codex["model"].as_str(), Some("o3"));
    let server = &codex["mcp_servers"]["intentfs"];
    assert_eq!(server["command"].as_str(), Some("/opt/bin/intentfs"));
    assert_eq!(server["args"].as_array().unwrap()[0].as_str(), Some("mcp"));

    init(&["gemini"]);
    let g: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".gemini/settings.json")).unwrap())
            .unwrap();
    assert_eq!(g["mcpServers"]["intentfs"]["command"], "/opt/bin/intentfs");
    assert_eq!(g["mcpServers"]["intentfs"]["args"], json!(["mcp"]));

    let generic: Value = serde_json::from_str(&init(&["generic"])).unwrap();
    assert_eq!(generic["mcpServers"]["intentfs"]["args"], json!(["mcp"]));

    // A file that is not JSON is left alone, with what to do.
    put(&ws.join(".gemini/settings.json"), "{ not json");
    let mut c = intentfs();
    c.args(["init", "gemini", "--workspace"]).arg(ws);
    let out = run_timeout(c, Duration::from_secs(10));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not valid JSON"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(ws.join(".gemini/settings.json")).unwrap(),
        "{ not json"
    );
}

fn ws_has(ws: &Path, rel: &str, needle: &str) -> bool {
    std::fs::read_to_string(ws.join(rel))
        .unwrap_or_default()
        .contains(needle)
}

/// The configuration init writes is the agent's own leash: an agent whose intent owns
/// everything still cannot write, `sed -i`, rename over, unlink, hard-link or symlink its
/// way into it; the backing files stay byte for byte, every refusal is on the ledger.
/// `init` pointed at the mount writes to the workspace behind it.
#[test]
fn agents_cannot_change_their_own_configuration() {
    let Some(l) = layout_with(POLICY_ALL, FILES) else {
        return;
    };
    let _m = l.mount(&["--allow-other", "--approver", "deny"]).0;
    for agent in ["claude-code", "codex"] {
        let mut c = intentfs();
        c.args(["init", agent, "--workspace"]).arg(&l.mnt);
        ok(
            run_timeout(c, Duration::from_secs(10)),
            "init through the mount's path",
        );
    }
    chown_r(&l.ws, AGENT_UID);
    let guarded = [".mcp.json", ".claude/settings.json", ".codex/config.toml"];
    let before: Vec<Vec<u8>> = guarded
        .iter()
        .map(|p| std::fs::read(l.ws.join(p)).unwrap())
        .collect();
    let script = "\
        echo '{}' > .mcp.json; echo write=$?
        sed -i 's/hook/true/' .claude/settings.json; echo sed=$?
        echo '{\"disableAllHooks\": true}' > evil.json && mv -f evil.json .claude/settings.json; echo rename_over=$?
        echo '{\"disableAllHooks\": true}' > .claude/settings.local.json; echo local=$?
        rm -f .codex/config.toml; echo unlink=$?
        mv .claude .claude-old; echo rename_dir=$?
        ln .mcp.json mine.json; echo hardlink=$?
        mkdir -p /tmp/evil-gemini-$$ && ln -s /tmp/evil-gemini-$$ .gemini; echo symlink_dir=$?
        ln -sf /tmp/evil.toml .codex/config.toml; echo symlink_over=$?
        mkdir -p x && echo '{}' > x/settings.json && mv x .gemini; echo move_dir_in=$?
        truncate -s 0 .mcp.json; echo truncate=$?
    ";
    let out = run_agent(&l, &["--intent", "ALL", "--agent", "evil"], script);
    let m: std::collections::HashMap<String, String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let ctx = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    for k in [
        "write",
        "sed",
        "rename_over",
        "local",
        "unlink",
        "rename_dir",
        "hardlink",
        "symlink_dir",
        "symlink_over",
        "move_dir_in",
        "truncate",
    ] {
        assert!(m.contains_key(k), "no {k} marker: {ctx}");
        assert_ne!(m[k], "0", "{k} succeeded: {ctx}");
    }
    for (p, b) in guarded.iter().zip(&before) {
        assert_eq!(&std::fs::read(l.ws.join(p)).unwrap(), b, "{p} changed");
    }
    assert!(!l.ws.join(".claude/settings.local.json").exists());
    assert!(
        std::fs::symlink_metadata(l.ws.join(".gemini")).is_err(),
        ".gemini was made"
    );
    assert!(!l.ws.join("mine.json").exists());
    let denied: Vec<String> = l
        .ledger()
        .into_iter()
        .filter(|e| e["mutation_type"] == "DENIAL" && e["code"] == "PROTECTED_PATH")
        .map(|e| e["path"].as_str().unwrap_or_default().to_string())
        .collect();
    for p in [
        ".mcp.json",
        ".claude/settings.json",
        ".codex/config.toml",
        ".claude",
        ".gemini",
    ] {
        assert!(
            denied.iter().any(|d| d == p),
            "no PROTECTED_PATH refusal of {p}: {denied:?}"
        );
    }
    // The operator is not refused: init again (say, after an upgrade) through the mount path.
    let mut c = intentfs();
    c.args(["init", "claude-code", "--workspace"]).arg(&l.mnt);
    ok(run_timeout(c, Duration::from_secs(10)), "init again");
}
