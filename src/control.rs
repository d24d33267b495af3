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
//! | `session` | the caller's identity: key, agent name, selectable intents | — |
//! | `check` | the answer to the request written on the same open file | a query: may the caller do `operation` to `path`? |
//! | `approval` | the outcome of the request written on the same open file | a request for a human's approval |
//!
//! `check` and `approval` are answered per open file description (one request each): the
//! caller writes a JSON request and reads the answer back from offset 0 of the same file
//! (see `fs::query`). A `check` has no side effect and is not recorded; an `approval` goes
//! to the same broker and ledger as the approvals refused operations ask for.
//!
//! Nothing written here grants, widens or resets anything: identities are granted by the
//! operator over the control socket (`intentfs run`), and an identity selects only among
//! the intents the operator allowed it.
//!
//! Contents are rendered when the file is opened, so one open sees one consistent snapshot.

use crate::guard::Operation;
use std::ffi::OsStr;

use crate::guard::{Code, Denial, Identities, Identity};
use crate::policy::Policy;
use crate::stat::{self, Stat};

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
    Check,
    Approval,
}

/// The control files, in node id order (new files are appended: node ids never move).
pub const FILES: [CtlFile; 8] = [
    CtlFile::Intent,
    CtlFile::Context,
    CtlFile::Intents,
    CtlFile::LastError,
    CtlFile::Status,
    CtlFile::Session,
    CtlFile::Check,
    CtlFile::Approval,
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
            CtlFile::Check => "check",
            CtlFile::Approval => "approval",
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
        matches!(self, CtlFile::Intent | CtlFile::Check | CtlFile::Approval)
    }

    /// A query file: a request written to an open file is answered on that file.
    pub fn is_query(self) -> bool {
        matches!(self, CtlFile::Check | CtlFile::Approval)
    }
}

/// Is this node id inside the control directory (the directory included)?
pub fn is_control(ino: u64) -> bool {
    ino == DIR_INO || CtlFile::from_ino(ino).is_some()
}

