//! Identities: who is acting. The mount has a default identity; a process tree started by
//! `intentfs run` registers its POSIX session as an identity of its own. A request is
//! attributed by its caller's session, read from `/proc/<pid>/stat`; a caller whose pid is
//! not visible (0, another pid namespace) falls back to the default identity.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use globset::GlobMatcher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::stale::Seen;
use super::{Code, Denial};

/// A process-wide logical clock ordering views and renames: a view of a path recorded
/// before a file left that path (see `Node::departed`) may be the view the agent's open of
/// that file was based on.
static CLOCK: AtomicU64 = AtomicU64::new(1);

/// The next tick of the view clock.
pub fn tick() -> u64 {
    CLOCK.fetch_add(1, Ordering::AcqRel)
}

/// One acting identity and its governance state.
pub struct Identity {
    /// Display name (`--agent`).
    pub name: String,
    /// The session id, `None` for the mount's default identity.
    pub session: Option<i32>,
    /// The selected intent id.
    pub intent: Mutex<Option<String>>,
    /// The most recent denial.
    pub last_error: Mutex<Option<Denial>>,
    /// Refusals so far.
    pub denials: AtomicU64,
    /// Completed mutations so far.
    pub mutations: AtomicU64,
    /// Stale-file refusals so far.
    pub stale_refusals: AtomicU64,
    /// `--require-read`: overwriting or deleting a file this identity never read is refused.
    pub require_read: bool,
    /// What this identity last saw of each file, by workspace-relative path.
    pub seen: Mutex<HashMap<PathBuf, SeenBy>>,
    /// Human grants that widen what this identity may do for the rest of its session.
    pub grants: Mutex<Grants>,
    /// Times of recent refusals, for the circuit breaker.
    recent_denials: Mutex<VecDeque<Instant>>,
    /// The breaker tripped: every mutation is refused until a human resets it.
    pub tripped: AtomicBool,
}

/// What humans granted an identity.
#[derive(Default, Debug)]
pub struct Grants {
    /// Single-use grants: `(kind, path)`; consumed by the next matching check.
    pub once: Vec<(GrantKind, PathBuf)>,
    /// Paths granted for the rest of the session.
    pub files: HashSet<(GrantKind, PathBuf)>,
    /// Scope expansions (globs), for the rest of the session.
    pub globs: Vec<(String, GlobMatcher)>,
}

/// What a grant lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrantKind {
    /// A write outside the intent's scope.
    Write,
    /// Reading a sensitive path.
    Read,
    /// A delete the policy asks about.
    Delete,
}

impl Grants {
    /// Does a grant cover `(kind, rel)`? A single-use grant is consumed.
    pub fn take(&mut self, kind: GrantKind, rel: &Path) -> bool {
        if let Some(i) = self.once.iter().position(|(k, p)| *k == kind && p == rel) {
            self.once.remove(i);
            return true;
        }
        if self.files.contains(&(kind, rel.to_path_buf())) {
            return true;
        }
        kind == GrantKind::Write && self.globs.iter().any(|(_, g)| g.is_match(rel))
    }
}

/// The circuit breaker's settings.
#[derive(Clone, Copy, Debug)]
pub struct Breaker {
    /// Refusals within `window` that trip it.
    pub limit: usize,
    pub window: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            limit: 20,
            window: Duration::from_secs(60),
        }
    }
}

impl Identity {
    fn new(
        name: String,
        session: Option<i32>,
        intent: Option<String>,
        require_read: bool,
    ) -> Identity {
        Identity {
            name,
            session,
            intent: Mutex::new(intent),
            last_error: Mutex::new(None),
            denials: AtomicU64::new(0),
            mutations: AtomicU64::new(0),
            stale_refusals: AtomicU64::new(0),
            require_read,
            seen: Mutex::new(HashMap::new()),
            grants: Mutex::new(Grants::default()),
            recent_denials: Mutex::new(VecDeque::new()),
            tripped: AtomicBool::new(false),
        }
    }

    /// Count a refusal for the circuit breaker; true when this one trips it.
    pub fn count_refusal(&self, b: Breaker) -> bool {
        if b.limit == 0 || self.tripped.load(Ordering::Acquire) {
            return false;
        }
        let now = Instant::now();
        let mut q = self.recent_denials.lock();
        q.push_back(now);
        while q
            .front()
            .map(|t| now.duration_since(*t) > b.window)
            .unwrap_or(false)
        {
            q.pop_front();
        }
        if q.len() >= b.limit {
            q.clear();
            return !self.tripped.swap(true, Ordering::AcqRel);
        }
        false
    }

