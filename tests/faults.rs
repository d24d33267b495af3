//! Fault injection (issue 8, part 3), through real mounts: `kill -9` of the daemon during
//! rename/delete storms (the write storm is in `ledger.rs`), a full disk under the workspace
//! only and under the ledger only, the policy file replaced by garbage mid-session, the
//! workspace's directories moved or replaced by symlinks from outside while agents hold
//! handles in them, thousands of open files, 255-byte names, paths near and beyond
//! PATH_MAX, and non-UTF-8 names in every kind of entry.
//!
//! Randomness is seeded (`INTENTFS_FAULTS_SEED`, default 3) and printed.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::ffi::{CString, OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

// ----- helpers --------------------------------------------------------------------------

fn seed() -> u64 {
    std::env::var("INTENTFS_FAULTS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// xorshift64*: a small seeded generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `intentfs ledger verify [WS] [--ledger FILE] --json`.
fn verify(ws: &Path, ledger: Option<&Path>) -> Value {
    let mut c = intentfs();
    c.args(["ledger", "verify", "--json"]).arg(ws);
    if let Some(l) = ledger {
        c.arg("--ledger").arg(l);
    }
    let out = c.output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify --json ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn cname(n: &[u8]) -> CString {
    CString::new(n).unwrap()
}

/// Unmounts a tmpfs on drop (even on panic), after the test mount is gone.
#[derive(Clone, Default)]
struct TmpfsGuard(Arc<Mutex<Vec<PathBuf>>>);

impl TmpfsGuard {
    fn mount(&self, dir: &Path, size: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        self.0.lock().unwrap().push(dir.to_path_buf());
    }
}

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        if Arc::strong_count(&self.0) > 1 {
            return;
        }
        for p in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let ok = Command::new("umount")
                .arg(&p)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&p).status();
            }
            // The test mount's temp dir could not remove a directory with a mount on it.
            if let Some(root) = p.parent() {
                let _ = std::fs::remove_dir_all(root);
            }
        }
    }
}

/// Fill the filesystem holding `dir` with a file `dir/name` (written directly).
fn fill(dir: &Path, name: &str) {
    let mut f = std::fs::File::create(dir.join(name)).unwrap();
    while f.write(&[0u8; 65536]).is_ok() {}
    while f.write(&[0u8; 512]).is_ok() {}
    let _ = f.sync_all();
}

/// Kill the `--foreground` daemon with SIGKILL and detach its dead mount.
fn kill_9(tm: &mut TestMount) {
    tm.kill_daemon();
}

/// Ledger lines that parse (a torn last line is skipped: the next mount repairs it).
fn intact_entries(p: &Path) -> Vec<Value> {
    let raw = std::fs::read(p).unwrap_or_default();
    raw.split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

// ----- 1. kill -9 during rename and delete storms ---------------------------------------

/// Each worker creates a file, renames it twice, makes and removes a directory, deletes
/// the file; it logs every acknowledged operation (after the syscall returned).
const NAMESPACE_STORM: &str = r#"
import os, sys
k, rnd, log = sys.argv[1], sys.argv[2], sys.argv[3]
lg = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def done(what):
    os.write(lg, (what + "\n").encode())
os.makedirs(f"d{k}", exist_ok=True)
try:
    for i in range(100000):
        a, b, c = f"d{k}/r{rnd}_{i}.a", f"d{k}/r{rnd}_{i}.b", f"r{rnd}_{k}_{i}.c"
        fd = os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, f"{k} {i}\n".encode())
        os.close(fd)
        done("W " + a)
        os.rename(a, b)
        done("R " + a + " " + b)
        os.rename(b, c)
        done("R " + b + " " + c)
        dd = f"d{k}/dir{rnd}_{i}"
        os.mkdir(dd)
        done("M " + dd)
        os.rmdir(dd)
        done("X " + dd)
        if i % 2 == 0:
            os.unlink(c)
            done("D " + c)
except OSError:
    sys.exit(0)
