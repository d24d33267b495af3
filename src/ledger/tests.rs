//! Tests of the ledger as a whole: real files in temporary directories, real
//! threads, a real (tmpfs) full disk and a real `kill -9`. No mocks.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::agent_trace;
use super::blame::{blame, Origin};
use super::reader::{read_entries, verify_chain, verify_drift, DriftKind, FindingKind};
use super::*;

fn agent(name: &str) -> Agent {
    Agent {
        name: name.into(),
        identity: format!("{name}-session"),
        pid: 42,
        uid: 1000,
        process: "bash".into(),
    }
}

fn draft(t: MutationType, path: &str) -> Draft {
    Draft {
        intent_id: Some("INT-1".into()),
        agent: Some(agent("claude")),
        mutation_type: Some(t),
        path: Some(PathBuf::from(path)),
        ..Draft::default()
    }
}

fn open(path: &Path) -> (Ledger, OpenReport) {
    Ledger::open(path, LedgerOptions::default()).unwrap()
}

fn raw_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut s = lines.join("\n");
    s.push('\n');
    std::fs::write(path, s).unwrap();
}

/// A ledger of `n` WRITE entries (paths f0..f{n-1}).
fn ledger_with(dir: &Path, n: usize) -> PathBuf {
    let p = dir.join("ledger.jsonl");
    let (l, _) = open(&p);
    for i in 0..n {
        l.record_nowait(draft(MutationType::Write, &format!("f{i}")))
            .unwrap();
    }
    l.shutdown();
    p
}

fn keys_in_order(line: &str) -> Vec<String> {
    // serde_json without preserve_order sorts map keys, so read the key order from
    // the text: every `"key":` at depth 1.
    let mut keys = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0, false, false, 0);
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if in_str {
            match c {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => {
                    in_str = false;
                    if depth == 1 && b.get(i + 1) == Some(&b':') {
                        keys.push(line[start + 1..i].to_owned());
                    }
                }
                _ => {}
            }
        } else {
            match c {
                b'"' => {
                    in_str = true;
                    start = i;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => depth -= 1,
                _ => {}
            }
        }
    }
    keys
}

fn sha256sum(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    format!(
        "sha256:{}",
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
    )
}

