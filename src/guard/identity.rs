//! Identities: who is acting. The mount has a default identity; a process tree started by
//! `intentfs run` registers its POSIX session as an identity of its own. A request is
//! attributed by its caller's session, read from `/proc/<pid>/stat`; a caller whose pid is
//! not visible (0, another pid namespace) falls back to the default identity.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::Denial;

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
}

impl Identity {
    fn new(name: String, session: Option<i32>, intent: Option<String>) -> Identity {
        Identity {
            name,
            session,
            intent: Mutex::new(intent),
            last_error: Mutex::new(None),
            denials: AtomicU64::new(0),
            mutations: AtomicU64::new(0),
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
        *self.last_error.lock() = Some(d.clone());
    }
}

/// All identities of one mount.
pub struct Identities {
    default: Arc<Identity>,
    sessions: RwLock<HashMap<i32, Arc<Identity>>>,
}

/// The session id and command name of a process, from `/proc/<pid>/stat`.
pub fn proc_session(pid: u32) -> Option<(i32, String)> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
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

/// The process name of a pid, for the ledger (empty when not visible).
pub fn proc_name(pid: u32) -> String {
    proc_session(pid).map(|(_, c)| c).unwrap_or_default()
}

impl Identities {
    pub fn new(default_name: String, default_intent: Option<String>) -> Identities {
        Identities {
            default: Arc::new(Identity::new(default_name, None, default_intent)),
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
    pub fn register(&self, pid: u32, name: &str) -> Result<Arc<Identity>, &'static str> {
        let (sid, _) =
            proc_session(pid).ok_or("the caller's process is not visible to the daemon")?;
        if sid as u32 != pid {
            return Err("only a session leader may register a session (intentfs run does this)");
        }
        let id = Arc::new(Identity::new(name.to_string(), Some(sid), None));
        self.sessions.write().insert(sid, id.clone());
        Ok(id)
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
