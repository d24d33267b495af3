//! One reply path: a request's result is answered, and a failure logged by its kind.

use super::*;

/// A fuser reply that can carry an errno: every reply type a handler answers with.
pub(super) trait Reply: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! reply {
    ($($t:ty),*) => { $(impl Reply for $t { fn fail(self, e: Errno) { self.error(e) } })* };
}
reply!(
    ReplyEntry,
    ReplyEmpty,
    ReplyAttr,
    ReplyOpen,
    ReplyCreate,
    ReplyData,
    ReplyWrite,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyIoctl,
    ReplyStatfs,
    ReplyXattr,
    ReplyLseek
);

/// How much a failed request says about the daemon or its backing filesystem.
#[derive(Debug, PartialEq)]
pub(super) enum Failure {
    /// An ordinary answer to the request: the name is missing or exists, the node is of the
    /// wrong kind, permission or governance refused, the attribute is absent or larger
    /// than the buffer, the operation or ioctl is not supported, the argument is invalid.
    /// Programs probe with these all the time (`stat` before `open`, `getxattr` of
    /// `security.capability`, `isatty`): logged at `debug`. A governance refusal is
    /// explained to the agent in `.intentfs/last_error` and recorded in the ledger.
    Answer,
    /// The backing store or the daemon's resources failed: I/O error, no space or quota
    /// left, a read-only or corrupted filesystem, memory or descriptors exhausted, a
    /// network or FUSE backing gone. The caller sees the errno as it would natively, but
    /// whoever runs the mount must hear of it: `warn`.
    Trouble,
    /// Any other errno: neither expected of the request nor a known failure of the
    /// store. `info`, so an unforeseen one shows in the default log.
    Unexpected,
}

pub(super) fn failure(errno: i32) -> Failure {
    match errno {
        libc::ENOENT
        | libc::EACCES
        | libc::EPERM
        | libc::EEXIST
        | libc::ENOTEMPTY
        | libc::ENOTDIR
        | libc::EISDIR
        | libc::ELOOP
        | libc::ENAMETOOLONG
        | libc::EXDEV
        | libc::EMLINK
        | libc::EBUSY
        | libc::ETXTBSY
        | libc::EINVAL
        | libc::ENODATA
        | libc::ERANGE
        | libc::E2BIG
        | libc::EFBIG
        | libc::ENXIO
        | libc::ESPIPE
        | libc::ENOTTY
        | libc::ENOSYS
        | libc::EOPNOTSUPP
        | libc::EAGAIN
        | libc::EINTR
        // A node whose backing file was removed outside the mount.
        | libc::ESTALE => Failure::Answer,
        libc::EIO
        | libc::ENOSPC
        | libc::EDQUOT
        | libc::EROFS
        | libc::EUCLEAN
        | libc::EBADMSG
        | libc::ENOMEM
        | libc::EMFILE
        | libc::ENFILE
        | libc::ENOTCONN
        | libc::ETIMEDOUT
        | libc::EREMOTEIO => Failure::Trouble,
        _ => Failure::Unexpected,
    }
}

/// Log a failed request by the rule of [`Failure`], naming the opcode and the errno.
pub(super) fn log_failure(op: Op, e: &FsError) {
    let n = e.errno();
    let name = nix::errno::Errno::from_raw(n);
    match e {
        FsError::Denied(d) => {
            tracing::debug!(
                "{}: {name:?}: refused by governance ({})",
                op.name(),
                d.code
            )
        }
        // Questions past the depth `drive` allows (four in one request) are refused.
        FsError::Ask(a) => tracing::info!(
            "{}: {name:?}: too many approval questions in one request (last: {})",
            op.name(),
            a.rel.display()
        ),
        FsError::Os(_) => match failure(n) {
            Failure::Answer => tracing::debug!("{}: {name:?}", op.name()),
            Failure::Trouble => tracing::warn!("{}: {name:?} ({})", op.name(), name.desc()),
            Failure::Unexpected => tracing::info!("{}: {name:?} ({})", op.name(), name.desc()),
        },
    }
}

/// Answer a request with its outcome: `ok` builds the reply from a success, a failure
/// is logged ([`log_failure`]) and answered with its errno.
pub(super) fn respond<T, R: Reply>(op: Op, reply: R, r: Result<T, FsError>, ok: impl FnOnce(R, T)) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => {
            log_failure(op, &e);
            reply.fail(errno(&e));
        }
    }
}

/// A listing reply: entries go in as the core walks the directory (fuser's `add` says
/// when the reply is full), so both listing requests share [`FuseFs::list`].
pub(super) trait Listing: Reply {
    const OP: Op;
    fn fill(&mut self, fs: &Fs, ino: u64, fh: u64, offset: i64) -> Result<(), FsError>;
    fn done(self);
}

impl Listing for ReplyDirectory {
    const OP: Op = Op::Readdir;
    fn fill(&mut self, fs: &Fs, ino: u64, fh: u64, offset: i64) -> Result<(), FsError> {
        fs.readdir(ino, fh, offset, |i, off, t, name| {
            self.add(INodeNo(i), off as u64, dtype(t), name)
        })
    }
    fn done(self) {
        self.ok()
    }
}

impl Listing for ReplyDirectoryPlus {
    const OP: Op = Op::Readdirplus;
    fn fill(&mut self, fs: &Fs, ino: u64, fh: u64, offset: i64) -> Result<(), FsError> {
        let ttl = fs.ttl();
        fs.readdirplus(ino, fh, offset, |e, off, name| {
            self.add(
                INodeNo(e.nodeid),
                off as u64,
                name,
                &ttl,
                &attr(e.nodeid, &e.st),
                Generation(0),
            )
        })
    }
    fn done(self) {
        self.ok()
    }
}
