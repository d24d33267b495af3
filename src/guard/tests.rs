//! Table-driven tests of the guard's decisions (no FUSE).

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
        let got = g.check_write(*intent, "write", Path::new(path), *is_dir);
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
        .check_write(Some("ALL"), "create", Path::new("secrets/x"), false)
        .unwrap_err();
    assert!(
        d.rule.as_deref().unwrap_or("").contains("secrets/"),
        "rule quotes .intentignore: {:?}",
        d.rule
    );
    let d = g
        .check_write(Some("INT-001"), "create", Path::new("README.md"), false)
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
        .check_write(Some("INT-001"), "create", Path::new("src/auth/a.ts"), false)
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
        "a/my_secret.txt",
        "CREDENTIALS.json",
    ] {
        let d = deny.check_read(Some("ALL"), Path::new(p)).expect_err(p);
        assert_eq!(d.code, Code::SensitiveRead, "{p}");
        assert!(d.rule.is_some(), "{p}: the rule that decided is quoted");
    }
    for p in ["src/main.rs", "README.md", "environment.txt"] {
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
fn proc_session_reads_the_session_and_name_of_a_process() {
    let pid = std::process::id();
    let (sid, comm) = crate::guard::identity::proc_session(pid).expect("own process");
    // SAFETY: getsid(0) has no preconditions.
    assert_eq!(sid, unsafe { libc::getsid(0) });
    let want = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(comm, want.trim_end_matches('\n'));
    assert_eq!(crate::guard::identity::proc_name(pid), comm);
    assert_eq!(crate::guard::identity::proc_name(0), "");
    assert_eq!(crate::guard::identity::proc_name(u32::MAX), "");
    assert!(crate::guard::identity::proc_session(u32::MAX).is_none());
}
