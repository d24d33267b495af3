//! Property test: random sequences of filesystem operations are applied to a plain
//! directory and to the mount (allow-all intent); every step's result (the value on
//! success, the errno on failure) must match, and so must the final trees. A failing
//! sequence is shrunk by proptest to a minimal one before it is reported.
//!
//! The generator is state-free (paths come from a small name space, so most operations
//! hit existing entries and collide in interesting ways) and the RNG seed is fixed, so a
//! run is deterministic. One mount serves every case; each case works in a fresh
//! directory of both trees. As in `differential.rs`, every file an operation touches is
//! read through the mount first (a careful agent) and a truncate by path never goes to
//! 0 bytes, so that stale-write protection does not refuse a sequence that the native
//! filesystem accepts.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use common::fsops::*;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Names of the small name space: the setup creates some of them.
const NAMES: [&str; 5] = ["a", "b", "x", "y", "l"];

/// A path of 1 to 3 components (mostly short), which may or may not exist.
fn path() -> impl Strategy<Value = String> {
    let name = proptest::sample::select(NAMES.to_vec());
    prop_oneof![
        4 => name.clone().prop_map(|n| n.to_string()),
        3 => (name.clone(), name.clone()).prop_map(|(a, b)| format!("{a}/{b}")),
        1 => (name.clone(), name.clone(), name).prop_map(|(a, b, c)| format!("{a}/{b}/{c}")),
    ]
}

fn data() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(b'a'..=b'z', 0..48)
}

