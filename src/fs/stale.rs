//! Context-rot protection in the core: what each identity saw, and the stale checks at
//! open-for-write, truncate, unlink and rename, plus the check that holds across a whole
//! write (another writer between this handle's writes is refused).
//!
//! How the check holds across the whole write: every write handle remembers the file's stamp
//! after its own last write (or its open). At each `write`, a different stamp means the
//! file changed in between; unless the latest change is this same identity's own write
//! (through another of its handles), the write is refused with `STALE_FILE`, so content
//! another agent or a human wrote while this handle was open is never silently overwritten.

use super::handle::WriteState;
use crate::guard::Operation;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::hash::{self, stamp_of};
use super::inode::Node;
use super::{sys, Caller, FileHandle, Fs, FsError, Result};
use crate::guard::stale::{judge_by, Seen, Stamp, Verdict};
use crate::guard::{Code, Denial, Identity};
use crate::ledger::{changed_ranges, Draft, MutationType};

/// Files larger than this get no pre-image and no line ranges.
pub(crate) const RANGE_LIMIT: u64 = 1024 * 1024;

/// The stamp compared between writes: identity and content-changing fields only.
fn race_stamp(st: &sys::Stat) -> Stamp {
    Stamp {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (0, 0),
    }
}

/// What the names of `detail.aliases` may take in an entry, at most: an entry's size stays
/// bounded (the ledger's reserve is counted in entries, see `ledger::writer`).
const ALIASES_BYTES: usize = 8 << 10;

/// A content entry of a file with several names (hard links) lists the others in
/// `detail.aliases`: they hold the same content (`ledger verify` and `log --path` follow
/// them). Names inside git's internals and names that are not UTF-8 are left out, and so
/// are the names past [`ALIASES_BYTES`] (counted in `detail.aliases_left_out`).
pub(crate) fn with_aliases(draft: &mut Draft, aliases: &[PathBuf]) {
    let mut taken = 0;
    let mut left_out = 0;
    let names: Vec<&str> = aliases
        .iter()
        .filter(|a| !untracked(a))
        .filter(|a| {
            taken += crate::ledger::entry::encoded_len(a) + 3;
            let fits = taken <= ALIASES_BYTES;
            left_out += usize::from(!fits);
            fits
        })
        .filter_map(|a| a.to_str())
        .collect();
    if !names.is_empty() || left_out > 0 {
        let d = draft.detail.get_or_insert_with(|| serde_json::json!({}));
        d["aliases"] = serde_json::json!(names);
        if left_out > 0 {
            d["aliases_left_out"] = serde_json::json!(left_out);
        }
    }
}

/// Git's internals (inside any `.git` directory) are neither ledgered nor tracked as seen,
/// file by file: git keeps its own locks.
pub(crate) fn untracked(rel: &Path) -> bool {
    crate::policy::git::in_git_dir(rel)
}

impl Fs {
    fn stale_denial(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        unread: bool,
        detail: &str,
    ) -> FsError {
        let (message, remedy) = if unread {
            (
                format!(
                    "{} exists and this agent never read it; read it first (--require-read)",
                    rel.display()
                ),
                format!(
                    "Read {} in full, then redo the change based on its current content.",
                    rel.display()
                ),
            )
        } else {
            (
                format!("{} changed since this agent last read it ({detail})", rel.display()),
                format!(
                    "Re-read {} now: another agent, a human or a tool changed it. Then redo your change on top of \
                     the current content instead of overwriting it.",
                    rel.display()
                ),
            )
        };
        let d = Denial::new(
            Code::StaleFile,
            op,
            rel,
            ident.intent().as_deref(),
            message,
            remedy,
        );
        self.gate.deny(ident, caller, d)
    }

    /// The stale check of an open file node (open for write, truncate): the kernel resolved
    /// the name the agent used before the request reached the daemon, so every view that
    /// may be the one the agent acted on counts, and any of them differing from the content
    /// now refuses:
    ///
    /// - the identity's view under every current name of the file (`rels`: hard links, and
    ///   the name a rename just gave it);
    /// - its view under each name the file recently lost to a rename, if recorded before that
    ///   rename. An open that the kernel resolved through `f` just before another identity
    ///   renamed `f` away reaches the daemon naming the file by its new name only; natively
    ///   the open would then write the renamed file, whose content the agent never saw as
    ///   `f`: that is a lost update, refused like any other. (A view of the old name recorded
    ///   after the rename is about whatever is there now, not this file.)
    ///
    /// The caller holds the file's stale lock ([`InodeTable::stale_locks`]), so no rename,
    /// truncation or write of the file runs between this check and the mutation it allows.
    pub(crate) fn check_stale_node(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        node: &Node,
        rels: &[PathBuf],
        fd: BorrowedFd<'_>,
    ) -> Result<()> {
        let mut views: Vec<(PathBuf, Option<(u32, Seen)>)> = rels
            .iter()
            .filter(|r| !untracked(r))
            .map(|r| (r.clone(), ident.seen_for(r, caller.pid)))
            .collect();
        let Some(first) = views.first().map(|(r, _)| r.clone()) else {
            return Ok(());
        };
        for (rel, at, _) in self.departed_rels(node, &ident.key()) {
            if untracked(&rel) || views.iter().any(|(r, _)| *r == rel) {
                continue;
            }
            if let Some(v) = ident.seen_for_before(&rel, caller.pid, at) {
                views.push((rel, Some(v)));
            }
        }
        self.judge_views(ident, caller, op, &first, fd, views)
    }

    /// The workspace paths of the names `node` recently lost to identities other than
    /// `except` (see `Node::departed`), with the tick and the time of each loss.
    pub(crate) fn departed_rels(
        &self,
        node: &Node,
        except: &str,
    ) -> Vec<(PathBuf, u64, std::time::Instant)> {
        node.departed(except)
            .into_iter()
            .filter_map(|(parent, name, at, when)| {
                let p = self.table.get(parent)?;
                Some((self.child_rel(&p, &name).ok()?, at, when))
            })
            .collect()
    }

    /// Judge the file behind `fd` against each view; `rel` names it in an `Unread` refusal.
    fn judge_views(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        fd: BorrowedFd<'_>,
        views: Vec<(PathBuf, Option<(u32, Seen)>)>,
    ) -> Result<()> {
        let st = sys::stat_fd(fd)?;
        let open = || sys::reopen_quiet(self.proc_fd.as_fd(), fd).ok();
        self.judge_views_of(ident, caller, op, rel, &st, &open, views)
    }

