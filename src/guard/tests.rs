//! Table-driven tests of the guard's decisions (no FUSE).

use crate::guard::Operation;
use std::path::{Path, PathBuf};

use super::*;
use crate::policy::{IntentIgnore, Policy};

const POLICY: &str = r#"
intents:
  - id: INT-001
    name: Auth
    status: IN_PROGRESS
    owned_scope: ["src/auth/**", "src/middleware/jwt.ts", "docs/"]
  - id: INT-002
    name: Paused work
    status: PAUSED
    owned_scope: ["**"]
  - id: ALL
    name: Everything
    status: IN_PROGRESS
    owned_scope: ["**"]
"#;

fn guard(ignore: &str) -> Guard {
    let policy = Policy::parse(POLICY, Path::new("policy.yaml")).expect("policy parses");
    let ignore = IntentIgnore::parse(ignore, Path::new(".intentignore")).expect("ignore parses");
    Guard::new(Rules {
        policy,
        ignore,
        protected: Protected::new(&[PathBuf::from("custom/ledger.jsonl")]),
    })
}

#[test]
fn write_decisions() {
    let g = guard("secrets/\n*.lock\n");
    // (intent, path, is_dir, expected code or None for allowed)
    let cases: &[(Option<&str>, &str, bool, Option<Code>)] = &[
        (Some("INT-001"), "src/auth/login.ts", false, None),
        (Some("INT-001"), "src/auth/deep/er/x.ts", false, None),
        (Some("INT-001"), "src/middleware/jwt.ts", false, None),
        (
            Some("INT-001"),
            "src/middleware/other.ts",
            false,
            Some(Code::ScopeViolation),
        ),
        (
            Some("INT-001"),
            "src/auth",
            true,
            Some(Code::ScopeViolation),
        ),
        (Some("INT-001"), "docs", true, None),
        (Some("INT-001"), "docs/a/b.md", false, None),
        (
            Some("INT-001"),
            "README.md",
            false,
            Some(Code::ScopeViolation),
        ),
        (None, "src/auth/login.ts", false, Some(Code::NoIntent)),
        (Some("INT-002"), "src/x.ts", false, Some(Code::NoIntent)),
        (Some("NOPE"), "src/x.ts", false, Some(Code::NoIntent)),
        (
            Some("ALL"),
            ".orchestration/active_intents.yaml",
            false,
            Some(Code::ProtectedPath),
        ),
        (
            Some("ALL"),
            ".orchestration",
            true,
            Some(Code::ProtectedPath),
        ),
        (
            Some("ALL"),
            ".intentignore",
            false,
            Some(Code::ProtectedPath),
        ),
        (
            Some("ALL"),
            ".git/hooks/pre-commit",
            false,
            Some(Code::ProtectedPath),
        ),
        (Some("ALL"), ".git/config", false, Some(Code::ProtectedPath)),
        (Some("ALL"), ".git/objects/ab/cdef", false, None),
        (Some("ALL"), ".git/index", false, None),
        (Some("INT-001"), ".git/index.lock", false, None),
        (Some("INT-001"), ".git/objects/ab/cdef", false, None),
        (
            Some("INT-001"),
            ".git/hooks/post-commit",
            false,
            Some(Code::ProtectedPath),
        ),
        (None, ".git/index", false, Some(Code::NoIntent)),
        (
            Some("ALL"),
            "custom/ledger.jsonl",
            false,
            Some(Code::ProtectedPath),
        ),
        (
            Some("ALL"),
            "secrets/key.txt",
            false,
            Some(Code::ProtectedPath),
        ),
        (Some("ALL"), "secrets", true, Some(Code::ProtectedPath)),
        (Some("ALL"), "Cargo.lock", false, Some(Code::ProtectedPath)),
        (Some("ALL"), "src/main.rs", false, None),
        (Some("ALL"), "", true, Some(Code::ProtectedPath)),
    ];
    for (intent, path, is_dir, want) in cases {
        let got = g.check_write(*intent, Operation::Write, Path::new(path), *is_dir);
        match (want, &got) {
            (None, Ok(_)) => {}
            (Some(code), Err(d)) => assert_eq!(d.code, *code, "{intent:?} {path}: {}", d.message),
            _ => panic!(
                "{intent:?} {path}: expected {want:?}, got {:?}",
                got.map_err(|d| d.code)
            ),
        }
    }
}

