//! The adapter between fuser and the core: the only module that imports fuser. Each handler
//! converts types and goes through one path ([`FuseFs::answer`], or [`FuseFs::governed`]
//! when a human may be asked): the opcode is counted, [`Fs`] runs, a failure is logged by
//! its kind (`reply::Failure`) and every request is answered, so none turns into `EIO`.

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

mod convert;
mod passthrough;
mod reply;
#[cfg(test)]
mod tests;

use convert::*;
use passthrough::Passthrough;
use reply::*;

/// The fuser-facing filesystem.
pub struct FuseFs {
    pub fs: Arc<Fs>,
    pt: Arc<Passthrough>,
    /// Ask INIT for FUSE-over-io_uring (`--transport io-uring` or `auto`).
    uring: bool,
    /// How regular files' reads and writes travel (`--data`).
    data: Data,
}

impl FuseFs {
    /// The path of every request: count its opcode (before running it, so a status read
    /// counts itself), run it against the core, answer ([`respond`]).
    fn answer<T, R: Reply>(
        &self,
        op: Op,
        reply: R,
        run: impl FnOnce(&Fs) -> Result<T, FsError>,
        ok: impl FnOnce(R, T),
    ) {
        self.fs.counters.requests.count(op);
        respond(op, reply, run(&self.fs), ok);
    }

    /// [`FuseFs::answer`] for an operation governance may need a human for. When it does,
    /// the reply is parked (no worker thread waits) and the operation re-runs once the
    /// decision grants it; a later question in the same operation (the second name of a
    /// rename) is asked the same way.
    fn governed<T, R, Run, Ok>(&self, op: Op, reply: R, run: Run, ok: Ok)
    where
        R: Reply,
        Run: Fn(&Fs) -> Result<T, FsError> + Send + 'static,
        Ok: FnOnce(R, T) + Send + 'static,
    {
        self.fs.counters.requests.count(op);
        self.fs.drive(run, move |r| respond(op, reply, r, ok));
    }