    /// [`Fs::judge_views`] of the file of stat `st`, opened by `open` only when its bytes
    /// are to be hashed.
    #[allow(clippy::too_many_arguments)]
    fn judge_views_of(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        st: &sys::Stat,
        open: &dyn Fn() -> Option<std::fs::File>,
        views: Vec<(PathBuf, Option<(u32, Seen)>)>,
    ) -> Result<()> {
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let now = stamp_of(st);
        // Another identity's write through a page it keeps mapped writable changes the
        // bytes without moving the stamp: while that may be, the stamp vouches for nothing,
        // and neither does a hash remembered for it.
        let mapped = self.may_be_mapped(st.st_dev, st.st_ino);
        if mapped {
            self.hashes.forget(st.st_dev, st.st_ino);
        }
        // The content now, hashed at most once and only when a view's stamp differs (or
        // the file may be mapped).
        let mut hashed: Option<Option<[u8; 32]>> = None;
        let mut hash_now = || {
            *hashed.get_or_insert_with(|| {
                let f = open()?;
                if mapped {
                    // (Its bytes, not a hash another request may have remembered for the
                    // stamp since it was forgotten above.)
                    return hash::hash_stream(&f).ok().map(|(h, _)| h);
                }
                self.hashes.hash(&f).ok().map(|(h, _)| h)
            })
        };
        if views.iter().all(|(_, v)| v.is_none()) {
            return if ident.require_read {
                Err(self.stale_denial(ident, caller, op, rel, true, ""))
            } else {
                Ok(())
            };
        }
        // The file is exactly as this identity's own last write through an open handle left
        // it (a `write`, a page of a shared mapping written back, `fallocate`,
        // `copy_file_range`, a truncation through the handle): whatever the views say, the
        // difference is the identity's own doing, and it never goes stale against itself
        // (rust-lld truncates its output, fills it through `mmap`, then renames it).
        if self.own_last_change(ident, st) {
            if let Some(h) = hash_now() {
                for (vrel, seen) in &views {
                    if let Some((pid, _)) = seen {
                        ident.saw(
                            vrel,
                            *pid,
                            Seen {
                                stamp: now,
                                hash: h,
                            },
                        );
                    }
                }
            }
            return Ok(());
        }
        let mut refresh = Vec::new();
        for (vrel, seen) in &views {
            let Some((pid, seen)) = seen else { continue };
            let v = judge_by(Some(seen), now, false, !mapped, &mut hash_now);
            tracing::debug!(
                agent = %ident.name, op = %op, rel = %vrel.display(), ino = now.ino,
                seen_ino = seen.stamp.ino, seen = %hex::encode(&seen.hash[..6]),
                fresh = matches!(v, Verdict::Fresh(_)), "stale check"
            );
            match v {
                Verdict::Fresh(Some(s)) => refresh.push((vrel, *pid, s)),
                Verdict::Fresh(None) | Verdict::Unread => {}
                Verdict::Stale { seen, now } => {
                    return Err(self.stale_denial(
                        ident,
                        caller,
                        op,
                        vrel,
                        false,
                        &format!(
                            "seen {}, now {}",
                            &hash::to_string(&seen)[..19],
                            &hash::to_string(&now)[..19]
                        ),
                    ))
                }
            }
        }
        for (vrel, pid, s) in refresh {
            ident.saw(vrel, pid, s);
        }
        Ok(())
    }

    /// Whether the file behind `st` is exactly as `ident`'s own last write through an open
    /// handle left it, or `ident` holds it open for writing with kernel passthrough (see
    /// [`Fs::pt_holds`]): the stale checks never find it stale against `ident`.
    pub(crate) fn own_last_change(&self, ident: &Identity, st: &sys::Stat) -> bool {
        self.last_writer
            .lock()
            .get(&(st.st_dev, st.st_ino))
            .is_some_and(|(k, s)| *k == ident.key && *s == race_stamp(st))
            || self.pt_holds(ident, st.st_dev, st.st_ino)
    }

