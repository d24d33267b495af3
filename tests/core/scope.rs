//! Scope checks on every name an operation touches.

use intentfs::guard::Code;
use intentfs::ledger::MutationType;

use super::*;

const FILES: &[(&str, &str)] = &[
    ("src/a.rs", "fn a() {}\n"),
    ("docs/guide.md", "# guide\n"),
    ("lib/util.rs", "fn util() {}\n"),
];

#[test]
fn every_mutation_outside_the_scope_is_refused_and_recorded() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    let before = tree(&c.ws);
    let checks: Vec<(&str, &str, Result<(), FsError>)> = vec![
        ("lib/new.rs", "create", c.create("lib/new.rs", "x")),
        ("lib/sub", "mkdir", c.mkdir("lib/sub")),
        ("lib/util.rs", "open-write", c.overwrite("lib/util.rs", "y")),
        ("lib/util.rs", "unlink", c.unlink("lib/util.rs")),
        // A rename counts both names: out of the scope, and into it.
        ("lib/a.rs", "rename", c.rename("src/a.rs", "lib/a.rs")),
        (
            "lib/util.rs",
            "rename",
            c.rename("lib/util.rs", "src/util.rs"),
        ),
        // A link: a new name outside for an in-scope file.
        ("lib/a-link.rs", "link", c.link("src/a.rs", "lib/a-link.rs")),
        // ... and a new in-scope name for an outside file (writes through it would land
        // outside).
        (
            "docs/guide.md",
            "link",
            c.link("docs/guide.md", "src/guide.md"),
        ),
        (
            "lib/util.rs",
            "chmod",
            c.setattr("lib/util.rs", chmod(0o600)),
        ),
        (
            "lib/util.rs",
            "truncate",
            c.setattr("lib/util.rs", truncate(0)),
        ),
        ("docs", "rename", c.rename("docs", "src/docs")),
    ];
    let denials = c.of(MutationType::Denial);
    assert_eq!(denials.len(), checks.len(), "{denials:#?}");
    for ((path, op, r), entry) in checks.into_iter().zip(&denials) {
        assert_eq!(code(r), Code::ScopeViolation, "{op} {path}");
        assert_eq!(entry.path.as_deref(), Some(path), "{op}: {entry:?}");
        assert_eq!(entry.code.as_deref(), Some("SCOPE_VIOLATION"));
        assert_eq!(entry.intent_id.as_deref(), Some("INT-001"));
        assert_eq!(entry.detail.as_ref().unwrap()["op"], op, "{entry:?}");
    }
    assert_eq!(tree(&c.ws), before);
    // Nothing but the handshake and the refusals is on record.
    assert!(c
        .entries()
        .iter()
        .all(|e| matches!(e.mutation_type, MutationType::Intent | MutationType::Denial)));
    c.assert_ledger_clean();
}

#[test]
fn the_same_operations_inside_the_scope_succeed_and_each_is_ledgered() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.mkdir("src/m").unwrap();
    c.create("src/m/b.rs", "fn b() {}\n").unwrap();
    c.link("src/m/b.rs", "src/m/b2.rs").unwrap();
    c.rename("src/m/b2.rs", "src/m/c.rs").unwrap();
    c.setattr("src/m/b.rs", chmod(0o600)).unwrap();
    c.unlink("src/m/c.rs").unwrap();
    assert_eq!(c.backing("src/m/b.rs"), "fn b() {}\n");
    assert!(!c.exists("src/m/c.rs") && !c.exists("src/m/b2.rs"));
    let kinds: Vec<(MutationType, String)> = c
        .entries()
        .into_iter()
        .filter(|e| e.mutation_type != MutationType::Intent)
        .map(|e| (e.mutation_type, e.path.unwrap_or_default()))
        .collect();
    use MutationType::*;
    assert_eq!(
        kinds,
        vec![
            (Mkdir, "src/m".into()),
            (Create, "src/m/b.rs".into()),
            (Write, "src/m/b.rs".into()),
            (Link, "src/m/b2.rs".into()),
            (Rename, "src/m/c.rs".into()),
            (Chmod, "src/m/b.rs".into()),
            (Delete, "src/m/c.rs".into()),
        ]
    );
    let chmod = &c.at(Chmod, "src/m/b.rs")[0];
    assert_eq!(chmod.detail.as_ref().unwrap()["mode_before"], "644");
    assert_eq!(chmod.detail.as_ref().unwrap()["mode_after"], "600");
    assert_eq!(
        c.at(Link, "src/m/b2.rs")[0].from.as_deref(),
        Some("src/m/b.rs")
    );
    c.assert_ledger_clean();
}

