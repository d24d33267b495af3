//! Identities: who is acting, and what each one is allowed and has seen. The mount has a
//! default identity; the operator grants others with `intentfs run` over the control socket
//! (see [`super::tracking`] for how a request is attributed to one). Nothing here trusts
//! what an agent says about itself: an identity's name, its selectable intents and its
//! `--require-read` are fixed when the operator grants it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use globset::GlobMatcher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

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

/// Which intents an identity may select: fixed by the operator when the identity is granted
/// (`mount --intent`, `run --intent` lock it; `run --intents` lists them or says `all`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intents {
    /// Exactly this intent, selected from the start.
    Locked(String),
    /// Any of these (the agent chooses with the handshake).
    Among(Vec<String>),
    /// Any intent of the policy.
    All,
}

impl Intents {
    /// May an identity with these bounds select `id`?
    pub fn allows(&self, id: &str) -> bool {
        match self {
            Intents::Locked(x) => x == id,
            Intents::Among(v) => v.iter().any(|x| x == id),
            Intents::All => true,
        }
    }

    /// For people: `INT-001 (locked)`, `INT-001, INT-002`, `all`.
    pub fn describe(&self) -> String {
        match self {
            Intents::Locked(x) => format!("{x} (locked)"),
            Intents::Among(v) => v.join(", "),
            Intents::All => "all".into(),
        }
    }

    /// The intent selected at grant time.
    pub fn initial(&self) -> Option<String> {
        match self {
            Intents::Locked(x) => Some(x.clone()),
            Intents::Among(v) if v.len() == 1 => Some(v[0].clone()),
            _ => None,
        }
    }
}

/// One acting identity and its governance state.
pub struct Identity {
    /// Display name (`--agent`), chosen by the operator.
    pub name: String,
    /// `default`, or `run:<pid of the intentfs run process>` for an identity the operator
    /// granted (see [`super::tracking`]).
    pub key: String,
    /// The intents this identity may select (the operator's bound).
    pub allowed: Intents,
    /// The uid the operator started the identity's command as (`run --user`), for `status`.
    pub uid: Option<u32>,
    /// The selected intent id.
    pub intent: Mutex<Option<String>>,
    /// The most recent denial.
    pub last_error: Mutex<Option<Denial>>,
    /// Refusals so far.
    pub denials: AtomicU64,
    /// Tools' harmless probes refused (git refreshing its index before the handshake):
    /// counted here, not as denials, not for the breaker, not ledgered one by one.
    pub probes: AtomicU64,
    /// Completed mutations so far.
    pub mutations: AtomicU64,
    /// Stale-file refusals so far.
    pub stale_refusals: AtomicU64,
    /// `--require-read`: overwriting or deleting a file this identity never read is refused
    /// (the mount's setting, or the run's when it tightens it).
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

/// What humans granted an identity for its session. (A `once` approval of an operation
/// that asked is never the identity's: it goes to that operation, see [`Run`]. A `once`
/// approval the agent asked for ahead, through `.intentfs/approval`, is: no operation is
/// waiting for it, so it waits in [`Grants::ahead`] for the identity's next operation on
/// that path.)
#[derive(Default, Debug)]
pub struct Grants {
    /// Paths granted for the rest of the session.
    pub files: HashSet<(GrantKind, PathBuf)>,
    /// Scope expansions (globs), for the rest of the session.
    pub globs: Vec<(String, GlobMatcher)>,
    /// Single-use approvals asked for ahead (`.intentfs/approval`), spent by the next
    /// operation they cover.
    pub ahead: Vec<OnceGrant>,
}

/// Most single-use approvals asked ahead an identity holds unspent: each took a human's
/// answer, so more than a few means the agent asks instead of working.
pub const MAX_AHEAD: usize = 8;

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

/// A single-use grant: what it lets through, and where.
pub type OnceGrant = (GrantKind, PathBuf);

/// The single-use grants of the operation running on this thread, while a [`Run`] is open.
#[derive(Default)]
struct RunGrants {
    /// Carried over from the run before, which stopped to ask: usable by this run only.
    carried: Vec<OnceGrant>,
    /// Consumed by this run.
    taken: Vec<OnceGrant>,
}

thread_local! {
    static RUN: std::cell::RefCell<Option<RunGrants>> = const { std::cell::RefCell::new(None) };
}

/// One run of an operation that may stop to ask a human (see `Fs::drive`). A rename of
/// two names outside the scope asks about each in turn; a `once` approval of the first name
/// must still hold when the run after the second approval checks both again. So a run that
/// stops to ask hands the single-use grants it consumed ([`Run::carry`]) to the run after
/// the answer, and to no other operation: they never go back to the identity, so nothing
/// else the agent does meanwhile can spend them, and a refusal in the end leaves none. A
/// `once` approval itself is carried the same way (`Gate::settle`), straight to the run
/// after it.
pub struct Run(());

impl Run {
    /// Start a run with the grants the run before it carried.
    pub fn begin(carried: Vec<OnceGrant>) -> Run {
        RUN.with(|r| {
            *r.borrow_mut() = Some(RunGrants {
                carried,
                taken: Vec::new(),
            })
        });
        Run(())
    }