#[test]
fn entries_for_each_mutation_type_with_real_hashes_and_field_order() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let file = ws.join("a.txt");
    std::fs::write(&file, "hello\nworld\n").unwrap();
    let (hash, size) = sha256_file(&file).unwrap();
    assert_eq!(hash, sha256sum(&file), "our hash is sha256sum's");
    let lp = ws.join(DEFAULT_LEDGER);
    let (l, report) = Ledger::open(
        &lp,
        LedgerOptions {
            workspace: Some(ws.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(report.entries, 0);
    for t in MutationType::ALL {
        let mut d = draft(t, "a.txt");
        d.content_hash = Some(hash.clone());
        d.size = Some(size);
        if matches!(t, MutationType::Rename | MutationType::Link) {
            d.from = Some("old.txt".into());
        }
        if t == MutationType::Write {
            d.created = true;
            d.ranges = Some(vec![(1, 2)]);
            d.prev_content_hash = Some(sha256_bytes(b""));
        }
        if t == MutationType::Denial {
            d.outcome = crate::ledger::Outcome::Denied;
            d.code = Some(crate::ledger::Code::ScopeViolation);
            d.rule = Some("owned_scope: src/**".into());
            d.detail = Some(serde_json::json!({"op": "write"}));
        }
        l.record(d).unwrap();
    }
    assert!(matches!(
        l.record(Draft::default()),
        Err(LedgerError::Invalid(_))
    ));
    l.shutdown();
    assert_eq!(
        std::fs::metadata(&lp).unwrap().permissions().mode() & 0o777 & !0o640,
        0,
        "mode 0640"
    );

    let lines = raw_lines(&lp);
    assert_eq!(lines.len(), MutationType::ALL.len());
    let entries = read_entries(&lp).unwrap();
    for ((_, e), (t, line)) in entries.iter().zip(MutationType::ALL.iter().zip(&lines)) {
        assert_eq!(e.mutation_type, *t);
        assert_eq!(e.content_hash.as_deref(), Some(hash.as_str()));
        assert_eq!(e.size, Some(size));
        assert!(uuid::Uuid::parse_str(&e.id).is_ok_and(|u| u.get_version_num() == 4));
        assert!(chrono::DateTime::parse_from_rfc3339(&e.timestamp).is_ok());
        assert!(
            e.timestamp.ends_with('Z') && e.timestamp.len() == 27,
            "micros, UTC: {}",
            e.timestamp
        );
        assert_eq!(e.mutation_class.is_some(), t.is_classified(), "{t:?}");
        let keys = keys_in_order(line);
        let expected: Vec<&str> = [
            "id",
            "timestamp",
            "intent_id",
            "agent",
            "mutation_type",
            "mutation_class",
            "path",
            "from",
            "content_hash",
            "prev_content_hash",
            "size",
            "created",
            "ranges",
            "outcome",
            "code",
            "rule",
            "detail",
            "prev",
        ]
        .into_iter()
        .filter(|k| line.contains(&format!("\"{k}\":")))
        .collect();
        assert_eq!(keys, expected, "field order of {t:?}");
        assert_eq!(
            keys.contains(&"from".to_owned()),
            matches!(t, MutationType::Rename | MutationType::Link)
        );
        assert_eq!(
            keys.contains(&"created".to_owned()),
            *t == MutationType::Write
        );
        assert!(
            !line.contains(":null"),
            "null optional fields are skipped: {line}"
        );
    }
    // First classified mutation of the path by the intent evolves it; later ones refactor.
    let classes: Vec<_> = entries
        .iter()
        .filter_map(|(_, e)| e.mutation_class)
        .collect();
    assert_eq!(classes[0], MutationClass::IntentEvolution);
    assert!(classes[1..]
        .iter()
        .all(|c| *c == MutationClass::AstRefactor));
    assert!(verify_chain(&lp).unwrap().intact());
    assert_eq!(entries[0].1.prev, entry::GENESIS_PREV);
    assert_eq!(
        entries[0].1.ranges,
        Some(vec![LineRange {
            start_line: 1,
            end_line: 2
        }])
    );
}

#[test]
fn chain_of_1000_entries_verifies_and_prev_is_hash_of_previous_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = ledger_with(dir.path(), 1000);
    let report = verify_chain(&p).unwrap();
    assert_eq!(report.entries, 1000);
    assert!(report.intact(), "{:?}", report.findings);
    let bytes = std::fs::read(&p).unwrap();
    let mut lines = bytes.split_inclusive(|&b| b == b'\n');
    let first = lines.next().unwrap();
    let second: Entry = serde_json::from_slice(lines.next().unwrap()).unwrap();
    use sha2::Digest;
    assert_eq!(second.prev, hex::encode(sha2::Sha256::digest(first)));
}

#[test]
fn verify_catches_changed_byte_with_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let p = ledger_with(dir.path(), 20);
    let mut lines = raw_lines(&p);
    // An edit that keeps the JSON valid: only the chain can tell.
    lines[9] = lines[9].replace("\"path\":\"f9\"", "\"path\":\"f8\"");
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
    let f = &r.findings[0];
    assert_eq!((f.line, f.kind), (11, FindingKind::ChainBroken));
    assert!(f.message.contains("line 10 was edited"), "{}", f.message);

    // An edit that breaks the JSON: the line itself is reported too.
    let mut lines = raw_lines(&ledger_with(&dir.path().join("b"), 20));
    lines[4].insert(0, 'x');
    let p2 = dir.path().join("b/ledger.jsonl");
    write_lines(&p2, &lines);
    let r = verify_chain(&p2).unwrap();
    let got: Vec<_> = r.findings.iter().map(|f| (f.line, f.kind)).collect();
    assert_eq!(
        got,
        vec![(5, FindingKind::Unparsable), (6, FindingKind::ChainBroken)]
    );
}

#[test]
fn verify_catches_deleted_inserted_and_swapped_lines() {
    let dir = tempfile::tempdir().unwrap();
    let p = ledger_with(dir.path(), 20);
    let orig = raw_lines(&p);

    // Deleted line 8: the line now at 8 no longer follows line 7.
    let mut lines = orig.clone();
    lines.remove(7);
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].line, 8);
    assert!(
        r.findings[0]
            .message
            .contains("deleted between lines 7 and 8"),
        "{}",
        r.findings[0].message
    );

    // Deleted first line.
    let mut lines = orig.clone();
    lines.remove(0);
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(
        r.findings.iter().map(|f| f.line).collect::<Vec<_>>(),
        vec![1]
    );

    // Inserted line at 6 (a copy of line 2, with a forged prev of line 5).
    let mut lines = orig.clone();
    let mut forged: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    use sha2::Digest;
    forged["prev"] = hex::encode(sha2::Sha256::digest(format!("{}\n", lines[4]).as_bytes())).into();
    lines.insert(5, serde_json::to_string(&forged).unwrap());
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
    assert_eq!(r.findings[0].line, 7);
    assert_eq!(r.findings[0].prev_matches_line, Some(5));
    assert!(
        r.findings[0].message.contains("line 6 was inserted"),
        "{}",
        r.findings[0].message
    );

    // Swapped lines 10 and 11: breaks at 10, 11 and 12; line 10's says swapped.
    let mut lines = orig.clone();
    lines.swap(9, 10);
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(
        r.findings.iter().map(|f| f.line).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );
    assert!(
        r.findings[0]
            .message
            .contains("lines 10 and 11 are swapped"),
        "{}",
        r.findings[0].message
    );

    // Swapped first two lines.
    let mut lines = orig.clone();
    lines.swap(0, 1);
    write_lines(&p, &lines);
    let r = verify_chain(&p).unwrap();
    assert_eq!(
        r.findings.iter().map(|f| f.line).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(
        r.findings[0].message.contains("lines 1 and 2 are swapped"),
        "{}",
        r.findings[0].message
    );

    // Untouched: intact.
    write_lines(&p, &orig);
    assert!(verify_chain(&p).unwrap().intact());
}

