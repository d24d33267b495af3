//! In-process tests of the governed core (`intentfs::fs::Fs`): no `/dev/fuse`, no mount, no
//! daemon process. Each test builds an `Fs` over a temporary workspace and calls its
//! operations the way the FUSE adapter does (node ids, a `Caller`), then asserts what
//! landed on the backing files and in the ledger.
//!
//! Everything about how an `Fs` is put together lives in [`Core::build`]: when the core's
//! fields move (the approver, the breaker), only that function changes.
//!
//! None of these need root; run as root, `create`/`mkdir` switch fs credentials to the
//! caller's uid and gid, which here are the test process's own.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ask;
mod handshake;
mod ledger;
mod locks;
mod rename;
mod scope;
mod stale;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use intentfs::approval::{Broker, BrokerConfig, Mode};
use intentfs::control;
use intentfs::fs::approve::Approver;
use intentfs::fs::inode::ROOT;
use intentfs::fs::{Caller, Fs, FsConfig, FsError};
use intentfs::guard::{Code, Guard, Identities, Intents, Protected, Rules};
use intentfs::ledger::{Entry, Ledger, LedgerOptions, MutationType};
use intentfs::policy::{IntentIgnore, Policy};

/// One intent owning `src/**` and `README.md`, another owning `docs/`.
pub const POLICY: &str = r#"
intents:
  - id: INT-001
    name: Source work
    status: IN_PROGRESS
    owned_scope: ["src/**", "README.md"]
  - id: INT-002
    name: Docs
    status: IN_PROGRESS
    owned_scope: ["docs/"]
  - id: INT-003
    name: Paused
    status: PAUSED
    owned_scope: ["**"]
"#;

/// Who answers when the policy says `ask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Deny,
    Allow,
    /// A broker in CLI mode (no socket): the test decides with `Broker::decide`.
    Human,
}

/// How to build a core.
pub struct Opts {
    pub who: Who,
    /// `(limit, window)` of the circuit breaker.
    pub breaker: Option<(usize, Duration)>,
    /// How long a human has to answer.
    pub timeout: Duration,
    /// `.intentignore` content, written before the rules are loaded.
    pub ignore: Option<&'static str>,
    /// Files (workspace-relative path, content) made before the core is built.
    pub files: &'static [(&'static str, &'static str)],
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            who: Who::Deny,
            breaker: None,
            timeout: Duration::from_secs(60),
            ignore: None,
            files: &[],
        }
    }
}

/// A core over a temporary workspace, and what a test needs to look at it. A clone shares
/// the same `Fs` (what a parked operation's continuation re-runs through).
#[derive(Clone)]
pub struct Core {
    pub fs: Arc<Fs>,
    pub ws: PathBuf,
    pub ledger: PathBuf,
    pub broker: Option<Arc<Broker>>,
    /// The test process itself: resolves to the default identity.
    pub me: Caller,
    _dir: Arc<tempfile::TempDir>,
}

/// A core with this policy, no intent selected, unattended refusals, these files.
pub fn core(policy: &str, files: &'static [(&'static str, &'static str)]) -> Core {
    Core::build(
        policy,
        Opts {
            files,
            ..Default::default()
        },
    )
}

