//! `--record async` (issue 19): the entry of a close is written right after the close is
//! answered, by a thread of its own, in order; the next change of the same file waits for
//! it. Real mounts and real processes, over both data modes: every close ends on record
//! with the hash of what that close left (not of what came after), in the order the agent
//! acted; an intent switch, `status`, `intentfs log` and the unmount wait for the closes
//! still queued; a daemon killed with closes queued leaves every lost one visible to
//! `ledger verify`. The suite as a whole also runs with INTENTFS_RECORD=async (`.ci/run`).

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

fn mount(data: &str) -> TestMount {
    mount_with(data, "async")
}

fn mount_with(data: &str, record: &str) -> TestMount {
    TestMount::builder()
        .policy(ALL_AND_DOCS)
        .intent("ALL")
        .arg("--record")
        .arg(record)
        .arg("--data")
        .arg(data)
        .mount()
}

/// Entries of completed changes to `path`, in ledger order.
fn of(entries: &[Value], path: &str) -> Vec<Value> {
    entries
        .iter()
        .filter(|e| e["path"] == path || e["from"] == path)
        .cloned()
        .collect()
}

fn python(tm: &TestMount, script: &str) {
    let out = Command::new("python3")
        .args(["-I", "-c", script])
        .current_dir(&tm.mnt)
        .output()
        .unwrap();
    ok(out, "python");
}

/// `intentfs ledger verify --json WS`: whether it passed, and its report.
fn verify(ws: &std::path::Path) -> (bool, Value) {
    let out = intentfs()
        .args(["ledger", "verify", "--json"])
        .arg(ws)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ledger verify --json ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

/// Run `script` (a python program printing a line per step) in the mount, kill the daemon
/// once it has printed `steps` lines, remount and verify: the report, whose chain must be
/// intact.
fn killed_after(tm: &mut TestMount, script: &str, steps: usize) -> Value {
    let mut writer = Command::new("python3")
        .args(["-I", "-c", script])
        .current_dir(&tm.mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(writer.stdout.take().unwrap());
    let mut line = String::new();
    for k in 0..steps {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "the writer stopped after {k} steps");
    }
    tm.kill_daemon();
    let _ = writer.kill();
    let _ = writer.wait();
    // Remount: a torn tail is repaired; then verify.
    tm.start();
    let (_, v) = verify(&tm.ws);
    assert_eq!(v["chain_intact"], true, "{v}");
    v
}

/// 300 files written and closed one after another, as `tar x` does: once settled, every
/// one has its entry with the hash of the bytes on disk, the store resolves each hash, the
/// chain is intact and nothing drifts; `status` says how they were recorded.
#[test]
fn every_close_ends_on_record_with_its_hash() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        python(
            &tm,
            "import os\nos.mkdir('t')\nfor i in range(300):\n    \
             open('t/f%03d.rs' % i, 'w').write('fn f%d() {}\\n' % i * (1 + i % 7))\n",
        );
        let st = tm.status();
        assert_eq!(st["mount"]["record"], "async", "{st}");
        let rec = &st["counters"]["record"];
        assert_eq!(rec["queued"], 0, "status waits for the queue: {rec}");
        assert_eq!(rec["failures"], 0, "{rec}");
        assert!(rec["done"].as_u64().unwrap() >= 300, "{rec}");
        let ledger = tm.ledger();
        for i in 0..300 {
            let rel = format!("t/f{i:03}.rs");
            let bytes = tm.ws_bytes(&rel);
            let last = of(&ledger, &rel)
                .into_iter()
                .rfind(|e| e["mutation_type"] == "WRITE")
                .unwrap_or_else(|| panic!("{data}: no WRITE of {rel}"));
            assert_eq!(last["content_hash"], sha(&bytes), "{data}: {rel}: {last}");
        }
        let (passed, v) = verify(&tm.ws);
        assert!(passed, "{data}: verify: {v}");
        assert_eq!(v["drift"], serde_json::json!([]), "{data}: {v}");
        // Every hash named resolves in the store: kept before its entry was written.
        for e in &ledger {
            let Some(h) = e["content_hash"].as_str() else {
                continue;
            };
            if e["mutation_type"] != "WRITE" {
                continue;
            }
            let store = intentfs::store::Store::open_existing(&tm.w(".orchestration/objects"))
                .unwrap()
                .expect("the mount made its store");
            assert!(
                store.get(h).unwrap().is_some(),
                "{data}: {} names {h}, not in the store",
                e["path"]
            );
        }
    }
}