#[test]
fn torn_tail_is_repaired_with_a_repair_entry_and_chain_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let p = ledger_with(dir.path(), 5);
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"{\"id\":\"half a li").unwrap();
    drop(f);
    assert_eq!(
        verify_chain(&p).unwrap().findings.last().unwrap().kind,
        FindingKind::TornTail
    );
    let (l, report) = open(&p);
    let desc = report.repaired_torn_tail.expect("repaired");
    assert!(desc.contains("16 bytes"), "{desc}");
    assert_eq!(report.entries, 6);
    assert!(report.chain_findings.is_empty());
    l.record(draft(MutationType::Write, "after")).unwrap();
    l.shutdown();
    let entries = read_entries(&p).unwrap();
    assert_eq!(entries.len(), 7);
    let repair = &entries[5].1;
    assert_eq!(repair.mutation_type, MutationType::LedgerRepair);
    assert_eq!(repair.outcome, "repaired");
    let detail = repair.detail.as_ref().unwrap();
    assert_eq!(detail["removed_bytes"], 16);
    assert_eq!(
        entry::b64_decode(detail["removed_text_b64"].as_str().unwrap()).unwrap(),
        b"{\"id\":\"half a li"
    );
    assert!(verify_chain(&p).unwrap().intact());

    // A complete but unparsable last line is torn too; an intact file is left alone.
    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"\0\0\0\0\0\0\n").unwrap();
    drop(f);
    let (l, report) = open(&p);
    assert!(report.repaired_torn_tail.is_some());
    drop(l);
    assert!(verify_chain(&p).unwrap().intact());
    let (l, report) = open(&p);
    assert!(report.repaired_torn_tail.is_none());
    assert_eq!(report.entries, 8);
    drop(l);
}

#[test]
fn chain_break_in_the_middle_is_reported_at_open_not_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let p = ledger_with(dir.path(), 10);
    let mut lines = raw_lines(&p);
    lines.remove(3);
    write_lines(&p, &lines);
    let before = std::fs::read(&p).unwrap();
    let (l, report) = open(&p);
    assert!(report.repaired_torn_tail.is_none());
    assert_eq!(
        report
            .chain_findings
            .iter()
            .map(|f| f.line)
            .collect::<Vec<_>>(),
        vec![4]
    );
    l.record(draft(MutationType::Write, "x")).unwrap();
    l.shutdown();
    let after = std::fs::read(&p).unwrap();
    assert_eq!(&after[..before.len()], &before[..], "evidence untouched");
    // The new entry chains onto the last line: only the old break remains.
    assert_eq!(verify_chain(&p).unwrap().findings.len(), 1);
}

/// `umount /mnt && mount /mnt`: the new daemon waits for the old one to close the ledger.
#[test]
fn a_second_writer_waits_for_one_that_is_closing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    l.record(draft(MutationType::Write, "a")).unwrap();
    let closing = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        l.shutdown();
    });
    let (l2, _) = Ledger::open(&p, LedgerOptions::default()).expect("waited for the first writer");
    closing.join().unwrap();
    l2.record(draft(MutationType::Write, "b")).unwrap();
    l2.shutdown();
    assert!(verify_chain(&p).unwrap().findings.is_empty());
}

#[test]
fn a_second_writer_is_refused_until_the_first_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    let err = Ledger::open(&p, LedgerOptions::default()).unwrap_err();
    assert!(err.to_string().contains("in use by another"), "{err}");
    l.shutdown();
    let (l2, _) = open(&p);
    l2.record(draft(MutationType::Write, "a")).unwrap();
}

