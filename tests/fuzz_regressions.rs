//! Hostile-input regression tests, on stable, without a mount.
//!
//! - Every input under `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` is replayed
//!   through the same harness the cargo-fuzz targets run (`fuzz/harness.rs`): no panic,
//!   and each input finishes (nextest's slow-test timeout would catch a hang).
//! - Explicit cases for the classic parser attacks (YAML alias bombs, deep nesting, huge
//!   scalars, invalid UTF-8, torn JSON lines) assert a clear error, not just "no panic".
//! - Each finding of the fuzzing campaign has its own test here, named after it.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

use intentfs::ledger::reader::{self, FindingKind};
use intentfs::ledger::DriftKind;
use intentfs::policy::Policy;

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(rd) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        for e in rd {
            out.push(e.unwrap().path());
        }
    }
    out.sort();
    out
}

fn replay(target: &str, f: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no inputs for {target}");
    for p in &files {
        let data = std::fs::read(p).unwrap();
        let r = std::panic::catch_unwind(|| f(&data));
        assert!(r.is_ok(), "{target}: {} panicked", p.display());
    }
    harness::cleanup();
}

#[test]
fn replay_policy_inputs() {
    replay("policy", harness::policy);
}

#[test]
fn replay_control_inputs() {
    replay("control", harness::control);
}

#[test]
fn replay_ledger_inputs() {
    replay("ledger", harness::ledger);
}

fn parse(text: &str) -> Result<Policy, String> {
    Policy::parse(text, Path::new("p.yaml")).map_err(|e| e.to_string())
}

