//! Every route an agent may try to change a file outside its intent's scope (or a protected
//! file) through the mount. After each refusal the target's bytes in the workspace are
//! checked unchanged.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::*;

const FILES: &[(&str, &str)] = &[
    ("src/auth/a.ts", "auth\n"),
    ("src/auth/sub/b.ts", "sub\n"),
    ("src/middleware/jwt.ts", "jwt\n"),
    ("src/middleware/other.ts", "other\n"),
    ("tests/auth/t.ts", "test\n"),
    ("README.md", "readme\n"),
    ("docs/guide.md", "guide\n"),
    (".env", "SECRET=hunter2\n"),
    ("config/prod/db.yaml", "password: x\n"),
];

/// The example policy (out-of-scope writes refused outright), intent INT-001, the files
/// above.
fn int001() -> TestMount {
    TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(FILES)
        .mount()
}

fn allow_all() -> TestMount {
    TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(FILES)
        .mount()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn res(ret: libc::c_int) -> std::io::Result<()> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Assert `rel` in the workspace still has its original bytes (from FILES).
fn unchanged(tm: &TestMount, rel: &str) {
    let want = FILES.iter().find(|(p, _)| *p == rel).unwrap().1;
    assert_eq!(
        String::from_utf8_lossy(&tm.ws_bytes(rel)),
        want,
        "{rel} changed in the workspace"
    );
}

// ----- denial codes ---------------------------------------------------------------------

#[test]
fn no_intent() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .files(FILES)
        .mount();
    let le = tm.assert_denied(std::fs::write(tm.m("src/auth/a.ts"), "x"), "NO_INTENT");
    assert_eq!(le["path"], "src/auth/a.ts");
    assert_eq!(le["op"], "open-write");
    unchanged(&tm, "src/auth/a.ts");
    let e = tm.wait_ledger("NO_INTENT denial", |e| e["code"] == "NO_INTENT");
    assert_eq!(e["mutation_type"], "DENIAL");
    assert_eq!(e["outcome"], "denied");
    assert_eq!(e["agent"]["name"], "tester");
}

#[test]
fn scope_violation_fields() {
    let tm = int001();
    let le = tm.assert_denied(std::fs::write(tm.m("README.md"), "x"), "SCOPE_VIOLATION");
    assert_eq!(le["path"], "README.md");
    assert_eq!(le["intent"], "INT-001");
    let remedy = le["remedy"].as_str().unwrap();
    assert!(remedy.contains("src/auth/**"), "{remedy}");
    unchanged(&tm, "README.md");
    let e = tm.wait_ledger("SCOPE_VIOLATION denial", |e| {
        e["code"] == "SCOPE_VIOLATION" && e["path"] == "README.md"
    });
    assert_eq!(e["intent_id"], "INT-001");
    // In scope works, and is ledgered with a content hash of the bytes on disk.
    std::fs::write(tm.m("src/middleware/jwt.ts"), "new jwt").unwrap();
    let w = tm
        .mutations()
        .into_iter()
        .find(|e| e["path"] == "src/middleware/jwt.ts")
        .expect("WRITE entry");
    assert_eq!(w["mutation_type"], "WRITE");
    assert_eq!(w["intent_id"], "INT-001");
    use sha2::Digest;
    let h = format!("sha256:{}", hex::encode(sha2::Sha256::digest(b"new jwt")));
    assert_eq!(w["content_hash"], h.as_str());
    assert_eq!(w["size"], 7);
    // Sibling outside the owned file: refused.
    tm.assert_denied(
        std::fs::write(tm.m("src/middleware/other.ts"), "x"),
        "SCOPE_VIOLATION",
    );
    unchanged(&tm, "src/middleware/other.ts");
}

#[test]
fn protected_path() {
    let tm = int001();
    let le = tm.assert_denied(
        std::fs::write(tm.m(".orchestration/notes.md"), "x"),
        "PROTECTED_PATH",
    );
    assert_eq!(le["path"], ".orchestration/notes.md");
    assert!(
        le["rule"].as_str().unwrap().contains(".orchestration"),
        "{le:#}"
    );
    assert!(!tm.w(".orchestration/notes.md").exists());
}

#[test]
fn sensitive_read_denied_by_default() {
    let tm = int001();
    let le = tm.assert_denied(std::fs::read(tm.m(".env")), "SENSITIVE_READ");
    assert_eq!(le["path"], ".env");
    // The policy's extra sensitive globs count too.
    let le = tm.assert_denied(std::fs::read(tm.m("config/prod/db.yaml")), "SENSITIVE_READ");
    assert_eq!(le["path"], "config/prod/db.yaml");
    // Through a symlink in scope.
    std::os::unix::fs::symlink("../../.env", tm.m("src/auth/e")).unwrap();
    tm.assert_denied(std::fs::read(tm.m("src/auth/e")), "SENSITIVE_READ");
    let out = tm.sh("cat .env");
    failed_eacces(&out, "cat .env");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hunter2"));
    // Its metadata stays visible.
    assert_eq!(std::fs::metadata(tm.m(".env")).unwrap().len(), 15);
    tm.wait_ledger("SENSITIVE_READ denial", |e| e["code"] == "SENSITIVE_READ");
}

#[test]
fn sensitive_read_allowed_with_approver_allow() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .arg("--approver")
        .arg("allow")
        .files(FILES)
        .mount();
    assert_eq!(std::fs::read(tm.m(".env")).unwrap(), b"SECRET=hunter2\n");
    assert_eq!(tm.sh_ok("cat config/prod/db.yaml"), "password: x\n");
    // Writing it is still a scope question.
    tm.assert_denied(std::fs::write(tm.m(".env"), "x"), "SCOPE_VIOLATION");
    unchanged(&tm, ".env");
}