    /// The run stopped to ask: what it consumed, and what it was carried and did not reach,
    /// for the run after the answer.
    pub fn carry(self) -> Vec<OnceGrant> {
        RUN.with(|r| {
            r.borrow_mut()
                .take()
                .map(|g| g.taken.into_iter().chain(g.carried).collect())
                .unwrap_or_default()
        })
    }
}

impl Run {
    /// A single-use grant for `(kind, rel)` that the running operation carries from the
    /// answer it stopped for, spent by this call.
    pub fn take_carried(kind: GrantKind, rel: &Path) -> bool {
        take_carried(kind, rel)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        RUN.with(|r| *r.borrow_mut() = None);
    }
}

/// A carried single-use grant for `(kind, rel)`, spent by this run.
fn take_carried(kind: GrantKind, rel: &Path) -> bool {
    RUN.with(|r| {
        let mut r = r.borrow_mut();
        let Some(g) = r.as_mut() else { return false };
        let Some(i) = g.carried.iter().position(|(k, p)| *k == kind && p == rel) else {
            return false;
        };
        let c = g.carried.remove(i);
        g.taken.push(c);
        true
    })
}

impl Grants {
    /// Does a grant cover `(kind, rel)`: a single-use one the running operation carries
    /// (consumed), or one for the session?
    pub fn take(&mut self, kind: GrantKind, rel: &Path) -> bool {
        if take_carried(kind, rel) {
            return true;
        }
        if self.session_covers(kind, rel) {
            return true;
        }
        if let Some(i) = self.ahead.iter().position(|(k, p)| *k == kind && p == rel) {
            self.ahead.remove(i);
            return true;
        }
        false
    }

    /// Does a grant for the rest of the session cover `(kind, rel)`?
    pub fn session_covers(&self, kind: GrantKind, rel: &Path) -> bool {
        if self.files.contains(&(kind, rel.to_path_buf())) {
            return true;
        }
        kind == GrantKind::Write && self.globs.iter().any(|(_, g)| g.is_match(rel))
    }

    /// Would [`Grants::take`] let `(kind, rel)` through (spending nothing)? For questions
    /// asked ahead (`.intentfs/check`).
    pub fn covers(&self, kind: GrantKind, rel: &Path) -> bool {
        self.session_covers(kind, rel) || self.ahead.iter().any(|(k, p)| *k == kind && p == rel)
    }

