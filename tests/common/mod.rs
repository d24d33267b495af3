//! Test harness: mount a temp workspace through the real `intentfs` binary, act on it as an
//! agent would, unmount on drop.
//!
//! Every test gets its own temp directory (`ws/`, `mnt/`, the daemon's stderr), so tests can
//! run in parallel (cargo-nextest runs one process per test).

#![allow(dead_code)]

pub mod deploy;
pub mod fsops;

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering as AtOrd};
use std::time::{Duration, Instant};

/// The binary under test (built by cargo for the integration tests).
pub const BIN: &str = env!("CARGO_BIN_EXE_intentfs");
/// Intent `ALL`, scope `**`.
pub const ALLOW_ALL: &str = include_str!("../../policies/allow-all.yaml");
/// INT-001 `src/auth/**`, `src/middleware/jwt.ts`, `tests/auth/**`; INT-002 `docs/`,
/// `README.md`; INT-003 PAUSED.
pub const EXAMPLE: &str = include_str!("../../policies/example.yaml");

/// The example policy with `approval.out_of_scope: deny`: out-of-scope writes are refused
/// outright (SCOPE_VIOLATION) instead of asking a human, whatever `--approver` says.
pub fn example_deny() -> String {
    let s = EXAMPLE.replacen("out_of_scope: ask", "out_of_scope: deny", 1);
    assert_ne!(
        s, EXAMPLE,
        "policies/example.yaml no longer has `out_of_scope: ask`"
    );
    s
}

/// Workspace-relative location of the default policy file.
pub const POLICY_REL: &str = ".orchestration/active_intents.yaml";
/// Workspace-relative location of the default ledger file.
pub const LEDGER_REL: &str = ".orchestration/agent_trace.jsonl";

/// A command for the binary under test.
pub fn intentfs() -> Command {
    let mut c = Command::new(BIN);
    c.env("LC_ALL", "C").env_remove("DBUS_SESSION_BUS_ADDRESS");
    c
}

/// Is `path` a mountpoint right now (per /proc/mounts)?
pub fn is_mounted(path: &Path) -> bool {
    let p = path.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(p.as_str()))
}

/// Return from a mount test where FUSE is unavailable: without `/dev/fuse` (or where it
/// cannot be opened, as in a container that was not given the device) no mount can work,
/// so every mount test would fail for the machine's sake, not the code's. Every way the
/// tests mount reaches this first ([`Builder::mount`], [`deploy::Layout::with`], and the
/// few tests that run `intentfs mount` themselves), so the check lives in one place.
///
/// A test cannot return on its caller's behalf, so this ends the test's process with
/// success after printing the reason: under cargo-nextest (the project's runner, see
/// `.ci/run`) each test is its own process, and the test shows as passed with the message
/// on its stderr. (Under plain `cargo test` it ends the whole test binary the same way;
/// without FUSE its mount tests could not run anyway.)
pub fn require_fuse() {
    static FUSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let usable = *FUSE.get_or_init(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok()
    });
    if !usable {
        eprintln!("skipped: /dev/fuse is missing (mount tests need FUSE)");
        std::process::exit(0);
    }
}

/// Memory pressure, as far as a mount's nodes go: the kernel drops every unused dentry
/// and inode (`drop_caches`) every `every` until this is dropped, so it forgets nodes while
/// the test works (it sends `FORGET`s for them, and looks them up again from one name).
/// System-wide: the tests using it run alone (`.config/nextest.toml`). Needs root.
pub struct MemoryPressure {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl MemoryPressure {
    pub fn start(every: Duration) -> MemoryPressure {
        std::fs::write("/proc/sys/vm/drop_caches", "2")
            .expect("this test needs root: it makes the kernel forget nodes with drop_caches");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(AtOrd::Relaxed) {
                    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
                    n += 1;
                    std::thread::sleep(every);
                }
                n
            })
        };
        MemoryPressure {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop; how many times the caches were dropped.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, AtOrd::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap())
    }
}

