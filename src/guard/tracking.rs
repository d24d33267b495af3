//! Which identity a request belongs to: the default identity, or one the operator granted
//! with `intentfs run`. Membership is something the agent cannot shed:
//!
//! - **cgroup v2** (preferred): the daemon makes a cgroup per granted identity below one of
//!   its own (`<own cgroup>/intentfs-<mount>/run-<pid>`) and moves the `intentfs run`
//!   process into it before the command starts; every descendant is born inside it, and no
//!   process can leave it without write access to the cgroup files (root-owned, or the
//!   mount owner's). A request's identity is read from `/proc/<pid>/cgroup`. `setsid`,
//!   double forks, `nohup`, daemons: all stay inside.
//! - **ancestry** (where cgroup v2 is not writable): the `intentfs run` process makes itself
//!   a child subreaper (`PR_SET_CHILD_SUBREAPER`), so orphans are re-parented to it rather
//!   than to init, and a request belongs to the identity whose `run` process is among its
//!   ancestors (`/proc/<pid>/stat`, checked by start time so a reused pid is not taken for
//!   it). `run` waits for every descendant before it exits, so the anchor outlives them.
//!
//! The answer for a pid is cached, so the common request costs no syscall: each cache entry
//! holds a pidfd of the thread that asked (`PIDFD_THREAD`), and a thread waiting on all of
//! them in one epoll set drops an entry when its thread exits, before the pid can be reused
//! (a pid is reused only after its zombie is reaped and the pid space has wrapped around).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use super::identity::{read_proc, Identity, Intents};

/// Most pids cached at once; past this the cache starts afresh (each entry holds a pidfd).
const CACHE_MAX: usize = 16_384;
/// The longest ancestry there can be: no more processes than pids (`pid_max`; the kernel's
/// ceiling when it cannot be read). A chain is walked to its end, however deep an agent
/// nests its processes: stopping early would make the deepest the default identity.
fn max_ancestry() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4_194_304)
    })
}

/// How a granted identity's members are recognised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anchor {
    /// Members of this cgroup (path as `/proc/<pid>/cgroup` shows it) and below.
    Cgroup {
        /// The cgroup path, e.g. `/intentfs-mnt/run-4242`.
        path: String,
        /// Where it is in the cgroup2 filesystem.
        dir: PathBuf,
    },
    /// Descendants of this process (the `intentfs run` process, a child subreaper).
    Process {
        /// Its pid.
        pid: u32,
        /// Its start time (`/proc/<pid>/stat` field 22), so a reused pid does not count.
        start: u64,
    },
}

impl Anchor {
    /// `cgroup` or `ancestry`, as `status` and `intentfs run` say it.
    pub fn kind(&self) -> &'static str {
        match self {
            Anchor::Cgroup { .. } => "cgroup",
            Anchor::Process { .. } => "ancestry",
        }
    }
}

/// The cgroup v2 subtree this mount's identities live in.
#[derive(Debug)]
struct CgroupBase {
    /// The cgroup2 mount point.
    mount: PathBuf,
    /// Our subtree's cgroup path (`/…/intentfs-<mount>`).
    path: String,
}

impl CgroupBase {
    fn dir(&self, path: &str) -> PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }
}

/// The cgroup2 mount point as this process sees it, from `/proc/self/mountinfo` (never
/// assumed: it is `/sys/fs/cgroup` on a unified layout, `/sys/fs/cgroup/unified` on a
/// hybrid one). Only a mount of the hierarchy's root will do.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in text.lines() {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        if f.get(3) == Some(&"/") {
            if let Some(mp) = f.get(4) {
                return Some(PathBuf::from(unescape_mountinfo(mp)));
            }
        }
    }
    None
}

/// A field of `/proc/self/mountinfo` as the path it is: the kernel escapes space, tab,
/// newline and backslash as `\ooo` octal.
pub fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = s
                .get(i + 1..i + 4)
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path of a process (the `0::PATH` line of `/proc/<pid>/cgroup`).
pub fn proc_cgroup(pid: u32) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = read_proc(pid, "cgroup", &mut buf)?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_owned())
}

