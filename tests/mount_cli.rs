//! The command line: what `intentfs mount` refuses before mounting anything, the daemonized
//! and foreground life cycles, `umount`, signals, `check-policy`, `--help`.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

/// A fresh `ws/` (with a policy) and an empty `mnt/` in a temp dir.
struct Dirs {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    mnt: PathBuf,
}

fn dirs(policy: Option<&str>) -> Dirs {
    let dir = tempfile::Builder::new()
        .prefix("intentfs-cli-")
        .tempdir()
        .unwrap();
    let root = dir.path().canonicalize().unwrap();
    let ws = root.join("ws");
    let mnt = root.join("mnt");
    std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    if let Some(p) = policy {
        std::fs::write(ws.join(POLICY_REL), p).unwrap();
    }
    Dirs {
        _dir: dir,
        root,
        ws,
        mnt,
    }
}

/// Run `intentfs mount ARGS... WS MNT` (with a 20 s guard against hangs).
fn mount_cmd(extra: &[&str], ws: &Path, mnt: &Path) -> Output {
    let mut c = intentfs();
    c.arg("mount").args(extra).arg(ws).arg(mnt);
    run_timeout(c, Duration::from_secs(20))
}

/// A refused mount: non-zero exit, the message contains every `needles`, nothing mounted.
/// Checked both with and without `--foreground`.
fn assert_refused(extra: &[&str], ws: &Path, mnt: &Path, needles: &[&str]) -> String {
    let mut last = String::new();
    for fg in [true, false] {
        let mut args: Vec<&str> = extra.to_vec();
        if fg {
            args.push("--foreground");
        }
        let out = mount_cmd(&args, ws, mnt);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "mount {args:?} should fail; stderr: {err}"
        );
        for n in needles {
            assert!(
                err.contains(n),
                "mount {args:?}: message should contain {n:?}:\n{err}"
            );
        }
        assert!(
            !is_mounted(mnt),
            "something is mounted at {}",
            mnt.display()
        );
        last = err;
    }
    last
}

#[test]
fn refuses_missing_workspace() {
    let d = dirs(Some(EXAMPLE));
    let missing = d.root.join("no-such-ws");
    let err = assert_refused(&["--intent", "INT-001"], &missing, &d.mnt, &["no-such-ws"]);
    assert!(err.contains("hint"), "{err}");
}

#[test]
fn refuses_missing_mountpoint() {
    let d = dirs(Some(EXAMPLE));
    let missing = d.root.join("no-such-mnt");
    assert_refused(&[], &d.ws, &missing, &["no-such-mnt"]);
    assert!(!missing.exists(), "the mountpoint must not be created");
}

#[test]
fn refuses_non_empty_mountpoint() {
    let d = dirs(Some(EXAMPLE));
    std::fs::write(d.mnt.join("stuff"), "x").unwrap();
    assert_refused(&[], &d.ws, &d.mnt, &["not an empty directory", "mnt"]);
    assert_eq!(std::fs::read(d.mnt.join("stuff")).unwrap(), b"x");
}

#[test]
fn refuses_mountpoint_that_is_a_file() {
    let d = dirs(Some(EXAMPLE));
    let f = d.root.join("file");
    std::fs::write(&f, "x").unwrap();
    assert_refused(&[], &d.ws, &f, &["not a directory"]);
}

#[test]
fn refuses_mountpoint_inside_workspace() {
    let d = dirs(Some(EXAMPLE));
    let inner = d.ws.join("inner");
    std::fs::create_dir(&inner).unwrap();
    assert_refused(&[], &d.ws, &inner, &["must not contain each other"]);
}

const TYPO: &str = "intents:
  - id: INT-001
    name: Typo
    status: IN_PROGRESS
    owned_scop:
      - \"src/**\"
";

#[test]
fn refuses_invalid_policy_with_location_and_hint() {
    let d = dirs(Some(TYPO));
    let err = assert_refused(
        &["--intent", "INT-001"],
        &d.ws,
        &d.mnt,
        &["owned_scop", "active_intents.yaml:5:5", "hint"],
    );
    assert!(err.contains("owned_scope"), "a did-you-mean: {err}");
}

#[test]
fn refuses_unparseable_policy() {
    let d = dirs(Some("intents: [\n  - id: X\n   name: : :\n"));
    let err = assert_refused(&[], &d.ws, &d.mnt, &["active_intents.yaml"]);
    // file:line:col somewhere in the message
    let has_loc = err.split("active_intents.yaml:").skip(1).any(|rest| {
        let mut it = rest.splitn(3, ':');
        let l = it.next().unwrap_or("");
        let c = it.next().unwrap_or("");
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_digit())
            && !c.is_empty()
            && c.chars().take_while(|c| c.is_ascii_digit()).count() > 0
    });
    assert!(has_loc, "no file:line:col in {err}");
}

