//! The content store through real mounts (issue 20, part 1): every content hash the
//! ledger names resolves to the bytes it names, whatever changed the file (`sed -i`,
//! Python, shell redirections, `truncate`, `rm`, `mv` over, `copy_file_range`, large
//! files); equal contents are one object; a `kill -9` of the daemon leaves complete
//! objects and entries whose hashes resolve; `intentfs gc` keeps what retention says; the
//! store cannot be seen or written through the mount, by an agent under another uid
//! trying names, `..`, symlinks and listings; reflinks on a real btrfs.
//!
//! Every check is on the backing files, the store's files and the ledger.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::deploy::*;
use common::*;
use intentfs::store::Store;
use serde_json::Value;

fn store_of(ws: &Path) -> Store {
    Store::open_existing(&Store::default_dir(ws))
        .unwrap()
        .expect("the mount created its store")
}

/// The objects of a store, loose or packed: their hashes, sorted.
fn object_hashes(dir: &Path) -> Vec<String> {
    let Some(s) = Store::open_existing(dir).unwrap() else {
        return Vec::new();
    };
    let mut out: Vec<String> = s.objects().unwrap().into_iter().map(|o| o.hash).collect();
    out.sort();
    out
}

/// The files a store keeps objects in: loose objects and packs (not its temporaries or its
/// gc log).
fn object_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        if !sub.file_type().unwrap().is_dir() {
            continue;
        }
        for e in std::fs::read_dir(sub.path()).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !n.starts_with('.') {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Every content hash entries name, with the entry naming it.
fn named_hashes(entries: &[Value]) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for e in entries {
        for k in ["content_hash", "prev_content_hash"] {
            if let Some(h) = e[k].as_str() {
                out.push((h.to_owned(), e));
            }
        }
    }
    out
}

/// Each hash an entry names is in the store with the bytes it names, unless the entry
/// says why it was not kept (`detail.version`).
fn assert_all_resolve(store: &Store, entries: &[Value]) -> usize {
    let mut resolved = 0;
    for (h, e) in named_hashes(entries) {
        let v = &e["detail"]["version"];
        let excused = v["kept"] == false
            && v["hashes"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == h.as_str()));
        match store.get(&h).unwrap() {
            Some(bytes) => {
                assert_eq!(sha(&bytes), h);
                resolved += 1;
            }
            None => assert!(
                excused,
                "{h} does not resolve and the entry does not say why: {e:#}"
            ),
        }
    }
    resolved
}

fn entries_of<'a>(l: &'a [Value], t: &str, path: &str) -> Vec<&'a Value> {
    l.iter()
        .filter(|e| e["mutation_type"] == t && e["path"] == path)
        .collect()
}

fn mount() -> TestMount {
    TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[
            ("notes.txt", "one\ntwo\nthree\n"),
            ("old.txt", "the old content\n"),
            ("gone.txt", "deleted but kept\n"),
            ("trunc.txt", "to be truncated\n"),
            ("trunc2.txt", "truncated by path\n"),
            ("replaced.txt", "replaced by mv\n"),
        ])
        .mount()
}

// ----- what every kind of change keeps ---------------------------------------------------