/// `(ppid, start time)` of a process, from `/proc/<pid>/stat`.
pub fn proc_parent(pid: u32) -> Option<(u32, u64)> {
    let mut buf = [0u8; 1024];
    let n = read_proc(pid, "stat", &mut buf)?;
    let stat = std::str::from_utf8(&buf[..n]).ok()?;
    // `comm` (in parentheses) may hold spaces and parentheses: fields count from the last `)`.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ") ": state(3) ppid(4) … starttime(22): indexes 0, 1 … 19.
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// pid → identity answers, each valid while the thread that asked lives.
struct PidCache {
    map: RwLock<HashMap<u32, Cached>>,
    /// The epoll set of every cached pidfd (readable when its thread exits).
    epoll: OwnedFd,
    /// Distinguishes entries for one pid over time in epoll's data.
    seq: AtomicU32,
}

struct Cached {
    ident: Arc<Identity>,
    seq: u32,
    /// Keeps the epoll registration alive; closing it removes it from the set.
    _pidfd: OwnedFd,
}

impl PidCache {
    fn new() -> std::io::Result<Arc<PidCache>> {
        let epoll = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)?;
        let cache = Arc::new(PidCache {
            map: RwLock::new(HashMap::new()),
            epoll,
            seq: AtomicU32::new(1),
        });
        let weak = Arc::downgrade(&cache);
        std::thread::Builder::new()
            .name("intentfs-pid-exits".into())
            .spawn(move || Self::reap_exits(weak))?;
        Ok(cache)
    }

    /// Drop the entry of every thread that exits, until the cache itself is gone.
    fn reap_exits(weak: Weak<PidCache>) {
        use rustix::event::epoll;
        let mut events = Vec::with_capacity(256);
        loop {
            let Some(cache) = weak.upgrade() else { return };
            events.clear();
            let timeout = rustix::event::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            match epoll::wait(&cache.epoll, spare(&mut events), Some(&timeout)) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!("pid cache: epoll_wait: {e}; caching stops");
                    cache.map.write().clear();
                    return;
                }
            }
            if events.is_empty() {
                continue;
            }
            let mut map = cache.map.write();
            for ev in &events {
                let data = ev.data.u64();
                let (pid, seq) = ((data >> 32) as u32, data as u32);
                if map.get(&pid).is_some_and(|c| c.seq == seq) {
                    map.remove(&pid);
                }
            }
        }
    }

    fn get(&self, pid: u32) -> Option<Arc<Identity>> {
        self.map.read().get(&pid).map(|c| c.ident.clone())
    }

    /// Resolve `pid` with `compute` and cache the answer when its thread can be watched.
    fn resolve(&self, pid: u32, compute: impl FnOnce() -> Arc<Identity>) -> Arc<Identity> {
        use rustix::event::epoll;
        // The pidfd first: if the pid was reused between it and `compute`, the process it
        // names has exited, which the check below sees.
        // PIDFD_THREAD (O_EXCL, Linux 6.9): a pidfd of any thread, readable when it exits.
        let flags = rustix::process::PidfdFlags::from_bits_retain(libc::O_EXCL as u32);
        let pidfd = rustix::process::Pid::from_raw(pid as i32)
            .and_then(|p| rustix::process::pidfd_open(p, flags).ok());
        let ident = compute();
        let Some(pidfd) = pidfd else { return ident };
        let mut fds = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if !matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0)) {
            return ident; // exited already (or poll failed): do not cache
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let data = epoll::EventData::new_u64((u64::from(pid) << 32) | u64::from(seq));
        let mut map = self.map.write();
        if map.len() >= CACHE_MAX {
            map.clear();
        }
        if epoll::add(&self.epoll, pidfd.as_fd(), data, epoll::EventFlags::IN).is_ok() {
            map.insert(
                pid,
                Cached {
                    ident: ident.clone(),
                    seq,
                    _pidfd: pidfd,
                },
            );
        }
        ident
    }

    fn clear(&self) {
        self.map.write().clear();
    }
}

/// The spare capacity of an event vector, as epoll's output buffer.
fn spare(
    v: &mut Vec<rustix::event::epoll::Event>,
) -> rustix::buffer::SpareCapacity<'_, rustix::event::epoll::Event> {
    rustix::buffer::spare_capacity(v)
}

/// One granted identity and how its members are recognised.
struct Granted {
    ident: Arc<Identity>,
    anchor: Anchor,
}

