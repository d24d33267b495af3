//! Human approvals: a broker that parks requests until a person decides, and the channels
//! a person decides through (desktop notification, CLI socket, or an unattended allow/deny).
//!
//! This module owns the pending requests, their timeout, the channels and the record of
//! "expand scope" grants. It must not know about FUSE: a pending request carries a callback
//! ([`OnDecision`]), never a reply, and nothing here blocks the thread that asks. It does not
//! know about the ledger or the circuit breaker either: the filesystem ledgers decisions in
//! its callback and installs a reset hook ([`Broker::set_reset_hook`]).

mod broker;
mod decider;
mod desktop;
mod scope_updates;
pub mod socket;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use broker::{Broker, LIMIT_PREFIX, MAX_PENDING, MAX_PENDING_PER_IDENTITY};
pub use desktop::desktop_available;
pub use scope_updates::{record_scope_update, SCOPE_UPDATES_FILE};
pub use socket::peer_cred;

/// Why the filesystem asks a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskKind {
    /// A mutation outside the selected intent's `owned_scope` (`approval.out_of_scope: ask`).
    OutOfScope,
    /// A read of a sensitive path such as `.env` (`approval.sensitive_read: ask`).
    SensitiveRead,
    /// A delete (`approval.delete: ask`).
    Delete,
}

impl AskKind {
    /// The snake_case name used in [`PendingInfo::kind`] and on the socket.
    pub fn as_str(self) -> &'static str {
        match self {
            AskKind::OutOfScope => "out_of_scope",
            AskKind::SensitiveRead => "sensitive_read",
            AskKind::Delete => "delete",
        }
    }

    /// Whether `grant` makes sense for this kind of request: "for this file" only for
    /// out-of-scope writes and sensitive reads, "expand scope" only for out-of-scope writes.
    pub fn allows(self, grant: Grant) -> bool {
        match grant {
            Grant::Once => true,
            Grant::File => matches!(self, AskKind::OutOfScope | AskKind::SensitiveRead),
            Grant::ExpandScope => self == AskKind::OutOfScope,
        }
    }
}

/// How far an approval reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// This one operation.
    Once,
    /// This file, for the rest of the identity's session.
    File,
    /// Add the suggested glob to the identity's scope for its session, and record it in
    /// `.orchestration/pending_scope_updates.json` for the human to fold into the policy.
    ExpandScope,
}

impl Grant {
    /// The snake_case name used on the socket and in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Grant::Once => "once",
            Grant::File => "file",
            Grant::ExpandScope => "expand_scope",
        }
    }
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A person approved. `by` names the channel: `desktop`, `cli:uid=N`, `approver:allow`.
    Approved { grant: Grant, by: String },
    /// A person (or the unattended approver, or the unmount) refused. `by` as above, plus
    /// `approver:deny` and `unmount`.
    Rejected { by: String },
    /// Nobody answered within the timeout.
    TimedOut,
}

/// What the filesystem asks about.
#[derive(Clone, Debug)]
pub struct Ask {
    /// Why it asks.
    pub kind: AskKind,
    /// The identity key: `default` or `run:<pid>`.
    pub identity: String,
    /// The agent name the identity was given (`--agent`).
    pub agent: String,
    /// The identity's selected intent id, if any.
    pub intent: Option<String>,
    /// The operation, as the ledger names it: `open-write`, `unlink`, `read`, ...
    pub op: String,
    /// Workspace-relative path of the file concerned.
    pub path: PathBuf,
    /// The glob an "expand scope" grant would add (OutOfScope only).
    pub suggested_glob: String,
    /// Why the agent asks, in its own words, when it asked ahead (`.intentfs/approval`):
    /// the agent's text, shown to the human as such.
    pub reason: Option<String>,
}

/// A pending request as `intentfs approvals` and `.intentfs/status` show it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PendingInfo {
    /// The request id, for `intentfs approve ID`.
    pub id: u64,
    /// The identity key of the asking agent.
    pub identity: String,
    /// The agent name.
    pub agent: String,
    /// The selected intent, if any.
    pub intent: Option<String>,
    /// `out_of_scope`, `sensitive_read` or `delete`.
    pub kind: String,
    /// The operation (`open-write`, `unlink`, `read`, ...).
    pub op: String,
    /// Workspace-relative path.
    pub path: String,
    /// How long the request has been waiting, in milliseconds.
    pub age_ms: u64,
    /// Why the agent asks, in its own words, when it asked ahead (`.intentfs/approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Which channel decides (`mount --approver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Desktop notifications, with the CLI socket as a second channel.
    Desktop,
    /// The CLI socket only.
    Cli,
    /// Refuse every request at once (unattended runs).
    Deny,
    /// Approve every request at once, grant `once` (unattended runs).
    Allow,
}