#[test]
fn every_version_a_session_names_resolves_to_its_bytes() {
    let tm = mount();
    let py = python();
    // A large file (over the 1 MiB range limit: stored from the file, not from memory).
    let big: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| b"abcdefghij\n"[(i % 11) as usize])
        .collect();
    put(&tm.w("big.bin"), &big);
    tm.sh_ok("sed -i 's/two/TWO/' notes.txt");
    tm.sh_ok("echo new > old.txt");
    tm.sh_ok("rm gone.txt");
    tm.sh_ok("truncate -s 3 trunc.txt");
    tm.sh_ok(&format!(
        "{py} -c \"import os; os.truncate('trunc2.txt', 9)\""
    ));
    tm.sh_ok("printf 'moved in\\n' > src.tmp && mv src.tmp replaced.txt");
    tm.sh_ok(&format!(
        "{py} -c \"open('py.txt','w').write('from python\\n'); open('py.txt','a').write('more\\n')\""
    ));
    // copy_file_range into an existing file, and an edit of the large file in place.
    tm.sh_ok(&format!(
        "{py} -c \"import os\nsrc=os.open('notes.txt',os.O_RDONLY)\ndst=os.open('old.txt',os.O_WRONLY)\nos.copy_file_range(src,dst,4,0,0)\nos.close(src); os.close(dst)\nf=open('big.bin','r+b'); f.seek(1000); f.write(b'XYZ'); f.close()\""
    ));
    let l = tm.ledger();
    let store = store_of(&tm.ws);
    let resolved = assert_all_resolve(&store, &l);
    assert!(resolved >= 12, "only {resolved} hashes resolved: {l:#?}");
    let get = |h: &Value| {
        let hs = h
            .as_str()
            .unwrap_or_else(|| panic!("no hash where one was expected: {l:#?}"));
        store.get(hs).unwrap().unwrap()
    };

    // sed -i: a rename over notes.txt; both versions.
    let r = entries_of(&l, "RENAME", "notes.txt");
    let r = r.last().unwrap();
    assert_eq!(get(&r["prev_content_hash"]), b"one\ntwo\nthree\n");
    assert_eq!(get(&r["content_hash"]), b"one\nTWO\nthree\n");
    // `>`: O_TRUNC at open keeps the old content before the open empties it.
    let b = entries_of(&l, "WRITE_BEGIN", "old.txt");
    assert_eq!(get(&b[0]["prev_content_hash"]), b"the old content\n");
    let w = entries_of(&l, "WRITE", "old.txt");
    assert_eq!(get(&w[0]["content_hash"]), b"new\n");
    // copy_file_range: the content before it and after it.
    assert_eq!(get(&w.last().unwrap()["prev_content_hash"]), b"new\n");
    assert_eq!(get(&w.last().unwrap()["content_hash"]), b"one\n");
    assert_eq!(tm.ws_bytes("old.txt"), b"one\n");
    // rm: the DELETE names what it removed.
    let d = entries_of(&l, "DELETE", "gone.txt");
    assert_eq!(get(&d[0]["prev_content_hash"]), b"deleted but kept\n");
    // truncate(1) truncates through its own write handle: the handle's WRITE has both.
    let t = entries_of(&l, "WRITE", "trunc.txt");
    assert_eq!(get(&t[0]["prev_content_hash"]), b"to be truncated\n");
    assert_eq!(get(&t[0]["content_hash"]), b"to ");
    // truncate(2) by path: the TRUNCATE entry has both.
    let t = entries_of(&l, "TRUNCATE", "trunc2.txt");
    assert_eq!(get(&t[0]["prev_content_hash"]), b"truncated by path\n");
    assert_eq!(get(&t[0]["content_hash"]), b"truncated");
    // mv over a file: the replaced content and the new one.
    let m = entries_of(&l, "RENAME", "replaced.txt");
    assert_eq!(get(&m[0]["prev_content_hash"]), b"replaced by mv\n");
    assert_eq!(get(&m[0]["content_hash"]), b"moved in\n");
    // Python, two handles: each WRITE's before and after.
    let p = entries_of(&l, "WRITE", "py.txt");
    assert_eq!(
        get(&p.last().unwrap()["content_hash"]),
        b"from python\nmore\n"
    );
    assert_eq!(
        get(&p.last().unwrap()["prev_content_hash"]),
        b"from python\n"
    );
    // The large file: its version before the in-place edit, and after.
    let bw = entries_of(&l, "WRITE", "big.bin");
    let bw = bw.last().unwrap();
    assert_eq!(get(&bw["prev_content_hash"]), big);
    let mut edited = big.clone();
    edited[1000..1003].copy_from_slice(b"XYZ");
    assert_eq!(get(&bw["content_hash"]), edited);
    // Compressed on disk (this text compresses well): the store is smaller than the data.
    let on_disk: u64 = store.objects().unwrap().iter().map(|o| o.size).sum();
    assert!(
        on_disk < big.len() as u64 / 4,
        "store takes {on_disk} bytes"
    );
}