impl Drop for MemoryPressure {
    fn drop(&mut self) {
        self.stop.store(true, AtOrd::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Poll `f` every 10 ms until it is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The errno of a failed result (panics on success, with `what`).
pub fn errno_of<T: std::fmt::Debug>(res: io::Result<T>, what: &str) -> i32 {
    match res {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: error without errno: {e}")),
    }
}

/// Run a `sh -c` script in `dir`, with the C locale.
pub fn sh_in(dir: &Path, script: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "tester")
        .env("GIT_AUTHOR_EMAIL", "tester@example.com")
        .env("GIT_COMMITTER_NAME", "tester")
        .env("GIT_COMMITTER_EMAIL", "tester@example.com")
        .stdin(Stdio::null())
        .output()
        .expect("running sh")
}

/// Panic with the script's output unless it succeeded; return its stdout.
pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Panic unless the script failed with "Permission denied" on stderr.
pub fn failed_eacces(out: &Output, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Permission denied"),
        "{what}: expected a failure with 'Permission denied', got {}:\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        err
    );
}

/// Set up a workspace before mounting.
type Setup = Box<dyn FnOnce(&Path)>;

/// Builds a [`TestMount`].
pub struct Builder {
    policy: Option<String>,
    intent: Option<String>,
    agent: String,
    args: Vec<OsString>,
    files: Vec<(String, Vec<u8>)>,
    setup: Vec<Setup>,
    daemonize: bool,
    shm: bool,
    envs: Vec<(OsString, OsString)>,
    mnt_name: String,
}

impl Builder {
    /// The policy YAML, written to `ws/.orchestration/active_intents.yaml`.
    pub fn policy(mut self, yaml: &str) -> Self {
        self.policy = Some(yaml.to_string());
        self
    }
    /// `--intent ID`.
    pub fn intent(mut self, id: &str) -> Self {
        self.intent = Some(id.to_string());
        self
    }
    /// `--agent NAME`.
    pub fn agent(mut self, name: &str) -> Self {
        self.agent = name.to_string();
        self
    }
    /// Any extra argument to `intentfs mount` (`{ws}` and `{root}` are replaced by the
    /// workspace and temp dir paths).
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }
    /// Files to create in the workspace (parents created).
    pub fn files(mut self, files: &[(&str, &str)]) -> Self {
        for (p, c) in files {
            self.files.push((p.to_string(), c.as_bytes().to_vec()));
        }
        self
    }
    /// One more workspace file (for lists built in a loop).
    pub fn file(mut self, path: &str, content: &str) -> Self {
        self.files
            .push((path.to_string(), content.as_bytes().to_vec()));
        self
    }
    /// Arbitrary workspace preparation, run after the files are written.
    pub fn setup(mut self, f: impl FnOnce(&Path) + 'static) -> Self {
        self.setup.push(Box::new(f));
        self
    }
    /// Put the workspace on tmpfs (`/dev/shm`, when usable): creating tens of thousands of
    /// files there is much faster than on a journaling disk.
    pub fn on_tmpfs(mut self) -> Self {
        self.shm = true;
        self
    }
    /// An environment variable for the daemon.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }
    /// The mountpoint directory's name in the temp dir (`mnt` unless set): for mountpoints
    /// whose path the kernel escapes in /proc/self/mountinfo (a space, say).
    pub fn mountpoint_name(mut self, name: &str) -> Self {
        self.mnt_name = name.to_string();
        self
    }
    /// Use the daemonizing `intentfs mount` (no `--foreground`).
    pub fn daemonize(mut self) -> Self {
        self.daemonize = true;
        self
    }

