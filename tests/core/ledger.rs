//! The entries each operation writes, and that they chain.

use intentfs::ledger::{sha256_bytes, MutationType};

use super::*;

#[test]
fn create_then_write_is_one_create_and_one_write_sharing_the_handle_token() {
    let c = core(POLICY, &[]);
    c.select("INT-001");
    c.mkdir("src").unwrap();
    c.create("src/new.rs", "line 1\nline 2\n").unwrap();
    let cr = c.at(MutationType::Create, "src/new.rs");
    let wr = c.at(MutationType::Write, "src/new.rs");
    assert_eq!((cr.len(), wr.len()), (1, 1), "{:#?}", c.entries());
    // The CREATE is the empty file, before any byte lands; the WRITE what the handle left.
    assert_eq!(
        cr[0].content_hash.as_deref(),
        Some(sha256_bytes(b"").as_str())
    );
    assert_eq!(cr[0].size, Some(0));
    assert_eq!(
        wr[0].content_hash.as_deref(),
        Some(sha256_bytes(b"line 1\nline 2\n").as_str())
    );
    assert_eq!(wr[0].size, Some(14));
    assert!(wr[0].created);
    let token = cr[0].detail.as_ref().unwrap()["handle"].clone();
    assert!(token.is_string());
    assert_eq!(wr[0].detail.as_ref().unwrap()["handle"], token);
    let ranges = wr[0].ranges.as_ref().unwrap();
    assert_eq!((ranges[0].start_line, ranges[0].end_line), (1, 2));
    let agent = wr[0].agent.as_ref().unwrap();
    assert_eq!(
        (agent.name.as_str(), agent.identity.as_str(), agent.pid),
        ("agent", "default", c.me.pid)
    );
    assert_eq!(wr[0].intent_id.as_deref(), Some("INT-001"));
    c.assert_ledger_clean();
}

#[test]
fn an_overwrite_is_begun_before_it_lands_and_records_the_lines_it_changed() {
    let c = core(POLICY, &[("src/a.rs", "one\ntwo\nthree\n")]);
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    c.overwrite("src/a.rs", "one\nTWO\nthree\n").unwrap();
    let e: Vec<_> = c
        .entries()
        .into_iter()
        .filter(|e| e.path.as_deref() == Some("src/a.rs"))
        .collect();
    assert_eq!(
        e.iter().map(|e| e.mutation_type).collect::<Vec<_>>(),
        vec![MutationType::WriteBegin, MutationType::Write]
    );
    let old = sha256_bytes(b"one\ntwo\nthree\n");
    assert_eq!(e[0].prev_content_hash.as_deref(), Some(old.as_str()));
    assert_eq!(e[1].prev_content_hash.as_deref(), Some(old.as_str()));
    assert_eq!(
        e[1].content_hash.as_deref(),
        Some(sha256_bytes(b"one\nTWO\nthree\n").as_str())
    );
    assert_eq!(
        e[0].detail.as_ref().unwrap()["handle"],
        e[1].detail.as_ref().unwrap()["handle"]
    );
    let r = e[1].ranges.as_ref().unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].start_line, r[0].end_line), (2, 2));
    c.assert_ledger_clean();
}

