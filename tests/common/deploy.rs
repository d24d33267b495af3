//! Deployment-shaped layouts for tests that need root: the workspace under a directory
//! only its owner can enter, the mount where other uids (agents) reach it, agents started
//! under another uid. Shared by the container and adversarial-agent tests.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::*;

/// The uid and gid agents run as.
pub const AGENT_UID: u32 = 1000;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd} >/dev/null"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Print why a test does not run here; true when it should return early.
pub fn skip_unless(cond: bool, why: &str) -> bool {
    if !cond {
        eprintln!("SKIPPED: {why}");
    }
    !cond
}

pub fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn chown_r(p: &Path, uid: u32) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success(), "chown -R {}", p.display());
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The layout the docs recommend: the workspace under a directory only its owner (root)
/// can enter, the mountpoint where other uids can reach it.
///
/// ```text
/// root/            0755
///   private/       0700   <- other uids stop here
///     ws/          0755   the workspace (a git repo, with the example policy)
///   mnt/           0755   the mountpoint
/// ```
pub struct Layout {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub ws: PathBuf,
    pub mnt: PathBuf,
}

impl Layout {
    pub fn new() -> Layout {
        Layout::with(&example_deny(), &[])
    }

    /// The layout with this policy and these extra files (committed to its git repository).
    pub fn with(policy: &str, files: &[(&str, &str)]) -> Layout {
        require_fuse();
        let dir = tempfile::Builder::new()
            .prefix("intentfs-containers-")
            .tempdir()
            .unwrap();
        let root = dir.path().canonicalize().unwrap();
        let private = root.join("private");
        let ws = private.join("ws");
        let mnt = root.join("mnt");
        std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        std::fs::write(ws.join(POLICY_REL), policy).unwrap();
        put(
            &ws.join("src/auth/session.ts"),
            "export const session = 1;\n",
        );
        put(&ws.join("docs/index.md"), "# Docs\n");
        for (p, c) in files {
            put(&ws.join(p), c);
        }
        ok(
            sh_in(
                &ws,
                "git init -q && git add -A && git commit -qm init && git status --porcelain",
            ),
            "git init",
        );
        chmod(&root, 0o755);
        chmod(&private, 0o700);
        chmod(&ws, 0o755);
        chmod(&mnt, 0o755);
        Layout {
            _dir: dir,
            root,
            ws,
            mnt,
        }
    }

    /// `intentfs mount ARGS... WS MNT` (daemonized: returns once the mount serves), and
    /// what it said.
    pub fn mount(&self, args: &[&str]) -> (Mount, Output) {
        self.mount_with(args, &[])
    }

    pub fn ledger(&self) -> Vec<serde_json::Value> {
        read_ledger(&self.ws.join(LEDGER_REL))
    }

    pub fn wait_ledger(
        &self,
        what: &str,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        wait_ledger_in(&self.ws.join(LEDGER_REL), what, f)
    }
}

/// A live mount, unmounted on drop (`intentfs umount`, else a lazy `umount -l`).
pub struct Mount {
    pub mnt: PathBuf,
    /// Unmount with umount(8) only: `intentfs umount` waits for the daemon's recorded pid,
    /// which for a daemon in its own pid namespace is a pid of that namespace.
    pub plain: bool,
}

impl Mount {
    pub fn new(mnt: &Path) -> Mount {
        Mount {
            mnt: mnt.to_path_buf(),
            plain: false,
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !is_mounted(&self.mnt) {
            return;
        }
        if self.plain {
            let _ = Command::new("umount").arg(&self.mnt).status();
            if is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
            return;
        }
        let mut c = intentfs();
        c.arg("umount").arg(&self.mnt);
        let ok = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok || is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

impl Layout {
    /// `intentfs mount ARGS... WS MNT` with these variables in the daemon's environment.
    pub fn mount_env(&self, args: &[&str], envs: &[(&str, &str)]) -> Mount {
        self.mount_with(args, envs).0
    }

    fn mount_with(&self, args: &[&str], envs: &[(&str, &str)]) -> (Mount, Output) {
        let mut c = intentfs();
        c.arg("mount")
            .args(args)
            .arg("--log")
            .arg(self.root.join("daemon.log"))
            .arg(&self.ws)
            .arg(&self.mnt)
            .envs(envs.iter().copied());
        let out = run_timeout(c, Duration::from_secs(20));
        assert!(
            out.status.success(),
            "intentfs mount {args:?} failed: {}{}",
            text(&out.stderr),
            std::fs::read_to_string(self.root.join("daemon.log")).unwrap_or_default()
        );
        (Mount::new(&self.mnt), out)
    }

    /// A directory every uid can write, for an agent and the test to meet in (sync files).
    pub fn meeting_dir(&self) -> PathBuf {
        let d = self.root.join("meet");
        std::fs::create_dir_all(&d).unwrap();
        chmod(&d, 0o1777);
        d
    }

    /// The daemon's status, read through the mount (as root).
    pub fn status(&self) -> serde_json::Value {
        let t = std::fs::read_to_string(self.mnt.join(".intentfs/status")).unwrap();
        serde_json::from_str(&t).unwrap()
    }
}

/// `intentfs run --mount MNT --user AGENT_UID ARGS -- sh -c SCRIPT`, started by the operator
/// (root) from the mount: an agent under another uid, as the threat model has it.
pub fn agent_cmd(l: &Layout, args: &[&str], script: &str) -> Command {
    let mut c = intentfs();
    c.arg("run")
        .arg("--mount")
        .arg(&l.mnt)
        .args(["--user", &AGENT_UID.to_string()])
        .args(args)
        .args(["--", "sh", "-c", script])
        .current_dir(&l.mnt)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "agent")
        .env("GIT_AUTHOR_EMAIL", "agent@example.com")
        .env("GIT_COMMITTER_NAME", "agent")
        .env("GIT_COMMITTER_EMAIL", "agent@example.com");
    c
}

/// Run [`agent_cmd`] to its end (60 s at most).
pub fn run_agent(l: &Layout, args: &[&str], script: &str) -> Output {
    run_timeout(agent_cmd(l, args, script), Duration::from_secs(60))
}
