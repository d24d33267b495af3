//! `--data passthrough` (issue 19, deliverable 3): the kernel reads and writes the backing
//! file itself; governance of data is decided at open and recorded at close.
//!
//! Real mounts and real processes: writes and mmap that never reach the daemon still end
//! on record with the content's hash; another identity's write open is refused while one
//! holds the file (the write lease); an intent switch is refused while the identity holds
//! files open for writing; a writer outside the mount during an agent's open write is
//! named at release; staleness is decided at open; `sed -i` and `git` work.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;

const TWO: &str = r#"
intents:
  - id: ALL
    name: everything
    status: IN_PROGRESS
    owned_scope: ["**"]
  - id: DOCS
    name: docs only
    status: IN_PROGRESS
    owned_scope: ["docs/**"]
"#;

fn mount(files: &[(&str, &str)]) -> TestMount {
    TestMount::builder()
        .policy(TWO)
        .intent("ALL")
        .arg("--data")
        .arg("passthrough")
        .files(files)
        .mount()
}

fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// The kernel really did the I/O: no READ or WRITE request reached the daemon.
fn requests(tm: &TestMount, op: &str) -> u64 {
    tm.status()["counters"]["requests"][op]
        .as_u64()
        .unwrap_or(0)
}

fn entries(tm: &TestMount, ty: &str, path: &str) -> Vec<Value> {
    tm.ledger()
        .into_iter()
        .filter(|e| e["mutation_type"] == ty && e["path"] == path)
        .collect()
}

/// `intentfs run --mount MNT ARGS -- sh -c SCRIPT`, from the mount.
fn run_cmd(tm: &TestMount, args: &[&str], script: &str) -> Command {
    let mut c = intentfs();
    c.arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args(args)
        .arg("--")
        .args(["sh", "-c", script])
        .current_dir(&tm.mnt);
    c
}

fn run(tm: &TestMount, args: &[&str], script: &str) -> Output {
    run_timeout(run_cmd(tm, args, script), Duration::from_secs(60))
}

/// An agent process holding `rel` open for writing (it wrote `first`), until its stdin
/// closes; returns once its write is on the page (the line it prints).
fn hold_open(tm: &TestMount, args: &[&str], rel: &str, first: &str) -> Child {
    let script = format!("exec 3>>{rel}; printf '{first}' >&3; echo held; read _; exec 3>&-");
    let mut c = run_cmd(tm, args, &script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held", "the holder did not start");
    c
}

fn release(mut c: Child) {
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "holder failed: {out:?}");
}