/// What the agent does to a file right after closing it comes after the close's entry,
/// and the entry hashes what the close left, not what came next: a temporary file renamed
/// over its target (`sed -i`, editors' save), a file written again at once, a chmod, a
/// hard link and an unlink right after the close. Both record modes: the kernel may
/// deliver a handle's release after the agent opened and truncated the file again, and
/// that truncation is not the released handle's (found with `--record async`, where it
/// made an extra entry 6-8 times in 100, and once in 100-300 with `--record sync`).
#[test]
fn the_next_change_of_a_file_waits_for_the_entry_of_its_close() {
    for (data, record) in [
        ("daemon", "async"),
        ("passthrough", "async"),
        ("daemon", "sync"),
        ("passthrough", "sync"),
    ] {
        let tm = mount_with(data, record);
        let data = format!("{data}, --record {record}");
        python(
            &tm,
            r#"
import os
for i in range(100):
    with open('t.tmp', 'w') as f:
        f.write('version %d\n' % i)
    os.rename('t.tmp', 'target.rs')
    with open('again.rs', 'w') as f:
        f.write('first %d\n' % i)
    with open('again.rs', 'w') as f:
        f.write('second %d\n' % i)
    with open('mode.sh', 'w') as f:
        f.write('echo %d\n' % i)
    os.chmod('mode.sh', 0o755 if i % 2 else 0o700)
    with open('gone.rs', 'w') as f:
        f.write('gone %d\n' % i)
    os.link('gone.rs', 'kept.rs')
    os.unlink('gone.rs')
    os.unlink('kept.rs')
"#,
        );
        // `--record async`: the renames of t.tmp, closed just before, were answered before
        // the entry of its close was written (theirs follow it, below).
        let deferred = tm.status()["counters"]["record"]["renames_deferred"].as_u64();
        if record == "async" {
            assert!(deferred.unwrap() > 0, "{data}: no rename was deferred");
        }
        let ledger = without_rerecords(tm.mutations());
        // t.tmp made anew right after each rename: its CREATE comes after that RENAME.
        let kinds: Vec<&str> = ledger
            .iter()
            .filter(|e| e["path"] == "t.tmp" || e["from"] == "t.tmp")
            .map(|e| e["mutation_type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds.len(), 300, "{data}: {kinds:?}");
        for (k, c) in kinds.chunks(3).enumerate() {
            assert_eq!(c, ["CREATE", "WRITE", "RENAME"], "{data}: iteration {k}");
        }
        // The temporary file: WRITE of t.tmp with its content, then the RENAME, each time.
        let t: Vec<&Value> = ledger
            .iter()
            .filter(|e| e["path"] == "t.tmp" || e["path"] == "target.rs")
            .filter(|e| e["mutation_type"] != "CREATE")
            .collect();
        let mut i = 0;
        for pair in t.chunks(2) {
            assert_eq!(pair[0]["mutation_type"], "WRITE", "{data}: {}", pair[0]);
            assert_eq!(pair[0]["path"], "t.tmp", "{data}: {}", pair[0]);
            let want = sha(format!("version {i}\n").as_bytes());
            assert_eq!(pair[0]["content_hash"], want, "{data}: iteration {i}");
            assert_eq!(pair[1]["mutation_type"], "RENAME", "{data}: {}", pair[1]);
            assert_eq!(pair[1]["content_hash"], want, "{data}: iteration {i}");
            i += 1;
        }
        assert_eq!(i, 100, "{data}: every save is on record");
        // Written twice in a row: two WRITEs, each with its own content, in order.
        let again: Vec<&Value> = ledger
            .iter()
            .filter(|e| e["path"] == "again.rs" && e["mutation_type"] == "WRITE")
            .collect();
        assert_eq!(again.len(), 200, "{data}");
        for (k, e) in again.iter().enumerate() {
            let word = if k % 2 == 0 { "first" } else { "second" };
            assert_eq!(
                e["content_hash"],
                sha(format!("{word} {}\n", k / 2).as_bytes()),
                "{data}: write {k} of again.rs"
            );
        }
        // Each close of mode.sh comes before the chmod that followed it.
        let mode: Vec<&str> = ledger
            .iter()
            .filter(|e| e["path"] == "mode.sh" && e["mutation_type"] != "CREATE")
            .map(|e| e["mutation_type"].as_str().unwrap())
            .collect();
        let pairs: Vec<&[&str]> = mode.chunks(2).collect();
        assert_eq!(pairs.len(), 100, "{data}: {mode:?}");
        for p in pairs {
            assert_eq!(p, ["WRITE", "CHMOD"], "{data}: {mode:?}");
        }
        // gone.rs: written, linked, deleted; the deleted content was kept and named.
        let gone: Vec<&Value> = ledger
            .iter()
            .filter(|e| e["path"] == "gone.rs" || e["from"] == "gone.rs")
            .filter(|e| e["mutation_type"] != "CREATE")
            .collect();
        for (k, p) in gone.chunks(3).enumerate() {
            let kinds: Vec<&str> = p
                .iter()
                .map(|e| e["mutation_type"].as_str().unwrap())
                .collect();
            assert_eq!(kinds, ["WRITE", "LINK", "DELETE"], "{data}: iteration {k}");
            let want = sha(format!("gone {k}\n").as_bytes());
            assert_eq!(p[0]["content_hash"], want, "{data}");
        }
        assert_eq!(gone.len(), 300, "{data}");
        assert!(!tm.w("gone.rs").exists() && !tm.w("kept.rs").exists());
        assert_eq!(tm.ws_bytes("target.rs"), b"version 99\n");
    }
}

/// The entries less the `WRITE`s that record again the content already on record for
/// their path. The kernel delivers a handle's release when it likes: on a loaded machine
/// it can come after the agent closed the file, changed its name or mode, or wrote it
/// again through a newer handle and closed that too; the release then finds the file
/// changed since its own close and records what is there, which the later entries already
/// did (both record modes). A release that comes while a newer handle of the same identity
/// has the file open leaves the change to it (that is not a re-record: it would be a
/// truncation taken for the old handle's content, and the test fails on it).
fn without_rerecords(entries: Vec<Value>) -> Vec<Value> {
    let mut last: HashMap<String, Value> = HashMap::new();
    entries
        .into_iter()
        .filter(|e| {
            let path = e["path"].as_str().unwrap_or("").to_string();
            let h = e["content_hash"].clone();
            let again =
                e["mutation_type"] == "WRITE" && h.is_string() && last.get(&path) == Some(&h);
            if h.is_string() {
                last.insert(path, h);
            }
            !again
        })
        .collect()
}

/// What `tar x` does to every file (create with mode 0600, write, `fchmod` to the mode of
/// the archive, close) and to every directory: the mode changes' entries are written after
/// their reply, by the recorder (its count of jobs done grows by one per change), yet each
/// lands in the order the agent acted (after the file's `CREATE`, before the `CHMOD` that
/// followed it; before the rename that follows it), with the modes before and after, the
/// process that made it, and the intent it was made under, even when the agent switches
/// intent right after.
#[test]
fn mode_changes_are_recorded_after_their_reply_in_order_under_their_intent() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        let done = |tm: &TestMount| tm.status()["counters"]["record"]["done"].as_u64().unwrap();
        let before = done(&tm);
        python(
            &tm,
            "import os\nos.mkdir('d', 0o700)\nfor i in range(40):\n    \
             fd = os.open('d/m%02d.sh' % i, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n    \
             os.write(fd, b'echo %d\\n' % i)\n    os.fchmod(fd, 0o755)\n    os.close(fd)\n    \
             os.chmod('d/m%02d.sh' % i, 0o750)\nos.chmod('d', 0o755)\n\
             open('x.sh', 'w').write('x')\nos.chmod('x.sh', 0o700)\nos.rename('x.sh', 'y.sh')\n\
             open('.intentfs/intent', 'w').write('DOCS')\n",
        );
        assert_eq!(tm.ctl("intent"), "DOCS\n", "{data}");
        // 41 closes and 82 mode changes, every one through the recorder.
        let jobs = done(&tm) - before;
        assert!(
            jobs >= 123,
            "{data}: {jobs} jobs for 41 closes and 82 mode changes"
        );
        let ledger = tm.mutations();
        for i in 0..40 {
            let rel = format!("d/m{i:02}.sh");
            let kinds: Vec<(String, String)> = of(&ledger, &rel)
                .iter()
                .map(|e| {
                    let mode = e["detail"]["mode_after"].as_str().unwrap_or("").to_owned();
                    (e["mutation_type"].as_str().unwrap().to_owned(), mode)
                })
                .collect();
            let want: Vec<(String, String)> = [
                ("CREATE", ""),
                ("CHMOD", "755"),
                ("WRITE", ""),
                ("CHMOD", "750"),
            ]
            .iter()
            .map(|(k, m)| ((*k).to_owned(), (*m).to_owned()))
            .collect();
            assert_eq!(kinds, want, "{data}: {rel}");
            for e in of(&ledger, &rel)
                .iter()
                .filter(|e| e["mutation_type"] == "CHMOD")
            {
                assert_eq!(e["intent_id"], "ALL", "{data}: {e}");
                assert_eq!(e["agent"]["process"], "python3", "{data}: {e}");
            }
            assert_eq!(
                std::fs::metadata(tm.w(&rel)).unwrap().permissions().mode() & 0o777,
                0o750,
                "{data}: {rel}"
            );
        }
        let dir = of(&ledger, "d");
        assert_eq!(dir.len(), 2, "{data}: {dir:?}");
        assert_eq!(dir[1]["mutation_type"], "CHMOD", "{data}: {dir:?}");
        assert_eq!(dir[1]["detail"]["mode_before"], "700", "{data}: {dir:?}");
        assert_eq!(dir[1]["detail"]["mode_after"], "755", "{data}: {dir:?}");
        // A rename right after a mode change waits for its entry: the CHMOD names the file
        // by the name it had.
        let at = |mt: &str, path: &str| {
            ledger
                .iter()
                .position(|e| e["mutation_type"] == mt && e["path"] == path)
                .unwrap_or_else(|| panic!("{data}: no {mt} of {path}"))
        };
        assert!(at("CHMOD", "x.sh") < at("RENAME", "y.sh"), "{data}");
        let (passed, v) = verify(&tm.ws);
        assert!(passed, "{data}: verify: {v}");
    }
}

