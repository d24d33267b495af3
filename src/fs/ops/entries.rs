//! Making and removing entries: `mkdir`, `mknod`, `symlink`, `link`, `unlink`/`rmdir`.

use super::*;

impl Fs {
    /// Resolve and authorize a new entry `parent/name` (`in_control`: the errno inside
    /// `.intentfs/`): the parent's handle (watched from now on), the entry's path, who
    /// makes it, and whether it is a tool's temporary; git's layout is checked too.
    pub(super) fn authorize_new(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        op: Operation,
        is_dir: bool,
        in_control: i32,
    ) -> Result<NewEntry> {
        if is_ctl_name(parent, name) {
            return err(libc::EEXIST);
        }
        if control::is_control(parent) {
            return err(in_control);
        }
        check_name(name)?;
        let p = self.node(parent)?;
        let rel = self.child_rel(&p, name)?;
        // A name a rename just vacated, its entry still queued: the entry of what is made
        // there comes after it.
        self.wait_deferred(&rel);
        let ident = self.authorize(caller, op, &rel, is_dir)?;
        let temp = crate::fs::temps::NEW_TEMP.with(|t| t.replace(false));
        let pfd = self.fd(&p)?;
        self.check_git_layout(
            &ident,
            caller,
            op,
            pfd.as_fd(),
            rel.parent().unwrap_or(Path::new("")),
            name,
        )?;
        // A git state file is made only as git makes it, a file created and written: some
        // count by being there (`rebase-apply/rebasing`: `git am` then applies the commits
        // its mails name, and an attack pass made it with mkdir, mkfifo and mknod, which
        // no write or close check sees). Such a one is judged as it is made.
        // (Directories of reflogs, `logs/refs/heads/<dir>`, are made as directories.)
        if let Some(kind) = crate::fs::gitrefs::commit_list_kind(&rel) {
            let rebasing = kind == crate::fs::gitrefs::ListKind::Rebasing;
            if matches!(op, Operation::Mknod | Operation::Symlink)
                || (op == Operation::Mkdir && rebasing)
            {
                return Err(self.state_shape_denial(&ident, caller, op, &rel));
            }
            if rebasing && op == Operation::Create {
                // (Judged before it exists, as its close would judge it, empty.)
                self.check_state_file(&ident, caller, &rel, b"", true)?;
            }
        }
        self.watch_dir_fd(&p, pfd.as_fd());
        Ok(NewEntry {
            pfd,
            rel,
            ident,
            temp,
        })
    }

