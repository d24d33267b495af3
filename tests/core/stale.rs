//! Stale-write protection: a change to a file the identity read, made by someone else since,
//! is never overwritten, renamed away or deleted.

use std::os::unix::fs::FileExt;

use intentfs::guard::Code;
use intentfs::ledger::MutationType;

use super::*;

const FILES: &[(&str, &str)] = &[("src/a.rs", "fn a() {}\n")];

/// A human edits the backing file directly.
fn outside(c: &Core, rel: &str, content: &str) {
    std::fs::write(c.w(rel), content).unwrap();
}

#[test]
fn overwrite_of_a_file_changed_outside_since_read_is_refused() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    outside(&c, "src/a.rs", "fn a() { human() }\n");
    assert_eq!(
        code(c.overwrite("src/a.rs", "fn a() { agent() }\n")),
        Code::StaleFile
    );
    // Refused at open, before the O_TRUNC: the human's version is intact.
    assert_eq!(c.backing("src/a.rs"), "fn a() { human() }\n");
    c.assert_denial("src/a.rs", Code::StaleFile, "open-write");
    assert!(c.of(MutationType::WriteBegin).is_empty());
    assert!(c.of(MutationType::Write).is_empty());
    let ident = c.fs.gate.ids.default_identity();
    assert_eq!(
        ident.last_error.lock().as_ref().unwrap().code,
        Code::StaleFile
    );
    assert!(c.ctl(&c.me, "last_error").contains("STALE_FILE"));
}

#[test]
fn rereading_makes_the_overwrite_fresh_again() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    outside(&c, "src/a.rs", "fn a() { human() }\n");
    assert_eq!(code(c.overwrite("src/a.rs", "mine\n")), Code::StaleFile);
    // The remedy the refusal gives: re-read, then redo the change.
    assert_eq!(c.read("src/a.rs").unwrap(), b"fn a() { human() }\n");
    c.overwrite("src/a.rs", "fn a() { both() }\n").unwrap();
    assert_eq!(c.backing("src/a.rs"), "fn a() { both() }\n");
    let w = c.at(MutationType::Write, "src/a.rs");
    assert_eq!(w.len(), 1);
    assert_eq!(
        w[0].content_hash.as_deref(),
        Some(intentfs::ledger::sha256_bytes(b"fn a() { both() }\n").as_str())
    );
    // What the WRITE replaced is the human's version, not the one the agent first read.
    assert_eq!(
        w[0].prev_content_hash.as_deref(),
        Some(intentfs::ledger::sha256_bytes(b"fn a() { human() }\n").as_str())
    );
}

#[test]
fn a_write_after_someone_else_wrote_the_open_file_is_refused() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    let node = c.node("src/a.rs").unwrap();
    let (fh, _) = c.fs.open(&c.me, node, libc::O_WRONLY).unwrap();
    c.fs.write(&c.me, fh, 0, b"fn a() {} // 1\n", false)
        .unwrap();
    // Between two writes of the same handle, someone writes the file in place.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(c.w("src/a.rs"))
        .unwrap();
    f.write_all_at(b"HUMAN EDIT, longer than before\n", 0)
        .unwrap();
    drop(f);
    let r = c.fs.write(&c.me, fh, 15, b"more\n", false).map(drop);
    assert_eq!(code(r), Code::StaleFile);
    c.fs.flush(&c.me, fh).unwrap();
    c.fs.release(fh).unwrap();
    assert_eq!(c.backing("src/a.rs"), "HUMAN EDIT, longer than before\n");
    let d = c.of(MutationType::Denial);
    assert_eq!(d.last().unwrap().detail.as_ref().unwrap()["op"], "write");
    // The handle's WRITE at close says the content there is not its own.
    let w = c.at(MutationType::Write, "src/a.rs");
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].detail.as_ref().unwrap()["superseded"], true, "{w:?}");
}

#[test]
fn unlink_and_rename_of_a_file_changed_since_read_are_refused() {
    let c = core(
        POLICY,
        &[("src/a.rs", "fn a() {}\n"), ("src/b.rs", "fn b() {}\n")],
    );
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    c.read("src/b.rs").unwrap();
    outside(&c, "src/a.rs", "human a\n");
    outside(&c, "src/b.rs", "human b\n");
    let before = tree(&c.ws);
    assert_eq!(code(c.unlink("src/a.rs")), Code::StaleFile);
    c.assert_denial("src/a.rs", Code::StaleFile, "unlink");
    // Renaming it away, and renaming over the other (what `sed -i` does), both lose a
    // version the agent never saw.
    assert_eq!(code(c.rename("src/a.rs", "src/c.rs")), Code::StaleFile);
    c.assert_denial("src/a.rs", Code::StaleFile, "rename");
    c.create("src/tmp.rs", "new b\n").unwrap();
    let before = {
        let mut b = before;
        b.push(("src/tmp.rs".into(), Some(b"new b\n".to_vec())));
        b.sort();
        b
    };
    assert_eq!(code(c.rename("src/tmp.rs", "src/b.rs")), Code::StaleFile);
    c.assert_denial("src/b.rs", Code::StaleFile, "rename");
    assert_eq!(tree(&c.ws), before);
    assert!(c.of(MutationType::Delete).is_empty());
    assert!(c.of(MutationType::Rename).is_empty());
    let ident = c.fs.gate.ids.default_identity();
    assert_eq!(
        ident
            .stale_refusals
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[test]
fn another_identity_writing_through_the_mount_makes_the_first_stale() {
    let c = core(POLICY, FILES);
    // A second agent, granted like `intentfs run` is: a process of its own, tracked by
    // ancestry (no cgroup here).
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let other = caller(child.id());
    let (ident, _) =
        c.fs.gate
            .ids
            .grant(
                child.id(),
                intentfs::guard::tracking::Grant {
                    name: "other".into(),
                    intents: intentfs::guard::Intents::All,
                    require_read: false,
                    uid: None,
                },
            )
            .unwrap();
    assert_eq!(c.fs.gate.ids.resolve(child.id()).key, ident.key);
    assert_eq!(c.fs.gate.ids.resolve(c.me.pid).key, "default");
    c.select("INT-001");
    c.select_as(&other, "INT-001").unwrap();
    c.read("src/a.rs").unwrap();
    c.read_as(&other, "src/a.rs").unwrap();
    c.overwrite_as(&other, "src/a.rs", "fn a() { other() }\n")
        .unwrap();
    assert_eq!(
        code(c.overwrite("src/a.rs", "fn a() { me() }\n")),
        Code::StaleFile
    );
    assert_eq!(c.backing("src/a.rs"), "fn a() { other() }\n");
    // Its own write never makes the writer stale: it writes again without re-reading.
    c.overwrite_as(&other, "src/a.rs", "fn a() { other2() }\n")
        .unwrap();
    let w = c.at(MutationType::Write, "src/a.rs");
    assert_eq!(w.len(), 2);
    assert!(w
        .iter()
        .all(|e| e.agent.as_ref().unwrap().identity == ident.key));
    c.assert_ledger_clean();
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn truncate_through_setattr_is_stale_checked_and_ledgered() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    outside(&c, "src/a.rs", "human\n");
    assert_eq!(code(c.setattr("src/a.rs", truncate(0))), Code::StaleFile);
    assert_eq!(c.backing("src/a.rs"), "human\n");
    c.read("src/a.rs").unwrap();
    c.setattr("src/a.rs", truncate(2)).unwrap();
    assert_eq!(c.backing("src/a.rs"), "hu");
    let t = c.at(MutationType::Truncate, "src/a.rs");
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].size, Some(2));
}