/// `renameat2(x, d, RENAME_EXCHANGE)` of a file with a directory moves the directory
/// (attack pass): the entries still owed below it (a mode change, a close), which name the
/// files by their paths before the exchange, are written first, while a close of a large
/// file keeps the recorder busy. Before, only a directory as the source waited, and the
/// `CHMOD d/f` landed after the exchange had made `d` a file.
#[test]
fn an_exchange_of_a_file_with_a_directory_comes_after_the_entries_owed_below_it() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        python(
            &tm,
            "import os, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n\
             os.mkdir('d')\nopen('d/f', 'w').write('hi\\n')\nopen('x', 'w').write('file\\n')\n\
             fd = os.open('big.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
             os.pwrite(fd, b'x', 64 << 20)\nos.close(fd)\n\
             os.chmod('d/f', 0o600)\nopen('d/g', 'w').write('g\\n')\n\
             r = libc.syscall(316, -100, b'x', -100, b'd', 2)\n\
             assert r == 0, os.strerror(ctypes.get_errno())\n",
        );
        assert!(tm.w("x").is_dir(), "{data}: the exchange did not happen");
        let ledger = tm.mutations();
        let at = |mt: &str, path: &str| {
            ledger
                .iter()
                .position(|e| e["mutation_type"] == mt && e["path"] == path)
                .unwrap_or_else(|| panic!("{data}: no {mt} of {path}: {ledger:#?}"))
        };
        let exchange = ledger
            .iter()
            .position(|e| e["mutation_type"] == "RENAME" && e["detail"]["exchange"] == true)
            .unwrap_or_else(|| panic!("{data}: no exchange"));
        assert!(
            at("CHMOD", "d/f") < exchange,
            "{data}: CHMOD d/f after the exchange"
        );
        assert!(
            at("WRITE", "d/g") < exchange,
            "{data}: WRITE d/g after the exchange"
        );
        let (passed, v) = verify(&tm.ws);
        assert!(passed, "{data}: verify: {v}");
    }
}

