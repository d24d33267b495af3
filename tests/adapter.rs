//! The FUSE adapter (`src/fuse/`) on a real mount: timestamps before the epoch and at
//! the ends of the 64-bit range, the read-ahead tuning of a mountpoint whose path the
//! kernel escapes, and the mount tests' skip where FUSE is missing.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// `utimensat(path, {atime, mtime})` with explicit `(seconds, nanoseconds)` pairs: std's
/// `set_times` takes `SystemTime`s, which cannot say `i64::MIN` seconds everywhere.
fn utimensat(path: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: a valid C string and a two-element timespec array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// `(mtime seconds, mtime nanoseconds, atime seconds, atime nanoseconds)` by `lstat`.
fn times(p: &Path) -> (i64, i64, i64, i64) {
    let md = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display()));
    (md.mtime(), md.mtime_nsec(), md.atime(), md.atime_nsec())
}

/// 1.5 s before the epoch is `{tv_sec: -2, tv_nsec: 500000000}`: the half second must
/// survive both ways, set through the mount (SETATTR) and read through it (the
/// attributes of a file set so natively).
#[test]
fn pre_epoch_times_keep_their_fraction_through_the_mount() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("native.txt", "n\n"), ("set.txt", "s\n")])
        .setup(|ws| utimensat(&ws.join("native.txt"), (-1, 250_000_000), (-2, 500_000_000)))
        .mount();

    // Read: the backing file's times, as they are.
    assert_eq!(
        times(&tm.w("native.txt")),
        (-2, 500_000_000, -1, 250_000_000)
    );
    assert_eq!(
        times(&tm.m("native.txt")),
        (-2, 500_000_000, -1, 250_000_000),
        "a pre-epoch time read through the mount"
    );

    // Write: what the caller set reaches the backing file, and reads back the same.
    utimensat(&tm.m("set.txt"), (-3, 1), (-2, 500_000_000));
    assert_eq!(
        times(&tm.w("set.txt")),
        (-2, 500_000_000, -3, 1),
        "a pre-epoch time set through the mount, on the backing file"
    );
    assert_eq!(times(&tm.m("set.txt")), times(&tm.w("set.txt")));

    // What `touch -d @-1.5` does (GNU date reads fractional epoch seconds).
    tm.sh_ok("touch -d @-1.5 set.txt");
    assert_eq!(times(&tm.w("set.txt")).0, -2);
    assert_eq!(times(&tm.w("set.txt")).1, 500_000_000);
    assert_eq!(times(&tm.m("set.txt")), times(&tm.w("set.txt")));
}

/// tmpfs keeps any 64-bit time: a file whose mtime is `i64::MIN` seconds is answered with
/// that time (the earliest a reply can carry), and the daemon goes on serving.
#[test]
fn an_mtime_of_i64_min_seconds_is_answered_and_the_daemon_keeps_serving() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .on_tmpfs()
        .files(&[("old.txt", "o\n"), ("late.txt", "l\n")])
        .setup(|ws| {
            utimensat(&ws.join("old.txt"), (i64::MIN, 0), (i64::MIN, 0));
            utimensat(
                &ws.join("late.txt"),
                (i64::MAX, 999_999_999),
                (i64::MAX, 999_999_999),
            );
        })
        .mount();
    if times(&tm.w("old.txt")).0 != i64::MIN {
        eprintln!(
            "skipped: the workspace's filesystem clamps times ({}: not tmpfs?)",
            tm.ws.display()
        );
        return;
    }
    for name in ["old.txt", "late.txt"] {
        assert_eq!(
            times(&tm.m(name)),
            times(&tm.w(name)),
            "{name} through the mount"
        );
    }
    // A listing with attributes (readdirplus) converts the same times.
    let listed = tm.sh_ok("ls -l --time-style=+%s old.txt late.txt");
    assert!(listed.contains("old.txt"), "{listed}");
    // Still serving, with the same daemon.
    let pid = tm.daemon_pid();
    assert!(tm.status()["mount"]["workspace"].is_string());
    assert_eq!(std::fs::read(tm.m("old.txt")).unwrap(), b"o\n");
    // SAFETY: signal 0 only checks that the process exists.
    assert_eq!(
        // SAFETY: kill(2) names a pid and a signal; no memory is involved.
        unsafe { libc::kill(pid as i32, 0) },
        0,
        "the daemon is gone"
    );
}

