//! `rename`: the names locked with the files they point to, the subtree walk, and the
//! rename itself as resolve → authorize → stale checks → syscall → record.

use super::*;

/// Attempts at a rename whose names other renames keep re-pointing, before `EBUSY`.
const RENAME_ATTEMPTS: usize = 256;

impl Fs {
    /// Take the stale locks of the files these names point to (see
    /// [`InodeTable::stale_locks`](crate::fs::inode::InodeTable::stale_locks)), and their stat
    /// under the locks (`None`: no such name). A name re-pointed between the look and the
    /// locking is looked at again. Each name is given with its directory's handle and
    /// backing (dev, ino).
    pub(super) fn lock_names(
        &self,
        names: &[NameAt<'_>],
    ) -> (
        Vec<crate::fs::inode::StaleGuard<'_>>,
        Vec<Option<sys::Stat>>,
    ) {
        // One name (an unlink): looked at once, under its lock, when its file's lock is
        // free and nothing is owed (`rm -rf`: one `stat` in two saved).
        if let [(d, dir, n)] = names {
            let fast = self.table.lock_name_then_file(
                name_key(*dir, n),
                || sys::stat_at(*d, n).ok(),
                |st| st.map(|s| (s.st_dev, s.st_ino)),
            );
            if let Some((guards, st)) = fast {
                return (guards, vec![st]);
            }
        }
        let l = self.lock_names_owing(names, None, None);
        (l.guards, l.stats)
    }

    /// [`Fs::lock_names`], where the file the first name points to may still owe entries
    /// of `own`'s changes only (see
    /// [`InodeTable::stale_locks_owing`](crate::fs::inode::InodeTable::stale_locks_owing)).
    /// `seen`: what the names were just found to point to, if the caller looked (looked at
    /// again under the locks all the same).
    fn lock_names_owing<'s>(
        &'s self,
        names: &[NameAt<'_>],
        own: Option<&str>,
        seen: Option<Vec<Option<sys::Stat>>>,
    ) -> LockedNames<'s> {
        let look = || -> Vec<Option<sys::Stat>> {
            names
                .iter()
                .map(|(d, _, n)| sys::stat_at(*d, n).ok())
                .collect()
        };
        // The names themselves are locked too, not only the files they point to: an
        // unlink that removed `t` holds `t`'s lock until its DELETE is on record, so a
        // rename onto `t` (which finds no file there to lock) cannot record its RENAME
        // first and leave the ledger saying `t` is gone while it exists.
        let name_keys: Vec<(u64, u64)> =
            names.iter().map(|(_, dir, n)| name_key(*dir, n)).collect();
        let key = |v: &[Option<sys::Stat>]| -> Vec<(u64, u64)> {
            v.iter()
                .flatten()
                .map(|s| (s.st_dev, s.st_ino))
                .chain(name_keys.iter().copied())
                .collect()
        };
        let lock = |v: &[Option<sys::Stat>]| {
            let first: Vec<(u64, u64)> = match (own, v.first()) {
                (Some(_), Some(Some(s))) => vec![(s.st_dev, s.st_ino)],
                _ => Vec::new(),
            };
            self.table
                .stale_locks_owing(&key(v), &first, own.unwrap_or(""))
        };
        let mut stats = seen.unwrap_or_else(look);
        for _ in 0..64 {
            let (guards, owing) = lock(&stats);
            let now = look();
            let same = now.len() == stats.len()
                && now.iter().zip(&stats).all(|(a, b)| {
                    a.map(|s| (s.st_dev, s.st_ino)) == b.map(|s| (s.st_dev, s.st_ino))
                });
            if same {
                return LockedNames {
                    guards,
                    stats: now,
                    owing,
                    name_keys,
                };
            }
            drop(guards);
            stats = now;
        }
        // Names re-pointed without end: lock what they point to now and go on (the
        // stale checks still run, only not atomically with a concurrent change), with the
        // stats the names have under the locks (the checks judge those files). (Nothing
        // owed is let through here.)
        let guards = self.table.stale_locks(&key(&stats));
        LockedNames {
            guards,
            stats: look(),
            owing: false,
            name_keys,
        }
    }