/// What the operator asks for when granting an identity (`intentfs run`).
#[derive(Clone, Debug)]
pub struct Grant {
    /// The agent name recorded in the ledger.
    pub name: String,
    /// The intents it may select.
    pub intents: Intents,
    /// `run --require-read` (the mount's setting applies anyway).
    pub require_read: bool,
    /// `run --user`: the uid its command runs as (for `status`).
    pub uid: Option<u32>,
}

/// All identities of one mount.
pub struct Identities {
    default: Arc<Identity>,
    /// Granted identities by key.
    granted: RwLock<HashMap<String, Granted>>,
    /// The mount-wide `--require-read`: every identity has it.
    require_read: bool,
    /// Where cgroup identities go; `None`: cgroup v2 is not usable (ancestry only).
    cgroup: Option<CgroupBase>,
    cache: Option<Arc<PidCache>>,
}

impl Identities {
    /// The mount's identities: the default one (`--agent`, `--intent`/`--intents`), and
    /// room for granted ones. `cgroup_name` names this mount's cgroup subtree; `None` (or
    /// cgroup v2 not writable here) leaves attribution by ancestry.
    pub fn new(
        default_name: String,
        default_intents: Intents,
        require_read: bool,
        cgroup_name: Option<&str>,
    ) -> Identities {
        let default = Arc::new(Identity::new(
            default_name,
            "default".into(),
            default_intents,
            None,
            require_read,
        ));
        let cgroup = cgroup_name.and_then(|n| match setup_cgroup(n) {
            Ok(b) => {
                tracing::info!(cgroup = %b.path, "identities are tracked by cgroup v2");
                Some(b)
            }
            Err(e) => {
                tracing::info!(
                    "cgroup v2 is not usable for identities ({e}); tracking by ancestry"
                );
                None
            }
        });
        let cache = PidCache::new()
            .map_err(|e| tracing::warn!("pid cache: {e}; identities are looked up per request"))
            .ok();
        Identities {
            default,
            granted: RwLock::new(HashMap::new()),
            require_read,
            cgroup,
            cache,
        }
    }

    pub fn default_identity(&self) -> &Arc<Identity> {
        &self.default
    }