#[test]
fn mutation_class_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("a.rs")),
        MutationClass::IntentEvolution
    );
    l.record(draft(MutationType::Write, "a.rs")).unwrap();
    l.record(draft(MutationType::Chmod, "b.rs")).unwrap();
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("a.rs")),
        MutationClass::AstRefactor
    );
    drop(l);
    let (l, _) = open(&p);
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("a.rs")),
        MutationClass::AstRefactor
    );
    assert_eq!(
        l.next_class(Some("INT-2"), Path::new("a.rs")),
        MutationClass::IntentEvolution
    );
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("b.rs")),
        MutationClass::IntentEvolution,
        "chmod is not content"
    );
    l.record(draft(MutationType::Write, "a.rs")).unwrap();
    let mut d = draft(MutationType::Write, "a.rs");
    d.intent_id = Some("INT-2".into());
    l.record(d).unwrap();
    l.record(draft(MutationType::Rename, "b.rs")).unwrap();
    drop(l);
    let classes: Vec<_> = read_entries(&p)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.mutation_class)
        .collect();
    use MutationClass::*;
    assert_eq!(
        classes,
        vec![
            Some(IntentEvolution),
            None,
            Some(AstRefactor),
            Some(IntentEvolution),
            Some(IntentEvolution)
        ]
    );
}

#[test]
fn record_returns_only_when_the_line_is_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    for i in 0..50 {
        l.record(draft(MutationType::Write, &format!("f{i}")))
            .unwrap();
        // A fresh reader, the ledger still open: the line is already there.
        let entries = read_entries(&p).unwrap();
        assert_eq!(entries.len(), i + 1);
        assert_eq!(entries[i].1.path.as_deref(), Some(format!("f{i}").as_str()));
    }
    assert!(l.health().is_ok());
    l.shutdown();
    assert!(matches!(
        l.record(draft(MutationType::Write, "late")),
        Err(LedgerError::Closed)
    ));
    assert!(l.health().is_err(), "a shut-down ledger fails closed");
}

#[test]
fn eight_threads_recording_concurrently_all_present_once_and_chained() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    std::thread::scope(|s| {
        for t in 0..8 {
            let l = l.clone();
            s.spawn(move || {
                for i in 0..2000 {
                    let d = draft(MutationType::Write, &format!("t{t}/f{i}"));
                    if i % 2 == 0 {
                        l.record(d).unwrap();
                    } else {
                        l.record_nowait(d).unwrap();
                    }
                }
            });
        }
    });
    drop(l);
    let entries = read_entries(&p).unwrap();
    assert_eq!(entries.len(), 16_000);
    let paths: HashSet<String> = entries
        .iter()
        .map(|(_, e)| e.path.clone().unwrap())
        .collect();
    assert_eq!(paths.len(), 16_000);
    let report = verify_chain(&p).unwrap();
    assert!(
        report.intact(),
        "{:?}",
        &report.findings[..report.findings.len().min(3)]
    );
}

#[test]
fn back_pressure_with_a_tiny_queue_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let opts = LedgerOptions {
        queue_capacity: 1,
        max_batch_delay: Duration::from_millis(0),
        ..Default::default()
    };
    let (l, _) = Ledger::open(&p, opts).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let l = l.clone();
            s.spawn(move || {
                for i in 0..1500 {
                    l.record_nowait(draft(MutationType::Write, &format!("t{t}/f{i}")))
                        .unwrap();
                }
            });
        }
    });
    l.shutdown();
    let entries = read_entries(&p).unwrap();
    assert_eq!(entries.len(), 6000);
    // Per producer, order is kept.
    for t in 0..4 {
        let mine: Vec<String> = entries
            .iter()
            .filter_map(|(_, e)| e.path.clone())
            .filter(|p| p.starts_with(&format!("t{t}/")))
            .collect();
        let expected: Vec<String> = (0..1500).map(|i| format!("t{t}/f{i}")).collect();
        assert_eq!(mine, expected);
    }
    assert!(verify_chain(&p).unwrap().intact());
}

#[test]
fn non_utf8_paths_round_trip_as_valid_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let raw = PathBuf::from(std::ffi::OsString::from_vec(
        b"src/caf\xe9\xff\n.rs".to_vec(),
    ));
    let raw_from = PathBuf::from(std::ffi::OsString::from_vec(b"old\x80.rs".to_vec()));
    let (l, _) = open(&p);
    let mut d = draft(MutationType::Rename, "x");
    d.path = Some(raw.clone());
    d.from = Some(raw_from.clone());
    l.record(d).unwrap();
    drop(l);
    let text = std::fs::read(&p).unwrap();
    let text = String::from_utf8(text).expect("the ledger is UTF-8");
    assert_eq!(
        text.lines().count(),
        1,
        "the newline in the name is escaped"
    );
    let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert!(v["path_b64"].is_string() && v["from_b64"].is_string());
    let (_, e) = read_entries(&p).unwrap().pop().unwrap();
    assert_eq!(e.path_buf(), Some(raw));
    assert_eq!(e.from_buf(), Some(raw_from));
}