/// A close made under one intent is recorded under it, even when the agent switches
/// intent right after (the switch waits for the queue).
#[test]
fn a_close_right_before_an_intent_switch_keeps_its_intent() {
    let tm = mount("daemon");
    tm.sh_ok(
        "for i in 1 2 3 4 5 6 7 8; do echo $i > docs_$i.txt; done; echo DOCS > .intentfs/intent",
    );
    assert_eq!(tm.ctl("intent"), "DOCS\n");
    let ledger = tm.mutations();
    for i in 1..=8 {
        let e = ledger
            .iter()
            .rfind(|e| e["path"] == format!("docs_{i}.txt") && e["mutation_type"] == "WRITE")
            .unwrap_or_else(|| panic!("no WRITE of docs_{i}.txt"));
        assert_eq!(e["intent_id"], "ALL", "{e}");
    }
}

/// `intentfs log` right after an agent's close shows it: the command asks the mount for
/// the closes it still owes before it reads the ledger.
#[test]
fn intentfs_log_right_after_a_close_shows_it() {
    let tm = mount("passthrough");
    for i in 0..20 {
        std::fs::write(tm.m(&format!("n{i}.rs")), format!("fn n{i}() {{}}\n")).unwrap();
        let out = intentfs()
            .args(["log", "--json", "--path"])
            .arg(format!("n{i}.rs"))
            .arg(&tm.ws)
            .output()
            .unwrap();
        let text = ok(out, "intentfs log");
        assert!(
            text.contains("\"WRITE\"")
                && text.contains(&sha(format!("fn n{i}() {{}}\n").as_bytes())),
            "the close of n{i}.rs is not in `intentfs log`: {text}"
        );
    }
}