    /// `cgroup` when granted identities are tracked by cgroup v2, else `ancestry`.
    pub fn tracking(&self) -> &'static str {
        if self.cgroup.is_some() {
            "cgroup"
        } else {
            "ancestry"
        }
    }

    /// The identity a request from `pid` (a thread id, as FUSE gives it) acts as.
    pub fn resolve(&self, pid: u32) -> Arc<Identity> {
        if pid == 0 || self.granted.read().is_empty() {
            return self.default.clone();
        }
        let Some(cache) = &self.cache else {
            return self.lookup(pid);
        };
        if let Some(i) = cache.get(pid) {
            return i;
        }
        cache.resolve(pid, || self.lookup(pid))
    }

    /// The identity of `pid`, from `/proc` (no cache: what a thread's first request pays;
    /// public for the governance benchmark).
    pub fn lookup(&self, pid: u32) -> Arc<Identity> {
        let granted = self.granted.read();
        let by_cgroup = granted
            .values()
            .any(|g| matches!(g.anchor, Anchor::Cgroup { .. }));
        if by_cgroup {
            if let Some(cg) = proc_cgroup(pid) {
                // The identity's cgroup or one below it (an agent cannot make cgroups in
                // ours, but a container runtime started inside may have).
                let mut best: Option<(&Granted, usize)> = None;
                for g in granted.values() {
                    if let Anchor::Cgroup { path, .. } = &g.anchor {
                        let inside = cg == *path
                            || (cg.starts_with(path.as_str())
                                && cg.as_bytes().get(path.len()) == Some(&b'/'));
                        if inside && best.is_none_or(|(_, l)| path.len() > l) {
                            best = Some((g, path.len()));
                        }
                    }
                }
                if let Some((g, _)) = best {
                    return g.ident.clone();
                }
            }
        }
        let anchors: HashMap<u32, (u64, &Arc<Identity>)> = granted
            .values()
            .filter_map(|g| match g.anchor {
                Anchor::Process { pid, start } => Some((pid, (start, &g.ident))),
                Anchor::Cgroup { .. } => None,
            })
            .collect();
        if !anchors.is_empty() {
            // A process of the chain that exits while it is walked breaks it; its children
            // are re-parented (to the anchor, a subreaper), so walking again finds them.
            'walk: for _ in 0..3 {
                let mut p = pid;
                for _ in 0..max_ancestry() {
                    if p <= 1 {
                        break 'walk;
                    }
                    let Some((ppid, start)) = proc_parent(p) else {
                        continue 'walk;
                    };
                    if let Some((s, ident)) = anchors.get(&p) {
                        if *s == start {
                            return (*ident).clone();
                        }
                    }
                    p = ppid;
                }
                break;
            }
        }
        self.default.clone()
    }

    /// Grant a new identity to the process `peer` (the `intentfs run` process, talking to
    /// the control socket): its cgroup is made and `peer` moved into it, or (where that
    /// cannot be done) `peer` becomes the anchor of an ancestry. The new identity.
    pub fn grant(&self, peer: u32, g: Grant) -> Result<(Arc<Identity>, Anchor), String> {
        let Some((_, start)) = proc_parent(peer).filter(|_| peer != 0) else {
            return Err(
                "the daemon cannot see the calling process (it runs in another pid \
                        namespace, e.g. a sidecar container): identities can only be granted \
                        to processes the daemon sees"
                    .into(),
            );
        };
        let inside = self.resolve(peer);
        if inside.key != "default" {
            return Err(format!(
                "the calling process already belongs to identity {} ({}): an identity cannot \
                 grant identities",
                inside.key, inside.name
            ));
        }
        let mut key = format!("run:{peer}");
        {
            let granted = self.granted.read();
            let mut n = 1;
            while granted.contains_key(&key) {
                n += 1;
                key = format!("run:{peer}.{n}");
            }
        }
        let anchor = match &self.cgroup {
            Some(base) => match join_cgroup(base, &key, peer) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(
                        "identity {key}: cannot use a cgroup ({e}); tracking by ancestry"
                    );
                    Anchor::Process { pid: peer, start }
                }
            },
            None => Anchor::Process { pid: peer, start },
        };
        let ident = Arc::new(Identity::new(
            g.name,
            key.clone(),
            g.intents,
            g.uid,
            g.require_read || self.require_read,
        ));
        self.granted.write().insert(
            key,
            Granted {
                ident: ident.clone(),
                anchor: anchor.clone(),
            },
        );
        // Answers cached before the grant (the `run` process itself, as the default
        // identity) no longer hold.
        if let Some(c) = &self.cache {
            c.clear();
        }
        Ok((ident, anchor))
    }

    /// The identity with this key (`default`, `run:<pid>`, or an agent name).
    pub fn by_key(&self, key: &str) -> Option<Arc<Identity>> {
        if key == "default" || key == self.default.name {
            return Some(self.default.clone());
        }
        let granted = self.granted.read();
        if let Some(g) = granted.get(key) {
            return Some(g.ident.clone());
        }
        granted
            .values()
            .find(|g| g.ident.name == key)
            .map(|g| g.ident.clone())
    }

    /// Processes from which every member of the granted identity `key` is reached by
    /// descent: the processes of its cgroup and of the cgroups below, or its anchor process
    /// (`intentfs run`, a child subreaper: orphans of the agent become its children). None
    /// for the default identity, or a gone anchor.
    pub fn member_roots(&self, key: &str) -> Vec<u32> {
        let anchor = match self.granted.read().get(key) {
            Some(g) => g.anchor.clone(),
            None => return Vec::new(),
        };
        match anchor {
            Anchor::Process { pid, start } => proc_parent(pid)
                .is_some_and(|(_, s)| s == start)
                .then_some(pid)
                .into_iter()
                .collect(),
            Anchor::Cgroup { dir, .. } => {
                let mut pids = Vec::new();
                let mut dirs = vec![dir];
                // (A bound: an agent's cgroup tree of a few hundred groups is read whole.)
                while let Some(d) = dirs.pop().filter(|_| pids.len() < 4096) {
                    if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
                        pids.extend(
                            procs
                                .split_ascii_whitespace()
                                .filter_map(|p| p.parse::<u32>().ok()),
                        );
                    }
                    if let Ok(rd) = std::fs::read_dir(&d) {
                        dirs.extend(
                            rd.flatten()
                                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                                .map(|e| e.path()),
                        );
                    }
                }
                pids
            }
        }
    }

    /// How a granted identity is tracked (`cgroup` or `ancestry`).
    pub fn tracking_of(&self, key: &str) -> Option<&'static str> {
        self.granted.read().get(key).map(|g| g.anchor.kind())
    }

    /// All identities, default first, then by key.
    pub fn all(&self) -> Vec<Arc<Identity>> {
        let mut v = vec![self.default.clone()];
        let mut s: Vec<_> = self
            .granted
            .read()
            .values()
            .map(|g| g.ident.clone())
            .collect();
        s.sort_by(|a, b| a.key.cmp(&b.key));
        v.extend(s);
        v
    }

    /// Free identities with no process left (their cgroup is empty, or their `run`
    /// process is gone), removing their cgroups. Returns how many were freed.
    pub fn reap(&self) -> usize {
        let gone: Vec<String> = self
            .granted
            .read()
            .iter()
            .filter(|(_, g)| !alive(&g.anchor))
            .map(|(k, _)| k.clone())
            .collect();
        if gone.is_empty() {
            return 0;
        }
        let mut map = self.granted.write();
        for k in &gone {
            if let Some(Granted {
                anchor: Anchor::Cgroup { dir, .. },
                ..
            }) = map.remove(k)
            {
                if let Err(e) = std::fs::remove_dir(&dir) {
                    tracing::debug!("removing {}: {e}", dir.display());
                }
            }
        }
        drop(map);
        if let Some(c) = &self.cache {
            c.clear();
        }
        gone.len()
    }

    /// At unmount: remove the cgroups left empty, and this mount's subtree if it is.
    pub fn shutdown(&self) {
        self.reap();
        if let Some(base) = &self.cgroup {
            let dir = base.dir(&base.path);
            if let Err(e) = std::fs::remove_dir(&dir) {
                tracing::info!(
                    "cgroup {} stays ({e}): processes of an identity are still running",
                    dir.display()
                );
            }
        }
    }
}