#[test]
fn sensitive_read_by_own_name_after_hard_link_seen() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[(".env", "SECRET=hunter2\n")])
        .setup(|ws| std::fs::hard_link(ws.join(".env"), ws.join("notes.txt")).unwrap())
        .mount();
    // The kernel looks up .env, then the same inode under notes.txt (the daemon's "primary"
    // name becomes notes.txt) ...
    std::fs::metadata(tm.m(".env")).unwrap();
    std::fs::metadata(tm.m("notes.txt")).unwrap();
    // ... then opening .env by its own, sensitive, name (dentry cached: no new lookup) must
    // still be refused.
    let r = std::fs::read(tm.m(".env"));
    assert!(
        r.is_err(),
        "read .env without approval: {:?}",
        String::from_utf8_lossy(r.as_ref().unwrap())
    );
    tm.assert_new_denial("SENSITIVE_READ");
}

#[test]
fn sensitive_read_through_hard_link_made_in_mount() {
    let tm = allow_all();
    tm.assert_denied(std::fs::read(tm.m(".env")), "SENSITIVE_READ");
    // Making a harmless-looking name for a secret is itself refused as a sensitive read...
    tm.assert_denied(
        std::fs::hard_link(tm.m(".env"), tm.m("plain")),
        "SENSITIVE_READ",
    );
    assert!(!tm.ws.join("plain").exists(), "the link must not exist");
    // ...and so is renaming the secret to such a name.
    tm.assert_denied(
        std::fs::rename(tm.m(".env"), tm.m("plain")),
        "SENSITIVE_READ",
    );
    assert!(tm.ws.join(".env").exists() && !tm.ws.join("plain").exists());
    // A link made outside the mount: reading either name is refused once the mount knows both.
    std::fs::hard_link(tm.ws.join(".env"), tm.ws.join("plain")).unwrap();
    // The mount cached "plain" as missing (the refused link looked it up): it hears of the
    // outside link from its watcher, about a millisecond later.
    assert!(
        wait_until(Duration::from_secs(5), || tm.m("plain").exists()),
        "the link made outside never showed through the mount"
    );
    let _ = std::fs::metadata(tm.m(".env"));
    let r = std::fs::read(tm.m("plain"));
    assert!(
        r.is_err(),
        "read the secret through a hard link: {:?}",
        String::from_utf8_lossy(&r.unwrap())
    );
    tm.assert_new_denial("SENSITIVE_READ");
}

// ----- symlinks and hard links ----------------------------------------------------------

#[test]
fn symlink_in_scope_pointing_out() {
    let tm = int001();
    // Creating the link itself is a change in scope: allowed, and ledgered.
    tm.sh_ok("ln -s ../../README.md src/auth/l");
    assert_eq!(
        std::fs::read_link(tm.w("src/auth/l")).unwrap(),
        Path::new("../../README.md")
    );
    tm.wait_ledger("SYMLINK", |e| {
        e["mutation_type"] == "SYMLINK" && e["path"] == "src/auth/l"
    });
    // Reading through it is fine; writing through it is refused.
    assert_eq!(std::fs::read(tm.m("src/auth/l")).unwrap(), b"readme\n");
    let le = tm.assert_denied(
        std::fs::write(tm.m("src/auth/l"), "pwned"),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "README.md");
    tm.assert_sh_denied("echo pwned >> src/auth/l", "SCOPE_VIOLATION");
    tm.assert_sh_denied("truncate -s 0 src/auth/l", "SCOPE_VIOLATION");
    tm.assert_sh_denied("chmod 777 src/auth/l", "SCOPE_VIOLATION");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(tm.m("src/auth/l"));
    tm.assert_denied(r, "SCOPE_VIOLATION");
    unchanged(&tm, "README.md");
    assert_eq!(
        std::fs::metadata(tm.w("README.md")).unwrap().mode() & 0o777,
        0o644
    );
    // A symlink to a directory out of scope: creating files through it is refused.
    std::os::unix::fs::symlink("../../docs", tm.m("src/auth/d")).unwrap();
    tm.assert_denied(
        std::fs::write(tm.m("src/auth/d/new.md"), "x"),
        "SCOPE_VIOLATION",
    );
    tm.assert_denied(
        std::fs::create_dir(tm.m("src/auth/d/sub")),
        "SCOPE_VIOLATION",
    );
    assert!(!tm.w("docs/new.md").exists() && !tm.w("docs/sub").exists());
    // Replacing the link (in scope) does not touch its target.
    std::fs::remove_file(tm.m("src/auth/l")).unwrap();
    unchanged(&tm, "README.md");
}

#[test]
fn hard_link_from_out_of_scope_into_scope() {
    let tm = int001();
    let le = tm.assert_denied(
        std::fs::hard_link(tm.m("README.md"), tm.m("src/auth/h")),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "README.md");
    assert_eq!(le["op"], "link");
    assert!(!tm.w("src/auth/h").exists());
    tm.assert_sh_denied("ln src/middleware/other.ts src/auth/o", "SCOPE_VIOLATION");
    // In scope -> out of scope is refused as well (new name out of scope).
    let le = tm.assert_denied(
        std::fs::hard_link(tm.m("src/auth/a.ts"), tm.m("docs/a.ts")),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "docs/a.ts");
    assert!(!tm.w("docs/a.ts").exists());
    assert_eq!(std::fs::metadata(tm.w("README.md")).unwrap().nlink(), 1);
    unchanged(&tm, "README.md");
    // In scope -> in scope works.
    std::fs::hard_link(tm.m("src/auth/a.ts"), tm.m("src/auth/a2.ts")).unwrap();
    assert_eq!(std::fs::metadata(tm.w("src/auth/a.ts")).unwrap().nlink(), 2);
}

