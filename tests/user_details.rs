//! What a user hits first (issue 17): the agent is told what went wrong and what it may
//! select; secrets by kind, so reading code never waits for a human; no desktop, no waiting;
//! `intentfs log | head`; `intentfs verify`; commands from any directory of the workspace or
//! the mount; `run`'s exit codes; acknowledging a human's edit; ledger problems and dead
//! mounts said at mount time.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A policy whose ids are not the example's: remedies must name these.
const POLICY: &str = "intents:
  - id: FEAT-7
    name: the feature
    status: IN_PROGRESS
    owned_scope: [\"src/**\"]
  - id: DOCS-2
    name: docs
    status: PAUSED
    owned_scope: [\"docs/\"]
approval:
  out_of_scope: deny
";

#[test]
fn the_agent_is_told_what_it_may_select_and_where_to_look() {
    let tm = TestMount::builder()
        .policy(POLICY)
        .files(&[("src/a.rs", "a\n")])
        .mount();
    let le = tm.assert_sh_denied("echo x >> src/a.rs", "NO_INTENT");
    let remedy = le["remedy"].as_str().unwrap();
    assert!(
        remedy.contains("FEAT-7") && !remedy.contains("INT-001"),
        "{remedy}"
    );
    // A refused handshake explains itself in last_error, and says what can be selected.
    for (id, errno_text, why) in [
        ("NOPE", "Invalid argument", "not an intent of the policy"),
        ("DOCS-2", "Invalid argument", "PAUSED"),
    ] {
        let out = tm.sh(&format!("echo {id} > .intentfs/intent"));
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains(errno_text) || text(&out.stderr).contains("error"),
            "{}",
            text(&out.stderr)
        );
        let le = tm.last_error();
        assert_eq!(le["code"], "INVALID_INTENT", "{le:#}");
        assert!(le["message"].as_str().unwrap().contains(why), "{le:#}");
        assert!(le["remedy"].as_str().unwrap().contains("FEAT-7"), "{le:#}");
    }
    // The context tells the agent to read last_error after a refusal; every control file
    // ends with a newline.
    for f in ["context", "last_error", "intents", "session", "status"] {
        let t = tm.ctl(f);
        assert!(
            t.ends_with('\n'),
            ".intentfs/{f} does not end with a newline: {t:?}"
        );
    }
    assert!(tm.ctl("context").contains(".intentfs/last_error"));
    tm.sh_ok("echo FEAT-7 > .intentfs/intent");
    assert!(tm.ctl("context").contains(".intentfs/last_error"));
    // Selections are on record.
    let sel = tm.wait_ledger("INTENT", |e| e["mutation_type"] == "INTENT");
    assert_eq!(sel["detail"]["to"], "FEAT-7");
}

/// Code and documentation whose names contain "secret" or "credential" are not secrets:
/// reading them never waits for a human, even with the CLI channel waiting 30 s.
#[test]
fn reading_code_about_secrets_does_not_wait_for_a_human() {
    let tm = TestMount::builder()
        .policy(
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"**\"]\napproval:\n  sensitive_read: ask\n  timeout_s: 20\n",
        )
        .files(&[
            ("cargo-credential/src/secret.rs", "pub fn secret() {}\n"),
            ("docs/credential-provider-protocol.md", "# protocol\n"),
            (".env.example", "KEY=\n"),
            (".npmrc", "//registry/:_authToken=x\n"),
        ])
        .arg("--approver")
        .arg("cli")
        .mount();
    let start = Instant::now();
    let out = tm.sh_ok(
        "cat cargo-credential/src/secret.rs docs/credential-provider-protocol.md .env.example",
    );
    assert!(out.contains("pub fn secret"));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "reading code waited {:?}",
        start.elapsed()
    );
    // A real credential file still asks: refused by a human over the CLI channel.
    let mut child = Command::new("cat")
        .arg(tm.m(".npmrc"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut id = None;
    assert!(wait_until(Duration::from_secs(5), || {
        id = tm.status()["pending_approvals"]
            .as_array()
            .and_then(|a| a.first().map(|p| p["id"].to_string()));
        id.is_some()
    }));
    let r = intentfs()
        .args(["reject", id.as_deref().unwrap(), "--mount"])
        .arg(&tm.mnt)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", text(&r.stderr));
    assert!(!child.wait().unwrap().success());
}

/// Without `--approver` and without a desktop, nobody would see a request: the mount says
/// so at start, and a request the policy asks a human about is refused at once.
#[test]
fn without_a_desktop_asking_is_refused_at_once_and_the_mount_says_so() {
    require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (ws, mnt) = (root.join("ws"), root.join("mnt"));
    put(
        &ws.join(POLICY_REL),
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\"]\napproval:\n  out_of_scope: ask\n  timeout_s: 30\n",
    );
    put(&ws.join("README.md"), "r\n");
    std::fs::create_dir_all(&mnt).unwrap();
    let out = intentfs()
        .args(["mount", "--intent", "A"])
        .arg("--log")
        .arg(root.join("log"))
        .arg(&ws)
        .arg(&mnt)
        .env_remove("DBUS_SESSION_BUS_ADDRESS")
        .env("XDG_RUNTIME_DIR", "/nonexistent-runtime-dir-for-this-test")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(
        said.contains("no desktop session") && said.contains("--approver cli"),
        "{said}"
    );
    let start = Instant::now();
    let r = std::fs::write(mnt.join("README.md"), "x");
    let took = start.elapsed();
    let _ = intentfs().arg("umount").arg(&mnt).output();
    assert!(r.is_err(), "the out-of-scope write was allowed");
    assert!(
        took < Duration::from_secs(5),
        "it waited {took:?} for nobody"
    );
    assert_eq!(std::fs::read(ws.join("README.md")).unwrap(), b"r\n");
}

#[test]
fn log_into_a_closed_pipe_is_quiet_and_verify_points_to_ledger_verify() {
    let tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    for i in 0..300 {
        std::fs::write(tm.m(&format!("f{i}")), "x").unwrap();
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{BIN} log {} | head -1 >/dev/null",
            tm.ws.display()
        ))
        .output()
        .unwrap();
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let out = intentfs().args(["verify"]).arg(&tm.ws).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("intentfs ledger verify"),
        "{}",
        text(&out.stderr)
    );
}