    /// The stale check for `parent_fd/name` (unlink, rename), whose stat `st` the caller
    /// took under the file's stale lock ([`Fs::lock_names`]): the file is opened only if
    /// its bytes are to be hashed (a view with another stamp, or a file that may be mapped),
    /// and then only if the name still holds that file (a rename from outside the mount in
    /// between: refused as stale, the file that would be changed being unknown).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_stale_at(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        parent_fd: BorrowedFd<'_>,
        name: &std::ffi::OsStr,
        st: &sys::Stat,
    ) -> Result<()> {
        if untracked(rel) {
            return Ok(());
        }
        let views = vec![(rel.to_path_buf(), ident.seen_for(rel, caller.pid))];
        let open = || {
            let fd = sys::open_path(parent_fd, name).ok()?;
            let now = sys::stat_fd(fd.as_fd()).ok()?;
            ((now.st_dev, now.st_ino) == (st.st_dev, st.st_ino))
                .then(|| sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()).ok())
                .flatten()
        };
        self.judge_views_of(ident, caller, op, rel, st, &open, views)
    }

    /// Record what the file holds now as seen by `h`'s identity, before (or without) any
    /// read request: at open when no request may come (page cache kept, passthrough, an
    /// empty file) or while other handles overlap (see `Fs::note_open`). Once per handle;
    /// never after an exact record, and it does not stop a later read request from
    /// recording exactly what it returned.
    pub(crate) fn record_read_provisional(&self, h: &FileHandle, pid: u32) {
        {
            let mut r = h.read_state();
            if r.recorded || std::mem::replace(&mut r.provisional, true) {
                return;
            }
        }
        self.record_content_now(h, pid, "read recorded (provisional)");
    }

    /// A read that cannot be recorded exactly (not from offset 0, or not to the end):
    /// what the file holds now, once per handle.
    pub(crate) fn record_read(&self, h: &FileHandle, pid: u32) {
        if std::mem::replace(&mut h.read_state().recorded, true) {
            return;
        }
        self.record_content_now(h, pid, "read recorded");
    }

    /// Record the file's content now as seen by `h`'s identity under the names it was
    /// reached by.
    fn record_content_now(&self, h: &FileHandle, pid: u32, what: &str) {
        self.record_seen(h, pid, what, || {
            let (hash, stamp) = self.hashes.hash(&h.file).ok()?;
            Some(Seen { stamp, hash })
        });
    }

    /// The first read through a handle returned the whole file (`bytes`, read from offset 0
    /// up to end of file, the file's stamp being `before` just before reading): record
    /// exactly what the identity got, not what the file holds a moment later (another
    /// identity may have written it in between, and hashing the file then would credit
    /// the reader with a version it never saw). When the stamp moved during the read, the
    /// view gets a stamp that matches no file, so the next check compares content.
    pub(crate) fn record_read_bytes(&self, h: &FileHandle, pid: u32, before: Stamp, bytes: &[u8]) {
        if std::mem::replace(&mut h.read_state().recorded, true) {
            return;
        }
        self.record_seen(h, pid, "read recorded (bytes)", || {
            let after = sys::stat_fd(h.file.as_fd()).ok().map(|s| stamp_of(&s));
            let exact = after == Some(before) && before.size == bytes.len() as u64;
            // Unchanged while it was read: the bytes are the content at `before`, which
            // the hash cache may know already (the WRITE entry that made it, another
            // identity's read): a read never hashes what is known. A hash taken here is
            // kept for the stale checks and the next reader.
            let hash = self.hashes.of_bytes(exact.then_some(before), bytes);
            let stamp = if exact {
                before
            } else {
                Stamp {
                    ctime: (i64::MIN, 0),
                    ..before
                }
            };
            Some(Seen { stamp, hash })
        });
    }

    /// Record `seen()` (computed only when the handle has a name to record it under) as
    /// what `h`'s identity saw under every name the file was reached by.
    fn record_seen(
        &self,
        h: &FileHandle,
        pid: u32,
        what: &str,
        seen: impl FnOnce() -> Option<Seen>,
    ) {
        let rels = self.read_rels(h);
        if rels.is_empty() {
            tracing::debug!(agent = %h.identity.name, ino = h.node.ino, open_rels = ?h.open_rels, "read not recorded: no name");
            return;
        }
        let Some(s) = seen() else { return };
        tracing::debug!(
            agent = %h.identity.name, rels = ?rels, ino = s.stamp.ino, size = s.stamp.size,
            hash = %hex::encode(&s.hash[..6]), "{what}"
        );
        for rel in &rels {
            h.identity.saw(rel, pid, s);
        }
    }

    /// After a WRITE entry of `h`: the identity wrote the file it reached through the names
    /// it opened it by, so its view under those names is its own content too, even when
    /// another identity renamed the file away meanwhile (the entry and the view then carry
    /// the new name). Without this, a later open of the old name, now holding a file some
    /// other identity put there, would find no view and overwrite a version the identity
    /// never saw.
    pub(crate) fn note_open_names(&self, h: &FileHandle) {
        let aliases = self.alias_rels(&h.node);
        tracing::debug!(agent = %h.identity.name, open_rels = ?h.open_rels, aliases = ?aliases, "note open names");
        if h.open_rels.iter().all(|r| aliases.contains(r)) {
            return;
        }
        let Ok(current) = self.node_rels(&h.node) else {
            tracing::debug!(agent = %h.identity.name, "note open names: no current name");
            return;
        };
        let Some((_, seen)) = current
            .iter()
            .find_map(|r| h.identity.seen_for(r, h.caller.pid))
        else {
            tracing::debug!(agent = %h.identity.name, current = ?current, "note open names: no view under the current names");
            return;
        };
        for r in &h.open_rels {
            if !current.contains(r) && !r.as_os_str().is_empty() && !untracked(r) {
                h.identity.saw_own(r, h.caller.pid, seen);
            }
        }
    }

    /// The names a read through `h` is recorded under: the file's names now and at open.
    fn read_rels(&self, h: &FileHandle) -> Vec<PathBuf> {
        let mut rels: Vec<PathBuf> = Vec::new();
        for r in self
            .alias_rels(&h.node)
            .into_iter()
            .chain(h.open_rels.iter().cloned())
        {
            if !r.as_os_str().is_empty() && !untracked(&r) && !rels.contains(&r) {
                rels.push(r);
            }
        }
        rels
    }

    /// Before a write through `h`: refuse if someone else changed the file since this
    /// handle's last own write. Content changes move size or mtime; ctime alone (the
    /// writer's own chmod/chown, as `sed -i` does on its temp file) does not count.
    pub(crate) fn check_write_race(&self, h: &FileHandle) -> Result<()> {
        let cur = race_stamp(&sys::stat_fd(h.file.as_fd())?);
        let expected = {
            let Some(mut w) = h.write_state() else {
                return Ok(());
            };
            if w.expected == Some(cur) {
                return Ok(());
            }
            if w.pt && w.outside.is_empty() {
                // Its own writes moved the stamp without the daemon (the lease keeps other
                // identities out; the watcher names writers outside the mount).
                w.expected = Some(cur);
                return Ok(());
            }
            w.disturbed = true;
            w.expected
        };
        let key = h.identity.key();
        let ours = self
            .last_writer
            .lock()
            .get(&(cur.dev, cur.ino))
            .map(|(k, s)| *k == key && *s == cur)
            .unwrap_or(false);
        if ours || expected.is_none() {
            return Ok(());
        }
        let rel = self.display_rel(&h.node);
        Err(self.stale_denial(
            &h.identity,
            &h.caller,
            Operation::Write,
            &rel,
            false,
            "written by someone else while this agent had it open",
        ))
    }

    /// The hash a handle took while writing the file in order (see [`hash::SeqHash`]),
    /// if the file is still exactly that: untouched since the handle's last write.
    fn seq_hash(&self, h: &FileHandle, f: &std::fs::File) -> Option<([u8; 32], Stamp)> {
        let mut w = h.write_state()?;
        let st = sys::stat_fd(f.as_fd()).ok()?;
        if Some(race_stamp(&st)) != w.expected {
            w.seq.off();
            return None;
        }
        let h32 = w.seq.finish(st.st_size as u64)?;
        drop(w);
        let after = sys::stat_fd(f.as_fd()).ok()?;
        if race_stamp(&after) != race_stamp(&st) {
            return None;
        }
        let stamp = hash::stamp_of(&after);
        self.hashes.insert(stamp, h32);
        Some((h32, stamp))
    }

    /// Whether the file behind `h` changed after the handle's last own change, by someone
    /// other than its identity.
    fn superseded(&self, h: &FileHandle) -> bool {
        let Some(expected) = h.write_state().and_then(|w| w.expected) else {
            return false;
        };
        if h.write_state().is_some_and(|w| w.pt) {
            // Its own writes moved the stamp without the daemon: only what the watcher
            // saw from other processes counts (recorded in the entry, see `record_write`).
            return false;
        }
        let Ok(st) = sys::stat_fd(h.file.as_fd()) else {
            return false;
        };
        let cur = race_stamp(&st);
        if cur == expected {
            return false;
        }
        let key = h.identity.key();
        !self
            .last_writer
            .lock()
            .get(&(cur.dev, cur.ino))
            .is_some_and(|(k, s)| *k == key && *s == cur)
    }

    /// After a write through `h`: remember the stamp it left.
    pub(crate) fn after_write(&self, h: &FileHandle) {
        let Some(mut w) = h.write_state() else { return };
        w.own_writes = true;
        if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
            w.expected = Some(race_stamp(&st));
            drop(w);
            self.note_own_change(&h.node, &h.identity, &st);
        }
    }

    /// The identity changed this file's content itself (a write, a truncate, utimes): its
    /// other open write handles must not take that for someone else's change.
    /// Only write handles open on the inode consult it, so it is kept only while one is
    /// (entries for every file ever written made a long-running daemon grow by ~250 bytes
    /// a file).
    pub(crate) fn note_own_change(&self, node: &Node, ident: &Identity, st: &sys::Stat) {
        let s = race_stamp(st);
        let writers = writers_open(node);
        let mut lw = self.last_writer.lock();
        if !writers {
            lw.remove(&(s.dev, s.ino));
            return;
        }
        if lw.len() > 100_000 {
            lw.clear();
        }
        lw.insert((s.dev, s.ino), (ident.key(), s));
    }

    /// A handle closed (after its last ledger entry). It leaves its node's list: the node
    /// outlives its handles (the kernel keeps it while the name is cached), and a `Weak`
    /// keeps a closed handle's memory (~350 bytes; a walk that read 50,000 files kept
    /// 50,000 of them). When it was the inode's last write handle, who wrote the inode
    /// last no longer matters.
    pub(crate) fn handle_closed(&self, h: &Arc<FileHandle>) {
        h.node
            .handles
            .lock()
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(h)));
        if h.writable && !writers_open(&h.node) {
            self.last_writer.lock().remove(&(h.node.dev, h.node.ino));
        }
    }

    /// At open-for-write: remember the stamp to compare later writes against, and the
    /// previous content hash when the cache already knows it (never reads the file: the
    /// pre-image for line ranges is taken at the first write, see [`Fs::before_modify`]).
    pub(crate) fn prepare_write_handle(&self, h: &FileHandle, rel: &Path) {
        let Some(mut w) = h.write_state() else { return };
        if w.pt {
            // Its writes bypass the daemon: the pre-image and the begin were taken at
            // open, its WRITE is owed from now on, and no write feeds the in-order hash.
            w.pre_captured = true;
            w.own_writes = true;
            w.dirty = w.begun;
            w.seq.off();
            if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
                w.expected = Some(race_stamp(&st));
            }
            return;
        }
        if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
            w.expected = Some(race_stamp(&st));
            if st.st_size == 0 {
                w.seq = hash::SeqHash::start();
            }
            if untracked(rel) || w.created {
                return;
            }
            if w.prev_hash.is_none() {
                if let Some(hh) = self.hashes.cached(&stamp_of(&st)) {
                    w.prev_hash = Some(hash::to_string(&hh));
                }
            }
        }
    }

    /// The cross-identity write lease (kernel passthrough of data): while one identity
    /// holds `node` open for writing, another identity's write open is refused, naming
    /// the holder. It stands in for the per-write check that no one else wrote in between
    /// (writes no longer reach the daemon). Called under the file's stale lock, which
    /// every write open takes: two opens cannot both miss each other.
    pub(crate) fn check_lease(
        &self,
        ident: &Arc<Identity>,
        caller: &Caller,
        op: Operation,
        node: &Node,
        rel: &Path,
    ) -> Result<()> {
        let open = node.open_file_handles();
        let Some(holder) = open
            .iter()
            .find(|h| h.writable && h.identity.key != ident.key)
        else {
            return Ok(());
        };
        // (The opener may have exited while a child or a mapping of the file holds it.)
        let process = match crate::guard::identity::proc_name(holder.caller.pid) {
            n if n.is_empty() => "exited".to_owned(),
            n => n,
        };
        let who = format!(
            "agent {:?} (intent {}, pid {}, {process})",
            holder.identity.name,
            holder.identity.intent().as_deref().unwrap_or("none"),
            holder.caller.pid,
        );
        let d = Denial::new(
            Code::WriteLeased,
            op,
            rel,
            ident.intent().as_deref(),
            format!("{} is open for writing by {who}", rel.display()),
            format!(
                "Another agent is changing {} right now. Wait until it closes the file, then \
                 re-read it and make your change on top of its content.",
                rel.display()
            ),
        );
        Err(self.gate.deny(ident, caller, d))
    }

    /// With kernel passthrough of data: whether a writable shared mapping of the file
    /// `(dev, ino)` may exist, that is, whether a passthrough handle opened for reading and
    /// writing is alive on it (open, or kept after its release while its file stays
    /// mapped: [`linger_while_mapped`]). A write through a page already mapped writable
    /// moves neither the size nor the times, so while this holds a stamp says nothing of
    /// the bytes: the stale checks and the versions kept before an unlink or a rename over
    /// the file hash what the file holds.
    pub(crate) fn may_be_mapped(&self, dev: u64, ino: u64) -> bool {
        self.data_passthrough()
            && self.table.by_backing(dev, ino).is_some_and(|n| {
                n.open_file_handles()
                    .iter()
                    .any(|h| h.write_state().is_some_and(|w| w.pt && w.rdwr))
            })
    }

    /// The hash of `bytes`, a whole file read at the stamp `at` (None: it moved while they
    /// were read): the one known for that stamp unless the file may be mapped writable
    /// ([`Fs::may_be_mapped`]), else hashed (and remembered for the stamp).
    pub(crate) fn hash_read(&self, bytes: &[u8], at: Option<Stamp>) -> [u8; 32] {
        let at = at.filter(|s| !self.may_be_mapped(s.dev, s.ino));
        self.hashes.of_bytes(at, bytes)
    }

    /// With kernel passthrough of data: whether `ident` holds the file open for writing
    /// and nothing outside its processes wrote it meanwhile. Its own writes through that
    /// handle are then the only changes the daemon has not seen (they are on record at its
    /// flush and release), and they never make it stale against itself. (The write lease
    /// keeps other identities out while it holds the file.)
    pub(crate) fn pt_holds(&self, ident: &Identity, dev: u64, ino: u64) -> bool {
        if !self.data_passthrough() {
            return false;
        }
        let Some(node) = self.table.by_backing(dev, ino) else {
            return false;
        };
        let open = node.open_file_handles();
        open.iter().any(|h| {
            h.identity.key == ident.key
                && h.write_state()
                    .is_some_and(|w| w.pt && w.outside.is_empty())
        })
    }

    /// The watcher saw process `pid` (not the daemon) change `node`'s content. With
    /// passthrough write handles open on it, that is either one of theirs (the process
    /// that opened it, or another process of the same granted identity: true, nothing
    /// for the kernel to drop, it made the change) or a writer outside the mount, which
    /// each such handle records at release (false).
    pub(crate) fn pt_write_seen(&self, node: &Node, pid: i32) -> bool {
        let open = node.open_file_handles();
        let pt: Vec<&Arc<FileHandle>> = open
            .iter()
            .filter(|h| h.write_state().is_some_and(|w| w.pt))
            .collect();
        if pt.is_empty() {
            return false;
        }
        let writers: Vec<i32> = pt
            .iter()
            .filter_map(|h| h.write_state().map(|w| w.writers.clone()))
            .flatten()
            .collect();
        // The process that opened it, or one it started (a subshell or a command writing
        // to an inherited descriptor).
        let lineage = descends_from(pid as u32, &writers);
        if lineage == Some(true) {
            return true;
        }
        let ident = self.gate.ids.resolve(pid as u32);
        if lineage.is_some()
            && ident.key != "default"
            && pt.iter().any(|h| h.identity.key == ident.key)
        {
            return true;
        }
        // A process gone before its event was read cannot be told apart: it may have
        // written through a descriptor it inherited from the agent. It is named, but not
        // taken for an outsider (the identity's views stay its own).
        let list = if lineage.is_none() {
            "unattributed"
        } else {
            "outside"
        };
        let who = serde_json::json!({
            "pid": pid,
            "process": crate::guard::identity::proc_name(pid as u32),
            "identity": ident.key,
            "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        });
        for h in pt {
            if let Some(mut w) = h.write_state() {
                let v = if list == "outside" {
                    &mut w.outside
                } else {
                    &mut w.unattributed
                };
                // One mention per process (a writer's events come in bursts), a few at most.
                if v.len() < 8 && !v.iter().any(|o| o["pid"] == who["pid"]) {
                    v.push(who.clone());
                }
            }
        }
        false
    }

    /// The devices a mapping of `node`'s file may name: the mount's and the backing
    /// file's; none while the mount's is not known (see [`maps_shared`]).
    fn mapping_devs(&self, node: &Node) -> Vec<u64> {
        self.mount_dev
            .get()
            .map(|&m| vec![m, node.dev])
            .unwrap_or_default()
    }

    /// Whether process `pid` (a thread of it) maps `h`'s file shared (see [`maps_shared`]):
    /// a passthrough handle's process at a close.
    pub(crate) fn pt_mapped_by(&self, h: &FileHandle, pid: u32) -> bool {
        h.write_state().is_some_and(|w| w.pt && w.rdwr)
            && maps_shared(
                crate::guard::identity::tgid_of(pid),
                h.node.ino,
                &self.mapping_devs(&h.node),
            )
    }

    /// A passthrough write handle's file still mapped shared: with kernel
    /// passthrough the mapping holds the backing file itself, so it goes on writing after
    /// the handle's release. The processes among `h`'s (those that opened it or closed a
    /// descriptor of it), the processes in `also` (mappers found before: a child that
    /// inherited the mapping is no one's descendant once its parent exited) and their
    /// descendants that map it.
    pub(crate) fn pt_mappers(&self, h: &FileHandle, also: &[u32]) -> Vec<u32> {
        // (A mapping through another, read-write, handle is that handle's to find.)
        let Some((writers, untracked)) = h
            .write_state()
            .filter(|w| w.pt && w.rdwr)
            .map(|w| (w.writers.clone(), w.closers_untracked))
        else {
            return Vec::new();
        };
        let (ino, devs) = (h.node.ino, self.mapping_devs(&h.node));
        if untracked {
            // (Rare: a handle closed by more than 64 processes, or handed to another
            // identity. Every process is looked at: hundreds of small reads.)
            return every_mapper(ino, &devs);
        }
        let mut seen = Vec::new();
        let mut found = Vec::new();
        let mut todo: Vec<u32> = writers.iter().map(|&p| p as u32).collect();
        todo.extend_from_slice(also);
        // And every process of the handle's identity: a child that took the mapping over
        // and whose parent exited between two looks is no one's descendant here, but it
        // stays in the identity's cgroup, or becomes a child of its `intentfs run` (found
        // open: forked after the close, `setsid`, parent gone, it wrote unrecorded).
        let roots = self.gate.ids.member_roots(&h.identity.key());
        let no_roots = roots.is_empty();
        todo.extend(roots);
        // (A tree of more than 512 processes is not walked further: every process is
        // looked at instead, as for untracked closers.)
        while let Some(pid) = todo.pop() {
            if seen.len() >= 512 {
                return every_mapper(ino, &devs);
            }
            if seen.contains(&pid) {
                continue;
            }
            seen.push(pid);
            if maps_shared(pid, ino, &devs) {
                found.push(pid);
            }
            todo.extend(proc_children(pid));
        }
        // The mappers known before are gone and nothing of the tree maps the file: for an
        // identity without a set of its processes (a mount's default identity: no cgroup,
        // no `intentfs run`) a mapper may have forked and exited between two looks, its
        // child nobody's descendant now. Before the file is taken as unmapped (and may be
        // put into place as a ref or `.git/config`), every process is looked at.
        if found.is_empty() && !also.is_empty() && no_roots {
            return every_mapper(ino, &devs);
        }
        found
    }

    /// A passthrough write handle (see [`WriteState::pt`]): whether the file changed since
    /// its open or its last entry (its writes moved the stamp without the daemon); if so,
    /// a `WRITE` is owed.
    pub(crate) fn pt_changed(&self, h: &FileHandle) -> bool {
        let Some(mut w) = h.write_state() else {
            return false;
        };
        if !w.pt {
            return false;
        }
        let Ok(st) = sys::stat_fd(h.file.as_fd()) else {
            return false;
        };
        if w.expected == Some(race_stamp(&st)) && w.outside.is_empty() {
            return false;
        }
        w.dirty = true;
        true
    }

    /// Before a handle changes the file (write, fallocate, copy_file_range): re-authorize if
    /// the identity switched intent or the policy reloaded since the handle was opened,
    /// refuse if someone else wrote in between, and take the pre-image at the first change.
    pub(crate) fn before_modify(&self, h: &FileHandle) -> Result<()> {
        // A tripped breaker stops writes through handles opened before it tripped too.
        if h.identity.tripped.load(Ordering::Acquire) {
            return self
                .authorize_node(&h.caller, Operation::Write, &h.node)
                .map(drop)
                .and(Err(FsError::Os(libc::EACCES)));
        }
        let now = (h.identity.intent(), self.gate.guard.generation());
        let Some(epoch) = h.write_state().map(|w| w.epoch.clone()) else {
            return Err(FsError::Os(libc::EBADF));
        };
        if epoch != now {
            match self.authorize_node(&h.caller, Operation::Write, &h.node) {
                Ok(_) => {
                    if let Some(mut w) = h.write_state() {
                        w.epoch = now;
                    }
                }
                Err(FsError::Ask(spec)) => {
                    return Err(self.gate.deny(&spec.ident, &spec.caller, spec.denial))
                }
                Err(e) => return Err(e),
            }
        }
        self.check_write_race(h)?;
        // The content before the first change: in the store before `WRITE_BEGIN` names it.
        self.keep_before(h);
        self.begin_write(h)
    }

    /// Put the handle's `WRITE_BEGIN` on record before its first change lands (once per
    /// handle; a handle that created its file has its `CREATE`). The entry names the
    /// content before (when known) and the handle's token; if it cannot be written, the
    /// change is refused like any mutation the ledger cannot take.
    pub(crate) fn begin_write(&self, h: &FileHandle) -> Result<()> {
        let (prev, token) = {
            let Some(mut w) = h.write_state() else {
                return Ok(());
            };
            if std::mem::replace(&mut w.begun, true) {
                return Ok(());
            }
            (w.prev_hash.clone(), w.token.clone())
        };
        let rel = self.display_rel(&h.node);
        let r = self.record_begin(&h.identity, &h.caller, &rel, prev, &token);
        if r.is_err() {
            if let Some(mut w) = h.write_state() {
                w.begun = false;
            }
        }
        r
    }

    /// Ledger a handle's writes if it wrote since its last entry, and record the result as
    /// seen by its identity (its own writes never make it stale).
    pub(crate) fn record_write(&self, h: &FileHandle) -> Result<()> {
        let created = {
            let Some(mut w) = h.write_state() else {
                return Ok(());
            };
            if !std::mem::take(&mut w.dirty) {
                return Ok(());
            }
            w.wrote = false;
            std::mem::take(&mut w.created)
        };
        // The file may have lost every name while open (renamed over, deleted): the entry
        // then keeps the name it was written under and says it is detached, so `ledger
        // verify` does not expect its content at that path any more.
        // (`--record async`: the name the file had when its close was answered; a rename
        // of it or of a directory above waits for this entry, so the name still holds.)
        let at_close = h.write_state().and_then(|mut w| w.at_close.take());
        let close_agent = at_close.as_ref().map(|(_, a)| a.clone());
        // (A file with several names, hard links: the entry is under one of them and lists
        // the others, which hold the same content.)
        let mut names = match at_close {
            Some((rels, _)) => rels,
            // (Or, the kernel having forgotten the directories above it, where this
            // handle's file is now, when that is its one name.)
            None => self
                .node_rels(&h.node)
                .ok()
                .or_else(|| self.sole_name_of(&h.node, h.file.as_fd()).map(|r| vec![r]))
                .unwrap_or_default(),
        }
        .into_iter();
        let named = names.next();
        let aliases: Vec<PathBuf> = names.collect();
        let (rel, detached) = match named {
            Some(r) => {
                if let Some(mut w) = h.write_state() {
                    w.last_rel = r.clone();
                }
                (r, false)
            }
            None => {
                let last = h
                    .write_state()
                    .map(|w| w.last_rel.clone())
                    .unwrap_or_default();
                if last.as_os_str().is_empty() {
                    (self.display_rel(&h.node), false)
                } else {
                    (last, true)
                }
            }
        };
        let mut draft = Draft {
            created,
            detail: detached.then(|| {
                serde_json::json!({
                    "detached": true,
                    "note": "the file was renamed over or deleted before this handle closed; the content is no longer at this path",
                })
            }),
            ..Default::default()
        };
        with_aliases(&mut draft, &aliases);
        // Someone else changed the file after this handle's last own change (a handle that
        // truncated at open and had its writes refused, closing after another identity
        // wrote): the content there now is not this identity's doing. The entry records
        // what this handle left when that is known (an empty file after a truncation or a
        // create) and says it was superseded; the identity's views are left alone (taking
        // the other content as its own would hide that change from its stale checks).
        // A passthrough handle during whose writes processes outside the mount (or of
        // another identity) wrote the file too: the entry names them, and the content is
        // not taken as the identity's own view.
        let outside: Vec<serde_json::Value> = h
            .write_state()
            .map(|mut w| std::mem::take(&mut w.outside))
            .unwrap_or_default();
        let unattributed: Vec<serde_json::Value> = h
            .write_state()
            .map(|mut w| std::mem::take(&mut w.unattributed))
            .unwrap_or_default();
        if !unattributed.is_empty() {
            let d = draft.detail.get_or_insert_with(|| serde_json::json!({}));
            d["unattributed_writers"] = serde_json::Value::Array(unattributed);
        }
        if !outside.is_empty() {
            let d = draft.detail.get_or_insert_with(|| serde_json::json!({}));
            d["superseded"] = serde_json::Value::Bool(true);
            d["outside_writers"] = serde_json::Value::Array(outside.clone());
            d["note"] = "processes outside the mount wrote the file while this handle had it open; the content there is partly theirs".into();
        }
        if self.superseded(h) {
            let mut w = h.write_state().ok_or(FsError::Os(libc::EBADF))?;
            let own_writes = w.own_writes;
            let mut detail = serde_json::json!({
                "superseded": true,
                "note": "another agent or a tool changed the file after this handle's last change; the content there is theirs",
            });
            if detached {
                detail["detached"] = serde_json::Value::Bool(true);
            }
            if let Some(a) = draft.detail.as_ref().and_then(|d| d.get("aliases")) {
                detail["aliases"] = a.clone();
            }
            draft.detail = Some(detail);
            if !own_writes {
                let empty = crate::ledger::sha256_bytes(b"");
                draft.content_hash = Some(empty.clone());
                draft.size = Some(0);
                draft.prev_content_hash = w.prev_hash.replace(empty);
            } else {
                draft.prev_content_hash = w.prev_hash.take();
            }
            w.pre_image = None;
            with_token(&mut draft, &w);
            drop(w);
            draft.agent = close_agent;
            return self.record(&h.identity, &h.caller, MutationType::Write, &rel, draft);
        }
        if h.write_state().is_some_and(|w| w.pt && w.mapped) {
            // Writes through a shared mapping can change the content without moving the
            // stamp the hash cache is keyed by: the entry of a passthrough handle whose
            // file was mapped hashes what it reads, never a remembered hash. (A write(2)
            // moves the stamp.)
            self.hashes.forget(h.node.dev, h.node.ino);
        }
        // (Through the handle's own file when the node's handle is gone: a file renamed
        // over and forgotten by the kernel before a `--record async` close is recorded.)
        let mut hashed_at = None;
        let reopened = self
            .fd(&h.node)
            .ok()
            .and_then(|fd| sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()).ok())
            .or_else(|| sys::reopen_quiet(self.proc_fd.as_fd(), h.file.as_fd()).ok());
        if let Some(f) = reopened {
            // (The stamp is taken before the bytes are read, and kept only if the file
            // held still: see [`hash::HashCache::hash`].)
            let before = sys::stat_fd(f.as_fd()).ok().map(|s| stamp_of(&s));
            let small = if untracked(&rel) {
                None
            } else {
                hash::read_small(&f, RANGE_LIMIT)
            };
            let result = match small {
                Some(bytes) => {
                    let after = sys::stat_fd(f.as_fd()).ok().map(|s| stamp_of(&s));
                    let before = before.filter(|_| after == before);
                    let pre = h
                        .write_state()
                        .and_then(|mut w| w.pre_image.replace(bytes.clone()))
                        .or_else(|| draft.created.then(Vec::new));
                    // (The new content is the next version's pre-image, for a handle
                    // that writes again.)
                    if let Some(pre) = pre {
                        draft.ranges = changed_ranges(&pre, &bytes);
                    }
                    let r = match before {
                        Some(s) if s.size == bytes.len() as u64 => {
                            Some((self.hashes.of_bytes(Some(s), &bytes), s))
                        }
                        _ => self.hashes.hash(&f).ok(),
                    };
                    // The new version, in the store before the entry naming it.
                    if let Some((h32, s)) = r {
                        if s.size == bytes.len() as u64 {
                            self.keep_bytes(&rel, &bytes, &hash::to_string(&h32));
                        } else {
                            self.keep_file(&rel, &f, Some(h32), true);
                        }
                    }
                    r
                }
                None if untracked(&rel) => {
                    self.seq_hash(h, &f).or_else(|| self.hashes.hash(&f).ok())
                }
                // A large file: stored from the file (hashed while it is stored when the
                // hash is not known yet: one read).
                None => match self.seq_hash(h, &f) {
                    Some((h32, s)) => {
                        self.keep_file(&rel, &f, Some(h32), true);
                        Some((h32, s))
                    }
                    None => self
                        .keep_file(&rel, &f, None, true)
                        .or_else(|| self.hashes.hash(&f).ok()),
                },
            };
            hashed_at = result.map(|(_, s)| s);
            if let Some((h32, stamp)) = result {
                draft.content_hash = Some(hash::to_string(&h32));
                draft.size = Some(stamp.size);
                // The identity's own completed write supersedes every older view, under
                // every name of the file.
                // A detached file keeps the view under the name it was written as: the
                // identity believes that path holds its content, so whatever another
                // identity put there meanwhile is a change it has not seen (stale).
                let names = if detached {
                    Vec::new()
                } else {
                    self.alias_rels(&h.node)
                };
                for alias in names.into_iter().chain(std::iter::once(rel.clone())) {
                    if !untracked(&alias) && outside.is_empty() {
                        h.identity
                            .saw_own(&alias, h.caller.pid, Seen { stamp, hash: h32 });
                    }
                }
                draft.prev_content_hash = h
                    .write_state()
                    .and_then(|mut w| w.prev_hash.replace(hash::to_string(&h32)));
            }
        }
        if let Some(mut w) = h.write_state() {
            with_token(&mut draft, &w);
            if w.pt {
                // The next flush records only if the file changes again: from what was
                // hashed, not from a stat now (with `--record async` the agent may have
                // written again since; that write is the next entry's).
                w.expected = match hashed_at {
                    Some(s) => Some(Stamp { ctime: (0, 0), ..s }),
                    None => sys::stat_fd(h.file.as_fd()).ok().map(|st| race_stamp(&st)),
                };
            }
        }
        draft.agent = close_agent;
        self.record(&h.identity, &h.caller, MutationType::Write, &rel, draft)
    }

    /// The `WRITE_BEGIN` entry of handle `token` about to change `rel`.
    pub(crate) fn record_begin(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        prev: Option<String>,
        token: &str,
    ) -> Result<()> {
        if untracked(rel) {
            return Ok(());
        }
        let draft = Draft {
            prev_content_hash: prev,
            detail: Some(serde_json::json!({ "handle": token })),
            ..Default::default()
        };
        self.record(ident, caller, MutationType::WriteBegin, rel, draft)
    }
}

