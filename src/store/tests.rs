//! The store on a real directory: dedup, zstd round trip, the reflink attempt and its
//! fallback, complete-or-absent objects, concurrent puts of one object.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;

use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(&d.path().join("objects")).unwrap();
    (d, s)
}

/// Every file under `dir`, recursively (objects and temporaries).
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn open_creates_0700_and_open_existing_tells_absent() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("a/b/objects");
    assert!(Store::open_existing(&dir).unwrap().is_none());
    let s = Store::open(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(s.dir(), dir);
    assert!(Store::open_existing(&dir).unwrap().is_some());
    assert_eq!(
        Store::default_dir(Path::new("/w")),
        Path::new("/w/.orchestration/objects")
    );
    // A file where the store should be: a clear error, not a panic.
    fs::write(d.path().join("f"), b"x").unwrap();
    let e = Store::open(&d.path().join("f")).unwrap_err().to_string();
    assert!(e.contains("content store"), "{e}");
}

#[test]
fn put_bytes_round_trips_through_zstd_at_the_ledgers_hash() {
    let (_d, s) = store();
    let text = "fn main() { println!(\"hello\"); }\n".repeat(2000);
    let h = s.put_bytes(text.as_bytes()).unwrap();
    assert_eq!(h, sha256_bytes(text.as_bytes()));
    assert!(s.has(&h));
    let hex = &h["sha256:".len()..];
    let obj = s.dir().join(&hex[..2]).join(format!("{}.zst", &hex[2..]));
    assert!(obj.is_file(), "{obj:?}");
    // Really zstd (its magic number) and really compressed.
    let on_disk = fs::read(&obj).unwrap();
    assert_eq!(&on_disk[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
    assert!(on_disk.len() * 10 < text.len(), "{} bytes", on_disk.len());
    assert_eq!(s.get(&h).unwrap().unwrap(), text.as_bytes());
    // Empty content is an object too (a created file's first hash names it).
    let e = s.put_bytes(b"").unwrap();
    assert_eq!(s.get(&e).unwrap().unwrap(), b"");
    // Binary bytes.
    let bin: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let b = s.put_bytes(&bin).unwrap();
    assert_eq!(s.get(&b).unwrap().unwrap(), bin);
}

#[test]
fn get_of_an_absent_or_malformed_hash() {
    let (_d, s) = store();
    let absent = sha256_bytes(b"never stored");
    assert!(!s.has(&absent));
    assert!(s.get(&absent).unwrap().is_none());
    for bad in ["sha256:xyz", "md5:00", "", &"A".repeat(64)] {
        let e = s.get(bad).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        assert!(e.to_string().contains("not a content hash"), "{e}");
        assert!(!s.has(bad));
    }
}

#[test]
fn same_content_is_one_object() {
    let (_d, s) = store();
    let mut hashes = std::collections::BTreeSet::new();
    for _ in 0..1000 {
        hashes.insert(s.put_bytes(b"same bytes in a thousand files\n").unwrap());
    }
    assert_eq!(hashes.len(), 1);
    assert_eq!(files(s.dir()).len(), 1);
    assert_eq!(s.counters.written.load(Ordering::Relaxed), 1);
    assert_eq!(s.counters.deduplicated.load(Ordering::Relaxed), 999);
    // A file with that content: no write either.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("f");
    fs::write(&p, b"same bytes in a thousand files\n").unwrap();
    let put = s
        .put_file_counted(&File::open(&p).unwrap(), hashes.first().unwrap())
        .unwrap();
    assert_eq!(put, Put::Present);
    assert_eq!(files(s.dir()).len(), 1);
}

#[test]
fn put_file_stores_a_file_and_refuses_one_that_does_not_match_its_hash() {
    let (d, s) = store();
    let p = d.path().join("big");
    // Larger than the streaming buffer, so the put streams several reads.
    let data: Vec<u8> = (0..3 * BUF + 17).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(&p, &data).unwrap();
    let h = sha256_bytes(&data);
    let f = File::open(&p).unwrap();
    let put = s.put_file_counted(&f, &h).unwrap();
    assert!(matches!(put, Put::Compressed | Put::Cloned), "{put:?}");
    assert_eq!(s.get(&h).unwrap().unwrap(), data);
    // The caller's hash is not the file's: nothing kept under it, no temp left.
    let wrong = sha256_bytes(b"other");
    let (d2, s2) = store();
    let e = s2.put_file_counted(&f, &wrong);
    // A clone cannot check the bytes (that would read them); a compressed put can.
    if s2.counters.cloned.load(Ordering::Relaxed) == 0 {
        let e = e.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("changed while it was stored"), "{e}");
        assert!(!s2.has(&wrong));
        assert!(files(s2.dir()).is_empty(), "{:?}", files(s2.dir()));
    }
    drop(d2);
}

#[test]
fn reflink_is_attempted_and_falls_back_to_zstd_where_unsupported() {
    // tmpfs has no FICLONE: the first put tries it, gets EOPNOTSUPP/EINVAL/EXDEV, stops
    // trying, and compresses; the object is still complete and readable.
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let s = Store::open(&base.path().join("objects")).unwrap();
    let p = base.path().join("f");
    fs::write(&p, b"cloned or compressed\n".repeat(100)).unwrap();
    let data = fs::read(&p).unwrap();
    let h = sha256_bytes(&data);
    let put = s.put_file_counted(&File::open(&p).unwrap(), &h).unwrap();
    let is_tmpfs = nix::sys::statfs::statfs(base.path())
        .map(|st| st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        .unwrap_or(false);
    if is_tmpfs {
        assert_eq!(put, Put::Compressed);
        assert!(
            !s.reflink.load(Ordering::Relaxed),
            "FICLONE not given up on tmpfs"
        );
    }
    assert_eq!(s.get(&h).unwrap().unwrap(), data);
}

#[test]
fn a_clone_is_kept_raw_where_the_filesystem_reflinks() {
    // Only where this test's temp dir supports FICLONE (btrfs, XFS): elsewhere the
    // fallback above is what runs; tests/store.rs mounts a real btrfs image for this.
    let (d, s) = store();
    let p = d.path().join("f");
    let data = b"reflinked content\n".repeat(1000);
    fs::write(&p, &data).unwrap();
    let h = sha256_bytes(&data);
    let put = s.put_file_counted(&File::open(&p).unwrap(), &h).unwrap();
    if put == Put::Cloned {
        let (path, kind) = s.locate(&h).unwrap();
        assert_eq!(kind, Kind::Raw);
        assert_eq!(fs::read(path).unwrap(), data);
        // The clone is a snapshot: the file changing does not change it.
        fs::write(&p, b"changed").unwrap();
        assert_eq!(s.get(&h).unwrap().unwrap(), data);
    }
}

#[test]
fn an_interrupted_put_leaves_no_object_and_its_temp_is_swept() {
    let (_d, s) = store();
    let h = sha256_bytes(b"half written");
    let hex = parse_hash(&h).unwrap().to_owned();
    // What a daemon killed between write and rename leaves: a temp, no object.
    let (tmp, mut f) = s.temp(&hex).unwrap();
    f.write_all(b"half").unwrap();
    drop(f);
    assert!(!s.has(&h));
    assert!(s.get(&h).unwrap().is_none());
    assert!(
        s.objects().unwrap().is_empty(),
        "a temp listed as an object"
    );
    // Young temps may be puts in progress: kept.
    assert_eq!(
        s.sweep_temps(std::time::Duration::from_secs(3600)).unwrap(),
        0
    );
    assert!(tmp.exists());
    assert_eq!(s.sweep_temps(std::time::Duration::ZERO).unwrap(), 1);
    assert!(!tmp.exists());
    // The put then succeeds as usual.
    s.put_bytes(b"half written").unwrap();
    assert_eq!(s.get(&h).unwrap().unwrap(), b"half written");
}

#[test]
fn a_damaged_object_is_an_error_not_wrong_content() {
    let (_d, s) = store();
    let h = s.put_bytes(b"original").unwrap();
    let (path, _) = s.locate(&h).unwrap();
    // Another valid zstd frame, of other bytes, under this name.
    fs::write(&path, zstd::bulk::compress(b"tampered", 3).unwrap()).unwrap();
    let e = s.get(&h).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("damaged"), "{e}");
    // Not zstd at all.
    fs::write(&path, b"garbage").unwrap();
    assert!(s.get(&h).is_err());
}

#[test]
fn concurrent_puts_of_one_object_leave_one_complete_object() {
    let (_d, s) = store();
    let s = Arc::new(s);
    let data: Arc<Vec<u8>> = Arc::new(b"raced content\n".repeat(50_000));
    let h = sha256_bytes(&data);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (s, data) = (Arc::clone(&s), Arc::clone(&data));
            std::thread::spawn(move || {
                for _ in 0..20 {
                    assert_eq!(s.put_bytes(&data).unwrap(), sha256_bytes(&data));
                    // Readers meanwhile see the whole object or none.
                    if let Some(got) = s.get(&sha256_bytes(&data)).unwrap() {
                        assert_eq!(got.len(), data.len());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(files(s.dir()).len(), 1, "{:?}", files(s.dir()));
    assert_eq!(s.get(&h).unwrap().unwrap(), *data);
}

#[test]
fn objects_lists_and_remove_removes() {
    let (_d, s) = store();
    let a = s.put_bytes(b"a").unwrap();
    let b = s.put_bytes(b"b").unwrap();
    let mut listed: Vec<String> = s.objects().unwrap().into_iter().map(|o| o.hash).collect();
    listed.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(listed, want);
    assert!(s.remove(&a).unwrap());
    assert!(!s.remove(&a).unwrap());
    assert!(!s.has(&a));
    assert!(s.has(&b));
}

#[test]
fn put_file_hashing_hashes_while_storing_and_deduplicates() {
    let (d, s) = store();
    let p = d.path().join("f");
    let data = b"hashed as it is stored\n".repeat(30_000);
    fs::write(&p, &data).unwrap();
    let (h, put) = s.put_file_hashing(&File::open(&p).unwrap()).unwrap();
    assert_eq!(h, sha256_bytes(&data));
    assert_eq!(put, Put::Compressed);
    assert_eq!(s.get(&h).unwrap().unwrap(), data);
    let (h2, put2) = s.put_file_hashing(&File::open(&p).unwrap()).unwrap();
    assert_eq!((h2, put2), (h.clone(), Put::Present));
    // One object, no temporary left behind (the second put's was removed).
    assert_eq!(files(s.dir()).len(), 1, "{:?}", files(s.dir()));
}

/// A ledger line naming `hash` at `ts` (only what gc reads; gc does not verify the chain).
fn line(ts: chrono::DateTime<chrono::Utc>, content: Option<&str>, prev: Option<&str>) -> String {
    serde_json::json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "timestamp": ts.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "intent_id": null,
        "mutation_type": "WRITE",
        "path": "f",
        "content_hash": content,
        "prev_content_hash": prev,
        "outcome": "ok",
        "prev": "0".repeat(64),
    })
    .to_string()
}

/// Set the mtime of the file at `p` (an object, a pack).
fn set_mtime(p: &Path, t: std::time::SystemTime) {
    File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

fn age(s: &Store, hash: &str, t: std::time::SystemTime) {
    set_mtime(&s.locate(hash).unwrap().0, t);
}

/// The objects a gc removed (or would), in its order.
fn removed(r: &super::gc::Report) -> Vec<&str> {
    r.removed.iter().map(|x| x.hash.as_str()).collect()
}

#[test]
fn gc_keeps_what_recent_entries_name_and_logs_what_it_removed() {
    use super::gc::{gc, removal_of, Retention, Why};
    use std::time::{Duration, SystemTime};
    let (d, s) = store();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let old = now - 40 * day;
    let a = s.put_bytes(b"named 40 days ago").unwrap();
    let b = s.put_bytes(b"named 10 days ago (and 40)").unwrap();
    let c = s
        .put_bytes(b"named by nothing, written 40 days ago")
        .unwrap();
    let e = s.put_bytes(b"named by nothing, written just now").unwrap();
    let p = s.put_bytes(b"a prev_content_hash 5 days ago").unwrap();
    for h in [&a, &b, &c, &p] {
        age(&s, h, old);
    }
    let ledger = d.path().join("agent_trace.jsonl");
    let ts = |t: SystemTime| chrono::DateTime::<chrono::Utc>::from(t);
    let lines = [
        line(ts(old), Some(&a), Some(&b)),
        line(ts(now - 10 * day), Some(&b), None),
        line(ts(now - 5 * day), Some(EMPTY), Some(&p)),
    ];
    fs::write(&ledger, lines.join("\n") + "\n").unwrap();
    let keep30 = Retention {
        keep: Some(30 * day),
        max_size: None,
    };

    // A dry run decides the same and removes nothing.
    let r = gc(&s, &ledger, &keep30, now, true).unwrap();
    let mut gone = removed(&r);
    gone.sort();
    let mut want = vec![a.as_str(), c.as_str()];
    want.sort();
    assert_eq!(gone, want);
    assert!(s.has(&a) && s.has(&c));
    assert!(!s.dir().join(super::gc::GC_LOG).exists());

    let r = gc(&s, &ledger, &keep30, now, false).unwrap();
    assert_eq!(r.removed.len(), 2);
    assert!(r.removed.iter().all(|x| x.why == Why::Expired));
    assert!(!s.has(&a) && !s.has(&c));
    for kept in [&b, &e, &p] {
        assert!(s.has(kept), "{kept} removed");
    }
    assert_eq!(r.objects_after, 3);
    assert_eq!(r.freed_bytes + r.bytes_after, r.bytes_before);
    // On record, with the reason and the last entry naming it.
    let (when, rec) = removal_of(&s, &a).unwrap().unwrap();
    assert_eq!(when, r.timestamp);
    assert_eq!(rec.why, Why::Expired);
    assert!(rec.last_referenced.is_some());
    assert!(removal_of(&s, &c)
        .unwrap()
        .unwrap()
        .1
        .last_referenced
        .is_none());
    assert!(removal_of(&s, &b).unwrap().is_none());
    // Nothing more to do: nothing logged.
    let before = fs::read_to_string(s.dir().join(super::gc::GC_LOG)).unwrap();
    let r = gc(&s, &ledger, &keep30, now, false).unwrap();
    assert!(r.removed.is_empty());
    assert_eq!(
        fs::read_to_string(s.dir().join(super::gc::GC_LOG)).unwrap(),
        before
    );
}

#[test]
fn gc_with_a_size_budget_removes_the_oldest_referenced_first() {
    use super::gc::{gc, Retention, Why};
    use std::time::{Duration, SystemTime};
    let (d, s) = store();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    // Incompressible, so each object takes about its size on disk.
    let blob = |seed: u64| -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..64 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let hashes: Vec<String> = (0..4).map(|i| s.put_bytes(&blob(i)).unwrap()).collect();
    let ts = |t: SystemTime| chrono::DateTime::<chrono::Utc>::from(t);
    // hashes[i] last named (4 - i) days ago: hashes[0] is the oldest.
    let lines: Vec<String> = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| line(ts(now - (4 - i as u32) * day), Some(h), None))
        .collect();
    for h in &hashes {
        age(&s, h, now - 10 * day);
    }
    let ledger = d.path().join("agent_trace.jsonl");
    fs::write(&ledger, lines.join("\n") + "\n").unwrap();
    let total: u64 = s.objects().unwrap().iter().map(|o| o.disk).sum();
    let one = total / 4;
    // Room for a bit more than two objects: the two oldest go.
    let budget = Retention {
        keep: None,
        max_size: Some(2 * one + one / 2),
    };
    let r = gc(&s, &ledger, &budget, now, false).unwrap();
    let gone = removed(&r);
    assert_eq!(gone, vec![hashes[0].as_str(), hashes[1].as_str()]);
    assert!(r.removed.iter().all(|x| x.why == Why::OverBudget));
    assert!(s.has(&hashes[2]) && s.has(&hashes[3]));
    assert_eq!(r.over_budget_bytes, 0);
    // `keep` wins over the budget: what a recent entry names stays, and the report says
    // by how much the store is still over.
    let both = Retention {
        keep: Some(30 * day),
        max_size: Some(1),
    };
    let r = gc(&s, &ledger, &both, now, false).unwrap();
    assert!(r.removed.is_empty());
    assert!(r.over_budget_bytes > 0);
}

#[test]
fn gc_puts_back_an_object_a_put_reused_meanwhile() {
    use std::time::{Duration, SystemTime};
    let (_d, s) = store();
    let h = s.put_bytes(b"reused").unwrap();
    age(&s, &h, SystemTime::now() - Duration::from_secs(86_400 * 40));
    let listed = s.objects().unwrap().pop().unwrap();
    // The daemon reuses it (dedup) after gc listed it and before gc removes it.
    assert_eq!(s.put_bytes(b"reused").unwrap(), h);
    let r = s.remove_unless_used(&listed, SystemTime::now()).unwrap();
    assert!(matches!(r, super::gc::Removal::Reused));
    assert_eq!(s.get(&h).unwrap().unwrap(), b"reused");
    // Not reused: removed.
    age(&s, &h, SystemTime::now() - Duration::from_secs(86_400 * 40));
    let r = s.remove_unless_used(&listed, SystemTime::now()).unwrap();
    assert!(matches!(r, super::gc::Removal::Removed));
    assert!(!s.has(&h));
}

#[test]
fn deferred_durability_syncs_once_and_an_empty_object_counts_as_absent() {
    let (_d, s) = store();
    s.defer_sync();
    assert!(s.sync().is_ok(), "nothing written: nothing to do");
    let h = s.put_bytes(b"synced by the ledger's group commit").unwrap();
    assert!(s.unsynced.load(Ordering::Relaxed));
    s.sync().unwrap();
    assert!(!s.unsynced.load(Ordering::Relaxed));
    // What a power cut leaves of an object whose data never reached the disk: its name,
    // empty. Not present: the next put writes it again.
    let (path, _) = s.locate(&h).unwrap();
    fs::write(&path, b"").unwrap();
    assert!(!s.touch(&h));
    assert_eq!(
        s.put_bytes_hashed(b"synced by the ledger's group commit", &h)
            .unwrap(),
        Put::Compressed
    );
    assert_eq!(
        s.get(&h).unwrap().unwrap(),
        b"synced by the ledger's group commit"
    );
}

// ----- packs ---------------------------------------------------------------------------

/// A store that packs, as a mounted daemon's.
fn packing() -> (tempfile::TempDir, Store) {
    let (d, s) = store();
    s.defer_sync();
    s.use_packs();
    (d, s)
}

fn packs(s: &Store) -> Vec<PathBuf> {
    s.pack_paths().unwrap()
}

#[test]
fn packed_objects_round_trip_for_this_store_and_any_reader() {
    let (_d, s) = packing();
    let a = "fn a() {}\n".repeat(300);
    let ha = s.put_bytes(a.as_bytes()).unwrap();
    let hb = s.put_bytes(b"b\n").unwrap();
    // One pack, no loose object, no temporary.
    let all = files(s.dir());
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(all[0].starts_with(s.dir().join("packs")), "{all:?}");
    assert_eq!(s.put_bytes_hashed(a.as_bytes(), &ha).unwrap(), Put::Present);
    assert!(s.has(&ha) && s.touch(&ha));
    assert_eq!(s.get(&ha).unwrap().unwrap(), a.as_bytes());
    // Another process's view (a CLI reader) finds both, in the pack in use.
    let r = Store::open_existing(s.dir()).unwrap().unwrap();
    assert_eq!(r.get(&hb).unwrap().unwrap(), b"b\n");
    assert!(r.has(&ha));
    assert!(!r.has(&sha256_bytes(b"never stored")));
    assert!(!s.has(&sha256_bytes(b"never stored")));
    assert_eq!(r.get(&sha256_bytes(b"never stored")).unwrap(), None);
    let listed = r.objects().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|o| o.kind == Kind::Packed && o.in_use));
    // Compressed in the pack.
    assert!(fs::metadata(&packs(&s)[0]).unwrap().len() < a.len() as u64 / 4);
    // Durable with the group commit: the sync clears what it owed.
    s.sync().unwrap();
    assert!(!s.pack_unsynced.load(Ordering::Relaxed));
    let c = s.put_bytes(b"c").unwrap();
    assert!(s.pack_unsynced.load(Ordering::Relaxed));
    s.sync().unwrap();
    assert!(r.has(&c));
    // Larger objects stay loose files.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let big: Vec<u8> = (0..3_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let hbig = s.put_bytes(&big).unwrap();
    assert_eq!(s.locate(&hbig).unwrap().1, Kind::Zstd);
    assert_eq!(r.get(&hbig).unwrap().unwrap(), big);
}

/// A pack's torn tail (an append a crash cut, a power cut's zeros) hides only the record
/// it tore; a damaged frame is an error, never wrong content.
#[test]
fn a_torn_or_damaged_pack_loses_only_what_it_tore() {
    let (_d, s) = packing();
    let h1 = s.put_bytes(b"first\n").unwrap();
    let h2 = s.put_bytes(&b"second\n".repeat(100)).unwrap();
    let pack = packs(&s)[0].clone();
    drop(s);
    let len = fs::metadata(&pack).unwrap().len();
    let reader = |p: &Path| {
        Store::open_existing(p.parent().unwrap().parent().unwrap())
            .unwrap()
            .unwrap()
    };
    for cut in [len - 1, len - 10, len - 40] {
        let f = File::options().write(true).open(&pack).unwrap();
        f.set_len(cut).unwrap();
        let r = reader(&pack);
        assert_eq!(r.get(&h1).unwrap().unwrap(), b"first\n");
        assert_eq!(r.get(&h2).unwrap(), None, "cut at {cut}");
        assert!(!r.has(&h2));
        // Zeros where the rest of the record was (a power cut's): never wrong content.
        f.set_len(len).unwrap();
        let r = reader(&pack);
        assert_eq!(r.get(&h1).unwrap().unwrap(), b"first\n");
        match r.get(&h2) {
            Ok(None) => assert_eq!(r.objects().unwrap().len(), 1),
            Ok(Some(b)) => panic!("cut at {cut}: {} bytes of wrong content", b.len()),
            Err(e) => assert!(e.to_string().contains(".pack"), "{e}"),
        }
    }
    // A flipped byte in the first frame: an error naming the pack.
    let mut bytes = fs::read(&pack).unwrap();
    bytes[16 + 48 + 5] ^= 0x55;
    fs::write(&pack, &bytes).unwrap();
    let e = reader(&pack).get(&h1).unwrap_err();
    assert!(e.to_string().contains(".pack"), "{e}");
}

/// gc unpacks a sealed pack into loose objects (with the pack's time, so none looks
/// younger or older than it is), then judges them as any; a pack a daemon holds is left
/// alone, and its objects are never removed.
#[test]
fn gc_unpacks_sealed_packs_and_leaves_the_one_in_use() {
    use super::gc::{gc, Retention};
    use std::time::{Duration, SystemTime};
    let (d, s) = packing();
    let old = s.put_bytes(b"old version\n").unwrap();
    let kept = s.put_bytes(b"named lately\n").unwrap();
    let sealed = packs(&s)[0].clone();
    // The daemon's pack is sealed (as after SEAL_AFTER, or when it exits): another one
    // takes the next objects.
    drop(s);
    let when = SystemTime::now() - Duration::from_secs(40 * 86_400);
    set_mtime(&sealed, when);
    let daemon = Store::open(&d.path().join("objects")).unwrap();
    daemon.defer_sync();
    daemon.use_packs();
    let young = daemon.put_bytes(b"in the pack in use\n").unwrap();
    assert_eq!(packs(&daemon).len(), 2);
    let ledger = d.path().join("ledger.jsonl");
    fs::write(&ledger, line(chrono::Utc::now(), Some(&kept), None) + "\n").unwrap();
    // A dry run judges packed objects where they are and changes nothing.
    let cli = Store::open_existing(&d.path().join("objects"))
        .unwrap()
        .unwrap();
    let keep = Retention {
        keep: Some(Duration::from_secs(86_400)),
        max_size: None,
    };
    let dry = gc(&cli, &ledger, &keep, SystemTime::now(), true).unwrap();
    assert_eq!(removed(&dry), [old.as_str()]);
    assert_eq!((packs(&cli).len(), dry.packs_unpacked), (2, 0));
    let r = gc(&cli, &ledger, &keep, SystemTime::now(), false).unwrap();
    assert_eq!(removed(&r), [old.as_str()]);
    assert_eq!(r.packs_unpacked, 1);
    // The sealed pack is gone, its named object loose with the pack's time; the pack in
    // use is whole.
    assert_eq!(packs(&cli), vec![packs(&daemon)[0].clone()]);
    assert_ne!(packs(&cli)[0], sealed);
    let (p, kind) = cli.locate(&kept).unwrap();
    assert_eq!(kind, Kind::Zstd);
    assert_eq!(fs::metadata(p).unwrap().modified().unwrap(), when);
    assert_eq!(cli.get(&kept).unwrap().unwrap(), b"named lately\n");
    assert!(!cli.has(&old));
    assert_eq!(cli.get(&young).unwrap().unwrap(), b"in the pack in use\n");
    // Even a budget of nothing removes no object of the pack in use.
    let none = Retention {
        keep: None,
        max_size: Some(0),
    };
    let r = gc(
        &cli,
        &ledger,
        &none,
        SystemTime::now() + Duration::from_secs(3600),
        false,
    )
    .unwrap();
    assert!(
        !r.removed.iter().any(|x| x.hash == young),
        "{:?}",
        r.removed
    );
    assert!(cli.has(&young) && daemon.has(&young));
}

/// The pack is sealed after SEAL_AFTER: the next put starts another, and the sealed one
/// is durable and unlocked (gc may unpack it).
#[test]
fn a_pack_is_sealed_after_its_time() {
    use std::time::{Duration, SystemTime};
    let (_d, s) = packing();
    let a = s.put_bytes(b"a").unwrap();
    let first = packs(&s)[0].clone();
    // Its last append long ago: the seal dates it now (a put found `a` in it until then).
    let long_ago = SystemTime::now() - Duration::from_secs(86_400);
    set_mtime(&first, long_ago);
    let mut p = s.pack.lock();
    let born = &mut p.as_mut().unwrap().born;
    *born = born.checked_sub(SEAL_AFTER).unwrap();
    drop(p);
    let b = s.put_bytes(b"b").unwrap();
    let now = packs(&s);
    assert_eq!(now.len(), 2, "{now:?}");
    let dated = fs::metadata(&first).unwrap().modified().unwrap();
    assert!(
        dated > SystemTime::now() - Duration::from_secs(60),
        "{dated:?}"
    );
    // Locked until the group commit made it durable, then left to gc.
    let f = File::open(&first).unwrap();
    assert!(
        !pack::take_lock(&f).unwrap(),
        "sealed and unsynced, yet unlocked"
    );
    s.sync().unwrap();
    assert!(pack::take_lock(&f).unwrap(), "synced, yet still locked");
    drop(f);
    // Still found by its owner, without looking the packs over.
    assert!(s.has(&a));
    assert_eq!(s.get(&a).unwrap().unwrap(), b"a");
    // Content only in the sealed pack is written again to the pack in use (a put never
    // leans on a pack gc may unpack and remove from under it).
    assert!(!s.touch(&a));
    assert_eq!(s.put_bytes_hashed(b"a", &a).unwrap(), Put::Compressed);
    assert!(s.in_own_pack(parse_hash(&a).unwrap()) && s.in_own_pack(parse_hash(&b).unwrap()));
}

/// gc removes a packed object by leaving it out of the loose copies it unpacks, never the
/// pack with it; and a packed object is never handed to the loose removal.
#[test]
fn gc_removes_one_packed_object_not_its_pack() {
    use std::time::SystemTime;
    let (_d, s) = packing();
    let x = s.put_bytes(b"x").unwrap();
    let y = s.put_bytes(b"y").unwrap();
    drop(s);
    let cli = Store::open_existing(&_d.path().join("objects"))
        .unwrap()
        .unwrap();
    let listed = cli.objects().unwrap();
    assert!(listed.iter().all(|o| o.kind == Kind::Packed && !o.in_use));
    let ox = listed.iter().find(|o| o.hash == x).unwrap();
    // The loose removal refuses it (its path is the pack's).
    assert!(matches!(
        cli.remove_unless_used(ox, SystemTime::now()).unwrap(),
        super::gc::Removal::Reused
    ));
    assert!(packs(&cli).len() == 1 && cli.has(&x));
    let drop_x = [x.clone()].into_iter().collect();
    let (n, dropped) = cli.unpack_sealed(&drop_x).unwrap();
    assert_eq!((n, dropped), (1, drop_x));
    assert!(packs(&cli).is_empty());
    assert!(!cli.has(&x));
    assert_eq!(cli.get(&y).unwrap().unwrap(), b"y");
}

/// An empty loose file (what a power cut leaves of an object whose data never reached the
/// disk) hides no packed copy: `get` reads the pack, and gc writes the loose copy again.
#[test]
fn an_empty_loose_copy_does_not_hide_a_packed_one() {
    let (d, s) = packing();
    let h = s.put_bytes(b"packed and whole\n").unwrap();
    drop(s);
    let cli = Store::open_existing(&d.path().join("objects"))
        .unwrap()
        .unwrap();
    let hex = parse_hash(&h).unwrap();
    let loose = cli.object_path(hex, Kind::Zstd);
    fs::create_dir_all(loose.parent().unwrap()).unwrap();
    fs::write(&loose, b"").unwrap();
    assert_eq!(cli.get(&h).unwrap().unwrap(), b"packed and whole\n");
    cli.unpack_sealed(&Default::default()).unwrap();
    assert!(fs::metadata(&loose).unwrap().len() > 0);
    assert_eq!(cli.get(&h).unwrap().unwrap(), b"packed and whole\n");
}

/// A dry run says what the real run does, sizes included (a sealed pack's objects are
/// counted at what their loose copies take once unpacked).
#[test]
fn gc_dry_run_and_real_run_agree_on_packed_objects() {
    use super::gc::{gc, Retention};
    use std::time::{Duration, SystemTime};
    let (d, s) = packing();
    for i in 0..200 {
        s.put_bytes(format!("object {i}\n").as_bytes()).unwrap();
    }
    let pack = packs(&s)[0].clone();
    drop(s);
    let old = SystemTime::now() - Duration::from_secs(40 * 86_400);
    set_mtime(&pack, old);
    let ledger = d.path().join("ledger.jsonl");
    fs::write(&ledger, "").unwrap();
    let cli = Store::open_existing(&d.path().join("objects"))
        .unwrap()
        .unwrap();
    let budget = Retention {
        keep: None,
        max_size: Some(100_000),
    };
    let names = |r: &super::gc::Report| -> Vec<String> {
        let mut v: Vec<String> = r.removed.iter().map(|x| x.hash.clone()).collect();
        v.sort();
        v
    };
    let dry = gc(&cli, &ledger, &budget, SystemTime::now(), true).unwrap();
    let real = gc(&cli, &ledger, &budget, SystemTime::now(), false).unwrap();
    assert_eq!(names(&dry), names(&real));
    assert_eq!(
        (dry.bytes_before, dry.bytes_after),
        (real.bytes_before, real.bytes_after)
    );
    assert!(
        !real.removed.is_empty() && real.bytes_after <= 100_000,
        "{real:?}"
    );
    // What is left is what the report says: loose now, each one block.
    let left = cli.objects().unwrap();
    assert_eq!(left.len(), real.objects_after);
    assert_eq!(left.iter().map(|o| o.disk).sum::<u64>(), real.bytes_after);
}

/// A file in `packs/` that is not a pack, or a pack being made, breaks neither readers nor
/// gc: skipped (and left as it is).
#[test]
fn a_malformed_or_unfinished_pack_is_skipped() {
    use super::gc::{gc, Retention};
    use std::time::SystemTime;
    let (d, s) = packing();
    let h = s.put_bytes(b"fine\n").unwrap();
    drop(s);
    let dir = d.path().join("objects/packs");
    fs::write(
        dir.join("garbage.pack"),
        b"this is not a pack at all, not even close",
    )
    .unwrap();
    fs::write(dir.join(".tmp.1-2-3.pack"), PACK_MAGIC).unwrap();
    let cli = Store::open_existing(&d.path().join("objects"))
        .unwrap()
        .unwrap();
    assert!(!cli
        .pack_paths()
        .unwrap()
        .iter()
        .any(|p| p.to_string_lossy().contains(".tmp.")));
    assert_eq!(cli.get(&h).unwrap().unwrap(), b"fine\n");
    assert!(!cli.has(&sha256_bytes(b"absent")));
    assert_eq!(cli.objects().unwrap().len(), 1);
    let ledger = d.path().join("ledger.jsonl");
    fs::write(&ledger, "").unwrap();
    let r = gc(
        &cli,
        &ledger,
        &Retention::default(),
        SystemTime::now(),
        false,
    )
    .unwrap();
    assert_eq!(r.packs_unpacked, 1);
    assert!(dir.join("garbage.pack").exists());
    assert_eq!(cli.get(&h).unwrap().unwrap(), b"fine\n");
}