fn preexisting_link(look_up_readme_first: bool) {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(FILES)
        .setup(|ws| std::fs::hard_link(ws.join("README.md"), ws.join("src/auth/h")).unwrap())
        .mount();
    if look_up_readme_first {
        assert_eq!(std::fs::read(tm.m("README.md")).unwrap(), b"readme\n");
    }
    assert_eq!(std::fs::read(tm.m("src/auth/h")).unwrap(), b"readme\n");
    tm.assert_denied(
        std::fs::write(tm.m("src/auth/h"), "pwned"),
        "SCOPE_VIOLATION",
    );
    tm.assert_sh_denied("echo pwned >> src/auth/h", "SCOPE_VIOLATION");
    tm.assert_sh_denied("truncate -s 1 src/auth/h", "SCOPE_VIOLATION");
    tm.assert_sh_denied("chmod 600 src/auth/h", "SCOPE_VIOLATION");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .open(tm.m("src/auth/h"))
        .and_then(|f| f.set_len(0));
    tm.assert_denied(r, "SCOPE_VIOLATION");
    let r = xattr_set(&tm.m("src/auth/h"), "user.k", b"v");
    tm.assert_denied(r, "SCOPE_VIOLATION");
    unchanged(&tm, "README.md");
    let md = std::fs::metadata(tm.w("README.md")).unwrap();
    assert_eq!(md.mode() & 0o777, 0o644);
    assert_eq!(md.nlink(), 2);
}

#[test]
fn preexisting_hard_link_in_workspace_unseen_name() {
    preexisting_link(false);
}

#[test]
fn preexisting_hard_link_in_workspace_both_names_seen() {
    preexisting_link(true);
}

// ----- renames ----------------------------------------------------------------------------

#[test]
fn rename_in_to_out_and_out_to_in() {
    let tm = int001();
    let le = tm.assert_denied(
        std::fs::rename(tm.m("src/auth/a.ts"), tm.m("a.ts")),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "a.ts");
    assert_eq!(le["op"], "rename");
    let le = tm.assert_denied(
        std::fs::rename(tm.m("README.md"), tm.m("src/auth/r.md")),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "README.md");
    // Over an existing out-of-scope file.
    tm.assert_denied(
        std::fs::rename(tm.m("src/auth/a.ts"), tm.m("README.md")),
        "SCOPE_VIOLATION",
    );
    tm.assert_sh_denied("mv src/auth/a.ts docs/", "SCOPE_VIOLATION");
    tm.assert_sh_denied("mv docs/guide.md src/auth/", "SCOPE_VIOLATION");
    unchanged(&tm, "README.md");
    unchanged(&tm, "src/auth/a.ts");
    unchanged(&tm, "docs/guide.md");
    assert!(!tm.w("a.ts").exists() && !tm.w("src/auth/r.md").exists());
    assert!(!tm.w("docs/a.ts").exists() && !tm.w("src/auth/guide.md").exists());
    // RENAME_EXCHANGE of an in-scope and an out-of-scope file.
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(&tm.m("src/auth/a.ts")).as_ptr(),
            libc::AT_FDCWD,
            cpath(&tm.m("README.md")).as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    });
    tm.assert_denied(r, "SCOPE_VIOLATION");
    unchanged(&tm, "README.md");
    unchanged(&tm, "src/auth/a.ts");
    // Within scope works.
    std::fs::rename(tm.m("src/auth/a.ts"), tm.m("src/auth/b.ts")).unwrap();
    assert_eq!(tm.ws_bytes("src/auth/b.ts"), b"auth\n");
    let e = tm.wait_ledger("RENAME", |e| e["mutation_type"] == "RENAME");
    assert_eq!(e["path"], "src/auth/b.ts");
    assert_eq!(e["from"], "src/auth/a.ts");
}

#[test]
fn rename_of_the_scope_directory() {
    let tm = int001();
    tm.assert_sh_denied("mv src/auth src/auth2", "SCOPE_VIOLATION");
    tm.assert_denied(
        std::fs::rename(tm.m("src/auth"), tm.m("auth")),
        "SCOPE_VIOLATION",
    );
    tm.assert_denied(std::fs::remove_dir_all(tm.m("src/auth")), "SCOPE_VIOLATION");
    // rmdir of the (emptied) scope directory itself is refused; its contents went.
    assert!(tm.w("src/auth").is_dir());
    assert!(!tm.w("src/auth2").exists() && !tm.w("auth").exists());
    // Moving src (which holds the scope) is refused too.
    tm.assert_denied(
        std::fs::rename(tm.m("src"), tm.m("src2")),
        "SCOPE_VIOLATION",
    );
    unchanged(&tm, "src/middleware/other.ts");
}

const LIB_STAR: &str = "intents:
  - id: LIB
    name: top level of lib only
    status: IN_PROGRESS
    owned_scope:
      - \"lib/*\"
";

#[test]
fn rename_of_directory_with_contents_out_of_scope() {
    // `lib/d` is in scope (lib/*), `lib/d/inner.txt` is not (* does not cross /).
    let tm = TestMount::builder()
        .policy(LIB_STAR)
        .intent("LIB")
        .files(&[
            ("lib/d/inner.txt", "inner"),
            ("lib/e/x", "x"),
            ("lib/top.txt", "t"),
        ])
        .mount();
    std::fs::write(tm.m("lib/top.txt"), "t2").unwrap();
    tm.assert_denied(
        std::fs::write(tm.m("lib/d/inner.txt"), "x"),
        "SCOPE_VIOLATION",
    );
    let le = tm.assert_denied(
        std::fs::rename(tm.m("lib/d"), tm.m("lib/d2")),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "lib/d/inner.txt", "{le:#}");
    assert!(tm.w("lib/d/inner.txt").exists() && !tm.w("lib/d2").exists());
    // Exchanging two directories with out-of-scope contents.
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(&tm.m("lib/d")).as_ptr(),
            libc::AT_FDCWD,
            cpath(&tm.m("lib/e")).as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    });
    tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(tm.ws_bytes("lib/d/inner.txt"), b"inner");
    assert_eq!(tm.ws_bytes("lib/e/x"), b"x");
    // An empty directory in scope can move.
    std::fs::create_dir(tm.m("lib/empty")).unwrap();
    std::fs::rename(tm.m("lib/empty"), tm.m("lib/empty2")).unwrap();
    assert!(tm.w("lib/empty2").is_dir());
}