#[test]
fn protected_paths_are_refused_whatever_the_scope() {
    let c = core(
        "intents:\n  - id: ALL\n    name: all\n    status: IN_PROGRESS\n    owned_scope: [\"**\"]\n",
        &[(".git/HEAD", "ref: refs/heads/main\n"), (".git/hooks/pre-commit", "#!/bin/sh\n")],
    );
    c.select("ALL");
    let before = std::fs::read(c.w(".orchestration/active_intents.yaml")).unwrap();
    // The policy itself, the ledger's directory, git's hooks.
    assert_eq!(
        code(c.overwrite(".orchestration/active_intents.yaml", "intents: []\n")),
        Code::ProtectedPath
    );
    assert_eq!(code(c.create(".orchestration/x", "")), Code::ProtectedPath);
    assert_eq!(
        code(c.create(".git/hooks/post-checkout", "")),
        Code::ProtectedPath
    );
    c.assert_denial(".git/hooks/post-checkout", Code::ProtectedPath, "create");
    assert_eq!(code(c.create(".intentignore", "")), Code::ProtectedPath);
    assert_eq!(
        std::fs::read(c.w(".orchestration/active_intents.yaml")).unwrap(),
        before
    );
    assert!(!c.exists(".git/hooks/post-checkout") && !c.exists(".intentignore"));
}

#[test]
fn a_hard_link_made_outside_keeps_an_in_scope_name_from_writing_an_outside_file() {
    let c = core(POLICY, FILES);
    c.select("INT-001");
    // Someone links an outside file into the scope directly in the workspace: the mount
    // knows one name of two, so a write through it could change `lib/util.rs`.
    std::fs::hard_link(c.w("lib/util.rs"), c.w("src/util.rs")).unwrap();
    c.read("src/util.rs").unwrap();
    assert_eq!(code(c.overwrite("src/util.rs", "x")), Code::ScopeViolation);
    c.assert_denial("src/util.rs", Code::ScopeViolation, "open-write");
    assert_eq!(c.backing("lib/util.rs"), "fn util() {}\n");
    // Once the mount has seen the other name, the refusal names it.
    c.node("lib/util.rs").unwrap();
    assert_eq!(code(c.overwrite("src/util.rs", "x")), Code::ScopeViolation);
    c.assert_denial("lib/util.rs", Code::ScopeViolation, "open-write");
}

#[test]
fn the_circuit_breaker_stops_an_identity_that_loops_on_refusals() {
    let c = Core::build(
        POLICY,
        Opts {
            files: FILES,
            breaker: Some((3, Duration::from_secs(60))),
            ..Default::default()
        },
    );
    c.select("INT-001");
    for i in 0..3 {
        let r = c.create(&format!("lib/x{i}.rs"), "");
        assert_eq!(code(r), Code::ScopeViolation);
    }
    // Tripped: even an in-scope change is refused now, until a human resets it.
    assert_eq!(code(c.create("src/ok.rs", "")), Code::CircuitOpen);
    assert!(!c.exists("src/ok.rs"));
    let tripped: Vec<_> = c
        .of(MutationType::Denial)
        .into_iter()
        .filter(|e| e.outcome == "tripped")
        .collect();
    assert_eq!(tripped.len(), 1);
    assert_eq!(tripped[0].code.as_deref(), Some("CIRCUIT_OPEN"));
    c.fs.gate.ids.default_identity().reset_breaker();
    c.create("src/ok.rs", "ok").unwrap();
    assert_eq!(c.backing("src/ok.rs"), "ok");
}

/// A request that sets a mode and a size on a directory (one SETATTR may carry both) is
/// refused as a whole: the size is impossible, so the mode does not change either.
#[test]
fn a_size_change_on_a_directory_changes_nothing_else() {
    use std::os::unix::fs::PermissionsExt;
    let c = core(POLICY, FILES);
    c.select("INT-001");
    c.mkdir("src/sub").unwrap();
    let mode = |c: &Core| {
        std::fs::metadata(c.w("src/sub"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    let before = mode(&c);
    let both = intentfs::fs::ops::SetAttr {
        mode: Some(0o700),
        size: Some(0),
        ..Default::default()
    };
    match c.setattr("src/sub", both) {
        Err(FsError::Os(e)) => assert_eq!(e, libc::EISDIR),
        other => panic!("expected EISDIR, got {other:?}"),
    }
    assert_eq!(
        mode(&c),
        before,
        "the mode changed although the request was refused"
    );
    assert!(c.of(MutationType::Chmod).is_empty());
}