#[test]
fn drift_finds_modified_and_missing_files_and_follows_renames() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let lp = ws.join(DEFAULT_LEDGER);
    let (l, _) = open(&lp);
    std::fs::create_dir_all(ws.join("d")).unwrap();
    for name in [
        "same.txt",
        "edited.txt",
        "gone.txt",
        "d/moved.txt",
        "deleted.txt",
    ] {
        std::fs::write(ws.join(name), format!("content of {name}\n")).unwrap();
        let mut d = draft(MutationType::Write, name);
        d.content_hash = Some(sha256_file(&ws.join(name)).unwrap().0);
        l.record(d).unwrap();
    }
    // Directory rename d -> e, recorded; and a recorded delete.
    std::fs::rename(ws.join("d"), ws.join("e")).unwrap();
    let mut d = draft(MutationType::Rename, "e");
    d.from = Some("d".into());
    l.record(d).unwrap();
    std::fs::remove_file(ws.join("deleted.txt")).unwrap();
    l.record(draft(MutationType::Delete, "deleted.txt"))
        .unwrap();
    l.shutdown();
    assert!(verify_drift(&lp, ws).unwrap().is_empty());

    // Now changes outside the mount.
    std::fs::write(ws.join("edited.txt"), "changed by a human\n").unwrap();
    std::fs::remove_file(ws.join("gone.txt")).unwrap();
    let drift = verify_drift(&lp, ws).unwrap();
    assert_eq!(drift.len(), 2, "{drift:?}");
    assert_eq!(drift[0].path, "edited.txt");
    assert!(
        matches!(&drift[0].kind, DriftKind::Modified { actual, .. } if *actual == sha256_file(&ws.join("edited.txt")).unwrap().0)
    );
    assert_eq!(drift[1].path, "gone.txt");
    assert!(matches!(drift[1].kind, DriftKind::Missing { .. }));
    std::fs::write(ws.join("e/moved.txt"), "x").unwrap();
    assert_eq!(
        verify_drift(&lp, ws).unwrap().len(),
        3,
        "the renamed file is tracked under its new name"
    );
}

#[test]
fn blame_two_intents_editing_different_lines() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let lp = ws.join(DEFAULT_LEDGER);
    let (l, _) = open(&lp);
    let f = ws.join("lib.rs");
    let write = |intent: &str, who: &str, old: &[u8], new: &str, created: bool| {
        std::fs::write(&f, new).unwrap();
        let mut d = draft(MutationType::Write, "lib.rs");
        d.intent_id = Some(intent.into());
        d.agent = Some(agent(who));
        d.created = created;
        d.ranges = changed_ranges(old, new.as_bytes());
        d.content_hash = Some(sha256_file(&f).unwrap().0);
        l.record(d).unwrap();
    };
    let v0 = "a\nb\nc\nd\n";
    std::fs::write(&f, v0).unwrap(); // predates the ledger
    let v1 = "a\nB1\nc\nd\n";
    write("INT-A", "alice", v0.as_bytes(), v1, false);
    let v2 = "a\nB1\nc\nD2\ne2\n";
    write("INT-B", "bob", v1.as_bytes(), v2, false);
    l.shutdown();
    let r = blame(&lp, ws, Path::new("lib.rs")).unwrap();
    assert!(r.warning.is_none(), "{:?}", r.warning);
    let who: Vec<String> = r
        .lines
        .iter()
        .map(|l| match &l.origin {
            Origin::Ledger(c) => format!(
                "{}/{}",
                c.intent_id.as_deref().unwrap(),
                c.agent.as_deref().unwrap()
            ),
            Origin::PredatesLedger => "old".into(),
            o => format!("{o:?}"),
        })
        .collect();
    assert_eq!(
        who,
        vec!["old", "INT-A/alice", "old", "INT-B/bob", "INT-B/bob"]
    );
    assert_eq!(r.versions.len(), 2);

    // Changed outside the mount: every line unknown, with a warning.
    std::fs::write(&f, "a\nB1\nc\nD2\ne2\nhuman\n").unwrap();
    let r = blame(&lp, ws, Path::new("lib.rs")).unwrap();
    assert!(r
        .warning
        .as_deref()
        .is_some_and(|w| w.contains("outside the mount")));
    assert!(r.lines.iter().all(|l| l.origin == Origin::ChangedOutside));
}