// ----- truncation, attributes, xattrs, mknod, .. -------------------------------------------

#[test]
fn truncation_out_of_scope() {
    let tm = int001();
    tm.assert_sh_denied("truncate -s 0 README.md", "SCOPE_VIOLATION");
    tm.assert_sh_denied(": > README.md", "SCOPE_VIOLATION");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(tm.m("README.md"));
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["path"], "README.md");
    // O_TRUNC with O_RDONLY (Linux truncates even then).
    let r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(tm.m("README.md"));
    tm.assert_denied(r, "SCOPE_VIOLATION");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .open(tm.m("README.md"))
        .and_then(|f| f.set_len(0));
    tm.assert_denied(r, "SCOPE_VIOLATION");
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe { libc::truncate(cpath(&tm.m("README.md")).as_ptr(), 3) });
    tm.assert_denied(r, "SCOPE_VIOLATION");
    // ftruncate on a read-only handle never reaches the file.
    let f = std::fs::File::open(tm.m("README.md")).unwrap();
    assert!(f.set_len(0).is_err());
    unchanged(&tm, "README.md");
    // set_len in scope works and is ledgered as a write/truncate.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(tm.m("src/auth/a.ts"))
        .unwrap();
    f.set_len(2).unwrap();
    drop(f);
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"au");
}

#[test]
fn set_len_after_switching_intent_is_refused() {
    let tm = int001();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(tm.m("src/auth/a.ts"))
        .unwrap();
    std::fs::write(tm.m(".intentfs/intent"), "INT-002").unwrap();
    tm.assert_denied(f.set_len(0), "SCOPE_VIOLATION");
    drop(f);
    unchanged(&tm, "src/auth/a.ts");
}

#[test]
fn write_through_open_fd_after_intent_switch() {
    let tm = int001();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("src/auth/a.ts"))
        .unwrap();
    std::fs::write(tm.m(".intentfs/intent"), "INT-002").unwrap();
    let r = f.write_all(b"after switch\n").and_then(|_| f.flush());
    drop(f);
    if r.is_err() {
        // Refused: then nothing may have changed.
        unchanged(&tm, "src/auth/a.ts");
        return;
    }
    // Allowed (it was authorized at open): then it must be on record under the intent that
    // authorized it, never under one whose scope does not hold the file.
    let w = tm
        .mutations()
        .into_iter()
        .rev()
        .find(|e| e["path"] == "src/auth/a.ts" && e["mutation_type"] == "WRITE")
        .expect("WRITE entry");
    assert_eq!(w["intent_id"], "INT-001", "{w:#}");
}

#[test]
fn chmod_chown_utimes_out_of_scope() {
    let tm = int001();
    let before = std::fs::metadata(tm.w("README.md")).unwrap();
    tm.assert_denied(
        std::fs::set_permissions(tm.m("README.md"), std::fs::Permissions::from_mode(0o777)),
        "SCOPE_VIOLATION",
    );
    tm.assert_sh_denied("chmod +x README.md", "SCOPE_VIOLATION");
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe { libc::chown(cpath(&tm.m("README.md")).as_ptr(), 1000, 1000) });
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["op"], "chown");
    tm.assert_sh_denied("chown 1:1 README.md", "SCOPE_VIOLATION");
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 0,
        },
    ];
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cpath(&tm.m("README.md")).as_ptr(),
            times.as_ptr(),
            0,
        )
    });
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["op"], "utimes");
    tm.assert_sh_denied("touch -d 2001-01-01 README.md", "SCOPE_VIOLATION");
    let out = tm.sh("touch README.md");
    failed_eacces(&out, "touch README.md");
    // Directories out of scope too.
    tm.assert_denied(
        std::fs::set_permissions(tm.m("docs"), std::fs::Permissions::from_mode(0o700)),
        "SCOPE_VIOLATION",
    );
    let after = std::fs::metadata(tm.w("README.md")).unwrap();
    assert_eq!(after.mode(), before.mode());
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    assert_eq!(after.mtime(), before.mtime());
    assert_eq!(after.mtime_nsec(), before.mtime_nsec());
    assert_eq!(after.atime(), before.atime());
    assert_eq!(
        std::fs::metadata(tm.w("docs")).unwrap().mode() & 0o777,
        0o755
    );
    unchanged(&tm, "README.md");
    // In scope: allowed, CHMOD ledgered.
    std::fs::set_permissions(
        tm.m("src/auth/a.ts"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(tm.w("src/auth/a.ts")).unwrap().mode() & 0o777,
        0o600
    );
    let e = tm.wait_ledger("CHMOD", |e| e["mutation_type"] == "CHMOD");
    assert_eq!(e["path"], "src/auth/a.ts");
}

fn xattr_set(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    res(unsafe {
        libc::setxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

fn xattr_get(p: &Path, name: &str) -> Option<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = unsafe {
        libc::getxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if r < 0 {
        None
    } else {
        buf.truncate(r as usize);
        Some(buf)
    }
}

#[test]
fn xattrs_out_of_scope() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(FILES)
        .setup(|ws| xattr_set(&ws.join("README.md"), "user.keep", b"1").unwrap())
        .mount();
    let le = tm.assert_denied(
        xattr_set(&tm.m("README.md"), "user.evil", b"x"),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["op"], "setxattr");
    tm.assert_denied(
        xattr_set(&tm.m("README.md"), "user.keep", b"2"),
        "SCOPE_VIOLATION",
    );
    let n = CString::new("user.keep").unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe { libc::removexattr(cpath(&tm.m("README.md")).as_ptr(), n.as_ptr()) });
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["op"], "removexattr");
    let out = tm.sh("python3 -c \"import os; os.setxattr('README.md', 'user.py', b'x')\"");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("PermissionError"));
    tm.assert_new_denial("SCOPE_VIOLATION");
    // Reading xattrs through the mount works.
    assert_eq!(xattr_get(&tm.m("README.md"), "user.keep").unwrap(), b"1");
    assert_eq!(xattr_get(&tm.w("README.md"), "user.keep").unwrap(), b"1");
    assert!(xattr_get(&tm.w("README.md"), "user.evil").is_none());
    assert!(xattr_get(&tm.w("README.md"), "user.py").is_none());
    unchanged(&tm, "README.md");
    // In scope: allowed.
    xattr_set(&tm.m("src/auth/a.ts"), "user.ok", b"y").unwrap();
    assert_eq!(xattr_get(&tm.w("src/auth/a.ts"), "user.ok").unwrap(), b"y");
}

