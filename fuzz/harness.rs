//! What each fuzz target does with its input, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`, nightly) and by the regression test that replays
//! `fuzz/regressions/*` and `fuzz/seeds/*` on stable (`tests/fuzz_regressions.rs`, which
//! includes this file with `#[path]`).
//!
//! The property checked is the same everywhere: the function returns (an `Ok` or a clear
//! error), without panicking, hanging or allocating without bound.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use intentfs::control::{self, CtlFile, StatusInfo};
use intentfs::guard::{Identities, Identity, Intents};
use intentfs::ledger::{self, reader};
use intentfs::policy::{IntentIgnore, Policy};

/// A scratch directory of this process and thread (files written there are removed
/// again by the caller that wrote them).
fn scratch() -> PathBuf {
    thread_local! {
        static DIR: PathBuf = {
            let base = if Path::new("/dev/shm").is_dir() {
                PathBuf::from("/dev/shm")
            } else {
                std::env::temp_dir()
            };
            let d = base.join(format!(
                "intentfs-fuzz-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ).replace(['(', ')'], ""));
            std::fs::create_dir_all(&d).expect("scratch dir");
            d
        };
    }
    DIR.with(|d| d.clone())
}

/// Removes this thread's scratch directory (for tests; the fuzzers leave it).
pub fn cleanup() {
    let _ = std::fs::remove_dir_all(scratch());
}

/// Paths every matcher is asked about, whatever the input.
const PROBES: &[&str] = &[
    "",
    "a",
    "src/auth/x.ts",
    ".env",
    "deep/a/b/c/d/e/f/g/h/key.pem",
    ".git/config",
    "dir/",
    "a/../b",
];

/// Up to 8 lines of the input (each at most 256 bytes), used as paths too: the fuzzer
/// can then find paths that the input's own globs match.
fn paths_from(data: &[u8]) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    data.split(|&b| b == b'\n')
        .take(8)
        .map(|l| {
            let l = &l[..l.len().min(256)];
            let l = l.strip_prefix(b"- ").unwrap_or(l);
            let l: Vec<u8> = l.iter().copied().filter(|&b| b != b'"').collect();
            PathBuf::from(std::ffi::OsStr::from_bytes(&l))
        })
        .collect()
}

/// Policy target: YAML bytes -> `Policy::parse` (or `Policy::load` when they are not
/// UTF-8), then everything a compiled policy is asked; the same text as `.intentignore`.
pub fn policy(data: &[u8]) {
    let origin = Path::new("fuzz/active_intents.yaml");
    let text = std::str::from_utf8(data).ok();
    let res = match text {
        Some(t) => Policy::parse(t, origin),
        None => {
            let f = scratch().join("policy.yaml");
            std::fs::write(&f, data).expect("write scratch policy");
            let r = Policy::load(&f);
            let _ = std::fs::remove_file(&f);
            r
        }
    };
    let mut paths: Vec<PathBuf> = PROBES.iter().map(PathBuf::from).collect();
    paths.extend(paths_from(data));
    match res {
        Ok(p) => {
            let _ = p.summary_table();
            let _ = p.approval();
            for it in p.intents() {
                let _ = it.context_xml();
                let _ = it.selectable();
                assert!(
                    p.intent(&it.id).is_some(),
                    "intent {:?} not found by id",
                    it.id
                );
                for rel in &paths {
                    let _ = it.scope_match(rel);
                }
            }
            for rel in &paths {
                let _ = p.sensitive_match(rel);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty(), "empty error message");
            let _ = e.position();
            let _ = e.hint();
        }
    }
    if let Some(t) = text {
        match IntentIgnore::parse(t, Path::new(".intentignore")) {
            Ok(ig) => {
                for rel in &paths {
                    let _ = ig.matched(rel, false);
                    let _ = ig.matched(rel, true);
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// The policy the control target handshakes against.
pub const CONTROL_POLICY: &str = "\
intents:
  - id: INT-001
    name: \"JWT <auth> & 'co'\"
    status: IN_PROGRESS
    owned_scope: [\"src/auth/**\", \"src/middleware/jwt.ts\"]
    constraints: [\"no external \\u0001 providers\"]
    acceptance_criteria: [\"tests pass\"]
  - id: INT-002
    name: Docs
    status: PAUSED
    owned_scope: [\"docs/\"]
  - id: \"INT-\\u00e9\"
    name: unicode
    status: IN_PROGRESS
";

fn control_policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| Policy::parse(CONTROL_POLICY, Path::new("control.yaml")).expect("policy"))
}

/// Control target: a sequence of writes to `.intentfs/` files, handled as the daemon's
/// `write` handler does (one buffer per open file, at most 64 KiB, offsets honoured,
/// decoded lossily, then `control::apply_write`), then every control file rendered.
///
/// Input: records of `[file selector][offset lo][offset hi][len][len bytes]`; a short
/// last record takes what is left.
pub fn control(data: &[u8]) {
    let policy = control_policy();
    let ids = Identities::new("fuzz-agent".into(), Intents::All, false, None);
    let default = ids.default_identity().clone();
    // An identity the operator bound to one intent: nothing written may widen it.
    let bound = Identity::new(
        "bound".into(),
        "run:1".into(),
        Intents::Among(vec!["INT-\u{e9}".into()]),
        None,
        false,
    );
    let mut bufs: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut rest = data;
    let mut writes = 0;
    while !rest.is_empty() && writes < 64 {
        writes += 1;
        let sel = rest[0];
        let off = u16::from_le_bytes([*rest.get(1).unwrap_or(&0), *rest.get(2).unwrap_or(&0)])
            as usize
            % 80_000;
        let len = *rest.get(3).unwrap_or(&0) as usize;
        let body_start = rest.len().min(4);
        let body_end = rest
            .len()
            .min(4 + if len == 0 { usize::MAX - 4 } else { len });
        let body = &rest[body_start..body_end];
        rest = &rest[body_end..];
        let k = (sel & 0x7f) as usize % control::FILES.len();
        let f = control::FILES[k];
        let buf = bufs.entry(k).or_default();
        // What `Fs::write_ctl` does.
        if off + body.len() > 64 * 1024 {
            continue; // EFBIG
        }
        if buf.len() < off + body.len() {
            buf.resize(off + body.len(), 0);
        }
        buf[off..off + body.len()].copy_from_slice(body);
        let text = String::from_utf8_lossy(buf).into_owned();
        let ident = if sel & 0x80 != 0 { &bound } else { &*default };
        let _ = control::apply_write(f, ident, policy, &text);
        if f == CtlFile::Intent {
            // What was accepted is exactly a selectable intent of the policy, and one the
            // identity's bound allows.
            if let Some(sel) = ident.intent() {
                let it = policy.intent(&sel).expect("selected intent exists");
                assert!(it.selectable(), "selected a non-selectable intent");
                assert!(
                    ident.allowed.allows(&sel),
                    "selected outside the bound: {sel}"
                );
            }
        }
        let _ = ids.by_key(text.trim());
    }
    let info = || StatusInfo {
        workspace: "/ws".into(),
        mountpoint: "/mnt".into(),
        policy: "control.yaml".into(),
        policy_error: None,
        nodes: 1,
        open_handles: 0,
        transport: None,
        data: "daemon",
        record: "sync",
        counters: serde_json::Value::Null,
        pending: serde_json::json!([]),
        lessons_file: "CLAUDE.md".into(),
    };
    for f in control::FILES {
        let _ = control::render(f, &default, &ids, policy, &info);
        let _ = control::render(f, &bound, &ids, policy, &info);
        let _ = control::file_stat(f, 0);
        assert_eq!(CtlFile::from_ino(f.ino()), Some(f));
    }
}

/// Ledger target: bytes of a `.jsonl` ledger (and, when the input starts with `#`, its
/// first line as the `<ledger>.head` checkpoint) -> chain verification, entry reading,
/// drift against an empty-ish workspace, queries, blame, export and the intent map.
pub fn ledger(data: &[u8]) {
    let dir = scratch();
    let ws = dir.join("ws");
    let _ = std::fs::create_dir_all(&ws);
    let _ = std::fs::write(ws.join("a"), b"one\ntwo\n");
    let path = dir.join("agent_trace.jsonl");
    let head = ledger::writer::head_path(&path);
    let body = match data.strip_prefix(b"#") {
        Some(rest) => {
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            std::fs::write(&head, &rest[..end]).expect("write head");
            &rest[(end + 1).min(rest.len())..]
        }
        None => {
            let _ = std::fs::remove_file(&head);
            data
        }
    };
    std::fs::write(&path, body).expect("write ledger");

    let lines = body.split_inclusive(|&b| b == b'\n').count() as u64;
    let report = reader::verify_chain(&path).expect("verify_chain");
    assert_eq!(report.entries, lines, "entry count");
    for f in &report.findings {
        assert!(f.line >= 1, "finding at line 0: {f:?}");
        assert!(!f.message.is_empty());
    }
    let _ = serde_json::to_string(&report);

    // The incremental checker over an in-memory reader agrees on the line count.
    let mut checker = reader::ChainChecker::new();
    let mut n = 0;
    for line in reader::Lines::new(Cursor::new(body)) {
        let line = line.expect("in-memory read");
        n += 1;
        let _ = line.hash_hex();
        match reader::parse_line(line.content()) {
            Ok(e) => checker.push(&line, Some(&e.prev), None),
            Err(err) => checker.push(&line, None, Some(err.to_string())),
        }
    }
    assert_eq!(n, lines);
    let _ = checker.last_hash().to_owned();
    let _ = checker.finish();

    let entries = reader::read_entries(&path).expect("read_entries");
    let _ = reader::last_hashes(&entries);
    let _ = reader::verify_drift(&path, &ws);
    for (_, e) in &entries {
        let _ = e.path_buf();
        let _ = e.from_buf();
        let _ = ledger::agent_trace::record_for(e);
    }
    let filter = reader::Filter {
        intent: Some("INT-001".into()),
        agent: Some("a".into()),
        path: globset::Glob::new("**/a").ok().map(|g| g.compile_matcher()),
        since: Some(chrono::DateTime::<chrono::Utc>::MIN_UTC),
        until: Some(chrono::DateTime::<chrono::Utc>::MAX_UTC),
        mutation_type: None,
    };
    for (_, e) in &entries {
        let _ = filter.matches(e);
    }
    let _ = reader::query(&path, &reader::Filter::default());
    let _ = ledger::blame::blame(&path, &ws, Path::new("a"));
    let _ = ledger::agent_trace::export(&path, &mut std::io::sink());
    let _ = ledger::write_intent_map(&path, Some(&ws), &dir.join("intent_map.md"));
}