#[test]
fn a_read_only_session_and_a_time_only_setattr_write_nothing() {
    let c = core(POLICY, &[("src/a.rs", "a\n")]);
    c.select("INT-001");
    let n = c.entries().len();
    c.read("src/a.rs").unwrap();
    let dir = c.node("src").unwrap();
    let fh = c.fs.opendir(dir).unwrap();
    let mut names = Vec::new();
    c.fs.readdir(dir, fh, 0, |_, _, _, name| {
        names.push(name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    c.fs.releasedir(fh);
    names.sort();
    assert_eq!(names, [".", "..", "a.rs"]);
    // `touch`: mtime set to now.
    c.setattr(
        "src/a.rs",
        intentfs::fs::ops::SetAttr {
            mtime: Some(None),
            ..Default::default()
        },
    )
    .unwrap();
    // A chmod to the mode it already has is no change either.
    c.setattr("src/a.rs", chmod(0o644)).unwrap();
    assert_eq!(c.entries().len(), n, "{:#?}", c.entries());
}

#[test]
fn the_root_listing_hides_the_control_directory() {
    let c = core(POLICY, &[("README.md", "r\n")]);
    let fh = c.fs.opendir(ROOT).unwrap();
    let mut names = Vec::new();
    c.fs.readdir(ROOT, fh, 0, |_, _, _, name| {
        names.push(name.to_string_lossy().into_owned());
        false
    })
    .unwrap();
    c.fs.releasedir(fh);
    assert!(names.contains(&"README.md".to_string()));
    assert!(!names.contains(&control::DIR_NAME.to_string()));
    // ... but it is there by name.
    assert_eq!(
        c.fs.lookup(ROOT, OsStr::new(control::DIR_NAME))
            .unwrap()
            .nodeid,
        control::DIR_INO
    );
}

#[test]
fn a_mixed_session_leaves_an_intact_chain_that_matches_the_disk() {
    let c = core(
        POLICY,
        &[
            ("src/a.rs", "a\n"),
            ("README.md", "readme\n"),
            ("lib/util.rs", "u\n"),
        ],
    );
    c.select("INT-001");
    c.read("src/a.rs").unwrap();
    c.overwrite("src/a.rs", "a2\n").unwrap();
    c.mkdir("src/m").unwrap();
    c.create("src/m/b.rs", "b\n").unwrap();
    c.rename("src/m/b.rs", "src/b.rs").unwrap();
    c.link("src/b.rs", "src/m/b-link.rs").unwrap();
    c.unlink("src/m/b-link.rs").unwrap();
    let (p, n) = c.parent("src/m");
    c.fs.unlink(&c.me, p, n, true).unwrap();
    let _ = c.create("lib/x.rs", "");
    c.read("README.md").unwrap();
    c.setattr("README.md", truncate(3)).unwrap();
    c.select("INT-002");
    let _ = c.overwrite("README.md", "no");
    let types: Vec<MutationType> = c.entries().iter().map(|e| e.mutation_type).collect();
    use MutationType::*;
    assert_eq!(
        types,
        vec![
            Intent, WriteBegin, Write, Mkdir, Create, Write, Rename, Link, Delete, Rmdir, Denial,
            Truncate, Intent, Denial
        ]
    );
    // Each entry's `prev` is the hash of the line before it.
    let raw = std::fs::read_to_string(&c.ledger).unwrap();
    let lines: Vec<&str> = raw.lines().collect();
    let entries = c.entries();
    for (i, e) in entries.iter().enumerate().skip(1) {
        let want = sha256_bytes(format!("{}\n", lines[i - 1]).as_bytes());
        assert_eq!(format!("sha256:{}", e.prev), want, "line {}", i + 1);
    }
    c.assert_ledger_clean();
    // A line edited afterwards breaks the chain where it shows.
    let tampered = raw.replacen("src/b.rs", "src/c.rs", 1);
    assert_ne!(tampered, raw);
    std::fs::write(&c.ledger, tampered).unwrap();
    let r = intentfs::ledger::verify_chain(&c.ledger).unwrap();
    assert!(!r.intact());
}

/// The process an entry names is read from `/proc/<pid>/comm` at most every quarter
/// second per pid (a burst of requests from one process names it once), and a renamed
/// (or exec'd) process is named by its new name after that.
#[test]
fn the_process_name_follows_the_process_within_a_quarter_second() {
    let c = core(POLICY, &[]);
    c.select("INT-001");
    c.mkdir("src").unwrap();
    let comm = |c: &Core, rel: &str| {
        let e = c.at(MutationType::Mkdir, rel);
        e[0].agent.as_ref().unwrap().process.clone()
    };
    let before = std::fs::read_to_string("/proc/self/comm").unwrap();
    let named = std::time::Instant::now();
    assert_eq!(comm(&c, "src"), before.trim_end());
    // This process renames itself (what an exec does to the name).
    std::fs::write("/proc/self/comm", "renamed-proc").unwrap();
    c.mkdir("src/a").unwrap();
    // Within the quarter second the name is not read again (a loaded machine may take
    // longer to get here: then there is nothing to check).
    if named.elapsed() < Duration::from_millis(200) {
        assert_eq!(comm(&c, "src/a"), before.trim_end(), "read again at once");
    }
    std::thread::sleep(Duration::from_millis(300));
    c.mkdir("src/b").unwrap();
    assert_eq!(comm(&c, "src/b"), "renamed-proc");
}