"#;

#[test]
fn kill_9_during_rename_and_delete_storms_loses_no_acknowledged_entry() {
    if skip_under_record_async("a returned close is on record only with --record sync (record_async.rs has the async side)") {
        return;
    }
    let seed = seed();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    eprintln!("seed {seed}");
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .mount();
    let script = tm.root.join("ns.py");
    std::fs::write(&script, NAMESPACE_STORM).unwrap();
    let lp = tm.w(LEDGER_REL);
    let mut total_acked = 0;
    for round in 0..3 {
        let logs: Vec<PathBuf> = (0..4)
            .map(|k| tm.root.join(format!("ns{round}_{k}.log")))
            .collect();
        let mut workers: Vec<_> = (0..4)
            .map(|k| {
                Command::new("python3")
                    .arg(&script)
                    .arg(k.to_string())
                    .arg(round.to_string())
                    .arg(&logs[k])
                    .current_dir(&tm.mnt)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Wait until the storm is under way, then kill at a seeded random point.
        wait_until(Duration::from_secs(10), || {
            logs.iter()
                .map(|l| std::fs::metadata(l).map(|m| m.len()).unwrap_or(0))
                .sum::<u64>()
                > 2000
        });
        let delay = 50 + rng.below(700);
        std::thread::sleep(Duration::from_millis(delay));
        kill_9(&mut tm);
        for w in &mut workers {
            let deadline = Instant::now() + Duration::from_secs(20);
            while w.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "a worker hangs after the kill");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let entries = intact_entries(&lp);
        let has = |t: &str, path: &str, from: Option<&str>| {
            entries.iter().any(|e| {
                e["mutation_type"] == t && e["path"] == path && from.is_none_or(|f| e["from"] == f)
            })
        };
        let mut acked = 0;
        let mut missing = Vec::new();
        for l in &logs {
            for line in std::fs::read_to_string(l).unwrap_or_default().lines() {
                acked += 1;
                let w: Vec<&str> = line.split(' ').collect();
                let found = match w[0] {
                    "W" => has("WRITE", w[1], None),
                    "R" => has("RENAME", w[2], Some(w[1])),
                    "M" => has("MKDIR", w[1], None),
                    "X" => has("RMDIR", w[1], None),
                    "D" => has("DELETE", w[1], None),
                    _ => unreachable!(),
                };
                if !found {
                    missing.push(line.to_string());
                }
            }
        }
        eprintln!("round {round}: killed after {delay} ms, {acked} acknowledged operations");
        assert!(acked > 50, "the storm barely ran ({acked})");
        assert!(
            missing.is_empty(),
            "round {round}: {} of {acked} acknowledged operations have no entry: {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        total_acked += acked;
        tm.start(); // remount: repairs a torn tail, if any
    }
    tm.stop();
    let v = verify(&tm.ws, None);
    assert_eq!(v["chain_intact"], true, "{v:#}");
    assert_eq!(v["findings"], serde_json::json!([]), "{v:#}");
    // Drift is possible only for what was done but not acknowledged when the daemon died.
    eprintln!(
        "{total_acked} acknowledged operations over 3 kills; drift entries after: {}",
        v["drift"].as_array().map(|a| a.len()).unwrap_or(0)
    );
    assert!(
        v["drift"].as_array().map(|a| a.len()).unwrap_or(0) <= 3 * 4,
        "more drift than one in-flight operation per worker and kill: {v:#}"
    );
}

// ----- 2. full disk under the workspace only, then under the ledger only -----------------

/// Every entry of the workspace (but `.orchestration`) has at least one ledger entry.
fn all_on_record(ws: &Path, ledger: &[Value]) {
    for ent in std::fs::read_dir(ws).unwrap() {
        let n = ent.unwrap().file_name().into_string().unwrap();
        if n == ".orchestration" || n == "lost+found" {
            continue;
        }
        assert!(
            ledger.iter().any(|e| e["path"] == n.as_str()),
            "{n} exists in the workspace with no ledger entry"
        );
    }
}

#[test]
fn full_disk_under_the_workspace_only_is_enospc_and_resumes() {
    let guard = TmpfsGuard::default();
    let g = guard.clone();
    let mut tm = TestMount::builder()
        .intent("ALL")
        .arg("--ledger")
        .arg("{root}/ledger/agent_trace.jsonl")
        .setup(move |ws| {
            g.mount(ws, "2m");
            put(&ws.join(POLICY_REL), ALLOW_ALL);
            std::fs::create_dir_all(ws.parent().unwrap().join("ledger")).unwrap();
            drop(g);
        })
        .mount();
    let lp = tm.root.join("ledger/agent_trace.jsonl");
    std::fs::write(tm.m("before.txt"), "before\n").unwrap();
    let mut big = std::fs::File::create(tm.m("big")).unwrap();
    let err = loop {
        if let Err(e) = big.write(&[b'x'; 65536]) {
            break e;
        }
    };
    assert_eq!(errno(&err), libc::ENOSPC, "{err}");
    drop(big);
    // Writes fail with ENOSPC (the ledger has room: it is not the ledger's fault).
    let mut acked = Vec::new();
    for i in 0..30 {
        let name = format!("m{i}");
        let r = create_write_close(&tm.m(&name), &[b'y'; 8192]);
        match r {
            Ok(()) => acked.push(name),
            Err(e) => assert_eq!(errno(&e), libc::ENOSPC, "{name}: {e}"),
        }
    }
    eprintln!("full workspace: {} of 30 writes acknowledged", acked.len());
    // Namespace changes need no data blocks: they keep working, on record.
    std::fs::rename(tm.m("before.txt"), tm.m("renamed.txt")).unwrap();
    // Free the space through the mount; writes resume.
    std::fs::remove_file(tm.m("big")).unwrap();
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            match std::fs::write(tm.m("after.txt"), "after\n") {
                Ok(()) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            }
        }),
        "writes did not resume: {last:?}"
    );
    tm.stop();
    let l = read_ledger(&lp);
    for n in acked.iter().map(String::as_str).chain(["after.txt"]) {
        assert!(
            l.iter()
                .any(|e| e["mutation_type"] == "WRITE" && e["path"] == n),
            "{n}: acknowledged write without a WRITE entry"
        );
    }
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "RENAME" && e["path"] == "renamed.txt"));
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "DELETE" && e["path"] == "big"));
    all_on_record(&tm.ws, &l);
    let v = verify(&tm.ws, Some(&lp));
    assert_eq!(v["ok"], true, "{v:#}");
}

