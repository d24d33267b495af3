//! The intent handshake through the virtual `.intentfs/` directory, and policy reloads.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;

fn example_mount() -> TestMount {
    TestMount::builder()
        .policy(&example_deny())
        .files(&[
            ("src/auth/a.ts", "auth"),
            ("README.md", "readme"),
            ("docs/x.md", "docs"),
        ])
        .mount()
}

/// Write `text` to `.intentfs/intent` the way `echo ID > .intentfs/intent` does.
fn select(tm: &TestMount, text: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(tm.m(".intentfs/intent"))?;
    f.write_all(text.as_bytes())
}

#[test]
fn no_intent_then_select_with_echo() {
    let tm = example_mount();
    assert_eq!(tm.ctl("intent"), "");
    // A write without an intent: EACCES, NO_INTENT, with a remedy naming the handshake.
    let le = tm.assert_denied(std::fs::write(tm.m("src/auth/a.ts"), "x"), "NO_INTENT");
    assert_eq!(le["path"], "src/auth/a.ts");
    assert!(le["intent"].is_null(), "{le:#}");
    let remedy = le["remedy"].as_str().unwrap();
    assert!(remedy.contains(".intentfs/intent"), "{remedy}");
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"auth");
    // Creating, mkdir, unlink are refused as well.
    tm.assert_denied(std::fs::write(tm.m("src/auth/new.ts"), "x"), "NO_INTENT");
    tm.assert_denied(std::fs::create_dir(tm.m("src/auth/d")), "NO_INTENT");
    tm.assert_denied(std::fs::remove_file(tm.m("src/auth/a.ts")), "NO_INTENT");
    assert!(!tm.w("src/auth/new.ts").exists() && !tm.w("src/auth/d").exists());
    // Reading needs no intent.
    assert_eq!(std::fs::read(tm.m("src/auth/a.ts")).unwrap(), b"auth");

    tm.sh_ok("echo INT-001 > .intentfs/intent");
    assert_eq!(tm.ctl("intent"), "INT-001\n");
    std::fs::write(tm.m("src/auth/a.ts"), "jwt").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"jwt");
    let e = tm
        .mutations()
        .into_iter()
        .find(|e| e["path"] == "src/auth/a.ts")
        .expect("a ledger entry for the write");
    assert_eq!(e["mutation_type"], "WRITE");
    assert_eq!(e["intent_id"], "INT-001");
    assert_eq!(e["agent"]["name"], "tester");
    // The NO_INTENT denials are in the ledger too.
    tm.wait_ledger("DENIAL NO_INTENT", |e| {
        e["mutation_type"] == "DENIAL" && e["code"] == "NO_INTENT" && e["path"] == "src/auth/a.ts"
    });
    // Switching intent switches the scope.
    select(&tm, "INT-002\n").unwrap();
    assert_eq!(tm.ctl("intent"), "INT-002\n");
    std::fs::write(tm.m("README.md"), "new readme").unwrap();
    tm.assert_denied(
        std::fs::write(tm.m("src/auth/a.ts"), "y"),
        "SCOPE_VIOLATION",
    );
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"jwt");
    // An empty line deselects.
    tm.sh_ok("echo > .intentfs/intent");
    assert_eq!(tm.ctl("intent"), "");
    tm.assert_denied(std::fs::write(tm.m("README.md"), "z"), "NO_INTENT");
}

#[test]
fn invalid_or_paused_intent_is_einval() {
    let tm = example_mount();
    for bad in ["NOPE\n", "INT-003\n", "int-001\n"] {
        let e = errno_of(select(&tm, bad), bad);
        assert_eq!(e, libc::EINVAL, "writing {bad:?}");
        assert_eq!(tm.ctl("intent"), "", "after {bad:?}");
    }
    let out = tm.sh("env echo INT-003 > .intentfs/intent");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Invalid argument"),
        "{:?}",
        out
    );
    // A valid selection, then an invalid one, keeps the valid one.
    select(&tm, "INT-001").unwrap();
    assert_eq!(errno_of(select(&tm, "NOPE"), "NOPE"), libc::EINVAL);
    assert_eq!(tm.ctl("intent"), "INT-001\n");
}

