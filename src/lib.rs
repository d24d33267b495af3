//! intentfs: a FUSE filesystem that governs AI coding agents at the filesystem layer.
//!
//! Layers, from the bottom up (a module never knows about the layers above it):
//! - [`policy`]: pure YAML -> compiled policy (globset); decisions quote the rule that decided.
//! - [`approval`]: the human-approval broker and its channels (desktop, CLI socket).
//! - [`ledger`]: the append-only, hash-chained audit ledger (writer thread, reader, verify).
//! - [`guard`]: the decision for one operation (intent, scope, protected paths, stale check).
//! - [`fs`]: the passthrough core over `O_PATH` handles; the only `unsafe`.
//! - [`control`]: the virtual `.intentfs/` directory.
//! - [`latency`]: `--low-latency`, the CPU latency request held while requests arrive.
//! - `fuse`: the adapter implementing `fuser::Filesystem`, the only module importing fuser.
//! - [`cli`]: the command line.

pub mod approval;
pub mod cli;
pub mod control;
pub mod fs;
mod fuse;
pub mod guard;
pub mod latency;
pub mod ledger;
pub mod policy;
pub mod stat;
