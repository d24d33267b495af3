//! Criterion benchmarks of the governance hot paths (issue 6): policy evaluation with a
//! 1,000-glob policy, SHA-256 hashing throughput, ledger appends, and which identity a
//! request belongs to (issue 16).
//!
//!     cargo bench --bench governance                 # full (about 1 min)
//!     cargo bench --bench governance -- --quick      # smoke run
//!     cargo bench --bench governance -- policy       # one group (a name filter)
//!
//! Wired in Cargo.toml as `[[bench]] name = "governance" path = "bench/governance.rs"`.
//! Benchmarks report; they assert nothing about time.

// A benchmark panics on a setup that did not work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sha2::{Digest, Sha256};

use intentfs::guard::{Guard, Protected, Rules};
use intentfs::ledger::{Agent, Draft, Ledger, LedgerOptions, MutationType};
use intentfs::policy::{IntentIgnore, Policy};

const N_GLOBS: usize = 1000;
const HASH_BYTES: usize = 64 << 20;

/// A policy of `N_GLOBS` globs over 10 intents (100 each), in the shapes real policies use:
/// `dir/**`, `dir/` (directory and below), `dir/*.ext`, exact files, `**/name` and
/// brace/class patterns. Intent `BIG` holds all 1,000 (the one benchmarked).
fn policy_yaml() -> String {
    let mut globs = Vec::with_capacity(N_GLOBS);
    for i in 0..N_GLOBS {
        globs.push(match i % 6 {
            0 => format!("src/mod{i}/**"),
            1 => format!("crates/c{i}/"),
            2 => format!("pkg/p{i}/*.rs"),
            3 => format!("docs/section{i}/index.md"),
            4 => format!("**/gen{i}_*.{{c,h}}"),
            _ => format!("tests/t{i}/[a-m]*.py"),
        });
    }
    let mut y = String::from("intents:\n");
    y.push_str("  - id: BIG\n    name: one intent with 1000 globs\n    status: IN_PROGRESS\n    owned_scope:\n");
    for g in &globs {
        y.push_str(&format!("      - \"{g}\"\n"));
    }
    // A few more intents of 100 globs each: the policy as a whole, not just one intent.
    for k in 0..3 {
        y.push_str(&format!(
            "  - id: I{k}\n    name: part {k}\n    status: IN_PROGRESS\n    owned_scope:\n"
        ));
        for g in globs.iter().skip(k * 100).take(100) {
            y.push_str(&format!("      - \"{g}\"\n"));
        }
    }
    y.push_str("sensitive: [\"config/prod/**\"]\n");
    y
}

/// 1,000 paths: about half inside the BIG scope (spread over every glob shape, matched
/// by early and late globs alike), half outside it.
fn paths() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut hit = Vec::new();
    let mut miss = Vec::new();
    for i in 0..500usize {
        let g = (i * 2) % N_GLOBS; // every other glob, early to late
        let g = g - g % 6 + (i % 6); // cycle the shapes
        let g = g.min(N_GLOBS - 1);
        hit.push(PathBuf::from(match g % 6 {
            0 => format!("src/mod{g}/deep/er/file{i}.rs"),
            1 => format!("crates/c{g}/src/lib.rs"),
            2 => format!("pkg/p{g}/main.rs"),
            3 => format!("docs/section{g}/index.md"),
            4 => format!("vendor/x/y/gen{g}_table.c"),
            _ => format!("tests/t{g}/check_{i}.py"),
        }));
        miss.push(PathBuf::from(match i % 5 {
            0 => format!("src/other{i}/file.rs"),
            1 => format!("crates/c{i}x/src/lib.rs"),
            2 => format!("pkg/p{g}/sub/main.rs"),
            3 => format!("README{i}.md"),
            _ => format!("tests/t{g}/zz_{i}.py"),
        }));
    }
    (hit, miss)
}