/// A daemon killed while closes are queued: what was recorded is intact (a torn last line
/// at most, repaired at the next mount), and every file whose close was lost is named by
/// `ledger verify` as drift. Nothing goes unseen.
#[test]
fn a_killed_daemon_loses_only_queued_closes_and_verify_names_each() {
    let mut tm = TestMount::builder()
        .policy(ALL_AND_DOCS)
        .intent("ALL")
        .arg("--record")
        .arg("async")
        .mount();
    // Large files take the recorder a while each (hash, compress, store): the queue fills.
    let v = killed_after(
        &mut tm,
        "import os, sys\nfor i in range(40):\n    \
         open('big%02d.bin' % i, 'wb').write(os.urandom(1 << 20) * 4)\n    \
         print(i, flush=True)\n",
        20,
    );
    let drift: HashMap<String, Value> = v["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["path"].as_str().unwrap().to_string(), d.clone()))
        .collect();
    let ledger = read_ledger(&tm.w(LEDGER_REL));
    let mut recorded = 0;
    let mut lost = 0;
    let mut unanswered = 0;
    for i in 0..40 {
        let rel = format!("big{i:02}.bin");
        let Ok(bytes) = std::fs::read(tm.w(&rel)) else {
            continue;
        };
        let named = ledger.iter().any(|e| e["path"] == rel.as_str());
        let last = ledger
            .iter()
            .rfind(|e| e["path"] == rel.as_str() && e["content_hash"].is_string());
        match last {
            Some(e) if e["content_hash"] == sha(&bytes) => recorded += 1,
            // Made in the workspace, but the daemon died before the CREATE entry was on
            // record, so the create was never answered and nothing was written to the
            // file: an empty file no entry names (a file with bytes must have an entry).
            None if !named && bytes.is_empty() => unanswered += 1,
            _ => {
                assert!(
                    drift.contains_key(&rel),
                    "{rel} ({} bytes, {} entries name it): its close is not on record and verify does not say so: {v}",
                    bytes.len(),
                    ledger.iter().filter(|e| e["path"] == rel.as_str()).count()
                );
                lost += 1;
            }
        }
    }
    assert!(recorded >= 1, "nothing was recorded before the kill");
    assert!(
        unanswered <= 1,
        "{unanswered} creates cut off by the kill: one at most is in flight"
    );
    eprintln!("closes on record {recorded}, lost with the daemon {lost}, creates not answered {unanswered}");
}

/// Found by the attack pass on this mode: a directory renamed right after a file below it
/// was closed took the file's entry along (it was written after the directory's RENAME,
/// under a path the file never had at its close), and a file whose node the kernel forgot
/// before its entry was written (memory pressure; here `drop_caches`) was recorded as
/// "detached" and then reported as drift. The entry now names the file as it was when its
/// close was answered, with the process that closed it, and a directory rename first waits
/// for the entries owed below it.
#[test]
fn a_directory_renamed_or_a_node_forgotten_after_a_close_keeps_the_entry_right() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dropper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // (Root only; elsewhere the forgetting is left to chance.)
                    let _ = std::fs::write("/proc/sys/vm/drop_caches", "2");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            })
        };
        python(
            &tm,
            r#"
import os
for i in range(40):
    open('warm.bin', 'wb').write(b'w' * (4 << 20))   # a close the recorder takes a while on
    os.makedirs('dC%d/deep' % i)
    open('dC%d/deep/x' % i, 'w').write('hi %d\n' % i)
    os.rename('dC%d' % i, 'dD%d' % i)
    os.makedirs('f%d/deep' % i)
    open('f%d/deep/x' % i, 'w').write('stay %d\n' % i)
"#,
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        dropper.join().unwrap();
        let ledger = tm.ledger();
        for i in 0..40 {
            let write = ledger
                .iter()
                .position(|e| {
                    e["mutation_type"] == "WRITE" && e["path"] == format!("dC{i}/deep/x").as_str()
                })
                .unwrap_or_else(|| {
                    panic!("{data}: no WRITE of dC{i}/deep/x under its name at close")
                });
            let rename = ledger
                .iter()
                .position(|e| {
                    e["mutation_type"] == "RENAME" && e["from"] == format!("dC{i}").as_str()
                })
                .unwrap_or_else(|| panic!("{data}: no RENAME of dC{i}"));
            assert!(
                write < rename,
                "{data}: the WRITE of dC{i}/deep/x after its directory's RENAME"
            );
            assert_eq!(
                ledger[write]["content_hash"],
                sha(format!("hi {i}\n").as_bytes())
            );
        }
        for e in ledger.iter().filter(|e| e["mutation_type"] == "WRITE") {
            assert_ne!(e["detail"]["detached"], true, "{data}: {e}");
            assert_ne!(e["agent"]["process"], "", "{data}: no process named: {e}");
        }
        let (passed, v) = verify(&tm.ws);
        assert!(passed, "{data}: {v}");
        assert_eq!(v["drift"], serde_json::json!([]), "{data}: {v}");
    }
}

