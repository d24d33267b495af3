//! Renames and unlinks under concurrent renames through the mount. Each takes the stale
//! locks of the files its names point to, then looks again: a name re-pointed in between
//! (by a rename that held the lock first) makes it start over (`lock_names`, `rename`'s
//! retries). What is observable: every entry describes the file the operation really
//! moved or removed, and replaying the ledger in order reproduces the workspace.

use std::collections::HashMap;
use std::thread;

use intentfs::ledger::{sha256_bytes, Entry, MutationType};

use super::*;

const ROUNDS: usize = 150;

fn contents(c: &Core, names: &[&str]) -> HashMap<String, Vec<u8>> {
    names
        .iter()
        .filter(|n| c.exists(&format!("src/{n}")))
        .map(|n| {
            (
                format!("src/{n}"),
                std::fs::read(c.w(&format!("src/{n}"))).unwrap(),
            )
        })
        .collect()
}

/// Assert a RENAME entry moved `moved`: its size and content hash are that file's.
fn assert_moved(e: &Entry, moved: &[u8]) {
    assert_eq!(e.size, Some(moved.len() as u64), "{e:?}");
    assert_eq!(
        e.content_hash.as_deref(),
        Some(sha256_bytes(moved).as_str()),
        "{e:?}"
    );
}

#[test]
fn concurrent_exchanges_are_ledgered_in_the_order_they_happened() {
    // Three files of different sizes, swapped pairwise by three threads around a ring:
    // every pair shares a name with the other two, so each exchange races the others.
    let c = core(
        POLICY,
        &[
            ("src/a", "a"),
            ("src/b", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"),
            ("src/c", "ccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"),
        ],
    );
    c.select("INT-001");
    let start = contents(&c, &["a", "b", "c"]);
    // Look the names up once, as the kernel would have before the requests.
    c.node("src/a").unwrap();
    c.node("src/b").unwrap();
    c.node("src/c").unwrap();
    let threads: Vec<_> = [("src/a", "src/b"), ("src/b", "src/c"), ("src/c", "src/a")]
        .into_iter()
        .map(|(x, y)| {
            let c = c.clone();
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    c.rename_as(&c.me, x, y, libc::RENAME_EXCHANGE).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let renames = c.of(MutationType::Rename);
    assert_eq!(renames.len(), 3 * ROUNDS);
    let mut state = start;
    for e in &renames {
        let (from, to) = (e.from.clone().unwrap(), e.path.clone().unwrap());
        assert_eq!(e.detail.as_ref().unwrap()["exchange"], true);
        let f = state.remove(&from).unwrap();
        let t = state.remove(&to).unwrap();
        assert_moved(e, &f);
        state.insert(to, f);
        state.insert(from, t);
    }
    assert_eq!(state, contents(&c, &["a", "b", "c"]));
    assert!(c.of(MutationType::Denial).is_empty());
    c.assert_ledger_clean();
}

/// Found by this test (fixed: `lock_names` locks the names too): the stale locks were per inode, so once an unlink has removed the
/// name, a rename onto the freed name locks only its own file and may put its RENAME on
/// record before the unlink's DELETE, which then reads as deleting the renamed file (the
/// replay below, and `ledger verify`'s drift check, see `src/t` deleted while it exists).
#[test]
fn deletes_racing_editor_saves_remove_and_record_the_same_file() {
    // One thread saves `src/t` as editors do (write a new file, rename it over the old);
    // the other deletes `src/t` whenever it is there. Each save has its own size.
    let c = core(POLICY, &[("src/t", "")]);
    c.select("INT-001");
    let saver = {
        let c = c.clone();
        thread::spawn(move || {
            for i in 1..=ROUNDS {
                let tmp = format!("src/t.tmp{i}");
                c.create(&tmp, &"x".repeat(i)).unwrap();
                c.rename(&tmp, "src/t").unwrap();
            }
        })
    };
    let deleter = {
        let c = c.clone();
        thread::spawn(move || {
            let mut n = 0;
            for _ in 0..ROUNDS {
                match c.unlink("src/t") {
                    Ok(()) => n += 1,
                    Err(FsError::Os(libc::ENOENT)) => {}
                    Err(e) => panic!("unlink: {e:?}"),
                }
            }
            n
        })
    };
    saver.join().unwrap();
    let deleted = deleter.join().unwrap();
    let dels = c.of(MutationType::Delete);
    assert_eq!(dels.len(), deleted);
    // Replay: what `src/t` held at each DELETE is what the entry says was removed.
    let mut t: Option<u64> = Some(0);
    let mut written: HashMap<String, u64> = HashMap::new();
    for e in c.entries() {
        let path = e.path.clone().unwrap_or_default();
        match e.mutation_type {
            MutationType::Write => {
                written.insert(path, e.size.unwrap());
            }
            MutationType::Rename => {
                let size = written.remove(e.from.as_deref().unwrap()).unwrap();
                assert_eq!(e.size, Some(size), "{e:?}");
                t = Some(size);
            }
            MutationType::Delete => {
                assert_eq!(path, "src/t");
                assert_eq!(e.size, t, "{e:?}");
                t = None;
            }
            _ => {}
        }
    }
    match t {
        Some(n) => assert_eq!(std::fs::metadata(c.w("src/t")).unwrap().len(), n),
        None => assert!(!c.exists("src/t")),
    }
    assert!(
        c.of(MutationType::Denial).is_empty(),
        "{:?}",
        c.of(MutationType::Denial)
    );
    c.assert_ledger_clean();
}