    /// Keep a single-use approval asked for ahead (the oldest goes past [`MAX_AHEAD`]).
    pub fn keep_ahead(&mut self, g: OnceGrant) {
        if self.ahead.len() >= MAX_AHEAD {
            self.ahead.remove(0);
        }
        self.ahead.push(g);
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
    /// A new identity; its intent is the one `allowed` selects from the start, if any.
    pub fn new(
        name: String,
        key: String,
        allowed: Intents,
        uid: Option<u32>,
        require_read: bool,
    ) -> Identity {
        let intent = allowed.initial();
        Identity {
            name,
            key,
            allowed,
            uid,
            intent: Mutex::new(intent),
            last_error: Mutex::new(None),
            denials: AtomicU64::new(0),
            probes: AtomicU64::new(0),
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

    /// A path moved (this identity's own rename): its views move with it, and a
    /// directory's views of everything below it too (else a file renamed with its
    /// directory would have no view, and a change made behind the agent's back would no
    /// longer be stale).
    pub fn move_path(&self, from: &Path, to: &Path, is_dir: bool) {
        let mut m = self.seen.lock();
        if !is_dir {
            m.remove(to);
            if let Some(s) = m.remove(from) {
                m.insert(to.to_path_buf(), s);
            }
            return;
        }
        m.retain(|k, _| !k.starts_with(to));
        let moved: Vec<PathBuf> = m.keys().filter(|k| k.starts_with(from)).cloned().collect();
        for k in moved {
            if let Some(s) = m.remove(&k) {
                m.insert(rebase(&k, from, to), s);
            }
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

    /// Exchange what was seen under two paths (RENAME_EXCHANGE), and below them.
    pub fn swap_paths(&self, a: &Path, b: &Path) {
        let mut m = self.seen.lock();
        let keys: Vec<PathBuf> = m
            .keys()
            .filter(|k| k.starts_with(a) || k.starts_with(b))
            .cloned()
            .collect();
        let entries: Vec<(PathBuf, SeenBy)> = keys
            .into_iter()
            .filter_map(|k| m.remove(&k).map(|v| (k, v)))
            .collect();
        for (k, v) in entries {
            let nk = if k.starts_with(a) {
                rebase(&k, a, b)
            } else {
                rebase(&k, b, a)
            };
            m.insert(nk, v);
        }
    }

    /// `default` or `run:<pid>`.
    pub fn key(&self) -> String {
        self.key.clone()
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

/// `k` (at or below `from`) as the same place below `to`.
fn rebase(k: &Path, from: &Path, to: &Path) -> PathBuf {
    match k.strip_prefix(from) {
        Ok(rest) if !rest.as_os_str().is_empty() => to.join(rest),
        _ => to.to_path_buf(),
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

/// One `read` of `/proc/<pid>/<file>` into `buf`: these files are small, and a single read
/// returns them whole when `buf` is large enough (`read_to_string` would stat the file and
/// read until a second, empty read). The byte count; None for pid 0 or a process not seen.
pub(crate) fn read_proc(pid: u32, file: &str, buf: &mut [u8]) -> Option<usize> {
    if pid == 0 {
        return None;
    }
    let mut f = std::fs::File::open(format!("/proc/{pid}/{file}")).ok()?;
    std::io::Read::read(&mut f, buf).ok()
}

/// The process (thread group id) a thread belongs to, None when `/proc` does not show
/// the thread (FUSE requests carry the calling thread's id, fanotify events the
/// process's).
pub fn tgid(tid: u32) -> Option<u32> {
    // (`Tgid:` is the fourth line of `status`, well inside the buffer.)
    let mut buf = [0u8; 512];
    let n = read_proc(tid, "status", &mut buf)?;
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What `/proc` said about a pid, remembered for a short while: `/proc/<pid>/...` files
/// are generated in full for every read, and a burst of requests from one process asks
/// the same thing again and again.
pub struct RecentByPid<V> {
    ttl: Duration,
    seen: Mutex<HashMap<u32, (Instant, V)>>,
}

impl<V: Clone> RecentByPid<V> {
    pub fn new(ttl: Duration) -> RecentByPid<V> {
        RecentByPid {
            ttl,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// The value for `pid` remembered less than the TTL ago, else `read()`'s, remembered
    /// when it has one (a thousand pids at most before the expired ones are dropped).
    pub fn get_or(&self, pid: u32, read: impl FnOnce() -> Option<V>) -> Option<V> {
        let now = Instant::now();
        if let Some((at, v)) = self.seen.lock().get(&pid) {
            if now.duration_since(*at) < self.ttl {
                return Some(v.clone());
            }
        }
        let v = read()?;
        let mut seen = self.seen.lock();
        if seen.len() >= 1024 {
            let ttl = self.ttl;
            seen.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        }
        seen.insert(pid, (now, v.clone()));
        Some(v)
    }
}

/// How long [`tgid_of`] reuses what `/proc` said. `/proc/<tid>/status` is generated in
/// full for every read (about 2% of the daemon's CPU in `tar x` with kernel passthrough,
/// one read per write open). A thread's process never changes while the thread lives; a
/// reused thread id would have to come round the whole pid space (32,768 here) within
/// this time, which no fork rate reaches.
const TGID_TTL: Duration = Duration::from_millis(100);

/// [`tgid`], or the thread's own id when `/proc` does not say; remembered briefly.
pub fn tgid_of(tid: u32) -> u32 {
    static SEEN: std::sync::LazyLock<RecentByPid<u32>> =
        std::sync::LazyLock::new(|| RecentByPid::new(TGID_TTL));
    SEEN.get_or(tid, || tgid(tid)).unwrap_or(tid)
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