/// `detail.handle` of a WRITE entry: the token of the `CREATE`/`WRITE_BEGIN` it completes.
fn with_token(draft: &mut Draft, w: &WriteState) {
    if !w.begun {
        return;
    }
    let d = draft.detail.get_or_insert_with(|| serde_json::json!({}));
    if let Some(m) = d.as_object_mut() {
        m.insert("handle".into(), w.token.clone().into());
    }
}

/// A passthrough write handle released while its file stays mapped: it keeps its lease
/// (and counts for WRITES_OPEN) until no process of its tree maps the file any more, then
/// its last content is recorded, as a release would have.
pub(crate) fn linger_while_mapped(
    fs: &std::sync::Weak<Fs>,
    fh: u64,
    h: &Arc<FileHandle>,
    mut known: Vec<u32>,
) {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let Some(fs) = fs.upgrade() else { return };
        let now = fs.pt_mappers(h, &known);
        if !now.is_empty() {
            known = now;
            continue;
        }
        if fs.take_handle(fh).is_none() {
            return;
        }
        // Writes through a mapping may leave the stamp as it was (a page mapped writable
        // already takes them without a fault): the content is hashed whatever the stamp
        // says.
        if let Some(mut w) = h.write_state() {
            w.dirty = true;
            w.mapped = true;
        }
        if let Err(e) = fs.record_write_noting(h) {
            tracing::warn!("the WRITE after a mapping of a released handle went: {e:?}");
        }
        fs.handle_closed(h);
        return;
    }
}