fn base_stat(ino: u64, mode: u32, nlink: u64, started: i64) -> Stat {
    let mut st = stat::zeroed();
    st.st_ino = ino;
    st.st_mode = mode;
    st.st_nlink = nlink;
    st.st_uid = nix::unistd::getuid().as_raw();
    st.st_gid = nix::unistd::getgid().as_raw();
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
    /// How requests reach the daemon.
    pub transport: Option<String>,
    /// How regular files' data travels: `daemon` or `passthrough` (`--data`).
    pub data: &'static str,
    /// When a close's entry is written: `sync` or `async` (`--record`).
    pub record: &'static str,
    pub counters: serde_json::Value,
    /// Requests waiting for a human.
    pub pending: serde_json::Value,
    /// The workspace-relative file lessons are appended to (`intentfs run --verify`).
    pub lessons_file: String,
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
        CtlFile::Intent => ident
            .intent()
            .map(|i| format!("{i}\n"))
            .unwrap_or_default()
            .into_bytes(),
        CtlFile::Context => match ident.intent().and_then(|i| policy.intent(&i).cloned()) {
            Some(it) => it.context_xml().into_bytes(),
            None => {
                let ids = selectable_for(ident, policy);
                format!(
                    "<intent_context>\n  <none>no intent selected: write one of these ids to .intentfs/intent: {}</none>\n{}</intent_context>\n",
                    if ids.is_empty() { "(none can be selected: ask the human)".to_string() } else { ids.join(", ") },
                    crate::policy::ON_REFUSAL
                )
                .into_bytes()
            }
        },
        CtlFile::Intents => {
            let mut out = String::new();
            for it in policy.intents().iter().filter(|i| i.selectable()) {
                out.push_str(&format!(
                    "{}\t{}\t{}\n",
                    it.id,
                    it.name,
                    it.owned_scope.join(" ")
                ));
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
        // Answered per open file: until a request is written, how to write one.
        CtlFile::Check => QUERY_USAGE_CHECK.as_bytes().to_vec(),
        CtlFile::Approval => QUERY_USAGE_APPROVAL.as_bytes().to_vec(),
        CtlFile::Session => format!(
            "{}\t{}\t{}\n",
            ident.key,
            ident.name,
            ident.allowed.describe()
        )
        .into_bytes(),
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
                        "probe_refusals": id.probes.load(std::sync::atomic::Ordering::Relaxed),
                        "stale_refusals": id.stale_refusals.load(std::sync::atomic::Ordering::Relaxed),
                        "files_seen": id.seen_count(),
                        "require_read": id.require_read,
                        "intents_allowed": id.allowed.describe(),
                        "tracking": ids.tracking_of(&id.key),
                        "uid": id.uid,
                    })
                })
                .collect();
            let v = serde_json::json!({
                "mount": { "workspace": i.workspace, "mountpoint": i.mountpoint, "policy": i.policy,
                           "policy_reload_error": i.policy_error, "nodes": i.nodes, "open_handles": i.open_handles,
                           "identity_tracking": ids.tracking(), "transport": i.transport, "data": i.data, "record": i.record,
                           "lessons_file": i.lessons_file },
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

/// What `check` shows before a request is written to it.
pub const QUERY_USAGE_CHECK: &str = r#"{"usage": "open read-write, write a request such as {\"path\": \"src/x.rs\", \"operation\": \"write\"}, read the answer back from offset 0"}
"#;
/// What `approval` shows before a request is written to it.
pub const QUERY_USAGE_APPROVAL: &str = r#"{"usage": "open read-write, write a request such as {\"path\": \"src/x.rs\", \"operation\": \"write\", \"reason\": \"why\"}: the write returns once a human decided; read the outcome back from offset 0"}
"#;

/// A refused write to a control file: the errno, and the refusal `last_error` shows.
pub struct WriteError {
    /// `EINVAL` (not an intent the policy can select), `EPERM` (not this identity's to
    /// select), `EACCES` (a read-only file).
    pub errno: i32,
    pub denial: Box<Denial>,
}

/// The selectable intent ids of the policy that `ident` may select, for messages.
fn selectable_for(ident: &Identity, policy: &Policy) -> Vec<String> {
    policy
        .intents()
        .iter()
        .filter(|i| i.selectable() && ident.allowed.allows(&i.id))
        .map(|i| i.id.clone())
        .collect()
}

fn handshake_denial(ident: &Identity, policy: &Policy, wanted: &str, message: String) -> Denial {
    let ids = selectable_for(ident, policy);
    let remedy = if ids.is_empty() {
        "No intent can be selected by this agent right now: stop and ask the human to set an intent \
         IN_PROGRESS or to start you with one."
            .to_string()
    } else {
        format!(
            "Write one of these ids to .intentfs/intent: {} (`echo {} > .intentfs/intent`), then read \
             .intentfs/context.",
            ids.join(", "),
            ids[0]
        )
    };
    Denial::new(
        Code::InvalidIntent,
        Operation::SelectIntent,
        std::path::Path::new(".intentfs/intent"),
        ident.intent().as_deref(),
        message,
        remedy,
    )
    .with_rule(Some(format!("intent {wanted:?}")))
}

/// Apply what was written to a control file (the whole buffer written so far, trimmed).
/// `Ok(Some((from, to)))` when the identity's intent changed.
#[allow(clippy::type_complexity)]
pub fn apply_write(
    f: CtlFile,
    ident: &Identity,
    policy: &Policy,
    text: &str,
) -> Result<Option<(Option<String>, Option<String>)>, WriteError> {
    let text = text.trim();
    if f != CtlFile::Intent {
        return Err(WriteError {
            errno: libc::EACCES,
            denial: Box::new(Denial::new(
                Code::ProtectedPath,
                Operation::Write,
                std::path::Path::new(DIR_NAME).join(f.name()).as_path(),
                ident.intent().as_deref(),
                format!(".intentfs/{} is read-only", f.name()),
                "Only .intentfs/intent can be written.".into(),
            )),
        });
    }
    let refuse = |errno, message| {
        Err(WriteError {
            errno,
            denial: Box::new(handshake_denial(ident, policy, text, message)),
        })
    };
    let to = if text.is_empty() {
        None
    } else {
        match policy.intent(text) {
            None => {
                return refuse(
                    libc::EINVAL,
                    format!("{text:?} is not an intent of the policy"),
                )
            }
            Some(it) if !it.selectable() => {
                return refuse(
                    libc::EINVAL,
                    format!(
                        "intent {text} is {}: only IN_PROGRESS intents can be selected{}",
                        it.status.as_str(),
                        if it.status.as_str() == "DONE" {
                            " (this one is finished)"
                        } else {
                            " (a human paused this one)"
                        }
                    ),
                )
            }
            Some(_) if !ident.allowed.allows(text) => {
                return refuse(
                    libc::EPERM,
                    format!(
                        "{} may not select {text}: the operator allowed {}",
                        ident.name,
                        ident.allowed.describe()
                    ),
                )
            }
            Some(_) => Some(text.to_string()),
        }
    };
    let mut cur = ident.intent.lock();
    if *cur == to {
        return Ok(None);
    }
    let from = std::mem::replace(&mut *cur, to.clone());
    Ok(Some((from, to)))
}
