//! The adapter between fuser and the core: the only file that imports fuser. Each handler
//! converts types, calls [`Fs`], and replies — always, so no request turns into `EIO`.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use crate::fs::ops::SetAttr;
use crate::fs::{sys::Stat, Caller, Entry, Fs, FsError, Op, OpenOpts};

/// The fuser-facing filesystem.
pub struct FuseFs {
    pub fs: Arc<Fs>,
    pt: Arc<Passthrough>,
}

/// How an open file's I/O goes, for the kernel's per-inode I/O mode rule: an inode with
/// passthrough files open refuses caching opens (`ETXTBSY`) and the reverse, so while one
/// kind is open the other is not used (a write open gets `FOPEN_DIRECT_IO` instead).
#[derive(Clone, Copy, PartialEq)]
enum Io {
    Passthrough,
    Cached,
    Direct,
}

#[derive(Default)]
struct PtInode {
    /// One backing id per inode, kept while the kernel knows the inode (saves two ioctls
    /// per open).
    backing: Option<Arc<fuser::BackingId>>,
    passthrough: u32,
    cached: u32,
}

/// Kernel passthrough bookkeeping.
#[derive(Default)]
struct Passthrough {
    inodes: parking_lot::Mutex<std::collections::HashMap<u64, PtInode>>,
    handles: parking_lot::Mutex<std::collections::HashMap<u64, (u64, Io)>>,
}