#[test]
fn context_intents_status() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .agent("claude")
        .mount();
    let none = tm.ctl("context");
    assert!(none.contains("<intent_context>"), "{none}");
    select(&tm, "INT-001").unwrap();
    let ctx = tm.ctl("context");
    assert!(
        ctx.contains("<intent_context>") && ctx.contains("</intent_context>"),
        "{ctx}"
    );
    for needle in [
        "INT-001",
        "JWT Authentication Migration",
        "src/auth/**",
        "src/middleware/jwt.ts",
        "tests/auth/**",
        "Must not use external auth providers",
        "Unit tests in tests/auth/ pass",
    ] {
        assert!(ctx.contains(needle), "context lacks {needle}:\n{ctx}");
    }
    assert!(!ctx.contains("INT-002"), "{ctx}");

    let intents = tm.ctl("intents");
    let ids: Vec<&str> = intents
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(ids, vec!["INT-001", "INT-002"], "{intents}");

    let st = tm.status();
    let me = &st["identities"][0];
    assert_eq!(me["agent"], "claude", "{st:#}");
    assert_eq!(me["intent"], "INT-001", "{st:#}");
    assert_eq!(me["identity"], "default", "{st:#}");
    assert_eq!(
        st["mount"]["workspace"].as_str().unwrap(),
        tm.ws.to_str().unwrap()
    );
    assert_eq!(
        st["mount"]["mountpoint"].as_str().unwrap(),
        tm.mnt.to_str().unwrap()
    );
    assert!(st["mount"]["policy_reload_error"].is_null());
    // last_error before any denial: an empty JSON object.
    assert_eq!(tm.last_error(), serde_json::json!({}));
}

#[test]
fn control_files_cannot_be_changed() {
    let tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    let ctl = tm.m(".intentfs");
    for name in ["intent", "context", "intents", "last_error", "status", ""] {
        let p = ctl.join(name);
        if !name.is_empty() {
            let e = errno_of(std::fs::remove_file(&p), "unlink");
            assert!(matches!(e, libc::EPERM | libc::EACCES), "rm {name}: {e}");
        }
        let e = errno_of(std::fs::rename(&p, tm.m("moved")), "rename");
        assert!(matches!(e, libc::EPERM | libc::EACCES), "mv {name}: {e}");
        let e = errno_of(
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)),
            "chmod",
        );
        assert!(matches!(e, libc::EPERM | libc::EACCES), "chmod {name}: {e}");
        assert!(p.exists(), "{name} vanished");
    }
    assert!(!tm.m("moved").exists() && !tm.w("moved").exists());
    for name in ["context", "intents", "last_error", "status"] {
        let e = errno_of(std::fs::write(ctl.join(name), "x"), name);
        assert!(matches!(e, libc::EPERM | libc::EACCES), "write {name}: {e}");
    }
    // Nothing can be created in it, and it cannot be removed or replaced.
    let e = errno_of(std::fs::write(ctl.join("new"), "x"), "create");
    assert!(matches!(e, libc::EPERM | libc::EACCES), "create: {e}");
    let e = errno_of(std::fs::create_dir(ctl.join("d")), "mkdir");
    assert!(matches!(e, libc::EPERM | libc::EACCES), "mkdir: {e}");
    let e = errno_of(std::fs::remove_dir(&ctl), "rmdir");
    assert!(
        matches!(e, libc::EPERM | libc::EACCES | libc::ENOTEMPTY),
        "rmdir: {e}"
    );
    std::fs::create_dir(tm.m("d")).unwrap();
    let e = errno_of(std::fs::rename(tm.m("d"), &ctl), "rename over");
    assert!(
        matches!(e, libc::EPERM | libc::EACCES | libc::EEXIST),
        "rename over: {e}"
    );
    let e = errno_of(std::fs::create_dir(&ctl), "mkdir .intentfs");
    assert_eq!(e, libc::EEXIST);
    let e = errno_of(std::fs::hard_link(ctl.join("status"), tm.m("st")), "link");
    assert!(matches!(e, libc::EPERM | libc::EACCES), "link: {e}");
    let e = errno_of(std::os::unix::fs::symlink("x", ctl.join("l")), "symlink");
    assert!(matches!(e, libc::EPERM | libc::EACCES), "symlink: {e}");
    // Still intact, and still working.
    assert_eq!(tm.ctl("intent"), "ALL\n");
    assert!(tm.status()["identities"].is_array());
    // It never appears in the workspace.
    assert!(!tm.w(".intentfs").exists());
}