#[test]
fn full_disk_under_the_ledger_only_fails_closed_and_resumes() {
    let guard = TmpfsGuard::default();
    let g = guard.clone();
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .arg("--ledger")
        .arg("{root}/lfs/agent_trace.jsonl")
        .setup(move |ws| {
            g.mount(&ws.parent().unwrap().join("lfs"), "1m");
            drop(g);
        })
        .mount();
    let lfs = tm.root.join("lfs");
    let lp = lfs.join("agent_trace.jsonl");
    std::fs::write(tm.m("before.txt"), "before\n").unwrap();
    fill(&lfs, "filler");
    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..300 {
        let name = format!("m{i}");
        let r = create_write_close(&tm.m(&name), b"hello\n");
        match r {
            Ok(()) => acked.push(name),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("300 creations with a full ledger disk all acknowledged");
    eprintln!(
        "full ledger disk: {} creations acknowledged, then {e}",
        acked.len()
    );
    assert_eq!(errno(&e), libc::EACCES, "{e}");
    let le = tm.last_error();
    assert!(
        le["message"].as_str().unwrap_or("").contains("ledger"),
        "the refusal must say the ledger cannot be written: {le:#}"
    );
    // Its own code: not a protected path, nothing the agent can fix by choosing another.
    assert_eq!(le["code"], "LEDGER_UNWRITABLE", "{le:#}");
    // Other mutations fail closed too.
    assert!(std::fs::rename(tm.m("before.txt"), tm.m("renamed.txt")).is_err());
    assert!(std::fs::create_dir(tm.m("dir_while_full")).is_err());
    assert!(!tm.w("dir_while_full").exists() && tm.w("before.txt").exists());
    // Space comes back: mutations resume.
    std::fs::remove_file(lfs.join("filler")).unwrap();
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            match std::fs::write(tm.m("after.txt"), "after\n") {
                Ok(()) => true,
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(50));
                    false
                }
            }
        }),
        "mutations still refused after the ledger's disk has room: {last:?}"
    );
    std::fs::create_dir(tm.m("dir_after")).unwrap();
    tm.stop();
    let l = read_ledger(&lp);
    for n in acked.iter().map(String::as_str).chain(["after.txt"]) {
        assert!(
            l.iter()
                .any(|e| e["mutation_type"] == "WRITE" && e["path"] == n),
            "{n}: acknowledged without a WRITE entry"
        );
    }
    all_on_record(&tm.ws, &l);
    let v = verify(&tm.ws, Some(&lp));
    assert_eq!(v["chain_intact"], true, "{v:#}");
    assert_eq!(v["ok"], true, "{v:#}");
}

