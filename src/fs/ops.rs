//! The operations of the core, one method each, in FUSE's vocabulary. Each mutating method
//! authorizes first (scope, protected paths, hard links), then acts through handles, then
//! ledgers the result.

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
use super::{sys, Caller, CtlHandle, Entry, FileHandle, Fs, Handle, OpenOpts};
use crate::guard::Operation;
use crate::control::{self, CtlFile};
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

impl Fs {
    // ----- lookups and attributes --------------------------------------------------

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        if is_ctl_name(parent, name) {
            return Ok(Entry {
                nodeid: control::DIR_INO,
                st: control::dir_stat(self.started),
            });
        }
        if parent == control::DIR_INO {
            let f = CtlFile::from_name(name).ok_or(FsError::Os(libc::ENOENT))?;
            return Ok(Entry {
                nodeid: f.ino(),
                st: control::file_stat(f, self.started),
            });
        }
        if name.len() > 255 {
            return err(libc::ENAMETOOLONG);
        }
        if !sys::valid_name(name) {
            return err(libc::ENOENT);
        }
        let p = self.node(parent)?;
        let pfd = self.fd(&p)?;
        self.watch_dir_fd(&p, pfd.as_fd());
        // A file's handle is opened when something needs it (`InodeTable::fd` re-resolves
        // the name and checks the inode): a lookup alone (`stat`, `git status`, `find`)
        // costs one fstatat. Directories keep theirs: their children are looked up from it.
        let st = sys::stat_at(pfd.as_fd(), name)?;
        let (st, fd) = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let fd = sys::open_path(pfd.as_fd(), name)?;
            (sys::stat_fd(fd.as_fd())?, Some(fd))
        } else {
            (st, None)
        };
        let node = self.table.lookup(parent, name, fd, &st);
        Ok(Entry {
            nodeid: node.nodeid,
            st,
        })
    }

    pub fn forget(&self, nodeid: u64, n: u64) {
        if !control::is_control(nodeid) {
            self.table.forget(nodeid, n);
        }
    }

    pub fn getattr(&self, nodeid: u64, fh: Option<u64>) -> Result<sys::Stat> {
        if nodeid == control::DIR_INO {
            return Ok(control::dir_stat(self.started));
        }
        if let Some(f) = CtlFile::from_ino(nodeid) {
            return Ok(control::file_stat(f, self.started));
        }
        if let Some(fh) = fh {
            if let Ok(h) = self.file_handle(fh) {
                return Ok(sys::stat_fd(h.file.as_fd())?);
            }
        }
        let node = self.node(nodeid)?;
        let fd = self.fd(&node)?;
        Ok(sys::stat_fd(fd.as_fd())?)
    }

    pub fn setattr(
        &self,
        caller: &Caller,
        nodeid: u64,
        a: SetAttr,
        fh: Option<u64>,
    ) -> Result<sys::Stat> {
        if control::is_control(nodeid) {
            // `echo X > .intentfs/intent` truncates first: harmless on writable control files.
            if let Some(f) = CtlFile::from_ino(nodeid) {
                if f.writable() && a.mode.is_none() && a.uid.is_none() && a.gid.is_none() {
                    return Ok(control::file_stat(f, self.started));
                }
            }
            return err(libc::EPERM);
        }
        let node = self.node(nodeid)?;
        // Only a regular file has a size to set: refuse before anything else changes (a
        // request may carry a mode or owner with the size).
        if a.size.is_some() && !node.is_reg() {
            return err(if node.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            });
        }
        let op = if a.size.is_some() {
            Operation::Truncate
        } else if a.mode.is_some() {
            Operation::Chmod
        } else if a.uid.is_some() || a.gid.is_some() {
            Operation::Chown
        } else {
            Operation::Utimes
        };
        // A truncation holds the file's stale lock from its check through the change.
        let _stale = if a.size.is_some() {
            self.table.stale_locks(&[(node.dev, node.ino)])
        } else {
            Vec::new()
        };
        let (ident, rels) = self.authorize_node_names(caller, op, &node)?;
        let rel = rels[0].clone();
        let fd = self.fd(&node)?;
        if a.size.is_some() {
            // Truncating through the identity's own write handle (`f.truncate()` after
            // writing) continues that handle's write: the race check applies, not the
            // comparison with what was read before the handle's own writes.
            let own = fh
                .and_then(|fh| self.file_handle(fh).ok())
                .filter(|h| h.writable && h.identity.key() == ident.key());
            match own {
                Some(h) => self.before_modify(&h)?,
                None => self.check_stale_node(
                    &ident,
                    caller,
                    Operation::Truncate,
                    &node,
                    &rels,
                    fd.as_fd(),
                )?,
            }
        }
        let before = sys::stat_fd(fd.as_fd())?;
        let mut through_handle = None;
        if let Some(mode) = a.mode {
            if node.is_symlink() {
                return err(libc::EOPNOTSUPP);
            }
            sys::chmod_fd(self.proc_fd.as_fd(), fd.as_fd(), mode & 0o7777)?;
        }
        if a.uid.is_some() || a.gid.is_some() {
            sys::chown_fd(fd.as_fd(), a.uid, a.gid)?;
        }
        if let Some(size) = a.size {
            match fh
                .and_then(|fh| self.file_handle(fh).ok())
                .filter(|h| h.writable)
            {
                Some(h) => {
                    // The handle's WRITE at close records what it leaves, with the lines
                    // changed since before its first change: the TRUNCATE entry says so.
                    if let Some(mut w) = h.write_state() {
                        through_handle = Some(w.token.clone());
                        w.seq.off();
                    }
                    h.file.set_len(size)?;
                    if caller.uid != 0 && a.mode.is_none() {
                        self.kill_suidgid(h.file.as_fd(), caller);
                    }
                    h.mark_changed();
                    self.after_write(&h);
                }
                None => {
                    let f = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_WRONLY)?;
                    f.set_len(size)?;
                    if caller.uid != 0 && a.mode.is_none() {
                        self.kill_suidgid(f.as_fd(), caller);
                    }
                }
            }
        }
        if a.atime.is_some() || a.mtime.is_some() {
            if node.is_symlink() {
                let (parent, name) = node
                    .aliases()
                    .into_iter()
                    .next()
                    .ok_or(FsError::Os(libc::ESTALE))?;
                let p = self.node(parent)?;
                let pfd = self.fd(&p)?;
                sys::utimes_at_nofollow(pfd.as_fd(), &name, a.atime, a.mtime)?;
            } else {
                sys::utimes_fd(self.proc_fd.as_fd(), fd.as_fd(), a.atime, a.mtime)?;
            }
        }
        let after = sys::stat_fd(fd.as_fd())?;
        if node.is_reg() {
            self.note_own_change(&node, &ident, &after);
            if a.size.is_some() {
                // A truncate is the identity's own completed change: its view follows.
                if let Ok(f) = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_RDONLY) {
                    if let Ok((hash, stamp)) = self.hashes.hash(&f) {
                        for r in self.alias_rels(&node) {
                            ident.saw_own(
                                &r,
                                caller.pid,
                                crate::guard::stale::Seen { stamp, hash },
                            );
                        }
                    }
                }
            }
        }
        let mt = match op {
            Operation::Truncate => MutationType::Truncate,
            Operation::Chmod => MutationType::Chmod,
            Operation::Chown => MutationType::Chown,
            _ => MutationType::Utimes,
        };
        let mut draft = Draft {
            size: Some(after.st_size as u64),
            ..Default::default()
        };
        if a.mode.is_some() {
            draft.detail = Some(serde_json::json!({
                "mode_before": format!("{:o}", before.st_mode & 0o7777),
                "mode_after": format!("{:o}", after.st_mode & 0o7777),
            }));
        }
        // Time-only changes are not content mutations worth a ledger line each (every
        // `touch` and `tar x` would double the ledger); they are still authorized above.
        // Neither is a chmod or chown that changes nothing (`tar x` as root chowns and
        // chmods every file it makes to what it already is).
        let noop = matches!(mt, MutationType::Chmod | MutationType::Chown)
            && before.st_mode == after.st_mode
            && before.st_uid == after.st_uid
            && before.st_gid == after.st_gid;
        if let (MutationType::Truncate, Some(t)) = (mt, through_handle) {
            draft.detail = Some(serde_json::json!({ "handle": t }));
        }
        if mt != MutationType::Utimes && !noop {
            self.record(&ident, caller, mt, &rel, draft)?;
        }
        Ok(after)
    }

    pub fn readlink(&self, nodeid: u64) -> Result<Vec<u8>> {
        let node = self.node(nodeid)?;
        if !node.is_symlink() {
            return err(libc::EINVAL);
        }
        let fd = self.fd(&node)?;
        Ok(sys::readlink_fd(fd.as_fd())?)
    }

    pub fn access(&self, nodeid: u64, mask: i32) -> Result<()> {
        if control::is_control(nodeid) {
            return Ok(());
        }
        let node = self.node(nodeid)?;
        let fd = self.fd(&node)?;
        let st = sys::stat_fd(fd.as_fd())?;
        // With default_permissions the kernel checks permission bits itself; what remains
        // is existence, and refusing execute on non-executables.
        if mask & libc::X_OK != 0
            && st.st_mode & 0o111 == 0
            && st.st_mode & libc::S_IFMT != libc::S_IFDIR
        {
            return err(libc::EACCES);
        }
        Ok(())
    }

    pub fn statfs(&self, nodeid: u64) -> Result<libc::statvfs64> {
        let node = self.node(if control::is_control(nodeid) {
            ROOT
        } else {
            nodeid
        })?;
        let fd = self.fd(&node)?;
        Ok(sys::statvfs_fd(fd.as_fd())?)
    }

    // ----- creating entries --------------------------------------------------------

    /// Common shape of mkdir/mknod/symlink: authorize `parent/name`, run `make`, look the new
    /// entry up, ledger it.
    #[allow(clippy::too_many_arguments)]
    fn make_entry(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        op: Operation,
        mt: MutationType,
        is_dir: bool,
        make: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>,
        detail: Option<serde_json::Value>,
    ) -> Result<Entry> {
        if is_ctl_name(parent, name) {
            return err(libc::EEXIST);
        }
        if control::is_control(parent) {
            return err(libc::EPERM);
        }
        check_name(name)?;
        let p = self.node(parent)?;
        let rel = self.child_rel(&p, name)?;
        let ident = self.authorize(caller, op, &rel, is_dir)?;
        let temp = super::temps::NEW_TEMP.with(|t| t.replace(false));
        let pfd = self.fd(&p)?;
        self.check_git_layout(
            &ident,
            caller,
            op,
            pfd.as_fd(),
            rel.parent().unwrap_or(Path::new("")),
            name,
        )?;
        self.watch_dir_fd(&p, pfd.as_fd());
        {
            let _cred = sys::FsCred::switch(caller.uid, caller.gid);
            make(pfd.as_fd())?;
        }
        if temp {
            self.gate.temps.add(&ident, caller, &rel, is_dir, None);
        }
        let fd = sys::open_path(pfd.as_fd(), name)?;
        let st = sys::stat_fd(fd.as_fd())?;
        let node = self.table.lookup(parent, name, Some(fd), &st);
        self.record(
            &ident,
            caller,
            mt,
            &rel,
            Draft {
                detail,
                ..Default::default()
            },
        )?;
        Ok(Entry {
            nodeid: node.nodeid,
            st,
        })
    }

    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        self.make_entry(
            caller,
            parent,
            name,
            Operation::Mkdir,
            MutationType::Mkdir,
            true,
            |d| sys::mkdir_at(d, name, mode & !umask),
            None,
        )
    }

    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        let kind = mode & libc::S_IFMT;
        // Device nodes would give an agent raw access to disks: only regular files, fifos
        // and sockets may be made through the mount.
        if kind == libc::S_IFCHR || kind == libc::S_IFBLK {
            return err(libc::EPERM);
        }
        self.make_entry(
            caller,
            parent,
            name,
            Operation::Mknod,
            MutationType::Mknod,
            false,
            |d| sys::mknod_at(d, name, mode & !umask, rdev as u64),
            Some(serde_json::json!({ "mode": format!("{:o}", mode) })),
        )
    }

    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &Path,
    ) -> Result<Entry> {
        self.make_entry(
            caller,
            parent,
            name,
            Operation::Symlink,
            MutationType::Symlink,
            false,
            |d| sys::symlink_at(target.as_os_str(), d, name),
            Some(serde_json::json!({ "target": target.to_string_lossy() })),
        )
    }

    pub fn link(
        &self,
        caller: &Caller,
        nodeid: u64,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<Entry> {
        if control::is_control(nodeid)
            || control::is_control(newparent)
            || is_ctl_name(newparent, newname)
        {
            return err(libc::EPERM);
        }
        check_name(newname)?;
        let node = self.node(nodeid)?;
        if node.is_dir() {
            return err(libc::EPERM);
        }
        // Both names count: the existing one (a link shares the inode, so writing through
        // the new name changes the old one) and the new one.
        let (ident, from) = self.authorize_node(caller, Operation::Link, &node)?;
        // A new name for a secret is a way to read it under a harmless name.
        for rel in self.alias_rels(&node) {
            if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), &rel) {
                self.gate.sensitive_read(&ident, caller, &rel, d)?;
            }
        }
        let np = self.node(newparent)?;
        let rel = self.child_rel(&np, newname)?;
        self.authorize_as(&ident, caller, Operation::Link, &rel, false)?;
        let fd = self.fd(&node)?;
        let npfd = self.fd(&np)?;
        self.check_git_layout(
            &ident,
            caller,
            Operation::Link,
            npfd.as_fd(),
            rel.parent().unwrap_or(Path::new("")),
            newname,
        )?;
        self.watch_dir_fd(&np, npfd.as_fd());
        sys::link_fd(self.proc_fd.as_fd(), fd.as_fd(), npfd.as_fd(), newname)?;
        let st = sys::stat_fd(fd.as_fd())?;
        let node = self.table.lookup(newparent, newname, None, &st);
        self.record(
            &ident,
            caller,
            MutationType::Link,
            &rel,
            Draft {
                from: Some(from),
                ..Default::default()
            },
        )?;
        Ok(Entry {
            nodeid: node.nodeid,
            st,
        })
    }

    // ----- removing and renaming ---------------------------------------------------

    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr, is_dir: bool) -> Result<()> {
        if is_ctl_name(parent, name) || control::is_control(parent) {
            return err(libc::EPERM);
        }
        check_name(name)?;
        let p = self.node(parent)?;
        let rel = self.child_rel(&p, name)?;
        let op = if is_dir {
            Operation::Rmdir
        } else {
            Operation::Unlink
        };
        let ident = self.authorize(caller, op, &rel, is_dir)?;
        if is_dir {
            if let Some(rule) = self.gate.guard.rules().protected.below(&rel) {
                return Err(self.protected_below(&ident, caller, op, &rel, rule));
            }
        }
        self.gate.delete_approval(&ident, caller, op, &rel)?;
        let pfd = self.fd(&p)?;
        // The stale check and the unlink are one step for any other stale-checked change of
        // the file (an open for write, a rename, a write).
        let (_stale, st) = self.lock_names(&[(pfd.as_fd(), name)]);
        let st = st[0].ok_or(FsError::Os(libc::ENOENT))?;
        let prev = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            Some(st.st_size as u64)
        } else {
            None
        };
        if !is_dir {
            self.check_stale_at(&ident, caller, Operation::Unlink, &rel, pfd.as_fd(), name)?;
        }
        let old_ref = crate::policy::git::ref_name(&rel).and_then(|r| {
            let v = sys::read_ref_at(pfd.as_fd(), name)?;
            // `git pack-refs` removes loose refs it packed: the ref did not move.
            (self.packed_value(&rel, &r).as_deref() != Some(v.as_str())).then_some(v)
        });
        sys::unlink_at(pfd.as_fd(), name, is_dir)?;
        self.gate.temps.remove(&rel);
        if old_ref.is_some() {
            self.gate.record_ref(&ident, caller, &rel, old_ref, None)?;
        }
        ident.forget_path(&rel);
        if !is_dir && st.st_nlink <= 1 {
            self.hashes.forget(st.st_dev, st.st_ino);
        }
        if let Some(n) = self.table.by_backing(st.st_dev, st.st_ino) {
            self.table.remove_alias(&n, parent, name, &ident.key());
        }
        let mt = if is_dir {
            MutationType::Rmdir
        } else {
            MutationType::Delete
        };
        self.record(
            &ident,
            caller,
            mt,
            &rel,
            Draft {
                size: prev,
                ..Default::default()
            },
        )?;
        Ok(())
    }

    /// Take the stale locks of the files these names point to (see
    /// [`InodeTable::stale_locks`](super::inode::InodeTable::stale_locks)), and their stat
    /// under the locks (`None`: no such name). A name re-pointed between the look and the
    /// locking is looked at again.
    fn lock_names(
        &self,
        names: &[(std::os::fd::BorrowedFd<'_>, &OsStr)],
    ) -> (Vec<parking_lot::MutexGuard<'_, ()>>, Vec<Option<sys::Stat>>) {
        let look = || -> Vec<Option<sys::Stat>> {
            names
                .iter()
                .map(|(d, n)| sys::stat_at(*d, n).ok())
                .collect()
        };
        // The names themselves are locked too, not only the files they point to: an
        // unlink that removed `t` holds `t`'s lock until its DELETE is on record, so a
        // rename onto `t` (which finds no file there to lock) cannot record its RENAME
        // first and leave the ledger saying `t` is gone while it exists.
        let name_keys: Vec<(u64, u64)> = names
            .iter()
            .filter_map(|(d, n)| {
                let dir = sys::stat_fd(*d).ok()?;
                let mut h = std::hash::DefaultHasher::new();
                std::hash::Hash::hash(&(dir.st_dev, dir.st_ino, n), &mut h);
                Some((!dir.st_dev, std::hash::Hasher::finish(&h)))
            })
            .collect();
        let key = |v: &[Option<sys::Stat>]| -> Vec<(u64, u64)> {
            v.iter()
                .flatten()
                .map(|s| (s.st_dev, s.st_ino))
                .chain(name_keys.iter().copied())
                .collect()
        };
        let mut stats = look();
        for _ in 0..64 {
            let guards = self.table.stale_locks(&key(&stats));
            let now = look();
            let same = now.len() == stats.len()
                && now.iter().zip(&stats).all(|(a, b)| {
                    a.map(|s| (s.st_dev, s.st_ino)) == b.map(|s| (s.st_dev, s.st_ino))
                });
            if same {
                return (guards, now);
            }
            drop(guards);
            stats = now;
        }
        // Names re-pointed without end: lock what they point to now and go on (the
        // stale checks still run, only not atomically with a concurrent change).
        let guards = self.table.stale_locks(&key(&stats));
        (guards, stats)
    }

    fn protected_below(
        &self,
        ident: &Arc<crate::guard::Identity>,
        caller: &Caller,
        op: Operation,
        rel: &Path,
        rule: String,
    ) -> FsError {
        let d = crate::guard::Denial::new(
            crate::guard::Code::ProtectedPath,
            op,
            rel,
            ident.intent().as_deref(),
            format!("{} contains an always-protected path", rel.display()),
            "Do not move or remove directories that hold governance files.".into(),
        )
        .with_rule(Some(rule));
        self.gate.deny(ident, caller, d)
    }

    /// Authorize every entry below a directory that a rename would move, under both its old
    /// and its new path: moving a directory moves everything in it.
    fn authorize_subtree(
        &self,
        ident: &Arc<crate::guard::Identity>,
        caller: &Caller,
        dir: &Arc<Node>,
        old: &Path,
        new: &Path,
    ) -> Result<()> {
        if let Some(rule) = self.gate.guard.rules().protected.below(old) {
            return Err(self.protected_below(ident, caller, Operation::Rename, old, rule));
        }
        let fd = self.fd(dir)?;
        let mut stack: Vec<(std::os::fd::OwnedFd, PathBuf)> =
            vec![(sys::open_path(fd.as_fd(), OsStr::new("."))?, PathBuf::new())];
        let mut seen = 0usize;
        while let Some((dfd, sub)) = stack.pop() {
            let mut ds = sys::DirStream::open(dfd.as_fd())?;
            while let Some(e) = ds.next_entry()? {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                seen += 1;
                if seen > MAX_SUBTREE {
                    return err(libc::EXDEV);
                }
                let name = OsStr::from_bytes(&e.name);
                let rel = sub.join(name);
                let is_dir = e.kind == libc::DT_DIR;
                let (o, n) = (old.join(&rel), new.join(&rel));
                self.authorize_as(ident, caller, Operation::Rename, &o, is_dir)?;
                self.authorize_as(ident, caller, Operation::Rename, &n, is_dir)?;
                // Moving a secret to a name that is not sensitive would expose it, as for
                // a file renamed on its own.
                if !is_dir {
                    let intent = ident.intent();
                    if let Err(d) = self.gate.guard.check_read(intent.as_deref(), &o) {
                        if self.gate.guard.check_read(intent.as_deref(), &n).is_ok() {
                            self.gate.sensitive_read(ident, caller, &o, d)?;
                        }
                    }
                }
                if is_dir {
                    if let Ok(cfd) = sys::open_path(dfd.as_fd(), name) {
                        stack.push((cfd, rel));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        for _ in 0..16 {
            if let Some(()) = self.rename_once(caller, parent, name, newparent, newname, flags)? {
                return Ok(());
            }
        }
        err(libc::EBUSY)
    }

    /// One attempt at a rename; `None` when a name was re-pointed by a concurrent change
    /// after it was authorized (try again from the start).
    fn rename_once(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<Option<()>> {
        if is_ctl_name(parent, name)
            || is_ctl_name(newparent, newname)
            || control::is_control(parent)
            || control::is_control(newparent)
        {
            return err(libc::EPERM);
        }
        check_name(name)?;
        check_name(newname)?;
        let p = self.node(parent)?;
        let np = self.node(newparent)?;
        let pfd = self.fd(&p)?;
        let npfd = self.fd(&np)?;
        let from = self.child_rel(&p, name)?;
        let to = self.child_rel(&np, newname)?;
        let src = sys::stat_at(pfd.as_fd(), name)?;
        let src_dir = src.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let ident = self.authorize(caller, Operation::Rename, &from, src_dir)?;
        // Renaming a secret to a name that is not sensitive would expose it.
        if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), &from) {
            if self
                .gate
                .guard
                .check_read(ident.intent().as_deref(), &to)
                .is_ok()
            {
                self.gate.sensitive_read(&ident, caller, &from, d)?;
            }
        }
        let dst = sys::stat_at(npfd.as_fd(), newname).ok();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        // A tool's temporary may take a free name next to in-scope files (vim renames the
        // file to `name~` before writing it anew); such a rename never replaces anything.
        let to_temp = !exchange && self.gate.temp_target(&ident, &to, src_dir, dst.is_some());
        let from_temp = self.gate.temps.covers(&ident.key, &from);
        let flags = if to_temp && dst.is_none() {
            flags | libc::RENAME_NOREPLACE
        } else {
            flags
        };
        if !to_temp {
            self.authorize_as(&ident, caller, Operation::Rename, &to, src_dir)?;
        }
        self.check_git_layout(
            &ident,
            caller,
            Operation::Rename,
            npfd.as_fd(),
            to.parent().unwrap_or(Path::new("")),
            newname,
        )?;
        if super::gitrefs::is_rebase_todo(&to) && !src_dir {
            let text = sys::openat_mode(
                pfd.as_fd(),
                name,
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                0,
            )
            .ok()
            .and_then(|fd| super::hash::read_small(&std::fs::File::from(fd), 16 << 20))
            .unwrap_or_default();
            if super::gitrefs::todo_runs_commands(&text) {
                return Err(self.todo_denial(&ident, caller, &to));
            }
        }
        if src_dir {
            // Hold a counted reference while walking, released right after.
            let fd = sys::open_path(pfd.as_fd(), name)?;
            let dir = self.table.lookup(parent, name, Some(fd), &src);
            let r = self.authorize_subtree(&ident, caller, &dir, &from, &to);
            self.table.forget(dir.nodeid, 1);
            r?;
        }
        if let Some(d) = &dst {
            let dst_dir = d.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if exchange && dst_dir {
                let fd = sys::open_path(npfd.as_fd(), newname)?;
                let n = self.table.lookup(newparent, newname, Some(fd), d);
                let r = self.authorize_subtree(&ident, caller, &n, &to, &from);
                self.table.forget(n.nodeid, 1);
                r?;
            } else if dst_dir {
                // Replacing a directory: it must be empty, so only its own name matters,
                // unless it holds protected paths.
                if let Some(rule) = self.gate.guard.rules().protected.below(&to) {
                    return Err(self.protected_below(&ident, caller, Operation::Rename, &to, rule));
                }
            }
        }
        // The stale checks, the rename and the update of the names the daemon knows are one
        // step for any other stale-checked change of either file (an open for write, an
        // unlink, a write): an open for write either came first (and the check below sees
        // what it did) or sees the names after the rename.
        let (_stale, now) = self.lock_names(&[(pfd.as_fd(), name), (npfd.as_fd(), newname)]);
        let ino = |s: &Option<sys::Stat>| s.map(|s| (s.st_dev, s.st_ino));
        if ino(&now[0]) != ino(&Some(src)) || ino(&now[1]) != ino(&dst) {
            return Ok(None);
        }
        // Stale checks: renaming a file away, and renaming over one (what `sed -i` and
        // editors do), both destroy a version the identity may not have seen.
        if !src_dir {
            self.check_stale_at(&ident, caller, Operation::Rename, &from, pfd.as_fd(), name)?;
        }
        if dst.is_some() {
            self.check_stale_at(
                &ident,
                caller,
                Operation::Rename,
                &to,
                npfd.as_fd(),
                newname,
            )?;
        }
        // A rename over a file (`sed -i`, editors, `os.replace`) is an edit of it: the entry
        // carries the lines that changed against the file it replaced, and both hashes.
        let edit = match &dst {
            Some(d)
                if !src_dir
                    && !exchange
                    && d.st_mode & libc::S_IFMT == libc::S_IFREG
                    && src.st_mode & libc::S_IFMT == libc::S_IFREG
                    && !super::stale::untracked(&to)
                    && self.gate.guard.rules().policy.output_match(&to).is_none() =>
            {
                let small = |dir, n| {
                    sys::openat_mode(
                        dir,
                        n,
                        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                        0,
                    )
                    .ok()
                    .and_then(|fd| {
                        super::hash::read_small(&std::fs::File::from(fd), super::stale::RANGE_LIMIT)
                    })
                };
                small(npfd.as_fd(), newname).zip(small(pfd.as_fd(), name))
            }
            _ => None,
        };
        let moved_ref = crate::policy::git::ref_name(&to).map(|r| {
            (
                r,
                sys::read_ref_at(npfd.as_fd(), newname),
                sys::read_ref_at(pfd.as_fd(), name),
            )
        });
        // A ref moving (or `packed-refs` rewritten) brings only commits within the scope.
        if let Some((r, _, new)) = &moved_ref {
            self.check_ref_move(&ident, caller, &to, r, new.as_deref())?;
        }
        let packed = (to == Path::new(".git/packed-refs") && !src_dir).then(|| {
            let text = |dir, n| {
                sys::openat_mode(
                    dir,
                    n,
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    0,
                )
                .ok()
                .and_then(|fd| super::hash::read_small(&std::fs::File::from(fd), 64 << 20))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
            };
            super::gitrefs::packed_changes(&text(npfd.as_fd(), newname), &text(pfd.as_fd(), name))
        });
        for (r, _, new) in packed.iter().flatten() {
            self.check_ref_move(&ident, caller, &to, r, new.as_deref())?;
        }
        sys::rename_at(pfd.as_fd(), name, npfd.as_fd(), newname, flags)?;
        if let Some((_, old, new)) = moved_ref {
            self.gate.record_ref(&ident, caller, &to, old, new)?;
        }
        for (r, old, new) in packed.into_iter().flatten() {
            // `git pack-refs` copies loose refs in: the ref did not move.
            if new.is_some() && self.loose_value(&to, &r) == new {
                continue;
            }
            self.gate
                .record_ref_named(&ident, caller, &to, &r, old, new)?;
        }
        match (from_temp, to_temp) {
            (true, true) => self.gate.temps.rename(&from, &to),
            (true, false) => {
                self.gate.temps.remove(&from);
                self.gate.temps.remove(&to);
            }
            (false, true) => self
                .gate
                .temps
                .add(&ident, caller, &to, src_dir, Some(from.clone())),
            (false, false) => self.gate.temps.remove(&to),
        }
        if exchange {
            ident.swap_paths(&from, &to);
        } else {
            ident.move_path(&from, &to, src_dir);
        }
        if let Some(n) = self.table.by_backing(src.st_dev, src.st_ino) {
            self.table
                .move_alias(&n, parent, name, newparent, newname, &ident.key());
        }
        if let Some(d) = &dst {
            if let Some(n) = self.table.by_backing(d.st_dev, d.st_ino) {
                if exchange {
                    self.table
                        .move_alias(&n, newparent, newname, parent, name, &ident.key());
                } else {
                    self.table
                        .remove_alias(&n, newparent, newname, &ident.key());
                }
            }
        }
        let (ranges, content_hash, prev_content_hash) = match &edit {
            Some((old, new)) => (
                crate::ledger::changed_ranges(old, new),
                Some(crate::ledger::sha256_bytes(new)),
                Some(crate::ledger::sha256_bytes(old)),
            ),
            // A regular file's content is on record under its new name too: it may come
            // from where nothing is ledgered file by file (written under `.git/`, as a
            // temporary) and the entry is then its only record (the hash cache knows it
            // when it was written or read through the mount).
            None if !src_dir
                && src.st_mode & libc::S_IFMT == libc::S_IFREG
                && !super::stale::untracked(&to)
                && self.gate.guard.rules().policy.output_match(&to).is_none() =>
            {
                let h = sys::openat_mode(
                    npfd.as_fd(),
                    newname,
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                    0,
                )
                .ok()
                .and_then(|fd| self.hashes.hash(&std::fs::File::from(fd)).ok());
                (None, h.map(|(h, _)| super::hash::to_string(&h)), None)
            }
            None => (None, None, None),
        };
        let draft = Draft {
            from: Some(from.clone()),
            ranges,
            content_hash,
            prev_content_hash,
            size: if src_dir {
                None
            } else {
                Some(src.st_size as u64)
            },
            detail: if exchange {
                Some(serde_json::json!({ "exchange": true }))
            } else {
                None
            },
            ..Default::default()
        };
        self.record(&ident, caller, MutationType::Rename, &to, draft)?;
        Ok(Some(()))
    }

    // ----- files -------------------------------------------------------------------

    pub fn open(&self, caller: &Caller, nodeid: u64, flags: i32) -> Result<(u64, OpenOpts)> {
        self.counters.opens.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = CtlFile::from_ino(nodeid) {
            return self.open_ctl(caller, f, flags);
        }
        let node = self.node(nodeid)?;
        if !node.is_reg() {
            return err(if node.is_dir() {
                libc::EISDIR
            } else {
                libc::ELOOP
            });
        }
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let mut write_rel = None;
        // The file's names when opened for write (checked under the stale lock).
        let mut write_rels = None;
        let epoch = self.gate.guard.generation();
        // An open for write holds the file's stale lock from its stale check through the
        // truncation (O_TRUNC) and the handle's setup: a concurrent stale-checked rename,
        // unlink, truncate or write of the same file either happened before the check (and
        // is judged by it) or sees this open's effect.
        let mut _stale = Vec::new();
        let ident = if writable {
            _stale = self.table.stale_locks(&[(node.dev, node.ino)]);
            let (ident, rels) = self.authorize_node_names(caller, Operation::OpenWrite, &node)?;
            // A read-write handle reads too: a secret in scope still needs its approval.
            if acc == libc::O_RDWR {
                for rel in &rels {
                    if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), rel) {
                        self.gate.sensitive_read(&ident, caller, rel, d)?;
                    }
                }
            }
            let fd = self.fd(&node)?;
            self.check_stale_node(
                &ident,
                caller,
                Operation::OpenWrite,
                &node,
                &rels,
                fd.as_fd(),
            )?;
            write_rel = Some(rels[0].clone());
            write_rels = Some(rels);
            ident
        } else {
            let ident = self.gate.ids.resolve(caller.pid);
            // Every known name counts: a secret must not be readable through a hard link.
            for rel in self.alias_rels(&node) {
                if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), &rel) {
                    self.gate.sensitive_read(&ident, caller, &rel, d)?;
                }
            }
            ident
        };
        let fd = self.fd(&node)?;
        // O_TRUNC empties the file inside the open: keep the old content first (line ranges).
        let (pre, pre_hash) = if write_rel.is_some() && flags & libc::O_TRUNC != 0 {
            let old = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_RDONLY).ok();
            let bytes = old
                .as_ref()
                .and_then(|f| super::hash::read_small(f, super::stale::RANGE_LIMIT));
            let hash = match &bytes {
                Some(b) => Some(crate::ledger::sha256_bytes(b)),
                // Too big for a pre-image: the hash only if already known.
                None => sys::stat_fd(fd.as_fd())
                    .ok()
                    .and_then(|st| self.hashes.cached(&super::hash::stamp_of(&st)))
                    .map(|h| super::hash::to_string(&h)),
            };
            (bytes, hash)
        } else {
            (None, None)
        };
        let token = uuid::Uuid::new_v4().to_string();
        // O_TRUNC changes the content inside the open: on record before it lands.
        let truncates = write_rel.is_some() && flags & libc::O_TRUNC != 0;
        if let (true, Some(rel)) = (truncates, &write_rel) {
            self.record_begin(&ident, caller, rel, pre_hash.clone(), &token)?;
        }
        let file = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), flags)?;
        if flags & libc::O_TRUNC != 0 && caller.uid != 0 {
            self.kill_suidgid(file.as_fd(), caller);
        }
        let open_intent = h_intent(&write_rel, &ident);
        // The names the agent may have reached the file by: its names now, and names it
        // lost a moment ago (the kernel resolved the name before this request came; a
        // name lost longer ago may name another file the agent knows by now).
        let mut open_rels = write_rels.unwrap_or_else(|| self.alias_rels(&node));
        // Names the file lost a moment ago to another identity's rename or unlink count
        // too: the kernel may have resolved the agent's path through such a name just
        // before. (Names it lost to this identity's own renames do not: its views moved
        // with them.) A view under a name that now holds another file is conservative: a
        // later overwrite there is refused as stale.
        open_rels.retain(|r| !r.as_os_str().is_empty());
        for (rel, _, when) in self.departed_rels(&node, &ident.key()) {
            if when.elapsed() <= std::time::Duration::from_secs(1) && !open_rels.contains(&rel) {
                open_rels.push(rel);
            }
        }
        let write = write_rel.clone().map(|rel| super::handle::WriteOpen {
            rel,
            token,
            epoch: (open_intent, epoch),
            created: false,
            truncated: flags & libc::O_TRUNC != 0,
            pre_image: pre,
            prev_hash: pre_hash,
            begun: truncates,
        });
        let h = FileHandle::new(
            file,
            node,
            ident,
            *caller,
            acc != libc::O_RDONLY,
            open_rels,
            write,
        );
        let mut keep_cache = false;
        let mut passthrough = false;
        if let Some(rel) = &write_rel {
            *h.node.last_open.lock() = None;
            self.prepare_write_handle(&h, rel);
        } else if let Ok(st) = sys::stat_fd(h.file.as_fd()) {
            let now = super::hash::stamp_of(&st);
            // FOPEN_KEEP_CACHE when the file is unchanged since the last read-only open and
            // its hash is known: reads may then be served from the page cache without
            // reaching the daemon, so what the identity sees is recorded here, at open.
            let mut last = h.node.last_open.lock();
            keep_cache = *last == Some(now) && self.hashes.cached(&now).is_some();
            *last = Some(now);
            drop(last);
            // With kernel passthrough no read request reaches the daemon either.
            passthrough = self.passthrough.load(Ordering::Relaxed);
            // An empty file is read in full by opening it (no read request ever comes).
            // Provisional: a read request that does come records exactly what it returns
            // (an empty file may be written by another identity before the first read).
            if keep_cache || passthrough || st.st_size == 0 {
                self.record_read_provisional(&h, caller.pid);
            }
        }
        let h = Arc::new(h);
        self.note_open(&h);
        let fh = self.add_handle(Handle::File(h));
        drop(_stale);
        Ok((
            fh,
            OpenOpts {
                direct_io: false,
                keep_cache,
                passthrough,
                noflush: write_rel.is_none(),
            },
        ))
    }

    /// A read-only file on the backing inode of a node, to register for kernel passthrough.
    pub fn backing_file(&self, nodeid: u64) -> Result<std::fs::File> {
        let node = self.node(nodeid)?;
        let fd = self.fd(&node)?;
        Ok(sys::reopen(
            self.proc_fd.as_fd(),
            fd.as_fd(),
            libc::O_RDONLY,
        )?)
    }

    fn open_ctl(&self, caller: &Caller, f: CtlFile, flags: i32) -> Result<(u64, OpenOpts)> {
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_RDONLY && !f.writable() {
            return err(libc::EACCES);
        }
        let ident = self.gate.ids.resolve(caller.pid);
        let rules = self.gate.guard.rules();
        let content = control::render(f, &ident, &self.gate.ids, &rules.policy, &|| {
            self.status_info()
        });
        let h = CtlHandle {
            file: f,
            content,
            written: Vec::new(),
        };
        let fh = self.add_handle(Handle::Control(Arc::new(Mutex::new(h))));
        Ok((
            fh,
            OpenOpts {
                direct_io: true,
                keep_cache: false,
                passthrough: false,
                noflush: true,
            },
        ))
    }

    fn status_info(&self) -> control::StatusInfo {
        control::StatusInfo {
            workspace: self.cfg.workspace.display().to_string(),
            mountpoint: self.cfg.mountpoint.display().to_string(),
            policy: self.cfg.policy_path.display().to_string(),
            policy_error: self.gate.guard.reload_error(),
            nodes: self.table.len(),
            open_handles: self.table.open_handles(),
            pending: match &self.gate.approver {
                super::approve::Approver::Human(b) => {
                    serde_json::to_value(b.pending()).unwrap_or_default()
                }
                _ => serde_json::json!([]),
            },
            counters: serde_json::json!({
                "lookups": self.counters.lookups.load(Ordering::Relaxed),
                "listings": self.counters.listings.load(Ordering::Relaxed),
                "opens": self.counters.opens.load(Ordering::Relaxed),
                "mutations": self.gate.counters.mutations.load(Ordering::Relaxed),
                "denials": self.gate.counters.denials.load(Ordering::Relaxed),
                "probe_refusals": self.gate.counters.probes.load(Ordering::Relaxed),
                "hashed_bytes": self.hashes.bytes.load(Ordering::Relaxed),
                "temporaries": self.gate.temps.len(),
                "requests": self.counters.requests.to_json(),
                "low_latency": self.low_latency.get().map(|l| {
                    let (bursts, held_ms) = l.stats();
                    serde_json::json!({"held": l.held(), "bursts": bursts, "held_ms": held_ms})
                }),
            }),
        }
    }

    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Entry, u64, OpenOpts)> {
        if is_ctl_name(parent, name) {
            return err(libc::EEXIST);
        }
        if control::is_control(parent) {
            return err(libc::EACCES);
        }
        check_name(name)?;
        let p = self.node(parent)?;
        let rel = self.child_rel(&p, name)?;
        let ident = self.authorize(caller, Operation::Create, &rel, false)?;
        let temp = super::temps::NEW_TEMP.with(|t| t.replace(false));
        let ident_intent = ident.intent();
        let pfd = self.fd(&p)?;
        self.check_git_layout(
            &ident,
            caller,
            Operation::Create,
            pfd.as_fd(),
            rel.parent().unwrap_or(Path::new("")),
            name,
        )?;
        self.watch_dir_fd(&p, pfd.as_fd());
        // A temporary is always a new file: never open an existing one as one.
        let flags = if temp { flags | libc::O_EXCL } else { flags };
        let file = {
            let _cred = sys::FsCred::switch(caller.uid, caller.gid);
            sys::create_at(pfd.as_fd(), name, flags, mode & !umask)?
        };
        if temp {
            self.gate.temps.add(&ident, caller, &rel, false, None);
        }
        let fd = sys::open_path(pfd.as_fd(), name)?;
        let st = sys::stat_fd(fd.as_fd())?;
        let node = self.table.lookup(parent, name, Some(fd), &st);
        // The creation is on record before the kernel sees the file. If the ledger cannot
        // take it now, the create fails (fail closed); the entry stays queued and lands when
        // the ledger can be written again, so the file that exists is never off the record.
        let token = uuid::Uuid::new_v4().to_string();
        let draft = Draft {
            content_hash: Some(crate::ledger::sha256_bytes(b"")),
            size: Some(0),
            detail: Some(serde_json::json!({ "handle": token })),
            ..Default::default()
        };
        if let Err(e) = self.record(&ident, caller, MutationType::Create, &rel, draft) {
            self.table.forget(node.nodeid, 1);
            return Err(e);
        }
        let h = FileHandle::new(
            file,
            node.clone(),
            ident,
            *caller,
            flags & libc::O_ACCMODE != libc::O_RDONLY,
            vec![rel.clone()],
            Some(super::handle::WriteOpen {
                rel: rel.clone(),
                token,
                epoch: (ident_intent, self.gate.guard.generation()),
                created: true,
                truncated: false,
                pre_image: None,
                prev_hash: None,
                begun: true,
            }),
        );
        self.prepare_write_handle(&h, &rel);
        let h = Arc::new(h);
        self.note_open(&h);
        let fh = self.add_handle(Handle::File(h));
        Ok((
            Entry {
                nodeid: node.nodeid,
                st,
            },
            fh,
            OpenOpts::default(),
        ))
    }

    pub fn read(&self, caller: &Caller, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if let Some(c) = self.ctl_handle(fh) {
            let c = c.lock();
            let start = (offset as usize).min(c.content.len());
            let end = (start + size as usize).min(c.content.len());
            return Ok(c.content[start..end].to_vec());
        }
        let h = self.file_handle(fh)?;
        // The first read from offset 0 that reaches end of file returned the whole file:
        // what the identity saw is exactly those bytes.
        let recorded = h.read_state().recorded;
        let before = (offset == 0 && !recorded)
            .then(|| sys::stat_fd(h.file.as_fd()).ok())
            .flatten();
        let buf = sys::pread_exact_or_eof(&h.file, offset, size as usize)?;
        let whole = buf.len() < size as usize;
        match before {
            Some(st) if whole => {
                self.record_read_bytes(&h, caller.pid, super::hash::stamp_of(&st), &buf)
            }
            // A partial read: the file's content now, unless something more exact (or
            // at least earlier) is on record for this handle.
            _ if !h.read_state().provisional => self.record_read(&h, caller.pid),
            _ => {}
        }
        Ok(buf)
    }

    /// Another handle being open on the same inode means the kernel may serve this
    /// handle's reads from pages the other one's requests filled (the page cache is
    /// dropped at each open, not at each read): no READ would reach the daemon and what
    /// the reader saw would go unrecorded, and a later overwrite by it would be judged as
    /// by an identity that never read the file. So while handles overlap, every read-only
    /// handle not yet recorded records what the file holds now (a conservative view: if
    /// the file changes before the reader reads, its later write is refused as stale).
    fn note_open(&self, h: &Arc<FileHandle>) {
        let mut list = h.node.handles.lock();
        list.retain(|w| w.strong_count() > 0);
        let others: Vec<Arc<FileHandle>> = list.iter().filter_map(|w| w.upgrade()).collect();
        list.push(Arc::downgrade(h));
        drop(list);
        if others.is_empty() {
            return;
        }
        for o in others.iter().chain(std::iter::once(h)) {
            if !o.writable {
                self.record_read_provisional(o, o.caller.pid);
            }
        }
    }

    /// A content change by a caller without `CAP_FSETID` drops set-user-ID, and set-group-ID
    /// when the file is group-executable, as the kernel does natively. With
    /// `FUSE_HANDLE_KILLPRIV_V2` (which spares a `getxattr("security.capability")` round
    /// trip per write) the kernel leaves this to the filesystem. The daemon's own writes
    /// run as root, so the backing filesystem would not do it; it does drop
    /// `security.capability` itself. Callers other than `write` are judged by uid (the
    /// kernel's flag for truncate and `O_TRUNC` is not passed through).
    pub(crate) fn kill_suidgid(&self, fd: std::os::fd::BorrowedFd<'_>, caller: &Caller) {
        let Ok(st) = sys::stat_fd(fd) else { return };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return;
        }
        let mode = st.st_mode & 0o7777;
        let mut new = mode & !libc::S_ISUID;
        // As the kernel's setattr_should_drop_sgid: set-group-ID goes when the file is
        // group-executable, or when the caller is not in the file's group.
        if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group(caller, st.st_gid))
        {
            new &= !libc::S_ISGID;
        }
        if new != mode {
            if let Err(e) = sys::chmod_fd(self.proc_fd.as_fd(), fd, new) {
                tracing::warn!("dropping set-user-ID/set-group-ID after a write: {e}");
            }
        }
    }

    /// `kill_suidgid`: the kernel asks the filesystem to drop set-user-ID and set-group-ID
    /// (the writer lacks `CAP_FSETID`; `FUSE_WRITE_KILL_SUIDGID`).
    pub fn write(
        &self,
        caller: &Caller,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<usize> {
        if let Some(c) = self.ctl_handle(fh) {
            return self.write_ctl(caller, &c, offset, data);
        }
        let h = self.file_handle(fh)?;
        // No stale-checked rename or unlink of this file runs between the checks and the
        // write (see `InodeTable::stale_locks`).
        let _stale = self.table.stale_locks(&[(h.node.dev, h.node.ino)]);
        self.before_modify(&h)?;
        if h.is_todo() {
            self.check_todo_write(&h, offset, data)?;
        }
        let undisturbed = match h.write_state() {
            Some(mut w) => !std::mem::take(&mut w.disturbed),
            None => return err(libc::EBADF),
        };
        let r = h.file.write_all_at(data, offset);
        if kill_suidgid && r.is_ok() {
            self.kill_suidgid(h.file.as_fd(), caller);
        }
        if let Some(mut w) = h.write_state() {
            w.seq
                .wrote(offset, data.len() as u64, undisturbed && r.is_ok(), || {
                    let fd = self.fd(&h.node).ok()?;
                    sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), libc::O_RDONLY).ok()
                });
            w.dirty = true;
            w.wrote = true;
        }
        // Even a failed write (ENOSPC) may have moved mtime: it was this handle's own doing.
        self.after_write(&h);
        r?;
        Ok(data.len())
    }

    fn write_ctl(
        &self,
        caller: &Caller,
        c: &Mutex<CtlHandle>,
        offset: u64,
        data: &[u8],
    ) -> Result<usize> {
        let mut c = c.lock();
        let off = offset as usize;
        if off + data.len() > 64 * 1024 {
            return err(libc::EFBIG);
        }
        if c.written.len() < off + data.len() {
            c.written.resize(off + data.len(), 0);
        }
        c.written[off..off + data.len()].copy_from_slice(data);
        let text = String::from_utf8_lossy(&c.written).into_owned();
        let ident = self.gate.ids.resolve(caller.pid);
        let rules = self.gate.guard.rules();
        match control::apply_write(c.file, &ident, &rules.policy, &text) {
            Ok(None) => Ok(data.len()),
            Ok(Some((from, to))) => {
                tracing::info!(agent = %ident.name, identity = %ident.key, "intent {from:?} -> {to:?}");
                if let Some(l) = &self.gate.ledger {
                    let draft = Draft {
                        intent_id: to.clone(),
                        agent: Some(self.gate.agent(&ident, caller)),
                        mutation_type: Some(MutationType::Intent),
                        detail: Some(serde_json::json!({ "from": from, "to": to })),
                        ..Default::default()
                    };
                    if let Err(e) = l.record(draft) {
                        // The switch is undone: a selection that is not on record did not happen.
                        *ident.intent.lock() = from;
                        return Err(self.gate.ledger_denial(
                            &ident,
                            Operation::SelectIntent,
                            Path::new(".intentfs/intent"),
                            &e.to_string(),
                        ));
                    }
                }
                Ok(data.len())
            }
            Err(control::WriteError { errno, denial }) => {
                tracing::info!(agent = %ident.name, "handshake refused: {}", denial.message);
                let _ = self.gate.deny(&ident, caller, *denial);
                err(errno)
            }
        }
    }

    pub fn flush(&self, caller: &Caller, fh: u64) -> Result<()> {
        let _ = caller;
        if self.ctl_handle(fh).is_some() {
            return Ok(());
        }
        let h = self.file_handle(fh)?;
        // close(2) waits for flush: ledgering here means a returned close() is on record.
        // Only a handle that wrote since its last entry records here: `echo x > f` closes a
        // duplicate of the truncating fd before writing, which must not make an entry of
        // the empty file. A truncate-only or create-only handle records at release.
        if h.write_state().is_some_and(|w| w.wrote) {
            self.record_write_noting(&h)?;
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        if self.ctl_handle(fh).is_some() {
            return Ok(());
        }
        let h = self.file_handle(fh)?;
        Ok(sys::fsync(&h.file, datasync)?)
    }

    /// The WRITE entry of a handle, and the identity's view under the names it opened the
    /// file by (see [`Fs::note_open_names`]).
    fn record_write_noting(&self, h: &FileHandle) -> Result<()> {
        let dirty = h.write_state().is_some_and(|w| w.dirty);
        // The entry's path, content hash and place in the ledger are taken under the file's
        // stale lock: a rename of the file either comes before (the entry has the new name)
        // or after (the rename's entry follows), never between the name and the append.
        let _stale = if dirty {
            self.table.stale_locks(&[(h.node.dev, h.node.ino)])
        } else {
            Vec::new()
        };
        let r = self.record_write(h);
        if dirty && r.is_ok() {
            self.note_open_names(h);
        }
        r
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        if let Some(Handle::File(h)) = self.take_handle(fh) {
            let r = self.record_write_noting(&h);
            self.handle_closed(&h);
            r?;
        }
        Ok(())
    }

    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let h = self.file_handle(fh)?;
        if !h.writable {
            return err(libc::EBADF);
        }
        let _stale = self.table.stale_locks(&[(h.node.dev, h.node.ino)]);
        self.before_modify(&h)?;
        if let Some(mut w) = h.write_state() {
            w.seq.off();
        }
        sys::fallocate(&h.file, mode, offset, len)?;
        if h.caller.uid != 0 {
            self.kill_suidgid(h.file.as_fd(), &h.caller);
        }
        h.mark_changed();
        self.after_write(&h);
        Ok(())
    }

    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> Result<usize> {
        let hi = self.file_handle(fh_in)?;
        let ho = self.file_handle(fh_out)?;
        if !ho.writable {
            return err(libc::EBADF);
        }
        if ho.is_todo() {
            // Writes to a rebase todo list are checked as text: let the tool write it.
            return err(libc::EXDEV);
        }
        let _stale = self.table.stale_locks(&[(ho.node.dev, ho.node.ino)]);
        self.before_modify(&ho)?;
        if let Some(mut w) = ho.write_state() {
            w.seq.off();
        }
        let n = sys::copy_file_range(&hi.file, off_in, &ho.file, off_out, len, flags)?;
        if ho.caller.uid != 0 {
            self.kill_suidgid(ho.file.as_fd(), &ho.caller);
        }
        ho.mark_changed();
        self.after_write(&ho);
        Ok(n)
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        let h = self.file_handle(fh)?;
        Ok(sys::lseek(&h.file, offset, whence)?)
    }

    // ----- directories -------------------------------------------------------------

    pub fn opendir(&self, nodeid: u64) -> Result<u64> {
        if nodeid == control::DIR_INO {
            let h = CtlHandle {
                file: CtlFile::Status,
                content: Vec::new(),
                written: Vec::new(),
            };
            return Ok(self.add_handle(Handle::Control(Arc::new(Mutex::new(h)))));
        }
        let node = self.node(nodeid)?;
        let fd = self.fd(&node)?;
        let ds = sys::DirStream::open(fd.as_fd())?;
        Ok(self.add_handle(Handle::Dir(Arc::new(Mutex::new(ds)))))
    }

    /// The stream a listing request reads: the handle's, or (fh 0: the kernel skips
    /// OPENDIR once the filesystem answered it ENOSYS, see `FuseFs::opendir`) a fresh one
    /// positioned by the request's offset. Offsets are the backing directory's own `d_off`
    /// cookies, valid on any descriptor of the directory.
    fn dir_stream(&self, nodeid: u64, fh: u64) -> Result<Arc<Mutex<sys::DirStream>>> {
        self.counters.listings.fetch_add(1, Ordering::Relaxed);
        if fh != 0 {
            return self.dir_handle(fh);
        }
        let node = self.node(nodeid)?;
        let fd = self.fd(&node)?;
        let ds = sys::DirStream::open(fd.as_fd())?;
        Ok(Arc::new(Mutex::new(ds)))
    }

    pub fn releasedir(&self, fh: u64) {
        self.take_handle(fh);
    }

    /// The control directory's entries in listing order (offset `i` resumes after the
    /// `i`th), with their types and attributes: both listing requests read this one list.
    fn control_listing(&self) -> Vec<(Entry, u8, &'static str)> {
        let dir = control::dir_stat(self.started);
        let mut entries = vec![
            (
                Entry {
                    nodeid: control::DIR_INO,
                    st: dir,
                },
                libc::DT_DIR,
                ".",
            ),
            (
                Entry {
                    nodeid: ROOT,
                    st: dir,
                },
                libc::DT_DIR,
                "..",
            ),
        ];
        for f in control::FILES {
            let st = control::file_stat(f, self.started);
            entries.push((
                Entry {
                    nodeid: f.ino(),
                    st,
                },
                libc::DT_REG,
                f.name(),
            ));
        }
        entries
    }

    /// The one listing walk behind [`Fs::readdir`] and [`Fs::readdirplus`]: from `offset`,
    /// the control directory's fixed entries, or the backing directory's. `each` gets
    /// every entry and returns true when the reply is full.
    fn list(
        &self,
        nodeid: u64,
        fh: u64,
        offset: i64,
        mut each: impl FnMut(Listed<'_>) -> Result<bool>,
    ) -> Result<()> {
        if nodeid == control::DIR_INO {
            let entries = self.control_listing();
            for (i, (e, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                let l = Listed {
                    ino: e.nodeid,
                    next: i as i64 + 1,
                    kind: *kind,
                    name: OsStr::new(name),
                    from: Source::Control(e),
                };
                if each(l)? {
                    break;
                }
            }
            return Ok(());
        }
        let d = self.dir_stream(nodeid, fh)?;
        let mut ds = d.lock();
        // Offsets are the backing directory's own d_off values (ext4 uses i64::MAX as its
        // end marker, so no made-up offset is safe). The virtual `.intentfs` is reachable by
        // name but not listed: `git add -A`, `tar`, `rsync` and `find` of the mount must not
        // pick up the handshake files. A real `.intentfs` in the workspace is hidden.
        ds.seek(offset);
        while let Some(e) = ds.next_entry()? {
            let name = OsStr::from_bytes(&e.name);
            if nodeid == ROOT && name == OsStr::new(control::DIR_NAME) {
                continue;
            }
            let ino = if e.name == b".." && nodeid == ROOT {
                ROOT
            } else {
                e.ino
            };
            let l = Listed {
                ino,
                next: e.offset,
                kind: e.kind,
                name,
                from: Source::Backing(ds.fd()),
            };
            if each(l)? {
                break;
            }
        }
        Ok(())
    }

    /// List a directory from `offset`. `add(ino, next_offset, dtype, name)` returns true
    /// when the reply is full.
    pub fn readdir(
        &self,
        nodeid: u64,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(u64, i64, u8, &OsStr) -> bool,
    ) -> Result<()> {
        self.list(nodeid, fh, offset, |l| {
            Ok(add(l.ino, l.next, l.kind, l.name))
        })
    }

    /// List a directory with each entry's attributes (readdirplus): one request instead of
    /// a lookup per entry. `add(entry, next_offset, name)` returns true when the reply is
    /// full; only entries that fit count as kernel lookups (not `.` and `..`).
    pub fn readdirplus(
        &self,
        nodeid: u64,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(&Entry, i64, &OsStr) -> bool,
    ) -> Result<()> {
        let dir = if nodeid == control::DIR_INO {
            None
        } else {
            let dir = self.node(nodeid)?;
            if let Ok(dfd) = self.fd(&dir) {
                self.watch_dir_fd(&dir, dfd.as_fd());
            }
            Some(dir)
        };
        self.list(nodeid, fh, offset, |l| {
            let dirfd = match l.from {
                // The control directory is tiny: plain entries with their attributes.
                Source::Control(e) => return Ok(add(e, l.next, l.name)),
                Source::Backing(fd) => fd,
            };
            // Backing entries come from a directory with a node.
            let Some(dir) = &dir else {
                return Ok(false);
            };
            if l.name == "." || l.name == ".." {
                // The kernel never links `.` and `..` from a listing, so they are not
                // counted; their attributes are informative only.
                let st = match sys::stat_fd(self.fd(dir)?.as_fd()) {
                    Ok(st) => st,
                    Err(_) => return Ok(false),
                };
                let id = if l.name == "." || nodeid == ROOT {
                    nodeid
                } else {
                    l.ino
                };
                return Ok(add(&Entry { nodeid: id, st }, l.next, l.name));
            }
            let st = match sys::stat_at(dirfd, l.name) {
                Ok(st) => st,
                Err(_) => return Ok(false), // gone since listed
            };
            let (node, existed) = self.table.peek(nodeid, l.name, &st);
            let ent = Entry {
                nodeid: node.nodeid,
                st,
            };
            if add(&ent, l.next, l.name) {
                if !existed {
                    self.table.discard_unreferenced(&node);
                }
                return Ok(true);
            }
            self.table.count_lookup(&node);
            Ok(false)
        })
    }

    // ----- xattrs ------------------------------------------------------------------

    pub fn getxattr(&self, nodeid: u64, name: &OsStr, size: u32) -> Result<Vec<u8>> {
        if control::is_control(nodeid) {
            return err(libc::ENODATA);
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return err(libc::ENODATA);
        }
        let fd = self.fd(&node)?;
        Ok(sys::getxattr_fd(fd.as_fd(), name, size as usize)?)
    }

    pub fn listxattr(&self, nodeid: u64, size: u32) -> Result<Vec<u8>> {
        if control::is_control(nodeid) {
            return Ok(Vec::new());
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return Ok(Vec::new());
        }
        let fd = self.fd(&node)?;
        Ok(sys::listxattr_fd(fd.as_fd(), size as usize)?)
    }

    pub fn setxattr(
        &self,
        caller: &Caller,
        nodeid: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        self.xattr_change(caller, nodeid, name, Operation::Setxattr, |fd| {
            sys::setxattr_fd(fd, name, value, flags)
        })
    }

    pub fn removexattr(&self, caller: &Caller, nodeid: u64, name: &OsStr) -> Result<()> {
        self.xattr_change(caller, nodeid, name, Operation::Removexattr, |fd| {
            sys::removexattr_fd(fd, name)
        })
    }

    fn xattr_change(
        &self,
        caller: &Caller,
        nodeid: u64,
        name: &OsStr,
        op: Operation,
        act: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>,
    ) -> Result<()> {
        if control::is_control(nodeid) {
            return err(libc::EPERM);
        }
        let node = self.node(nodeid)?;
        if node.is_symlink() {
            return err(libc::EPERM);
        }
        let (ident, rel) = self.authorize_node(caller, op, &node)?;
        let fd = self.fd(&node)?;
        act(fd.as_fd())?;
        let draft = Draft {
            detail: Some(serde_json::json!({ "op": op, "name": name.to_string_lossy() })),
            ..Default::default()
        };
        self.record(&ident, caller, MutationType::Xattr, &rel, draft)?;
        Ok(())
    }
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

/// One entry of a listing, as [`Fs::list`] walks it.
struct Listed<'a> {
    /// The entry's `d_ino`: the backing inode number (the root's `..` is the root node,
    /// control entries are their node ids).
    ino: u64,
    /// The offset that resumes after this entry.
    next: i64,
    /// Its `DT_*` type.
    kind: u8,
    name: &'a OsStr,
    from: Source<'a>,
}

/// Where a listed entry's attributes come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// A control entry: attributes made up, not stat'ed.
    Control(&'a Entry),
    /// An entry of this open backing directory.
    Backing(std::os::fd::BorrowedFd<'a>),
}