#[test]
fn denial_carries_rule_and_remedy() {
    let g = guard("secrets/\n");
    let d = g
        .check_write(
            Some("ALL"),
            Operation::Create,
            Path::new("secrets/x"),
            false,
        )
        .unwrap_err();
    assert!(
        d.rule.as_deref().unwrap_or("").contains("secrets/"),
        "rule quotes .intentignore: {:?}",
        d.rule
    );
    let d = g
        .check_write(
            Some("INT-001"),
            Operation::Create,
            Path::new("README.md"),
            false,
        )
        .unwrap_err();
    assert!(
        d.remedy.contains("src/auth/**"),
        "remedy names the scope: {}",
        d.remedy
    );
    let v: serde_json::Value = serde_json::from_str(&d.to_json()).unwrap();
    assert_eq!(v["code"], "SCOPE_VIOLATION");
    assert_eq!(v["path"], "README.md");
    assert_eq!(v["intent"], "INT-001");
    let ok = g
        .check_write(
            Some("INT-001"),
            Operation::Create,
            Path::new("src/auth/a.ts"),
            false,
        )
        .unwrap();
    assert!(
        ok.contains("src/auth/**"),
        "allow quotes the scope rule: {ok}"
    );
}

#[test]
fn sensitive_reads() {
    let deny = guard("");
    for p in [
        ".env",
        "config/.env.local",
        "deploy/server.pem",
        "home/id_rsa",
        "CREDENTIALS.json",
        ".netrc",
        "keys/id_ed25519",
    ] {
        let d = deny.check_read(Some("ALL"), Path::new(p)).expect_err(p);
        assert_eq!(d.code, Code::SensitiveRead, "{p}");
        assert!(d.rule.is_some(), "{p}: the rule that decided is quoted");
    }
    for p in [
        "src/main.rs",
        "README.md",
        "environment.txt",
        "a/my_secret.txt",
        ".env.example",
    ] {
        assert!(
            deny.check_read(None, Path::new(p)).is_ok(),
            "{p} is not sensitive"
        );
    }
}

#[test]
fn protected_below() {
    let p = Protected::new(&[]);
    assert!(p.below(Path::new(".git")).is_some());
    assert!(p.below(Path::new("")).is_some());
    assert!(p.below(Path::new("src")).is_none());
    assert!(
        p.below(Path::new(".orchestration")).is_none(),
        "the entry itself is `matched`, not below"
    );
}

#[test]
fn scope_message_lists_a_few_globs_and_counts_the_rest() {
    let globs: Vec<String> = (0..1000).map(|i| format!("src/m{i}/**")).collect();
    let s = super::scope_list(&globs);
    assert!(s.starts_with("src/m0/**, src/m1/**"), "{s}");
    assert!(s.contains("(988 more in .intentfs/context)"), "{s}");
    assert!(s.len() < 300, "{}", s.len());
    assert_eq!(super::scope_list(&globs[..2]), "src/m0/**, src/m1/**");
}

#[test]
fn proc_readers_read_parent_start_time_cgroup_and_name() {
    let pid = std::process::id();
    let (ppid, start) = crate::guard::tracking::proc_parent(pid).expect("own process");
    // SAFETY: getppid has no preconditions.
    assert_eq!(ppid as i32, unsafe { libc::getppid() });
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let field22 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert_eq!(start, field22);
    let want = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(
        crate::guard::identity::proc_name(pid),
        want.trim_end_matches('\n')
    );
    assert_eq!(crate::guard::identity::proc_name(0), "");
    assert_eq!(crate::guard::identity::proc_name(u32::MAX), "");
    assert!(crate::guard::tracking::proc_parent(u32::MAX).is_none());
    let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    if let Some(line) = cg.lines().find_map(|l| l.strip_prefix("0::")) {
        assert_eq!(
            crate::guard::tracking::proc_cgroup(pid).as_deref(),
            Some(line)
        );
    }
    assert_eq!(
        crate::guard::tracking::unescape_mountinfo("/mnt/a\\040b\\134c"),
        "/mnt/a b\\c"
    );
}