#[test]
fn refuses_missing_policy() {
    let d = dirs(None);
    assert_refused(&[], &d.ws, &d.mnt, &["active_intents.yaml"]);
}

#[test]
fn refuses_unknown_intent() {
    let d = dirs(Some(EXAMPLE));
    let err = assert_refused(&["--intent", "NOPE"], &d.ws, &d.mnt, &["NOPE", "hint"]);
    // The hint lists what can be selected (and not the paused one).
    assert!(err.contains("INT-001") && err.contains("INT-002"), "{err}");
    assert!(
        !err.contains("INT-003"),
        "INT-003 is PAUSED, not selectable: {err}"
    );
}

#[test]
fn refuses_paused_intent() {
    let d = dirs(Some(EXAMPLE));
    let err = assert_refused(&["--intent", "INT-003"], &d.ws, &d.mnt, &["INT-003"]);
    assert!(
        err.contains("Paused") || err.contains("PAUSED") || err.contains("IN_PROGRESS"),
        "{err}"
    );
}

#[test]
fn refuses_second_mount_on_same_mountpoint() {
    let tm = TestMount::builder()
        .policy(EXAMPLE)
        .intent("INT-001")
        .mount();
    let out = mount_cmd(&["--foreground"], &tm.ws, &tm.mnt);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already an intentfs mount"), "{err}");
    // The first mount still serves.
    assert!(tm.status()["mount"]["workspace"].is_string());
}

/// The daemon pid recorded for a mount (root's runtime dir).
fn runtime_pid(mnt: &Path) -> Option<i32> {
    let key: String = mnt
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    std::fs::read_to_string(Path::new("/run/intentfs").join(key).join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) names a pid and a signal; no memory is involved.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn daemonized_mount_serves_at_once_and_intentfs_umount_unmounts() {
    // The builder asserts that .intentfs/status is readable right after the command returns.
    let mut tm = TestMount::builder()
        .policy(EXAMPLE)
        .intent("INT-001")
        .files(&[("src/auth/a.ts", "old")])
        .daemonize()
        .mount();
    assert!(is_mounted(&tm.mnt));
    std::fs::write(tm.m("src/auth/a.ts"), "new").unwrap();
    assert_eq!(tm.ws_bytes("src/auth/a.ts"), b"new");
    let pid = runtime_pid(&tm.mnt).expect("daemon pid in /run/intentfs");
    assert!(alive(pid));
    let out = intentfs().arg("umount").arg(&tm.mnt).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&tm.mnt));
    // `intentfs umount` waits for the daemon to close its ledger.
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "daemon still alive"
    );
    let l = tm.ledger();
    assert_eq!(l.first().unwrap()["mutation_type"], "MOUNT");
    assert_eq!(l.last().unwrap()["mutation_type"], "UNMOUNT", "{l:#?}");
    assert!(l
        .iter()
        .any(|e| e["mutation_type"] == "WRITE" && e["path"] == "src/auth/a.ts"));
    tm.stop();
    // The mountpoint is an ordinary empty directory again.
    assert_eq!(std::fs::read_dir(&tm.mnt).unwrap().count(), 0);
}

#[test]
fn plain_umount_works() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .daemonize()
        .mount();
    let pid = runtime_pid(&tm.mnt).expect("daemon pid");
    let st = Command::new("umount").arg(&tm.mnt).status().unwrap();
    assert!(st.success());
    assert!(!is_mounted(&tm.mnt));
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)),
        "daemon did not exit"
    );
    assert_eq!(tm.ledger().last().unwrap()["mutation_type"], "UNMOUNT");
}

#[test]
fn intentfs_umount_refuses_a_non_mount() {
    let d = dirs(None);
    let out = intentfs().arg("umount").arg(&d.mnt).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an intentfs mount"));
}

fn sigterm_unmounts(sig: i32) {
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("f", "1")])
        .mount();
    std::fs::write(tm.m("f"), "2").unwrap();
    let mut child = tm.take_child();
    // SAFETY: kill(2) names a pid and a signal; no memory is involved.
    unsafe { libc::kill(child.id() as i32, sig) };
    let mut status = None;
    wait_until(Duration::from_secs(10), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the daemon did not exit after signal {sig}")
    });
    assert!(status.success(), "exit status {status}");
    assert!(!is_mounted(&tm.mnt), "still mounted after signal {sig}");
    let l = tm.ledger();
    assert_eq!(l.last().unwrap()["mutation_type"], "UNMOUNT", "{l:#?}");
    assert_eq!(tm.ws_bytes("f"), b"2");
}

#[test]
fn sigterm_unmounts_cleanly() {
    sigterm_unmounts(libc::SIGTERM);
}