/// `ledger verify`, `log` and `blame` find the workspace from any directory inside it or
/// inside its mount.
#[test]
fn audit_commands_find_the_workspace_from_inside_it_or_its_mount() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("src/deep/a.txt", "a\n")])
        .mount();
    std::fs::write(tm.m("src/deep/a.txt"), "b\n").unwrap();
    for dir in [tm.m("src/deep"), tm.w("src/deep"), tm.mnt.clone()] {
        let v = intentfs()
            .args(["ledger", "verify"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            v.status.success(),
            "from {}: {}{}",
            dir.display(),
            text(&v.stdout),
            text(&v.stderr)
        );
        let l = intentfs()
            .args(["log", "--json"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            text(&l.stdout).contains("src/deep/a.txt"),
            "from {}: {}",
            dir.display(),
            text(&l.stderr)
        );
    }
    let b = intentfs()
        .args(["blame", "a.txt"])
        .current_dir(tm.m("src/deep"))
        .output()
        .unwrap();
    assert!(
        b.status.success() && text(&b.stdout).contains("ALL"),
        "{}{}",
        text(&b.stdout),
        text(&b.stderr)
    );
}

#[test]
fn run_exits_127_and_126_like_a_shell() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .files(&[("noexec.sh", "#!/bin/sh\necho hi\n")])
        .mount();
    let run = |cmd: &str| {
        intentfs()
            .arg("run")
            .arg("--mount")
            .arg(&tm.mnt)
            .args(["--intent", "ALL", "--", cmd])
            .current_dir(&tm.mnt)
            .output()
            .unwrap()
    };
    assert_eq!(run("/no/such/command").status.code(), Some(127));
    assert_eq!(
        run(&tm.m("noexec.sh").display().to_string()).status.code(),
        Some(126)
    );
}