/// Renames answered before their entry (an edit by rename of a temporary just closed) and
/// lost with a killed daemon leave nothing unexplained: every file whose content is not
/// the last the ledger gives it is named by `ledger verify`.
#[test]
fn a_killed_daemon_with_renames_queued_leaves_each_one_to_verify() {
    let mut tm = TestMount::builder()
        .policy(ALL_AND_DOCS)
        .intent("ALL")
        .arg("--record")
        .arg("async")
        .mount();
    python(
        &tm,
        "for i in range(30):\n    open('e%02d.bin' % i, 'w').write('first %d\\n' % i)\n\
         open('.intentfs/status').read()\n",
    );
    // Large temporaries take the recorder a while each: their renames queue behind them.
    let v = killed_after(
        &mut tm,
        "import os\nfor i in range(30):\n    \
         open('e%02d.tmp' % i, 'wb').write(os.urandom(1 << 20) * 4)\n    \
         os.rename('e%02d.tmp' % i, 'e%02d.bin' % i)\n    \
         open('n%02d.tmp' % i, 'wb').write(os.urandom(1 << 20) * 4)\n    \
         os.rename('n%02d.tmp' % i, 'n%02d.new' % i)\n    \
         print(i, flush=True)\n",
        15,
    );
    let drift: Vec<String> = v["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap().to_string())
        .collect();
    let ledger = read_ledger(&tm.w(LEDGER_REL));
    let (mut recorded, mut lost) = (0, 0);
    for i in 0..30 {
        let rel = format!("e{i:02}.bin");
        let bytes = std::fs::read(tm.w(&rel)).unwrap();
        let last = ledger
            .iter()
            .rfind(|e| e["path"] == rel.as_str() && e["content_hash"].is_string());
        if last.is_some_and(|e| e["content_hash"] == sha(&bytes)) {
            recorded += 1;
        } else {
            assert!(
                drift.contains(&rel),
                "{rel} ({} bytes): its rename is not on record and verify does not say so: {v}",
                bytes.len()
            );
            lost += 1;
        }
    }
    // Renamed to a free name: the new name is on record with its content, or the old name
    // is named by verify (missing, or unfinished when its close was lost too).
    for i in 0..30 {
        let (tmp, new) = (format!("n{i:02}.tmp"), format!("n{i:02}.new"));
        let Ok(bytes) = std::fs::read(tm.w(&new)) else {
            continue;
        };
        let last = ledger
            .iter()
            .rfind(|e| e["path"] == new.as_str() && e["content_hash"].is_string());
        if last.is_some_and(|e| e["content_hash"] == sha(&bytes)) {
            recorded += 1;
        } else {
            assert!(
                drift.contains(&tmp) || drift.contains(&new),
                "{new} ({} bytes): its rename from {tmp} is not on record and verify names neither: {v}",
                bytes.len()
            );
            lost += 1;
        }
    }
    let renamed = ledger
        .iter()
        .filter(|e| e["mutation_type"] == "RENAME")
        .count();
    assert!(renamed >= 1, "no rename was recorded before the kill");
    eprintln!("files explained {recorded}, renames lost with the daemon {lost}");
}

/// Another identity renaming a file whose close is still being recorded waits for that
/// entry, as any change does: only the identity whose own entries a file owes may rename
/// it before they are on record. (A large file keeps the recorder busy past the second
/// agent's start.)
#[test]
fn another_identity_renaming_a_file_just_closed_waits_for_its_entry() {
    let tm = mount("passthrough");
    let dir = tempfile::tempdir().unwrap();
    let agent = |name: &str, code: &str| {
        let mut c = intentfs();
        c.arg("run")
            .arg("--mount")
            .arg(&tm.mnt)
            .args(["--intent", "ALL", "--agent", name, "--"])
            .args(["python3", "-I", "-c", code])
            .current_dir(&tm.mnt);
        c
    };
    for i in 0..3 {
        // The mover waits on a pipe outside the mount and renames as soon as the writer has
        // closed its file: while the recorder is still hashing and keeping it.
        let fifo = dir.path().join(format!("go{i}"));
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let mover = agent(
            "mover",
            &format!(
                "import os\nopen({f:?}).read()\nos.rename('x{i}.bin', 'y{i}.bin')\n",
                f = fifo.to_str().unwrap()
            ),
        )
        .spawn()
        .unwrap();
        let out = agent(
            "writer",
            &format!(
                "import os\nopen('x{i}.bin', 'wb').write(os.urandom(1 << 20) * 48)\nopen({f:?}, 'w').write('go')\n",
                f = fifo.to_str().unwrap()
            ),
        )
        .output()
        .unwrap();
        ok(out, "writer");
        ok(mover.wait_with_output().unwrap(), "mover");
    }
    let deferred = tm.status()["counters"]["record"]["renames_deferred"].as_u64();
    assert_eq!(
        deferred,
        Some(0),
        "another identity's rename went before the entries owed"
    );
    let ledger = tm.mutations();
    for i in 0..3 {
        let (x, y) = (format!("x{i}.bin"), format!("y{i}.bin"));
        let at = |kind: &str, path: &str| {
            ledger
                .iter()
                .position(|e| e["mutation_type"] == kind && e["path"] == path)
                .unwrap_or_else(|| panic!("no {kind} of {path}"))
        };
        let (w, r) = (at("WRITE", &x), at("RENAME", &y));
        assert!(
            w < r,
            "the RENAME of {x} came before the WRITE of its close"
        );
        assert_eq!(ledger[w]["agent"]["name"], "writer");
        assert_eq!(ledger[r]["agent"]["name"], "mover");
        assert_eq!(ledger[r]["content_hash"], ledger[w]["content_hash"]);
        assert_eq!(ledger[r]["content_hash"], sha(&tm.ws_bytes(&y)));
    }
}

/// Sparse 1 GiB files closed one after another: cheap to write, long to hash. Their
/// entries keep the recorder seconds behind.
const BACKLOG: &str = "import os, time\n\
for i in range(3):\n    \
    f = open('big%d.bin' % i, 'wb')\n    \
    f.truncate(1 << 30)\n    \
    f.seek((1 << 30) - 1)\n    \
    f.write(b'x')\n    \
    f.close()\n";

fn position(ledger: &[Value], what: &str, f: impl Fn(&Value) -> bool) -> usize {
    ledger
        .iter()
        .position(f)
        .unwrap_or_else(|| panic!("no {what} in {ledger:#?}"))
}

/// An editor's save (write t.tmp, rename it over t, make t.tmp again) while the recorder
/// is seconds behind: the second `CREATE` of t.tmp waits for the `RENAME` that vacated the
/// name, however long. (Found by a review: a wait of at most 2 s wrote it first.)
#[test]
fn a_name_made_again_waits_for_the_rename_that_vacated_it_however_long() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        python(
            &tm,
            "open('t', 'w').write('zero\\n')\nopen('.intentfs/status').read()\n",
        );
        python(
            &tm,
            &format!(
                "{BACKLOG}\
open('t.tmp', 'w').write('one\\n')\n\
os.rename('t.tmp', 't')\n\
open('t.tmp', 'w').write('two\\n')\n"
            ),
        );
        let ledger = tm.mutations();
        let kinds: Vec<String> = ledger
            .iter()
            .filter(|e| e["path"] == "t.tmp" || e["from"] == "t.tmp")
            .map(|e| format!("{} {}", e["mutation_type"].as_str().unwrap(), e["path"]))
            .collect();
        let rename = position(&ledger, "RENAME", |e| {
            e["mutation_type"] == "RENAME" && e["from"] == "t.tmp"
        });
        let creates: Vec<usize> = ledger
            .iter()
            .enumerate()
            .filter(|(_, e)| e["mutation_type"] == "CREATE" && e["path"] == "t.tmp")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(creates.len(), 2, "{data}: {kinds:?}");
        assert!(
            creates[1] > rename,
            "{data}: t.tmp made again is on record before the RENAME that vacated it: {kinds:?}"
        );
        assert_eq!(
            ledger[rename]["content_hash"],
            sha(b"one\n"),
            "{data}: {kinds:?}"
        );
        let (ok, v) = verify(&tm.ws);
        assert!(ok, "{data}: {v}");
    }
}