#[test]
fn control_dir_reachable_but_not_listed() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a", "1"), ("b/c", "2")])
        .mount();
    // `.intentfs` is reachable by name but never listed, so `git add -A`, `tar`, `rsync`
    // and `find` of the mount do not pick up the handshake files.
    let out = tm.sh_ok("ls -a");
    let names: Vec<&str> = out.lines().collect();
    assert_eq!(
        names.iter().filter(|n| **n == ".intentfs").count(),
        0,
        "{names:?}"
    );
    assert!(tm.m(".intentfs").is_dir());
    let mut want = vec![".", "..", ".orchestration", "a", "b"];
    want.sort();
    let mut got = names.clone();
    got.sort();
    assert_eq!(got, want);
    let mut ctl: Vec<String> = std::fs::read_dir(tm.m(".intentfs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ctl.sort();
    for n in ["context", "intent", "intents", "last_error", "status"] {
        assert!(ctl.iter().any(|c| c == n), "{ctl:?}");
    }
    // Not in subdirectories.
    assert!(!tm.m("b/.intentfs").exists());
    let out = tm.sh_ok("ls -a b");
    assert!(!out.contains(".intentfs"));
}

#[test]
fn a_workspace_dir_named_intentfs_does_not_shadow_the_control_dir() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[(".intentfs/intent", "forged")])
        .mount();
    assert_eq!(tm.ctl("intent"), "ALL\n");
    // The workspace's own `.intentfs` is hidden: neither listed nor reachable.
    let out = tm.sh_ok("ls -a");
    assert_eq!(
        out.lines().filter(|n| *n == ".intentfs").count(),
        0,
        "{out}"
    );
    assert_eq!(tm.ws_bytes(".intentfs/intent"), b"forged");
}

#[test]
fn control_files_read_whole_until_eof() {
    // Control files report size 0 but are read until EOF (direct I/O): `cat`, `head`, and a
    // read with a small buffer all see the whole text.
    let tm = example_mount();
    select(&tm, "INT-001").unwrap();
    let full = tm.ctl("context");
    let cat = tm.sh_ok("cat .intentfs/context");
    assert_eq!(cat, full);
    let mut f = std::fs::File::open(tm.m(".intentfs/context")).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 7];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(String::from_utf8(got).unwrap(), full);
}

fn wait_for(tm: &TestMount, what: &str, f: impl Fn(&TestMount) -> bool) {
    assert!(
        wait_until(Duration::from_secs(5), || f(tm)),
        "timed out waiting for {what}"
    );
}

#[test]
fn policy_edit_takes_effect_without_remount() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(&[("src/auth/a.ts", "a")])
        .mount();
    std::fs::write(tm.m("src/auth/a.ts"), "b").unwrap();
    // The human pauses INT-001 (directly in the workspace).
    let base = example_deny();
    let paused = base.replacen(
        "status: IN_PROGRESS               # IN_PROGRESS | PAUSED",
        "status: PAUSED               # IN_PROGRESS | PAUSED",
        1,
    );
    assert_ne!(paused, base, "the example policy changed shape");
    let start = std::time::Instant::now();
    std::fs::write(tm.w(POLICY_REL), &paused).unwrap();
    wait_for(&tm, "INT-001 to leave .intentfs/intents", |tm| {
        !tm.ctl("intents").contains("INT-001")
    });
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "reload took {:?}",
        start.elapsed()
    );
    let le = tm.assert_denied(std::fs::write(tm.m("src/auth/a.ts"), "c"), "NO_INTENT");
    assert!(
        le["message"].as_str().unwrap().contains("INT-001"),
        "{le:#}"
    );
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"b");
    // And back.
    std::fs::write(tm.w(POLICY_REL), example_deny()).unwrap();
    wait_for(&tm, "INT-001 to come back", |tm| {
        tm.ctl("intents").contains("INT-001")
    });
    std::fs::write(tm.m("src/auth/a.ts"), "d").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"d");
}