// ----- 3. the policy replaced by garbage mid-session ------------------------------------

const POLICY_A: &str =
    "intents:\n  - id: A\n    name: a\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\"]\n";

fn reload_error(tm: &TestMount) -> Value {
    tm.status()["mount"]["policy_reload_error"].clone()
}

#[test]
fn policy_replaced_by_garbage_keeps_the_last_good_policy() {
    policy_garbage(&[
        b"\x00\xff\xfe garbage \x01\x02\n\x7f",
        b"intents:\n  - id: A\n    name: a\n    status: IN_PROGRESS\n    owned_scop: [\"**\"]\n",
        b"intents:\n  - id: A\n    name: [unclosed\n",
        b"intents: *alias_to_nowhere\n",
    ]);
}

#[test]
fn policy_truncated_to_empty_keeps_the_last_good_policy() {
    policy_garbage(&[b""]);
}

fn policy_garbage(garbage: &[&[u8]]) {
    let tm = TestMount::builder()
        .policy(POLICY_A)
        .intent("A")
        .files(&[("src/a.txt", "a\n"), ("docs/d.txt", "d\n")])
        .arg("--breaker")
        .arg("0")
        .mount();
    // An agent keeps writing in scope meanwhile; any failure is logged outside the mount.
    let errs = tm.root.join("agent_errors");
    let stop = tm.root.join("stop");
    let script = format!(
        "i=0; while [ ! -e '{stop}' ] && [ -e .intentfs/status ]; do echo $i > src/loop.txt 2>/dev/null || echo \"fail $i\" >> '{errs}'; \
         echo $i > docs/no.txt 2>/dev/null && echo \"out of scope write $i\" >> '{errs}'; i=$((i+1)); done",
        stop = stop.display(),
        errs = errs.display()
    );
    let mut agent = intentfs()
        .arg("run")
        .arg("--mount")
        .arg(&tm.mnt)
        .args([
            "--intent", "A", "--agent", "looper", "--", "sh", "-c", &script,
        ])
        .current_dir(&tm.mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pol = tm.w(POLICY_REL);
    for (i, g) in garbage.iter().enumerate() {
        std::fs::write(&pol, g).unwrap();
        assert!(
            wait_until(Duration::from_secs(5), || !reload_error(&tm).is_null()),
            "garbage #{i} ({:?}): no reload error in status",
            String::from_utf8_lossy(g)
        );
        // The last good policy holds: in scope allowed, out of scope refused.
        std::fs::write(tm.m("src/b.txt"), format!("{i}\n")).unwrap();
        tm.assert_denied(std::fs::write(tm.m("docs/d.txt"), "x"), "SCOPE_VIOLATION");
        eprintln!("garbage #{i}: {}", reload_error(&tm));
        // Back to the good policy: the error clears.
        std::fs::write(&pol, POLICY_A).unwrap();
        assert!(
            wait_until(Duration::from_secs(5), || reload_error(&tm).is_null()),
            "the error stayed after a good policy came back: {}",
            reload_error(&tm)
        );
    }
    // A new good policy (atomically replaced) takes effect without a remount.
    let wider = POLICY_A.replace("[\"src/**\"]", "[\"src/**\", \"docs/**\"]");
    std::fs::write(tm.w(".orchestration/new.yaml"), wider).unwrap();
    std::fs::rename(tm.w(".orchestration/new.yaml"), &pol).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::write(
            tm.m("docs/d.txt"),
            "now in scope\n"
        )
        .is_ok()),
        "the new policy was not applied"
    );
    std::fs::write(&stop, "").unwrap();
    assert!(agent.wait().unwrap().success());
    // Once the wider policy applied, docs/no.txt was allowed: only count before that.
    let e = std::fs::read_to_string(&errs).unwrap_or_default();
    let fails: Vec<&str> = e.lines().filter(|l| l.starts_with("fail")).collect();
    assert!(
        fails.is_empty(),
        "in-scope writes failed during reloads: {fails:?}"
    );
    assert!(tm.ws_bytes("src/loop.txt").len() > 1);
}