/// Kernel passthrough: a handle that made a file and wrote nothing records its `WRITE` at
/// its release, under the names the file has when the release runs. A rename of the file
/// right after waits for it (found by a review: passed, the release's entry named the new
/// path before the `RENAME` that put the file there).
#[test]
fn a_release_naming_the_file_when_it_runs_is_not_passed_by_a_rename() {
    let tm = mount("passthrough");
    python(
        &tm,
        "open('u', 'w').write('old\\n')\nopen('.intentfs/status').read()\n",
    );
    python(
        &tm,
        &format!(
            "{BACKLOG}\
fd = os.open('u.tmp', os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)\n\
os.close(fd)\n\
time.sleep(0.3)\n\
os.rename('u.tmp', 'u')\n"
        ),
    );
    let ledger = tm.mutations();
    let rename = position(&ledger, "RENAME", |e| {
        e["mutation_type"] == "RENAME" && e["from"] == "u.tmp"
    });
    let first = position(&ledger, "WRITE of u", |e| {
        e["mutation_type"] == "WRITE" && e["path"] == "u"
    });
    let misplaced: Vec<&Value> = ledger[first + 1..rename]
        .iter()
        .filter(|e| e["path"] == "u")
        .collect();
    assert!(
        misplaced.is_empty(),
        "entries naming u before the RENAME that put the file there: {misplaced:#?}"
    );
}

