//! `intentfs notes`: the ledger's attribution of each commit as a git note, in a real git
//! repository worked on through a real mount: an agent changes files under two intents and
//! commits through the mount; the note on its commit names both intents with the right line
//! ranges, carries the commit's Agent Trace record, is not rewritten when nothing changed,
//! and a human's commit made outside the mount gets none.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Output, Stdio};

use common::*;
use serde_json::Value;

/// Two intents over the same source tree; the second also owns docs/.
const POLICY: &str = "intents:
  - id: INT-A
    name: Parser
    status: IN_PROGRESS
    owned_scope: [\"src/**\"]
  - id: INT-B
    name: Parser fixes and docs
    status: IN_PROGRESS
    owned_scope: [\"src/**\", \"docs/**\"]
";

fn notes(args: &[&str], ws: &std::path::Path) -> Output {
    let mut c = intentfs();
    c.arg("notes").args(args).arg(ws).stdin(Stdio::null());
    // No git identity of its own here: notes are committed as intentfs.
    c.env("HOME", ws)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_COMMITTER_NAME")
        .env_remove("GIT_COMMITTER_EMAIL");
    c.output().unwrap()
}

fn notes_json(args: &[&str], ws: &std::path::Path) -> Value {
    let out = notes(&[args, &["--json"]].concat(), ws);
    assert!(
        out.status.success(),
        "intentfs notes failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn git_ws(ws: &std::path::Path, script: &str) -> String {
    ok(sh_in(ws, script), script)
}

fn entry_for<'a>(report: &'a Value, rev: &str) -> &'a Value {
    report["commits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["commit"] == rev)
        .unwrap_or_else(|| panic!("{rev} not in the report: {report:#}"))
}

#[test]
fn one_note_per_commit_names_both_intents_with_their_lines() {
    let mut tm = TestMount::builder()
        .policy(POLICY)
        .agent("coder")
        .files(&[("src/lib.rs", "base1\nbase2\n")])
        .setup(|ws| {
            ok(
                sh_in(
                    ws,
                    "git init -q -b main . && git add src && git commit -qm init",
                ),
                "git init in ws",
            );
            std::fs::write(
                ws.join(".git/info/exclude"),
                ".intentfs/\n.orchestration/\n",
            )
            .unwrap();
        })
        .mount();

    // Under INT-A: a new file and a line added to an old one.
    tm.sh_ok(
        "echo INT-A > .intentfs/intent && printf 'a1\\na2\\na3\\n' > src/parser.rs \
         && printf 'base1\\nbase2\\nA-added\\n' > src/lib.rs",
    );
    // Under INT-B: one line of the new file changed by sed -i, and a doc.
    tm.sh_ok(
        "echo INT-B > .intentfs/intent && sed -i 's/a2/b2/' src/parser.rs \
         && mkdir -p docs && printf 'doc1\\ndoc2\\n' > docs/parser.md",
    );
    // The agent commits through the mount (INT-B's scope covers every path).
    tm.sh_ok("git add -A && git commit -qm 'parser and docs'");
    let agent_commit = git_ws(&tm.ws, "git rev-parse HEAD").trim().to_string();
    tm.stop();
    // A human's commit, outside the mount: nothing of it is in the ledger.
    git_ws(
        &tm.ws,
        "echo human >> src/lib.rs && git commit -qam 'human edit'",
    );
    let human_commit = git_ws(&tm.ws, "git rev-parse HEAD").trim().to_string();

    let report = notes_json(&[], &tm.ws);
    assert_eq!(report["ref"], "refs/notes/intentfs");
    let c = entry_for(&report, &agent_commit);
    assert_eq!(c["status"], "written", "{c:#}");
    assert_eq!(entry_for(&report, &human_commit)["status"], "skipped");

    // The note, as git shows it.
    let shown = git_ws(
        &tm.ws,
        &format!("git notes --ref refs/notes/intentfs show {agent_commit}"),
    );
    assert_eq!(
        shown,
        c["note"].as_str().unwrap(),
        "--json prints what was written"
    );
    assert!(
        shown.starts_with(&format!(
            "intentfs: attribution of {agent_commit} from the ledger\n"
        )),
        "{shown}"
    );
    assert!(
        shown.contains("intent INT-A agent coder: src/lib.rs:3 src/parser.rs:1,3\n"),
        "{shown}"
    );
    assert!(
        shown.contains("intent INT-B agent coder: docs/parser.md:1-2 src/parser.rs:2\n"),
        "{shown}"
    );
    assert!(!shown.contains("not in the ledger"), "{shown}");
    assert_eq!(
        git_ws(&tm.ws, "git notes --ref intentfs list | wc -l").trim(),
        "1",
        "one note: the human's commit has none"
    );

    // Its last line is the commit's Agent Trace record.
    let rec: Value = serde_json::from_str(shown.lines().last().unwrap()).unwrap();
    assert_eq!(
        rec["vcs"],
        serde_json::json!({"type": "git", "revision": agent_commit})
    );
    assert_eq!(rec["tool"]["name"], "intentfs");
    let files = rec["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["docs/parser.md", "src/lib.rs", "src/parser.rs"]);
    let parser = &files[2]["conversations"];
    let ranges = |conv: &Value| -> Vec<(u64, u64)> {
        conv["ranges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["start_line"].as_u64().unwrap(),
                    r["end_line"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(ranges(&parser[0]), [(1, 1), (3, 3)]);
    assert_eq!(ranges(&parser[1]), [(2, 2)]);
    assert_eq!(parser[0]["contributor"]["type"], "ai");
    let meta = &rec["metadata"]["dev.intentfs"]["files"]["src/parser.rs"]["conversations"];
    assert_eq!(meta[0]["intent_id"], "INT-A");
    assert_eq!(meta[1]["intent_id"], "INT-B");
    assert_eq!(meta[1]["agent"], "coder");
    // Each conversation names the ledger entries its lines come from.
    let ledger = tm.ledger();
    for id in meta[1]["entry_ids"].as_array().unwrap() {
        let e = ledger
            .iter()
            .find(|e| e["id"] == *id)
            .expect("entry in the ledger");
        assert_eq!(e["intent_id"], "INT-B");
        assert_eq!(e["path"], "src/parser.rs");
    }

    // Again: nothing to rewrite, the notes ref does not move.
    let before = git_ws(&tm.ws, "git rev-parse refs/notes/intentfs");
    let again = notes_json(&[], &tm.ws);
    assert_eq!(entry_for(&again, &agent_commit)["status"], "unchanged");
    assert_eq!(git_ws(&tm.ws, "git rev-parse refs/notes/intentfs"), before);
    assert_eq!(
        git_ws(
            &tm.ws,
            &format!("git notes --ref intentfs show {agent_commit}")
        ),
        shown
    );

    // A range, another ref, a dry run.
    let dry = notes_json(&["--ref", "trial", "--dry-run", "HEAD~1..HEAD"], &tm.ws);
    assert_eq!(dry["ref"], "refs/notes/trial");
    assert_eq!(dry["commits"].as_array().unwrap().len(), 1, "{dry:#}");
    assert_eq!(entry_for(&dry, &human_commit)["status"], "skipped");
    let dry = notes_json(&["--ref", "trial", "--dry-run", "HEAD~2..HEAD"], &tm.ws);
    assert_eq!(entry_for(&dry, &agent_commit)["status"], "would write");
    assert!(
        !sh_in(&tm.ws, "git rev-parse -q --verify refs/notes/trial")
            .status
            .success(),
        "a dry run writes nothing"
    );
    let out = notes(&["--ref", "refs/heads/main"], &tm.ws);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("notes live under refs/notes/"), "{stderr}");

    // Text output: one line per commit, the intents under it.
    let out = notes(&["--ref", "human-readable"], &tm.ws);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains(&format!("{}  written", &agent_commit[..12])),
        "{stdout}"
    );
    assert!(
        stdout.contains("    intent INT-A agent coder: src/lib.rs:3 src/parser.rs:1,3"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 note(s) written, 0 unchanged, under refs/notes/human-readable"),
        "{stdout}"
    );
}