    pub(super) fn protected_below(
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
    pub(super) fn authorize_subtree(
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
                if !is_dir {
                    // (A directory moved into `refs/` would make branches of whatever its
                    // files name, without the check of a ref move; one moved out of it
                    // would delete branches with no entry. Git moves refs one by one.)
                    let git = crate::policy::git::is_ref_file;
                    if git(&n) || git(&o) {
                        let d = crate::guard::ref_write_denial(
                            Operation::Rename,
                            if git(&n) { &n } else { &o },
                            ident.intent().as_deref(),
                        );
                        return Err(self.gate.deny(ident, caller, d));
                    }
                    self.check_todo_entry(ident, caller, dfd.as_fd(), name, &n, &o)?;
                    if crate::policy::git::loose_object_id(&n).is_some() {
                        let f = sys::open_read_at(dfd.as_fd(), name).ok();
                        self.check_loose_object(ident, caller, f.as_ref(), &n)?;
                    }
                    // (An index git trusts, or a pack, arrives on its own, where git
                    // verifies it; git moves no directory of them.)
                    if crate::policy::git::trusted_index(&n).is_some() {
                        return Err(self.git_denial(
                            ident,
                            caller,
                            Operation::Rename,
                            &n,
                            format!("{} would arrive inside a directory moved: a pack or an index git trusts arrives on its own, where git verifies it", n.display()),
                            "Let git write its packs and indexes (`git gc`, `git repack`, `git commit-graph write`).",
                            "git: packs and indexes arrive one by one",
                        ));
                    }
                    if e.kind == libc::DT_LNK && crate::policy::git::in_git_dir(&n) {
                        return Err(self.todo_denial(ident, caller, &n));
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
        // An attempt is redone when another rename re-pointed one of the names between its
        // look and its locks. Renames running truly in parallel on the same names (three
        // threads exchanging around a ring of files on an idle two-CPU machine) lost that
        // race more than 16 times in a row and answered EBUSY; yielding between attempts
        // lets the winner finish, and the bound only stops a livelock.
        for _ in 0..RENAME_ATTEMPTS {
            if let Some(()) = self.rename_once(caller, parent, name, newparent, newname, flags)? {
                return Ok(());
            }
            std::thread::yield_now();
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
        let r = self.rename_resolve(parent, name, newparent, newname, flags)?;
        // (A directory moved into or out of a git directory may carry what `git am
        // --abort` reads.)
        let _am = if r.src_dir && (r.to.starts_with(".git") || r.from.starts_with(".git")) {
            Some(self.am_state.lock())
        } else {
            self.am_lock(&[name, newname])
        };
        let g = self.rename_authorize(caller, &r, flags)?;
        // The stale checks, the rename and the update of the names the daemon knows are one
        // step for any other stale-checked change of either file (an open for write, an
        // unlink, a write): an open for write either came first (and the check below sees
        // what it did) or sees the names after the rename.
        let dst_dir = r
            .dst
            .is_some_and(|d| d.st_mode & libc::S_IFMT == libc::S_IFDIR);
        if (r.src_dir || dst_dir) && self.records_owed() {
            // `--record async`: a file below the directory (either one: `RENAME_EXCHANGE`
            // of a file with a directory moves the directory) may owe the entry of its
            // close or mode change, which names it by its path now: those entries come
            // first. (A close that lands while the rename runs is ordered as with `--record
            // sync`: by the stale locks.)
            self.settle_records();
        }
        // `--record async`: an edit by rename of a file the identity has just closed (an
        // editor's or `os.replace`'s temporary) does not wait for the entries of that close:
        // its own `RENAME` is written after them, after its reply (see `may_defer`).
        let own = self.may_defer(&g, &r).then_some(g.ident.key.as_str());
        let locked = self.lock_names_owing(
            &[
                (r.pfd.as_fd(), r.pkey, name),
                (r.npfd.as_fd(), r.npkey, newname),
            ],
            own,
            Some(vec![Some(r.src), r.dst]),
        );
        let (_stale, now) = (locked.guards, locked.stats);
        let ino = |s: &Option<sys::Stat>| s.map(|s| (s.st_dev, s.st_ino));
        if ino(&now[0]) != ino(&Some(r.src)) || ino(&now[1]) != ino(&r.dst) {
            return Ok(None);
        }
        // What the entries owed would tell the stale check of the file renamed: unless the
        // file is as the identity's own write left it (they then change nothing the check
        // finds), and the recorder has room for the entry, wait for them as any change does.
        let slot = match (locked.owing, &now[0]) {
            (true, Some(src)) => {
                let slot = self
                    .own_last_change(&g.ident, src)
                    .then(|| self.rename_slot(&g.ident, &r.from, &r.to, (src.st_dev, src.st_ino)))
                    .flatten();
                if slot.is_none() {
                    drop(_stale);
                    self.table.wait_settled((src.st_dev, src.st_ino));
                    return Ok(None);
                }
                slot
            }
            _ => None,
        };
        // (Opened for writing again since the look in `rename_authorize`: look again.)
        if (checked_name(&r.to) || g.config_swap) && !r.src_dir && self.open_for_writing(&r.src) {
            return Ok(None);
        }
        // `git branch -m`'s configuration: judged again under the locks, where no write
        // handle can be set up on it any more (one opened, written and closed since the look
        // in `rename_authorize` would otherwise put what it wrote into `.git/config`).
        if g.config_swap {
            let Some(src) = now[0] else { return Ok(None) };
            self.check_config_content(
                &g.ident,
                caller,
                r.pfd.as_fd(),
                name,
                r.npfd.as_fd(),
                &src,
                &r.from,
                &r.to,
            )?;
        }
        // Stale checks: renaming a file away, and renaming over one (what `sed -i` and
        // editors do), both destroy a version the identity may not have seen.
        // (Against the stats taken under the locks: `now` holds the files `r` resolved.)
        if let (false, Some(src)) = (r.src_dir, &now[0]) {
            self.check_stale_at(
                &g.ident,
                caller,
                Operation::Rename,
                &r.from,
                r.pfd.as_fd(),
                name,
                src,
            )?;
        }
        if let (true, Some(dst)) = (r.dst.is_some(), &now[1]) {
            self.check_stale_at(
                &g.ident,
                caller,
                Operation::Rename,
                &r.to,
                r.npfd.as_fd(),
                newname,
                dst,
            )?;
        }
        let mut fx = self.rename_effects(&g.ident, caller, &r, slot.is_some())?;
        sys::rename_at(r.pfd.as_fd(), name, r.npfd.as_fd(), newname, g.flags)?;
        // (The hash of the bytes this rename read of the file moved follows it to its new
        // stamp when the rename moved only its change time: its next open does not hash
        // it again.)
        if let Some((at, h)) = fx.moved {
            if let Ok(st) = sys::stat_at(r.npfd.as_fd(), newname) {
                self.hashes
                    .carry_over_rename(&at, h, &crate::fs::hash::stamp_of(&st));
            }
        }
        self.rename_done(&g, caller, &r, &fx)?;
        // (An entry written later keeps both versions and finds the lines that changed
        // then, from the bytes read here.)
        let later = slot.is_some().then(|| fx.edit.take()).flatten();
        let draft = self.rename_draft(&r, fx.edit, fx.versions.clone());
        match slot {
            Some(slot) => {
                let keep = later.map(|(old, new)| Kept {
                    old,
                    new,
                    versions: fx.versions,
                });
                let mut keys = vec![(r.src.st_dev, r.src.st_ino)];
                keys.extend(locked.name_keys.iter().copied());
                self.record_rename_later(
                    slot,
                    keys,
                    &g.ident,
                    caller,
                    (r.from.clone(), r.to.clone()),
                    draft,
                    keep,
                );
            }
            None => self.record(&g.ident, caller, MutationType::Rename, &r.to, draft)?,
        }
        Ok(Some(()))
    }

    /// Whether this rename's entry may be written after its reply when the file renamed
    /// still owes entries of its identity's own changes (`--record async`): a regular file
    /// renamed within the recorded content (no directory, no exchange, nothing of git's
    /// internals or build output, whose checks and entries read other files), over a
    /// regular file or none.
    fn may_defer(&self, g: &RenameGrant, r: &RenameReq<'_>) -> bool {
        let reg = |m: u32| m & libc::S_IFMT == libc::S_IFREG;
        self.recorder.get().is_some()
            && !r.src_dir
            && !r.exchange
            && !g.config_swap
            && reg(r.src.st_mode)
            && r.dst.is_none_or(|d| reg(d.st_mode))
            && self.content_recorded(&r.from)
            && self.content_recorded(&r.to)
    }

    /// Resolve a rename: both names, where they are, what they name now.
    fn rename_resolve<'a>(
        &self,
        parent: u64,
        name: &'a OsStr,
        newparent: u64,
        newname: &'a OsStr,
        flags: u32,
    ) -> Result<RenameReq<'a>> {
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
        // (Within one directory, as an editor's save is, its path is looked up once.)
        let to = match from.parent() {
            Some(dir) if parent == newparent => dir.join(newname),
            _ => self.child_rel(&np, newname)?,
        };
        let src = sys::stat_at(pfd.as_fd(), name)?;
        let dst = sys::stat_at(npfd.as_fd(), newname).ok();
        Ok(RenameReq {
            parent,
            name,
            newparent,
            newname,
            pkey: (p.dev, p.ino),
            npkey: (np.dev, np.ino),
            pfd,
            npfd,
            from,
            to,
            src_dir: src.st_mode & libc::S_IFMT == libc::S_IFDIR,
            src,
            dst,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        })
    }

    /// May the caller rename `from` to `to`: both names (or a tool's temporary name), a
    /// secret not exposed under a plain name, git's layout, a rebase todo list, and every
    /// name below a directory moved.
    fn rename_authorize(
        &self,
        caller: &Caller,
        r: &RenameReq<'_>,
        flags: u32,
    ) -> Result<RenameGrant> {
        let ident = self.authorize(caller, Operation::Rename, &r.from, r.src_dir)?;
        // Renaming a secret to a name that is not sensitive would expose it.
        if let Err(d) = self
            .gate
            .guard
            .check_read(ident.intent().as_deref(), &r.from)
        {
            if self
                .gate
                .guard
                .check_read(ident.intent().as_deref(), &r.to)
                .is_ok()
            {
                self.gate.sensitive_read(&ident, caller, &r.from, d)?;
            }
        }
        // A tool's temporary may take a free name next to in-scope files (vim renames the
        // file to `name~` before writing it anew); such a rename never replaces anything.
        let to_temp = !r.exchange
            && self
                .gate
                .temp_target(&ident, &r.to, r.src_dir, r.dst.is_some());
        let from_temp = self.gate.temps.covers(&ident.key, &r.from);
        let flags = if to_temp && r.dst.is_none() {
            flags | libc::RENAME_NOREPLACE
        } else {
            flags
        };
        // `git branch -m` / `-d`: the configuration git wrote through its lock, put into
        // place; `config` itself is protected, so this is the only way it changes.
        let config_swap = !r.exchange
            && !r.src_dir
            && crate::policy::git::config_lock(&r.from)
            && r.to == r.from.with_file_name("config");
        if config_swap {
            self.check_config_content(
                &ident,
                caller,
                r.pfd.as_fd(),
                r.name,
                r.npfd.as_fd(),
                &r.src,
                &r.from,
                &r.to,
            )?;
        } else if !to_temp {
            self.authorize_as(&ident, caller, Operation::Rename, &r.to, r.src_dir)?;
        }
        self.check_git_layout(
            &ident,
            caller,
            Operation::Rename,
            r.npfd.as_fd(),
            r.to.parent().unwrap_or(Path::new("")),
            r.newname,
        )?;
        // A file becoming a ref, a git state file, an object or `.git/config`, whose content
        // is checked as it arrives, must not stay open for writing (see `Fs::writers_gone`).
        if !r.src_dir && (checked_name(&r.to) || config_swap) {
            let node = self.table.by_backing(r.src.st_dev, r.src.st_ino);
            if node.is_some_and(|n| !self.writers_gone(&n)) {
                return Err(self.still_open_denial(
                    &ident,
                    caller,
                    Operation::Rename,
                    &r.from,
                    &r.to,
                ));
            }
        }
        // Git never replaces a pack or an index git trusts that exists (new ones get new,
        // content-derived names; the commit-graph and multi-pack index through a lock).
        // (`git repack` may write the very same pack again: identical bytes may replace it.)
        if r.dst.is_some()
            && matches!(
                crate::policy::git::trusted_index(&r.to),
                Some(
                    crate::policy::git::TrustedIndex::PackData
                        | crate::policy::git::TrustedIndex::PackIndex
                )
            )
            && !same_bytes(r.pfd.as_fd(), r.name, r.npfd.as_fd(), r.newname)
        {
            return Err(self.git_denial(
                &ident,
                caller,
                Operation::Rename,
                &r.to,
                format!(
                    "{} exists: git never replaces a pack or its index (a new one has a new name)",
                    r.to.display()
                ),
                "Let git write its packs (`git gc`, `git repack`).",
                "git: packs and indexes are never replaced",
            ));
        }
        // (`rebase-apply/rebasing` counts by being there, a directory too: git makes it a
        // file.)
        if r.src_dir
            && crate::fs::gitrefs::commit_list_kind(&r.to)
                == Some(crate::fs::gitrefs::ListKind::Rebasing)
        {
            return Err(self.state_shape_denial(&ident, caller, Operation::Rename, &r.to));
        }
        if !r.src_dir {
            if crate::policy::git::loose_object_id(&r.to).is_some() {
                let f = sys::open_read_at(r.pfd.as_fd(), r.name).ok();
                self.check_loose_object(&ident, caller, f.as_ref(), &r.to)?;
            }
            self.check_todo_entry(&ident, caller, r.pfd.as_fd(), r.name, &r.to, &r.from)?;
            // (Git makes no symlink in its directory: one renamed there — a fan-out directory
            // of objects, `rebase-merge` — would have git read what no check saw.)
            if crate::policy::git::in_git_dir(&r.to)
                && r.src.st_mode & libc::S_IFMT == libc::S_IFLNK
            {
                return Err(self.todo_denial(&ident, caller, &r.to));
            }
        }
        // A directory moved out of a git directory into the worktree brings git's layout
        // (`config`, `hooks/`, `HEAD`: a repository git would use there) and content none
        // of whose files is on record. Git never does it.
        if r.src_dir
            && crate::policy::git::in_git_dir(&r.from)
            && !crate::policy::git::in_git_dir(&r.to)
        {
            return Err(self.git_denial(
                &ident,
                caller,
                Operation::Rename,
                &r.from,
                format!(
                    "{} is a directory inside git's internals: it cannot move out into the worktree ({})",
                    r.from.display(),
                    r.to.display()
                ),
                "Make new directories in the worktree and write the files there; git's internals stay in .git.",
                "git: directories do not move out of a git directory",
            ));
        }
        if r.src_dir {
            // Hold a counted reference while walking, released right after.
            let fd = sys::open_path(r.pfd.as_fd(), r.name)?;
            let dir = self.table.lookup(r.parent, r.name, Some(fd), &r.src);
            let res = self.authorize_subtree(&ident, caller, &dir, &r.from, &r.to);
            self.table.forget(dir.nodeid, 1);
            res?;
        }
        if let Some(d) = &r.dst {
            let dst_dir = d.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if r.exchange && dst_dir {
                let fd = sys::open_path(r.npfd.as_fd(), r.newname)?;
                let n = self.table.lookup(r.newparent, r.newname, Some(fd), d);
                let res = self.authorize_subtree(&ident, caller, &n, &r.to, &r.from);
                self.table.forget(n.nodeid, 1);
                res?;
            } else if dst_dir {
                // Replacing a directory: it must be empty, so only its own name matters,
                // unless it holds protected paths.
                if let Some(rule) = self.gate.guard.rules().protected.below(&r.to) {
                    return Err(self.protected_below(
                        &ident,
                        caller,
                        Operation::Rename,
                        &r.to,
                        rule,
                    ));
                }
            }
        }
        Ok(RenameGrant {
            config_swap,
            ident,
            from_temp,
            to_temp,
            flags,
        })
    }

    /// What the rename will change that the ledger carries, read before it happens: the
    /// file renamed over (an edit), and the git refs it moves, each checked to bring only
    /// commits within the scope.
    fn rename_effects(
        &self,
        ident: &Identity,
        caller: &Caller,
        r: &RenameReq<'_>,
        later: bool,
    ) -> Result<RenameEffects> {
        // A rename over a file (`sed -i`, editors, `os.replace`) is an edit of it: the entry
        // carries the lines that changed against the file it replaced, and both hashes.
        let over_file = r.dst.as_ref().is_some_and(|d| {
            !r.src_dir
                && !r.exchange
                && d.st_mode & libc::S_IFMT == libc::S_IFREG
                && r.src.st_mode & libc::S_IFMT == libc::S_IFREG
                && self.content_recorded(&r.to)
        });
        let edit = if over_file {
            // (The stamp is wanted only for the file moved, whose hash follows it.)
            let read = |dir, n| {
                sys::open_read_at(dir, n).ok().and_then(|f| {
                    crate::fs::hash::read_small_stamped(&f, crate::fs::stale::RANGE_LIMIT)
                })
            };
            read(r.npfd.as_fd(), r.newname).zip(read(r.pfd.as_fd(), r.name))
        } else {
            None
        };
        // Both versions go to the store before the rename replaces the old one: the
        // bytes just read for a small file, the files themselves for a larger one.
        let mut moved = None;
        let versions = match &edit {
            Some(((old, at_old), (new, at_new))) => {
                // A hash remembered for the stamp the bytes were read at stands for them
                // only while no write can change them without moving it: never while the
                // file may be mapped writable (a write through a page already mapped
                // leaves the stamp, and the store would keep the bytes under another
                // content's name); those bytes are hashed.
                let hn32 = self.hash_read(new, *at_new);
                let (ho, hn) = (
                    crate::fs::hash::to_string(&self.hash_read(old, *at_old)),
                    crate::fs::hash::to_string(&hn32),
                );
                moved = at_new.map(|at| (at, hn32));
                // (`later`: kept by the job that writes the entry, before it.)
                if !later {
                    self.keep_bytes(&r.to, old, &ho);
                    self.keep_bytes(&r.to, new, &hn);
                }
                (Some(hn), Some(ho))
            }
            None if over_file => {
                let keep = |dir, n| {
                    sys::open_read_at(dir, n)
                        .ok()
                        .and_then(|f| self.keep_current(&r.to, &f))
                };
                (keep(r.pfd.as_fd(), r.name), keep(r.npfd.as_fd(), r.newname))
            }
            None => (None, None),
        };
        let moved_ref = crate::policy::git::ref_name(&r.to).map(|name| {
            (
                name,
                sys::read_ref_at(r.npfd.as_fd(), r.newname),
                sys::read_ref_at(r.pfd.as_fd(), r.name),
            )
        });
        // A ref moving (or `packed-refs` rewritten) brings only commits within the scope.
        if let Some((name, _, new)) = &moved_ref {
            self.check_ref_move(ident, caller, &r.to, name, new.as_deref())?;
        }
        let mut unordered = None;
        let packed = (r.to == Path::new(".git/packed-refs") && !r.src_dir).then(|| {
            let text = |dir, n| {
                read_at(dir, n, 64 << 20)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            };
            let new = text(r.pfd.as_fd(), r.name);
            unordered = crate::fs::gitrefs::packed_out_of_order(&new);
            crate::fs::gitrefs::packed_changes(&text(r.npfd.as_fd(), r.newname), &new)
        });
        if let Some(name) = unordered {
            return Err(self.git_denial(
                ident,
                caller,
                Operation::Ref,
                &r.to,
                format!("{}: {name} is listed twice or out of order: git reads a sorted file by binary search, and could read another entry than the one checked", r.to.display()),
                "Let git write packed-refs (`git pack-refs`).",
                "git: packed-refs is sorted, one entry a name",
            ));
        }
        for (name, _, new) in packed.iter().flatten() {
            self.check_ref_move(ident, caller, &r.to, name, new.as_deref())?;
            if new.is_none() {
                // (Out of `packed-refs`: what is left is the loose ref, if there is one.)
                let loose = self.loose_value(&r.to, name);
                self.check_head_move(ident, caller, &r.to, name, loose.as_deref())?;
            }
        }
        // A loose ref moved away (not exchanged): what is left is its packed value.
        if let (Some(name), false) = (crate::policy::git::ref_name(&r.from), r.exchange) {
            if r.from != r.to {
                let packed = self.packed_value(&r.from, &name);
                self.check_head_move(ident, caller, &r.from, &name, packed.as_deref())?;
            }
        }
        Ok(RenameEffects {
            edit: edit.map(|((old, _), (new, _))| (old, new)),
            moved,
            versions,
            moved_ref,
            packed: packed.unwrap_or_default(),
        })
    }

    /// After the rename: the refs it moved on record, the temporaries, the identity's
    /// views and the daemon's names follow the files.
    fn rename_done(
        &self,
        g: &RenameGrant,
        caller: &Caller,
        r: &RenameReq<'_>,
        fx: &RenameEffects,
    ) -> Result<()> {
        let ident = &g.ident;
        if !r.src_dir {
            self.verify_trusted_index(ident, caller, &r.to)?;
        }
        if let Some((_, old, new)) = &fx.moved_ref {
            self.gate
                .record_ref(ident, caller, &r.to, old.clone(), new.clone())?;
        }
        for (name, old, new) in &fx.packed {
            // `git pack-refs` copies loose refs in: the ref did not move.
            if new.is_some() && self.loose_value(&r.to, name) == *new {
                continue;
            }
            self.gate
                .record_ref_named(ident, caller, &r.to, name, old.clone(), new.clone())?;
        }
        let temps = &self.gate.temps;
        match (g.from_temp, g.to_temp) {
            (true, true) => temps.rename(&r.from, &r.to),
            (true, false) => {
                temps.remove(&r.from);
                temps.remove(&r.to);
            }
            (false, true) => temps.add(ident, caller, &r.to, r.src_dir, Some(r.from.clone())),
            (false, false) => temps.remove(&r.to),
        }
        if r.exchange {
            ident.swap_paths(&r.from, &r.to);
        } else {
            ident.move_path(&r.from, &r.to, r.src_dir);
        }
        if let Some(n) = self.table.by_backing(r.src.st_dev, r.src.st_ino) {
            self.table
                .move_alias(&n, r.parent, r.name, r.newparent, r.newname, &ident.key());
        }
        if let Some(d) = &r.dst {
            if let Some(n) = self.table.by_backing(d.st_dev, d.st_ino) {
                if r.exchange {
                    self.table.move_alias(
                        &n,
                        r.newparent,
                        r.newname,
                        r.parent,
                        r.name,
                        &ident.key(),
                    );
                } else {
                    self.table
                        .remove_alias(&n, r.newparent, r.newname, &ident.key());
                }
            }
        }
        Ok(())
    }

    /// The `RENAME` entry: the lines an edit by rename changed, or the content now under
    /// the new name.
    fn rename_draft(
        &self,
        r: &RenameReq<'_>,
        edit: Option<(Vec<u8>, Vec<u8>)>,
        (kept_new, kept_old): (Option<String>, Option<String>),
    ) -> Draft {
        let (ranges, content_hash, prev_content_hash) = match &edit {
            Some((old, new)) => (crate::ledger::changed_ranges(old, new), kept_new, kept_old),
            // A larger file renamed over another: both versions were kept (and hashed)
            // before the rename.
            None if kept_new.is_some() || kept_old.is_some() => (None, kept_new, kept_old),
            // A regular file's content is on record under its new name too: it may come
            // from where nothing is ledgered file by file (written under `.git/`, as a
            // temporary) and the entry is then its only record (the hash cache knows it
            // when it was written or read through the mount). Kept in the store too.
            // Likewise a file moved from the workspace into git's internals, where it leaves
            // the record: its content as it left (kept as a version of its old name).
            None if !r.src_dir
                && r.src.st_mode & libc::S_IFMT == libc::S_IFREG
                && (self.content_recorded(&r.to) || self.leaves_record(r)) =>
            {
                let rel = if self.leaves_record(r) {
                    &r.from
                } else {
                    &r.to
                };
                let h = sys::open_read_at(r.npfd.as_fd(), r.newname)
                    .ok()
                    .and_then(|f| self.keep_file(rel, &f, None, true));
                (None, h.map(|(h, _)| crate::fs::hash::to_string(&h)), None)
            }
            None => (None, None, None),
        };
        Draft {
            from: Some(r.from.clone()),
            ranges,
            content_hash,
            prev_content_hash,
            size: (!r.src_dir).then_some(r.src.st_size as u64),
            detail: if r.exchange {
                Some(serde_json::json!({ "exchange": true }))
            } else {
                // What `rewind` needs to put the file it replaced back as it was.
                r.dst
                    .filter(|d| d.st_mode & libc::S_IFMT == libc::S_IFREG)
                    .map(|d| serde_json::json!({ "replaced_mode": format!("{:o}", d.st_mode & 0o7777) }))
            },
            ..Default::default()
        }
    }

    /// Whether the file behind `st` has a write handle open (any identity's).
    fn open_for_writing(&self, st: &sys::Stat) -> bool {
        self.table
            .by_backing(st.st_dev, st.st_ino)
            .is_some_and(|n| n.open_file_handles().iter().any(|h| h.writable))
    }

    /// A rename from the workspace into git's internals: what it moves leaves the record
    /// there (its entry is written all the same, see `Gate::record`).
    fn leaves_record(&self, r: &RenameReq<'_>) -> bool {
        crate::fs::stale::untracked(&r.to) && !crate::fs::stale::untracked(&r.from)
    }

    /// Whether a file's content at `rel` is recorded entry by entry (not git's internals,
    /// not build output summarized).
    pub(crate) fn content_recorded(&self, rel: &Path) -> bool {
        !crate::fs::stale::untracked(rel)
            && self.gate.guard.rules().policy.output_match(rel).is_none()
    }
}

/// The lock key of the name `n` in the directory with backing `dir` (dev, ino): apart from
/// every file's (`!dev`), sorted after them.
fn name_key((dev, ino): (u64, u64), n: &OsStr) -> (u64, u64) {
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&(dev, ino, n), &mut h);
    (!dev, std::hash::Hasher::finish(&h))
}

/// A name to lock: its directory's handle and backing (dev, ino), and the name.
pub(super) type NameAt<'a> = (std::os::fd::BorrowedFd<'a>, (u64, u64), &'a OsStr);

/// The names a change holds ([`Fs::lock_names_owing`]).
struct LockedNames<'s> {
    guards: Vec<crate::fs::inode::StaleGuard<'s>>,
    /// What each name points to, under the locks.
    stats: Vec<Option<sys::Stat>>,
    /// The first name's file owes entries (its identity's own), let through.
    owing: bool,
    /// The names' own lock keys.
    name_keys: Vec<(u64, u64)>,
}

