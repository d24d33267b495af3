//! Kernel passthrough bookkeeping: which inodes have passthrough files open, and their
//! backing ids (the kernel's per-inode I/O mode rule).

use super::*;

/// How an open file's I/O goes, for the kernel's per-inode I/O mode rule: an inode with
/// passthrough files open refuses caching opens (`ETXTBSY`) and the reverse, so while one
/// kind is open the other is not used (a write open gets `FOPEN_DIRECT_IO` instead).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Io {
    Passthrough,
    Cached,
    Direct,
}

#[derive(Default)]
pub(super) struct PtInode {
    /// One backing id per inode, kept while the kernel knows the inode (saves two ioctls
    /// per open).
    backing: Option<Arc<fuser::BackingId>>,
    passthrough: u32,
    cached: u32,
}

/// Kernel passthrough bookkeeping.
#[derive(Default)]
pub(super) struct Passthrough {
    inodes: parking_lot::Mutex<std::collections::HashMap<u64, PtInode>>,
    handles: parking_lot::Mutex<std::collections::HashMap<u64, (u64, Io)>>,
}

impl Passthrough {
    /// Answer an open of a regular file (or a create): passthrough when allowed and
    /// possible, else the daemon serves the I/O.
    pub(super) fn reply_open(&self, fs: &Fs, r: ReplyOpen, ino: u64, fh: u64, o: OpenOpts) {
        let mut flags = fopen(o);
        if o.direct_io {
            r.opened(FileHandle(fh), flags);
            return;
        }
        let mut inodes = self.inodes.lock();
        let e = inodes.entry(ino).or_default();
        if o.passthrough {
            if let Some(b) = self.backing(fs, e, ino, |f| r.open_backing(f)) {
                e.passthrough += 1;
                drop(inodes);
                self.handles.lock().insert(fh, (ino, Io::Passthrough));
                flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
                r.opened_passthrough(FileHandle(fh), flags, &b);
                return;
            }
        }
        let io = if e.passthrough > 0 {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
            flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
            Io::Direct
        } else {
            e.cached += 1;
            Io::Cached
        };
        drop(inodes);
        self.handles.lock().insert(fh, (ino, io));
        r.opened(FileHandle(fh), flags);
    }

    /// The backing id of `ino` for a passthrough open, registered on first use; None when
    /// the inode has caching opens (the kernel's I/O mode rule) or passthrough failed
    /// (then the daemon serves I/O from now on).
    fn backing(
        &self,
        fs: &Fs,
        e: &mut PtInode,
        ino: u64,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<fuser::BackingId>,
    ) -> Option<Arc<fuser::BackingId>> {
        if e.cached > 0 || !fs.passthrough.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        if let Some(b) = &e.backing {
            return Some(b.clone());
        }
        match fs.backing_file(ino).and_then(|f| Ok(register(&f)?)) {
            Ok(b) => {
                let b = Arc::new(b);
                e.backing = Some(b.clone());
                Some(b)
            }
            Err(err) => {
                tracing::warn!("kernel passthrough unavailable ({err:?}): the daemon serves I/O");
                fs.passthrough
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                fs.data_passthrough
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                None
            }
        }
    }

    /// Answer a create: passthrough when the handle's data may bypass the daemon
    /// (`--data passthrough`), else the daemon serves its I/O.
    pub(super) fn reply_create(&self, fs: &Fs, r: ReplyCreate, e: &Entry, fh: u64, o: OpenOpts) {
        let ttl = fs.ttl();
        let at = attr(e.nodeid, &e.st);
        let mut flags = fopen(o);
        let mut inodes = self.inodes.lock();
        let pe = inodes.entry(e.nodeid).or_default();
        if o.passthrough {
            if let Some(b) = self.backing(fs, pe, e.nodeid, |f| r.open_backing(f)) {
                pe.passthrough += 1;
                drop(inodes);
                self.handles.lock().insert(fh, (e.nodeid, Io::Passthrough));
                flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
                r.created_passthrough(&ttl, &at, Generation(0), FileHandle(fh), flags, &b);
                return;
            }
        }
        let io = if pe.passthrough > 0 || o.direct_io {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
            Io::Direct
        } else {
            pe.cached += 1;
            Io::Cached
        };
        drop(inodes);
        self.handles.lock().insert(fh, (e.nodeid, io));
        r.created(&ttl, &at, Generation(0), FileHandle(fh), flags)
    }

    pub(super) fn release(&self, fh: u64) {
        let Some((ino, io)) = self.handles.lock().remove(&fh) else {
            return;
        };
        if let Some(e) = self.inodes.lock().get_mut(&ino) {
            match io {
                Io::Passthrough => e.passthrough = e.passthrough.saturating_sub(1),
                Io::Cached => e.cached = e.cached.saturating_sub(1),
                Io::Direct => {}
            }
        }
    }

    /// The kernel forgot a node: its backing id goes unless files are still open.
    pub(super) fn forget(&self, fs: &Fs, ino: u64) {
        if fs.table.get(ino).is_some() {
            return;
        }
        let mut inodes = self.inodes.lock();
        if let Some(e) = inodes.get(&ino) {
            if e.passthrough == 0 && e.cached == 0 {
                inodes.remove(&ino);
            }
        }
    }
}