/// "Billion laughs": 9 levels of 9 aliases each would expand to 9^9 scalars.
fn alias_bomb(levels: usize) -> String {
    let mut s = String::from(
        "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..=levels {
        let refs = vec![format!("*a{}", i - 1); 9].join(",");
        s.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    s
}

#[test]
fn alias_bomb_at_top_level_is_a_clear_error() {
    let e = parse(&alias_bomb(9)).unwrap_err();
    assert!(e.contains("p.yaml"), "{e}");
    // Refused for what it is: a budget/alias limit, or the unknown top-level key.
    assert!(
        e.contains("limit") || e.contains("alias") || e.contains("unknown"),
        "{e}"
    );
}

#[test]
fn alias_bomb_inside_an_intent_is_refused_by_the_budget() {
    // Every value sits where the schema expects a list of strings: only the resource
    // budget can stop it.
    let mut doc = String::from("intents:\n  - id: A\n    status: IN_PROGRESS\n    constraints: &c0 [\"s\",\"s\",\"s\",\"s\",\"s\",\"s\",\"s\",\"s\"]\n");
    for i in 1..=8 {
        doc.push_str(&format!(
            "  - id: A{i}\n    status: IN_PROGRESS\n    constraints: &c{i} [{}]\n",
            vec![format!("*c{}", i - 1); 8].join(",")
        ));
    }
    let e = parse(&doc).unwrap_err();
    assert!(e.contains("p.yaml"), "{e}");
    assert!(e.contains("limit") || e.contains("alias"), "{e}");
}

#[test]
fn deeply_nested_documents_are_clear_errors() {
    for doc in [
        format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
        format!("{}b{}", "{a: ".repeat(10_000), "}".repeat(10_000)),
        (0..2000)
            .map(|i| format!("{}- \n", " ".repeat(i * 2)))
            .collect(),
        format!(
            "intents:\n  - id: A\n    status: IN_PROGRESS\n    constraints: {}{}\n",
            "[".repeat(5000),
            "]".repeat(5000)
        ),
    ] {
        let e = parse(&doc).unwrap_err();
        assert!(e.contains("p.yaml"), "{e}");
        assert!(
            e.contains("nested too deeply") || e.contains("resource limits"),
            "{e}"
        );
    }
}

#[test]
fn huge_scalars_are_bounded() {
    // Over the 4 MiB file budget: refused before parsing.
    let big = format!(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    name: \"{}\"\n",
        "x".repeat(5 << 20)
    );
    let e = parse(&big).unwrap_err();
    assert!(e.contains("larger than 4 MiB"), "{e}");
    // Under it: a long name is fine, and a long glob compiles or is refused, but returns.
    let name = format!(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    name: \"{}\"\n",
        "x".repeat(3 << 20)
    );
    let p = parse(&name).unwrap();
    assert_eq!(p.intents()[0].name.len(), 3 << 20);
    let glob = format!(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"{}x\", \"{}b{}\"]\n",
        "**/".repeat(20_000),
        "{a,".repeat(500),
        "}".repeat(500)
    );
    let _ = parse(&glob);
    harness::policy(glob.as_bytes());
}

/// Hardening: a megabyte-long bad value (status, key, id) used to be quoted whole in the
/// error message (log line, desktop notice); it is now clipped.
#[test]
fn huge_bad_values_make_short_messages() {
    let v = "Q".repeat(3 << 20);
    for doc in [
        format!("intents:\n  - id: A\n    status: {v}\n"),
        format!("intents:\n  - id: A\n    status: IN_PROGRESS\n    {v}: 1\n"),
        format!("intents:\n  - id: A {v}\n    status: IN_PROGRESS\n"),
        format!("intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"[{v}\"]\n"),
        format!("intents: \"{v}\"\n"),
        format!("approval:\n  timeout_s: {v}\n"),
    ] {
        let e = parse(&doc).unwrap_err();
        assert!(
            e.len() < 2000,
            "message of {} bytes: {}...",
            e.len(),
            &e[..200]
        );
    }
}

#[test]
fn invalid_utf8_policy_file_names_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.yaml");
    std::fs::write(&f, b"intents:\n  - id: A\xff\n    status: IN_PROGRESS\n").unwrap();
    let e = Policy::load(&f).unwrap_err().to_string();
    assert!(e.contains("utf-8"), "{e}");
    assert!(e.contains(":2:"), "{e}");
}

fn write_ledger(dir: &Path, body: &[u8]) -> PathBuf {
    let p = dir.join("agent_trace.jsonl");
    std::fs::write(&p, body).unwrap();
    p
}

/// Finding: a `prev` of 64 bytes that are not 64 hex digits (a multi-byte character across
/// byte 16) made chain verification panic on a string slice ("byte index 16 is not a char
/// boundary") — in `intentfs ledger verify`, and in the writer's check when it opens a
/// ledger at mount. Fixed in `reader::short`.
#[test]
fn finding_prev_with_multibyte_char_at_byte_16() {
    let dir = tempfile::tempdir().unwrap();
    let prev = format!("{}é{}", "a".repeat(15), "a".repeat(47));
    assert_eq!(prev.len(), 64);
    let line = format!(
        "{{\"id\":\"x\",\"timestamp\":\"t\",\"mutation_type\":\"WRITE\",\"outcome\":\"ok\",\"prev\":\"{prev}\"}}\n"
    );
    let p = write_ledger(dir.path(), line.as_bytes());
    let r = reader::verify_chain(&p).unwrap();
    assert_eq!(r.entries, 1);
    assert_eq!(r.findings.len(), 1, "{:?}", r.findings);
    assert_eq!(r.findings[0].kind, FindingKind::ChainBroken);
}

/// Finding: `ledger verify`'s drift check joined recorded paths to the workspace as they
/// were, so a tampered entry with an absolute or `..` path made it stat and hash files
/// outside the workspace (and `/dev/zero`-like files could never finish). Such entries
/// are now reported as tampered, never followed.
#[test]
fn finding_drift_never_leaves_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(dir.path().join("outside"), b"secret").unwrap();
    let mut body = String::new();
    let mut prev = "0".repeat(64);
    for path in ["../outside", "/etc/hostname", "ok/../../outside"] {
        let line = format!(
            "{{\"id\":\"x\",\"timestamp\":\"t\",\"mutation_type\":\"WRITE\",\"path\":\"{path}\",\"content_hash\":\"sha256:00\",\"outcome\":\"ok\",\"prev\":\"{prev}\"}}\n"
        );
        prev = intentfs::ledger::sha256_bytes(line.as_bytes())["sha256:".len()..].to_string();
        body.push_str(&line);
    }
    let p = write_ledger(dir.path(), body.as_bytes());
    assert!(reader::verify_chain(&p).unwrap().intact());
    let drift = reader::verify_drift(&p, &ws).unwrap();
    assert_eq!(drift.len(), 3, "{drift:?}");
    for d in drift {
        match d.kind {
            DriftKind::Modified { actual, .. } => {
                assert!(actual.contains("not a workspace-relative path"), "{actual}")
            }
            k => panic!("{}: {k:?}", d.path),
        }
    }
}