#[test]
fn sigint_unmounts_cleanly() {
    sigterm_unmounts(libc::SIGINT);
}

#[test]
fn remount_keeps_the_ledger_chain() {
    let mut tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    std::fs::write(tm.m("a"), "1").unwrap();
    tm.remount();
    std::fs::write(tm.m("b"), "2").unwrap();
    tm.stop();
    let l = tm.ledger();
    let kinds: Vec<_> = l
        .iter()
        .map(|e| e["mutation_type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "MOUNT").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "UNMOUNT").count(),
        2,
        "{kinds:?}"
    );
    // Every line's prev is the SHA-256 of the previous line (newline included).
    let text = std::fs::read_to_string(tm.w(LEDGER_REL)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(l[0]["prev"], "0".repeat(64));
    for w in lines.windows(2) {
        use sha2::Digest;
        let next: serde_json::Value = serde_json::from_str(w[1]).unwrap();
        let h = hex::encode(sha2::Sha256::digest(format!("{}\n", w[0]).as_bytes()));
        assert_eq!(next["prev"], h.as_str(), "chain broken after {}", w[0]);
    }
    let out = intentfs()
        .args(["ledger", "verify"])
        .arg(&tm.ws)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ledger verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn custom_policy_outside_workspace() {
    require_fuse();
    let d = dirs(None);
    let pol = d.root.join("team.yaml");
    std::fs::write(&pol, EXAMPLE).unwrap();
    let pol_s = pol.to_string_lossy().into_owned();
    let mut c = intentfs();
    c.args(["mount", "--policy", &pol_s, "--intent", "INT-002"])
        .arg(&d.ws)
        .arg(&d.mnt);
    let out = run_timeout(c, Duration::from_secs(20));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = std::fs::write(d.mnt.join("README.md"), "docs");
    let ctx = std::fs::read_to_string(d.mnt.join(".intentfs/context"));
    let st = Command::new(BIN)
        .arg("umount")
        .arg(&d.mnt)
        .status()
        .unwrap();
    assert!(st.success());
    r.unwrap();
    assert!(ctx.unwrap().contains("INT-002"));
    assert_eq!(std::fs::read(d.ws.join("README.md")).unwrap(), b"docs");
}

#[test]
fn check_policy_good() {
    let d = dirs(None);
    let p = d.root.join("p.yaml");
    std::fs::write(&p, EXAMPLE).unwrap();
    let out = intentfs().arg("check-policy").arg(&p).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("ok, 3 intent(s)"), "{s}");
    for needle in [
        "INT-001",
        "INT-002",
        "INT-003",
        "src/auth/**",
        "PAUSED",
        "IN_PROGRESS",
    ] {
        assert!(s.contains(needle), "missing {needle}: {s}");
    }
    // Alternative spellings are accepted.
    std::fs::write(
        &p,
        "active_intents:\n  - id: A\n    name: a\n    status: IN_PROGRESS\n    scope: [\"x/**\"]\n",
    )
    .unwrap();
    let out = intentfs().arg("check-policy").arg(&p).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("x/**"));
}

#[test]
fn check_policy_bad() {
    let d = dirs(None);
    let p = d.root.join("bad.yaml");
    std::fs::write(&p, TYPO).unwrap();
    let out = intentfs().arg("check-policy").arg(&p).output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("owned_scop"), "{e}");
    assert!(e.contains("bad.yaml:5:5"), "{e}");
    assert!(e.contains("hint"), "{e}");
    // Missing file.
    let out = intentfs()
        .arg("check-policy")
        .arg(d.root.join("nope.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.yaml"));
}

#[test]
fn help_mentions_the_options() {
    let out = intentfs().args(["mount", "--help"]).output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for o in [
        "--policy",
        "--intent",
        "--agent",
        "--allow-other",
        "--approver",
        "--foreground",
        "WORKSPACE",
        "MOUNTPOINT",
    ] {
        assert!(s.contains(o), "mount --help lacks {o}:\n{s}");
    }
    let out = intentfs().arg("--help").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for o in ["mount", "umount", "check-policy"] {
        assert!(s.contains(o), "--help lacks {o}:\n{s}");
    }
    // No subcommand: usage error, not a crash.
    let out = intentfs().output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn mountpoint_reports_the_backing_filesystem() {
    let tm = TestMount::builder().policy(ALLOW_ALL).intent("ALL").mount();
    let line = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(tm.mnt.to_str().unwrap()))
        .map(str::to_string)
        .expect("in /proc/mounts");
    assert!(line.contains("fuse"), "{line}");
    assert!(line.contains("intentfs"), "{line}");
    // The mount root is a different device than the workspace.
    let a = std::fs::metadata(&tm.mnt).unwrap();
    let b = std::fs::metadata(&tm.ws).unwrap();
    assert_ne!(a.dev(), b.dev());
}