/// Whether process `pid` maps the file with inode `ino` shared. Writable now or not: a
/// shared mapping of a file opened for writing can be made writable at any time
/// (`mprotect`), and neither maps nor PROCMAP_QUERY says whether it may (VM_MAYWRITE), so
/// a read-only shared mapping counts too (found open: an agent mapped the file read-only,
/// closed it, then `mprotect`ed the mapping writable and wrote unrecorded).
/// A mapping is the file's when its inode number is `ino` and its device one of `devs`:
/// with kernel passthrough the mapping holds the backing file, and maps names the inode the
/// user opened (the mount's device, Linux 6.8+), or the backing file's. Shared memory
/// (`/dev/shm`, memfd, SysV) with the same number is on another device. Without `devs`
/// (the mount's device not known yet) such memory is told by its name instead, which
/// misses a mount whose path starts with `/dev/` (found open: a workspace and mount under
/// `/dev/shm` had all their mappings skipped).
fn maps_shared(pid: u32, ino: u64, devs: &[u64]) -> bool {
    let Ok(maps) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
        return false;
    };
    if let Some(found) = query_shared(&maps, ino, devs) {
        return found;
    }
    // A kernel without PROCMAP_QUERY (before 6.11): the text.
    let Ok(maps) = std::io::read_to_string(maps) else {
        return false;
    };
    let want_ino = ino.to_string();
    // (Most processes map nothing with that number: one substring search rules them out.)
    if !maps.contains(want_ino.as_str()) {
        return false;
    }
    maps.lines().any(|l| {
        // address perms offset dev(hex major:minor) inode path
        let mut f = l.split_ascii_whitespace();
        let (perms, mapped_dev, i, path) = (f.nth(1), f.nth(1), f.next(), f.next().unwrap_or(""));
        let mapped_dev = mapped_dev.and_then(|d| {
            let (ma, mi) = d.split_once(':')?;
            Some(libc::makedev(
                u32::from_str_radix(ma, 16).ok()?,
                u32::from_str_radix(mi, 16).ok()?,
            ))
        });
        perms.is_some_and(|p| p.ends_with('s'))
            && i == Some(want_ino.as_str())
            && the_files(devs, mapped_dev, path.as_bytes())
    })
}