/// A file opened to read only and closed owes no entry: its release is not queued on the
/// recorder, so what the agent does next to the file (a save over it, a write open) does
/// not wait for the recorder's queue. An editor reads a file, then saves over it.
#[test]
fn a_close_of_a_file_read_only_queues_nothing() {
    for data in ["daemon", "passthrough"] {
        let tm = mount(data);
        let done = |tm: &TestMount| tm.status()["counters"]["record"]["done"].as_u64().unwrap();
        python(&tm, "open('r.rs', 'w').write('fn a() {}\\n')\n");
        let before = done(&tm);
        python(
            &tm,
            "import os\nfor i in range(50):\n    open('r.rs', 'rb').read()\n    \
             os.stat('r.rs')\n",
        );
        assert_eq!(
            done(&tm),
            before,
            "{data}: reads queued jobs on the recorder"
        );
        // Read, then save over it by rename, 20 times: each save is on record in order.
        python(
            &tm,
            "import os\nfor i in range(20):\n    d = open('r.rs', 'rb').read()\n    \
             open('r.tmp', 'wb').write(d + b'// %d\\n' % i)\n    os.rename('r.tmp', 'r.rs')\n",
        );
        let ledger = tm.mutations();
        let renames = of(&ledger, "r.tmp")
            .iter()
            .filter(|e| e["mutation_type"] == "RENAME" && e["path"] == "r.rs")
            .count();
        assert_eq!(renames, 20, "{data}");
        let body = std::fs::read_to_string(tm.ws.join("r.rs")).unwrap();
        assert!(body.ends_with("// 19\n"), "{data}: {body}");
        let (ok, v) = verify(&tm.ws);
        assert!(ok, "{data}: {v}");
    }
}
