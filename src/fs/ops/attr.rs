//! Lookups and attributes: `lookup`, `getattr`, `setattr` and the other calls that
//! read or set one node's attributes.

use super::*;

impl Fs {
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
        // The content store holds every version of every file, secrets included: it does
        // not exist as far as the mount is concerned (by inode: no name reaches it).
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR && self.is_store_dir(st.st_dev, st.st_ino) {
            return err(libc::ENOENT);
        }
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
        // (`--record async`: after the entry of the file's last close.)
        self.settled(&node);
        // Only a regular file has a size to set: refuse before anything else changes (a
        // request may carry a mode or owner with the size).
        if a.size.is_some() && !node.is_reg() {
            return err(if node.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            });
        }
        let op = a.operation();
        // A truncation holds the file's stale lock from its check through the change.
        let _am = a.size.and_then(|_| self.node_am_lock(&node));
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
            // With kernel passthrough, truncating a file another identity holds open for
            // writing is refused as its write open would be (the lease).
            if own.is_none() && self.data_passthrough() {
                self.check_lease(&ident, caller, Operation::Truncate, &node, &rel)?;
            }
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
        // (`--record async`: room for the entry of a mode or owner change, taken before the
        // change is made; one that finds none is recorded before its reply.)
        let slot = (a.size.is_none() && (a.mode.is_some() || a.uid.is_some() || a.gid.is_some()))
            .then(|| self.defer_slot(MutationType::Chmod, &node, &ident, &rel, 0))
            .flatten();
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
        // A truncation not through a write handle is an entry of its own: the content
        // before it and after it go to the store (a handle's are its WRITE's).
        let mut versions = (None, None);
        if let Some(size) = a.size {
            let own_handle = fh
                .and_then(|fh| self.file_handle(fh).ok())
                .is_some_and(|h| h.writable);
            if !own_handle {
                versions.0 = sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd())
                    .ok()
                    .and_then(|f| self.keep_current(&rel, &f));
            }
            through_handle = self.truncate(caller, fd.as_fd(), fh, size, a.mode.is_some())?;
            if !own_handle {
                versions.1 = sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd())
                    .ok()
                    .and_then(|f| self.keep_current(&rel, &f));
            }
        }
        if a.atime.is_some() || a.mtime.is_some() {
            self.set_times(&node, fd.as_fd(), &a)?;
        }
        let after = sys::stat_fd(fd.as_fd())?;
        if node.is_reg() {
            self.note_own_change(&node, &ident, &after);
            // A truncate is the identity's own completed change: its view follows. (One
            // through its own write handle continues that handle's change, as its writes
            // do: the handle's WRITE brings the view along at close, without reading the
            // file whole here as well.)
            if a.size.is_some() && through_handle.is_none() {
                self.saw_own_now(&node, &ident, caller, fd.as_fd());
            }
        }
        if let Some((mt, mut draft)) = setattr_entry(op, &a, &before, &after, through_handle) {
            if mt == MutationType::Truncate {
                (draft.prev_content_hash, draft.content_hash) = versions;
                crate::fs::stale::with_aliases(&mut draft, &rels[1..]);
            }
            self.record_change(&ident, caller, mt, &rel, draft, slot)?;
        }
        Ok(after)
    }

    /// Set a regular file's size, through the caller's write handle when it has one
    /// (returns its token: the handle's WRITE at close records what it leaves).
    fn truncate(
        &self,
        caller: &Caller,
        fd: std::os::fd::BorrowedFd<'_>,
        fh: Option<u64>,
        size: u64,
        sets_mode: bool,
    ) -> Result<Option<String>> {
        let through = fh
            .and_then(|fh| self.file_handle(fh).ok())
            .filter(|h| h.writable);
        let Some(h) = through else {
            let f = sys::reopen(self.proc_fd.as_fd(), fd, libc::O_WRONLY)?;
            f.set_len(size)?;
            if caller.uid != 0 && !sets_mode {
                self.kill_suidgid(f.as_fd(), caller);
            }
            return Ok(None);
        };
        // The handle's WRITE at close records what it leaves, with the lines changed since
        // before its first change: the TRUNCATE entry says so.
        let mut token = None;
        if let Some(mut w) = h.write_state() {
            token = Some(w.token.clone());
            w.seq.off();
        }
        h.file.set_len(size)?;
        if caller.uid != 0 && !sets_mode {
            self.kill_suidgid(h.file.as_fd(), caller);
        }
        h.mark_changed();
        self.after_write(&h);
        Ok(token)
    }

    /// Set access and modification times (of a symlink itself, not its target).
    fn set_times(
        &self,
        node: &Arc<Node>,
        fd: std::os::fd::BorrowedFd<'_>,
        a: &SetAttr,
    ) -> Result<()> {
        if !node.is_symlink() {
            return Ok(sys::utimes_fd(self.proc_fd.as_fd(), fd, a.atime, a.mtime)?);
        }
        let (parent, name) = node
            .aliases()
            .into_iter()
            .next()
            .ok_or(FsError::Os(libc::ESTALE))?;
        let p = self.node(parent)?;
        let pfd = self.fd(&p)?;
        Ok(sys::utimes_at_nofollow(
            pfd.as_fd(),
            &name,
            a.atime,
            a.mtime,
        )?)
    }

    /// The identity's view of the file under every name follows a change it made itself.
    fn saw_own_now(
        &self,
        node: &Arc<Node>,
        ident: &Identity,
        caller: &Caller,
        fd: std::os::fd::BorrowedFd<'_>,
    ) {
        let Ok(f) = sys::reopen_quiet(self.proc_fd.as_fd(), fd) else {
            return;
        };
        if let Ok((hash, stamp)) = self.hashes.hash(&f) {
            for r in self.alias_rels(node) {
                ident.saw_own(&r, caller.pid, crate::guard::stale::Seen { stamp, hash });
            }
        }
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
}

impl SetAttr {
    /// The operation a request is authorized as: its most consequential change.
    pub fn operation(&self) -> Operation {
        if self.size.is_some() {
            Operation::Truncate
        } else if self.mode.is_some() {
            Operation::Chmod
        } else if self.uid.is_some() || self.gid.is_some() {
            Operation::Chown
        } else {
            Operation::Utimes
        }
    }
}

/// The ledger entry of an attribute change, if it is worth one. Time-only changes are not
/// content mutations worth a ledger line each (every `touch` and `tar x` would double the
/// ledger); they are still authorized. Neither is a chmod or chown that changes nothing
/// (`tar x` as root chowns and chmods every file it makes to what it already is).
fn setattr_entry(
    op: Operation,
    a: &SetAttr,
    before: &sys::Stat,
    after: &sys::Stat,
    through_handle: Option<String>,
) -> Option<(MutationType, Draft)> {
    let mt = match op {
        Operation::Truncate => MutationType::Truncate,
        Operation::Chmod => MutationType::Chmod,
        Operation::Chown => MutationType::Chown,
        _ => return None,
    };
    let noop = matches!(mt, MutationType::Chmod | MutationType::Chown)
        && before.st_mode == after.st_mode
        && before.st_uid == after.st_uid
        && before.st_gid == after.st_gid;
    if noop {
        return None;
    }
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
    if let (MutationType::Truncate, Some(t)) = (mt, through_handle) {
        draft.detail = Some(serde_json::json!({ "handle": t }));
    }
    Some((mt, draft))
}