    /// A human reset the breaker.
    pub fn reset_breaker(&self) {
        self.recent_denials.lock().clear();
        self.tripped.store(false, Ordering::Release);
    }

    /// What this identity last saw of `rel`, as the view a mutation by process `pid` is
    /// based on: the newest record made by *another* process of the identity when there is
    /// one (a tool like `sed -i` re-reads the file itself right before replacing it; the
    /// agent's view is what it read before running the tool), else the newest record.
    pub fn seen_for(&self, rel: &Path, pid: u32) -> Option<(u32, Seen)> {
        self.seen_for_before(rel, pid, u64::MAX)
    }

    /// Like [`seen_for`](Self::seen_for), but only a view recorded before `before` (a tick).
    pub fn seen_for_before(&self, rel: &Path, pid: u32, before: u64) -> Option<(u32, Seen)> {
        let m = self.seen.lock();
        let by = m.get(rel).filter(|by| by.at < before)?;
        by.recs
            .iter()
            .flatten()
            .find(|(p, _)| *p != pid)
            .or(by.recs[0].as_ref())
            .copied()
    }

    /// Number of files this identity has seen.
    pub fn seen_count(&self) -> usize {
        self.seen.lock().len()
    }

    /// Record what process `pid` of this identity saw (a read, or its own completed write).
    pub fn saw(&self, rel: &Path, pid: u32, s: Seen) {
        let mut m = self.seen.lock();
        let by = m.entry(rel.to_path_buf()).or_default();
        by.at = tick();
        let keep_older = by.recs[0]
            .filter(|(p, _)| *p != pid)
            .or(by.recs[1].filter(|(p, _)| *p != pid));
        by.recs = [Some((pid, s)), keep_older];
    }

    /// A path went away or moved (this identity's own delete or rename).
    pub fn forget_path(&self, rel: &Path) {
        self.seen.lock().remove(rel);
    }

    pub fn move_path(&self, from: &Path, to: &Path) {
        let mut m = self.seen.lock();
        m.remove(to);
        if let Some(s) = m.remove(from) {
            m.insert(to.to_path_buf(), s);
        }
    }

    /// Record the identity's own completed change: it supersedes every older view (an
    /// identity never goes stale against itself).
    pub fn saw_own(&self, rel: &Path, pid: u32, s: Seen) {
        self.seen.lock().insert(
            rel.to_path_buf(),
            SeenBy {
                recs: [Some((pid, s)), None],
                at: tick(),
            },
        );
    }

    /// Exchange what was seen under two paths (RENAME_EXCHANGE).
    pub fn swap_paths(&self, a: &Path, b: &Path) {
        let mut m = self.seen.lock();
        let sa = m.remove(a);
        let sb = m.remove(b);
        if let Some(s) = sa {
            m.insert(b.to_path_buf(), s);
        }
        if let Some(s) = sb {
            m.insert(a.to_path_buf(), s);
        }
    }

    /// `default` or `session:<sid>`.
    pub fn key(&self) -> String {
        match self.session {
            None => "default".into(),
            Some(s) => format!("session:{s}"),
        }
    }

    pub fn intent(&self) -> Option<String> {
        self.intent.lock().clone()
    }

    /// Remember a refusal.
    pub fn deny(&self, d: &Denial) {
        self.denials.fetch_add(1, Ordering::Relaxed);
        if d.code == Code::StaleFile {
            self.stale_refusals.fetch_add(1, Ordering::Relaxed);
        }
        *self.last_error.lock() = Some(d.clone());
    }
}

/// The newest two records of what an identity saw of one file, from distinct processes,
/// newest first.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeenBy {
    pub recs: [Option<(u32, Seen)>; 2],
    /// When the newest record was made (see [`tick`]).
    pub at: u64,
}

/// All identities of one mount.
pub struct Identities {
    default: Arc<Identity>,
    sessions: RwLock<HashMap<i32, Arc<Identity>>>,
}

/// One `read` of `/proc/<pid>/<file>` into `buf`: these files are small, and a single read
/// returns them whole when `buf` is large enough (`read_to_string` would stat the file and
/// read until a second, empty read). The byte count; None for pid 0 or a process not seen.
fn read_proc(pid: u32, file: &str, buf: &mut [u8]) -> Option<usize> {
    if pid == 0 {
        return None;
    }
    let mut f = std::fs::File::open(format!("/proc/{pid}/{file}")).ok()?;
    std::io::Read::read(&mut f, buf).ok()
}