impl Passthrough {
    /// Answer an open of a regular file (or a create): passthrough when allowed and
    /// possible, else the daemon serves the I/O.
    fn reply_open(&self, fs: &Fs, r: ReplyOpen, ino: u64, fh: u64, o: OpenOpts) {
        let mut flags = fopen(o);
        if o.direct_io {
            r.opened(FileHandle(fh), flags);
            return;
        }
        let mut inodes = self.inodes.lock();
        let e = inodes.entry(ino).or_default();
        if o.passthrough
            && e.cached == 0
            && fs.passthrough.load(std::sync::atomic::Ordering::Relaxed)
        {
            let bid = match &e.backing {
                Some(b) => Some(b.clone()),
                None => match fs.backing_file(ino).and_then(|f| Ok(r.open_backing(&f)?)) {
                    Ok(b) => {
                        let b = Arc::new(b);
                        e.backing = Some(b.clone());
                        Some(b)
                    }
                    Err(err) => {
                        tracing::info!(
                            "kernel passthrough unavailable ({err:?}): the daemon serves reads"
                        );
                        fs.passthrough
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                        None
                    }
                },
            };
            if let Some(b) = bid {
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

    /// The I/O mode a create's handle gets (a new inode: never passthrough).
    fn created(&self, ino: u64, fh: u64) -> FopenFlags {
        let mut inodes = self.inodes.lock();
        let e = inodes.entry(ino).or_default();
        let (io, f) = if e.passthrough > 0 {
            (Io::Direct, FopenFlags::FOPEN_DIRECT_IO)
        } else {
            e.cached += 1;
            (Io::Cached, FopenFlags::empty())
        };
        drop(inodes);
        self.handles.lock().insert(fh, (ino, io));
        f
    }

    fn release(&self, fh: u64) {
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
    fn forget(&self, fs: &Fs, ino: u64) {
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

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs((-sec) as u64)
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// A backing `stat` as FUSE attributes, under node id `ino`.
fn attr(ino: u64, st: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind: kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// A negative entry: node id 0 tells the kernel the name does not exist (for the TTL).
fn negative() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn entry(fs: &Fs, reply: ReplyEntry, r: Result<Entry, FsError>) {
    match r {
        Ok(e) => reply.entry(&fs.ttl(), &attr(e.nodeid, &e.st), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn fopen(o: OpenOpts) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    if o.noflush {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    f
}

fn timespec(t: Option<TimeOrNow>) -> crate::fs::sys::TimeSpec {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => Some(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => (-(e.duration().as_secs() as i64), 0),
        }),
    })
}

/// A reply that can carry an error (every reply type the governed operations use).
trait ErrReply: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! err_reply {
    ($($t:ty),*) => { $(impl ErrReply for $t { fn fail(self, e: Errno) { self.error(e) } })* };
}
err_reply!(ReplyEntry, ReplyEmpty, ReplyAttr, ReplyOpen, ReplyCreate);

/// Run a governed operation. When it needs a human, the reply is parked (no worker thread
/// waits) and the operation re-runs once the decision grants it; a later question in the
/// same operation (the second name of a rename) is asked the same way.
fn governed<T, R, Op, Ok>(fs: Arc<Fs>, reply: R, op: Op, ok: Ok)
where
    R: ErrReply,
    Op: Fn(&Fs) -> Result<T, FsError> + Send + 'static,
    Ok: FnOnce(R, T) + Send + 'static,
{
    drive(fs, reply, op, ok, 0)
}

fn drive<T, R, Op, Ok>(fs: Arc<Fs>, reply: R, op: Op, ok: Ok, depth: u32)
where
    R: ErrReply,
    Op: Fn(&Fs) -> Result<T, FsError> + Send + 'static,
    Ok: FnOnce(R, T) + Send + 'static,
{
    match op(&fs) {
        Ok(v) => ok(reply, v),
        Err(FsError::Ask(spec)) if depth < 4 => {
            let fs2 = fs.clone();
            fs.park(
                *spec,
                Box::new(move |res| match res {
                    None => drive(fs2, reply, op, ok, depth + 1),
                    Some(e) => reply.fail(errno(e)),
                }),
            );
        }
        Err(e) => reply.fail(errno(e)),
    }
}

/// Entry replies of governed operations: the TTL is taken when the reply is sent.
fn reply_entry(fs: &Arc<Fs>) -> impl FnOnce(ReplyEntry, Entry) + Send + 'static {
    let fs = fs.clone();
    move |reply, e| entry(&fs, reply, Ok(e))
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // O_TRUNC arrives with open instead of a separate setattr, so the truncation is
        // authorized together with the open.
        // READDIRPLUS_AUTO: a listing carries every entry's attributes, so a walk (`find`,
        // `git status`, `rg`) does not pay one lookup round trip per entry.
        let wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            // The filesystem drops set-user-ID/set-group-ID on writes (see
            // `Fs::kill_suidgid`): the kernel then stops asking for security.capability
            // before every write (one round trip per write).
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let _ = config.add_capabilities(wanted & config.capabilities());
        let _ = config.set_max_write(MAX_IO);
        // Kernel passthrough for read-only opens (FUSE_PASSTHROUGH needs a backing stack
        // depth of at least 1). Opt-in (INTENTFS_PASSTHROUGH=1): kernel 6.18 answers EIO to
        // a non-passthrough (write) open of an inode while a passthrough reader holds it
        // open, even with FOPEN_DIRECT_IO, and writes must stay daemon-handled.
        if config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && std::env::var_os("INTENTFS_PASSTHROUGH").is_some_and(|v| v == "1")
            && config.set_max_stack_depth(1).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            self.fs
                .passthrough
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        tracing::info!("filesystem unmounted");
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.fs.counters.requests.count(Op::Lookup);
        match self.fs.lookup(parent.0, name) {
            // A name that does not exist is cached too (node id 0 with a TTL): compilers,
            // `git`, `rg` and interpreters probe many (`.gitignore` in every directory,
            // include and import paths). Creations through the mount replace the negative
            // entry; creations outside it are reported like every other change.
            Err(FsError::Os(libc::ENOENT)) if self.fs.caches_listings() => {
                reply.entry(&self.fs.ttl(), &negative(), Generation(0))
            }
            r => entry(&self.fs, reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.counters.requests.count(Op::Forget);
        self.fs.forget(ino.0, nlookup);
        self.pt.forget(&self.fs, ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.fs.counters.requests.count(Op::Getattr);
        match self.fs.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(st) => reply.attr(&self.fs.ttl(), &attr(self.fs.st_ino(ino.0, &st), &st)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.fs.counters.requests.count(Op::Setattr);
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: timespec(atime),
            mtime: timespec(mtime),
        };
        let (c, fh, ino) = (caller(req), fh.map(|f| f.0), ino.0);
        let fs2 = self.fs.clone();
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.setattr(&c, ino, a.clone(), fh),
            move |r, st| r.attr(&fs2.ttl(), &attr(fs2.st_ino(ino, &st), &st)),
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.fs.counters.requests.count(Op::Readlink);
        match self.fs.readlink(ino.0) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.fs.counters.requests.count(Op::Mknod);
        let (c, name) = (caller(req), name.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.mknod(&c, parent.0, &name, mode, umask, rdev),
            reply_entry(&self.fs),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.fs.counters.requests.count(Op::Mkdir);
        let (c, name) = (caller(req), name.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.mkdir(&c, parent.0, &name, mode, umask),
            reply_entry(&self.fs),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs.counters.requests.count(Op::Unlink);
        let (c, name) = (caller(req), name.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.unlink(&c, parent.0, &name, false),
            |r, ()| r.ok(),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs.counters.requests.count(Op::Rmdir);
        let (c, name) = (caller(req), name.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.unlink(&c, parent.0, &name, true),
            |r, ()| r.ok(),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.fs.counters.requests.count(Op::Symlink);
        let (c, name, target) = (caller(req), link_name.to_os_string(), target.to_path_buf());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.symlink(&c, parent.0, &name, &target),
            reply_entry(&self.fs),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Rename);
        let (c, name, newname, flags) = (
            caller(req),
            name.to_os_string(),
            newname.to_os_string(),
            flags.bits(),
        );
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.rename(&c, parent.0, &name, newparent.0, &newname, flags),
            |r, ()| r.ok(),
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.fs.counters.requests.count(Op::Link);
        let (c, newname) = (caller(req), newname.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.link(&c, ino.0, newparent.0, &newname),
            reply_entry(&self.fs),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.fs.counters.requests.count(Op::Open);
        let c = caller(req);
        let (fs2, pt) = (self.fs.clone(), self.pt.clone());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.open(&c, ino.0, flags.0),
            move |r, (fh, o)| pt.reply_open(&fs2, r, ino.0, fh, o),
        );
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.fs.counters.requests.count(Op::Read);
        match self.fs.read(&caller(req), fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.fs.counters.requests.count(Op::Write);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.fs.write(&caller(req), fh.0, offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Flush);
        empty(reply, self.fs.flush(&caller(req), fh.0));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Release);
        self.pt.release(fh.0);
        empty(reply, self.fs.release(fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Fsync);
        empty(reply, self.fs.fsync(fh.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.fs.counters.requests.count(Op::Opendir);
        // With every change outside the mount reported, the kernel may keep listings:
        // ENOSYS makes it stop sending OPENDIR/RELEASEDIR for good and cache what READDIR
        // returns (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR); a listing request then comes with
        // fh 0 (`Fs::readdir` reads from the offset). A walk costs the two requests that
        // fill a directory's cache instead of four per open, and nothing once cached.
        if self.fs.caches_listings() {
            reply.error(Errno::ENOSYS);
            return;
        }
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.fs.counters.requests.count(Op::Readdir);
        let r = self
            .fs
            .readdir(ino.0, fh.0, offset as i64, |i, off, t, name| {
                reply.add(INodeNo(i), off as u64, dtype(t), name)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.fs.counters.requests.count(Op::Readdirplus);
        let ttl = self.fs.ttl();
        let r = self
            .fs
            .readdirplus(ino.0, fh.0, offset as i64, |e, off, name| {
                reply.add(
                    INodeNo(e.nodeid),
                    off as u64,
                    name,
                    &ttl,
                    &attr(e.nodeid, &e.st),
                    Generation(0),
                )
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Releasedir);
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Fsyncdir);
        reply.ok();
    }

    /// No ioctl reaches the backing files (`FS_IOC_SETFLAGS` could set the immutable or
    /// append-only flag behind the policy's back). Answered here rather than by fuser's
    /// default, which logs a warning for each one: every `isatty()` on a file (Python's
    /// `open`, for one) sends `TCGETS`.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.fs.counters.requests.count(Op::Ioctl);
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.fs.counters.requests.count(Op::Statfs);
        match self.fs.statfs(ino.0) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Setxattr);
        let (c, name, value) = (caller(req), name.to_os_string(), value.to_vec());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.setxattr(&c, ino.0, &name, &value, flags),
            |r, ()| r.ok(),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.fs.counters.requests.count(Op::Getxattr);
        match self.fs.getxattr(ino.0, name, size) {
            Ok(d) if size == 0 => reply.size(d.len() as u32),
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.fs.counters.requests.count(Op::Listxattr);
        match self.fs.listxattr(ino.0, size) {
            Ok(d) if size == 0 => reply.size(d.len() as u32),
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.fs.counters.requests.count(Op::Removexattr);
        let (c, name) = (caller(req), name.to_os_string());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.removexattr(&c, ino.0, &name),
            |r, ()| r.ok(),
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.fs.counters.requests.count(Op::Access);
        empty(reply, self.fs.access(ino.0, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.fs.counters.requests.count(Op::Create);
        let (c, name) = (caller(req), name.to_os_string());
        let (fs2, pt) = (self.fs.clone(), self.pt.clone());
        governed(
            self.fs.clone(),
            reply,
            move |fs| fs.create(&c, parent.0, &name, mode, umask, flags),
            move |r, (e, fh, o)| {
                let io = pt.created(e.nodeid, fh);
                r.created(
                    &fs2.ttl(),
                    &attr(e.nodeid, &e.st),
                    Generation(0),
                    FileHandle(fh),
                    fopen(o) | io,
                )
            },
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.fs.counters.requests.count(Op::Fallocate);
        empty(reply, self.fs.fallocate(fh.0, offset, length, mode));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.fs.counters.requests.count(Op::Lseek);
        match self.fs.lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.fs.counters.requests.count(Op::CopyFileRange);
        match self.fs.copy_file_range(
            fh_in.0,
            offset_in,
            fh_out.0,
            offset_out,
            len,
            flags.bits() as u32,
        ) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// Invalidations through the session's notifier (errors mean "not cached": ignored).
struct Inval(fuser::Notifier);

impl crate::fs::watch::Invalidate for Inval {
    fn inval_entry(&self, parent: u64, name: &OsStr) {
        let _ = self.0.inval_entry(INodeNo(parent), name);
    }
    fn inval_inode(&self, nodeid: u64) {
        let _ = self.0.inval_inode(INodeNo(nodeid), 0, 0);
    }
}

/// Mount options and session settings for a governed mount.
pub struct MountSpec {
    pub allow_other: bool,
    pub threads: usize,
    pub fsname: String,
}

/// A live, handshaken FUSE session: the mount exists once this returns.
/// Reads and writes of up to 1 MiB per request (`set_max_write`).
const MAX_IO: u32 = 1024 * 1024;

/// The kernel reads ahead 128 KiB on a FUSE mount (the most it offers at INIT): one READ
/// round trip per 128 KiB of a sequential read. Its backing device's `read_ahead_kb`
/// (sysfs, writable by root) raises that to what one request may carry. Best effort: the
/// device is found in /proc/self/mountinfo (a `stat` of the mountpoint would ask this
/// very filesystem, not serving yet).
fn raise_readahead(mountpoint: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let want = mountpoint.to_string_lossy();
    // id parent major:minor root mountpoint ... (the last mount there is ours)
    let dev = info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && f[4] == want).then(|| f[2].to_string())
    });
    if let Some(dev) = dev {
        let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
        if let Err(e) = std::fs::write(&path, format!("{}\n", MAX_IO / 1024)) {
            tracing::debug!("{path}: {e} (sequential reads use the kernel's 128 KiB)");
        }
    }
}

pub struct Mounted {
    session: fuser::Session<FuseFs>,
}

/// Something that unmounts the session from another thread (signal handling).
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    pub fn unmount(&mut self) -> std::io::Result<()> {
        self.0.unmount()
    }
}

impl Mounted {
    pub fn new(fs: Arc<Fs>, mountpoint: &Path, spec: &MountSpec) -> std::io::Result<Mounted> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName(spec.fsname.clone()),
            fuser::MountOption::Subtype("intentfs".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
        ];
        if spec.allow_other {
            cfg.acl = fuser::SessionACL::All;
        }
        cfg.n_threads = Some(spec.threads.max(1));
        cfg.clone_fd = true;
        crate::fs::watch::Watcher::install(&fs);
        let ffs = FuseFs {
            fs: fs.clone(),
            pt: Arc::default(),
        };
        let session = fuser::Session::new(ffs, mountpoint, &cfg)?;
        crate::fs::watch::Watcher::start(&fs, Box::new(Inval(session.notifier())));
        raise_readahead(mountpoint);
        Ok(Mounted { session })
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.session.unmount_callable())
    }

    /// Serve requests until unmounted.
    pub fn run(self) -> std::io::Result<()> {
        self.session.run()
    }
}