    pub fn mount(self) -> TestMount {
        require_fuse();
        let shm = Path::new("/dev/shm");
        let dir = if self.shm && shm.is_dir() {
            tempfile::Builder::new()
                .prefix("intentfs-test-")
                .tempdir_in(shm)
                .ok()
        } else {
            None
        };
        let mut dir = dir.unwrap_or_else(|| {
            tempfile::Builder::new()
                .prefix("intentfs-test-")
                .tempdir()
                .expect("tempdir")
        });
        // INTENTFS_TEST_KEEP=1: keep the workspace, ledger and daemon log for a post-mortem.
        if std::env::var_os("INTENTFS_TEST_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("INTENTFS_TEST_KEEP: keeping {}", dir.path().display());
        }
        let root = dir.path().canonicalize().unwrap();
        let ws = root.join("ws");
        let mnt = root.join(&self.mnt_name);
        std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        if let Some(p) = &self.policy {
            std::fs::write(ws.join(POLICY_REL), p).unwrap();
        }
        for (p, c) in &self.files {
            let path = ws.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, c).unwrap();
        }
        for f in self.setup {
            f(&ws);
        }
        let mut args = vec![OsString::from("mount")];
        if let Some(i) = &self.intent {
            args.push("--intent".into());
            args.push(i.into());
        }
        args.push("--agent".into());
        args.push(self.agent.clone().into());
        // `{ws}` and `{root}` in arguments stand for the workspace and the temp dir.
        for a in &self.args {
            let t = a
                .to_string_lossy()
                .replace("{ws}", &ws.to_string_lossy())
                .replace("{root}", &root.to_string_lossy());
            args.push(t.into());
        }
        // Tests answer approvals unattended (refuse at once) unless they choose a channel:
        // the daemon's own default (desktop or cli) would wait for a person.
        if !args
            .iter()
            .any(|a| a.to_string_lossy().starts_with("--approver"))
        {
            args.push("--approver".into());
            args.push("deny".into());
        }
        let mut tm = TestMount {
            ws,
            mnt,
            root,
            args,
            envs: self.envs,
            daemonize: self.daemonize,
            child: None,
            seen_denials: AtomicU64::new(0),
            _dir: dir,
        };
        tm.start();
        tm
    }
}

/// A live intentfs mount of a temp workspace.
pub struct TestMount {
    /// The backing workspace.
    pub ws: PathBuf,
    /// The mountpoint.
    pub mnt: PathBuf,
    /// The temp directory holding both (and the daemon's stderr).
    pub root: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    daemonize: bool,
    child: Option<Child>,
    seen_denials: AtomicU64,
    _dir: tempfile::TempDir,
}

impl TestMount {
    pub fn builder() -> Builder {
        Builder {
            policy: None,
            intent: None,
            agent: "tester".into(),
            args: Vec::new(),
            files: Vec::new(),
            setup: Vec::new(),
            daemonize: false,
            shm: false,
            envs: Vec::new(),
            mnt_name: "mnt".into(),
        }
    }