#[test]
fn mknod_out_of_scope_and_devices() {
    let tm = int001();
    tm.assert_sh_denied("mkfifo fifo", "SCOPE_VIOLATION");
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe { libc::mknod(cpath(&tm.m("docs/f")).as_ptr(), libc::S_IFIFO | 0o644, 0) });
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["path"], "docs/f");
    assert!(!tm.w("fifo").exists() && !tm.w("docs/f").exists());
    // A fifo in scope works.
    tm.sh_ok("mkfifo src/auth/fifo");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(tm.w("src/auth/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    // A device node is never made, even in scope (raw disk access).
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        libc::mknod(
            cpath(&tm.m("src/auth/null")).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    });
    let e = errno_of(r, "mknod chr");
    assert!(matches!(e, libc::EPERM | libc::EACCES), "{e}");
    assert!(!tm.w("src/auth/null").exists());
}

#[test]
fn dotdot_in_paths() {
    let tm = int001();
    let le = tm.assert_denied(
        std::fs::write(tm.m("src/auth/../../README.md"), "x"),
        "SCOPE_VIOLATION",
    );
    assert_eq!(le["path"], "README.md");
    tm.assert_sh_denied("cd src/auth && echo x > ../../README.md", "SCOPE_VIOLATION");
    tm.assert_sh_denied("cd src/auth && mv a.ts ../../a.ts", "SCOPE_VIOLATION");
    tm.assert_denied(
        std::fs::write(tm.m("src/auth/sub/../../middleware/other.ts"), "x"),
        "SCOPE_VIOLATION",
    );
    unchanged(&tm, "README.md");
    unchanged(&tm, "src/middleware/other.ts");
    // A file literally named like a scope-lookalike is still judged by its real path.
    tm.assert_denied(std::fs::write(tm.m("src/authx"), "x"), "SCOPE_VIOLATION");
    tm.assert_denied(std::fs::write(tm.m("src/auth.ts"), "x"), "SCOPE_VIOLATION");
}

#[test]
fn unlink_and_rmdir_out_of_scope() {
    let tm = int001();
    tm.assert_denied(std::fs::remove_file(tm.m("README.md")), "SCOPE_VIOLATION");
    std::fs::create_dir(tm.w("emptydir")).unwrap();
    tm.assert_denied(std::fs::remove_dir(tm.m("emptydir")), "SCOPE_VIOLATION");
    // rm -rf of a directory mixing in-scope and out-of-scope files: only the in-scope ones go.
    let out = tm.sh("rm -rf src/middleware");
    assert!(!out.status.success());
    assert!(!tm.w("src/middleware/jwt.ts").exists(), "in scope: removed");
    unchanged(&tm, "src/middleware/other.ts");
    unchanged(&tm, "README.md");
    assert!(tm.w("emptydir").is_dir());
    let e = tm.wait_ledger("DELETE", |e| e["mutation_type"] == "DELETE");
    assert_eq!(e["path"], "src/middleware/jwt.ts");
}

#[test]
fn mmap_private_write_does_not_reach_the_file() {
    let tm = int001();
    let out = tm.sh("python3 - <<'EOF'
import mmap
with open('README.md', 'rb') as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    m[0:6] = b'PWNED!'
    m.flush()
    m.close()
try:
    with open('README.md', 'rb') as f:
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE)
    print('shared-writable mapping of a read-only fd succeeded')
except (OSError, PermissionError, TypeError) as e:
    print('refused', e)
EOF");
    let s = ok(out, "mmap script");
    assert!(s.contains("refused"), "{s}");
    unchanged(&tm, "README.md");
}

#[test]
fn reopen_through_proc_self_fd_for_writing() {
    let tm = int001();
    let f = std::fs::File::open(tm.m("README.md")).unwrap();
    use std::os::fd::AsRawFd;
    let p = format!("/proc/self/fd/{}", f.as_raw_fd());
    let r = std::fs::OpenOptions::new().write(true).open(&p);
    tm.assert_denied(r, "SCOPE_VIOLATION");
    unchanged(&tm, "README.md");
}

#[test]
fn directory_moved_out_of_scope_behind_the_mount() {
    let tm = int001();
    // Hold a directory fd inside the scope ...
    let dir = std::fs::File::open(tm.m("src/auth/sub")).unwrap();
    use std::os::fd::AsRawFd;
    // ... the human moves the directory out of scope, directly in the workspace ...
    std::fs::rename(tm.w("src/auth/sub"), tm.w("docs/sub")).unwrap();
    // ... creating or writing through the old handle is judged by the new path.
    let name = CString::new("new.ts").unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    let r = if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: `fd` was opened above, is owned here and closed once.
        unsafe { libc::close(fd) };
        Ok(())
    };
    let le = tm.assert_denied(r, "SCOPE_VIOLATION");
    assert_eq!(le["path"], "docs/sub/new.ts");
    let name = CString::new("b.ts").unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    let r = if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: `fd` was opened above, is owned here and closed once.
        unsafe { libc::close(fd) };
        Ok(())
    };
    let e = errno_of(r, "open b.ts for writing");
    assert!(
        matches!(e, libc::EACCES | libc::ESTALE | libc::ENOENT),
        "{e}"
    );
    assert!(!tm.w("docs/sub/new.ts").exists());
    assert_eq!(tm.ws_bytes("docs/sub/b.ts"), b"sub\n");
}