/// A rename request, resolved.
struct RenameReq<'a> {
    parent: u64,
    name: &'a OsStr,
    newparent: u64,
    newname: &'a OsStr,
    pfd: Arc<std::os::fd::OwnedFd>,
    npfd: Arc<std::os::fd::OwnedFd>,
    /// The directories' backing (dev, ino).
    pkey: (u64, u64),
    npkey: (u64, u64),
    from: PathBuf,
    to: PathBuf,
    src: sys::Stat,
    src_dir: bool,
    /// What `to` names now, if anything.
    dst: Option<sys::Stat>,
    exchange: bool,
}

/// What authorizing a rename decided.
struct RenameGrant {
    ident: Arc<Identity>,
    /// `<git dir>/config.lock` onto `config` (see `Fs::check_config_content`).
    config_swap: bool,
    /// `from` is a temporary of the identity's.
    from_temp: bool,
    /// `to` is taken as a temporary (a free name, next to in-scope files).
    to_temp: bool,
    /// The flags the rename runs with (`RENAME_NOREPLACE` added for a temporary).
    flags: u32,
}

/// What a rename changes that the ledger carries, read before it happens.
struct RenameEffects {
    /// `(old, new)` content of a file renamed over (an edit).
    edit: Option<(Vec<u8>, Vec<u8>)>,
    /// The file renamed over another: the stamp its bytes were read at and their hash.
    moved: Option<(crate::guard::stale::Stamp, [u8; 32])>,
    /// `(new, old)` content hashes of a file renamed over, both kept in the store.
    versions: (Option<String>, Option<String>),
    /// A loose ref moved: `(name, old, new)`.
    moved_ref: Option<(String, Option<String>, Option<String>)>,
    /// Refs `packed-refs` changes: `(name, old, new)` each.
    packed: Vec<(String, Option<String>, Option<String>)>,
}