/// The daemon raises the mount's read-ahead to 1 MiB through its backing device info in
/// sysfs, found by the mountpoint in /proc/self/mountinfo — where a space is `\040`.
#[test]
fn read_ahead_is_raised_on_a_mountpoint_with_a_space() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .mountpoint_name("mount point")
        .mount();
    // A FUSE mount's device is 0:<minor>, and so is its bdi.
    let dev = std::fs::metadata(&tm.mnt).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let ra = Path::new("/sys/class/bdi")
        .join(format!("{major}:{minor}"))
        .join("read_ahead_kb");
    let Ok(kb) = std::fs::read_to_string(&ra) else {
        eprintln!("skipped: {} is not readable here", ra.display());
        return;
    };
    assert_eq!(
        kb.trim(),
        "1024",
        "{} of the mount at {:?}",
        ra.display(),
        tm.mnt
    );
}

/// Not a test of its own: the mount test that `a_mount_test_without_dev_fuse_is_skipped`
/// runs where `/dev/fuse` cannot be opened.
#[test]
fn mounts_and_serves() {
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .files(&[("a.txt", "a\n")])
        .mount();
    assert_eq!(std::fs::read(tm.m("a.txt")).unwrap(), b"a\n");
}

/// Without `/dev/fuse` a mount test returns early, saying why, instead of failing: run
/// `mounts_and_serves` in a mount namespace whose `/dev` is a fresh tmpfs holding only the
/// few devices a process needs.
#[test]
fn a_mount_test_without_dev_fuse_is_skipped() {
    let have = |c: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {c} >/dev/null"))
            .status()
            .is_ok_and(|s| s.success())
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have("unshare") {
        eprintln!("skipped: needs root and unshare (a private mount namespace)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3 \
             && mknod -m 666 /dev/zero c 1 5 && mknod -m 666 /dev/urandom c 1 9 \
             && ln -s /proc/self/fd /dev/fd && test ! -e /dev/fuse \
             && exec \"$1\" --exact mounts_and_serves --nocapture --test-threads 1",
        )
        .arg("sh")
        .arg(&exe);
    let out = run_timeout(c, std::time::Duration::from_secs(60));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the mount test failed without /dev/fuse ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("skipped: /dev/fuse is missing (mount tests need FUSE)"),
        "no skip message:\n{stderr}"
    );
    // It returned before its assertions (libtest never got to report it).
    assert!(stdout.contains("running 1 test"), "{stdout}");
    assert!(!stdout.contains("test result"), "{stdout}");
}

/// Unmounts a tmpfs inside a test mount's workspace once the test mount is gone (declared
/// before the `TestMount`, so dropped after it), and removes the temp dir its mount kept.
struct InnerTmpfs(std::rc::Rc<std::cell::RefCell<Option<std::path::PathBuf>>>);

impl Drop for InnerTmpfs {
    fn drop(&mut self) {
        if let Some(p) = self.0.borrow_mut().take() {
            let _ = Command::new("umount").arg("-l").arg(&p).status();
            // ws/small -> the test mount's temp dir, which could not be removed with a
            // mount inside.
            if let Some(root) = p.parent().and_then(Path::parent) {
                let _ = std::fs::remove_dir_all(root);
            }
        }
    }
}

/// A failure of the backing store reaches the daemon's log with the opcode and the errno
/// (the caller only sees the errno); an ordinary answer such as a missing name does not,
/// at the default level.
#[test]
fn a_backing_enospc_is_logged_with_its_opcode_and_a_missing_name_is_not() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (mounts a small tmpfs)");
        return;
    }
    let small = InnerTmpfs(Default::default());
    let at = small.0.clone();
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .setup(move |ws| {
            let dir = ws.join("small");
            std::fs::create_dir_all(&dir).unwrap();
            let st = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(st.success(), "mount tmpfs on {}", dir.display());
            *at.borrow_mut() = Some(dir);
        })
        .mount();

    let e = std::fs::metadata(tm.m("no-such-file")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = std::fs::write(tm.m("small/big"), vec![7u8; 1 << 20]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");

    let log = std::fs::read_to_string(tm.stderr_path()).unwrap();
    let enospc: Vec<&str> = log.lines().filter(|l| l.contains("ENOSPC")).collect();
    assert!(
        enospc
            .iter()
            .any(|l| l.contains("WARN") && l.contains("write: ENOSPC")),
        "no warning naming the write and ENOSPC in the daemon's log:\n{log}"
    );
    assert!(!log.contains("ENOENT"), "a missing name was logged:\n{log}");
}