#[test]
fn agent_trace_export_has_only_spec_top_level_keys() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let git = ws.join(".git/refs/heads");
    std::fs::create_dir_all(&git).unwrap();
    std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let rev = "0123456789abcdef0123456789abcdef01234567";
    std::fs::write(git.join("main"), format!("{rev}\n")).unwrap();
    let lp = ws.join(DEFAULT_LEDGER);
    let (l, _) = Ledger::open(
        &lp,
        LedgerOptions {
            workspace: Some(ws.to_path_buf()),
            ..Default::default()
        },
    )
    .unwrap();
    let mut d = draft(MutationType::Write, "src/a.rs");
    d.ranges = Some(vec![(3, 5), (9, 9)]);
    d.content_hash = Some(sha256_bytes(b"x"));
    l.record(d).unwrap();
    l.record(draft(MutationType::Mkdir, "src")).unwrap();
    l.record(draft(MutationType::Write, "bin.dat")).unwrap();
    l.shutdown();
    let entries = read_entries(&lp).unwrap();
    assert_eq!(
        entries[0].1.vcs,
        Some(Vcs {
            kind: "git".into(),
            revision: rev.into()
        })
    );
    let mut out = Vec::new();
    assert_eq!(
        agent_trace::export(&lp, &mut out).unwrap(),
        2,
        "one record per WRITE"
    );
    let recs: Vec<serde_json::Value> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let allowed = [
        "version",
        "id",
        "timestamp",
        "vcs",
        "tool",
        "files",
        "metadata",
    ];
    for r in &recs {
        for k in r.as_object().unwrap().keys() {
            assert!(
                allowed.contains(&k.as_str()),
                "unexpected top-level key {k}"
            );
        }
        assert_eq!(r["version"], "0.1.0");
        assert_eq!(r["tool"]["name"], "intentfs");
        assert_eq!(
            r["files"][0]["conversations"][0]["contributor"]["type"],
            "ai"
        );
    }
    let r = &recs[0];
    assert_eq!(r["id"], entries[0].1.id.as_str());
    assert_eq!(
        r["vcs"],
        serde_json::json!({"type": "git", "revision": rev})
    );
    assert_eq!(r["files"][0]["path"], "src/a.rs");
    assert_eq!(
        r["files"][0]["conversations"][0]["ranges"],
        serde_json::json!([{"start_line": 3, "end_line": 5}, {"start_line": 9, "end_line": 9}])
    );
    let meta = &r["metadata"]["dev.intentfs"];
    assert_eq!(meta["intent_id"], "INT-1");
    assert_eq!(meta["mutation_class"], "INTENT_EVOLUTION");
    assert_eq!(meta["agent"]["name"], "claude");
    assert_eq!(meta["entry_id"], r["id"]);
}

#[test]
fn intent_map_lists_files_and_items_per_intent() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let lp = ws.join(DEFAULT_LEDGER);
    let out = ws.join(DEFAULT_INTENT_MAP);
    let (l, _) = open(&lp);
    let src = "use x;\n\npub fn parse() {\n    1\n}\n\nimpl Ledger {\n    fn open() {}\n}\n";
    std::fs::write(ws.join("lib.rs"), src).unwrap();
    let mut d = draft(MutationType::Write, "lib.rs");
    d.ranges = Some(vec![(4, 4), (8, 8)]);
    l.record(d).unwrap();
    let mut d = draft(MutationType::Write, "notes.txt");
    d.intent_id = Some("INT-2".into());
    d.agent = Some(agent("bob"));
    l.record(d).unwrap();
    let w = IntentMapWriter::new(&lp, Some(ws), &out);
    assert!(w.update().unwrap(), "first update writes");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("## INT-1") && text.contains("## INT-2"),
        "{text}"
    );
    let int1 = &text[text.find("## INT-1").unwrap()..text.find("## INT-2").unwrap()];
    assert!(int1.contains("`lib.rs` | 1 | 1 |"), "{int1}");
    assert!(
        int1.contains("`fn parse`") && int1.contains("`fn open`"),
        "{int1}"
    );
    assert!(
        text[text.find("## INT-2").unwrap()..].contains("| bob |"),
        "{text}"
    );
    // Debounced: a second update right away does not rewrite, even with news.
    l.record(draft(MutationType::Write, "lib.rs")).unwrap();
    assert!(!w.update().unwrap());
    w.write_now().unwrap();
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("`lib.rs` | 2 | 2 |"));
    // The background thread writes the final state when stopped.
    l.record(draft(MutationType::Delete, "lib.rs")).unwrap();
    let guard = IntentMapWriter::new(&lp, Some(ws), &out)
        .spawn(Duration::from_secs(60))
        .unwrap();
    drop(guard);
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("`lib.rs` | 3 | 2 |"));
    l.shutdown();
    std::fs::remove_file(&out).unwrap();
    write_intent_map(&lp, None, &out).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("(4 entries)") && text.contains("`lib.rs` | 3 | 2 |"),
        "{text}"
    );
}

