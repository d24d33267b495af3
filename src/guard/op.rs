//! The operations a decision is about, as the guard, `last_error` and the ledger name them.

use std::fmt;

use serde::Serialize;

/// An operation asked of the guard. Serialized as its name (`"write"`, `"rename"`, ...): the
/// names are part of `.intentfs/last_error` and of ledger `detail.op`, so they never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Read,
    Write,
    Create,
    Mkdir,
    Mknod,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    Truncate,
    Chmod,
    Chown,
    Utimes,
    Setxattr,
    Removexattr,
    /// A commit's content checked against the scope (a ref moved to a new commit).
    Commit,
    /// A git ref moved.
    Ref,
    /// An open for writing (a write handle is checked once, at open).
    #[serde(rename = "open-write")]
    OpenWrite,
    /// The intent handshake (`.intentfs/intent`).
    #[serde(rename = "select-intent")]
    SelectIntent,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Create => "create",
            Operation::Mkdir => "mkdir",
            Operation::Mknod => "mknod",
            Operation::Symlink => "symlink",
            Operation::Link => "link",
            Operation::Unlink => "unlink",
            Operation::Rmdir => "rmdir",
            Operation::Rename => "rename",
            Operation::Truncate => "truncate",
            Operation::Chmod => "chmod",
            Operation::Chown => "chown",
            Operation::Utimes => "utimes",
            Operation::Setxattr => "setxattr",
            Operation::Removexattr => "removexattr",
            Operation::Commit => "commit",
            Operation::Ref => "ref",
            Operation::OpenWrite => "open-write",
            Operation::SelectIntent => "select-intent",
        }
    }

    /// Makes a new entry (what a tool's temporary is born by).
    pub fn makes_entry(self) -> bool {
        matches!(
            self,
            Operation::Create | Operation::Mkdir | Operation::Mknod | Operation::Symlink
        )
    }

    /// Changes only an entry's attributes (times, mode, owner).
    pub fn sets_attributes(self) -> bool {
        matches!(
            self,
            Operation::Utimes | Operation::Chmod | Operation::Chown
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Operation;

    #[test]
    fn names_serialize_as_before() {
        for op in [
            Operation::Write,
            Operation::Rename,
            Operation::SelectIntent,
            Operation::Removexattr,
        ] {
            assert_eq!(
                serde_json::to_value(op).unwrap(),
                serde_json::Value::String(op.as_str().into())
            );
        }
        assert_eq!(Operation::SelectIntent.as_str(), "select-intent");
    }
}