/// Whether a shared mapping with the file's inode number, on device `dev` (when known) and
/// named `path`, is the file's: see [`maps_shared`].
fn the_files(devs: &[u64], dev: Option<u64>, path: &[u8]) -> bool {
    match dev {
        Some(d) if !devs.is_empty() => devs.contains(&d),
        // Shared memory, not a file, by its name.
        _ => ![&b"/dev/"[..], b"/memfd:", b"/SYSV"]
            .iter()
            .any(|special| path.starts_with(special)),
    }
}

/// [`maps_shared`] by the `PROCMAP_QUERY` ioctl of an open `/proc/PID/maps`
/// (Linux 6.11+): the kernel walks the mappings and returns only shared mappings of files,
/// so a process with none (nearly all) costs one ioctl, where the text costs
/// formatting every mapping's path (a Python process has hundreds: 12% of the daemon's time
/// in the edit loop). None when the kernel has no such ioctl.
fn query_shared(maps: &std::fs::File, ino: u64, devs: &[u64]) -> Option<bool> {
    use linux_raw_sys::general::{procmap_query, procmap_query_flags as qf};
    use rustix::ioctl::{ioctl, opcode, Updater};
    // `_IOWR(PROCFS_IOCTL_MAGIC = 'f', 17, struct procmap_query)` (linux/fs.h).
    const PROCMAP_QUERY: rustix::ioctl::Opcode = opcode::read_write::<procmap_query>(b'f', 17);
    let query = |addr: u64, name: &mut [u8]| -> rustix::io::Result<procmap_query> {
        let mut q = procmap_query {
            size: std::mem::size_of::<procmap_query>() as u64,
            query_flags: [
                qf::PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
                qf::PROCMAP_QUERY_VMA_SHARED,
                qf::PROCMAP_QUERY_FILE_BACKED_VMA,
            ]
            .iter()
            .fold(0, |a, f| a | *f as u64),
            query_addr: addr,
            vma_start: 0,
            vma_end: 0,
            vma_flags: 0,
            vma_page_size: 0,
            vma_offset: 0,
            inode: 0,
            dev_major: 0,
            dev_minor: 0,
            vma_name_size: name.len() as u32,
            build_id_size: 0,
            vma_name_addr: if name.is_empty() {
                0
            } else {
                name.as_mut_ptr() as u64
            },
            build_id_addr: 0,
        };
        // SAFETY: PROCMAP_QUERY takes a `struct procmap_query` (linux-raw-sys' is the
        // kernel's, its `size` says which version), which lives for the call; the kernel
        // writes a name of at most `vma_name_size` bytes to `name`, valid and exclusively
        // borrowed for the call (none when its address is 0).
        unsafe {
            ioctl(maps, Updater::<PROCMAP_QUERY, procmap_query>::new(&mut q))?;
        }
        Ok(q)
    };
    let mut addr = 0;
    loop {
        match query(addr, &mut []) {
            Ok(q) if q.inode == ino => {
                let mine = if devs.is_empty() {
                    // No device known: the name decides, asked again at the same address
                    // (only here: `d_path` is the cost).
                    let mut name = vec![0u8; libc::PATH_MAX as usize];
                    query(q.vma_start, &mut name).is_ok_and(|n| {
                        let len = (n.vma_name_size as usize).saturating_sub(1).min(name.len());
                        n.inode == ino && the_files(devs, None, &name[..len])
                    })
                } else {
                    the_files(devs, Some(libc::makedev(q.dev_major, q.dev_minor)), &[])
                };
                if mine {
                    return Some(true);
                }
                addr = q.vma_end;
            }
            Ok(q) => addr = q.vma_end,
            // No (further) such mapping, or the process has exited.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::SRCH) => return Some(false),
            Err(rustix::io::Errno::NOTTY | rustix::io::Errno::INVAL) if addr == 0 => return None,
            Err(_) => return Some(false),
        }
    }
}