// ----- 4. directories moved or replaced by symlinks from outside ------------------------

fn set_nofile(soft: u64, hard: u64) {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: the rlimit pointer is a live local for the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
}

fn openat_create(dir: &std::fs::File, name: &[u8], flags: i32) -> std::io::Result<()> {
    let n = cname(name);
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened above and nothing else owns it.
    let f = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(f);
    f.write_all(b"escaped?\n")
}

#[test]
fn directories_swapped_for_symlinks_from_outside_do_not_let_the_daemon_escape() {
    // A small open-file limit for the daemon (inherited): its node handles are evicted and
    // re-opened by name, the moment a swapped directory could be followed.
    set_nofile(1024, 1024);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sentinel"), "outside\n").unwrap();
    let mut files: Vec<(String, String)> = vec![
        ("src/a.txt".into(), "a\n".into()),
        ("lib/l.txt".into(), "l\n".into()),
    ];
    for i in 0..400 {
        files.push((format!("other/f{i}"), format!("{i}\n")));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let tm = TestMount::builder()
        .policy(
            "intents:\n  - id: A\n    name: a\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\", \"lib/**\"]\n",
        )
        .intent("A")
        .files(&refs)
        .mount();
    let before_outside = tree(outside.path(), &[]);
    let etc_name = format!("intentfs-escape-test-{}", std::process::id());
    let etc_probe = Path::new("/etc").join(&etc_name);
    assert!(!etc_probe.exists());
    // Agents hold the directories open (as a shell's cwd would).
    let src = std::fs::File::open(tm.m("src")).unwrap();
    let lib = std::fs::File::open(tm.m("lib")).unwrap();
    // From outside: src moved away and replaced by a symlink to a directory outside the
    // workspace; lib moved away and replaced by a symlink to /etc.
    std::fs::rename(tm.w("src"), tm.w("src_moved")).unwrap();
    std::os::unix::fs::symlink(outside.path(), tm.w("src")).unwrap();
    std::fs::rename(tm.w("lib"), tm.w("lib_moved")).unwrap();
    std::os::unix::fs::symlink("/etc", tm.w("lib")).unwrap();

    let attempt = |round: &str| {
        let flags = libc::O_WRONLY | libc::O_CREAT;
        let r1 = openat_create(&src, b"new.txt", flags);
        let r2 = openat_create(&src, b"a.txt", libc::O_WRONLY | libc::O_TRUNC);
        let r3 = openat_create(&lib, etc_name.as_bytes(), flags);
        let r4 = openat_create(&lib, b"l.txt", libc::O_WRONLY | libc::O_TRUNC);
        let d = cname(b"newdir");
        // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
        let r5 = unsafe { libc::mkdirat(src.as_raw_fd(), d.as_ptr(), 0o755) };
        if etc_probe.exists() {
            let _ = std::fs::remove_file(&etc_probe);
            panic!(
                "{round}: the daemon created {} through a symlink",
                etc_probe.display()
            );
        }
        for (what, r) in [
            ("create", &r1),
            ("truncate", &r2),
            ("create in lib", &r3),
            ("truncate lib", &r4),
        ] {
            assert!(
                r.is_err(),
                "{round}: {what} through a moved directory succeeded"
            );
        }
        assert!(
            r5 != 0,
            "{round}: mkdir through a moved directory succeeded"
        );
        assert_eq!(
            tree(outside.path(), &[]),
            before_outside,
            "{round}: outside changed"
        );
        assert!(!tm.w("src_moved/new.txt").exists() && !tm.w("src_moved/newdir").exists());
        assert_eq!(tm.ws_bytes("src_moved/a.txt"), b"a\n");
        assert_eq!(tm.ws_bytes("lib_moved/l.txt"), b"l\n");
        eprintln!("{round}: {r1:?} {r2:?} {r3:?} {r4:?}");
    };
    attempt("right after the swap");
    // Churn the daemon's node handles past its cap, so src and lib are re-opened by name.
    for i in 0..400 {
        let _ = std::fs::metadata(tm.m(&format!("other/f{i}"))).unwrap();
        let _ = std::fs::read(tm.m(&format!("other/f{i}"))).unwrap();
    }
    attempt("after the handles were evicted");
    // A fresh lookup sees the symlink as a symlink (the daemon does not traverse it).
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::symlink_metadata(
            tm.m("src")
        )
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)),
        "mnt/src is not shown as the symlink it now is"
    );
    // The moved directory is out of scope under its new name.
    tm.assert_denied(
        std::fs::write(tm.m("src_moved/x.txt"), "x"),
        "SCOPE_VIOLATION",
    );
}