/// An identity tracked by ancestry: the anchor's descendants belong to it, whatever they
/// do to their session; other processes do not; the pid cache answers the same and lets go
/// of a process that exited.
#[test]
fn ancestry_identities_follow_the_process_tree_and_the_cache_forgets_exited_pids() {
    use crate::guard::tracking::{Grant, Identities};
    use crate::guard::Intents;
    let ids = Identities::new("human".into(), Intents::All, false, None);
    assert_eq!(ids.tracking(), "ancestry");
    let me = std::process::id();
    // A grandchild in a session of its own (setsid), as an agent's daemon would be.
    let mut child = std::process::Command::new("setsid")
        .args(["sh", "-c", "sleep 30 & echo $!; wait"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let grandchild: u32 = line.trim().parse().unwrap();
    assert_eq!(
        ids.resolve(grandchild).key,
        "default",
        "nothing granted yet"
    );
    let (ident, anchor) = ids
        .grant(
            me,
            Grant {
                name: "agent".into(),
                intents: Intents::Locked("INT-1".into()),
                require_read: false,
                uid: None,
            },
        )
        .unwrap();
    assert_eq!(anchor.kind(), "ancestry");
    assert_eq!(ident.key, format!("run:{me}"));
    assert_eq!(ident.intent().as_deref(), Some("INT-1"));
    for _ in 0..2 {
        // The second round is answered from the cache.
        assert_eq!(ids.resolve(grandchild).key, ident.key);
        assert_eq!(ids.resolve(child.id()).key, ident.key);
    }
    // Our parent is not in the identity.
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() } as u32;
    assert_eq!(ids.resolve(parent).key, "default");
    // A process cannot be granted twice, nor grant from inside an identity.
    let again = ids.grant(
        child.id(),
        Grant {
            name: "x".into(),
            intents: Intents::All,
            require_read: false,
            uid: None,
        },
    );
    assert!(matches!(again, Err(e) if e.contains("already belongs")));
    // Once the grandchild is gone, a cached answer for its pid must not outlive it.
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(grandchild as i32, libc::SIGKILL) };
    let _ = child.wait();
    let gone = (0..200).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        ids.resolve(grandchild).key == "default"
    });
    assert!(gone, "the exited pid is still answered as the identity");
    assert_eq!(
        ids.by_key(&ident.key).map(|i| i.name.clone()).as_deref(),
        Some("agent")
    );
}

#[test]
fn intents_bound_what_an_identity_may_select() {
    use crate::guard::Intents;
    let l = Intents::Locked("A".into());
    assert!(l.allows("A") && !l.allows("B"));
    assert_eq!(l.initial().as_deref(), Some("A"));
    let m = Intents::Among(vec!["A".into(), "B".into()]);
    assert!(m.allows("B") && !m.allows("C"));
    assert_eq!(m.initial(), None);
    assert!(Intents::All.allows("anything"));
    assert_eq!(Intents::Among(vec![]).describe(), "");
}

#[test]
fn protected_paths_compare_by_bytes_as_by_components() {
    // The byte comparisons of plain paths answer what the component comparisons answer,
    // for plain and unplain spellings alike (the latter take the component path).
    let reference = |entries: &[(PathBuf, bool)], rel: &Path| {
        let matched = entries
            .iter()
            .find(|(p, sub)| rel == p || (*sub && rel.starts_with(p)))
            .map(|(p, _)| p.clone());
        let below = entries
            .iter()
            .find(|(p, _)| p != rel && p.starts_with(rel))
            .map(|(p, _)| p.clone());
        (matched, below)
    };
    for extra in [
        PathBuf::from("custom/ledger.jsonl"),
        PathBuf::from("./odd//name"),
    ] {
        let prot = Protected::new(std::slice::from_ref(&extra));
        for rel in [
            "",
            ".git",
            ".git/hooks",
            ".git/hooks/pre-commit",
            ".git/hooksx",
            ".git/hooks/",
            ".git//hooks/x",
            "./.git/hooks/x",
            ".git/./hooks",
            ".git/../.git/hooks/x",
            ".orchestration",
            ".orchestration/active_intents.yaml",
            ".orchestrationx/a",
            "a/.orchestration",
            ".intentignore",
            ".intentignore/x",
            ".claude",
            ".claude/settings.json",
            ".claude/settings.local.json",
            ".claude/hooks/x.sh",
            ".claude/hooksy",
            "custom",
            "custom/ledger.jsonl",
            "custom/ledger.jsonl2",
            "odd",
            "odd/name",
            "src/lib.rs",
        ] {
            let rel = Path::new(rel);
            let (m, b) = reference(&prot.entries, rel);
            assert_eq!(
                prot.matched(rel).is_some(),
                m.is_some(),
                "matched {rel:?} with {extra:?}"
            );
            assert_eq!(
                prot.below(rel).is_some(),
                b.is_some(),
                "below {rel:?} with {extra:?}"
            );
            if let (Some(got), Some(p)) = (prot.matched(rel), m) {
                assert!(got.contains(&*p.to_string_lossy()), "{got} for {rel:?}");
            }
        }
    }
}