fn bench_policy(c: &mut Criterion) {
    let yaml = policy_yaml();
    let policy = Policy::parse(&yaml, Path::new("bench-1000.yaml")).expect("bench policy parses");
    let big = policy.intent("BIG").expect("BIG intent");
    assert_eq!(big.owned_scope.len(), N_GLOBS);
    let (hit, miss) = paths();
    // Sanity: the sets are what their names say.
    let n_hit = hit.iter().filter(|p| big.scope_match(p).is_some()).count();
    let n_miss = miss.iter().filter(|p| big.scope_match(p).is_some()).count();
    assert_eq!(
        (n_hit, n_miss),
        (hit.len(), 0),
        "bench path sets are miscalibrated"
    );
    let mixed: Vec<PathBuf> = hit
        .iter()
        .zip(&miss)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();

    let mut g = c.benchmark_group("policy_1000_globs");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));

    g.throughput(Throughput::Bytes(yaml.len() as u64));
    g.bench_function("parse_compile", |b| {
        b.iter(|| Policy::parse(black_box(&yaml), Path::new("bench-1000.yaml")).unwrap())
    });

    for (name, set) in [
        ("scope_match_hit", &hit),
        ("scope_match_miss", &miss),
        ("scope_match_mixed", &mixed),
    ] {
        g.throughput(Throughput::Elements(set.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut n = 0usize;
                for p in set.iter() {
                    n += big.scope_match(black_box(p)).is_some() as usize;
                }
                n
            })
        });
    }

    // The full write decision (protected paths, .intentignore, intent lookup, scope) as
    // the daemon makes it for every mutation.
    let guard = Guard::new(Rules {
        policy: Policy::parse(&yaml, Path::new("bench-1000.yaml")).unwrap(),
        ignore: IntentIgnore::parse(
            "target/\n*.log\nnode_modules/\n",
            Path::new(".intentignore"),
        )
        .unwrap(),
        protected: Protected::new(&[]),
    });
    g.throughput(Throughput::Elements(mixed.len() as u64));
    g.bench_function("guard_check_write_mixed", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for p in &mixed {
                n += guard
                    .check_write(
                        Some("BIG"),
                        intentfs::guard::Operation::Write,
                        black_box(p),
                        false,
                    )
                    .is_ok() as usize;
            }
            n
        })
    });
    // The benchmark's own mount policy: intent ALL with `**` (one glob).
    let all = Guard::new(Rules {
        policy: Policy::parse(
            "intents:\n  - id: ALL\n    name: all\n    status: IN_PROGRESS\n    owned_scope: [\"**\"]\n",
            Path::new("allow-all.yaml"),
        )
        .unwrap(),
        ignore: IntentIgnore::empty(),
        protected: Protected::new(&[]),
    });
    g.bench_function("guard_check_write_allow_all", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for p in &mixed {
                n += all
                    .check_write(
                        Some("ALL"),
                        intentfs::guard::Operation::Write,
                        black_box(p),
                        false,
                    )
                    .is_ok() as usize;
            }
            n
        })
    });
    g.finish();
}

fn bench_hash(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let mut data = vec![0u8; HASH_BYTES];
    // Not all zeros (some filesystems special-case them); content does not change SHA-256 speed.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();

    let mut g = c.benchmark_group("sha256_64MiB");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(10)
        .throughput(Throughput::Bytes(HASH_BYTES as u64));
    // What the daemon runs: 256 KiB preads from the page cache + SHA-256.
    g.bench_function("hash_stream_file", |b| {
        b.iter(|| {
            let (h, n) = intentfs::fs::hash::hash_stream(black_box(&file)).unwrap();
            assert_eq!(n, HASH_BYTES as u64);
            h
        })
    });
    // The hash alone, from memory (sha2 with the `asm` feature; SHA-NI when the CPU has it).
    g.bench_function("sha2_in_memory", |b| {
        b.iter(|| Sha256::digest(black_box(&data)))
    });
    g.finish();
}

fn draft(i: u64) -> Draft {
    Draft {
        intent_id: Some("ALL".into()),
        agent: Some(Agent {
            name: "bench".into(),
            identity: "default".into(),
            pid: 4242,
            uid: 0,
            process: "bench".into(),
        }),
        mutation_type: Some(MutationType::Write),
        path: Some(PathBuf::from(format!(
            "src/mod{}/file{}.rs",
            i % 97,
            i % 1009
        ))),
        content_hash: Some(format!("sha256:{:064x}", i)),
        size: Some(1000 + i % 4096),
        ranges: Some(vec![(1, 3), (10, 12)]),
        ..Draft::default()
    }
}