#[test]
fn writes_and_mmap_bypass_the_daemon_and_are_on_record_with_their_hash() {
    let tm = mount(&[("docs/a.md", "one\n")]);
    assert_eq!(tm.status()["mount"]["data"], "passthrough");
    // (Reading `.intentfs/status` is itself a few READs of a control file: how many.)
    let r0 = requests(&tm, "read");
    let reads_before = requests(&tm, "read");
    let per_status = reads_before - r0;
    // 8 MiB through write(2), and an append.
    let big: Vec<u8> = (0..8 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(tm.m("big.bin"), &big).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("docs/a.md"))
        .unwrap();
    f.write_all(b"two\n").unwrap();
    drop(f);
    // A shared mapping written after the file was created empty and sized.
    let py = format!(
        "import mmap,os\nfd=os.open('{}',os.O_RDWR|os.O_CREAT,0o644)\nos.ftruncate(fd,8192)\nm=mmap.mmap(fd,8192)\nm[100:106]=b'mapped'\nm.close()\nos.close(fd)\n",
        tm.m("docs/m.bin").display()
    );
    let out = Command::new(python()).args(["-c", &py]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // Read the big file back through the mount too: 8 READs or more if the daemon
    // served it (1 MiB a request at most).
    assert_eq!(std::fs::read(tm.m("big.bin")).unwrap(), big);
    let reads = requests(&tm, "read") - reads_before;
    assert!(
        reads <= per_status + 1,
        "{reads} READs reached the daemon (a status read takes {per_status})"
    );
    assert_eq!(requests(&tm, "write"), 0, "writes reached the daemon");
    for rel in ["big.bin", "docs/a.md", "docs/m.bin"] {
        let want = sha(&tm.ws_bytes(rel));
        assert!(
            wait_until(Duration::from_secs(5), || entries(&tm, "WRITE", rel)
                .last()
                .is_some_and(|e| e["content_hash"] == want.as_str())),
            "{rel}: no WRITE with the backing file's hash {want}: {:#?}",
            entries(&tm, "WRITE", rel)
        );
    }
    let mapped = tm.ws_bytes("docs/m.bin");
    assert_eq!(&mapped[100..106], b"mapped");
    // The append's begin was on record with the content before, and its WRITE completes it.
    let begin = entries(&tm, "WRITE_BEGIN", "docs/a.md");
    assert_eq!(begin.len(), 1, "{begin:#?}");
    assert_eq!(begin[0]["prev_content_hash"], sha(b"one\n").as_str());
    let w = entries(&tm, "WRITE", "docs/a.md");
    assert_eq!(
        w.last().unwrap()["detail"]["handle"],
        begin[0]["detail"]["handle"]
    );
    assert_eq!(
        w.last().unwrap()["prev_content_hash"],
        sha(b"one\n").as_str()
    );
    // The chain holds and nothing is unexplained.
    let out = intentfs()
        .args(["ledger", "verify"])
        .arg(&tm.ws)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn another_identity_cannot_open_a_file_held_for_writing() {
    let tm = mount(&[("docs/shared.md", "base\n")]);
    let holder = hold_open(
        &tm,
        &["--agent", "alice", "--intent", "ALL"],
        "docs/shared.md",
        "alice\\n",
    );
    // Bob's append is refused at open, naming alice; nothing of his lands.
    let out = run(
        &tm,
        &["--agent", "bob", "--intent", "ALL"],
        "echo bob >> docs/shared.md; code=$?; cat .intentfs/last_error; exit $code",
    );
    assert!(!out.status.success(), "bob's write open was allowed");
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["code"], "WRITE_LEASED", "{err:#}");
    assert!(
        err["message"].as_str().unwrap().contains("alice"),
        "the refusal does not name the holder: {err:#}"
    );
    let denial = tm
        .ledger()
        .into_iter()
        .find(|e| e["code"] == "WRITE_LEASED")
        .expect("no WRITE_LEASED denial on the ledger");
    assert_eq!(denial["agent"]["name"], "bob");
    assert_eq!(denial["path"], "docs/shared.md");
    // Reading is not writing: bob may read while alice writes.
    let out = run(
        &tm,
        &["--agent", "bob", "--intent", "ALL"],
        "cat docs/shared.md",
    );
    assert!(out.status.success(), "{out:?}");
    release(holder);
    assert_eq!(tm.ws_bytes("docs/shared.md"), b"base\nalice\n");
    // Once alice closed, bob (who read the file after alice's write) may append.
    let out = run(
        &tm,
        &["--agent", "bob", "--intent", "ALL"],
        "cat docs/shared.md >/dev/null; echo bob >> docs/shared.md",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(tm.ws_bytes("docs/shared.md"), b"base\nalice\nbob\n");
}

#[test]
fn intent_switch_is_refused_while_the_identity_holds_write_handles() {
    let tm = mount(&[("docs/x.md", "x\n")]);
    // The default identity holds docs/x.md open for writing from a Python process.
    let mut py = Command::new(python())
        .args([
            "-c",
            "import sys\nf=open('docs/x.md','a')\nf.write('y\\n'); f.flush()\nprint('held', flush=True)\nsys.stdin.read()\nf.close()\n",
        ])
        .current_dir(&tm.mnt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(py.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    let e = errno_of(std::fs::write(tm.m(".intentfs/intent"), "DOCS\n"), "switch");
    assert_eq!(e, libc::EACCES);
    let err = tm.last_error();
    assert_eq!(err["code"], "WRITES_OPEN", "{err:#}");
    assert!(
        err["message"].as_str().unwrap().contains("docs/x.md"),
        "{err:#}"
    );
    assert_eq!(tm.ctl("intent").trim(), "ALL", "the intent changed anyway");
    drop(py.stdin.take());
    assert!(py.wait().unwrap().success());
    std::fs::write(tm.m(".intentfs/intent"), "DOCS\n").unwrap();
    assert_eq!(tm.ctl("intent").trim(), "DOCS");
}

#[test]
fn a_writer_outside_the_mount_is_named_at_release_and_own_children_are_not() {
    let tm = mount(&[("docs/o.md", "start\n")]);
    // The agent's own writes, some from a child process through an inherited descriptor.
    let out = tm.sh("exec 3>>docs/o.md; echo a >&3; (echo child >&3); echo b >&3; exec 3>&-");
    assert!(out.status.success(), "{out:?}");
    let w = entries(&tm, "WRITE", "docs/o.md");
    assert!(!w.is_empty());
    assert!(
        w.iter().all(|e| e["detail"]["outside_writers"].is_null()),
        "the agent's own writes were taken for an outsider's: {w:#?}"
    );
    // Now someone writes the backing file directly while the agent holds it open.
    let mut py = Command::new(python())
        .args([
            "-c",
            "import sys\nf=open('docs/o.md','a')\nf.write('agent\\n'); f.flush()\nprint('held', flush=True)\nsys.stdin.readline()\nf.write('agent2\\n'); f.close()\n",
        ])
        .current_dir(&tm.mnt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(py.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    // (A writer that lives until the agent closed: one gone before the watcher read its
    // event cannot be told from the agent's own children, and is only named.)
    let mut outsider = Command::new(python())
        .args([
            "-c",
            &format!(
                "import sys\nf=open('{}','a')\nf.write('outside\\n'); f.flush()\nprint('done', flush=True)\nsys.stdin.read()\n",
                tm.w("docs/o.md").display()
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let outsider_pid = outsider.id();
    let mut line = String::new();
    BufReader::new(outsider.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "done");
    // Give the watcher its batch before the agent closes.
    std::thread::sleep(Duration::from_millis(200));
    py.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    drop(py.stdin.take());
    assert!(py.wait().unwrap().success());
    let want = sha(&tm.ws_bytes("docs/o.md"));
    assert!(
        wait_until(Duration::from_secs(5), || entries(
            &tm,
            "WRITE",
            "docs/o.md"
        )
        .last()
        .is_some_and(|e| e["content_hash"] == want.as_str())),
        "no WRITE with the final content"
    );
    let last = entries(&tm, "WRITE", "docs/o.md").pop().unwrap();
    let outside = last["detail"]["outside_writers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        outside.iter().any(|o| o["pid"] == outsider_pid),
        "the outside writer (pid {outsider_pid}) is not named: {last:#}"
    );
    assert_eq!(last["detail"]["superseded"], true);
    drop(outsider.stdin.take());
    assert!(outsider.wait().unwrap().success());
}

#[test]
fn staleness_and_scope_are_decided_at_open() {
    let tm = mount(&[("docs/s.md", "v1\n"), ("src/lib.rs", "fn a() {}\n")]);
    // An agent that read v1, then a human changes the file behind the mount; then her
    // write open is refused as stale and the human's content stays.
    let mut dora = run_cmd(
        &tm,
        &["--agent", "dora", "--intent", "ALL"],
        "cat docs/s.md >/dev/null; echo read; read _; echo mine > docs/s.md; code=$?; \
         cat .intentfs/last_error; exit $code",
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(dora.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "read");
    std::fs::write(tm.w("docs/s.md"), "v2 by a human\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    dora.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut out, &mut rest).unwrap();
    assert!(
        !dora.wait().unwrap().success(),
        "a stale overwrite was allowed"
    );
    let err: Value = serde_json::from_slice(&rest).unwrap();
    assert_eq!(err["code"], "STALE_FILE", "{err:#}");
    assert_eq!(tm.ws_bytes("docs/s.md"), b"v2 by a human\n");
    // Scope: an agent under DOCS cannot open src/ for writing, even with sed -i's rename.
    let out = run(
        &tm,
        &["--agent", "eve", "--intent", "DOCS"],
        "sed -i 's/a/b/' src/lib.rs",
    );
    assert!(!out.status.success());
    assert_eq!(tm.ws_bytes("src/lib.rs"), b"fn a() {}\n");
    // Inside its scope sed -i works and is on record.
    let out = run(
        &tm,
        &["--agent", "eve", "--intent", "DOCS"],
        "sed -i 's/v2/v3/' docs/s.md",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(tm.ws_bytes("docs/s.md"), b"v3 by a human\n");
    assert!(wait_until(Duration::from_secs(5), || tm
        .ledger()
        .iter()
        .any(
            |e| e["mutation_type"] == "RENAME" && e["path"] == "docs/s.md"
        )));
}

#[test]
fn git_works_and_its_objects_are_intact() {
    // (`git init` writes .git/hooks, which no agent may: the repository exists before.)
    let tm = TestMount::builder()
        .policy(TWO)
        .intent("ALL")
        .arg("--data")
        .arg("passthrough")
        .files(&[("src/main.c", "int main(void) { return 0; }\n")])
        .setup(|ws| {
            assert!(Command::new("git")
                .args(["init", "-q"])
                .arg(ws)
                .status()
                .unwrap()
                .success());
        })
        .mount();
    let out = tm.sh("git -c user.name=a -c user.email=a@b add -A && \
         git -c user.name=a -c user.email=a@b commit -qm one && \
         echo '// two' >> src/main.c && git -c user.name=a -c user.email=a@b commit -qam two && \
         git fsck --strict && git log --oneline | wc -l");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    // The same repository read from the backing directory is whole.
    let out = Command::new("git")
        .args(["-C"])
        .arg(&tm.ws)
        .args(["fsck", "--strict"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(requests(&tm, "write"), 0);
}