/// Finding: a recorded `a/b` whose parent `a` became a file made the whole drift check fail
/// with ENOTDIR instead of reporting `a/b` missing.
#[test]
fn finding_drift_parent_replaced_by_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a"), b"now a file").unwrap();
    let line = format!(
        "{{\"id\":\"x\",\"timestamp\":\"t\",\"mutation_type\":\"WRITE\",\"path\":\"a/b\",\"content_hash\":\"sha256:00\",\"outcome\":\"ok\",\"prev\":\"{}\"}}\n",
        "0".repeat(64)
    );
    let p = write_ledger(dir.path(), line.as_bytes());
    let drift = reader::verify_drift(&p, &ws).unwrap();
    assert_eq!(drift.len(), 1);
    assert!(
        matches!(drift[0].kind, DriftKind::Missing { .. }),
        "{drift:?}"
    );
}

#[test]
fn torn_and_garbage_json_lines_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "{{\"id\":\"x\",\"timestamp\":\"t\",\"mutation_type\":\"MOUNT\",\"outcome\":\"ok\",\"prev\":\"{}\"}}\n",
        "0".repeat(64)
    );
    let mut body = good.clone().into_bytes();
    body.extend_from_slice(b"\xff\xfe{\"prev\":\n");
    body.extend_from_slice(&b"[".repeat(100_000));
    body.push(b'\n');
    body.extend_from_slice(&good.as_bytes()[..good.len() / 2]); // torn last line
    let p = write_ledger(dir.path(), &body);
    let r = reader::verify_chain(&p).unwrap();
    assert_eq!(r.entries, 4);
    let kinds: Vec<_> = r.findings.iter().map(|f| (f.line, f.kind)).collect();
    assert!(kinds.contains(&(2, FindingKind::Unparsable)), "{kinds:?}");
    assert!(kinds.contains(&(3, FindingKind::Unparsable)), "{kinds:?}");
    assert!(kinds.contains(&(4, FindingKind::TornTail)), "{kinds:?}");
    harness::ledger(&body);
    harness::cleanup();
}

#[test]
fn control_writes_of_hostile_bytes_are_refused_cleanly() {
    // Invalid UTF-8, NULs, a huge id, an id with the right prefix: all `EINVAL` (the
    // harness asserts that only a selectable intent can ever end up selected).
    let mut data = Vec::new();
    for body in [
        &b"INT-001\xff"[..],
        b"\0\0\0",
        b"INT-002",
        b"INT-00",
        b"  INT-001  \n",
    ] {
        data.extend_from_slice(&[0, 0, 0, body.len() as u8]);
        data.extend_from_slice(body);
    }
    harness::control(&data);
    // A write at an offset near the 64 KiB cap, then past it.
    harness::control(&[
        0, 0xf0, 0xff, 8, b'I', b'N', b'T', b'-', b'0', b'0', b'1', b'\n',
    ]);
}

/// Clipping applies to error messages only: a rule text names its glob in full.
#[test]
fn long_globs_are_quoted_verbatim_in_rule_texts() {
    let glob = format!("{}/**", "d".repeat(300));
    let p = parse(&format!(
        "intents:\n  - id: A\n    status: IN_PROGRESS\n    owned_scope: [\"{glob}\"]\n"
    ))
    .unwrap();
    let rule = p.intents()[0]
        .scope_match(Path::new(&format!("{}/x", "d".repeat(300))))
        .unwrap();
    assert_eq!(rule, format!("owned_scope \"{glob}\" of A"));
}
