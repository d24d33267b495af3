//! The filesystem core's one error type and its single errno mapping.

use std::io;

use crate::guard::Denial;

/// A failed operation: an OS error from the backing filesystem, or a governance refusal.
pub enum FsError {
    /// An errno from the backing filesystem (or ours, e.g. `EINVAL`).
    Os(i32),
    /// Refused by governance: answered `EACCES`, explained in `last_error`.
    Denied(Box<Denial>),
    /// A human must decide: the adapter parks the request (see [`crate::fs::approve`]).
    Ask(Box<crate::fs::approve::AskSpec>),
}

impl FsError {
    /// The errno the syscall returns.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Os(e) => *e,
            FsError::Denied(_) | FsError::Ask(_) => libc::EACCES,
        }
    }
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> Self {
        FsError::Os(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// Shorthand for an errno.
pub fn err<T>(errno: i32) -> std::result::Result<T, FsError> {
    Err(FsError::Os(errno))
}

pub type Result<T> = std::result::Result<T, FsError>;

impl std::fmt::Debug for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsError::Os(e) => write!(f, "Os({e})"),
            FsError::Denied(d) => write!(f, "Denied({})", d.code),
            FsError::Ask(a) => write!(f, "Ask({})", a.rel.display()),
        }
    }
}