/// The children of every thread of `pid` (`/proc/PID/task/TID/children`).
/// Every process now (`/proc`'s numeric entries) that maps inode `ino` of one of `devs`
/// shared: the search when the handle's own processes do not tell.
fn every_mapper(ino: u64, devs: &[u64]) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|&p| maps_shared(p, ino, devs))
                .collect()
        })
        .unwrap_or_default()
}

fn proc_children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_ascii_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Whether `pid` is one of `set` or a descendant of one (a few generations up); None when
/// the process is gone.
fn descends_from(pid: u32, set: &[i32]) -> Option<bool> {
    let mut p = pid;
    for depth in 0..16 {
        if set.contains(&(p as i32)) {
            return Some(true);
        }
        match crate::guard::tracking::proc_parent(p) {
            Some((pp, _)) if pp > 1 => p = pp,
            Some(_) => return Some(false),
            None if depth == 0 => return None,
            None => return Some(false),
        }
    }
    Some(false)
}

/// Whether a write handle is open on `node`.
fn writers_open(node: &Node) -> bool {
    node.handles
        .lock()
        .iter()
        .filter_map(|w| w.upgrade())
        .any(|o| o.writable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
    use std::os::unix::fs::MetadataExt;

    /// Map `f` (4 KiB) with `prot` and `flags`, run `check`, unmap.
    fn mapped<T>(f: &std::fs::File, prot: ProtFlags, flags: MapFlags, check: impl Fn() -> T) -> T {
        // SAFETY: a fresh mapping chosen by the kernel (no address given), of a file the
        // test owns, never dereferenced, unmapped below with the same length.
        let p = unsafe { mmap(std::ptr::null_mut(), 4096, prot, flags, f, 0) }.unwrap();
        let r = check();
        // SAFETY: `p` is the mapping made above, 4096 bytes, no reference into it remains.
        unsafe { munmap(p, 4096) }.unwrap();
        r
    }

    /// A new 4 KiB file at `path`, open read-write, with its device and inode number.
    fn page_file(path: &std::path::Path) -> (std::fs::File, u64, u64) {
        std::fs::write(path, vec![0u8; 4096]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let m = f.metadata().unwrap();
        (f, m.dev(), m.ino())
    }

    #[test]
    fn shared_mappings_are_found_by_the_ioctl_and_the_text_alike() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        let (f, dev, ino) = page_file(&path);
        let me = std::process::id();
        let text = |ino: u64| {
            let maps = std::fs::read_to_string(format!("/proc/{me}/maps")).unwrap();
            maps.lines().any(|l| {
                let v: Vec<&str> = l.split_ascii_whitespace().collect();
                v[1].ends_with('s') && v[4] == ino.to_string()
            })
        };
        let maps = || std::fs::File::open(format!("/proc/{me}/maps")).unwrap();
        let rw = ProtFlags::READ | ProtFlags::WRITE;
        // Not mapped; mapped privately (its writes never reach the file): not a writer.
        assert!(!maps_shared(me, ino, &[dev]));
        mapped(&f, rw, MapFlags::PRIVATE, || {
            assert!(!text(ino));
            assert!(!maps_shared(me, ino, &[dev]));
        });
        // Mapped shared, writable or read-only (`mprotect` can make it writable): found,
        // by the ioctl on this kernel, and by the text.
        for prot in [rw, ProtFlags::READ] {
            mapped(&f, prot, MapFlags::SHARED, || {
                assert!(text(ino), "the text does not show the mapping");
                assert_eq!(query_shared(&maps(), ino, &[dev]), Some(true), "{prot:?}");
                assert!(maps_shared(me, ino, &[dev]));
                assert_eq!(query_shared(&maps(), ino + 1, &[dev]), Some(false));
            });
        }
        assert_eq!(query_shared(&maps(), ino, &[dev]), Some(false));
        // Shared memory with the same inode number is not a file.
        let shm =
            rustix::fs::memfd_create("intentfs-test", rustix::fs::MemfdFlags::empty()).unwrap();
        rustix::fs::ftruncate(&shm, 4096).unwrap();
        let shm = std::fs::File::from(shm);
        let shm_ino = shm.metadata().unwrap().ino();
        mapped(&shm, rw, MapFlags::SHARED, || {
            assert!(text(shm_ino));
            assert!(!maps_shared(me, shm_ino, &[dev]));
            // (By its name when no device is known.)
            assert!(!maps_shared(me, shm_ino, &[]));
        });
        // A file under /dev/shm is a file: its mappings count (its device is its own).
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            let (g, gdev, gino) = page_file(&d.path().join("w"));
            mapped(&g, rw, MapFlags::SHARED, || {
                assert_eq!(query_shared(&maps(), gino, &[gdev]), Some(true));
                assert!(maps_shared(me, gino, &[gdev]));
            });
        }
        // A process that is gone maps nothing.
        assert!(!maps_shared(u32::MAX >> 10, ino, &[dev]));
    }

    /// A file with many long names lists only what fits in `ALIASES_BYTES` of them, and
    /// says how many it left out: an entry's size stays bounded.
    #[test]
    fn aliases_are_bounded_in_bytes() {
        let long = |i: usize| PathBuf::from(format!("{}-{i}", "\u{1}".repeat(600)));
        let names: Vec<PathBuf> = (0..16).map(long).collect();
        let mut d = Draft::default();
        with_aliases(&mut d, &names);
        let detail = d.detail.unwrap();
        let taken = serde_json::to_string(&detail["aliases"]).unwrap().len();
        assert!(taken <= ALIASES_BYTES, "{taken}");
        let listed = detail["aliases"].as_array().unwrap().len();
        assert!(listed >= 1, "{detail}");
        assert_eq!(detail["aliases_left_out"], 16 - listed);
        // A few short names are all listed, and nothing is said left out.
        let mut d = Draft::default();
        with_aliases(&mut d, &[PathBuf::from("a"), PathBuf::from("b/c")]);
        let detail = d.detail.unwrap();
        assert_eq!(detail["aliases"], serde_json::json!(["a", "b/c"]));
        assert!(detail.get("aliases_left_out").is_none());
    }
}
