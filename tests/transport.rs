//! `intentfs mount --transport`: FUSE-over-io_uring serves the same operations as /dev/fuse
//! (the requests really go through the ring threads), `auto` falls back to /dev/fuse when
//! the kernel does not offer the ring, and an explicit `io-uring` then refuses to mount.
//!
//! The ring needs the `fuse` module's `enable_uring` parameter (Linux 6.14+); the test sets
//! it for its duration and puts the old value back, and skips where it cannot.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets `enable_uring` for the test's lifetime; the previous value comes back on drop.
struct UringParam {
    old: String,
}

impl UringParam {
    /// `None` (after saying why) where the parameter is missing or cannot be written.
    fn set(on: bool) -> Option<UringParam> {
        let old = match std::fs::read_to_string(ENABLE_URING) {
            Ok(v) => v.trim().to_string(),
            Err(e) => {
                eprintln!("skipped: {ENABLE_URING}: {e} (a kernel without FUSE-over-io_uring)");
                return None;
            }
        };
        if let Err(e) = std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }) {
            eprintln!("skipped: cannot set {ENABLE_URING}: {e} (needs root)");
            return None;
        }
        Some(UringParam { old })
    }

    fn switch(&self, on: bool) {
        std::fs::write(ENABLE_URING, if on { "Y" } else { "N" }).unwrap();
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING, &self.old);
    }
}

/// Voluntary context switches of the daemon's ring threads (`fuser-ring-*`), summed.
fn ring_switches(pid: u32) -> u64 {
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-ring-") {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        n += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map_or(0, |v| v.trim().parse::<u64>().unwrap());
    }
    n
}

fn log_of(tm: &TestMount) -> String {
    std::fs::read_to_string(tm.stderr_path()).unwrap_or_default()
}

/// A few ordinary operations through the mount, checked against the backing directory.
fn file_operations(tm: &TestMount) {
    let big: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    std::fs::write(tm.m("big.bin"), &big).unwrap();
    assert_eq!(std::fs::read(tm.m("big.bin")).unwrap(), big);
    assert_eq!(tm.ws_bytes("big.bin"), big);
    std::fs::create_dir(tm.m("d")).unwrap();
    std::fs::write(tm.m("d/new.txt"), "over the ring\n").unwrap();
    std::fs::rename(tm.m("d/new.txt"), tm.m("d/renamed.txt")).unwrap();
    let names: Vec<String> = std::fs::read_dir(tm.m("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["renamed.txt"]);
    assert_eq!(tm.ws_bytes("d/renamed.txt"), b"over the ring\n");
    assert_eq!(std::fs::read_to_string(tm.m("hello.txt")).unwrap(), "hi\n");
    std::fs::remove_file(tm.m("d/renamed.txt")).unwrap();
    std::fs::remove_dir(tm.m("d")).unwrap();
    assert!(!Path::new(&tm.w("d")).exists());
    // Governance answers over the ring too: the ledger is not writable through the mount.
    assert!(std::fs::write(tm.m(LEDGER_REL), "x").is_err());
}

/// `mount.transport` in `.intentfs/status`.
fn transport_in_status(tm: &TestMount) -> String {
    let text = std::fs::read_to_string(tm.m(".intentfs/status")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["mount"]["transport"].as_str().unwrap_or("").to_owned()
}

#[test]
fn io_uring_transport_serves_and_auto_falls_back() {
    require_fuse();
    let Some(param) = UringParam::set(true) else {
        return;
    };

    // io-uring: served by the ring threads.
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .arg("--transport")
        .arg("io-uring")
        .files(&[("hello.txt", "hi\n")])
        .mount();
    let log = log_of(&tm);
    assert!(log.contains("transport: io-uring"), "daemon log:\n{log}");
    assert!(
        transport_in_status(&tm).starts_with("io-uring ("),
        "{}",
        transport_in_status(&tm)
    );
    let before = ring_switches(tm.daemon_pid());
    file_operations(&tm);
    let after = ring_switches(tm.daemon_pid());
    // Each request wakes a ring thread: dozens of operations, dozens of switches at least.
    assert!(
        after >= before + 20,
        "the ring threads did not serve the requests ({before} -> {after} switches)"
    );
    tm.stop();
    assert!(!is_mounted(&tm.mnt), "still mounted after stop");

    // auto without the kernel's offer: /dev/fuse, and the log says why.
    param.switch(false);
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .arg("--transport")
        .arg("auto")
        .files(&[("hello.txt", "hi\n")])
        .mount();
    let log = log_of(&tm);
    assert!(
        log.contains("transport: /dev/fuse (io-uring unavailable"),
        "daemon log:\n{log}"
    );
    assert!(transport_in_status(&tm).starts_with("/dev/fuse (io-uring unavailable"));
    file_operations(&tm);
    assert_eq!(ring_switches(tm.daemon_pid()), 0, "no ring thread expected");
    drop(tm);

    // An explicit io-uring refuses to mount without it.
    let dir = tempfile::tempdir().unwrap();
    let (ws, mnt) = (dir.path().join("ws"), dir.path().join("mnt"));
    std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(ws.join(POLICY_REL), ALLOW_ALL).unwrap();
    let mut c = intentfs();
    c.args(["mount", "--foreground", "--transport", "io-uring"])
        .arg(&ws)
        .arg(&mnt);
    let out = run_timeout(c, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted without the ring: {err}");
    assert!(err.contains("FUSE_OVER_IO_URING"), "stderr: {err}");
    assert!(!is_mounted(&mnt), "left mounted");
}