#[test]
fn a_thousand_files_with_the_same_content_are_one_object() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .mount();
    tm.sh_ok(
        "mkdir -p same && i=0; while [ $i -lt 1000 ]; do printf 'the same bytes everywhere\\n' > same/f$i; i=$((i+1)); done",
    );
    let l = tm.ledger();
    let writes: Vec<&Value> = l.iter().filter(|e| e["mutation_type"] == "WRITE").collect();
    assert_eq!(writes.len(), 1000);
    let h = sha(b"the same bytes everywhere\n");
    assert!(writes.iter().all(|e| e["content_hash"] == h.as_str()));
    let store = store_of(&tm.ws);
    let objects = object_hashes(store.dir());
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        store.get(&h).unwrap().unwrap(),
        b"the same bytes everywhere\n"
    );
    // The empty content every CREATE names resolves without an object.
    assert_eq!(assert_all_resolve(&store, &l), 2000);
    // What the daemon says it did: one object written, 999 puts answered by it.
    let v = &tm.status()["counters"]["versions"];
    assert_eq!(v["written"], 1, "{v}");
    assert_eq!(v["deduplicated"], 999, "{v}");
}

#[test]
fn a_version_not_kept_says_why_in_its_entry() {
    let policy =
        format!("{ALLOW_ALL}\nversions:\n  max_file_size: 1 KiB\n  exclude: [\"logs/**\"]\n");
    let tm = TestMount::builder()
        .policy(&policy)
        .intent("ALL")
        .files(&[("small.txt", "kept\n")])
        .mount();
    tm.sh_ok("head -c 4096 /dev/zero | tr '\\0' x > large.txt");
    tm.sh_ok("mkdir -p logs && echo line > logs/app.log");
    tm.sh_ok("echo edited > small.txt");
    let l = tm.ledger();
    let store = store_of(&tm.ws);
    assert_all_resolve(&store, &l);
    let w = entries_of(&l, "WRITE", "large.txt");
    let v = &w[0]["detail"]["version"];
    assert_eq!(v["kept"], false, "{:#}", w[0]);
    assert!(
        v["reason"].as_str().unwrap().contains("over the 1 KiB cap"),
        "{v}"
    );
    assert_eq!(v["hashes"][0], w[0]["content_hash"]);
    assert!(!store.has(w[0]["content_hash"].as_str().unwrap()));
    let g = entries_of(&l, "WRITE", "logs/app.log");
    let v = &g[0]["detail"]["version"];
    assert_eq!(v["kept"], false);
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains("excluded by versions.exclude \"logs/**\""),
        "{v}"
    );
    // What the policy keeps has no such note.
    let s = entries_of(&l, "WRITE", "small.txt");
    assert!(s[0]["detail"].get("version").is_none(), "{:#}", s[0]);
    assert_eq!(
        store
            .get(s[0]["prev_content_hash"].as_str().unwrap())
            .unwrap()
            .unwrap(),
        b"kept\n"
    );

    // Versions off: every entry naming content says so.
    let off = format!("{ALLOW_ALL}\nversions:\n  enabled: false\n");
    let tm = TestMount::builder()
        .policy(&off)
        .intent("ALL")
        .files(&[("a.txt", "before\n")])
        .mount();
    tm.sh_ok("echo after > a.txt");
    let l = tm.ledger();
    let w = entries_of(&l, "WRITE", "a.txt");
    assert!(
        w[0]["detail"]["version"]["reason"]
            .as_str()
            .unwrap()
            .contains("versions off"),
        "{:#}",
        w[0]
    );
    assert!(object_hashes(&Store::default_dir(&tm.ws)).is_empty());
}

// ----- kill -9 ---------------------------------------------------------------------------