/// The session id and command name of a process, from `/proc/<pid>/stat`.
pub fn proc_session(pid: u32) -> Option<(i32, String)> {
    // The line is a few hundred bytes (`comm` is at most 15).
    let mut buf = [0u8; 1024];
    let n = read_proc(pid, "stat", &mut buf)?;
    let stat = if n < buf.len() {
        String::from_utf8_lossy(&buf[..n]).into_owned()
    } else {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?
    };
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // After ") ": state ppid pgrp session ...
    let mut fields = stat.get(close + 2..)?.split_whitespace();
    let _state = fields.next()?;
    let _ppid = fields.next()?;
    let _pgrp = fields.next()?;
    let sid = fields.next()?.parse().ok()?;
    Some((sid, comm))
}

/// The process name of a pid, for the ledger (empty when not visible). From
/// `/proc/<pid>/comm`, which the kernel answers without gathering the rest of `stat`
/// (a third of the cost of naming the process in every ledger entry).
pub fn proc_name(pid: u32) -> String {
    let mut buf = [0u8; 64];
    let Some(n) = read_proc(pid, "comm", &mut buf) else {
        return String::new();
    };
    String::from_utf8_lossy(buf[..n].strip_suffix(b"\n").unwrap_or(&buf[..n])).into_owned()
}

impl Identities {
    pub fn new(
        default_name: String,
        default_intent: Option<String>,
        require_read: bool,
    ) -> Identities {
        Identities {
            default: Arc::new(Identity::new(
                default_name,
                None,
                default_intent,
                require_read,
            )),
            sessions: RwLock::new(HashMap::new()),
        }
    }

    pub fn default_identity(&self) -> &Arc<Identity> {
        &self.default
    }

    /// The identity a request from `pid` acts as.
    pub fn resolve(&self, pid: u32) -> Arc<Identity> {
        if self.sessions.read().is_empty() {
            return self.default.clone();
        }
        match proc_session(pid) {
            Some((sid, _)) => self
                .sessions
                .read()
                .get(&sid)
                .cloned()
                .unwrap_or_else(|| self.default.clone()),
            None => self.default.clone(),
        }
    }

    /// Register the caller's session as a new identity. Only a session leader may do so
    /// (`intentfs run` calls `setsid` first), so a process cannot split its own session's
    /// identity from its siblings'.
    pub fn register(
        &self,
        pid: u32,
        name: &str,
        require_read: bool,
    ) -> Result<Arc<Identity>, &'static str> {
        let (sid, _) =
            proc_session(pid).ok_or("the caller's process is not visible to the daemon")?;
        if sid as u32 != pid {
            return Err("only a session leader may register a session (intentfs run does this)");
        }
        let id = Arc::new(Identity::new(
            name.to_string(),
            Some(sid),
            None,
            require_read,
        ));
        self.sessions.write().insert(sid, id.clone());
        Ok(id)
    }

    /// The identity with this key (`default` or `session:<sid>`).
    pub fn by_key(&self, key: &str) -> Option<Arc<Identity>> {
        if key == "default" || key == self.default.name {
            return Some(self.default.clone());
        }
        let sessions = self.sessions.read();
        if let Some(sid) = key
            .strip_prefix("session:")
            .and_then(|s| s.parse::<i32>().ok())
        {
            return sessions.get(&sid).cloned();
        }
        sessions.values().find(|i| i.name == key).cloned()
    }

    /// All identities, default first.
    pub fn all(&self) -> Vec<Arc<Identity>> {
        let mut v = vec![self.default.clone()];
        let mut s: Vec<_> = self.sessions.read().values().cloned().collect();
        s.sort_by_key(|i| i.session);
        v.extend(s);
        v
    }

    /// Free identities whose session has no process left. Returns how many were freed.
    pub fn reap(&self) -> usize {
        let sids: Vec<i32> = self.sessions.read().keys().copied().collect();
        if sids.is_empty() {
            return 0;
        }
        let mut alive = std::collections::HashSet::new();
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some((sid, _)) = proc_session(pid) {
                    alive.insert(sid);
                }
            }
        }
        let mut map = self.sessions.write();
        let before = map.len();
        map.retain(|sid, _| alive.contains(sid));
        before - map.len()
    }
}
