//! Human approvals end to end: a real mount, real agent processes whose syscalls block on a
//! question, and a person answering through `intentfs approvals` / `approve` / `reject`
//! (the CLI socket) or through a real notification daemon (dunst on a private D-Bus session
//! bus and Xvfb, as in tests/approval_desktop.rs).
//!
//! The policy (written by each test) scopes INT-001 to `src/**` and asks a human for
//! out-of-scope writes, sensitive reads (`.env`) and deletes.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// The notification daemon and its watchdog are killed by pid (the watchdog outlives a
// killed test process on purpose), not waited for.
#![allow(clippy::zombie_processes)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// How long a blocked agent may take to return once its question is decided.
const ANSWERED: Duration = Duration::from_secs(5);

fn policy(timeout_s: u32) -> String {
    format!(
        r#"intents:
  - id: INT-001
    name: Approvals under test
    status: IN_PROGRESS
    owned_scope:
      - "src/**"
approval:
  out_of_scope: ask
  sensitive_read: ask
  delete: ask
  timeout_s: {timeout_s}
"#
    )
}

/// Workspace files every test starts with (README.md deliberately absent: writing it
/// creates an out-of-scope file).
const FILES: &[(&str, &str)] = &[
    ("src/x", "keep\n"),
    ("src/lib.rs", "fn main() {}\n"),
    (".env", "SECRET=hunter2\n"),
    ("docs/f0.md", "old\n"),
    ("docs/f1.md", "old\n"),
    ("docs/f2.md", "old\n"),
    ("docs/f3.md", "old\n"),
    ("docs/f4.md", "old\n"),
    ("docs/f5.md", "old\n"),
    ("docs/f6.md", "old\n"),
    ("docs/f7.md", "old\n"),
    ("docs/f8.md", "old\n"),
    ("docs/f9.md", "old\n"),
];

/// A mount whose questions go to the CLI channel.
fn cli_mount(timeout_s: u32) -> TestMount {
    TestMount::builder()
        .policy(&policy(timeout_s))
        .intent("INT-001")
        .agent("tester")
        .files(FILES)
        .arg("--approver")
        .arg("cli")
        .mount()
}

// ----- agents ------------------------------------------------------------------------

static AGENTS: AtomicU32 = AtomicU32::new(0);

/// An agent process: `sh -c SCRIPT` with the mount as its working directory.
struct Agent {
    child: Option<Child>,
    script: String,
    out: PathBuf,
    err: PathBuf,
}

