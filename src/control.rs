//! The virtual `.intentfs/` directory at the mount root: the intent handshake through the
//! filesystem. It exists only in the mount, never in the workspace.
//!
//! | file | read | write |
//! |---|---|---|
//! | `intent` | the caller's selected intent id | an intent id: selects it for the caller's identity |
//! | `context` | the selected intent as an `<intent_context>` block | — |
//! | `intents` | the selectable intents | — |
//! | `last_error` | JSON of the caller's most recent denial | — |
//! | `status` | mount, identities, counters (JSON) | — |
//! | `session` | the caller's identity | a name: registers the caller's session (used by `intentfs run`) |
//! | `lesson` | — | JSON of a failed verification: appended to `CLAUDE.md` on close (`intentfs run --verify`) |
//!
//! Contents are rendered when the file is opened, so one open sees one consistent snapshot.

use std::ffi::OsStr;

use crate::fs::sys::Stat;
use crate::guard::{Identities, Identity};
use crate::policy::Policy;

/// Name of the control directory at the mount root.
pub const DIR_NAME: &str = ".intentfs";
/// Node id of the control directory.
pub const DIR_INO: u64 = 0xFFFF_FFFF_FFFF_FF00;

/// The files of the control directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtlFile {
    Intent,
    Context,
    Intents,
    LastError,
    Status,
    Session,
    Lesson,
}

pub const FILES: [CtlFile; 7] = [
    CtlFile::Intent,
    CtlFile::Context,
    CtlFile::Intents,
    CtlFile::LastError,
    CtlFile::Status,
    CtlFile::Session,
    CtlFile::Lesson,
];

impl CtlFile {
    pub fn name(self) -> &'static str {
        match self {
            CtlFile::Intent => "intent",
            CtlFile::Context => "context",
            CtlFile::Intents => "intents",
            CtlFile::LastError => "last_error",
            CtlFile::Status => "status",
            CtlFile::Session => "session",
            CtlFile::Lesson => "lesson",
        }
    }
    pub fn ino(self) -> u64 {
        DIR_INO + 1 + FILES.iter().position(|f| *f == self).unwrap_or(0) as u64
    }
    pub fn from_ino(ino: u64) -> Option<CtlFile> {
        ino.checked_sub(DIR_INO + 1)
            .and_then(|i| FILES.get(i as usize))
            .copied()
    }
    pub fn from_name(name: &OsStr) -> Option<CtlFile> {
        FILES.iter().copied().find(|f| OsStr::new(f.name()) == name)
    }
    pub fn writable(self) -> bool {
        matches!(self, CtlFile::Intent | CtlFile::Session | CtlFile::Lesson)
    }
}

/// Is this node id inside the control directory (the directory included)?
pub fn is_control(ino: u64) -> bool {
    ino == DIR_INO || CtlFile::from_ino(ino).is_some()
}

fn base_stat(ino: u64, mode: u32, nlink: u64, started: i64) -> Stat {
    // SAFETY-free: a zeroed stat is a valid value of this plain C struct.
    let mut st: Stat = unsafe { std::mem::zeroed() };
    st.st_ino = ino;
    st.st_mode = mode;
    st.st_nlink = nlink;
    // SAFETY: getuid/getgid have no preconditions.
    st.st_uid = unsafe { libc::getuid() };
    // SAFETY: as above.
    st.st_gid = unsafe { libc::getgid() };
    st.st_blksize = 4096;
    st.st_atime = started;
    st.st_mtime = started;
    st.st_ctime = started;
    st
}

/// Attributes of the control directory.
pub fn dir_stat(started: i64) -> Stat {
    base_stat(DIR_INO, libc::S_IFDIR | 0o555, 2, started)
}

/// Attributes of a control file. Its size is reported as 0: contents are generated on
/// open and served with direct I/O, so readers read until EOF.
pub fn file_stat(f: CtlFile, started: i64) -> Stat {
    let perm = if f.writable() { 0o666 } else { 0o444 };
    base_stat(f.ino(), libc::S_IFREG | perm, 1, started)
}

/// Mount-wide facts for `status`.
pub struct StatusInfo {
    pub workspace: String,
    pub mountpoint: String,
    pub policy: String,
    pub policy_error: Option<String>,
    pub nodes: usize,
    pub open_handles: usize,
    pub counters: serde_json::Value,
    /// Requests waiting for a human.
    pub pending: serde_json::Value,
}

