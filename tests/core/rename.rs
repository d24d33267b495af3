//! Renaming a directory moves everything in it: every entry below is authorized under its
//! old and its new path.

use intentfs::guard::Code;
use intentfs::ledger::MutationType;

use super::*;

/// Directories directly under `src/` and `.rs` files at any depth below it.
const RS_ONLY: &str = r#"
intents:
  - id: RS
    name: Rust sources
    status: IN_PROGRESS
    owned_scope: ["src/*", "src/**/*.rs"]
"#;

#[test]
fn renaming_a_directory_holding_an_out_of_scope_file_is_refused() {
    let c = core(
        RS_ONLY,
        &[
            ("src/m/a.rs", "fn a() {}\n"),
            ("src/m/notes.txt", "notes\n"),
        ],
    );
    c.select("RS");
    let before = tree(&c.ws);
    // `src/m` and `src/n` are in scope themselves; `notes.txt` below is not.
    assert_eq!(code(c.rename("src/m", "src/n")), Code::ScopeViolation);
    c.assert_denial("src/m/notes.txt", Code::ScopeViolation, "rename");
    assert_eq!(tree(&c.ws), before);
    assert!(c.of(MutationType::Rename).is_empty());
}

#[test]
fn the_walk_reaches_deep_entries_and_protected_ones() {
    let c = Core::build(
        "intents:\n  - id: SRC\n    name: src\n    status: IN_PROGRESS\n    owned_scope: [\"src/**\"]\n",
        Opts {
            files: &[
                ("src/m/a.rs", "fn a() {}\n"),
                ("src/m/deep/er/still/key.secret", "k\n"),
            ],
            ignore: Some("*.secret\n"),
            ..Default::default()
        },
    );
    c.select("SRC");
    let before = tree(&c.ws);
    // Everything is in `src/**`, but `.intentignore` excludes the key four levels down.
    assert_eq!(code(c.rename("src/m", "src/n")), Code::ProtectedPath);
    c.assert_denial(
        "src/m/deep/er/still/key.secret",
        Code::ProtectedPath,
        "rename",
    );
    assert_eq!(tree(&c.ws), before);
}

#[test]
fn renaming_a_directory_above_a_protected_path_is_refused() {
    let c = core(
        "intents:\n  - id: ALL\n    name: all\n    status: IN_PROGRESS\n    owned_scope: [\"**\"]\n",
        &[(".git/HEAD", "ref: refs/heads/main\n"), (".git/hooks/pre-commit", "#!/bin/sh\n")],
    );
    c.select("ALL");
    // `.git/hooks` lies below: moving `.git` would move it out of its protection.
    assert_eq!(code(c.rename(".git", "old-git")), Code::ProtectedPath);
    c.assert_denial(".git", Code::ProtectedPath, "rename");
    assert!(c.exists(".git/hooks/pre-commit") && !c.exists("old-git"));
    // Removing it is refused the same way.
    let (p, n) = c.parent(".git");
    let r = c.fs.unlink(&c.me, p, n, true);
    assert_eq!(code(r), Code::ProtectedPath);
    assert!(c.exists(".git/hooks/pre-commit"));
}

#[test]
fn renaming_a_directory_all_in_scope_moves_it_and_ledgers_one_entry() {
    let c = core(
        RS_ONLY,
        &[("src/k/x.rs", "fn x() {}\n"), ("src/k/y.rs", "fn y() {}\n")],
    );
    c.select("RS");
    // Looked up before the move, as a kernel that has the directory cached would.
    let k = c.node("src/k").unwrap();
    c.rename("src/k", "src/l").unwrap();
    assert!(!c.exists("src/k"));
    assert_eq!(c.backing("src/l/x.rs"), "fn x() {}\n");
    let r = c.of(MutationType::Rename);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].from.as_deref(), Some("src/k"));
    assert_eq!(r[0].path.as_deref(), Some("src/l"));
    assert_eq!(r[0].size, None);
    assert_eq!(r[0].intent_id.as_deref(), Some("RS"));
    // The node keeps working under its new name: a file made through it is recorded
    // under `src/l`, and checked there.
    let (_, fh, _) =
        c.fs.create(&c.me, k, OsStr::new("z.rs"), 0o644, 0o022, libc::O_WRONLY)
            .unwrap();
    c.fs.release(fh).unwrap();
    assert!(c.exists("src/l/z.rs"));
    assert_eq!(c.at(MutationType::Create, "src/l/z.rs").len(), 1);
    let r =
        c.fs.create(&c.me, k, OsStr::new("z.txt"), 0o644, 0o022, libc::O_WRONLY)
            .map(drop);
    assert_eq!(code(r), Code::ScopeViolation);
    c.assert_denial("src/l/z.txt", Code::ScopeViolation, "create");
    c.assert_ledger_clean();
}

#[test]
fn a_directory_renamed_outside_the_mount_is_judged_where_it_is_now() {
    let c = core(POLICY, &[("src/d/a.rs", "fn a() {}\n")]);
    c.select("INT-001");
    let d = c.node("src/d").unwrap();
    // Someone moves the directory out of the scope directly in the workspace: the node's
    // handle follows it, and so does the check.
    std::fs::create_dir(c.w("lib")).unwrap();
    std::fs::rename(c.w("src/d"), c.w("lib/d")).unwrap();
    let r =
        c.fs.create(&c.me, d, OsStr::new("b.rs"), 0o644, 0o022, libc::O_WRONLY)
            .map(drop);
    assert_eq!(code(r), Code::ScopeViolation);
    c.assert_denial("lib/d/b.rs", Code::ScopeViolation, "create");
    assert!(!c.exists("lib/d/b.rs"));
}