// ----- 5. thousands of open files ------------------------------------------------------

#[test]
fn three_thousand_files_open_at_once_through_the_mount() {
    // Beyond the usual 1024: raise this process's soft limit to its hard limit.
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: the rlimit pointer is a live local for the call.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    assert!(
        r.rlim_max >= 4096,
        "hard RLIMIT_NOFILE {} too small",
        r.rlim_max
    );
    set_nofile(r.rlim_max, r.rlim_max);
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .mount();
    std::fs::create_dir(tm.m("many")).unwrap();
    let n = 3000;
    let mut open = Vec::with_capacity(n);
    for i in 0..n {
        let mut f = std::fs::File::create(tm.m(&format!("many/f{i}")))
            .unwrap_or_else(|e| panic!("open #{i}: {e}"));
        f.write_all(format!("{i}\n").as_bytes()).unwrap();
        open.push(f);
    }
    // All open at once; reading them back through other handles works too.
    for i in (0..n).step_by(97) {
        assert_eq!(
            std::fs::read(tm.m(&format!("many/f{i}"))).unwrap(),
            format!("{i}\n").as_bytes()
        );
    }
    drop(open);
    std::fs::write(tm.m("after"), "ok\n").unwrap();
    tm.stop();
    let l = tm.ledger();
    let writes: HashSet<&str> = l
        .iter()
        .filter(|e| e["mutation_type"] == "WRITE")
        .filter_map(|e| e["path"].as_str())
        .collect();
    for i in 0..n {
        assert!(
            writes.contains(format!("many/f{i}").as_str()),
            "no WRITE for many/f{i}"
        );
        assert_eq!(
            tm.ws_bytes(&format!("many/f{i}")),
            format!("{i}\n").as_bytes()
        );
    }
    assert_eq!(verify(&tm.ws, None)["ok"], true);
}

// ----- 6. long names, long paths, non-UTF-8 names --------------------------------------