/// How a broker runs.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// The channel(s) that decide.
    pub mode: Mode,
    /// How long a request waits before it is decided [`Decision::TimedOut`].
    pub timeout: std::time::Duration,
    /// Where to serve the CLI socket (outside the workspace and the mount); `None`: no socket.
    pub socket_path: Option<PathBuf>,
    /// The mount owner's uid: with root, the only peer the socket serves.
    pub owner_uid: u32,
    /// The mountpoint, shown in desktop prompts.
    pub mountpoint: PathBuf,
    /// The backing workspace, where "expand scope" grants are recorded.
    pub workspace: PathBuf,
}

/// What `intentfs run` asks the control socket for: an identity for the calling process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The agent name recorded in the ledger.
    pub agent: String,
    /// `run --intent ID`: the identity is locked to this intent.
    #[serde(default)]
    pub intent: Option<String>,
    /// `run --intents A,B` (or `all`): the identity may select among these.
    #[serde(default)]
    pub intents: Option<Vec<String>>,
    /// `run --require-read` (tightens the mount's setting, never loosens it).
    #[serde(default)]
    pub require_read: bool,
    /// `run --user`: the uid the command will run as (recorded).
    #[serde(default)]
    pub uid: Option<u32>,
}

/// The identity granted.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Registered {
    /// Its key (`run:<pid>`).
    pub identity: String,
    /// `cgroup` or `ancestry`: how its processes are recognised.
    pub tracking: String,
    /// The intent selected from the start, if any.
    pub intent: Option<String>,
}

/// A failed verification's lesson (`intentfs run --verify`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct LessonRequest {
    /// The identity that ran it (`run:<pid>`).
    pub identity: String,
    /// The command line.
    pub command: String,
    /// Its exit status.
    pub status: i32,
    /// The tail of its output.
    pub output: String,
}

/// The operator acknowledges files as they are on disk (`intentfs ledger ack`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// Workspace-relative paths.
    pub paths: Vec<String>,
    /// Why (recorded).
    #[serde(default)]
    pub note: Option<String>,
}

/// Put recorded versions back through the daemon (`intentfs restore`, `intentfs rewind`).
/// Plain data: the daemon plans from its ledger and store (`versions`) and applies the plan,
/// so the mount's caches see the change and each step is on record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// `restore` or `rewind`.
    pub command: String,
    /// restore: the workspace-relative path.
    #[serde(default)]
    pub path: Option<String>,
    /// restore: the entry (id, id prefix or `#line`) whose version to put back.
    #[serde(default)]
    pub to: Option<String>,
    /// restore: the version held just before this time (RFC 3339).
    #[serde(default)]
    pub before: Option<String>,
    /// rewind: the work of this agent (name or identity).
    #[serde(default)]
    pub agent: Option<String>,
    /// rewind: the work of this intent.
    #[serde(default)]
    pub intent: Option<String>,
    /// rewind: everything since this time (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// Overwrite what others changed since (the version overwritten is kept).
    #[serde(default)]
    pub force: bool,
}

/// The operator's requests on the control socket other than approvals, served by the
/// filesystem (which knows identities, the policy and the ledger). Only the mount's owner
/// and root reach them.
pub trait Operator: Send + Sync {
    /// Grant an identity to process `peer` (the `intentfs run` process).
    fn register(&self, peer: u32, req: RegisterRequest) -> Result<Registered, String>;
    /// Record a lesson; the file it went to.
    fn lesson(&self, req: LessonRequest) -> Result<String, String>;
    /// Record the files as the operator found them (`uid`: who asked); how many.
    fn ack(&self, uid: u32, req: AckRequest) -> Result<usize, String>;
    /// Put versions back (`pid`, `uid`: who asked); what was restored, removed and skipped,
    /// as JSON (the report type lives in a layer above this one).
    fn restore(&self, pid: u32, uid: u32, req: RestoreRequest)
        -> Result<serde_json::Value, String>;
}

/// Called exactly once with the decision: on the caller of [`Broker::ask`] in Deny/Allow
/// modes (and after unmount), else on one of the broker's few resume threads, never on
/// the channel that decided. It may re-run a filesystem operation, but a callback that
/// blocks for long holds a resume thread, and unmount waits for it.
pub type OnDecision = Box<dyn FnOnce(Decision) + Send + 'static>;