/// The agent `intentfs run` starts can be stopped: it starts with no signal blocked (the
/// forwarded ones are blocked in `run` itself, to read and pass them on), so a TERM from
/// `timeout`, or Ctrl-C, ends it. Found open: HUP, INT, TERM and WINCH stayed blocked in the
/// agent, and `timeout 2 intentfs run -- sleep 30` took 30 s.
#[test]
fn the_agent_of_run_starts_with_no_signal_blocked_and_timeout_stops_it() {
    let tm = TestMount::builder().policy(ALLOW_ALL).mount();
    let out = intentfs()
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args([
            "--intent",
            "ALL",
            "--",
            "grep",
            "SigBlk",
            "/proc/self/status",
        ])
        .output()
        .unwrap();
    assert_eq!(
        ok(out, "intentfs run -- grep SigBlk")
            .split_whitespace()
            .nth(1),
        Some("0000000000000000")
    );
    let t0 = Instant::now();
    let st = Command::new("timeout")
        .arg("2")
        .arg(BIN)
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args(["--intent", "ALL", "--", "sleep", "30"])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(124), "timeout's own exit status");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "a TERM did not stop the agent: {:?}",
        t0.elapsed()
    );
}

/// A human's edit outside the mount keeps `ledger verify` red until someone acknowledges
/// it; the acknowledgement is an entry, through the daemon when mounted, else directly.
#[test]
fn a_human_edit_is_acknowledged_into_the_record() {
    let mut tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    std::fs::write(tm.m("a.txt"), "agent\n").unwrap();
    std::fs::write(tm.m("b.txt"), "agent\n").unwrap();
    std::fs::write(tm.w("a.txt"), "human\n").unwrap();
    std::fs::remove_file(tm.w("b.txt")).unwrap();
    let ws = tm.ws.clone();
    let verify = || {
        intentfs()
            .args(["ledger", "verify"])
            .arg(&ws)
            .output()
            .unwrap()
    };
    let v = verify();
    assert!(!v.status.success());
    assert!(text(&v.stdout).contains("a.txt") && text(&v.stdout).contains("b.txt"));
    let ack = intentfs()
        .args(["ledger", "ack"])
        .arg(&tm.ws)
        .args(["a.txt", "--note", "hotfix by alice"])
        .output()
        .unwrap();
    assert!(ack.status.success(), "{}", text(&ack.stderr));
    let v = verify();
    assert!(!text(&v.stdout).contains("a.txt"), "{}", text(&v.stdout));
    let e = tm.wait_ledger("ACK a.txt", |e| {
        e["mutation_type"] == "ACK" && e["path"] == "a.txt"
    });
    assert_eq!(e["detail"]["note"], "hotfix by alice");
    assert_eq!(e["agent"]["name"], "operator");
    // Unmounted: the CLI appends itself (here from inside the workspace).
    tm.stop();
    let ack = intentfs()
        .args(["ledger", "ack", "b.txt"])
        .current_dir(&tm.ws)
        .output()
        .unwrap();
    assert!(ack.status.success(), "{}", text(&ack.stderr));
    let v = verify();
    assert!(v.status.success(), "{}", text(&v.stdout));
    let acks: Vec<Value> = tm
        .ledger()
        .into_iter()
        .filter(|e| e["mutation_type"] == "ACK")
        .collect();
    assert_eq!(acks.len(), 2);
    assert_eq!(acks[1]["detail"]["deleted"], true);
    tm.start();
}

/// A broken ledger chain is said on the terminal at mount, not only in the log; a mount
/// over a dead mount names it and how to clear it.
#[test]
fn ledger_problems_and_dead_mounts_are_said_at_mount() {
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .daemonize()
        .mount();
    std::fs::write(tm.m("a.txt"), "x\n").unwrap();
    tm.stop();
    // Tamper with a line of the ledger.
    let l = tm.w(LEDGER_REL);
    let t = std::fs::read_to_string(&l)
        .unwrap()
        .replacen("a.txt", "z.txt", 1);
    std::fs::write(&l, t).unwrap();
    let out = intentfs()
        .args(["mount", "--intent", "ALL", "--approver", "deny"])
        .arg(&tm.ws)
        .arg(&tm.mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("warning: ledger"),
        "{}",
        text(&out.stderr)
    );
    // Kill the daemon: the mount is left dead.
    let key = tm
        .mnt
        .to_string_lossy()
        .trim_start_matches('/')
        .replace(['/', ' '], "_");
    let pid: i32 =
        std::fs::read_to_string(std::path::Path::new("/run/intentfs").join(key).join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(300));
    let out = intentfs()
        .args(["mount", "--intent", "ALL", "--approver", "deny"])
        .arg(&tm.ws)
        .arg(&tm.mnt)
        .output()
        .unwrap();
    let _ = Command::new("umount").arg("-l").arg(&tm.mnt).status();
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(e.contains("dead FUSE mount") && e.contains("umount"), "{e}");
}
