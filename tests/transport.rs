//! `intentfs mount --transport`: FUSE-over-io_uring serves the same operations as /dev/fuse
//! (the requests really go through the ring threads), `auto` falls back to /dev/fuse when
//! the kernel does not offer the ring, and an explicit `io-uring` then refuses to mount.
//!
//! Over the ring, a slow request (hashing a large file at close) does not hold up the next
//! request from the same CPU, and more requests than the old 8 entries per queue can wait
//! for a human on one CPU while that CPU's other requests are served.
//!
//! The ring needs the `fuse` module's `enable_uring` parameter (Linux 6.14+); each test sets
//! it for its duration and puts the old value back, and skips where it cannot. The tests
//! that set it take a lock file first (nextest runs them in parallel processes: one must not
//! switch it off under another's mount attempt).

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Held while a test of this file owns `enable_uring`.
const PARAM_LOCK: &str = "/tmp/intentfs-test-enable-uring.lock";

/// Sets `enable_uring` for the test's lifetime; the previous value comes back on drop.
struct UringParam {
    old: String,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl UringParam {
    /// `None` (after saying why) where the parameter is missing or cannot be written.
    fn set(on: bool) -> Option<UringParam> {
        if !Path::new(ENABLE_URING).exists() {
            eprintln!("skipped: no {ENABLE_URING} (a kernel without FUSE-over-io_uring)");
            return None;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(PARAM_LOCK)
            .unwrap();
        let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .unwrap();
        let old = match std::fs::read_to_string(ENABLE_URING) {
            Ok(v) => v.trim().to_string(),
            Err(e) => {
                eprintln!("skipped: {ENABLE_URING}: {e} (a kernel without FUSE-over-io_uring)");
                return None;
            }
        };
        if let Err(e) = std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }) {
            eprintln!("skipped: cannot set {ENABLE_URING}: {e} (needs root)");
            return None;
        }
        Some(UringParam { old, _lock: lock })
    }

    fn switch(&self, on: bool) {
        std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }).unwrap();
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING, &self.old);
    }
}

/// Voluntary context switches of the daemon's ring threads (`fuser-ring-*`), summed.
fn ring_switches(pid: u32) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-ring-") {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        n += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    n
}

fn log_of(tm: &TestMount) -> String {
    std::fs::read_to_string(tm.stderr_path()).unwrap_or_default()
}