/// Does a granted identity still have a process?
fn alive(a: &Anchor) -> bool {
    match a {
        Anchor::Cgroup { dir, .. } => std::fs::read_to_string(dir.join("cgroup.events"))
            .map(|t| !t.lines().any(|l| l == "populated 0"))
            // Gone (someone removed it) counts as empty.
            .unwrap_or(false),
        Anchor::Process { pid, start } => proc_parent(*pid).is_some_and(|(_, s)| s == *start),
    }
}

/// This mount's cgroup subtree below the daemon's own cgroup: made (or, left by an earlier
/// daemon, checked to be ours and not writable by others).
fn setup_cgroup(name: &str) -> Result<CgroupBase, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if std::env::var_os("INTENTFS_NO_CGROUP").is_some() {
        return Err("INTENTFS_NO_CGROUP is set".into());
    }
    let mount = cgroup2_mount().ok_or("no cgroup2 hierarchy is mounted")?;
    let own = proc_cgroup(std::process::id()).ok_or("this process has no cgroup v2 path")?;
    let path = format!("{}/{name}", own.trim_end_matches('/'));
    let base = CgroupBase { mount, path };
    let dir = base.dir(&base.path);
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(&dir).map_err(|e| e.to_string())?;
            let me = nix::unistd::geteuid().as_raw();
            if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
                return Err(format!(
                    "{} exists and is not this user's private cgroup",
                    dir.display()
                ));
            }
        }
        Err(e) => return Err(format!("mkdir {}: {e}", dir.display())),
    }
    Ok(base)
}

/// Make the cgroup of identity `key` and move process `pid` into it.
fn join_cgroup(base: &CgroupBase, key: &str, pid: u32) -> std::io::Result<Anchor> {
    use std::os::unix::fs::DirBuilderExt;
    let leaf = key.replace(':', "-");
    let path = format!("{}/{leaf}", base.path);
    let dir = base.dir(&path);
    std::fs::DirBuilder::new().mode(0o755).create(&dir)?;
    if let Err(e) = std::fs::write(dir.join("cgroup.procs"), format!("{pid}\n")) {
        let _ = std::fs::remove_dir(&dir);
        return Err(e);
    }
    Ok(Anchor::Cgroup { path, dir })
}

/// A name for this mount's cgroup subtree: `intentfs-` and the mountpoint, made safe.
pub fn cgroup_name(mountpoint: &Path) -> String {
    let key: String = mountpoint
        .to_string_lossy()
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let key = if key.len() > 200 {
        &key[key.len() - 200..]
    } else {
        &key
    };
    format!("intentfs-{key}")
}