fn op() -> impl Strategy<Value = Op> {
    let mode = proptest::sample::select(vec![0o644u32, 0o600, 0o755, 0o700, 0o444, 0o640, 0o4755]);
    prop_oneof![
        3 => (path(), data()).prop_map(|(f, d)| Op::Create(f, d)),
        1 => path().prop_map(Op::CreateNew),
        2 => (path(), 0u64..80, data()).prop_map(|(f, o, d)| Op::WriteAt(f, o, d)),
        1 => (path(), data()).prop_map(|(f, d)| Op::Append(f, d)),
        1 => (path(), 0u64..60).prop_map(|(f, n)| Op::TruncFh(f, n)),
        1 => (path(), 1u64..60).prop_map(|(f, n)| Op::TruncPath(f, n)),
        3 => (path(), path()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => (path(), path()).prop_map(|(a, b)| Op::RenameNoReplace(a, b)),
        1 => (path(), path()).prop_map(|(a, b)| Op::Exchange(a, b)),
        2 => path().prop_map(Op::Mkdir),
        1 => path().prop_map(Op::Rmdir),
        2 => path().prop_map(Op::Unlink),
        1 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (0usize..3, path(), path()).prop_map(|(u, t, l)| Op::Symlink(u, t, l)),
        1 => path().prop_map(Op::Readlink),
        1 => (path(), mode).prop_map(|(f, m)| Op::Chmod(f, m)),
        1 => path().prop_map(Op::Stat),
        1 => path().prop_map(Op::StatFollow),
        1 => prop_oneof![Just(String::new()), path()].prop_map(Op::ReadDir),
        2 => path().prop_map(Op::Read),
    ]
}

/// What every case starts from.
fn setup() -> Vec<Op> {
    vec![
        Op::Mkdir("x".into()),
        Op::Mkdir("y".into()),
        Op::Mkdir("x/y".into()),
        Op::Create("a".into(), b"alpha".to_vec()),
        Op::Create("x/a".into(), b"bravo".to_vec()),
        Op::Create("x/y/b".into(), b"charlie".to_vec()),
        Op::Symlink(0, "x/a".into(), "l".into()),
    ]
}

/// Totals over all cases, printed at the end.
#[derive(Default)]
struct Tally {
    cases: AtomicU64,
    ops: AtomicU64,
    ok: AtomicU64,
    err: AtomicU64,
}

fn run(seed: u64, cases: u32, max_ops: usize, umask: Option<libc::mode_t>) {
    let tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    if let Some(m) = umask {
        // SAFETY: umask has no preconditions. Process-wide: nextest runs each test in its
        // own process. Set after mounting: the daemon must not inherit it.
        unsafe { libc::umask(m) };
    }
    let plain_dir = tempfile::Builder::new()
        .prefix("intentfs-prop-")
        .tempdir()
        .unwrap();
    let plain_root: PathBuf = plain_dir.path().join("t");
    let mount_root: PathBuf = tm.m("t");
    std::fs::create_dir(&plain_root).unwrap();
    std::fs::create_dir(&mount_root).unwrap();
    let n = AtomicU64::new(0);
    let tally = Tally::default();

    let config = Config {
        cases,
        failure_persistence: None,
        // Each shrinking step replays a sequence on the mount: bounded, still thorough.
        max_shrink_iters: 2000,
        ..Config::default()
    };
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
    let mut runner = TestRunner::new_with_rng(config, rng);

    let strategy = proptest::collection::vec(op(), 1..=max_ops);
    let result = runner.run(&strategy, |ops| {
        let case = format!("c{}", n.fetch_add(1, Ordering::Relaxed));
        let plain = plain_root.join(&case);
        let mounted = mount_root.join(&case);
        std::fs::create_dir(&plain).unwrap();
        std::fs::create_dir(&mounted).unwrap();
        tally.cases.fetch_add(1, Ordering::Relaxed);
        let mut log = Vec::new();
        for (step, op) in setup().iter().chain(ops.iter()).enumerate() {
            for p in paths_of(op) {
                let _ = std::fs::read(mounted.join(p));
            }
            let want = exec(&plain, op);
            let got = exec(&mounted, op);
            log.push(format!("{step}: {op:?} -> {want:?}"));
            tally.ops.fetch_add(1, Ordering::Relaxed);
            if want.is_ok() {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            } else {
                tally.err.fetch_add(1, Ordering::Relaxed);
            }
            if want != got {
                return Err(TestCaseError::fail(format!(
                    "step {step}: {op:?}\n  plain dir: {want:?}\n  mount:     {got:?}\nlast_error: {}\nsteps:\n{}",
                    tm.ctl("last_error"),
                    log.join("\n")
                )));
            }
        }
        let (a, b) = (tree(&plain, &[]), tree(&mounted, &[]));
        prop_assert_eq!(&a, &b, "final trees differ (plain, mount)");
        let w = tree(&tm.w("t").join(&case), &[]);
        prop_assert_eq!(&w, &b, "the workspace differs from the mount");
        Ok(())
    });
    eprintln!(
        "prop_differential seed {seed:#x}: {} sequences (incl. shrinking), {} operations, {} ok, {} errors",
        tally.cases.load(Ordering::Relaxed),
        tally.ops.load(Ordering::Relaxed),
        tally.ok.load(Ordering::Relaxed),
        tally.err.load(Ordering::Relaxed),
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // Allowed all along: no denial was ledgered.
    let l = tm.ledger();
    assert!(
        l.iter().all(|e| e["mutation_type"] != "DENIAL"),
        "denials in the ledger: {:#?}",
        l.iter()
            .filter(|e| e["mutation_type"] == "DENIAL")
            .collect::<Vec<_>>()
    );
}

#[test]
fn prop_differential_short_sequences() {
    run(0x1d1f_0001, 1000, 12, None);
}

#[test]
fn prop_differential_long_sequences() {
    run(0x1d1f_0002, 300, 60, None);
}

/// The same with the caller's umask 0 (as pjdfstest runs): modes must still match.
#[test]
fn prop_differential_umask_0() {
    run(0x1d1f_0003, 300, 12, Some(0));
}

/// The generator's own sanity: `exec` on a plain directory is what the comparison assumes.
#[test]
fn prop_generator_hits_errnos_and_successes() {
    let dir = tempfile::tempdir().unwrap();
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 64,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let errs = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let oks = AtomicU64::new(0);
    let n = AtomicU64::new(0);
    runner
        .run(&proptest::collection::vec(op(), 1..=40), |ops| {
            let base = dir
                .path()
                .join(n.fetch_add(1, Ordering::Relaxed).to_string());
            std::fs::create_dir(&base).unwrap();
            for op in setup().iter().chain(ops.iter()) {
                match exec(&base, op) {
                    Ok(_) => {
                        oks.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        errs.lock().unwrap().insert(e);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    let errs = errs.into_inner().unwrap();
    for e in [
        libc::ENOENT,
        libc::EEXIST,
        libc::ENOTDIR,
        libc::EISDIR,
        libc::ENOTEMPTY,
        libc::EINVAL,
    ] {
        assert!(errs.contains(&e), "errno {e} never came up: {errs:?}");
    }
    assert!(oks.load(Ordering::Relaxed) > 500);
}