/// A few ordinary operations through the mount, checked against the backing directory.
fn file_operations(tm: &TestMount) {
    let big: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    std::fs::write(tm.m("big.bin"), &big).unwrap();
    assert_eq!(std::fs::read(tm.m("big.bin")).unwrap(), big);
    assert_eq!(tm.ws_bytes("big.bin"), big);
    std::fs::create_dir(tm.m("d")).unwrap();
    std::fs::write(tm.m("d/new.txt"), "over the ring\n").unwrap();
    std::fs::rename(tm.m("d/new.txt"), tm.m("d/renamed.txt")).unwrap();
    let names: Vec<String> = std::fs::read_dir(tm.m("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["renamed.txt"]);
    assert_eq!(tm.ws_bytes("d/renamed.txt"), b"over the ring\n");
    assert_eq!(std::fs::read_to_string(tm.m("hello.txt")).unwrap(), "hi\n");
    std::fs::remove_file(tm.m("d/renamed.txt")).unwrap();
    std::fs::remove_dir(tm.m("d")).unwrap();
    assert!(!Path::new(&tm.w("d")).exists());
    // Governance answers over the ring too: the ledger is not writable through the mount.
    assert!(std::fs::write(tm.m(LEDGER_REL), "x").is_err());
}

/// A mount of `hello.txt` with `--transport T`.
fn mount_over(t: &str) -> TestMount {
    TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .arg("--transport")
        .arg(t)
        .files(&[("hello.txt", "hi\n")])
        .mount()
}

/// `mount.transport` in `.intentfs/status`.
fn transport_in_status(tm: &TestMount) -> String {
    let text = std::fs::read_to_string(tm.m(".intentfs/status")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["mount"]["transport"].as_str().unwrap_or("").to_owned()
}

#[test]
fn io_uring_transport_serves_and_auto_falls_back() {
    require_fuse();
    let Some(param) = UringParam::set(true) else {
        return;
    };

    // io-uring: served by the ring threads.
    let mut tm = mount_over("io-uring");
    let log = log_of(&tm);
    assert!(log.contains("transport: io-uring"), "daemon log:\n{log}");
    assert!(
        transport_in_status(&tm).starts_with("io-uring ("),
        "{}",
        transport_in_status(&tm)
    );
    let before = ring_switches(tm.daemon_pid());
    file_operations(&tm);
    let after = ring_switches(tm.daemon_pid());
    // Each request wakes a ring thread: dozens of operations, dozens of switches at least.
    assert!(
        after >= before + 20,
        "the ring threads did not serve the requests ({before} -> {after} switches)"
    );
    tm.stop();
    assert!(!is_mounted(&tm.mnt), "still mounted after stop");

    // dev (dev-fuse) where the kernel offers the ring: /dev/fuse all the same.
    let tm = mount_over("dev");
    let log = log_of(&tm);
    assert!(log.contains("transport: /dev/fuse"), "daemon log:\n{log}");
    assert_eq!(transport_in_status(&tm), "/dev/fuse");
    file_operations(&tm);
    assert_eq!(ring_switches(tm.daemon_pid()), 0, "no ring thread expected");
    drop(tm);

    // auto without the kernel's offer: /dev/fuse, and the log says why.
    param.switch(false);
    let tm = mount_over("auto");
    let log = log_of(&tm);
    assert!(
        log.contains("transport: /dev/fuse (io-uring unavailable"),
        "daemon log:\n{log}"
    );
    assert!(transport_in_status(&tm).starts_with("/dev/fuse (io-uring unavailable"));
    file_operations(&tm);
    assert_eq!(ring_switches(tm.daemon_pid()), 0, "no ring thread expected");
    drop(tm);

    // An explicit io-uring refuses to mount without it.
    let dir = tempfile::tempdir().unwrap();
    let (ws, mnt) = (dir.path().join("ws"), dir.path().join("mnt"));
    std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(ws.join(POLICY_REL), ALLOW_ALL).unwrap();
    let mut c = intentfs();
    c.args(["mount", "--foreground", "--transport", "io-uring"])
        .arg(&ws)
        .arg(&mnt);
    let out = run_timeout(c, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted without the ring: {err}");
    assert!(err.contains("FUSE_OVER_IO_URING"), "stderr: {err}");
    assert!(!is_mounted(&mnt), "left mounted");
}

/// Bytes the daemon has read (`rchar` of /proc/PID/io: every thread's read and pread).
fn daemon_read_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rchar:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

/// `sh -c SCRIPT` in the mount, pinned to CPU 0: the kernel puts a process's FUSE requests
/// on the ring queue of the CPU it runs on, so every such process uses queue 0.
fn on_cpu0(tm: &TestMount, script: &str) -> Command {
    let mut c = Command::new("taskset");
    c.args(["-c", "0", "sh", "-c", script])
        .current_dir(&tm.mnt)
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    c
}

fn ring_mount(b: Builder) -> TestMount {
    let tm = b.arg("--transport").arg("io-uring").mount();
    assert!(
        log_of(&tm).contains("transport: io-uring"),
        "{}",
        log_of(&tm)
    );
    tm
}

/// Whether the ledger has a WRITE entry for `rel`.
fn has_write(tm: &TestMount, rel: &str) -> bool {
    tm.ledger()
        .iter()
        .any(|e| e["mutation_type"] == "WRITE" && e["path"] == rel)
}

#[test]
fn a_slow_request_does_not_hold_up_the_next_from_the_same_cpu() {
    require_fuse();
    if skip_under_record_async("its slow request is a close that waits for its entry") {
        return;
    }
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    // A 1 GiB file (sparse: no disk): a one-byte write to it makes close(2) hash it whole
    // before the ledger entry that close waits for (FLUSH), hundreds of milliseconds of one
    // ring thread's time.
    let tm = ring_mount(
        TestMount::builder()
            .policy(ALLOW_ALL)
            .intent("ALL")
            .files(&[("hello.txt", "hi\n")])
            .setup(|ws| {
                let f = std::fs::File::create(ws.join("big.bin")).unwrap();
                f.set_len(1 << 30).unwrap();
            }),
    );
    let pid = tm.daemon_pid();
    let before = daemon_read_bytes(pid);
    let mut slow: Child = on_cpu0(&tm, "printf x 1<>big.bin").spawn().unwrap();
    // The daemon is under way with it once it has read a good part of the file.
    let started = wait_until(Duration::from_secs(60), || {
        daemon_read_bytes(pid) >= before + (64 << 20)
    });
    assert!(started, "the daemon did not start reading big.bin");
    assert!(
        !has_write(&tm, "big.bin"),
        "the slow close ended before the test could look"
    );

    // Meanwhile, from the same CPU: a lookup, an open, a read, a close.
    let out = on_cpu0(&tm, "cat hello.txt").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n", "{out:?}");
    // Answered while the slow close is still in the daemon: its entry is not written and
    // the writer still waits in close(2). (With one thread per queue, `cat`'s requests
    // queued behind it: by the time `cat` returned, the entry was there.)
    assert!(
        !has_write(&tm, "big.bin"),
        "`cat` was answered only after the slow close was done"
    );
    assert!(
        slow.try_wait().unwrap().is_none(),
        "the slow close returned"
    );

    // The slow close completes normally, on record.
    assert!(slow.wait().unwrap().success());
    let e = tm
        .ledger()
        .into_iter()
        .find(|e| e["mutation_type"] == "WRITE" && e["path"] == "big.bin")
        .expect("WRITE entry for big.bin");
    assert_eq!(e["outcome"], "ok", "{e:#}");
    assert!(e["content_hash"].is_string(), "{e:#}");
    let mut head = [0u8; 2];
    std::io::Read::read_exact(
        &mut std::fs::File::open(tm.w("big.bin")).unwrap(),
        &mut head,
    )
    .unwrap();
    assert_eq!(&head, b"x\0");
}

/// The approvals policy of tests/approvals.rs: INT-001 owns `src/**`; writing elsewhere asks
/// a human, who answers through the CLI socket.
const ASKING: &str = r#"intents:
  - id: INT-001
    name: Approvals over the ring
    status: IN_PROGRESS
    owned_scope:
      - "src/**"
approval:
  out_of_scope: ask
  timeout_s: 120
"#;

/// More requests parked on one CPU than the 8 entries a queue used to have.
const PARKED: usize = 12;

#[test]
fn parked_approvals_on_one_cpu_leave_its_queue_serving() {
    require_fuse();
    let Some(_param) = UringParam::set(true) else {
        return;
    };
    let b = (0..PARKED).fold(TestMount::builder(), |b, i| {
        b.file(&format!("docs/f{i}.md"), "old\n")
    });
    let tm = ring_mount(
        b.file("src/x", "keep\n")
            .policy(ASKING)
            .intent("INT-001")
            .agent("tester")
            .arg("--approver")
            .arg("cli"),
    );
    // Agents on CPU 0 edit out-of-scope files: each request waits for a human, holding its
    // entry of queue 0.
    let mut agents: Vec<Child> = (0..PARKED)
        .map(|i| {
            on_cpu0(&tm, &format!("echo new{i} > docs/f{i}.md"))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let listed = tm.pending_count(PARKED, Duration::from_secs(30));

    // Meanwhile, on the same CPU, in-scope work goes through (with 8 entries it waited for
    // the decisions: the bound below only turns that hang into a failure).
    let work = on_cpu0(
        &tm,
        "for i in 0 1 2 3 4 5 6 7 8 9; do echo w$i > src/w$i.txt && cat src/w$i.txt; done",
    );
    let out = run_timeout(work, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        (0..10).map(|i| format!("w{i}\n")).collect::<String>()
    );
    assert_eq!(tm.ws_bytes("src/w9.txt"), b"w9\n");
    // ... while every question still waits.
    assert_eq!(
        tm.pending().len(),
        PARKED,
        "the questions are still waiting"
    );
    for a in agents.iter_mut() {
        assert!(a.try_wait().unwrap().is_none(), "an agent ended undecided");
    }

    // Every one is answered afterwards, lands its write, and is on record.
    for p in &listed {
        let id = p["id"].as_u64().unwrap().to_string();
        let out = intentfs()
            .args(["approve", &id, "--mount"])
            .arg(&tm.mnt)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        ok(out, "intentfs approve");
    }
    for (i, a) in agents.iter_mut().enumerate() {
        assert!(a.wait().unwrap().success(), "agent {i}");
        assert_eq!(
            tm.ws_bytes(&format!("docs/f{i}.md")),
            format!("new{i}\n").as_bytes()
        );
    }
    assert!(tm.pending().is_empty());
    let ledger = tm.ledger();
    for i in 0..PARKED {
        let path = format!("docs/f{i}.md");
        assert!(
            ledger.iter().any(|e| e["mutation_type"] == "APPROVAL"
                && e["path"] == path.as_str()
                && e["outcome"] == "approved"),
            "no approved APPROVAL entry for {path}"
        );
        assert!(
            ledger
                .iter()
                .any(|e| e["mutation_type"] == "WRITE" && e["path"] == path.as_str()),
            "no WRITE entry for {path}"
        );
    }
}