/// Unmounts a tmpfs on drop.
struct TmpfsGuard(PathBuf);

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A tmpfs of `size` mounted in a temporary directory (unmounted when the guard drops), or
/// None when not root (said on stderr: the test skips).
fn small_tmpfs(size: &str) -> Option<(tempfile::TempDir, PathBuf, TmpfsGuard)> {
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("skipped: mounting a tmpfs needs root");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir_all(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "cannot mount a tmpfs as root");
    let guard = TmpfsGuard(mnt.clone());
    Some((dir, mnt, guard))
}

/// Fills the filesystem at `dir` with a file of its own (its path returned).
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![b'x'; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    filler
}

#[test]
fn full_disk_fails_closed_and_resumes_when_space_returns() {
    let Some((_dir, mnt, _guard)) = small_tmpfs("64k") else {
        return;
    };
    let lp = mnt.join("ledger.jsonl");
    let (l, _) = open(&lp);
    l.record(draft(MutationType::Mount, "")).unwrap();
    // Fill the disk.
    let filler = fill(&mnt);
    // Entries still fit in the ledger's last page for a while; then writes fail.
    let mut recorded = 1;
    let mut failed = 0;
    for i in 0..200 {
        let res = l.record(draft(MutationType::Write, &format!("while-full-{i}")));
        recorded += 1;
        if res.is_err() {
            failed += 1;
            if failed == 3 {
                break;
            }
        }
    }
    assert!(failed >= 1, "the disk never filled");
    assert!(matches!(l.health(), Err(LedgerError::Unavailable(_))));
    l.record_nowait(draft(MutationType::Write, "queued-while-full"))
        .unwrap();
    recorded += 1;
    // Still full after a retry period: still failing, no partial line left behind.
    std::thread::sleep(Duration::from_millis(250));
    assert!(l.health().is_err());
    let text = std::fs::read(&lp).unwrap();
    assert!(
        text.is_empty() || text.ends_with(b"\n"),
        "partial line left in the ledger"
    );
    // Space returns: the writer catches up by itself.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.health().is_err() {
        assert!(Instant::now() < deadline, "health never recovered");
        std::thread::sleep(Duration::from_millis(20));
    }
    l.record(draft(MutationType::Write, "after")).unwrap();
    recorded += 1;
    l.shutdown();
    let entries = read_entries(&lp).unwrap();
    assert_eq!(entries.len(), recorded, "every entry landed exactly once");
    let paths: HashSet<_> = entries.iter().map(|(_, e)| e.path.clone()).collect();
    assert_eq!(paths.len(), recorded);
    assert!(verify_chain(&lp).unwrap().intact());
}