#[test]
fn names_of_255_bytes_and_paths_near_path_max() {
    let mut tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    let n255 = format!("{}.txt", "n".repeat(251));
    let m255 = format!("{}.txt", "m".repeat(251));
    std::fs::write(tm.m(&n255), "long\n").unwrap();
    std::fs::rename(tm.m(&n255), tm.m(&m255)).unwrap();
    let too_long = "x".repeat(256);
    let e = std::fs::write(tm.m(&too_long), "x").unwrap_err();
    assert_eq!(errno(&e), libc::ENAMETOOLONG, "{e}");
    // A path whose absolute form in the mount is just under PATH_MAX.
    let comp = "d".repeat(200);
    let budget = 4095 - tm.mnt.as_os_str().len() - 1 - 20;
    let mut rel = String::new();
    while rel.len() + comp.len() + 1 < budget {
        rel.push_str(&comp);
        rel.push('/');
    }
    std::fs::create_dir_all(tm.m(&rel)).unwrap();
    let deep = format!("{rel}file.txt");
    assert!(tm.m(&deep).as_os_str().len() < 4096);
    std::fs::write(tm.m(&deep), "deep\n").unwrap();
    tm.stop();
    let l = tm.ledger();
    assert!(l.iter().any(|e| e["mutation_type"] == "RENAME"
        && e["path"] == m255.as_str()
        && e["from"] == n255.as_str()));
    assert!(
        l.iter()
            .any(|e| e["mutation_type"] == "WRITE" && e["path"] == deep.as_str()),
        "no WRITE entry with the {}-byte path",
        deep.len()
    );
    let v = verify(&tm.ws, None);
    assert_eq!(v["ok"], true, "{v:#}");
}

#[test]
fn non_utf8_names_in_every_kind_of_entry_are_recorded_losslessly() {
    use base64::Engine;
    let mut tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    let os = |b: &[u8]| OsString::from_vec(b.to_vec());
    let dir = os(b"d\xff\xfe");
    let file = os(b"d\xff\xfe/f\x80.txt");
    let moved = os(b"d\xff\xfe/g\xc3(.txt");
    let link = os(b"l\xe9");
    std::fs::create_dir(tm.mnt.join(&dir)).unwrap();
    std::fs::write(tm.mnt.join(&file), "x\n").unwrap();
    std::fs::rename(tm.mnt.join(&file), tm.mnt.join(&moved)).unwrap();
    std::os::unix::fs::symlink(OsStr::from_bytes(b"t\xfa"), tm.mnt.join(&link)).unwrap();
    std::fs::remove_file(tm.mnt.join(&moved)).unwrap();
    std::fs::remove_dir(tm.mnt.join(&dir)).unwrap();
    tm.stop();
    let raw = std::fs::read(tm.w(LEDGER_REL)).unwrap();
    assert!(std::str::from_utf8(&raw).is_ok(), "the ledger is not UTF-8");
    let l = tm.ledger();
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or(""))
            .unwrap()
    };
    let find = |t: &str, p: &[u8]| {
        l.iter()
            .find(|e| {
                e["mutation_type"] == t && e.get("path_b64").map(|v| b64(v) == p).unwrap_or(false)
            })
            .unwrap_or_else(|| panic!("no {t} entry with path bytes {p:?}: {l:#?}"))
            .clone()
    };
    find("MKDIR", dir.as_bytes());
    find("WRITE", file.as_bytes());
    let r = find("RENAME", moved.as_bytes());
    assert_eq!(b64(&r["from_b64"]), file.as_bytes());
    find("SYMLINK", link.as_bytes());
    find("DELETE", moved.as_bytes());
    find("RMDIR", dir.as_bytes());
    let v = verify(&tm.ws, None);
    assert_eq!(v["ok"], true, "{v:#}");
}

/// Create `path`, write `data`, and close it, reporting `close`'s own error (the mount
/// acknowledges a write at close, after its ledger entry: a full ledger fails it there).
fn create_write_close(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: `fd` was just taken from the file and is closed exactly once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