/// How an agent ended.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Done {
    fn assert_ok(&self, what: &str) {
        assert!(
            self.status.success(),
            "{what}: expected success, got {}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
    fn assert_eacces(&self, what: &str) {
        assert!(
            !self.status.success() && self.stderr.contains("Permission denied"),
            "{what}: expected EACCES, got {}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

fn agent(tm: &TestMount, script: &str) -> Agent {
    let n = AGENTS.fetch_add(1, Ordering::Relaxed);
    let out = tm.root.join(format!("agent{n}.out"));
    let err = tm.root.join(format!("agent{n}.err"));
    let child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(&tm.mnt)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawning an agent");
    Agent {
        child: Some(child),
        script: script.into(),
        out,
        err,
    }
}

impl Agent {
    fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits (at most `max`) for the agent to end; panics if it does not.
    fn wait(&mut self, max: Duration) -> Done {
        let start = Instant::now();
        let c = self.child.as_mut().expect("agent already waited for");
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                self.child = None;
                return Done {
                    status,
                    stdout: std::fs::read_to_string(&self.out).unwrap_or_default(),
                    stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
                };
            }
            assert!(
                start.elapsed() < max,
                "agent `{}` still blocked after {max:?}",
                self.script
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // A failed test may leave an agent blocked on a question: kill it (a fatal signal
        // aborts the FUSE request); never hang here.
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

// ----- the CLI channel -----------------------------------------------------------------

fn cli(args: &[&str]) -> std::process::Output {
    intentfs().args(args).stdin(Stdio::null()).output().unwrap()
}

fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    ok(out, &format!("intentfs {}", args.join(" ")))
}

fn mnt(tm: &TestMount) -> &str {
    tm.mnt.to_str().unwrap()
}

/// Polls the listing until a request for `path` shows up (5 s); returns it.
fn wait_pending(tm: &TestMount, path: &str) -> Value {
    let mut last = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        last = tm.pending();
        if let Some(p) = last.iter().find(|p| p["path"] == path) {
            assert!(p["id"].is_u64(), "request without a numeric id: {p}");
            return p.clone();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("no pending request for {path} after 5 s; pending: {last:#?}")
}

fn id_of(p: &Value) -> String {
    p["id"].as_u64().unwrap().to_string()
}

fn approve(tm: &TestMount, p: &Value, flag: Option<&str>) -> String {
    let id = id_of(p);
    let mut args = vec!["approve", id.as_str()];
    args.extend(flag);
    args.extend(["--mount", mnt(tm)]);
    cli_ok(&args)
}

fn reject(tm: &TestMount, p: &Value) -> String {
    cli_ok(&["reject", &id_of(p), "--mount", mnt(tm)])
}

/// APPROVAL ledger entries about `path`.
fn approvals_for(tm: &TestMount, path: &str) -> Vec<Value> {
    tm.ledger()
        .into_iter()
        .filter(|e| e["mutation_type"] == "APPROVAL" && e["path"] == path)
        .collect()
}

/// Waits for the `n`th APPROVAL entry about `path` and returns it.
fn nth_approval(tm: &TestMount, path: &str, n: usize) -> Value {
    let mut got = Vec::new();
    wait_until(Duration::from_secs(5), || {
        got = approvals_for(tm, path);
        got.len() > n
    });
    got.get(n).cloned().unwrap_or_else(|| {
        panic!(
            "no APPROVAL entry #{n} for {path}; ledger: {:#?}",
            tm.ledger()
        )
    })
}

fn assert_decision(e: &Value, outcome: &str, by: &str, grant: Option<&str>) {
    assert_eq!(e["outcome"], outcome, "{e:#}");
    assert_eq!(e["detail"]["decided_by"], by, "{e:#}");
    match grant {
        Some(g) => assert_eq!(e["detail"]["grant"], g, "{e:#}"),
        None => assert!(e["detail"]["grant"].is_null(), "{e:#}"),
    }
    assert!(e["detail"]["latency_ms"].is_u64(), "latency_ms: {e:#}");
    assert!(e["detail"]["op"].is_string(), "what was asked: {e:#}");
    assert!(e["agent"]["name"] == "tester", "who asked: {e:#}");
    assert!(e["timestamp"].is_string(), "when: {e:#}");
}

/// Approves every listed question, then waits for agent `i` (which wrote `new{i}` to
/// `docs/{stem}{i}.md`) to end well with its write landed.
fn approve_all_landing(tm: &TestMount, listed: &[Value], agents: &mut [Agent], stem: &str) {
    for p in listed {
        approve(tm, p, None);
    }
    for (i, a) in agents.iter_mut().enumerate() {
        a.wait(ANSWERED).assert_ok(&format!("agent {i}"));
        assert_eq!(
            tm.ws_bytes(&format!("docs/{stem}{i}.md")),
            format!("new{i}\n").as_bytes()
        );
    }
}

fn last_error_code(tm: &TestMount) -> String {
    tm.last_error()["code"].as_str().unwrap_or("").to_string()
}

// ----- 1. the CLI channel --------------------------------------------------------------

#[test]
fn cli_approve_once_lands_the_write_then_reject_answers_eacces() {
    let tm = cli_mount(10);
    let mut a = agent(&tm, "echo x > README.md");
    let p = wait_pending(&tm, "README.md");
    assert_eq!(p["kind"], "out_of_scope", "{p}");
    assert_eq!(p["identity"], "default", "{p}");
    assert_eq!(p["intent"], "INT-001", "{p}");
    assert_eq!(p["agent"], "tester", "{p}");
    assert!(p["op"].is_string() && p["age_ms"].is_u64(), "{p}");
    // The human table lists it too.
    let table = cli_ok(&["approvals", mnt(&tm)]);
    assert!(
        table.contains(&id_of(&p)) && table.contains("README.md"),
        "{table}"
    );

    // The agent's syscall waits for the human; nothing has landed.
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.running(), "the agent did not wait for the decision");
    assert!(!tm.w("README.md").exists());

    let said = approve(&tm, &p, None);
    assert!(
        said.contains(&format!("approved request {}", id_of(&p))),
        "{said}"
    );
    a.wait(ANSWERED).assert_ok("approved write");
    assert_eq!(tm.ws_bytes("README.md"), b"x\n");
    let e = nth_approval(&tm, "README.md", 0);
    assert_decision(&e, "approved", "cli:uid=0", Some("once"));
    assert!(e["detail"]["latency_ms"].as_u64().unwrap() >= 250, "{e:#}");
    assert!(tm.pending().is_empty());

    // Decided means decided: a second answer is refused.
    let again = cli(&["approve", &id_of(&p), "--mount", mnt(&tm)]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no pending request"),
        "{again:?}"
    );

    // "once" is once: the next write asks again, and this time the human says no.
    let mut b = agent(&tm, "echo y > README.md");
    let p2 = wait_pending(&tm, "README.md");
    assert_ne!(p2["id"], p["id"]);
    reject(&tm, &p2);
    b.wait(ANSWERED).assert_eacces("rejected write");
    assert_eq!(tm.ws_bytes("README.md"), b"x\n");
    let le = tm.last_error();
    assert_eq!(le["code"], "APPROVAL_REJECTED", "{le:#}");
    assert_eq!(le["path"], "README.md", "{le:#}");
    let e = nth_approval(&tm, "README.md", 1);
    assert_decision(&e, "rejected", "cli:uid=0", None);
}

#[test]
fn nobody_answering_times_out_with_approval_timeout() {
    let tm = cli_mount(2);
    let mut a = agent(&tm, "echo x > README.md");
    let start = Instant::now();
    wait_pending(&tm, "README.md");
    let done = a.wait(Duration::from_secs(10));
    let waited = start.elapsed();
    done.assert_eacces("unanswered write");
    assert!(
        waited >= Duration::from_millis(1500),
        "answered after {waited:?}, before the 2 s timeout"
    );
    assert_eq!(last_error_code(&tm), "APPROVAL_TIMEOUT");
    assert!(!tm.w("README.md").exists());
    let e = nth_approval(&tm, "README.md", 0);
    assert_decision(&e, "timeout", "timeout", None);
    assert!(tm.pending().is_empty());
}

#[test]
fn grant_for_file_stops_asking_for_that_file_only() {
    let tm = cli_mount(10);
    let mut a = agent(&tm, "echo one > README.md");
    let p = wait_pending(&tm, "README.md");
    let said = approve(&tm, &p, Some("--for-file"));
    assert!(said.contains("for this file"), "{said}");
    a.wait(ANSWERED).assert_ok("approved write");
    assert_decision(
        &nth_approval(&tm, "README.md", 0),
        "approved",
        "cli:uid=0",
        Some("file"),
    );

    // Same file again (a new process, same identity): no question.
    let mut b = agent(&tm, "echo two > README.md && echo three >> README.md");
    b.wait(ANSWERED).assert_ok("write under a file grant");
    assert_eq!(tm.ws_bytes("README.md"), b"two\nthree\n");
    assert_eq!(approvals_for(&tm, "README.md").len(), 1, "asked again");

    // Another file still asks.
    let mut c = agent(&tm, "echo no > docs/f0.md");
    let p = wait_pending(&tm, "docs/f0.md");
    reject(&tm, &p);
    c.wait(ANSWERED).assert_eacces("another file");
    assert_eq!(tm.ws_bytes("docs/f0.md"), b"old\n");
}

#[test]
fn grant_expand_scope_is_recorded_and_applies() {
    let tm = cli_mount(10);
    let mut a = agent(&tm, "echo one > docs/f0.md");
    let p = wait_pending(&tm, "docs/f0.md");
    let said = approve(&tm, &p, Some("--expand-scope"));
    assert!(said.contains("expanded"), "{said}");
    a.wait(ANSWERED).assert_ok("approved write");
    assert_eq!(tm.ws_bytes("docs/f0.md"), b"one\n");
    assert_decision(
        &nth_approval(&tm, "docs/f0.md", 0),
        "approved",
        "cli:uid=0",
        Some("expand_scope"),
    );

    let text = std::fs::read_to_string(tm.w(".orchestration/pending_scope_updates.json"))
        .expect("pending_scope_updates.json in the workspace");
    let v: Value = serde_json::from_str(&text).unwrap();
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {text}"));
    assert_eq!(arr.len(), 1, "{text}");
    let glob = arr[0]["glob"].as_str().unwrap_or_else(|| panic!("{text}"));
    assert!(
        globset::Glob::new(glob)
            .unwrap()
            .compile_matcher()
            .is_match("docs/f0.md"),
        "the recorded glob {glob:?} does not cover the path"
    );
    assert_eq!(arr[0]["intent"], "INT-001", "{text}");
    assert_eq!(arr[0]["identity"], "default", "{text}");

    // Later writes to that path do not ask.
    let mut b = agent(&tm, "echo two > docs/f0.md");
    b.wait(ANSWERED).assert_ok("write under the expanded scope");
    assert_eq!(tm.ws_bytes("docs/f0.md"), b"two\n");
    assert_eq!(approvals_for(&tm, "docs/f0.md").len(), 1, "asked again");
}

// ----- 2. sensitive reads and deletes ------------------------------------------------

#[test]
fn sensitive_read_asks_and_approval_prints_the_content() {
    let tm = cli_mount(10);
    let mut a = agent(&tm, "cat .env");
    let p = wait_pending(&tm, ".env");
    assert_eq!(p["kind"], "sensitive_read", "{p}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(a.running());
    assert_eq!(
        std::fs::read_to_string(&a.out).unwrap(),
        "",
        "read before approval"
    );
    approve(&tm, &p, None);
    let done = a.wait(ANSWERED);
    done.assert_ok("approved read");
    assert_eq!(done.stdout, "SECRET=hunter2\n");
    assert_decision(
        &nth_approval(&tm, ".env", 0),
        "approved",
        "cli:uid=0",
        Some("once"),
    );

    // Once: the next read asks again; rejected, nothing is printed.
    let mut b = agent(&tm, "cat .env");
    let p = wait_pending(&tm, ".env");
    reject(&tm, &p);
    let done = b.wait(ANSWERED);
    done.assert_eacces("rejected read");
    assert_eq!(done.stdout, "");
    assert_eq!(last_error_code(&tm), "APPROVAL_REJECTED");
}

#[test]
fn delete_asks_rejection_keeps_the_file_approval_deletes_it() {
    let tm = cli_mount(10);
    let mut a = agent(&tm, "rm src/x");
    let p = wait_pending(&tm, "src/x");
    assert_eq!(p["kind"], "delete", "{p}");
    reject(&tm, &p);
    a.wait(ANSWERED).assert_eacces("rejected delete");
    assert_eq!(tm.ws_bytes("src/x"), b"keep\n");
    let le = tm.last_error();
    assert_eq!(le["code"], "APPROVAL_REJECTED", "{le:#}");
    assert_eq!(le["path"], "src/x", "{le:#}");
    assert_decision(
        &nth_approval(&tm, "src/x", 0),
        "rejected",
        "cli:uid=0",
        None,
    );

    let mut b = agent(&tm, "rm src/x");
    let p = wait_pending(&tm, "src/x");
    approve(&tm, &p, None);
    b.wait(ANSWERED).assert_ok("approved delete");
    assert!(!tm.w("src/x").exists());
    tm.wait_ledger("DELETE src/x", |e| {
        e["mutation_type"] == "DELETE" && e["path"] == "src/x"
    });
}

// ----- 3. many prompts at once -----------------------------------------------------

#[test]
fn ten_prompts_pending_while_other_work_stays_fast() {
    let tm = cli_mount(60);
    // Ten agents edit ten existing out-of-scope files: each blocks on its own question.
    let mut agents: Vec<Agent> = (0..10)
        .map(|i| agent(&tm, &format!("echo new{i} > docs/f{i}.md")))
        .collect();
    let listed = tm.pending_count(10, Duration::from_secs(10));
    let mut paths: Vec<&str> = listed.iter().map(|p| p["path"].as_str().unwrap()).collect();
    paths.sort();
    assert_eq!(
        paths,
        (0..10).map(|i| format!("docs/f{i}.md")).collect::<Vec<_>>()
    );

    // Meanwhile, in-scope work through the same mount by the same identity. This is a
    // liveness check (nothing waits behind the parked requests), not a benchmark: the
    // bound is generous for a loaded 2-core machine.
    let src = tm.m("src");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        for i in 0..100 {
            let p = src.join(format!("w{i}.txt"));
            std::fs::write(&p, format!("w{i}\n")).unwrap();
            assert_eq!(std::fs::read_to_string(&p).unwrap(), format!("w{i}\n"));
        }
        let _ = tx.send(start.elapsed());
    });
    let took = rx.recv_timeout(Duration::from_secs(30)).expect(
        "200 in-scope reads/writes did not finish (or failed) while 10 prompts were pending",
    );
    assert!(
        took < Duration::from_secs(10),
        "200 in-scope reads/writes took {took:?} while 10 prompts were pending"
    );
    assert_eq!(tm.ws_bytes("src/w99.txt"), b"w99\n");
    assert_eq!(tm.pending().len(), 10, "the prompts are still waiting");
    assert!(agents.iter_mut().all(|a| a.running()));

    approve_all_landing(&tm, &listed, &mut agents, "f");
    assert!(tm.pending().is_empty());
}

/// An agent that asks question after question: past `MAX_PENDING_PER_IDENTITY` (16)
/// waiting at once, the next is refused at once (`APPROVALS_PENDING`) and never reaches
/// the human; the waiting ones are unaffected and land when approved. (Over
/// FUSE-over-io_uring every waiting request holds a ring entry of its CPU: without the
/// limit one agent could stall that CPU's requests for every agent.)
#[test]
fn an_agent_cannot_park_more_than_sixteen_questions() {
    const LIMIT: usize = 16;
    // Existing files: creating in one directory would wait on its lock behind the first
    // question (docs/approvals.md, known limit), so only one would ever be asked.
    let b = (0..=LIMIT).fold(TestMount::builder(), |b, i| {
        b.file(&format!("docs/n{i}.md"), "old\n")
    });
    let tm = b
        .file("src/x", "keep\n")
        .policy(&policy(120))
        .intent("INT-001")
        .agent("tester")
        .arg("--approver")
        .arg("cli")
        .mount();
    let mut agents: Vec<Agent> = (0..LIMIT)
        .map(|i| agent(&tm, &format!("echo new{i} > docs/n{i}.md")))
        .collect();
    let listed = tm.pending_count(LIMIT, Duration::from_secs(30));

    // One more: refused at once, not asked.
    let mut extra = agent(&tm, &format!("echo over > docs/n{LIMIT}.md"));
    extra
        .wait(ANSWERED)
        .assert_eacces("the question past the limit");
    assert_eq!(last_error_code(&tm), "APPROVALS_PENDING");
    let msg = tm.last_error()["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("16 of this agent's questions"), "{msg}");
    let over = format!("docs/n{LIMIT}.md");
    assert_eq!(tm.ws_bytes(&over), b"old\n", "the refused write landed");
    let e = nth_approval(&tm, &over, 0);
    assert_eq!(e["outcome"], "rejected", "{e:#}");
    assert_eq!(e["code"], "SCOPE_VIOLATION", "what was to be asked: {e:#}");
    assert!(
        e["detail"]["decided_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("limit: 16 of this agent's questions")),
        "{e:#}"
    );
    let denial = tm
        .ledger()
        .into_iter()
        .find(|e| e["mutation_type"] == "DENIAL" && e["path"] == over.as_str())
        .unwrap_or_else(|| panic!("no DENIAL entry for {over}: {:#?}", tm.ledger()));
    assert_eq!(denial["code"], "APPROVALS_PENDING", "{denial:#}");
    assert_eq!(tm.pending().len(), LIMIT, "the human saw no 17th question");

    // The waiting ones still land once approved, and then there is room again.
    approve_all_landing(&tm, &listed, &mut agents, "n");
    let mut again = agent(&tm, &format!("echo later > {over}"));
    let p = wait_pending(&tm, &over);
    approve(&tm, &p, None);
    again
        .wait(ANSWERED)
        .assert_ok("a question once the others were answered");
    assert_eq!(tm.ws_bytes(&over), b"later\n");
}

// ----- 4. who may decide ----------------------------------------------------------

/// The mount's runtime directory as the mounting user (root) sees it
/// (`src/cli/runtime.rs`: `/run/intentfs/<mountpoint with / and odd chars as _>`).
fn runtime_dir(mp: &Path) -> PathBuf {
    PathBuf::from("/run/intentfs").join(runtime_key(mp))
}

fn runtime_key(mp: &Path) -> String {
    mp.to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Runs the binary as uid/gid 65534 (nobody) with no supplementary groups.
fn as_nobody(args: &[&str], xdg: Option<&Path>) -> std::process::Output {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        BIN,
    ])
    .args(args)
    .env("LC_ALL", "C")
    .env_remove("XDG_RUNTIME_DIR")
    .env_remove("DBUS_SESSION_BUS_ADDRESS")
    .env("HOME", "/")
    .current_dir("/")
    .stdin(Stdio::null());
    if let Some(x) = xdg {
        c.env("XDG_RUNTIME_DIR", x);
    }
    c.output().expect("running setpriv")
}

/// A directory that exposes the mount's control socket to uid 65534 through a hard link
/// with mode 0666, as if someone loosened the permissions: only the daemon's peer check
/// is left. Removed on drop.
struct Exposed {
    dir: PathBuf,
}

impl Exposed {
    fn new(mp: &Path) -> Exposed {
        let sock = runtime_dir(mp).join("control.sock");
        // Under /run, so that the link is on the socket's filesystem.
        let dir = PathBuf::from(format!(
            "/run/intentfs-approvals-test-{}-{}",
            std::process::id(),
            AGENTS.fetch_add(1, Ordering::Relaxed)
        ));
        let sub = dir.join("intentfs").join(runtime_key(mp));
        std::fs::create_dir_all(&sub).unwrap();
        // A runtime directory of uid 65534's own (private, as the CLI checks it is): only
        // the socket in it is someone else's.
        for d in [dir.clone(), dir.join("intentfs"), sub.clone()] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        }
        std::fs::hard_link(&sock, sub.join("control.sock")).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        Exposed { dir }
    }
}

impl Drop for Exposed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn daemon_log(tm: &TestMount) -> String {
    std::fs::read_to_string(tm.stderr_path()).unwrap_or_default()
}

#[test]
fn the_approval_socket_refuses_another_uid() {
    let tm = cli_mount(30);
    let mut a = agent(&tm, "echo x > README.md");
    let p = wait_pending(&tm, "README.md");
    let id = id_of(&p);

    // The socket lives in the owner's private runtime directory.
    let rt = runtime_dir(&tm.mnt);
    let md = std::fs::metadata(&rt).unwrap();
    assert_eq!(
        (md.uid(), md.mode() & 0o777),
        (0, 0o700),
        "{}",
        rt.display()
    );
    let sm = std::fs::symlink_metadata(rt.join("control.sock")).unwrap();
    assert_eq!(sm.mode() & 0o777, 0o600);

    // Another uid: every command fails, says why, and decides nothing.
    for args in [
        vec!["approvals", mnt(&tm)],
        vec!["approve", id.as_str(), "--mount", mnt(&tm)],
        vec!["reject", id.as_str(), "--mount", mnt(&tm)],
    ] {
        let out = as_nobody(&args, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} as uid 65534 succeeded: {out:?}"
        );
        assert!(
            err.contains("socket")
                && (err.contains("user who mounted") || err.contains("permission")),
            "{args:?} as uid 65534: unclear message: {err}"
        );
    }

    // Even when the socket file is reachable and world-writable, the daemon checks the
    // peer's credentials.
    let exposed = Exposed::new(&tm.mnt);
    let xdg = exposed.dir.clone();
    for args in [
        vec!["approve", id.as_str(), "--mount", mnt(&tm)],
        vec!["reject", id.as_str(), "--mount", mnt(&tm)],
        vec!["approvals", "--json", mnt(&tm)],
    ] {
        let out = as_nobody(&args, Some(&xdg));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} through the exposed socket: {out:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        // The refusal text is what the daemon sends; see
        // `the_refusal_reaches_another_uid_every_time` for why a transport error is
        // accepted here.
        assert!(
            err.contains("uid 65534 may not use the approval socket")
                || err.contains("Broken pipe")
                || err.contains("Connection reset"),
            "{args:?}: {err}"
        );
    }
    drop(exposed);
    assert!(
        daemon_log(&tm).contains("refused a connection from another uid"),
        "the daemon did not log the refusal"
    );

    // No decision was made: the request waits, and so does the agent.
    assert!(tm.pending().iter().any(|q| q["id"] == p["id"]));
    assert!(a.running());
    assert!(approvals_for(&tm, "README.md").is_empty());
    reject(&tm, &p);
    a.wait(ANSWERED).assert_eacces("rejected by the owner");
    assert_decision(
        &nth_approval(&tm, "README.md", 0),
        "rejected",
        "cli:uid=0",
        None,
    );
}

#[test]
fn an_agent_cannot_approve_through_the_mount() {
    let tm = cli_mount(30);
    // (An existing file: a pending create would hold the root directory's lock, see
    // `a_pending_create_does_not_block_its_directory`.)
    let mut a = agent(&tm, "echo x > docs/f0.md");
    let p = wait_pending(&tm, "docs/f0.md");

    // What an agent could try from inside the mount: a control file to approve with, a
    // socket to talk to, or writing the scope record itself.
    let ls = tm.sh_ok("ls -a .intentfs");
    for name in ["approve", "approvals", "reject", "control.sock"] {
        assert!(!ls.lines().any(|l| l == name), ".intentfs has {name}: {ls}");
    }
    for script in [
        &format!("echo {} > .intentfs/approve", id_of(&p)),
        &format!("echo approve {} > .intentfs/approvals", id_of(&p)),
        "echo '[{\"glob\":\"**\"}]' > .orchestration/pending_scope_updates.json",
    ] {
        let out = tm.sh(script);
        assert!(!out.status.success(), "`{script}` succeeded in the mount");
    }
    let socks = tm.sh_ok("find . -type s 2>/dev/null; true");
    assert_eq!(socks.trim(), "", "sockets reachable through the mount");
    assert!(!tm.w(".orchestration/pending_scope_updates.json").exists());

    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.running(),
        "the agent's request was decided from inside the mount"
    );
    assert!(tm.pending().iter().any(|q| q["id"] == p["id"]));
    assert_eq!(tm.ws_bytes("docs/f0.md"), b"old\n");
    assert!(approvals_for(&tm, "docs/f0.md").is_empty());
    reject(&tm, &p);
    a.wait(ANSWERED).assert_eacces("rejected");
}

// ----- 5. the desktop channel ----------------------------------------------------------

/// A private desktop: Xvfb, a session dbus-daemon, dunst whose dmenu is a script that picks
/// the action the test wants (copied from tests/approval_desktop.rs, plus the display).
struct Desk {
    dir: PathBuf,
    bus: String,
    display: String,
    pids: Vec<u32>,
}

impl Drop for Desk {
    fn drop(&mut self) {
        for p in &self.pids {
            // SAFETY: signalling processes this test started.
            unsafe { libc::kill(*p as i32, libc::SIGTERM) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

fn first_line(child: &mut Child, what: &str) -> String {
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let line = line.trim().to_string();
    assert!(
        !line.is_empty(),
        "{what} exited without printing its address"
    );
    line
}

fn start_desk() -> Desk {
    let dir = tempfile::Builder::new()
        .prefix("intentfs-desk-")
        .tempdir()
        .unwrap()
        .keep();
    let mut pids = Vec::new();
    let mut x = Command::new("Xvfb")
        .args([
            "-displayfd",
            "1",
            "-nolisten",
            "tcp",
            "-screen",
            "0",
            "1024x768x24",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb");
    pids.push(x.id());
    let display = format!(":{}", first_line(&mut x, "Xvfb"));

    let conf = dir.join("bus.conf");
    std::fs::write(
        &conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"#,
            dir.join("bus").display()
        ),
    )
    .unwrap();
    let mut bus = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf.display()))
        .args(["--nofork", "--print-address=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbus-daemon");
    pids.push(bus.id());
    let address = first_line(&mut bus, "dbus-daemon");

    // dunst's action menu: picks the line whose text contains the wanted pattern and whose
    // action key is the wanted key ("#<label> (<summary>) [<id>,<key>]").
    let script = dir.join("dmenu.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nwant='{want}'\npat=$(sed -n 1p \"$want\")\nkey=$(sed -n 2p \"$want\")\n: > \"$want\"\n\
             menu=$(cat)\nprintf '%s\\n---\\n' \"$menu\" >> '{log}'\n\
             printf '%s\\n' \"$menu\" | grep -F -e \"$pat\" | grep -F -e \",$key]\" | head -n 1\n",
            want = dir.join("want").display(),
            log = dir.join("menus.log").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("want"), "").unwrap();
    let rc = dir.join("dunstrc");
    std::fs::write(
        &rc,
        format!(
            "[global]\n    dmenu = {} -p dunst\n    browser = /bin/true\n    notification_limit = 0\n    idle_threshold = 0\n\
             [urgency_low]\n    timeout = 0\n[urgency_normal]\n    timeout = 0\n[urgency_critical]\n    timeout = 0\n",
            script.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("dunst.log")).unwrap();
    let dunst = Command::new("dunst")
        .arg("-config")
        .arg(&rc)
        .env("DISPLAY", &display)
        .env("DBUS_SESSION_BUS_ADDRESS", &address)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("dunst");
    pids.push(dunst.id());

    // Nothing outlives the test process, even if it is killed: a watchdog.
    let pid_list: Vec<String> = pids.iter().map(u32::to_string).collect();
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill {pids} 2>/dev/null",
            me = std::process::id(),
            pids = pid_list.join(" "),
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("watchdog");

    let d = Desk {
        dir,
        bus: address,
        display,
        pids,
    };
    let start = Instant::now();
    while try_dunstctl(&d, &["count", "displayed"]).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "dunst did not come up: {}",
            std::fs::read_to_string(d.dir.join("dunst.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d
}

fn try_dunstctl(d: &Desk, args: &[&str]) -> Option<String> {
    let out = Command::new("dunstctl")
        .args(args)
        .env("DBUS_SESSION_BUS_ADDRESS", &d.bus)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn dunstctl(d: &Desk, args: &[&str]) -> String {
    try_dunstctl(d, args).unwrap_or_else(|| panic!("dunstctl {args:?} failed"))
}

fn wait_displayed(d: &Desk, n: usize) {
    let start = Instant::now();
    loop {
        let now: usize = dunstctl(d, &["count", "displayed"]).trim().parse().unwrap();
        if now == n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "dunst shows {now} notifications, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// One prompt on screen, and its thread listening for actions (a few D-Bus round trips
/// after it appears: a person is never that fast, a script is).
fn wait_one_prompt(d: &Desk) {
    wait_displayed(d, 1);
    std::thread::sleep(Duration::from_millis(400));
}

/// Acts as the person: opens dunst's action menu and picks `key` on the notification
/// whose text contains `pattern`.
fn choose(d: &Desk, pattern: &str, key: &str) {
    std::fs::write(d.dir.join("want"), format!("{pattern}\n{key}\n")).unwrap();
    dunstctl(d, &["context"]);
}

/// A `--approver desktop` mount whose daemon finds the desktop through its environment
/// (the common harness strips DBUS_SESSION_BUS_ADDRESS from the daemon's).
struct DeskMount {
    tm: TestMount,
    child: Option<Child>,
}

impl DeskMount {
    fn new(d: &Desk, timeout_s: u32) -> DeskMount {
        // A TestMount for the workspace and helpers; its own daemon is replaced by ours.
        let mut tm = TestMount::builder()
            .policy(&policy(timeout_s))
            .intent("INT-001")
            .agent("tester")
            .files(FILES)
            .mount();
        tm.stop();
        let log = std::fs::File::create(tm.root.join("desk-daemon.stderr")).unwrap();
        let mut child = Command::new(BIN)
            .args([
                "mount",
                "--foreground",
                "--intent",
                "INT-001",
                "--agent",
                "tester",
            ])
            .args(["--approver", "desktop"])
            .arg(&tm.ws)
            .arg(&tm.mnt)
            .env("LC_ALL", "C")
            .env("DBUS_SESSION_BUS_ADDRESS", &d.bus)
            .env("DISPLAY", &d.display)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let ready = wait_until(Duration::from_secs(10), || {
            std::fs::read(tm.m(".intentfs/status")).is_ok()
                || matches!(child.try_wait(), Ok(Some(_)))
        });
        assert!(
            ready && matches!(child.try_wait(), Ok(None)),
            "the desktop mount did not come up: {}",
            std::fs::read_to_string(tm.root.join("desk-daemon.stderr")).unwrap_or_default()
        );
        DeskMount {
            tm,
            child: Some(child),
        }
    }
}

impl Drop for DeskMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child: it rejects what is pending and unmounts.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = Command::new("umount").arg("-l").arg(&self.tm.mnt).status();
                let _ = c.wait();
            }
        }
    }
}

#[test]
fn desktop_channel_against_a_real_notification_daemon() {
    for bin in ["Xvfb", "dunst", "dunstctl", "dbus-daemon"] {
        if !on_path(bin) {
            eprintln!("skipped: `{bin}` is not installed (apt-get install -y dbus xvfb dunst)");
            return;
        }
    }
    let d = start_desk();
    let dm = DeskMount::new(&d, 30);
    let tm = &dm.tm;

    // Approve through the notification's action menu.
    let mut a = agent(tm, "echo approved > docs/f1.md");
    wait_pending(tm, "docs/f1.md");
    wait_one_prompt(&d);
    choose(&d, "docs/f1.md", "approve");
    a.wait(ANSWERED).assert_ok("approved on the desktop");
    assert_eq!(tm.ws_bytes("docs/f1.md"), b"approved\n");
    assert_decision(
        &nth_approval(tm, "docs/f1.md", 0),
        "approved",
        "desktop",
        Some("once"),
    );
    wait_displayed(&d, 0);
    // The prompt named the agent, the intent, the operation and the path.
    let history = dunstctl(&d, &["history"]);
    for want in ["tester", "INT-001", "open-write", "docs/f1.md"] {
        assert!(
            history.contains(want),
            "the notification lacks {want}: {history}"
        );
    }

    // Reject through the action.
    let mut b = agent(tm, "echo rejected > docs/f2.md");
    wait_pending(tm, "docs/f2.md");
    wait_one_prompt(&d);
    choose(&d, "docs/f2.md", "reject");
    b.wait(ANSWERED).assert_eacces("rejected on the desktop");
    assert_eq!(last_error_code(tm), "APPROVAL_REJECTED");
    assert_eq!(tm.ws_bytes("docs/f2.md"), b"old\n");
    assert_decision(
        &nth_approval(tm, "docs/f2.md", 0),
        "rejected",
        "desktop",
        None,
    );
    wait_displayed(&d, 0);

    // Closing the notification rejects.
    let mut c = agent(tm, "echo closed > docs/f3.md");
    wait_pending(tm, "docs/f3.md");
    wait_one_prompt(&d);
    dunstctl(&d, &["close"]);
    c.wait(ANSWERED).assert_eacces("notification closed");
    assert_eq!(last_error_code(tm), "APPROVAL_REJECTED");
    assert_eq!(tm.ws_bytes("docs/f3.md"), b"old\n");
    assert_decision(
        &nth_approval(tm, "docs/f3.md", 0),
        "rejected",
        "desktop",
        None,
    );

    // The CLI channel works while the desktop one is in use: it answers first, and the
    // notification goes away.
    let mut e = agent(tm, "echo by-cli > docs/f4.md");
    let p = wait_pending(tm, "docs/f4.md");
    wait_one_prompt(&d);
    approve(tm, &p, None);
    e.wait(ANSWERED).assert_ok("approved from the CLI");
    assert_eq!(tm.ws_bytes("docs/f4.md"), b"by-cli\n");
    assert_decision(
        &nth_approval(tm, "docs/f4.md", 0),
        "approved",
        "cli:uid=0",
        Some("once"),
    );
    wait_displayed(&d, 0);
    // A late click on the (gone) prompt decides nothing more.
    assert_eq!(approvals_for(tm, "docs/f4.md").len(), 1);
}

// ----- 6. the circuit breaker ------------------------------------------------------

#[test]
fn circuit_breaker_trips_after_n_refusals_and_resets() {
    let tm = TestMount::builder()
        .policy(&policy(10))
        .intent("INT-001")
        .agent("tester")
        .files(FILES)
        .arg("--approver")
        .arg("deny")
        .arg("--breaker")
        .arg("5")
        .arg("--breaker-window")
        .arg("60")
        .mount();
    for i in 0..5 {
        tm.assert_denied(
            std::fs::write(tm.m(&format!("out{i}.txt")), "x"),
            "SCOPE_VIOLATION",
        );
    }
    // Tripped: every mutation, even in scope, is refused.
    tm.assert_denied(std::fs::write(tm.m("src/in.txt"), "x"), "CIRCUIT_OPEN");
    tm.assert_denied(std::fs::remove_file(tm.m("src/x")), "CIRCUIT_OPEN");
    assert!(!tm.w("src/in.txt").exists());
    assert_eq!(tm.ws_bytes("src/x"), b"keep\n");
    // Reads are not mutations.
    assert_eq!(
        std::fs::read(tm.m("src/lib.rs")).unwrap(),
        b"fn main() {}\n"
    );
    tm.wait_ledger("the trip", |e| {
        e["code"] == "CIRCUIT_OPEN" && e["outcome"] == "tripped"
    });

    let out = cli(&["reset", "nobody-such", "--mount", mnt(&tm)]);
    assert!(!out.status.success(), "{out:?}");
    tm.assert_denied(std::fs::write(tm.m("src/in.txt"), "x"), "CIRCUIT_OPEN");

    let said = cli_ok(&["reset", "default", "--mount", mnt(&tm)]);
    assert!(said.contains("reset"), "{said}");
    std::fs::write(tm.m("src/in.txt"), "after reset\n").expect("in-scope write after reset");
    assert_eq!(tm.ws_bytes("src/in.txt"), b"after reset\n");
    // Out of scope is still out of scope (and counts again).
    tm.assert_denied(std::fs::write(tm.m("out9.txt"), "x"), "SCOPE_VIOLATION");
}

// ----- 7. unmount with prompts pending ---------------------------------------------

/// Three agents blocked on questions; returns them and their requests.
fn three_blocked(tm: &TestMount) -> (Vec<Agent>, Vec<Value>) {
    let agents: Vec<Agent> = (1..=3)
        .map(|i| agent(tm, &format!("echo z > docs/f{i}.md")))
        .collect();
    let reqs = (1..=3)
        .map(|i| wait_pending(tm, &format!("docs/f{i}.md")))
        .collect();
    (agents, reqs)
}

/// Every agent returns promptly with an error; the ledger says `unmount` decided.
fn assert_released_by_unmount(tm: &TestMount, agents: &mut [Agent], daemon: &mut Child) {
    for (i, a) in agents.iter_mut().enumerate() {
        let done = a.wait(ANSWERED);
        assert!(
            !done.status.success(),
            "agent {i} succeeded: {}",
            done.stdout
        );
        let how = if done.stderr.contains("Permission denied") {
            "EACCES"
        } else if done.stderr.contains("Transport endpoint is not connected") {
            "ENOTCONN"
        } else {
            panic!("agent {i}: unexpected error: {}", done.stderr)
        };
        eprintln!("agent {i} released by the unmount with {how}");
    }
    let exited = wait_until(Duration::from_secs(10), || {
        matches!(daemon.try_wait(), Ok(Some(_)))
    });
    assert!(exited, "the daemon did not exit after the unmount");
    assert!(!is_mounted(&tm.mnt));
    for i in 1..=3 {
        let path = format!("docs/f{i}.md");
        let e = approvals_for(tm, &path);
        assert_eq!(e.len(), 1, "APPROVAL entries for {path}: {e:#?}");
        assert_decision(&e[0], "rejected", "unmount", None);
        assert_eq!(tm.ws_bytes(&path), b"old\n");
    }
    assert!(
        tm.ledger().last().unwrap()["mutation_type"] == "UNMOUNT",
        "the UNMOUNT entry comes last"
    );
}

#[test]
fn sigterm_with_prompts_pending_rejects_every_one() {
    let mut tm = cli_mount(60);
    let (mut agents, _) = three_blocked(&tm);
    let mut daemon = tm.take_child();
    let start = Instant::now();
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert_released_by_unmount(&tm, &mut agents, &mut daemon);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn intentfs_umount_with_prompts_pending_rejects_every_one() {
    let mut tm = cli_mount(60);
    let (mut agents, _) = three_blocked(&tm);
    let mut daemon = tm.take_child();
    let out = cli(&["umount", mnt(&tm)]);
    let released = out.status.success();
    if !released {
        // Release everyone before failing, so the test does not hang in teardown.
        // SAFETY: signalling the daemon this test started.
        unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    }
    assert!(
        released,
        "intentfs umount with 3 prompts pending failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_released_by_unmount(&tm, &mut agents, &mut daemon);
}

// ----- bugs found -------------------------------------------------------------------

/// Waits (at most `max`) for `a` to end; false if it is still blocked.
fn ends_within(a: &mut Agent, max: Duration) -> bool {
    wait_until(max, || !a.running())
}

#[test]
#[ignore = "KERNEL LIMIT (documented in README, Approvals): a question parked on a create holds the parent directory's lock in the \
            kernel: listing that directory, other creates there, even lookups through it block \
            (some unkillably) until the human answers or the timeout"]
fn a_pending_create_does_not_block_its_directory() {
    let tm = cli_mount(3);
    // An out-of-scope create at the root waits for a human...
    let mut a = agent(&tm, "echo x > README.md");
    wait_pending(&tm, "README.md");
    // ...while other agents list the root, and ask about another new file there.
    let mut ls = agent(&tm, "ls -a >/dev/null");
    let ls_ok = ends_within(&mut ls, Duration::from_secs(2));
    let mut b = agent(&tm, "echo y > NOTES.md");
    let both = wait_until(Duration::from_secs(2), || {
        tm.pending().iter().any(|q| q["path"] == "NOTES.md")
    });
    // Let everything time out before asserting, so teardown does not hang.
    for x in [&mut a, &mut ls, &mut b] {
        let _ = ends_within(x, Duration::from_secs(15));
    }
    assert!(
        ls_ok,
        "`ls` of the root blocked behind the pending create of README.md"
    );
    assert!(
        both,
        "a second create at the root could not even ask while README.md was pending"
    );
}

#[test]
#[ignore = "KERNEL LIMIT (documented in README, Approvals): a question parked on an unlink holds the parent directory's lock in the \
            kernel: in-scope creates next to the file block (unkillably) until the human answers \
            or the timeout"]
fn a_pending_delete_does_not_block_creates_next_to_it() {
    let tm = cli_mount(3);
    let mut a = agent(&tm, "rm src/x");
    let p = wait_pending(&tm, "src/x");
    let mut b = agent(&tm, "echo new > src/new.txt");
    let start = Instant::now();
    let b_ok = ends_within(&mut b, Duration::from_secs(2));
    let took = start.elapsed();
    let _ = cli(&["reject", &id_of(&p), "--mount", mnt(&tm)]);
    for x in [&mut a, &mut b] {
        let _ = ends_within(x, Duration::from_secs(15));
    }
    assert!(
        b_ok,
        "an in-scope create of src/new.txt was blocked by the pending delete of src/x (>{took:?})"
    );
}

#[test]
fn the_refusal_reaches_another_uid_every_time() {
    let tm = cli_mount(30);
    let exposed = Exposed::new(&tm.mnt);
    let mut unclear = Vec::new();
    for _ in 0..40 {
        let out = as_nobody(&["approvals", mnt(&tm)], Some(&exposed.dir));
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if !err.contains("uid 65534 may not use the approval socket") {
            unclear.push(err);
        }
    }
    assert!(
        unclear.is_empty(),
        "{} of 40 refusals came without the daemon's message, e.g. {}",
        unclear.len(),
        unclear[0]
    );
}