impl Core {
    /// The one place an `Fs` is assembled, as `cli::mount::serve` does it: policy and
    /// `.intentignore` loaded from the workspace, the fixed protected paths, a ledger at
    /// the default place, identities with no cgroup (granted ones are tracked by ancestry).
    pub fn build(policy: &str, o: Opts) -> Core {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws").canonicalize_new();
        let mnt = dir.path().join("mnt").canonicalize_new();
        for (rel, content) in o.files {
            let p = ws.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
        }
        if let Some(ig) = o.ignore {
            std::fs::write(ws.join(".intentignore"), ig).unwrap();
        }
        let policy_path = ws.join(".orchestration/active_intents.yaml");
        std::fs::create_dir_all(policy_path.parent().unwrap()).unwrap();
        std::fs::write(&policy_path, policy).unwrap();
        let ledger_path = ws.join(intentfs::ledger::DEFAULT_LEDGER);
        let (ledger, report) = Ledger::open(
            &ledger_path,
            LedgerOptions {
                workspace: Some(ws.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(report.chain_findings.is_empty());
        let guard = Arc::new(Guard::new(Rules {
            policy: Policy::load(&policy_path).unwrap(),
            ignore: IntentIgnore::load(&ws).unwrap(),
            protected: Protected::new(&[]),
        }));
        let ids = Arc::new(Identities::new("agent".into(), Intents::All, false, None));
        let broker = (o.who == Who::Human).then(|| {
            Broker::start(BrokerConfig {
                mode: Mode::Cli,
                timeout: o.timeout,
                socket_path: None,
                // SAFETY: getuid has no preconditions.
                owner_uid: unsafe { libc::getuid() },
                mountpoint: mnt.clone(),
                workspace: ws.clone(),
            })
            .unwrap()
        });
        let cfg = FsConfig {
            workspace: ws.clone(),
            mountpoint: mnt,
            policy_path,
            fd_cap: 1024,
        };
        let mut fs = Fs::new(cfg, guard, ids, Some(ledger)).unwrap();
        fs.gate.approver = match (o.who, &broker) {
            (Who::Deny, _) => Approver::Deny,
            (Who::Allow, _) => Approver::Allow,
            (Who::Human, Some(b)) => Approver::Human(b.clone()),
            (Who::Human, None) => unreachable!(),
        };
        if let Some((limit, window)) = o.breaker {
            fs.gate.breaker = intentfs::guard::identity::Breaker { limit, window };
        }
        Core {
            fs: Arc::new(fs),
            ws,
            ledger: ledger_path,
            broker,
            me: caller(std::process::id()),
            _dir: Arc::new(dir),
        }
    }

    // ----- the handshake ---------------------------------------------------------------

    /// Write `id` to `.intentfs/intent` as `echo ID > .intentfs/intent` does: look the
    /// control directory up, open the file truncating, write, close.
    pub fn select_as(&self, c: &Caller, id: &str) -> Result<(), FsError> {
        let dir = self.fs.lookup(ROOT, OsStr::new(control::DIR_NAME))?;
        let f = self.fs.lookup(dir.nodeid, OsStr::new("intent"))?;
        let (fh, _) = self.fs.open(c, f.nodeid, libc::O_WRONLY | libc::O_TRUNC)?;
        let r = self.fs.write(c, fh, 0, format!("{id}\n").as_bytes(), false);
        self.fs.flush(c, fh)?;
        self.fs.release(fh)?;
        r.map(drop)
    }

    pub fn select(&self, id: &str) {
        self.select_as(&self.me, id).unwrap();
    }

    /// A control file's content as `cat .intentfs/NAME` shows it to `c`.
    pub fn ctl(&self, c: &Caller, name: &str) -> String {
        let dir = self.fs.lookup(ROOT, OsStr::new(control::DIR_NAME)).unwrap();
        let f = self.fs.lookup(dir.nodeid, OsStr::new(name)).unwrap();
        let (fh, _) = self.fs.open(c, f.nodeid, libc::O_RDONLY).unwrap();
        let b = self.fs.read(c, fh, 0, 1 << 20).unwrap();
        self.fs.release(fh).unwrap();
        String::from_utf8(b).unwrap()
    }

    // ----- paths -----------------------------------------------------------------------

    /// The node id of a workspace-relative path, looked up name by name from the root
    /// (as the kernel does before a request).
    pub fn node(&self, rel: &str) -> Result<u64, FsError> {
        let mut id = ROOT;
        for c in Path::new(rel).components() {
            id = self.fs.lookup(id, c.as_os_str())?.nodeid;
        }
        Ok(id)
    }

    /// The node id of `rel`'s parent and `rel`'s last name.
    pub fn parent<'a>(&self, rel: &'a str) -> (u64, &'a OsStr) {
        let p = Path::new(rel);
        let parent = p.parent().and_then(|d| d.to_str()).unwrap_or("");
        (
            self.node(parent).unwrap(),
            OsStr::from_bytes(p.file_name().unwrap().as_bytes()),
        )
    }

    /// The backing file's path.
    pub fn w(&self, rel: &str) -> PathBuf {
        self.ws.join(rel)
    }

    /// The backing file's content (panics when it is missing).
    pub fn backing(&self, rel: &str) -> String {
        std::fs::read_to_string(self.w(rel))
            .unwrap_or_else(|e| panic!("{rel} in the workspace: {e}"))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.w(rel).symlink_metadata().is_ok()
    }

    // ----- file operations as an agent makes them --------------------------------------

    /// `cat rel`: open read-only, read to the end, close (the identity has now seen it).
    pub fn read_as(&self, c: &Caller, rel: &str) -> Result<Vec<u8>, FsError> {
        let (fh, _) = self.fs.open(c, self.node(rel)?, libc::O_RDONLY)?;
        let mut out = Vec::new();
        loop {
            let b = self.fs.read(c, fh, out.len() as u64, 64 * 1024)?;
            let short = b.len() < 64 * 1024;
            out.extend_from_slice(&b);
            if short {
                break;
            }
        }
        self.fs.release(fh)?;
        Ok(out)
    }

    pub fn read(&self, rel: &str) -> Result<Vec<u8>, FsError> {
        self.read_as(&self.me, rel)
    }

    /// `echo data > rel` on an existing file: open truncating, write, flush, close.
    pub fn overwrite_as(&self, c: &Caller, rel: &str, data: &str) -> Result<(), FsError> {
        let (fh, _) = self
            .fs
            .open(c, self.node(rel)?, libc::O_WRONLY | libc::O_TRUNC)?;
        let r = self.fs.write(c, fh, 0, data.as_bytes(), false);
        let f = self.fs.flush(c, fh);
        self.fs.release(fh)?;
        r?;
        f
    }

    pub fn overwrite(&self, rel: &str, data: &str) -> Result<(), FsError> {
        self.overwrite_as(&self.me, rel, data)
    }

    /// A new file with this content: create, write, flush, close.
    pub fn create(&self, rel: &str, data: &str) -> Result<(), FsError> {
        let (parent, name) = self.parent(rel);
        let (_, fh, _) = self
            .fs
            .create(&self.me, parent, name, 0o644, 0o022, libc::O_WRONLY)?;
        let r = self.fs.write(&self.me, fh, 0, data.as_bytes(), false);
        let f = self.fs.flush(&self.me, fh);
        self.fs.release(fh)?;
        r?;
        f
    }

    pub fn mkdir(&self, rel: &str) -> Result<(), FsError> {
        let (parent, name) = self.parent(rel);
        self.fs
            .mkdir(&self.me, parent, name, 0o755, 0o022)
            .map(drop)
    }

    pub fn unlink(&self, rel: &str) -> Result<(), FsError> {
        let (parent, name) = self.parent(rel);
        self.fs.unlink(&self.me, parent, name, false)
    }

    pub fn rename_as(&self, c: &Caller, from: &str, to: &str, flags: u32) -> Result<(), FsError> {
        let (p, n) = self.parent(from);
        let (np, nn) = self.parent(to);
        self.fs.rename(c, p, n, np, nn, flags)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<(), FsError> {
        self.rename_as(&self.me, from, to, 0)
    }

    pub fn link(&self, from: &str, to: &str) -> Result<(), FsError> {
        let (np, nn) = self.parent(to);
        self.fs.link(&self.me, self.node(from)?, np, nn).map(drop)
    }

    pub fn setattr(&self, rel: &str, a: intentfs::fs::ops::SetAttr) -> Result<(), FsError> {
        self.fs
            .setattr(&self.me, self.node(rel)?, a, None)
            .map(drop)
    }

    // ----- the ledger ------------------------------------------------------------------

    /// Every entry of the ledger, in order.
    pub fn entries(&self) -> Vec<Entry> {
        intentfs::ledger::read_entries(&self.ledger)
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// The entries of one type.
    pub fn of(&self, mt: MutationType) -> Vec<Entry> {
        self.entries()
            .into_iter()
            .filter(|e| e.mutation_type == mt)
            .collect()
    }

    /// The entries of one type about `path`.
    pub fn at(&self, mt: MutationType, path: &str) -> Vec<Entry> {
        self.of(mt)
            .into_iter()
            .filter(|e| e.path.as_deref() == Some(path))
            .collect()
    }

    /// The chain verifies, and every recorded hash matches the disk (nothing changed
    /// outside the record).
    pub fn assert_ledger_clean(&self) {
        let r = intentfs::ledger::verify_chain(&self.ledger).unwrap();
        assert!(r.intact(), "chain findings: {:?}", r.findings);
        assert!(r.entries > 0);
        let drift = intentfs::ledger::verify_drift(&self.ledger, &self.ws).unwrap();
        assert!(
            drift.is_empty(),
            "drift: {:?}",
            drift.iter().map(|d| &d.path).collect::<Vec<_>>()
        );
    }

    /// Assert the last DENIAL entry is about `path`, with `code` and op `op`.
    pub fn assert_denial(&self, path: &str, code: Code, op: &str) {
        let d = self.of(MutationType::Denial);
        let last = d
            .last()
            .unwrap_or_else(|| panic!("no DENIAL entry (wanted {code} of {path})"));
        assert_eq!(last.path.as_deref(), Some(path), "{last:?}");
        assert_eq!(last.code.as_deref(), Some(code.as_str()), "{last:?}");
        assert_eq!(last.outcome, "denied");
        assert_eq!(
            last.detail.as_ref().and_then(|d| d["op"].as_str()),
            Some(op),
            "{last:?}"
        );
        assert_eq!(
            last.agent.as_ref().map(|a| a.identity.as_str()),
            Some("default")
        );
    }
}

/// A caller with this pid and the test process's uid and gid.
pub fn caller(pid: u32) -> Caller {
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Caller { uid, gid, pid }
}

/// The governance code of a refusal (panics on anything else).
pub fn code(r: Result<(), FsError>) -> Code {
    match r {
        Err(FsError::Denied(d)) => d.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A directory made now, as its canonical path (the workspace root the daemon resolves).
trait CanonicalizeNew {
    fn canonicalize_new(self) -> PathBuf;
}

impl CanonicalizeNew for PathBuf {
    fn canonicalize_new(self) -> PathBuf {
        std::fs::create_dir_all(&self).unwrap();
        self.canonicalize().unwrap()
    }
}

/// SetAttr shorthands.
pub fn chmod(mode: u32) -> intentfs::fs::ops::SetAttr {
    intentfs::fs::ops::SetAttr {
        mode: Some(mode),
        ..Default::default()
    }
}

pub fn truncate(size: u64) -> intentfs::fs::ops::SetAttr {
    intentfs::fs::ops::SetAttr {
        size: Some(size),
        ..Default::default()
    }
}

/// Every regular file and directory below the workspace (`.orchestration/` excepted), with
/// file contents: what "the backing tree is unchanged" compares.
pub fn tree(ws: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(ws).unwrap().to_string_lossy().into_owned();
            if rel == ".orchestration" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                out.push((rel, None));
                stack.push(p);
            } else {
                out.push((rel, Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}