#[test]
fn file_moved_out_of_scope_behind_the_mount() {
    let tm = int001();
    assert_eq!(std::fs::read(tm.m("src/auth/a.ts")).unwrap(), b"auth\n");
    let f = std::fs::File::open(tm.m("src/auth/a.ts")).unwrap();
    std::fs::rename(tm.w("src/auth/a.ts"), tm.w("docs/a.ts")).unwrap();
    // The kernel may still have the old name cached: whatever it does, the file now out of
    // scope must not change.
    let r = std::fs::OpenOptions::new()
        .append(true)
        .open(tm.m("src/auth/a.ts"));
    if let Ok(mut w) = r {
        let _ = w.write_all(b"x");
    }
    use std::os::fd::AsRawFd;
    let p = format!("/proc/self/fd/{}", f.as_raw_fd());
    let r = std::fs::OpenOptions::new().append(true).open(&p);
    if let Ok(mut w) = r {
        let _ = w.write_all(b"y");
    }
    assert_eq!(tm.ws_bytes("docs/a.ts"), b"auth\n");
}

// ----- protected files ------------------------------------------------------------------

fn protected_file_attempts(tm: &TestMount, rel: &str) {
    let before = tm.ws_bytes(rel);
    let p = tm.m(rel);
    let r = std::fs::OpenOptions::new().append(true).open(&p);
    tm.assert_denied(r, "PROTECTED_PATH");
    tm.assert_denied(std::fs::write(&p, "x"), "PROTECTED_PATH");
    tm.assert_sh_denied(&format!("echo x >> {rel}"), "PROTECTED_PATH");
    tm.assert_sh_denied(&format!("truncate -s 0 {rel}"), "PROTECTED_PATH");
    tm.assert_denied(std::fs::remove_file(&p), "PROTECTED_PATH");
    tm.assert_sh_denied(&format!("rm -f {rel}"), "PROTECTED_PATH");
    std::fs::write(tm.m("decoy"), "decoy").unwrap();
    let le = tm.assert_denied(std::fs::rename(tm.m("decoy"), &p), "PROTECTED_PATH");
    assert_eq!(le["path"], rel);
    tm.assert_denied(std::fs::rename(&p, tm.m("stolen")), "PROTECTED_PATH");
    tm.assert_denied(
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)),
        "PROTECTED_PATH",
    );
    tm.assert_denied(std::fs::hard_link(&p, tm.m("hl")), "PROTECTED_PATH");
    tm.assert_denied(xattr_set(&p, "user.x", b"1"), "PROTECTED_PATH");
    // Still there, same bytes (the ledger may only have grown by the daemon's appends).
    let after = tm.ws_bytes(rel);
    if rel.ends_with(".jsonl") {
        assert!(after.starts_with(&before), "{rel} was rewritten");
    } else {
        assert_eq!(after, before, "{rel} changed");
    }
    assert!(!tm.w("stolen").exists() && !tm.w("hl").exists());
    // Reading is fine.
    std::fs::read(&p).unwrap();
}

#[test]
fn ledger_file_is_protected() {
    let tm = allow_all();
    std::fs::write(tm.m("touch"), "so the ledger has content").unwrap();
    protected_file_attempts(&tm, LEDGER_REL);
    let l = tm.ledger();
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "WRITE" && e["path"] == "touch"));
}

#[test]
fn orchestration_dir_is_protected() {
    let tm = allow_all();
    // The directory holding the ledger and policy cannot be moved or removed.
    tm.assert_denied(
        std::fs::rename(tm.m(".orchestration"), tm.m("orch")),
        "PROTECTED_PATH",
    );
    tm.assert_denied(
        std::fs::remove_dir_all(tm.m(".orchestration")),
        "PROTECTED_PATH",
    );
    tm.assert_denied(
        std::fs::write(tm.m(".orchestration/pending_scope_updates.json"), "{}"),
        "PROTECTED_PATH",
    );
    // Replacing the directory from the root (exchange with an attacker's dir).
    std::fs::create_dir(tm.m("fake")).unwrap();
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(&tm.m("fake")).as_ptr(),
            libc::AT_FDCWD,
            cpath(&tm.m(".orchestration")).as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    });
    tm.assert_denied(r, "PROTECTED_PATH");
    assert!(tm.w(LEDGER_REL).is_file());
    assert_eq!(tm.ws_bytes(POLICY_REL), ALLOW_ALL.as_bytes());
    assert!(tm.w("fake").is_dir() && !tm.w("orch").exists());
}

#[test]
fn policy_file_is_protected() {
    let tm = allow_all();
    protected_file_attempts(&tm, POLICY_REL);
    assert_eq!(tm.ws_bytes(POLICY_REL), ALLOW_ALL.as_bytes());
}

#[test]
fn intentignore_file_is_protected() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[
            (".intentignore", "vendor/\n*.lock\n"),
            ("vendor/lib.js", "lib"),
            ("Cargo.lock", "lock"),
            ("src/x", "x"),
        ])
        .mount();
    protected_file_attempts(&tm, ".intentignore");
    assert_eq!(tm.ws_bytes(".intentignore"), b"vendor/\n*.lock\n");
}