/// Up to `limit` bytes of the regular file `dir/name` (see [`sys::open_read_at`]).
fn read_at(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr, limit: u64) -> Option<Vec<u8>> {
    let f = sys::open_read_at(dir, name).ok()?;
    crate::fs::hash::read_small(&f, limit)
}

/// A name whose content is checked when a file arrives there: a git ref or a rebase todo
/// list (see `Fs::rename_authorize`).
fn checked_name(rel: &Path) -> bool {
    crate::policy::git::is_ref_file(rel)
        || crate::fs::gitrefs::is_commit_list(rel)
        || crate::policy::git::loose_object_id(rel).is_some()
        || crate::policy::git::trusted_index(rel).is_some()
}

/// Whether `a` and `b` hold the same bytes (read without following symlinks).
fn same_bytes(
    ad: std::os::fd::BorrowedFd<'_>,
    a: &OsStr,
    bd: std::os::fd::BorrowedFd<'_>,
    b: &OsStr,
) -> bool {
    use std::io::Read;
    let (Ok(fa), Ok(fb)) = (sys::open_read_at(ad, a), sys::open_read_at(bd, b)) else {
        return false;
    };
    if fa.metadata().map(|m| m.len()).ok() != fb.metadata().map(|m| m.len()).ok() {
        return false;
    }
    let (mut ra, mut rb) = (std::io::BufReader::new(fa), std::io::BufReader::new(fb));
    let (mut x, mut y) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = match ra.read(&mut x) {
            Ok(n) => n,
            Err(_) => return false,
        };
        if n == 0 {
            return true;
        }
        if rb.read_exact(&mut y[..n]).is_err() || x[..n] != y[..n] {
            return false;
        }
    }
}
