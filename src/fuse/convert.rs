//! Conversions between fuser's types and the core's: callers, errnos, attributes, times.

use super::*;

pub(super) fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

pub(super) fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

/// A `stat` time as a `SystemTime`: `sec` whole seconds from the epoch (negative before
/// it) plus `nsec` nanoseconds forward, as in a `timespec` (1.5 s before the epoch is
/// `(-2, 500_000_000)`). tmpfs keeps any 64-bit time, `i64::MIN` seconds included, whose
/// negation overflows: the arithmetic is unsigned and checked, never a panic.
pub(super) fn time(sec: i64, nsec: i64) -> SystemTime {
    let whole = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    let frac = Duration::from_nanos(nsec.clamp(0, 999_999_999) as u64);
    // On Linux `SystemTime` is a timespec with 64-bit seconds, so every stat time fits
    // (and fuser encodes it back exactly); a narrower clock would answer the epoch.
    whole
        .map(|t| t.checked_add(frac).unwrap_or(t))
        .unwrap_or(UNIX_EPOCH)
}

pub(super) fn kind(mode: u32) -> FileType {
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

pub(super) fn dtype(t: u8) -> FileType {
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
pub(super) fn attr(ino: u64, st: &Stat) -> FileAttr {
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
pub(super) fn negative() -> FileAttr {
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

/// An xattr reply: the value's size when asked with size 0, else the value.
pub(super) fn xattr(r: ReplyXattr, size: u32, d: &[u8]) {
    if size == 0 {
        r.size(d.len() as u32)
    } else {
        r.data(d)
    }
}

pub(super) fn fopen(o: OpenOpts) -> FopenFlags {
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

/// A SETATTR time as the `(seconds, nanoseconds)` pair `utimensat` takes.
///
/// The kernel sends a time as a `timespec` (1.5 s before the epoch is `(-2, 500000000)`),
/// but fuser 0.18 decodes a pre-epoch one as `UNIX_EPOCH - |sec| s - nsec ns` (its
/// `system_time_from_time`, marked TODO there), so that time reaches us as 2.5 s before
/// the epoch. Undone here: the whole seconds before the epoch, negated, are the seconds;
/// the fraction is the nanoseconds. The decoding never yields a time in (-1 s, 0), so the
/// inverse is exact. `tests/adapter.rs` checks the round trip on a real mount, and fails
/// if a fuser update changes the decoding.
pub(super) fn timespec(t: Option<TimeOrNow>) -> crate::fs::sys::TimeSpec {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => Some(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => (
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                d.subsec_nanos().into(),
            ),
            Err(e) => {
                let d = e.duration();
                (
                    0i64.checked_sub_unsigned(d.as_secs()).unwrap_or(i64::MIN),
                    d.subsec_nanos().into(),
                )
            }
        }),
    })
}