    /// Common shape of mkdir/mknod/symlink: authorize `parent/name`, run `make`, look the new
    /// entry up, ledger it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn make_entry(
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
        let _am = self.am_lock(&[name]);
        let NewEntry {
            pfd,
            rel,
            ident,
            temp,
        } = self.authorize_new(caller, parent, name, op, is_dir, libc::EPERM)?;
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
        let _am = self.am_lock(&[newname]);
        let node = self.node(nodeid)?;
        if node.is_dir() {
            return err(libc::EPERM);
        }
        self.settled(&node);
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
        self.wait_deferred(&rel);
        self.authorize_as(&ident, caller, Operation::Link, &rel, false)?;
        // A file with a name in git's internals and one in the worktree: writes through the
        // first are not on record, and a rebase todo list with another name is changed
        // without its check. Git never links across (nor to a todo list).
        let names = self.alias_rels(&node);
        if crate::fs::gitrefs::is_commit_list(&rel)
            || names.iter().any(|n| crate::fs::gitrefs::is_commit_list(n))
        {
            return Err(self.todo_denial(&ident, caller, &rel));
        }
        // (Git links a loose object from its temporary name into place: its content must
        // be the object, and the temporary closed, as for a rename.)
        // (The file's stale lock is held through the link: a write open of it, which takes
        // that lock, either came before and is seen here, or comes after and finds the
        // object's name, where it is refused.)
        let mut _object_lock = Vec::new();
        if crate::policy::git::loose_object_id(&rel).is_some() {
            let still_open =
                || self.still_open_denial(&ident, caller, Operation::Link, &from, &rel);
            if !self.writers_gone(&node) {
                return Err(still_open());
            }
            _object_lock = self.table.stale_locks(&[(node.dev, node.ino)]);
            if node.open_file_handles().iter().any(|h| h.writable) {
                return Err(still_open());
            }
            let f = self
                .fd(&node)
                .ok()
                .and_then(|fd| sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()).ok());
            self.check_loose_object(&ident, caller, f.as_ref(), &rel)?;
        }
        let git = crate::policy::git::in_git_dir;
        if let Some(other) = names.iter().find(|n| git(n) != git(&rel)) {
            return Err(self.git_denial(
                &ident,
                caller,
                Operation::Link,
                &rel,
                format!(
                    "{} and {} would be one file, one name inside git's internals and one in the worktree: its changes through the first would not be on record",
                    rel.display(),
                    other.display()
                ),
                "Copy the file instead of linking it (`cp`).",
                "git: no hard link between git's internals and the worktree",
            ));
        }
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
        self.verify_trusted_index(&ident, caller, &rel)?;
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

    // ----- removing ----------------------------------------------------------------

    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr, is_dir: bool) -> Result<()> {
        if is_ctl_name(parent, name) || control::is_control(parent) {
            return err(libc::EPERM);
        }
        check_name(name)?;
        let _am = self.am_lock(&[name]);
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
        let (_stale, st) = self.lock_names(&[(pfd.as_fd(), (p.dev, p.ino), name)]);
        let st = st[0].ok_or(FsError::Os(libc::ENOENT))?;
        let prev = if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            Some(st.st_size as u64)
        } else {
            None
        };
        if !is_dir {
            self.check_stale_at(
                &ident,
                caller,
                Operation::Unlink,
                &rel,
                pfd.as_fd(),
                name,
                &st,
            )?;
        }
        // A loose ref's name and its packed value, read once (a directory holds no ref).
        let ref_packed = crate::policy::git::ref_name(&rel)
            .filter(|_| !is_dir)
            .map(|r| {
                let packed = self.packed_value(&rel, &r);
                (r, packed)
            });
        let old_ref = ref_packed.as_ref().and_then(|(_, packed)| {
            let v = sys::read_ref_at(pfd.as_fd(), name)?;
            // `git pack-refs` removes loose refs it packed: the ref did not move.
            (packed.as_deref() != Some(v.as_str())).then_some(v)
        });
        // The current branch's loose ref deleted: HEAD then names its packed value, or none.
        if let Some((r, packed)) = &ref_packed {
            self.check_head_move(&ident, caller, &rel, r, packed.as_deref())?;
        }
        // What `rewind` needs to make it again: the mode, and a symlink's target.
        let kind = st.st_mode & libc::S_IFMT;
        let target = (kind == libc::S_IFLNK)
            .then(|| sys::open_path(pfd.as_fd(), name).ok())
            .flatten()
            .and_then(|fd| sys::readlink_fd(fd.as_fd()).ok());
        // Removing a regular file's last name destroys its content: kept first, and named
        // by the DELETE (`restore` and `rewind` bring it back from there).
        // (Not even opened when its hash is known for the stamp it has.)
        let kept = (!is_dir
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
            && st.st_nlink <= 1
            && self.content_recorded(&rel))
        .then(|| self.keep_current_at(&rel, &st, || sys::open_read_at(pfd.as_fd(), name).ok()))
        .flatten();
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
                detail: Some(match target {
                    Some(t) => serde_json::json!({
                        "target": String::from_utf8_lossy(&t),
                    }),
                    None => serde_json::json!({
                        "mode": format!("{:o}", st.st_mode & 0o7777),
                    }),
                }),
                prev_content_hash: kept,
                ..Default::default()
            },
        )?;
        Ok(())
    }
}

/// A new entry, resolved and authorized (see [`Fs::authorize_new`]).
pub(super) struct NewEntry {
    pub pfd: Arc<std::os::fd::OwnedFd>,
    pub rel: PathBuf,
    pub ident: Arc<Identity>,
    /// A tool's temporary: registered once it exists.
    pub temp: bool,
}