fn bench_ledger(c: &mut Criterion) {
    let mut g = c.benchmark_group("ledger_append");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));

    // `record`: one entry, waits until it is on stable storage (one fdatasync when alone).
    {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, _) =
            Ledger::open(&dir.path().join("trace.jsonl"), LedgerOptions::default()).unwrap();
        let mut i = 0u64;
        g.throughput(Throughput::Elements(1));
        g.bench_function("record_durable_1_thread", |b| {
            b.iter(|| {
                i += 1;
                ledger.record(draft(i)).unwrap()
            })
        });
        ledger.shutdown();
    }

    // `record` from 4 threads at once: group commit shares the fdatasync.
    {
        let threads = 4u64;
        let dir = tempfile::tempdir().unwrap();
        let (ledger, _) =
            Ledger::open(&dir.path().join("trace.jsonl"), LedgerOptions::default()).unwrap();
        const PER_THREAD: u64 = 50;
        g.throughput(Throughput::Elements(threads * PER_THREAD));
        g.bench_function(BenchmarkId::new("record_durable_threads", threads), |b| {
            b.iter_custom(|iters| {
                let t0 = Instant::now();
                for _ in 0..iters {
                    std::thread::scope(|s| {
                        for t in 0..threads {
                            let ledger = &ledger;
                            s.spawn(move || {
                                for k in 0..PER_THREAD {
                                    ledger.record(draft(t * 1_000_000 + k)).unwrap();
                                }
                            });
                        }
                    });
                }
                t0.elapsed()
            })
        });
        ledger.shutdown();
    }

    // `record_nowait`: 1,000 entries queued, then one `record` so the batch is on disk:
    // the sustained rate of the writer thread (serialise, chain-hash, write, fdatasync).
    {
        let dir = tempfile::tempdir().unwrap();
        let (ledger, _) =
            Ledger::open(&dir.path().join("trace.jsonl"), LedgerOptions::default()).unwrap();
        const BATCH: u64 = 1000;
        let mut i = 0u64;
        g.throughput(Throughput::Elements(BATCH + 1));
        g.bench_function("record_nowait_1000_then_flush", |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    i += 1;
                    ledger.record_nowait(draft(i)).unwrap();
                }
                i += 1;
                ledger.record(draft(i)).unwrap();
            })
        });
        ledger.shutdown();
    }
    g.finish();
}

/// Which identity a request belongs to, once `intentfs run` identities exist:
/// - `proc_stat_per_request`: what every request paid before issue 16 (one read of
///   `/proc/<pid>/stat` for the caller's session);
/// - `uncached_lookup`: the lookup itself (`/proc/<pid>/cgroup`, then the ancestry walk of
///   `/proc/<pid>/stat` up to init), paid once per thread;
/// - `cached`: what a request pays once its thread is known (a map lookup under a read lock).
fn bench_identity(c: &mut Criterion) {
    use intentfs::guard::tracking::{Grant, Identities};
    use intentfs::guard::Intents;
    let mut g = c.benchmark_group("identity");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let mut child = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let pid = child.id();
    g.bench_function("proc_stat_per_request", |b| {
        b.iter(|| {
            let mut buf = [0u8; 1024];
            let mut f = std::fs::File::open(format!("/proc/{pid}/stat")).unwrap();
            let n = std::io::Read::read(&mut f, &mut buf).unwrap();
            let stat = std::str::from_utf8(&buf[..n]).unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            black_box(
                rest.split_whitespace()
                    .nth(3)
                    .unwrap()
                    .parse::<i32>()
                    .unwrap(),
            )
        })
    });
    let ids = Identities::new("human".into(), Intents::All, false, None);
    ids.grant(
        std::process::id(),
        Grant {
            name: "agent".into(),
            intents: Intents::All,
            require_read: false,
            uid: None,
        },
    )
    .unwrap();
    assert_ne!(ids.resolve(pid).key, "default");
    g.bench_function("uncached_lookup", |b| b.iter(|| black_box(ids.lookup(pid))));
    g.bench_function("cached", |b| b.iter(|| black_box(ids.resolve(pid))));
    g.finish();
    let _ = child.kill();
    let _ = child.wait();
}

criterion_group!(
    benches,
    bench_policy,
    bench_hash,
    bench_ledger,
    bench_identity
);
criterion_main!(benches);
