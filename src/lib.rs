//! intentfs: a FUSE filesystem that governs AI coding agents at the filesystem layer.
//!
//! Layers, from the bottom up (a module never knows about the layers above it):
//! - [`stat`]: the kernel's `stat`, shared by `fs` and `control`.
//! - [`text`]: text an agent controls made safe to show a person (control characters
//!   escaped), for the desktop prompts and the command line.
//! - [`policy`]: pure YAML -> compiled policy (globset); decisions quote the rule that decided.
//! - [`approval`]: the human-approval broker and its channels (desktop, CLI socket).
//! - [`ledger`]: the append-only, hash-chained audit ledger (writer thread, reader, verify).
//! - [`telemetry`]: the ledger as OpenTelemetry logs over OTLP (a follower thread, an export).
//! - [`store`]: the content store: the bytes behind the ledger's content hashes (zstd,
//!   reflinks, dedup), and its retention (`gc`).
//! - [`versions`]: diffs, restore and rewind plans, the audit report, over the ledger and
//!   the content store.
//! - [`guard`]: the decision for one operation (intent, scope, protected paths, stale check).
//! - [`control`]: the virtual `.intentfs/` directory.
//! - [`latency`]: `--low-latency`, the CPU latency request held while requests arrive.
//! - [`fs`]: the passthrough core over `O_PATH` handles (`fs::Fs`), its governance
//!   (`fs::Gate`: each operation reads resolve → authorize → syscall → record) and its
//!   syscall wrappers (`fs::sys`).
//! - `fuse`: the adapter implementing `fuser::Filesystem`, the only module importing fuser.
//! - [`cli`]: the command line.
//!
//! `unsafe` (outside tests) lives in `fs::sys`, the passthrough's syscalls that no safe
//! wrapper covers (`openat` on `O_PATH` handles, `renameat2`, xattrs, ...), and in four
//! places where a safe API cannot exist, each with a `// SAFETY:` comment saying why it
//! holds: `stat::zeroed` (a C struct without `Default`), `cli::mount`'s `fork` (taken before
//! any thread exists), `cli::run`'s two `pre_exec` closures (a new session, the controlling
//! terminal, dropping to `--user`: plain syscalls between fork and exec), and `cli`
//! restoring SIGPIPE's default action. Every other syscall goes through nix or rustix.

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
pub mod store;
pub mod telemetry;
pub mod text;
pub mod versions;
