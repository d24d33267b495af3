//! The operations of the core, one method each, in FUSE's vocabulary. Each mutating method
//! authorizes first (scope, protected paths, hard links), then acts through handles, then
//! ledgers the result.
//!
//! One file per family of operations; this module holds what they share.

mod attr;
mod ctl;
mod dirs;
mod entries;
mod files;
mod query;
mod rename;
mod restore;
mod xattr;

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::error::{err, FsError, Result};
use super::inode::{Node, ROOT};
use super::{sys, Caller, CtlHandle, Entry, FileHandle, Fs, Handle, Kept, OpenOpts, Owed};
use crate::control::{self, CtlFile};
use crate::guard::{Identity, Operation};
use crate::ledger::{Draft, MutationType};

/// Attribute changes requested by `setattr`.
#[derive(Default, Debug, Clone)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: sys::TimeSpec,
    pub mtime: sys::TimeSpec,
}

const MAX_SUBTREE: usize = 200_000;

fn check_name(name: &OsStr) -> Result<()> {
    if !sys::valid_name(name) {
        return err(libc::EINVAL);
    }
    if name.len() > 255 {
        return err(libc::ENAMETOOLONG);
    }
    Ok(())
}

fn is_ctl_name(parent: u64, name: &OsStr) -> bool {
    parent == ROOT && name == OsStr::new(control::DIR_NAME)
}

/// The intent a write handle was authorized under (none for read-only handles).
fn h_intent(write_rel: &Option<PathBuf>, ident: &crate::guard::Identity) -> Option<String> {
    write_rel.as_ref().and_then(|_| ident.intent())
}

/// Whether the caller is in group `gid`: its own gid, or one of its supplementary groups
/// (`Groups:` in `/proc/<pid>/status`; read only for this rare case).
fn in_group(caller: &Caller, gid: u32) -> bool {
    if caller.gid == gid {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{}/status", caller.pid))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
        })
        .unwrap_or(false)
}