#[test]
fn intentignore_is_honoured() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[
            (".intentignore", "vendor/\n*.lock\n"),
            ("vendor/lib.js", "lib"),
            ("Cargo.lock", "lock"),
            ("src/x", "x"),
        ])
        .mount();
    let le = tm.assert_denied(std::fs::write(tm.m("vendor/lib.js"), "x"), "PROTECTED_PATH");
    assert!(
        le["rule"].as_str().unwrap_or("").contains(".intentignore"),
        "{le:#}"
    );
    tm.assert_denied(std::fs::write(tm.m("Cargo.lock"), "x"), "PROTECTED_PATH");
    tm.assert_denied(std::fs::write(tm.m("src/new.lock"), "x"), "PROTECTED_PATH");
    tm.assert_denied(
        std::fs::rename(tm.m("vendor"), tm.m("v2")),
        "PROTECTED_PATH",
    );
    tm.assert_denied(
        std::fs::rename(tm.m("src/x"), tm.m("vendor/x")),
        "PROTECTED_PATH",
    );
    assert_eq!(tm.ws_bytes("vendor/lib.js"), b"lib");
    assert_eq!(tm.ws_bytes("Cargo.lock"), b"lock");
    std::fs::write(tm.m("src/x"), "ok").unwrap();
}

fn elsewhere() -> TestMount {
    TestMount::builder()
        .intent("ALL")
        .files(&[("gov/policy.yaml", ALLOW_ALL)])
        .arg("--policy")
        .arg("{ws}/gov/policy.yaml")
        .arg("--ledger")
        .arg("{ws}/logs/trace.jsonl")
        .mount()
}

#[test]
fn policy_elsewhere_in_workspace_is_protected() {
    let tm = elsewhere();
    std::fs::write(tm.m("gov/other"), "fine").unwrap();
    assert_eq!(tm.ws_bytes("gov/other"), b"fine");
    protected_file_attempts(&tm, "gov/policy.yaml");
}

#[test]
fn ledger_elsewhere_in_workspace_is_protected() {
    let tm = elsewhere();
    std::fs::write(tm.m("logs/other"), "fine").unwrap();
    protected_file_attempts(&tm, "logs/trace.jsonl");
    assert!(!tm.w(LEDGER_REL).exists(), "the ledger went to --ledger");
    let l = read_ledger(&tm.w("logs/trace.jsonl"));
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "WRITE" && e["path"] == "logs/other"));
}

#[test]
fn git_hooks_and_config_are_protected() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a.txt", "a\n")])
        .setup(|ws| {
            ok(
                sh_in(ws, "git init -q . && git add a.txt && git commit -qm init"),
                "git init",
            );
        })
        .mount();
    let config = tm.ws_bytes(".git/config");
    tm.assert_denied(
        std::fs::write(tm.m(".git/hooks/pre-commit"), "#!/bin/sh\ncurl evil\n"),
        "PROTECTED_PATH",
    );
    tm.assert_sh_denied(
        "printf '#!/bin/sh\\nexit 0\\n' > .git/hooks/post-checkout",
        "PROTECTED_PATH",
    );
    tm.assert_sh_denied("echo '[core]' >> .git/config", "PROTECTED_PATH");
    tm.assert_sh_denied("git config core.hooksPath /tmp/evil", "PROTECTED_PATH");
    tm.assert_denied(std::fs::remove_file(tm.m(".git/config")), "PROTECTED_PATH");
    tm.assert_denied(
        std::fs::rename(tm.m(".git/hooks"), tm.m(".git/h2")),
        "PROTECTED_PATH",
    );
    std::fs::create_dir(tm.m("evilhooks")).unwrap();
    std::fs::write(tm.m("evilhooks/pre-commit"), "#!/bin/sh\n").unwrap();
    tm.assert_denied(
        std::fs::rename(tm.m("evilhooks"), tm.m(".git/hooks")),
        "PROTECTED_PATH",
    );
    tm.assert_denied(
        std::fs::rename(tm.m(".git"), tm.m("git2")),
        "PROTECTED_PATH",
    );
    let out = tm.sh("rm -rf .git");
    assert!(!out.status.success());
    assert_eq!(tm.ws_bytes(".git/config"), config);
    assert!(!tm.w(".git/hooks/pre-commit").exists());
    assert!(!tm.w(".git/hooks/post-checkout").exists());
    assert!(tm.w(".git/hooks").is_dir());
}

#[test]
fn git_objects_stay_writable() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a.txt", "a\n")])
        .setup(|ws| {
            ok(
                sh_in(ws, "git init -q . && git add a.txt && git commit -qm init"),
                "git init",
            );
        })
        .mount();
    std::fs::write(tm.m("a.txt"), "a2\n").unwrap();
    std::fs::write(tm.m("b.txt"), "b\n").unwrap();
    tm.sh_ok("git add -A && git commit -qm second");
    let log = tm.sh_ok("git log --format=%s");
    assert_eq!(log, "second\ninit\n");
    // Only the ledger (which grows with every commit's writes), its head checkpoint (made
    // by the daemon a few milliseconds after the first entries: `git add -A` may run
    // before it exists) and the intent map may differ.
    let status = tm.sh_ok("git status --porcelain");
    assert!(
        status
            .lines()
            .all(|l| l.ends_with(".orchestration/agent_trace.jsonl")
                || l.ends_with(".orchestration/agent_trace.jsonl.head")
                || l.contains(".orchestration/intent_map.md")),
        "{status}"
    );
    // Seen from the workspace as well.
    let log = ok(sh_in(&tm.ws, "git log --format=%s"), "git log in ws");
    assert_eq!(log, "second\ninit\n");
    // .git internals are not ledgered file by file: only ref moves are (REF).
    assert!(tm
        .ledger()
        .iter()
        .filter(|e| e["mutation_type"] != "REF")
        .all(|e| !e["path"].as_str().unwrap_or("").starts_with(".git")));
    assert!(
        tm.ledger().iter().any(|e| e["mutation_type"] == "REF"
            && e["detail"]["ref"]
                .as_str()
                .unwrap_or("")
                .starts_with("refs/heads/")),
        "the commit's ref move is on record"
    );
}

#[test]
fn git_commit_works_under_a_narrow_intent() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(FILES)
        .setup(|ws| {
            ok(
                sh_in(ws, "git init -q . && git add -A && git commit -qm init"),
                "git init",
            );
        })
        .mount();
    std::fs::write(tm.m("src/auth/a.ts"), "jwt\n").unwrap();
    tm.sh_ok("git add src/auth/a.ts && git commit -qm jwt");
    assert_eq!(tm.sh_ok("git log -1 --format=%s"), "jwt\n");
}

