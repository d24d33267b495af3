//! Kernel caching with governance (issue 6): long entry/attribute TTLs stay correct because
//! changes made behind the mount are invalidated (fanotify -> FUSE notify), and reads
//! served by kernel passthrough still record what the identity saw.

mod common;

use std::time::Duration;

use common::*;

/// A change behind the mount is visible through it at once, whatever the TTLs.
#[test]
fn changes_behind_the_mount_are_seen_despite_long_ttls() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("d/f.txt", "one\n"), ("g.txt", "g\n")])
        .mount();
    // Warm the kernel caches: entries, attributes, pages.
    assert_eq!(std::fs::read(tm.m("d/f.txt")).unwrap(), b"one\n");
    assert_eq!(std::fs::metadata(tm.m("d/f.txt")).unwrap().len(), 4);
    let names = |p: &str| {
        let mut v: Vec<String> = std::fs::read_dir(tm.m(p))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("d"), ["f.txt"]);
    // A human edits, adds, removes and renames directly in the workspace.
    std::fs::write(tm.w("d/f.txt"), "second version\n").unwrap();
    std::fs::write(tm.w("d/new.txt"), "new\n").unwrap();
    std::fs::remove_file(tm.w("g.txt")).unwrap();
    std::fs::create_dir(tm.w("e")).unwrap();
    // The invalidation is asynchronous but fast: well under the old 1 s TTL.
    let fresh = wait_until(Duration::from_millis(900), || {
        std::fs::metadata(tm.m("d/f.txt")).map(|m| m.len()).ok() == Some(15)
            && std::fs::read(tm.m("d/f.txt")).ok().as_deref() == Some(&b"second version\n"[..])
            && tm.m("d/new.txt").exists()
            && !tm.m("g.txt").exists()
            && tm.m("e").is_dir()
    });
    assert!(fresh, "the mount kept serving cached state");
    assert_eq!(names("d"), ["f.txt", "new.txt"]);
    // And later, long after the change: still fresh (no TTL expiry needed).
    std::fs::write(tm.w("d/f.txt"), "3\n").unwrap();
    assert!(wait_until(Duration::from_millis(900), || std::fs::read(
        tm.m("d/f.txt")
    )
    .ok()
    .as_deref()
        == Some(&b"3\n"[..])));
}

/// Reads that never reach the daemon (kernel passthrough, or the page cache) still record
/// the content hash, so a write over a file changed since is refused as stale.
#[test]
fn passthrough_reads_record_what_was_seen() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("s.txt", "v1\n")])
        .mount();
    // Read twice (the second open may be served entirely by the kernel).
    assert_eq!(std::fs::read(tm.m("s.txt")).unwrap(), b"v1\n");
    assert_eq!(std::fs::read(tm.m("s.txt")).unwrap(), b"v1\n");
    // Unchanged: the agent may write.
    std::fs::write(tm.m("s.txt"), "agent v2\n").unwrap();
    assert_eq!(tm.ws_bytes("s.txt"), b"agent v2\n");
    assert_eq!(std::fs::read(tm.m("s.txt")).unwrap(), b"agent v2\n");
    // A human changes it behind the mount: the agent's next write is stale.
    std::fs::write(tm.w("s.txt"), "human v3\n").unwrap();
    tm.assert_denied(std::fs::write(tm.m("s.txt"), "agent v4\n"), "STALE_FILE");
    assert_eq!(tm.ws_bytes("s.txt"), b"human v3\n");
    // Re-reading (through passthrough) records the new content: the write goes through.
    assert!(wait_until(Duration::from_millis(900), || std::fs::read(
        tm.m("s.txt")
    )
    .ok()
    .as_deref()
        == Some(&b"human v3\n"[..])));
    std::fs::write(tm.m("s.txt"), "agent v5\n").unwrap();
    assert_eq!(tm.ws_bytes("s.txt"), b"agent v5\n");
}

/// A writer opening a file that a passthrough reader holds open is not refused by the
/// kernel's I/O-mode rule (it gets direct I/O), and the reader sees the new content.
#[test]
fn write_while_a_passthrough_reader_is_open() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("r.txt", "old\n")])
        .mount();
    let reader = std::fs::File::open(tm.m("r.txt")).unwrap();
    let mut buf = String::new();
    std::io::Read::read_to_string(&mut &reader, &mut buf).unwrap();
    assert_eq!(buf, "old\n");
    std::fs::write(tm.m("r.txt"), "new content\n").unwrap();
    let mut buf = vec![0u8; 64];
    let n = std::os::unix::fs::FileExt::read_at(&reader, &mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"new content\n");
    drop(reader);
    assert_eq!(std::fs::read(tm.m("r.txt")).unwrap(), b"new content\n");
}