/// Each writer rewrites its files (small and over 1 MiB, so both paths of the store run)
/// and logs what was acknowledged.
const WRITER: &str = r#"
import os, sys
k, log = sys.argv[1], sys.argv[2]
lg = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
try:
    for i in range(100000):
        name = f"w{k}_{i % 7}.txt"
        size = 2_000_000 if i % 5 == 0 else 300
        with open(name, "w") as f:
            f.write((f"writer {k} round {i} " * (size // 20 + 1))[:size])
        os.write(lg, (name + "\n").encode())
        if i % 3 == 0:
            os.unlink(name)
except OSError:
    sys.exit(0)
"#;

#[test]
fn kill_9_between_object_and_entry_loses_neither() {
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .mount();
    let script = tm.root.join("writer.py");
    std::fs::write(&script, WRITER).unwrap();
    for round in 0..3u64 {
        let logs: Vec<PathBuf> = (0..3)
            .map(|k| tm.root.join(format!("w{round}_{k}.log")))
            .collect();
        let mut writers: Vec<_> = (0..3)
            .map(|k| {
                Command::new(python())
                    .arg(&script)
                    .arg(k.to_string())
                    .arg(&logs[k])
                    .current_dir(&tm.mnt)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        assert!(wait_until(Duration::from_secs(20), || {
            logs.iter()
                .map(|l| std::fs::metadata(l).map(|m| m.len()).unwrap_or(0))
                .sum::<u64>()
                > 300
        }));
        // A different point of the storm each round.
        std::thread::sleep(Duration::from_millis(150 + 230 * round));
        let mut d = tm.take_child();
        d.kill().unwrap(); // SIGKILL
        d.wait().unwrap();
        for w in &mut writers {
            let deadline = Instant::now() + Duration::from_secs(20);
            while w.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "a writer hangs after the kill");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        tm.detach_dead();

        // Every intact entry's hashes resolve (a torn last line is the ledger's to
        // repair at the next mount), and every object is whole: `get` checks each one's
        // bytes against its name, and a partial object would fail to decompress.
        let raw = std::fs::read(tm.w(LEDGER_REL)).unwrap();
        let entries: Vec<Value> = raw
            .split(|&b| b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let store = store_of(&tm.ws);
        let resolved = assert_all_resolve(&store, &entries);
        assert!(resolved > 10, "round {round}: {resolved} hashes resolved");
        let objects = store.objects().unwrap();
        for o in &objects {
            assert!(
                store.get(&o.hash).unwrap().is_some(),
                "round {round}: object {} unreadable",
                o.path.display()
            );
        }
        // Nothing named an object that is not there, and the killed daemon's unfinished
        // writes are the ledger's to report, not the store's.
        tm.remount();
    }
}

// ----- gc ----------------------------------------------------------------------------------

#[test]
fn gc_keeps_what_retention_says_and_records_what_it_removed() {
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a.txt", "version 1\n")])
        .mount();
    tm.sh_ok("echo 'version 2' > a.txt && echo 'version 3' > a.txt && echo other > b.txt");
    let l = tm.ledger();
    let store = store_of(&tm.ws);
    let v1 = sha(b"version 1\n");
    let v3 = sha(b"version 3\n");
    assert!(store.has(&v1) && store.has(&v3));
    let before = object_hashes(store.dir());
    assert_eq!(before.len(), 4, "{before:?}");

    // Everything is minutes old: --keep 30d, and even --keep 1s, remove nothing (what was
    // written in the last 10 minutes is never removed: an entry may be on its way).
    for keep in ["30d", "1s"] {
        let out = intentfs()
            .args(["gc", "--keep", keep, "--json"])
            .arg(&tm.ws)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["removed"].as_array().unwrap().len(), 0, "{r:#}");
        assert_eq!(r["objects_after"], 4);
    }
    // Age the objects and the entries naming v1 and v2 by 40 days (the objects' mtimes;
    // the ledger's timestamps are rewritten in a copy, as an old ledger would have them).
    // (Unmounted first: the objects a daemon keeps are in its pack, which gc leaves alone
    // while the daemon appends to it; a pack sealed is unpacked by gc, its objects taking
    // the pack's time.)
    tm.stop();
    let old = std::time::SystemTime::now() - Duration::from_secs(40 * 86_400);
    for p in &object_files(store.dir()) {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    let aged = tm.root.join("aged.jsonl");
    // Every entry up to the last one naming version 2 (the WRITE of version 3 names it
    // as its `prev_content_hash`) is 40 days old; b.txt's are recent.
    let v2 = sha(b"version 2\n");
    let last_v2 = l
        .iter()
        .rposition(|e| e["content_hash"] == v2.as_str() || e["prev_content_hash"] == v2.as_str())
        .unwrap();
    let lines: Vec<String> = l
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut e = e.clone();
            if i <= last_v2 {
                e["timestamp"] = Value::from("2020-01-01T00:00:00.000000Z");
            }
            e.to_string()
        })
        .collect();
    std::fs::write(&aged, lines.join("\n") + "\n").unwrap();
    let gc = |extra: &[&str]| {
        let out = intentfs()
            .arg("gc")
            .args(extra)
            .args(["--json", "--ledger"])
            .arg(&aged)
            .arg(&tm.ws)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let removed = |r: &Value| -> BTreeSet<String> {
        r["removed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["hash"].as_str().unwrap().to_owned())
            .collect()
    };
    // A dry run says what would go and removes nothing.
    let dry = gc(&["--keep", "30d", "--dry-run"]);
    let want: BTreeSet<String> = [v1.clone(), v2.clone(), v3.clone()].into_iter().collect();
    assert_eq!(removed(&dry), want, "{dry:#}");
    assert_eq!(object_hashes(store.dir()), before);
    let r = gc(&["--keep", "30d"]);
    assert_eq!(removed(&r), want, "{r:#}");
    assert_eq!(r["packs_unpacked"], 1, "the mount's pack: {r:#}");
    assert!(!store.has(&v1) && !store.has(&v2) && !store.has(&v3));
    assert!(store.has(&sha(b"other\n")));
    // The current content of a.txt is still whole, through the mount and in the store.
    tm.start();
    assert_eq!(std::fs::read(tm.m("a.txt")).unwrap(), b"version 3\n");
    // On record: the gc log in the store, with why and when.
    let (when, rec) = intentfs::store::gc::removal_of(&store, &v1)
        .unwrap()
        .unwrap();
    assert_eq!(when, r["timestamp"].as_str().unwrap());
    assert_eq!(rec.why, intentfs::store::gc::Why::Expired);
    // The text report.
    let out = intentfs()
        .args(["gc", "--keep", "30d", "--ledger"])
        .arg(&aged)
        .arg(&tm.ws)
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(said.contains("removed 0 of 1 version "), "{said}");
    assert!(said.contains("kept 1 version "), "{said}");
    // Bad values are explained.
    let out = intentfs()
        .args(["gc", "--keep", "thirty days"])
        .arg(&tm.ws)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--keep"),
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("hint: a duration such as 30d"));
}

// ----- the store is not part of the mount --------------------------------------------------

#[test]
fn the_store_is_neither_visible_nor_writable_through_the_mount() {
    if skip_unless(
        is_root() && have("setpriv"),
        "needs root (an agent under another uid)",
    ) {
        return;
    }
    let l = Layout::with(ALLOW_ALL, &[("config/secret.txt", "SECRET-MARKER-42\n")]);
    let (_m, _) = l.mount(&["--allow-other", "--intent", "ALL", "--approver", "deny"]);
    // A version of the secret goes to the store: root deletes it through the mount.
    std::fs::remove_file(l.mnt.join("config/secret.txt")).unwrap();
    let store = Store::default_dir(&l.ws);
    let objects = object_files(&store);
    assert!(!objects.is_empty());
    let obj = objects[0]
        .strip_prefix(&store)
        .unwrap()
        .display()
        .to_string();
    // As root in the mount: not listed, not found.
    let listing: Vec<String> = std::fs::read_dir(l.mnt.join(".orchestration"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!listing.iter().any(|n| n == "objects"), "{listing:?}");
    assert_eq!(
        errno_of(
            std::fs::metadata(l.mnt.join(".orchestration/objects")),
            "stat"
        ),
        libc::ENOENT
    );
    // An agent under another uid tries every road in.
    let script = format!(
        r#"
set +e
try() {{ "$@" >/dev/null 2>&1 && echo "REACHED: $*"; }}
try ls .orchestration/objects
try ls -a .orchestration/objects/
try cat .orchestration/objects/{obj}
try stat src/../.orchestration/objects
try stat ./.orchestration/./objects/.
try cd .orchestration/objects
ls -a .orchestration | grep -x objects && echo "REACHED: listed"
find . -name '*.zst' -o -name '*.raw' -o -name gc.jsonl | grep . && echo "REACHED: find"
grep -rl SECRET-MARKER-42 . 2>/dev/null | grep . && echo "REACHED: grep"
ln -s .orchestration/objects link1 2>/dev/null; try ls link1/
ln -s ../.orchestration/objects docs/link2 2>/dev/null; try ls docs/link2/
ln -s {store} link3 2>/dev/null; try ls link3/
try cat {store}/{obj}
try mkdir .orchestration/objects
try sh -c 'echo x > .orchestration/objects/planted'
try sh -c 'echo x > .orchestration/objects/{obj}'
try mv docs .orchestration/objects
try {py} -c "import os; os.open('.orchestration/objects', os.O_RDONLY)"
try {py} -c "import os; fd=os.open('.orchestration', os.O_RDONLY); os.open('objects', os.O_RDONLY, dir_fd=fd)"
try {py} -c "import os; print(os.listdir('.orchestration/objects'))"
echo done
"#,
        obj = obj,
        store = store.display(),
        py = python(),
    );
    let out = run_agent(&l, &["--intent", "ALL", "--agent", "prober"], &script);
    let said = text(&out.stdout);
    assert!(said.contains("done"), "{said}{}", text(&out.stderr));
    assert!(!said.contains("REACHED"), "{said}");
    // The store is as it was: nothing planted, nothing replaced.
    assert_eq!(object_files(&store), objects);
    assert!(!store.join("planted").exists());
    let s = Store::open_existing(&store).unwrap().unwrap();
    for o in s.objects().unwrap() {
        assert!(s.get(&o.hash).unwrap().is_some());
    }
    assert_eq!(
        s.get(&sha(b"SECRET-MARKER-42\n")).unwrap().unwrap(),
        b"SECRET-MARKER-42\n"
    );
}

#[test]
fn a_store_inside_the_workspace_outside_orchestration_is_refused() {
    require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(ws.join(POLICY_REL), ALLOW_ALL).unwrap();
    let out = intentfs()
        .args(["mount", "--store"])
        .arg(ws.join("versions"))
        .arg(&ws)
        .arg(&mnt)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert!(
        e.contains("inside the workspace but not under its .orchestration/"),
        "{e}"
    );
    assert!(e.contains("hint: put it outside the workspace"), "{e}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_store_outside_the_workspace_is_named_in_the_mount_entry_and_found_by_gc() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .arg("--store")
        .arg("{root}/elsewhere")
        .files(&[("a.txt", "first\n")])
        .mount();
    tm.sh_ok("echo second > a.txt");
    let dir = tm.root.join("elsewhere");
    let s = Store::open_existing(&dir).unwrap().unwrap();
    assert_eq!(s.get(&sha(b"first\n")).unwrap().unwrap(), b"first\n");
    assert!(!Store::default_dir(&tm.ws).exists());
    let m = tm
        .ledger()
        .into_iter()
        .rfind(|e| e["mutation_type"] == "MOUNT")
        .unwrap();
    assert_eq!(m["detail"]["store"], dir.display().to_string());
    let ledger = tm.w(LEDGER_REL);
    assert_eq!(intentfs::store::dir_of(&tm.ws, &ledger), dir);
    let out = intentfs()
        .args(["gc", "--dry-run", "--json"])
        .arg(&tm.ws)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["objects_before"], 2, "{r:#}");
}

// ----- reflinks ----------------------------------------------------------------------------

/// On a filesystem with reflinks (a real btrfs, on a loop device), an object is a clone
/// of the file: no bytes copied, and it stays the old version when the file changes.
#[test]
fn on_btrfs_an_object_is_a_reflink_clone() {
    if skip_unless(is_root(), "needs root (a loop mount)") {
        return;
    }
    assert!(
        have("mkfs.btrfs"),
        "mkfs.btrfs is needed (.ci/run installs btrfs-progs)"
    );
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let mnt = dir.path().join("btrfs");
    std::fs::create_dir_all(&mnt).unwrap();
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(160 << 20).unwrap();
    drop(f);
    let mk = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg(&img)
        .output()
        .unwrap();
    assert!(mk.status.success(), "{}", text(&mk.stderr));
    let m = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(m.status.success(), "mount -o loop: {}", text(&m.stderr));
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Umount(mnt.clone());
    let s = Store::open(&mnt.join("objects")).unwrap();
    let p = mnt.join("data");
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    let h = sha(&data);
    let put = s
        .put_file_counted(&std::fs::File::open(&p).unwrap(), &h)
        .unwrap();
    assert_eq!(put, intentfs::store::Put::Cloned);
    let (path, kind) = s.locate(&h).unwrap();
    assert_eq!(kind, intentfs::store::Kind::Raw);
    assert!(path.to_string_lossy().ends_with(".raw"));
    // The clone shares the file's blocks: btrfs counts them once.
    let du = Command::new("btrfs")
        .args(["filesystem", "du", "-s", "--raw"])
        .arg(&mnt)
        .output()
        .unwrap();
    let said = text(&du.stdout);
    let shared: u64 = said
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(shared >= 4 << 20, "btrfs filesystem du: {said}");
    // Changing the file leaves the version whole.
    std::fs::write(&p, b"changed").unwrap();
    assert_eq!(s.get(&h).unwrap().unwrap(), data);
    let _ = BTreeMap::<u8, u8>::new();
}