// ----- symlinks in the workspace pointing outside it -------------------------------------

#[test]
fn symlinks_pointing_outside_the_workspace_are_not_followed_by_the_daemon() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(FILES)
        .setup(|ws| {
            let root = ws.parent().unwrap();
            put(&root.join("outside/x"), "outside x\n");
            std::os::unix::fs::symlink(root.join("outside/x"), ws.join("abs")).unwrap();
            std::os::unix::fs::symlink(root.join("outside"), ws.join("src/auth/absdir")).unwrap();
            std::os::unix::fs::symlink("../outside", ws.join("rel")).unwrap();
            std::os::unix::fs::symlink("../../../outside", ws.join("src/auth/deep")).unwrap();
            std::os::unix::fs::symlink("../../..", ws.join("up")).unwrap();
        })
        .mount();
    let outside = tm.root.join("outside");
    let ws_before = tree(&tm.ws, &[".orchestration"]);
    let fuse_dev = std::fs::metadata(&tm.mnt).unwrap().dev();
    let host_dev = std::fs::metadata(&tm.root).unwrap().dev();
    assert_ne!(fuse_dev, host_dev);

    let links = [
        ("abs", outside.join("x").to_string_lossy().into_owned()),
        ("src/auth/absdir", outside.to_string_lossy().into_owned()),
        ("rel", "../outside".to_string()),
        ("src/auth/deep", "../../../outside".to_string()),
        ("up", "../../..".to_string()),
    ];
    for (name, target) in &links {
        // The daemon reports the link itself, verbatim, never what it points to.
        let md = std::fs::symlink_metadata(tm.m(name)).unwrap();
        assert!(
            md.file_type().is_symlink(),
            "{name} is not a symlink through the mount"
        );
        assert_eq!(md.dev(), fuse_dev);
        assert_eq!(
            std::fs::read_link(tm.m(name)).unwrap().to_string_lossy(),
            target.as_str(),
            "{name}"
        );
        // Following it is the kernel's job, relative to the mount: it leaves intentfs.
        let followed = std::fs::metadata(tm.m(name)).unwrap();
        assert_eq!(
            followed.dev(),
            host_dev,
            "{name} was served through intentfs"
        );
    }
    // Listing through the links shows the host directories, not intentfs ones.
    let list = |p: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&tm.m("rel")), vec!["x"]);
    assert_eq!(list(&tm.m("src/auth/deep")), vec!["x"]);
    let up_host = tm.mnt.join("../../..").canonicalize().unwrap();
    assert_eq!(list(&tm.m("up")), list(&up_host));
    let ls = tm.sh_ok("ls -a up/");
    assert!(!ls.lines().any(|l| l == ".intentfs"), "{ls}");
    for e in std::fs::read_dir(tm.m("up")).unwrap() {
        let e = e.unwrap();
        if let Ok(md) = std::fs::symlink_metadata(e.path()) {
            assert_ne!(
                md.dev(),
                fuse_dev,
                "{} listed through intentfs",
                e.path().display()
            );
        }
    }
    // Writing through them lands outside the mount and outside the workspace, never in it.
    std::fs::write(tm.m("abs"), "via abs\n").unwrap();
    std::fs::write(tm.m("src/auth/deep/new"), "via deep\n").unwrap();
    std::fs::write(tm.m("rel/new2"), "via rel\n").unwrap();
    assert_eq!(std::fs::read(outside.join("x")).unwrap(), b"via abs\n");
    assert_eq!(std::fs::read(outside.join("new")).unwrap(), b"via deep\n");
    assert_eq!(std::fs::read(outside.join("new2")).unwrap(), b"via rel\n");
    assert_eq!(
        tree(&tm.ws, &[".orchestration"]),
        ws_before,
        "the workspace changed"
    );
    assert!(
        tm.mutations().is_empty(),
        "intentfs ledgered writes it never served: {:#?}",
        tm.mutations()
    );
    // Replacing such a link is a change of the link (in scope or not).
    tm.assert_denied(std::fs::remove_file(tm.m("abs")), "SCOPE_VIOLATION");
    std::fs::remove_file(tm.m("src/auth/deep")).unwrap();
    assert!(
        outside.join("new").exists(),
        "removing the link removed its target"
    );
    // Out-of-scope link: metadata changes on it are refused (never applied to the target).
    // SAFETY: a plain syscall: the C strings and buffers passed are valid for its duration.
    let r = res(unsafe {
        let t = [
            libc::timespec {
                tv_sec: 5,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 5,
                tv_nsec: 0,
            },
        ];
        libc::utimensat(
            libc::AT_FDCWD,
            cpath(&tm.m("rel")).as_ptr(),
            t.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    });
    tm.assert_denied(r, "SCOPE_VIOLATION");
}

#[test]
fn example_policy_out_of_scope_ask_is_refused_without_a_human() {
    // policies/example.yaml says `approval.out_of_scope: ask`; with the default
    // `--approver deny` nobody approves, so the write is refused and nothing changes.
    let tm = TestMount::builder()
        .policy(EXAMPLE)
        .intent("INT-001")
        .files(FILES)
        .mount();
    let e = errno_of(std::fs::write(tm.m("README.md"), "x"), "write README.md");
    assert_eq!(e, libc::EACCES);
    let le = tm.last_error();
    let code = le["code"].as_str().unwrap_or("");
    assert!(
        matches!(code, "SCOPE_VIOLATION" | "APPROVAL_REJECTED"),
        "last_error: {le:#}"
    );
    assert_eq!(le["path"], "README.md");
    tm.assert_sh_denied("mv src/auth/a.ts docs/", code);
    unchanged(&tm, "README.md");
    unchanged(&tm, "src/auth/a.ts");
    std::fs::write(tm.m("src/auth/a.ts"), "in scope").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"in scope");
}
