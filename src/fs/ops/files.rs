//! Regular files: `open`, `create`, `read`, `write`, `flush`, `release` and the other
//! calls through a file handle.

use super::*;

impl Fs {
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
        let truncates = flags & libc::O_TRUNC != 0;
        let changes = acc != libc::O_RDONLY || truncates;
        let epoch = self.gate.guard.generation();
        // An open for write holds the file's stale lock from its stale check through the
        // truncation (O_TRUNC) and the handle's setup: a concurrent stale-checked rename,
        // unlink, truncate or write of the same file either happened before the check (and
        // is judged by it) or sees this open's effect.
        // (Held until the handle is counted: see `Fs::intent_switch`.)
        let _switch = (changes && self.data_passthrough()).then(|| self.intent_switch.read());
        // (Before the stale lock, as everywhere: see `Fs::am_lock`.)
        let _am = changes.then(|| self.node_am_lock(&node)).flatten();
        let _stale = if changes {
            self.table.stale_locks(&[(node.dev, node.ino)])
        } else {
            Vec::new()
        };
        let (ident, write_rels) = self.authorize_open(caller, &node, flags)?;
        let write_rel = write_rels.as_ref().map(|r| r[0].clone());
        // With kernel passthrough of data, this handle's writes will not reach the daemon:
        // everything they would have been checked for is decided now (a rebase todo list
        // stays daemon-handled: each of its writes is checked as text).
        let pt = write_rel.as_deref().is_some_and(|rel| self.pt_writes(rel));
        // Every write open of a passthrough mount takes part in the lease, a daemon-served
        // one (a rebase todo list, which may be a hard link of any file) included.
        if let (true, Some(rel)) = (self.data_passthrough(), &write_rel) {
            self.check_lease(&ident, caller, Operation::OpenWrite, &node, rel)?;
        }
        let fd = self.fd(&node)?;
        // O_TRUNC empties the file inside the open: keep the old content first (line
        // ranges), and put the change on record before it lands. So does a passthrough
        // write open: its first byte lands without the daemon.
        let (pre, pre_hash) = if truncates || pt {
            self.content_before(fd.as_fd(), write_rel.as_deref())
        } else {
            (None, None)
        };
        let token = uuid::Uuid::new_v4().to_string();
        if let (true, Some(rel)) = (truncates || pt, &write_rel) {
            self.record_begin(&ident, caller, rel, pre_hash.clone(), &token)?;
        }
        let file = sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), flags)?;
        // Set-user-ID goes when content changes; with passthrough the kernel writes as the
        // daemon (which keeps it), so a write open drops it up front.
        if (truncates || pt) && caller.uid != 0 {
            self.kill_suidgid(file.as_fd(), caller);
        }
        let open_intent = h_intent(&write_rel, &ident);
        let open_rels = self.open_names(&node, &ident, write_rels);
        let write = write_rel.clone().map(|rel| crate::fs::handle::WriteOpen {
            rel,
            token,
            epoch: (open_intent, epoch),
            created: false,
            truncated: truncates,
            pre_image: pre,
            prev_hash: pre_hash,
            begun: truncates || pt,
            pt,
            rdwr: acc == libc::O_RDWR,
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
        let (keep_cache, passthrough) = match &write_rel {
            Some(rel) => {
                *h.node.last_open.lock() = None;
                self.prepare_write_handle(&h, rel);
                if pt && acc == libc::O_RDWR {
                    // Its reads bypass the daemon too: what it sees is recorded now.
                    self.record_read_provisional(&h, caller.pid);
                }
                (false, pt)
            }
            None => self.read_only_open(&h, caller),
        };
        // A git state file's writes are judged as they come, so each must arrive as the
        // write the tool made: through the page cache, an unaligned write that crosses a
        // page boundary reaches the daemon in two pieces (an attack pass's agent had every
        // commit fail once `.git/logs/HEAD` reached 4 KiB: a reflog line cut in two).
        let direct_io = h.is_todo();
        let h = Arc::new(h);
        self.note_open(&h);
        let fh = self.add_handle(Handle::File(h));
        drop(_stale);
        Ok((
            fh,
            OpenOpts {
                direct_io,
                keep_cache,
                passthrough,
                noflush: write_rel.is_none(),
            },
        ))
    }

    /// May the caller open `node` with `flags`? An open that may change the file (write
    /// access or `O_TRUNC`) is authorized under every name of the file and stale-checked,
    /// and its names are returned; any open that reads needs a secret's approval under
    /// every name it has (a hard link must not expose it).
    fn authorize_open(
        &self,
        caller: &Caller,
        node: &Arc<Node>,
        flags: i32,
    ) -> Result<(Arc<Identity>, Option<Vec<PathBuf>>)> {
        let acc = flags & libc::O_ACCMODE;
        if acc == libc::O_RDONLY && flags & libc::O_TRUNC == 0 {
            let ident = self.gate.ids.resolve(caller.pid);
            for rel in self.alias_rels(node) {
                if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), &rel) {
                    self.gate.sensitive_read(&ident, caller, &rel, d)?;
                }
            }
            return Ok((ident, None));
        }
        let (ident, rels) = self.authorize_node_names(caller, Operation::OpenWrite, node)?;
        // A read-write handle reads too: a secret in scope still needs its approval.
        if acc == libc::O_RDWR {
            for rel in &rels {
                if let Err(d) = self.gate.guard.check_read(ident.intent().as_deref(), rel) {
                    self.gate.sensitive_read(&ident, caller, rel, d)?;
                }
            }
        }
        let fd = self.fd(node)?;
        self.check_stale_node(
            &ident,
            caller,
            Operation::OpenWrite,
            node,
            &rels,
            fd.as_fd(),
        )?;
        Ok((ident, Some(rels)))
    }

    /// The content of a file about to be emptied, for line ranges (text files up to the
    /// range limit), and its hash; kept in the content store (a file larger than the
    /// range limit is stored from the file, hashed as it is stored when its hash is not
    /// known: one read).
    fn content_before(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        rel: Option<&Path>,
    ) -> (Option<Vec<u8>>, Option<String>) {
        let old = sys::reopen_quiet(self.proc_fd.as_fd(), fd).ok();
        let read = old
            .as_ref()
            .and_then(|f| crate::fs::hash::read_small_stamped(f, crate::fs::stale::RANGE_LIMIT));
        let (bytes, at) = read.unzip();
        let hash = match &bytes {
            Some(b) => {
                let h = crate::fs::hash::to_string(&self.hash_read(b, at.flatten()));
                if let Some(rel) = rel {
                    self.keep_bytes(rel, b, &h);
                }
                Some(h)
            }
            None => match (rel, &old) {
                (Some(rel), Some(f)) => self
                    .keep_file(rel, f, None, false)
                    .map(|(h, _)| crate::fs::hash::to_string(&h)),
                _ => sys::stat_fd(fd)
                    .ok()
                    .and_then(|st| self.hashes.cached(&crate::fs::hash::stamp_of(&st)))
                    .map(|h| crate::fs::hash::to_string(&h)),
            },
        };
        (bytes, hash)
    }

    /// The names the agent may have reached the file by: its names now (those it was
    /// authorized under, for a write), and names it lost a moment ago.
    fn open_names(
        &self,
        node: &Arc<Node>,
        ident: &Identity,
        write_rels: Option<Vec<PathBuf>>,
    ) -> Vec<PathBuf> {
        let mut open_rels = write_rels.unwrap_or_else(|| self.alias_rels(node));
        // Names the file lost a moment ago to another identity's rename or unlink count
        // too: the kernel may have resolved the agent's path through such a name just
        // before (a name lost longer ago may name another file the agent knows by now).
        // (Names it lost to this identity's own renames do not: its views moved with
        // them.) A view under a name that now holds another file is conservative: a
        // later overwrite there is refused as stale.
        open_rels.retain(|r| !r.as_os_str().is_empty());
        for (rel, _, when) in self.departed_rels(node, &ident.key()) {
            if when.elapsed() <= std::time::Duration::from_secs(1) && !open_rels.contains(&rel) {
                open_rels.push(rel);
            }
        }
        open_rels
    }

    /// A read-only open: whether the kernel may keep its page cache and read the backing
    /// file directly (`(keep_cache, passthrough)`); when no read request may come, what
    /// the identity sees is recorded now.
    fn read_only_open(&self, h: &FileHandle, caller: &Caller) -> (bool, bool) {
        let Ok(st) = sys::stat_fd(h.file.as_fd()) else {
            return (false, false);
        };
        let now = crate::fs::hash::stamp_of(&st);
        // FOPEN_KEEP_CACHE when the file is unchanged since the last read-only open and
        // its hash is known: reads may then be served from the page cache without
        // reaching the daemon, so what the identity sees is recorded here, at open.
        let mut last = h.node.last_open.lock();
        let keep_cache = *last == Some(now) && self.hashes.cached(&now).is_some();
        *last = Some(now);
        drop(last);
        // With kernel passthrough no read request reaches the daemon either.
        let passthrough = self.passthrough.load(Ordering::Relaxed);
        // An empty file is read in full by opening it (no read request ever comes).
        // Provisional: a read request that does come records exactly what it returns
        // (an empty file may be written by another identity before the first read).
        if keep_cache || passthrough || st.st_size == 0 {
            self.record_read_provisional(h, caller.pid);
        }
        (keep_cache, passthrough)
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

    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Entry, u64, OpenOpts)> {
        // (Held until the handle is counted: see `Fs::intent_switch`.)
        let _switch = self.data_passthrough().then(|| self.intent_switch.read());
        let _am = self.am_lock(&[name]);
        let super::entries::NewEntry {
            pfd,
            rel,
            ident,
            temp,
        } = self.authorize_new(caller, parent, name, Operation::Create, false, libc::EACCES)?;
        let ident_intent = ident.intent();
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
            content_hash: Some(crate::store::EMPTY.to_owned()),
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
            Some(crate::fs::handle::WriteOpen {
                rel: rel.clone(),
                token,
                epoch: (ident_intent, self.gate.guard.generation()),
                created: true,
                truncated: false,
                pre_image: None,
                prev_hash: None,
                begun: true,
                pt: self.pt_writes(&rel),
                rdwr: flags & libc::O_ACCMODE == libc::O_RDWR,
            }),
        );
        self.prepare_write_handle(&h, &rel);
        let pt = h.write_state().is_some_and(|w| w.pt);
        // (As in `open`: a git state file's writes arrive whole.)
        let direct_io = h.is_todo();
        let h = Arc::new(h);
        self.note_open(&h);
        let fh = self.add_handle(Handle::File(h));
        Ok((
            Entry {
                nodeid: node.nodeid,
                st,
            },
            fh,
            OpenOpts {
                passthrough: pt,
                direct_io,
                ..OpenOpts::default()
            },
        ))
    }

    pub fn read(&self, caller: &Caller, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        if let Some(c) = self.ctl_handle(fh) {
            let mut c = c.lock();
            if offset == 0 && c.request.is_some() {
                self.ask_ahead(caller, &mut c)?;
            }
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
                self.record_read_bytes(&h, caller.pid, crate::fs::hash::stamp_of(&st), &buf)
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
    pub(super) fn note_open(&self, h: &Arc<FileHandle>) {
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
                    sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()).ok()
                });
            w.dirty = true;
            w.wrote = true;
        }
        // Even a failed write (ENOSPC) may have moved mtime: it was this handle's own doing.
        self.after_write(&h);
        r?;
        Ok(data.len())
    }

    pub fn flush(self: &Arc<Self>, caller: &Caller, fh: u64) -> Result<()> {
        if self.ctl_handle(fh).is_some() {
            return Ok(());
        }
        let h = self.file_handle(fh)?;
        if h.is_todo() {
            self.check_todo_close(&h)?;
        }
        // A process of the handle's identity closing a descriptor of a passthrough handle
        // had it (inherited): one of the handle's processes, where a mapping of the file
        // may live on after its opener exited (see `release`). (Not one of another
        // identity, handed the descriptor: its writes stay an outsider's.)
        // A closer the handle cannot keep track of (the list is full, another identity's
        // process) may keep a mapping no search from the handle's processes finds: the
        // search at release then looks at every process.
        if h.write_state()
            .is_some_and(|w| w.pt && !w.writers.contains(&(caller.pid as i32)))
        {
            let own = self.gate.ids.resolve(caller.pid).key == h.identity.key;
            let tgid = crate::guard::identity::tgid_of(caller.pid) as i32;
            if let Some(mut w) = h.write_state() {
                if !w.writers.contains(&tgid) {
                    if own && w.writers.len() < 64 {
                        w.writers.push(tgid);
                    } else {
                        w.closers_untracked = true;
                    }
                }
            }
        }
        // close(2) waits for flush: ledgering here means a returned close() is on record.
        // Only a handle that wrote since its last entry records here: `echo x > f` closes a
        // duplicate of the truncating fd before writing, which must not make an entry of
        // the empty file. A truncate-only or create-only handle records at release.
        if h.write_state().is_some_and(|w| w.wrote) || self.pt_changed(&h) {
            // (The closing process only: the whole tree is searched at release.)
            if self.pt_mapped_by(&h, caller.pid) {
                if let Some(mut w) = h.write_state() {
                    w.mapped = true;
                }
            }
            if let Some(rec) = self.recorder.get() {
                // The entry is written after the reply, by the recorder, when the queue has
                // room for it; the file is marked as owing it first, so the agent's next
                // change of it waits for it.
                let key = (h.node.dev, h.node.ino);
                let limit = self.deferrable_bytes();
                let taken = self.table.owe_with(key, &h.identity.key, || {
                    let rels = self.node_rels(&h.node).ok();
                    let agent = self.gate.agent(&h.identity, &h.caller);
                    let bytes = self.close_bytes(&h, rels.as_deref());
                    if !rec.take(bytes, limit) {
                        return None;
                    }
                    if let (Some(rels), Some(mut w)) = (rels, h.write_state()) {
                        w.at_close = Some((rels, agent));
                    }
                    Some(bytes)
                });
                match taken {
                    Some(bytes) => {
                        self.record_later(rec, Some(key), bytes, move |fs| {
                            if let Err(e) = fs.record_write_noting(&h) {
                                fs.rec_failed("a close", &fs.display_rel(&h.node), &e);
                            }
                        });
                        return Ok(());
                    }
                    // No room: recorded now, after the entries the file owes already.
                    None => {
                        self.table.settle(key);
                        self.settled(&h.node);
                    }
                }
            }
            self.record_write_noting(&h)?;
        }
        Ok(())
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<()> {
        if self.ctl_handle(fh).is_some() {
            return Ok(());
        }
        let h = self.file_handle(fh)?;
        sys::fsync(&h.file, datasync)?;
        // (`--record async`: a file made durable has its entries on record too.)
        self.settled(&h.node);
        Ok(())
    }

    /// The WRITE entry of a handle, and the identity's view under the names it opened the
    /// file by (see [`Fs::note_open_names`]).
    pub(crate) fn record_write_noting(&self, h: &FileHandle) -> Result<()> {
        let dirty = h.write_state().is_some_and(|w| w.dirty);
        // The entry's path, content hash and place in the ledger are taken under the file's
        // stale lock: a rename of the file either comes before (the entry has the new name)
        // or after (the rename's entry follows), never between the name and the append.
        let _stale = if dirty {
            self.table.stale_locks(&[(h.node.dev, h.node.ino)])
        } else {
            Vec::new()
        };
        self.record_write_noting_locked(h)
    }

    /// [`Fs::record_write_noting`] with the file's stale lock held by the caller.
    fn record_write_noting_locked(&self, h: &FileHandle) -> Result<()> {
        let dirty = h.write_state().is_some_and(|w| w.dirty);
        let r = self.record_write(h);
        if dirty && r.is_ok() {
            self.note_open_names(h);
        }
        r
    }

    /// `--record async`: a write handle's release may still record (what changed since
    /// its last close, a mapping's writes) and ends its lease, so its file is marked as
    /// owing an entry ([`inode::InodeTable::owe`]) as soon as the release arrives: the file's
    /// next stale-checked change (the same agent opening it again, another identity's
    /// write open) waits until the release has run. Returns the file to settle after it
    /// and what its entry may take.
    pub fn release_owed(&self, fh: u64) -> Option<Owed> {
        self.recorder.get()?;
        let h = match self.handles.lock().get(&fh) {
            Some(Handle::File(h)) => h.clone(),
            _ => return None,
        };
        // (A handle that may change its file: write access, `O_TRUNC`, a create. One
        // opened to read only records nothing: it is released at once, owing nothing, so
        // a rename over the file or a write open of it does not wait for the recorder.)
        // Its close's entry still queued with the names it fixed, or already written with
        // nothing changed since, and nothing the release may record besides (no shared
        // mapping of a write-only handle, no writer from outside, no closer untracked): a
        // rename of the file by its identity may pass it (see `Fs::rename`). Otherwise what
        // it records is named when it runs, so it must come before any rename.
        let named = {
            let w = h.write_state()?;
            !w.rdwr
                && w.outside.is_empty()
                && !w.closers_untracked
                && (w.at_close.is_some() || !(w.dirty || w.wrote || w.created))
        };
        let key = (h.node.dev, h.node.ino);
        self.table.owe_now(key, &h.identity.key, named);
        Some(Owed {
            key,
            bytes: self.close_bytes(&h, None),
            named,
        })
    }

    /// What the `WRITE` entry of a handle's close or release takes at most: its names
    /// (`rels`, or the name it was last known by), its agent, its intent and at most
    /// [`crate::ledger::ranges::MAX_RANGES`] line ranges.
    fn close_bytes(&self, h: &FileHandle, rels: Option<&[PathBuf]>) -> u64 {
        let last;
        let names = match rels {
            Some(r) if !r.is_empty() => r,
            _ => {
                last = h
                    .write_state()
                    .map(|w| w.last_rel.clone())
                    .unwrap_or_default();
                std::slice::from_ref(&last)
            }
        };
        Fs::entry_bytes(names.iter().map(PathBuf::as_path), &h.identity)
            + crate::ledger::ranges::RANGES_BYTES
    }

    /// [`Fs::release`], after the entries the recorder owes (when it is on): nobody waits
    /// for a release's reply, and its work comes after the close's entry anyway.
    /// (`owed`: from [`Fs::release_owed`]; a handle without one, opened to read only, is
    /// released at once: it records nothing.)
    pub fn release_queued(self: &Arc<Self>, fh: u64, owed: Option<Owed>) -> Result<()> {
        if let (Some(rec), Some(owed)) = (self.recorder.get(), owed) {
            rec.add(owed.bytes);
            self.record_later(rec, None, owed.bytes, move |fs| {
                if let Err(e) = fs.release(fh) {
                    tracing::warn!(error = ?e, fh, "--record async: releasing a handle after its reply failed");
                }
                fs.table.settle_owed(owed.key, owed.named);
            });
            return Ok(());
        }
        self.release(fh)
    }

    /// Queue `work` on the recorder; the entry owed for `key` (marked by the caller) is
    /// settled once it has run. `bytes`: what its entries take at most
    /// ([`Fs::entry_bytes`]), counted on the recorder by the caller.
    pub(crate) fn record_later(
        self: &Arc<Self>,
        rec: &crate::fs::recorder::Recorder,
        key: Option<(u64, u64)>,
        bytes: u64,
        work: impl FnOnce(&Arc<Fs>) + Send + 'static,
    ) {
        let fs = self.clone();
        rec.queue(
            Box::new(move || {
                work(&fs);
                if let Some(k) = key {
                    fs.table.settle(k);
                }
            }),
            bytes,
        );
    }

    pub fn release(self: &Arc<Self>, fh: u64) -> Result<()> {
        if let Some(Handle::File(h)) = self.take_handle(fh) {
            // A passthrough handle's changes so far are hashed now (and afresh when the
            // file was mapped: writes through a mapped page need not move its stamp).
            // (RELEASE carries no pid: the processes searched are those that opened or
            // closed a descriptor of the handle, and their descendants.)
            let mappers = self.pt_mappers(&h, &[]);
            let mapped = !mappers.is_empty();
            // Under the file's stale lock, so that an open of it either is done (its handle
            // counted) or has not changed the file yet.
            // (Two statements: the handle's state is not held while the lock is taken, the
            // order every other path takes them in being lock, then state.)
            let may_change = h.write_state().is_some();
            let stale = may_change.then(|| self.table.stale_locks(&[(h.node.dev, h.node.ino)]));
            // A change since this handle's last entry while a newer write handle of the same
            // identity is open on the file is that handle's to record at its close (the
            // kernel may deliver this release after the agent already opened the file again
            // and truncated it: that truncation is not this handle's doing). Changes this
            // handle is known to have made are recorded all the same.
            let newer = h.writable
                && h.node
                    .open_file_handles()
                    .iter()
                    .any(|o| o.writable && !Arc::ptr_eq(o, &h) && o.identity.key == h.identity.key);
            if !newer || mapped {
                self.pt_changed(&h);
            }
            if let Some(mut w) = h.write_state().filter(|w| w.pt && (w.mapped || mapped)) {
                w.dirty = true;
                w.mapped = true;
            }
            let r = if stale.is_some() {
                self.record_write_noting_locked(&h)
            } else {
                self.record_write_noting(&h)
            };
            drop(stale);
            // With kernel passthrough a shared mapping holds the backing file, not this
            // handle: it outlives the release and keeps writing the file. Such a handle
            // stays open for the daemon (its lease, WRITES_OPEN) until the mapping goes,
            // then its last content is recorded.
            if mapped {
                tracing::info!(fh, "a passthrough write handle released while its file is mapped: it keeps its lease until unmapped");
                self.handles.lock().insert(fh, Handle::File(h.clone()));
                let fs = Arc::downgrade(self);
                std::thread::Builder::new()
                    .name("pt-mapped".into())
                    .spawn(move || crate::fs::stale::linger_while_mapped(&fs, fh, &h, mappers))?;
                return r;
            }
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
}