/// The ledger keeps space allocated past its end (attack pass: with `--record async` a
/// change answered before the disk filled must not lose its entry). A disk filled by
/// someone else leaves the next entries room: they land, whole; the ledger then reports
/// itself unavailable (mutations are refused) although no write failed, until the disk
/// has room again.
#[test]
fn a_filled_disk_leaves_the_next_entries_room_and_refuses_what_follows() {
    let Some((_dir, mnt, _guard)) = small_tmpfs("4m") else {
        return;
    };
    let lp = mnt.join("ledger.jsonl");
    let (l, _) = open(&lp);
    l.record(draft(MutationType::Mount, "")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Another process fills the disk.
    let filler = fill(&mnt);
    // 40 entries of about 300 bytes: in the reserve (64 KiB on 4 MiB), every one written.
    for i in 0..40 {
        l.record(draft(MutationType::Chmod, &format!("while-full-{i}")))
            .unwrap_or_else(|e| panic!("entry {i} on a full disk: {e}"));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.health().is_ok() {
        assert!(
            Instant::now() < deadline,
            "the ledger never said its disk is full"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let Err(LedgerError::Unavailable(why)) = l.health() else {
        unreachable!()
    };
    assert!(why.contains("cannot reserve"), "{why}");
    // Space returns: the ledger is available again by itself.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while l.health().is_err() {
        assert!(Instant::now() < deadline, "health never recovered");
        std::thread::sleep(Duration::from_millis(20));
    }
    l.shutdown();
    let entries = read_entries(&lp).unwrap();
    assert_eq!(entries.len(), 41, "every entry landed");
    assert!(verify_chain(&lp).unwrap().intact());
}

const STORM_ENV: &str = "INTENTFS_LEDGER_STORM_PATH";

/// The child half of the kill -9 test: records forever from 4 threads, printing
/// each acknowledged path. Does nothing unless run by the parent.
#[test]
#[ignore = "helper process for kill_9_during_a_storm_loses_no_acknowledged_entry"]
fn storm_child_process() {
    let Some(p) = std::env::var_os(STORM_ENV) else {
        return;
    };
    let (l, _) = open(Path::new(&p));
    std::thread::scope(|s| {
        for t in 0..4 {
            let l = l.clone();
            s.spawn(move || {
                for i in 0.. {
                    let path = format!("t{t}/f{i}");
                    if i % 3 == 0 {
                        l.record_nowait(draft(MutationType::Write, &path)).unwrap();
                        continue;
                    }
                    l.record(draft(MutationType::Write, &path)).unwrap();
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "ack {path}");
                    let _ = out.flush();
                }
            });
        }
    });
}

#[test]
fn kill_9_during_a_storm_loses_no_acknowledged_entry() {
    let dir = tempfile::tempdir().unwrap();
    let lp = dir.path().join("l.jsonl");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "ledger::tests::storm_child_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STORM_ENV, &lp)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut acked = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(p) = line.strip_prefix("ack ") {
            acked.push(p.to_owned());
            if acked.len() == 600 {
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
    }
    let _ = child.wait();
    assert_eq!(acked.len(), 600, "the child did not get going");
    let (l, report) = open(&lp);
    l.shutdown();
    assert!(
        report.chain_findings.is_empty(),
        "{:?}",
        report.chain_findings
    );
    let entries = read_entries(&lp).unwrap();
    let present: HashSet<String> = entries.iter().filter_map(|(_, e)| e.path.clone()).collect();
    for a in &acked {
        assert!(present.contains(a), "acknowledged entry {a} lost");
    }
    assert_eq!(
        present.len(),
        entries.iter().filter(|(_, e)| e.path.is_some()).count(),
        "no duplicates"
    );
    assert!(verify_chain(&lp).unwrap().intact());
}

#[test]
fn mutation_class_remembers_deleted_paths() {
    // An intent's first write to a path is the first ever: a file deleted and created again
    // refactors, before and after the set is rebuilt from the ledger.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("l.jsonl");
    let (l, _) = open(&p);
    l.record(draft(MutationType::Write, "g.rs")).unwrap();
    l.record(draft(MutationType::Delete, "g.rs")).unwrap();
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("g.rs")),
        MutationClass::AstRefactor
    );
    drop(l);
    let (l, _) = open(&p);
    assert_eq!(
        l.next_class(Some("INT-1"), Path::new("g.rs")),
        MutationClass::AstRefactor
    );
    assert_eq!(
        l.next_class(Some("INT-2"), Path::new("g.rs")),
        MutationClass::IntentEvolution
    );
}

#[test]
fn intent_map_keeps_recent_gone_files_and_drops_older_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let lp = ws.join(DEFAULT_LEDGER);
    let out = ws.join(DEFAULT_INTENT_MAP);
    let (l, _) = open(&lp);
    l.record(draft(MutationType::Write, "keep.rs")).unwrap();
    // 1,200 temp files, each written and renamed over keep.rs (what `sed -i` leaves).
    for i in 0..1200 {
        l.record(draft(MutationType::Write, &format!("sed{i:04}")))
            .unwrap();
        let mut r = draft(MutationType::Rename, "keep.rs");
        r.from = Some(PathBuf::from(format!("sed{i:04}")));
        l.record(r).unwrap();
    }
    l.shutdown();
    write_intent_map(&lp, None, &out).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("`keep.rs` | 1201 |"), "{}", &text[..400]);
    assert!(
        !text.contains("`sed0000`"),
        "the oldest gone rows are dropped"
    );
    assert!(text.contains("`sed1199`"), "recent ones stay");
    assert!(
        text.contains("200 older rows of files that are gone"),
        "{}",
        &text[text.len() - 300..]
    );
}

/// The hook the content store hangs on the group commit runs before each `fdatasync`, on
/// the sync thread: entries are never durable before what they name.
#[test]
fn before_sync_runs_before_each_group_commit() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let lp = dir.path().join("agent_trace.jsonl");
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let (l, _) = Ledger::open(
        &lp,
        LedgerOptions {
            before_sync: Some(BeforeSync(std::sync::Arc::new(move || {
                seen.fetch_add(1, Ordering::SeqCst);
            }))),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    l.record(draft(MutationType::Write, "a")).unwrap();
    let t0 = Instant::now();
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no sync after an entry"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A second entry later: another group commit, another call.
    std::thread::sleep(Duration::from_millis(20));
    let before = calls.load(Ordering::SeqCst);
    l.record(draft(MutationType::Write, "b")).unwrap();
    let t0 = Instant::now();
    while calls.load(Ordering::SeqCst) == before {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no sync after the second entry"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