/// Render a control file for `ident`.
pub fn render(
    f: CtlFile,
    ident: &Identity,
    ids: &Identities,
    policy: &Policy,
    info: &dyn Fn() -> StatusInfo,
) -> Vec<u8> {
    match f {
        CtlFile::Intent => ident.intent().map(|i| format!("{i}\n")).unwrap_or_default().into_bytes(),
        CtlFile::Context => match ident.intent().and_then(|i| policy.intent(&i).cloned()) {
            Some(it) => it.context_xml().into_bytes(),
            None => b"<intent_context>\n  <none>no intent selected: write an id from .intentfs/intents to .intentfs/intent</none>\n</intent_context>\n".to_vec(),
        },
        CtlFile::Intents => {
            let mut out = String::new();
            for it in policy.intents().iter().filter(|i| i.selectable()) {
                out.push_str(&format!("{}\t{}\t{}\n", it.id, it.name, it.owned_scope.join(" ")));
            }
            out.into_bytes()
        }
        CtlFile::LastError => match &*ident.last_error.lock() {
            Some(d) => {
                let mut s = d.to_json();
                s.push('\n');
                s.into_bytes()
            }
            None => b"{}\n".to_vec(),
        },
        CtlFile::Session => format!("{}\t{}\n", ident.key(), ident.name).into_bytes(),
        CtlFile::Lesson => Vec::new(),
        CtlFile::Status => {
            let i = info();
            let idents: Vec<_> = ids
                .all()
                .iter()
                .map(|id| {
                    serde_json::json!({
                        "identity": id.key(),
                        "agent": id.name,
                        "intent": id.intent(),
                        "mutations": id.mutations.load(std::sync::atomic::Ordering::Relaxed),
                        "denials": id.denials.load(std::sync::atomic::Ordering::Relaxed),
                        "stale_refusals": id.stale_refusals.load(std::sync::atomic::Ordering::Relaxed),
                        "files_seen": id.seen_count(),
                        "require_read": id.require_read,
                    })
                })
                .collect();
            let v = serde_json::json!({
                "mount": { "workspace": i.workspace, "mountpoint": i.mountpoint, "policy": i.policy,
                           "policy_reload_error": i.policy_error, "nodes": i.nodes, "open_handles": i.open_handles },
                "identities": idents,
                "pending_approvals": i.pending,
                "counters": i.counters,
            });
            let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
            s.push('\n');
            s.into_bytes()
        }
    }
}

/// Outcome of writing a control file.
pub enum WriteError {
    /// Not an intent id of the policy, or not selectable: `EINVAL`.
    Invalid(String),
    /// Not permitted: `EPERM`.
    NotPermitted(String),
}

/// Apply what was written to a control file (the whole buffer written so far, trimmed).
pub fn apply_write(
    f: CtlFile,
    ident: &Identity,
    ids: &Identities,
    policy: &Policy,
    pid: u32,
    text: &str,
) -> Result<(), WriteError> {
    let text = text.trim();
    match f {
        CtlFile::Intent => {
            if text.is_empty() {
                *ident.intent.lock() = None;
                return Ok(());
            }
            match policy.intent(text) {
                None => Err(WriteError::Invalid(format!("unknown intent {text:?}"))),
                Some(it) if !it.selectable() => Err(WriteError::Invalid(format!(
                    "intent {text} is not IN_PROGRESS"
                ))),
                Some(_) => {
                    *ident.intent.lock() = Some(text.to_string());
                    Ok(())
                }
            }
        }
        CtlFile::Session => {
            if text.is_empty() {
                return Ok(());
            }
            // `NAME` or `NAME require-read`.
            let mut words = text.split_whitespace();
            let name = words.next().unwrap_or("agent");
            let require_read = words.any(|w| w == "require-read");
            ids.register(pid, name, require_read)
                .map(drop)
                .map_err(|e| WriteError::NotPermitted(e.into()))
        }
        // Applied as a whole when the writer closes it (see `Fs::flush`).
        CtlFile::Lesson => Ok(()),
        _ => Err(WriteError::NotPermitted("read-only control file".into())),
    }
}