#[test]
fn policy_scope_edit_takes_effect_without_remount() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(&[("lib/x.ts", "x")])
        .mount();
    tm.assert_denied(std::fs::write(tm.m("lib/x.ts"), "1"), "SCOPE_VIOLATION");
    let base = example_deny();
    let wider = base.replacen(
        "      - \"src/auth/**\"\n",
        "      - \"src/auth/**\"\n      - \"lib/**\"\n",
        1,
    );
    assert_ne!(wider, base);
    std::fs::write(tm.w(POLICY_REL), &wider).unwrap();
    wait_for(&tm, "lib/** in the scope", |tm| {
        tm.ctl("context").contains("lib/**")
    });
    std::fs::write(tm.m("lib/x.ts"), "2").unwrap();
    assert_eq!(tm.ws_bytes("lib/x.ts"), b"2");
}

#[test]
fn garbage_policy_keeps_the_last_good_one() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(&[("src/auth/a.ts", "a"), ("README.md", "r")])
        .mount();
    std::fs::write(tm.w(POLICY_REL), "intents:\n  - id: [[[\n  garbage: :\n").unwrap();
    wait_for(&tm, "policy_reload_error in status", |tm| {
        tm.status()["mount"]["policy_reload_error"].is_string()
    });
    let st = tm.status();
    let err = st["mount"]["policy_reload_error"].as_str().unwrap();
    assert!(err.contains("active_intents.yaml"), "{err}");
    // The old rules still hold: in scope allowed, out of scope refused (never falls open).
    std::fs::write(tm.m("src/auth/a.ts"), "a2").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"a2");
    tm.assert_denied(std::fs::write(tm.m("README.md"), "x"), "SCOPE_VIOLATION");
    assert_eq!(tm.ws_bytes("README.md"), b"r");
    assert_eq!(tm.ctl("intents").lines().count(), 2);
    // An empty policy file / a policy with an unknown key also keep the old rules.
    std::fs::write(
        tm.w(POLICY_REL),
        "intents:\n  - id: INT-001\n    name: n\n    status: IN_PROGRESS\n    owned_scop: [\"**\"]\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    tm.assert_denied(std::fs::write(tm.m("README.md"), "x"), "SCOPE_VIOLATION");
    assert!(tm.status()["mount"]["policy_reload_error"]
        .as_str()
        .unwrap_or("")
        .contains("owned_scop"));
    // A good policy clears the error.
    std::fs::write(tm.w(POLICY_REL), example_deny()).unwrap();
    wait_for(&tm, "the reload error to clear", |tm| {
        tm.status()["mount"]["policy_reload_error"].is_null()
    });
}

#[test]
fn deleted_policy_keeps_the_last_good_one() {
    let tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-001")
        .files(&[("src/auth/a.ts", "a"), ("README.md", "r")])
        .mount();
    std::fs::remove_file(tm.w(POLICY_REL)).unwrap();
    wait_for(&tm, "policy_reload_error", |tm| {
        tm.status()["mount"]["policy_reload_error"].is_string()
    });
    tm.assert_denied(std::fs::write(tm.m("README.md"), "x"), "SCOPE_VIOLATION");
    std::fs::write(tm.m("src/auth/a.ts"), "b").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"b");
}

#[test]
fn control_file_modes() {
    // Reading `intent` does not need an intent; writing garbage to it is EINVAL, and
    // chmod/unlink are refused (checked in control_files_cannot_be_changed).
    let tm = example_mount();
    let md = std::fs::metadata(tm.m(".intentfs/intent")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.permissions().mode() & 0o777, 0o666);
    let md = std::fs::metadata(tm.m(".intentfs/status")).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o444);
    let md = std::fs::metadata(tm.m(".intentfs")).unwrap();
    assert!(md.is_dir());
}
