//! Directories: `opendir`, one listing walk behind `readdir` and `readdirplus`.

use super::*;

impl Fs {
    pub fn opendir(&self, nodeid: u64) -> Result<u64> {
        if nodeid == control::DIR_INO {
            let h = CtlHandle::new(CtlFile::Status, Vec::new());
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
    pub(super) fn dir_stream(&self, nodeid: u64, fh: u64) -> Result<Arc<Mutex<sys::DirStream>>> {
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
    pub(super) fn control_listing(&self) -> Vec<(Entry, u8, &'static str)> {
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
            // Nor is the content store listed (see `lookup`).
            if self.store_ino() == Some(e.ino)
                && sys::stat_at(ds.fd(), name)
                    .is_ok_and(|st| self.is_store_dir(st.st_dev, st.st_ino))
            {
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
            // Counted before it is handed out (as a lookup is, see `InodeTable::lookup`),
            // and given back if it does not fit: counting after the reply let a FORGET
            // in between drop a node the kernel was about to hold.
            let node = self.table.lookup(nodeid, l.name, None, &st);
            let ent = Entry {
                nodeid: node.nodeid,
                st,
            };
            if add(&ent, l.next, l.name) {
                self.table.forget(node.nodeid, 1);
                return Ok(true);
            }
            Ok(false)
        })
    }
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
