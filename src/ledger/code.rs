//! Denial codes: the vocabulary shared by the guard (which refuses) and the ledger (which
//! records refusals).

use std::fmt;

use serde::Serialize;

/// Why an operation was refused (the guard's denial codes, as `last_error` and the ledger's
/// `code` name them). Every code answers `EACCES` to the syscall.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    NoIntent,
    ScopeViolation,
    ProtectedPath,
    StaleFile,
    SensitiveRead,
    ApprovalRejected,
    ApprovalTimeout,
    CircuitOpen,
    /// A handshake refused: an unknown, non-selectable or not-allowed intent id.
    InvalidIntent,
    /// The audit ledger cannot be written (disk full, failing): every mutation is refused
    /// until it can, so nothing is acknowledged without its entry.
    LedgerUnwritable,
    /// With kernel passthrough of file data (`--data passthrough`): another identity holds
    /// the file open for writing (the cross-identity write lease), so this write open is
    /// refused until it closes.
    WriteLeased,
    /// With kernel passthrough of file data: an intent switch while the identity holds
    /// files open for writing (their writes were authorized under the old intent and no
    /// longer reach the daemon to be re-checked).
    WritesOpen,
    /// A question for a human not asked: too many of this agent's (or of all agents')
    /// questions already wait (see `approval::broker::MAX_PENDING_PER_IDENTITY`).
    ApprovalsPending,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::NoIntent => "NO_INTENT",
            Code::ScopeViolation => "SCOPE_VIOLATION",
            Code::ProtectedPath => "PROTECTED_PATH",
            Code::StaleFile => "STALE_FILE",
            Code::SensitiveRead => "SENSITIVE_READ",
            Code::ApprovalRejected => "APPROVAL_REJECTED",
            Code::ApprovalTimeout => "APPROVAL_TIMEOUT",
            Code::CircuitOpen => "CIRCUIT_OPEN",
            Code::InvalidIntent => "INVALID_INTENT",
            Code::LedgerUnwritable => "LEDGER_UNWRITABLE",
            Code::WriteLeased => "WRITE_LEASED",
            Code::WritesOpen => "WRITES_OPEN",
            Code::ApprovalsPending => "APPROVALS_PENDING",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