    /// Where the daemon's stderr goes (foreground mode), or its log (daemon mode).
    pub fn stderr_path(&self) -> PathBuf {
        self.root.join("daemon.stderr")
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// Mount (again) with the arguments given to the builder.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_path())
            .unwrap();
        let mut cmd = intentfs();
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)));
        if self.daemonize {
            cmd.arg("--log").arg(self.stderr_path());
            cmd.arg(&self.ws).arg(&self.mnt);
            let out = cmd
                .stdin(Stdio::null())
                .output()
                .expect("running intentfs mount");
            assert!(
                out.status.success(),
                "intentfs mount failed ({}): {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.stderr_text()
            );
            // A daemonized mount must serve as soon as the command returned.
            assert!(
                std::fs::read(self.mnt.join(".intentfs/status")).is_ok(),
                "the daemonized mount did not serve right after `intentfs mount` returned"
            );
            return;
        }
        cmd.arg("--foreground").arg(&self.ws).arg(&self.mnt);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning intentfs mount --foreground");
        let status = self.mnt.join(".intentfs/status");
        let start = Instant::now();
        loop {
            if std::fs::read(&status).is_ok() {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "intentfs mount --foreground exited ({st}) before the mount was ready:\n{}",
                    self.stderr_text()
                );
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                panic!(
                    "the mount was not ready after 10 s:\n{}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    /// Unmount and wait for the daemon to exit (it writes the UNMOUNT ledger entry last).
    pub fn stop(&mut self) {
        // `intentfs umount` waits for the daemon's pid to disappear; a foreground daemon is
        // our child, so reap it meanwhile (a zombie still answers kill(pid, 0)).
        let mut umount = None;
        if is_mounted(&self.mnt) {
            umount = intentfs()
                .arg("umount")
                .arg(&self.mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .ok();
        }
        let start = Instant::now();
        let mut child_done = self.child.is_none();
        let mut umount_ok = umount.is_none();
        loop {
            if !child_done {
                if let Some(c) = self.child.as_mut() {
                    child_done = matches!(c.try_wait(), Ok(Some(_)) | Err(_));
                }
            }
            if let Some(u) = umount.as_mut() {
                match u.try_wait() {
                    Ok(Some(st)) => {
                        umount_ok = st.success();
                        umount = None;
                        if !umount_ok {
                            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                        }
                    }
                    Ok(None) => {}
                    Err(_) => umount = None,
                }
            }
            if child_done && umount.is_none() {
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                if let Some(mut u) = umount.take() {
                    let _ = u.kill();
                    let _ = u.wait();
                }
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                if let Some(c) = self.child.as_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = umount_ok;
        self.child = None;
    }

    /// Unmount and mount again with the same arguments.
    pub fn remount(&mut self) {
        self.stop();
        self.start();
    }

    /// The pid of the `--foreground` daemon.
    pub fn daemon_pid(&self) -> u32 {
        self.child.as_ref().expect("a --foreground mount").id()
    }

    /// `kill -9` the `--foreground` daemon, then detach its dead mount (`umount -l`).
    pub fn kill_daemon(&mut self) {
        let mut d = self.take_child();
        d.kill().unwrap(); // SIGKILL
        d.wait().unwrap();
        self.detach_dead();
    }

    /// `umount -l` of the mount whose daemon is gone.
    pub fn detach_dead(&self) {
        let st = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .status()
            .unwrap();
        assert!(st.success(), "umount -l of the dead mount");
    }

    /// Take the foreground child (the caller then owns its lifetime).
    pub fn take_child(&mut self) -> Child {
        self.child.take().expect("a --foreground mount")
    }

    /// A path in the mount.
    pub fn m(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// A path in the workspace.
    pub fn w(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// The bytes of a workspace file (read directly, not through the mount).
    pub fn ws_bytes(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.w(rel)).unwrap_or_else(|e| panic!("reading ws/{rel}: {e}"))
    }

    /// Run `sh -c script` with the mount as the working directory.
    pub fn sh(&self, script: &str) -> Output {
        sh_in(&self.mnt, script)
    }

    /// Run a script that must succeed; return its stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        ok(self.sh(script), script)
    }

    /// A control file of the mount, read through the mount.
    pub fn ctl(&self, name: &str) -> String {
        std::fs::read_to_string(self.mnt.join(".intentfs").join(name))
            .unwrap_or_else(|e| panic!("reading .intentfs/{name}: {e}"))
    }

    /// `.intentfs/last_error` as JSON.
    pub fn last_error(&self) -> serde_json::Value {
        let t = self.ctl("last_error");
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("last_error is not JSON ({e}): {t}"))
    }

    /// The approval requests waiting for a human: `intentfs approvals --json MNT`.
    pub fn pending(&self) -> Vec<serde_json::Value> {
        let out = intentfs()
            .args(["approvals", "--json"])
            .arg(&self.mnt)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = ok(out, "intentfs approvals --json");
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("approvals --json is not a JSON array ({e}): {text}"))
    }

    /// The questions waiting for a human once there are `n` of them (within `within`):
    /// fails the test, showing the listing, if there are not.
    pub fn pending_count(&self, n: usize, within: Duration) -> Vec<serde_json::Value> {
        let mut listed = Vec::new();
        let all = wait_until(within, || {
            listed = self.pending();
            listed.len() == n
        });
        assert!(all, "expected {n} pending requests, got {listed:#?}");
        listed
    }

    /// `.intentfs/status` as JSON.
    pub fn status(&self) -> serde_json::Value {
        let t = self.ctl("status");
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("status is not JSON ({e}): {t}"))
    }

    /// Denials of the default identity so far (from `status`).
    pub fn denials(&self) -> u64 {
        self.status()["identities"][0]["denials"]
            .as_u64()
            .expect("status.identities[0].denials")
    }

    /// Every line of the ledger, parsed (after the closes the daemon still owes, with
    /// `--record async`).
    pub fn ledger(&self) -> Vec<serde_json::Value> {
        self.settle();
        read_ledger(&self.w(LEDGER_REL))
    }

    /// Mounted with `--record async` (the option, or INTENTFS_RECORD=async for a whole
    /// suite): closes are recorded just after they return.
    pub fn records_async(&self) -> bool {
        let opt = self
            .args
            .windows(2)
            .any(|w| w[0] == "--record" && w[1] == "async");
        opt || suite_records_async()
    }

    /// With `--record async`, wait until the closes made so far are on record: opening
    /// `.intentfs/status` does (a dead mount answers at once).
    pub fn settle(&self) {
        if self.records_async() {
            let _ = std::fs::File::open(self.m(".intentfs/status"));
        }
    }

    /// Ledger entries of completed mutations: not MOUNT/UNMOUNT/DENIAL, nor a handle's
    /// WRITE_BEGIN (its WRITE completes it), nor governance events (INTENT, IDENTITY, REF).
    pub fn mutations(&self) -> Vec<serde_json::Value> {
        self.ledger()
            .into_iter()
            .filter(|e| {
                !matches!(
                    e["mutation_type"].as_str(),
                    Some(
                        "MOUNT"
                            | "UNMOUNT"
                            | "DENIAL"
                            | "WRITE_BEGIN"
                            | "INTENT"
                            | "IDENTITY"
                            | "REF"
                    )
                )
            })
            .collect()
    }

    /// Wait until a ledger entry satisfies `f` (denials are ledgered asynchronously).
    pub fn wait_ledger(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_ledger_in(&self.w(LEDGER_REL), what, f)
    }

    /// Check that `res` failed with EACCES and that a *new* denial with `code` was recorded
    /// in `last_error`. Returns `last_error`.
    pub fn assert_denied<T: std::fmt::Debug>(
        &self,
        res: io::Result<T>,
        code: &str,
    ) -> serde_json::Value {
        let e = errno_of(res, code);
        assert_eq!(
            e,
            libc::EACCES,
            "expected EACCES ({code}), got {}",
            io::Error::from_raw_os_error(e)
        );
        self.assert_new_denial(code)
    }

    /// A new denial since the last check, with this code. Returns `last_error`.
    pub fn assert_new_denial(&self, code: &str) -> serde_json::Value {
        let n = self.denials();
        assert!(
            n > self.seen_denials.load(AtOrd::Relaxed),
            "expected a new {code} denial, but the denial count did not grow ({n})"
        );
        self.seen_denials.store(n, AtOrd::Relaxed);
        let le = self.last_error();
        assert_eq!(le["code"], code, "last_error: {le:#}");
        for k in ["path", "message", "remedy", "op"] {
            assert!(le.get(k).is_some(), "last_error lacks {k}: {le:#}");
        }
        assert!(
            !le["remedy"].as_str().unwrap_or("").is_empty(),
            "empty remedy: {le:#}"
        );
        le
    }

    /// Like [`assert_denied`] for a shell script: it must fail with "Permission denied".
    pub fn assert_sh_denied(&self, script: &str, code: &str) -> serde_json::Value {
        let out = self.sh(script);
        failed_eacces(&out, script);
        self.assert_new_denial(code)
    }

    /// The inode number of a path (not following symlinks).
    pub fn ino(p: &Path) -> u64 {
        std::fs::symlink_metadata(p)
            .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
            .ino()
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait (5 s at most) until an entry of the ledger at `path` satisfies `f` (some entries
/// are written asynchronously): that entry, or a panic naming `what`.
pub fn wait_ledger_in(
    path: &Path,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut found = None;
    wait_until(Duration::from_secs(5), || {
        found = read_ledger(path).into_iter().find(|e| f(e));
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("no ledger entry {what}; ledger: {:#?}", read_ledger(path)))
}

/// Run with a timeout (so a hung mount cannot hang the suite).
pub fn run_timeout(mut c: Command, t: Duration) -> Output {
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {c:?}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(t) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{c:?} did not finish within {t:?}");
        }
    }
}

/// `"sha256:<hex>"` of `b`, as entries name content.
pub fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// A policy of two intents in progress: `ALL` (every path) and `DOCS` (`docs/**`).
pub const ALL_AND_DOCS: &str = r#"
intents:
  - id: ALL
    name: everything
    status: IN_PROGRESS
    owned_scope: ["**"]
  - id: DOCS
    name: docs only
    status: IN_PROGRESS
    owned_scope: ["docs/**"]
"#;

/// The suite runs with INTENTFS_RECORD=async (`.ci/run`'s third pass): every mount records
/// closes after their reply. A test whose subject is `--record sync`'s promise (a returned
/// close is on record, even across `kill -9`) says so and passes over.
pub fn suite_records_async() -> bool {
    std::env::var("INTENTFS_RECORD").is_ok_and(|v| v == "async")
}

/// [`suite_records_async`], said in the test's output: true when the test should return.
pub fn skip_under_record_async(why: &str) -> bool {
    if suite_records_async() {
        eprintln!("skipped under INTENTFS_RECORD=async: {why}");
        return true;
    }
    false
}

/// Parse every line of a JSONL ledger (empty when missing).
pub fn read_ledger(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // A line is on record once its newline is: read while the daemon appends, the last
    // one may be caught half written (measured: 10 reads in 71,626 while a mount recorded
    // 3,000 closes), which is not a broken ledger.
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    complete
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("ledger line {l:?}: {e}")))
        .collect()
}

/// Write a file creating its parents.
pub fn put(path: &Path, content: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// Compact description of file contents for tree comparisons: the text when short,
/// else its length and a hash prefix.
pub fn describe(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if s.len() <= 64 => format!("{s:?}"),
        _ => {
            use sha2::Digest;
            let h = hex::encode(sha2::Sha256::digest(b));
            format!("{} bytes sha256:{}", b.len(), &h[..16])
        }
    }
}

/// `(relative path, kind, contents or link target, permission bits)` of every entry below
/// `root`, sorted, skipping the `skip` names at the top level.
pub fn tree(root: &Path, skip: &[&str]) -> Vec<(String, &'static str, String, u32)> {
    fn walk(
        root: &Path,
        dir: &Path,
        skip: &[&str],
        out: &mut Vec<(String, &'static str, String, u32)>,
    ) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if dir == root && skip.iter().any(|s| *s == n) {
                continue;
            }
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mode = md.mode() & 0o7777;
            let ft = md.file_type();
            if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, "link", t.to_string_lossy().into_owned(), 0));
            } else if ft.is_dir() {
                out.push((rel, "dir", String::new(), mode));
                walk(root, &p, skip, out);
            } else {
                out.push((rel, "file", describe(&std::fs::read(&p).unwrap()), mode));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, skip, &mut out);
    out
}

/// The real Python interpreter (not a pyenv shim, which depends on `$HOME`).
pub fn python() -> &'static str {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by these tests");
        let p = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(!p.is_empty(), "python3 did not tell its executable");
        p
    })
}