    /// An entry reply, the TTL taken when it is sent (a governed one may be sent later).
    fn entry(&self) -> impl FnOnce(ReplyEntry, Entry) + Send + 'static {
        let fs = self.fs.clone();
        move |reply, e| reply.entry(&fs.ttl(), &attr(e.nodeid, &e.st), Generation(0))
    }

    /// Attributes of node `ino` as a reply (`st_ino` as the core reports it).
    fn attr(&self) -> impl FnOnce(ReplyAttr, (u64, Stat)) + Send + 'static {
        let fs = self.fs.clone();
        move |reply, (ino, st)| reply.attr(&fs.ttl(), &attr(fs.st_ino(ino, &st), &st))
    }

    /// READDIR and READDIRPLUS: one handler over the two reply types.
    fn list<L: Listing>(&self, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: L) {
        self.fs.counters.requests.count(L::OP);
        let r = reply.fill(&self.fs, ino.0, fh.0, offset as i64);
        respond(L::OP, reply, r, |r, ()| r.done());
    }
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
        // Offered only when the `fuse` module's `enable_uring` is set; the rings are
        // registered once INIT is answered (`Mounted::new`).
        if self.uring
            && config
                .capabilities()
                .contains(InitFlags::FUSE_OVER_IO_URING)
        {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        let _ = config.set_max_write(MAX_IO);
        // Kernel passthrough (FUSE_PASSTHROUGH needs a backing stack depth of at least 1).
        // `--data passthrough`: every regular file's reads and writes (and mmap) go to the
        // backing file in the kernel; the daemon decides at open and records at close.
        // INTENTFS_PASSTHROUGH=1 (a measurement aid): read-only opens only (kernel 6.18
        // answers EIO to a non-passthrough open of an inode a passthrough reader holds
        // open, even with FOPEN_DIRECT_IO).
        let reads_only = std::env::var_os("INTENTFS_PASSTHROUGH").is_some_and(|v| v == "1");
        let wanted = self.data == Data::Passthrough || reads_only;
        if wanted
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.set_max_stack_depth(1).is_ok()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            use std::sync::atomic::Ordering::Relaxed;
            self.fs.passthrough.store(true, Relaxed);
            if self.data == Data::Passthrough {
                self.fs.data_passthrough.store(true, Relaxed);
            }
        } else if self.data == Data::Passthrough {
            tracing::warn!(
                "--data passthrough: the kernel does not offer FUSE passthrough \
                 (CONFIG_FUSE_PASSTHROUGH, Linux 6.9+); reads and writes go through the daemon"
            );
        }
        tracing::info!("data: {}", self.fs.data_mode());
        Ok(())
    }

    fn destroy(&mut self) {
        tracing::info!("filesystem unmounted");
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.entry();
        self.answer(
            Op::Lookup,
            reply,
            |fs| match fs.lookup(parent.0, name) {
                // A name that does not exist is cached too (node id 0 with a TTL):
                // compilers, `git`, `rg` and interpreters probe many (`.gitignore` in
                // every directory, include and import paths). Creations through the mount
                // replace the negative entry; creations outside it are reported like every
                // other change.
                Err(FsError::Os(libc::ENOENT)) if fs.caches_listings() => Ok(None),
                r => r.map(Some),
            },
            |r, e| match e {
                Some(e) => found(r, e),
                None => r.entry(&self.fs.ttl(), &negative(), Generation(0)),
            },
        );
    }

    /// FORGET has no reply: only counted.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.counters.requests.count(Op::Forget);
        self.fs.forget(ino.0, nlookup);
        self.pt.forget(&self.fs, ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.answer(
            Op::Getattr,
            reply,
            |fs| fs.getattr(ino.0, fh.map(|f| f.0)).map(|st| (ino.0, st)),
            self.attr(),
        );
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
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: timespec(atime),
            mtime: timespec(mtime),
        };
        let (c, fh, ino) = (caller(req), fh.map(|f| f.0), ino.0);
        self.governed(
            Op::Setattr,
            reply,
            move |fs| fs.setattr(&c, ino, a.clone(), fh).map(|st| (ino, st)),
            self.attr(),
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.answer(
            Op::Readlink,
            reply,
            |fs| fs.readlink(ino.0),
            |r, d| r.data(&d),
        );
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
        let (c, name) = (caller(req), name.to_os_string());
        self.governed(
            Op::Mknod,
            reply,
            move |fs| fs.mknod(&c, parent.0, &name, mode, umask, rdev),
            self.entry(),
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
        let (c, name) = (caller(req), name.to_os_string());
        self.governed(
            Op::Mkdir,
            reply,
            move |fs| fs.mkdir(&c, parent.0, &name, mode, umask),
            self.entry(),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (caller(req), name.to_os_string());
        self.governed(
            Op::Unlink,
            reply,
            move |fs| fs.unlink(&c, parent.0, &name, false),
            |r, ()| r.ok(),
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (caller(req), name.to_os_string());
        self.governed(
            Op::Rmdir,
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
        let (c, name, target) = (caller(req), link_name.to_os_string(), target.to_path_buf());
        self.governed(
            Op::Symlink,
            reply,
            move |fs| fs.symlink(&c, parent.0, &name, &target),
            self.entry(),
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
        let (c, name, newname, flags) = (
            caller(req),
            name.to_os_string(),
            newname.to_os_string(),
            flags.bits(),
        );
        self.governed(
            Op::Rename,
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
        let (c, newname) = (caller(req), newname.to_os_string());
        self.governed(
            Op::Link,
            reply,
            move |fs| fs.link(&c, ino.0, newparent.0, &newname),
            self.entry(),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = caller(req);
        let (fs2, pt) = (self.fs.clone(), self.pt.clone());
        self.governed(
            Op::Open,
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
        if self.fs.ctl_handle(fh.0).is_some() {
            // A control file: reading `.intentfs/approval` after a request was written to it
            // stops to ask a human (parked, like any operation that asks). A read, not the
            // write: the kernel holds the file's inode lock during a write, so a parked
            // write would hold every other identity's request to the same file.
            let (caller, fh) = (caller(req), fh.0);
            return self.governed(
                Op::Read,
                reply,
                move |fs| fs.read(&caller, fh, offset, size),
                |r, d| r.data(&d),
            );
        }
        self.answer(
            Op::Read,
            reply,
            |fs| fs.read(&caller(req), fh.0, offset, size),
            |r, d| r.data(&d),
        );
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
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        self.answer(
            Op::Write,
            reply,
            |fs| fs.write(&caller(req), fh.0, offset, data, kill),
            |r, n| r.written(n as u32),
        );
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.answer(
            Op::Flush,
            reply,
            |_| self.fs.flush(&caller(req), fh.0),
            |r, ()| r.ok(),
        );
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
        self.answer(
            Op::Release,
            reply,
            |_| {
                // (`--record async`: the file is marked first, so that its next change,
                // which may already be on its way to another thread, waits for this.)
                let owed = self.fs.release_owed(fh.0);
                self.pt.release(fh.0);
                // (The Arc: a handle whose file stays mapped lingers on a thread.)
                self.fs.release_queued(fh.0, owed)
            },
            |r, ()| r.ok(),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.answer(
            Op::Fsync,
            reply,
            |fs| fs.fsync(fh.0, datasync),
            |r, ()| r.ok(),
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.answer(
            Op::Opendir,
            reply,
            |fs| {
                // With every change outside the mount reported, the kernel may keep
                // listings: ENOSYS makes it stop sending OPENDIR/RELEASEDIR for good and
                // cache what READDIR returns (FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR); a
                // listing request then comes with fh 0 (`Fs::readdir` reads from the
                // offset). A walk costs the two requests that fill a directory's cache
                // instead of four per open, and nothing once cached.
                if fs.caches_listings() {
                    return Err(FsError::Os(libc::ENOSYS));
                }
                fs.opendir(ino.0)
            },
            |r, fh| r.opened(FileHandle(fh), FopenFlags::empty()),
        );
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.list(ino, fh, offset, reply);
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.list(ino, fh, offset, reply);
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.answer(
            Op::Releasedir,
            reply,
            |fs| {
                fs.releasedir(fh.0);
                Ok(())
            },
            |r, ()| r.ok(),
        );
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.answer(Op::Fsyncdir, reply, |_| Ok(()), |r, ()| r.ok());
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
        self.answer(
            Op::Ioctl,
            reply,
            |_| Err::<(), _>(FsError::Os(libc::ENOTTY)),
            |_, ()| {},
        );
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.answer(
            Op::Statfs,
            reply,
            |fs| fs.statfs(ino.0),
            |r, s| {
                r.statfs(
                    s.f_blocks,
                    s.f_bfree,
                    s.f_bavail,
                    s.f_files,
                    s.f_ffree,
                    s.f_bsize as u32,
                    s.f_namemax as u32,
                    s.f_frsize as u32,
                )
            },
        );
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
        let (c, name, value) = (caller(req), name.to_os_string(), value.to_vec());
        self.governed(
            Op::Setxattr,
            reply,
            move |fs| fs.setxattr(&c, ino.0, &name, &value, flags),
            |r, ()| r.ok(),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.answer(
            Op::Getxattr,
            reply,
            |fs| fs.getxattr(ino.0, name, size),
            |r, d| xattr(r, size, &d),
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.answer(
            Op::Listxattr,
            reply,
            |fs| fs.listxattr(ino.0, size),
            |r, d| xattr(r, size, &d),
        );
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, name) = (caller(req), name.to_os_string());
        self.governed(
            Op::Removexattr,
            reply,
            move |fs| fs.removexattr(&c, ino.0, &name),
            |r, ()| r.ok(),
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.answer(
            Op::Access,
            reply,
            |fs| fs.access(ino.0, mask.bits()),
            |r, ()| r.ok(),
        );
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
        let (c, name) = (caller(req), name.to_os_string());
        let (fs2, pt) = (self.fs.clone(), self.pt.clone());
        self.governed(
            Op::Create,
            reply,
            move |fs| fs.create(&c, parent.0, &name, mode, umask, flags),
            move |r, (e, fh, o)| pt.reply_create(&fs2, r, &e, fh, o),
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
        self.answer(
            Op::Fallocate,
            reply,
            |fs| fs.fallocate(fh.0, offset, length, mode),
            |r, ()| r.ok(),
        );
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
        self.answer(
            Op::Lseek,
            reply,
            |fs| fs.lseek(fh.0, offset, whence),
            |r, o| r.offset(o),
        );
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
        self.answer(
            Op::CopyFileRange,
            reply,
            |fs| {
                fs.copy_file_range(
                    fh_in.0,
                    offset_in,
                    fh_out.0,
                    offset_out,
                    len,
                    flags.bits() as u32,
                )
            },
            |r, n| r.written(n as u32),
        );
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

/// How requests travel between the kernel and the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// `read`/`writev` on /dev/fuse: two system calls and a thread wake-up per request.
    /// (`dev` for short.)
    #[value(alias = "dev")]
    DevFuse,
    /// FUSE-over-io_uring (Linux 6.14+, `enable_uring`): a request arrives as an io_uring
    /// completion in a per-CPU queue, its reply goes back with the fetch of the next one.
    /// The mount fails when the kernel does not offer it.
    IoUring,
    /// io-uring when the kernel offers it and the rings register, else dev-fuse.
    Auto,
}

/// Ring entries per kernel queue (one queue per CPU): the requests a queue can hold at
/// once, including those parked on an approval (a parked request keeps its entry until it
/// is decided: FUSE answers in the entry the request came in). With 32, up to 30 requests
/// from one CPU can wait for a human while the queue's threads still have an entry each;
/// beyond 32 the kernel holds that CPU's further requests until a decision (or the
/// approval timeout) frees one. Each entry has a 1 MiB payload buffer, resident only in
/// the pages requests and replies have used: the kernel hands out the most recently freed
/// entry first, so idle entries stay untouched (32 MiB of address space per CPU).
const RING_ENTRIES: usize = 32;

/// Threads serving each kernel queue: a primary and a standby. One thread alone would
/// serve its CPU's requests one at a time: a slow one (hashing a large file at close, an
/// fsync) would hold up every later request from that CPU. The standby serves the queue
/// while the primary has been stuck in one request for a millisecond or more, and costs
/// next to nothing otherwise (it does not wait on the ring, where every completion would
/// wake it: see `crates/fuser/src/ring.rs`). More standbys only help when several slow
/// requests from one CPU overlap.
const RING_THREADS: usize = 2;

/// Threads and entries per ring queue: [`RING_THREADS`] and [`RING_ENTRIES`], or
/// `INTENTFS_RING=THREADSxENTRIES` (a measurement aid: `1x8` is the transport as it was
/// first written, one thread and 8 entries per queue).
fn ring_shape() -> (usize, usize) {
    let parsed = std::env::var("INTENTFS_RING").ok().and_then(|v| {
        let (t, e) = v.split_once('x')?;
        Some((t.parse::<usize>().ok()?, e.parse::<usize>().ok()?))
    });
    match parsed {
        Some((t, e)) if t >= 1 && e >= t => (t, e),
        _ => (RING_THREADS, RING_ENTRIES),
    }
}

/// How regular files' reads and writes travel (`--data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Data {
    /// Every read and write is a request the daemon serves and checks (each write is
    /// judged against other identities' writes; the content is hashed as it is written).
    Daemon,
    /// Kernel passthrough (Linux 6.9+, CONFIG_FUSE_PASSTHROUGH): the kernel reads and
    /// writes the backing file itself. Scope, approvals and staleness are decided at open;
    /// another identity's write open is refused while one holds the file open for writing
    /// (WRITE_LEASED); the content is hashed at close. Falls back to `daemon` when the
    /// kernel does not offer it.
    Passthrough,
}

/// Mount options and session settings for a governed mount.
pub struct MountSpec {
    pub allow_other: bool,
    pub threads: usize,
    pub transport: Transport,
    pub data: Data,
    pub fsname: String,
}

/// A live, handshaken FUSE session: the mount exists once this returns.
/// Reads and writes of up to 1 MiB per request (`set_max_write`).
const MAX_IO: u32 = 1024 * 1024;

/// The mount's device as `/proc/self/mountinfo` says it (`major:minor`): a `stat` of the
/// mountpoint would ask this very filesystem, not serving yet. The last mount there is
/// ours.
fn mount_device(mountpoint: &Path) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    // id parent major:minor root mountpoint ... The kernel writes a space, tab, newline or
    // backslash in the mountpoint as `\ooo`.
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() <= 4 || crate::guard::tracking::unescape_mountinfo(f[4]) != want {
            return None;
        }
        let (ma, mi) = f[2].split_once(':')?;
        Some((ma.parse().ok()?, mi.parse().ok()?))
    })
}

/// The kernel reads ahead 128 KiB on a FUSE mount (the most it offers at INIT): one READ
/// round trip per 128 KiB of a sequential read. Its backing device's `read_ahead_kb`
/// (sysfs, writable by root) raises that to what one request may carry. Best effort.
fn raise_readahead((major, minor): (u32, u32)) {
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, format!("{}\n", MAX_IO / 1024)) {
        tracing::debug!("{path}: {e} (sequential reads use the kernel's 128 KiB)");
    }
}

/// Registers the io_uring queues when the transport asks for them, and says in the log
/// which transport serves the mount. The /dev/fuse threads run in every case: the kernel
/// sends FORGET and INTERRUPT there, and everything while the ring is not complete.
fn start_transport(
    fs: &Fs,
    session: &mut fuser::Session<FuseFs>,
    t: Transport,
) -> std::io::Result<()> {
    // What `.intentfs/status` says (`mount.transport`), as the log does.
    let say = |what: String| {
        tracing::info!("transport: {what}");
        let _ = fs.transport.set(what);
    };
    if t == Transport::DevFuse {
        say("/dev/fuse".into());
        return Ok(());
    }
    let why = if session.uring_negotiated() {
        let (threads, entries) = ring_shape();
        match session.start_uring(entries, threads) {
            Ok(queues) => {
                say(format!(
                    "io-uring ({queues} queues x {entries} entries, {threads} threads each; FORGET and INTERRUPT over /dev/fuse)"
                ));
                return Ok(());
            }
            Err(e) => format!("registering the rings failed: {e}"),
        }
    } else {
        "the kernel did not offer FUSE_OVER_IO_URING (Linux 6.14+ with \
         /sys/module/fuse/parameters/enable_uring set to Y)"
            .to_string()
    };
    if t == Transport::IoUring {
        return Err(std::io::Error::other(format!(
            "--transport io-uring: {why}"
        )));
    }
    say(format!("/dev/fuse (io-uring unavailable: {why})"));
    Ok(())
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
            uring: spec.transport != Transport::DevFuse,
            data: spec.data,
        };
        let mut session = fuser::Session::new(ffs, mountpoint, &cfg)?;
        start_transport(&fs, &mut session, spec.transport)?;
        crate::fs::watch::Watcher::start(&fs, Box::new(Inval(session.notifier())));
        if let Some(dev) = mount_device(mountpoint) {
            raise_readahead(dev);
            fs.set_mount_dev(libc::makedev(dev.0, dev.1));
        }
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
