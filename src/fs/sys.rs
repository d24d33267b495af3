//! Thin, safe wrappers over the syscalls the passthrough needs.
//!
//! This file holds the passthrough's `unsafe` (the crate's few other blocks are listed in
//! `lib.rs`): every block has a `// SAFETY:` comment. Every path
//! operation here is relative to a directory file descriptor and takes a single name
//! component; none of them resolves a multi-component path or follows a symlink.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

pub use crate::stat::Stat;

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// A name component must be a single, real entry name: no `/`, not `.` or `..`, not empty.
pub fn valid_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !(b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0))
}

/// `openat(dir, name, O_PATH|O_NOFOLLOW|O_CLOEXEC)`: a handle on the entry itself, never
/// on what a symlink points to.
pub fn open_path(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: `c` is a valid NUL-terminated string, `dir` a live fd; the returned fd is
    // owned by us alone.
    let fd = check(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open a path with `O_PATH` (used once, for the workspace root).
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: valid C string; we own the returned fd.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd from open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat(dir, name, flags, mode)` of a single name (the caller passes `O_NOFOLLOW`
/// where a symlink must not be followed).
pub fn openat_mode(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: i32,
    mode: u32,
) -> io::Result<OwnedFd> {
    if !valid_name(name) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let c = cstr(name)?;
    // SAFETY: valid C string and dirfd; we own the returned fd.
    let fd =
        check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: fresh fd from openat.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The first line of a small file `dir/name` (a git ref), not following a symlink.
pub fn read_ref_at(dir: BorrowedFd<'_>, name: &OsStr) -> Option<String> {
    let mut f = open_read_at(dir, name).ok()?;
    let mut buf = [0u8; 512];
    let n = std::io::Read::read(&mut f, &mut buf).ok()?;
    // (Lossy: bytes git ignores after the object id must not hide the id from the check.)
    let text = String::from_utf8_lossy(&buf[..n]);
    Some(text.lines().next().unwrap_or("").trim().to_string())
}

/// `dir/name` opened for reading its content: never through a symlink, never blocking on
/// a FIFO.
pub fn open_read_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    Ok(std::fs::File::from(openat_mode(dir, name, flags, 0)?))
}

/// Open a directory by path, refusing a symlink as its last component.
pub fn open_dir_nofollow(path: &std::path::Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: valid C string; we own the returned fd.
    let fd = check(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd from open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Stat> {
    let c = cstr(name)?;
    let mut st = std::mem::MaybeUninit::<Stat>::zeroed();
    // SAFETY: `st` points to writable memory of the right size; `c` is NUL-terminated.
    check(unsafe {
        libc::fstatat64(
            dir.as_raw_fd(),
            c.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat64 succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

/// The stat of `rel` (relative, without `..`) resolved beneath `root` without following
/// any symlink on the way or at its end: what a remembered name of an inode names now.
pub fn stat_beneath(root: BorrowedFd<'_>, rel: &std::path::Path) -> io::Result<Stat> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    stat_fd(fd.as_fd())
}

/// `fstat` of any fd, `O_PATH` ones included.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<Stat>::zeroed();
    // SAFETY: empty path with AT_EMPTY_PATH stats the fd itself; buffer is valid.
    check(unsafe {
        libc::fstatat64(
            fd.as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: success means the struct is initialised.
    Ok(unsafe { st.assume_init() })
}

/// The `/proc/self/fd` directory, through which an `O_PATH` handle is re-opened with real
/// access flags (the magic link refers to the very inode, never to a path).
pub fn open_proc_self_fd() -> io::Result<OwnedFd> {
    // SAFETY: static C string, we own the fd.
    let fd = check(unsafe {
        libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fd_name(fd: RawFd) -> CString {
    // A decimal number never contains NUL.
    CString::new(fd.to_string()).unwrap_or_default()
}

/// Re-open an `O_PATH` handle with `flags`. `O_CREAT`, `O_EXCL`, `O_NOFOLLOW` and `O_NOCTTY`
/// are stripped: the inode already exists and is the one the handle names.
pub fn reopen(
    proc_fd: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    flags: i32,
) -> io::Result<std::fs::File> {
    let flags = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_NOCTTY))
        | libc::O_CLOEXEC;
    let name = fd_name(fd.as_raw_fd());
    // SAFETY: valid C string and dirfd; the new fd is ours.
    let nfd = check(unsafe { libc::openat(proc_fd.as_raw_fd(), name.as_ptr(), flags) })?;
    // SAFETY: fresh fd from openat.
    Ok(unsafe { std::fs::File::from_raw_fd(nfd) })
}

/// The daemon's own read of a file (hashing it, keeping a version): like
/// `reopen(.., O_RDONLY)` but with `O_NOATIME`, so that reading for the record does not
/// change what the file's access time says (with passthrough of data the daemon hashes a
/// file a caller has just given times to). `O_NOATIME` needs the file's owner or
/// `CAP_FOWNER`: without them, a plain read-only open.
pub fn reopen_quiet(proc_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    match reopen(proc_fd, fd, libc::O_RDONLY | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => reopen(proc_fd, fd, libc::O_RDONLY),
        r => r,
    }
}

/// The modes a caller asks for are already masked by its own umask (the kernel sends it and
/// `ops` applies it). The daemon's umask must not mask them a second time, yet the daemon's
/// own files (ledger, pid file, socket) keep its umask: so each thread that creates on a
/// caller's behalf gets its own filesystem context (`unshare(CLONE_FS)`, as virtiofsd does)
/// with umask 0, once, before its first create.
fn caller_umask() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    DONE.with(|d| {
        if d.get() {
            return;
        }
        d.set(true);
        // SAFETY: unshare(CLONE_FS) only detaches this thread's cwd/root/umask; umask
        // cannot fail.
        if unsafe { libc::unshare(libc::CLONE_FS) } == 0 {
            // SAFETY: umask has no preconditions and only affects this thread (above).
            unsafe { libc::umask(0) };
        } else {
            tracing::warn!(
                "unshare(CLONE_FS) failed ({}): new files get the daemon's umask on top of the caller's",
                io::Error::last_os_error()
            );
        }
    });
}

/// `openat(dir, name, flags|O_CREAT|O_EXCL|O_NOFOLLOW, mode)`: create a new regular file.
pub fn create_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: i32,
    mode: u32,
) -> io::Result<std::fs::File> {
    let c = cstr(name)?;
    let flags = (flags & !libc::O_NOCTTY)
        | libc::O_CREAT
        | libc::O_EXCL
        | libc::O_NOFOLLOW
        | libc::O_CLOEXEC;
    caller_umask();
    // SAFETY: valid C string and dirfd; mode is passed as the variadic argument.
    let fd =
        check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

pub fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<()> {
    let c = cstr(name)?;
    caller_umask();
    // SAFETY: valid C string and dirfd.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) }).map(drop)
}

pub fn mknod_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cstr(name)?;
    caller_umask();
    // SAFETY: valid C string and dirfd.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), c.as_ptr(), mode, rdev) }).map(drop)
}

pub fn symlink_at(target: &OsStr, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let t = cstr(target)?;
    let c = cstr(name)?;
    // SAFETY: valid C strings and dirfd. The target is stored verbatim, never resolved.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) }).map(drop)
}

pub fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr, is_dir: bool) -> io::Result<()> {
    let c = cstr(name)?;
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid C string and dirfd.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
}

pub fn rename_at(
    olddir: BorrowedFd<'_>,
    oldname: &OsStr,
    newdir: BorrowedFd<'_>,
    newname: &OsStr,
    flags: u32,
) -> io::Result<()> {
    let o = cstr(oldname)?;
    let n = cstr(newname)?;
    // SAFETY: valid C strings and dirfds; renameat2 never follows symlinks in the last
    // component.
    check(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            o.as_ptr(),
            newdir.as_raw_fd(),
            n.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// Hard-link the inode behind an `O_PATH` handle under a new name, through its
/// `/proc/self/fd` magic link (no `CAP_DAC_READ_SEARCH` needed, no path resolution).
pub fn link_fd(
    proc_fd: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    newdir: BorrowedFd<'_>,
    newname: &OsStr,
) -> io::Result<()> {
    let src = fd_name(fd.as_raw_fd());
    let n = cstr(newname)?;
    // SAFETY: valid C strings and dirfds. AT_SYMLINK_FOLLOW follows only the magic link to
    // the inode itself.
    check(unsafe {
        libc::linkat(
            proc_fd.as_raw_fd(),
            src.as_ptr(),
            newdir.as_raw_fd(),
            n.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
    .map(drop)
}

/// The target of the symlink behind an `O_PATH|O_NOFOLLOW` handle.
pub fn readlink_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: empty path reads the link the fd refers to; buf is writable for its length.
    let n = check_size(unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// Where the kernel says a directory handle is now (`/proc/self/fd/N`): the real location,
/// even after a rename made outside the mount.
pub fn fd_path(fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// [`fd_path`] through the daemon's open `/proc/self/fd` (no walk of `/proc/self/fd/`
/// for each of the many mutations that need a directory's path).
pub fn fd_path_in(proc_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    // (rustix grows the buffer as needed: a path of any length, and no 4 KiB zeroed per
    // call as a PATH_MAX buffer cost on every request that resolves a directory's path.)
    let target = rustix::fs::readlinkat(
        proc_fd,
        fd_name(fd.as_raw_fd()).as_c_str(),
        Vec::with_capacity(256),
    )?;
    Ok(std::path::PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

/// Where this thread's own working directory is (see [`dir_path`]).
#[derive(Clone, Copy, PartialEq)]
enum Cwd {
    /// Shared with the process still: not moved yet.
    Shared,
    /// The thread cannot have one of its own (`unshare` refused): never moved.
    Refused,
    /// Its own, at the directory with this backing (dev, ino), or not known where.
    Own(Option<(u64, u64)>),
}

thread_local! {
    static CWD: std::cell::Cell<Cwd> = const { std::cell::Cell::new(Cwd::Shared) };
}

/// The path of directory `dir` (backing `key`: dev, ino) as the kernel resolves it now,
/// like [`fd_path_in`], for a third of its cost: the directory is made this thread's
/// working directory, then `getcwd(2)` says where it is (the same `d_path` as the
/// `/proc` link, without a `/proc` lookup), and a thread already there (the unlinks of
/// `rm -rf`, the creates of `tar x` in one directory) only asks. The working directory is
/// the thread's own (`unshare(CLONE_FS)` once per thread): no other thread's moves. The
/// directory it holds cannot be freed, so no other directory can come to have its
/// number. A directory removed has no path (`ENOENT`); where a thread cannot have a
/// working directory of its own, through `/proc`. The path is handed to `then` from a
/// buffer of the thread's (no allocation for a path only looked at).
pub fn dir_path<R, F: FnOnce(&[u8]) -> R>(
    proc_fd: BorrowedFd<'_>,
    key: (u64, u64),
    dir: impl FnOnce() -> io::Result<std::sync::Arc<OwnedFd>>,
    then: F,
) -> io::Result<R> {
    let mut cwd = CWD.get();
    let mut then = Some(then);
    if cwd == Cwd::Own(Some(key)) {
        if let Ok(Some(r)) = getcwd_then(|p| then.take().map(|f| f(p))) {
            return Ok(r);
        }
        // (Removed since: gone, or made again under another number.)
        cwd = Cwd::Own(None);
    }
    let then = then
        .take()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
    let dir = dir()?;
    let via_proc = |then: F| -> io::Result<R> {
        let p = fd_path_in(proc_fd, dir.as_fd())?;
        Ok(then(p.as_os_str().as_bytes()))
    };
    if cwd == Cwd::Shared {
        // SAFETY: CLONE_FS gives this thread its own root, working directory and umask
        // (copies of the process's); no file descriptor table is unshared.
        cwd = match unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) } {
            Ok(()) => Cwd::Own(None),
            Err(_) => Cwd::Refused,
        };
    }
    if cwd == Cwd::Refused {
        CWD.set(cwd);
        return via_proc(then);
    }
    CWD.set(Cwd::Own(None));
    if let Err(e) = rustix::process::fchdir(&*dir) {
        // (A daemon without CAP_DAC_READ_SEARCH may not enter a directory made 000 through
        // the mount; `/proc` still says where it is, and the mode can be put back.)
        if e == rustix::io::Errno::ACCESS || e == rustix::io::Errno::PERM {
            return via_proc(then);
        }
        return Err(e.into());
    }
    CWD.set(Cwd::Own(Some(key)));
    getcwd_then(then)
}

thread_local! {
    /// [`getcwd_then`]'s buffer.
    static CWD_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `getcwd(2)` into the thread's buffer: `then` of an absolute path, or an error
/// (`ENOENT` when the directory was removed, and a path the kernel says is not reachable
/// from the root is none; `ENAMETOOLONG` past a page, as `/proc` fails). The system call
/// itself: glibc's `getcwd` walks up through `..` reading every directory on the way when
/// the kernel's answer is too long or unreachable, which a deep tree an agent built would
/// make slow and not atomic.
fn getcwd_then<R>(then: impl FnOnce(&[u8]) -> R) -> io::Result<R> {
    CWD_BUF.with_borrow_mut(|buf| {
        // (The kernel answers at most a page, NUL included.)
        const MAX: usize = 4096;
        if buf.capacity() < MAX {
            buf.reserve(MAX);
        }
        buf.clear();
        // SAFETY: `buf` has `capacity()` writable bytes, at least MAX; the system call
        // writes at most its size argument, the terminating NUL included.
        let n = unsafe { libc::syscall(libc::SYS_getcwd, buf.as_mut_ptr(), MAX) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: on success the first `n` bytes (the path and its NUL) were written.
        unsafe { buf.set_len((n as usize).min(MAX)) };
        if buf.last() == Some(&0) {
            buf.pop();
        }
        if buf.first() != Some(&b'/') {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(then(buf))
    })
}

pub fn chmod_fd(proc_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let name = fd_name(fd.as_raw_fd());
    // SAFETY: valid C string and dirfd; the magic link resolves to the inode itself.
    check(unsafe { libc::fchmodat(proc_fd.as_raw_fd(), name.as_ptr(), mode, 0) }).map(drop)
}

pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let uid = uid.unwrap_or(u32::MAX);
    let gid = gid.unwrap_or(u32::MAX);
    // SAFETY: AT_EMPTY_PATH acts on the fd itself; -1 leaves an id unchanged.
    check(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// A timestamp for `utimensat`: `None` leaves it, `Some(None)` is "now", `Some(Some((s,
/// ns)))` is `s` seconds from the epoch plus `ns` nanoseconds (1.5 s before the epoch is
/// `(-2, 500_000_000)`, as in a `timespec`).
pub type TimeSpec = Option<Option<(i64, i64)>>;

fn timespec(t: TimeSpec) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(None) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        // `utimensat` refuses nanoseconds outside 0..1e9 (EINVAL) and would read the two
        // magic values as OMIT/NOW: carry whole seconds out of them (floored, so a
        // negative fraction borrows a second), saturating at the ends of the range.
        Some(Some((s, ns))) => libc::timespec {
            tv_sec: s.saturating_add(ns.div_euclid(1_000_000_000)),
            tv_nsec: ns.rem_euclid(1_000_000_000),
        },
    }
}

pub fn utimes_fd(
    proc_fd: BorrowedFd<'_>,
    fd: BorrowedFd<'_>,
    atime: TimeSpec,
    mtime: TimeSpec,
) -> io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    let name = fd_name(fd.as_raw_fd());
    // SAFETY: valid C string, dirfd and a 2-element timespec array.
    check(unsafe { libc::utimensat(proc_fd.as_raw_fd(), name.as_ptr(), times.as_ptr(), 0) })
        .map(drop)
}

/// `utimensat(dir, name, AT_SYMLINK_NOFOLLOW)`: for symlinks themselves.
pub fn utimes_at_nofollow(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    atime: TimeSpec,
    mtime: TimeSpec,
) -> io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    let c = cstr(name)?;
    // SAFETY: valid C string, dirfd and timespec array.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

pub fn statvfs_fd(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs64>::zeroed();
    // SAFETY: buffer of the right size; fstatvfs works on O_PATH fds.
    check(unsafe { libc::fstatvfs64(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: success means initialised.
    Ok(unsafe { st.assume_init() })
}

fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

/// xattr calls go through the `/proc/self/fd` magic link: `O_PATH` fds refuse f*xattr.
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &OsStr, size: usize) -> io::Result<Vec<u8>> {
    let p = proc_path(fd);
    let n = cstr(name)?;
    let mut buf = vec![0u8; size];
    // SAFETY: valid C strings; buf writable for `size` bytes (null pointer when 0 asks for
    // the size only).
    let len = check_size(unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr() as *mut libc::c_void
            },
            size,
        )
    })?;
    if size == 0 {
        return Ok(vec![0; len]);
    }
    buf.truncate(len);
    Ok(buf)
}

pub fn listxattr_fd(fd: BorrowedFd<'_>, size: usize) -> io::Result<Vec<u8>> {
    let p = proc_path(fd);
    let mut buf = vec![0u8; size];
    // SAFETY: as getxattr.
    let len = check_size(unsafe {
        libc::listxattr(
            p.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr() as *mut libc::c_char
            },
            size,
        )
    })?;
    if size == 0 {
        return Ok(vec![0; len]);
    }
    buf.truncate(len);
    Ok(buf)
}

pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let p = proc_path(fd);
    let n = cstr(name)?;
    // SAFETY: valid C strings and value slice.
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            flags,
        )
    })
    .map(drop)
}

pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let p = proc_path(fd);
    let n = cstr(name)?;
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an fd we own.
    check(unsafe { libc::fallocate64(file.as_raw_fd(), mode, offset as i64, len as i64) }).map(drop)
}

pub fn copy_file_range(
    fin: &std::fs::File,
    off_in: u64,
    fout: &std::fs::File,
    off_out: u64,
    len: u64,
    flags: u32,
) -> io::Result<usize> {
    let mut oi = off_in as i64;
    let mut oo = off_out as i64;
    // SAFETY: valid fds and offset pointers to locals.
    check_size(unsafe {
        libc::copy_file_range(
            fin.as_raw_fd(),
            &mut oi,
            fout.as_raw_fd(),
            &mut oo,
            len as usize,
            flags,
        )
    })
}

pub fn fsync(file: &std::fs::File, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscall on an fd we own.
    check(unsafe {
        if datasync {
            libc::fdatasync(file.as_raw_fd())
        } else {
            libc::fsync(file.as_raw_fd())
        }
    })
    .map(drop)
}

pub fn lseek(file: &std::fs::File, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on an fd we own.
    let r = unsafe { libc::lseek64(file.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Switch this thread's filesystem uid/gid for creating entries on behalf of a caller, and
/// switch back on drop. `setfsuid` is per thread on Linux, so other workers are unaffected.
pub struct FsCred {
    old_uid: Option<u32>,
    old_gid: Option<u32>,
}

impl FsCred {
    pub fn switch(uid: u32, gid: u32) -> FsCred {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 || (uid == 0 && gid == 0) {
            return FsCred {
                old_uid: None,
                old_gid: None,
            };
        }
        // SAFETY: setfsgid/setfsuid only change this thread's fs credentials; the old values
        // are returned and restored on drop. gid first: after dropping the uid we could not.
        let old_gid = unsafe { libc::setfsgid(gid) } as u32;
        // SAFETY: as above.
        let old_uid = unsafe { libc::setfsuid(uid) } as u32;
        FsCred {
            old_uid: Some(old_uid),
            old_gid: Some(old_gid),
        }
    }
}

impl Drop for FsCred {
    fn drop(&mut self) {
        if let Some(u) = self.old_uid {
            // SAFETY: restoring the thread's previous fs uid.
            unsafe { libc::setfsuid(u) };
        }
        if let Some(g) = self.old_gid {
            // SAFETY: restoring the thread's previous fs gid.
            unsafe { libc::setfsgid(g) };
        }
    }
}

/// A directory stream over a directory handle, for readdir with kernel-provided offsets.
pub struct DirStream {
    dir: *mut libc::DIR,
}

// SAFETY: a DIR* may be used from any thread as long as it is used by one at a time; the
// handle table wraps it in a Mutex.
unsafe impl Send for DirStream {}

/// One directory entry.
pub struct DirEntry {
    pub ino: u64,
    pub offset: i64,
    pub kind: u8,
    pub name: Vec<u8>,
}

impl DirStream {
    /// Open the directory behind an `O_PATH` handle for reading.
    pub fn open(fd: BorrowedFd<'_>) -> io::Result<DirStream> {
        // "." relative to the directory's own handle: the same inode, without the procfs
        // lookup a reopen through /proc/self/fd costs.
        // SAFETY: valid C string and dirfd; the new fd is ours.
        let raw = check(unsafe {
            libc::openat(
                fd.as_raw_fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: fdopendir takes ownership of `raw` on success.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so we still own `raw`.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        Ok(DirStream { dir })
    }

    pub fn seek(&mut self, offset: i64) {
        // SAFETY: self.dir is a live DIR*; offset 0 rewinds, others came from telldir/d_off.
        unsafe {
            if offset == 0 {
                libc::rewinddir(self.dir)
            } else {
                libc::seekdir(self.dir, offset)
            }
        }
    }

    pub fn next_entry(&mut self) -> io::Result<Option<DirEntry>> {
        // SAFETY: errno is thread-local; reset it to tell end-of-stream from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: self.dir is live and used by one thread at a time.
        let ent = unsafe { libc::readdir64(self.dir) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            return if e.raw_os_error().unwrap_or(0) == 0 {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: readdir64 returned a valid entry, alive until the next call on this DIR.
        let ent = unsafe { &*ent };
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) }
            .to_bytes()
            .to_vec();
        Ok(Some(DirEntry {
            ino: ent.d_ino,
            offset: ent.d_off,
            kind: ent.d_type,
            name,
        }))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: dirfd of a live DIR* is valid for the DIR's lifetime, which bounds 'self.
        unsafe { BorrowedFd::borrow_raw(libc::dirfd(self.dir)) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: self.dir is live and closed exactly once.
        unsafe { libc::closedir(self.dir) };
    }
}

/// Raise `RLIMIT_NOFILE` to its hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: valid in-parameter; raising the soft limit to the hard one is always allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    rl.rlim_cur
}

/// Borrow an fd we know outlives the borrow.
pub fn borrow(fd: &OwnedFd) -> BorrowedFd<'_> {
    fd.as_fd()
}

/// `name_to_handle_at(dir, path, flags)`: the file handle's type and bytes.
pub fn name_to_handle(dir: BorrowedFd<'_>, path: &CStr, flags: i32) -> io::Result<(i32, Vec<u8>)> {
    const MAX: usize = 128;
    #[repr(C)]
    struct Fh {
        bytes: u32,
        ty: i32,
        f: [u8; MAX],
    }
    let mut fh = Fh {
        bytes: MAX as u32,
        ty: 0,
        f: [0; MAX],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `fh` is a `struct file_handle` with room for MAX bytes (handle_bytes says
    // so); `path` is NUL-terminated; `mount_id` is writable.
    check(unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            dir.as_raw_fd(),
            path.as_ptr(),
            &mut fh as *mut Fh,
            &mut mount_id as *mut libc::c_int,
            flags,
        ) as libc::c_int
    })?;
    let n = (fh.bytes as usize).min(MAX);
    Ok((fh.ty, fh.f[..n].to_vec()))
}

/// `fanotify_init(flags, O_RDONLY|O_LARGEFILE)`.
pub fn fanotify_init(flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is ours.
    let fd =
        check(unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_LARGEFILE) as u32) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fanotify_mark(fan, flags, mask, dirfd, path)`.
pub fn fanotify_mark(
    fan: RawFd,
    flags: u32,
    mask: u64,
    dirfd: RawFd,
    path: &CStr,
) -> io::Result<()> {
    // SAFETY: valid fds and NUL-terminated path.
    check(unsafe { libc::fanotify_mark(fan, flags, mask, dirfd, path.as_ptr()) }).map(drop)
}

/// `read(fd, buf)`.
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    check_size(unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) })
}

/// Up to `size` bytes of `file` from `offset` (fewer at end of file), into a fresh buffer
/// that is not zeroed first: a 1 MiB read request would otherwise clear 1 MiB only to
/// overwrite it.
pub fn pread_exact_or_eof(file: &std::fs::File, offset: u64, size: usize) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(size);
    while buf.len() < size {
        let (len, want) = (buf.len(), size - buf.len());
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable for at least `want` bytes; pread writes at most that
        // many and reports how many it wrote, which become initialized below.
        let r = unsafe {
            libc::pread64(
                file.as_raw_fd(),
                spare.as_mut_ptr() as *mut libc::c_void,
                want,
                (offset + len as u64) as libc::off64_t,
            )
        };
        match check_size(r) {
            Ok(0) => break,
            // SAFETY: pread initialized `n` more bytes right after the current length.
            Ok(n) => unsafe { buf.set_len(buf.len() + n) },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod timespec_tests {
    use super::timespec;

    fn pair(t: super::TimeSpec) -> (i64, i64) {
        let ts = timespec(t);
        (ts.tv_sec, ts.tv_nsec)
    }

    #[test]
    fn pairs_keep_their_fraction_on_both_sides_of_the_epoch() {
        assert_eq!(pair(Some(Some((-2, 500_000_000)))), (-2, 500_000_000));
        assert_eq!(pair(Some(Some((1, 1)))), (1, 1));
        assert_eq!(pair(Some(Some((i64::MIN, 0)))), (i64::MIN, 0));
        assert_eq!(
            pair(Some(Some((i64::MAX, 999_999_999)))),
            (i64::MAX, 999_999_999)
        );
    }

    #[test]
    fn out_of_range_nanoseconds_carry_into_seconds() {
        // -1.5 s written as -1 s and -0.5 s.
        assert_eq!(pair(Some(Some((-1, -500_000_000)))), (-2, 500_000_000));
        assert_eq!(pair(Some(Some((0, 2_500_000_000)))), (2, 500_000_000));
        assert_eq!(pair(Some(Some((i64::MAX, 1_000_000_000)))).0, i64::MAX);
        assert_eq!(pair(Some(Some((i64::MIN, -1)))).0, i64::MIN);
        // Never one of the magic values.
        assert_eq!(
            pair(Some(Some((0, libc::UTIME_NOW)))).1,
            libc::UTIME_NOW % 1_000_000_000
        );
    }

    #[test]
    fn omit_and_now() {
        assert_eq!(pair(None).1, libc::UTIME_OMIT);
        assert_eq!(pair(Some(None)).1, libc::UTIME_NOW);
    }
}

#[cfg(test)]
mod dir_path_tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::Arc;

    fn owned(p: &[u8]) -> std::path::PathBuf {
        std::path::PathBuf::from(OsStr::from_bytes(p))
    }

    fn open(p: &std::path::Path) -> (Arc<OwnedFd>, (u64, u64)) {
        let m = std::fs::metadata(p).unwrap();
        (Arc::new(open_dir_nofollow(p).unwrap()), (m.dev(), m.ino()))
    }

    /// A directory's path is where it is now, renamed or not, from any thread; each
    /// thread's working directory is its own (the process's never moves); a directory
    /// removed has none; asked again at once, the thread already there answers.
    #[test]
    fn a_directory_path_follows_renames_and_moves_no_other_thread() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let proc_fd = open_proc_self_fd().unwrap();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir(root.join("c")).unwrap();
        let (b, kb) = open(&root.join("a/b"));
        let (c, kc) = open(&root.join("c"));
        // (The process's: its first thread's. A thread spawned shares its spawner's.)
        let process_cwd = std::fs::read_link("/proc/self/cwd").unwrap();
        let path = |fd: &Arc<OwnedFd>, k| dir_path(proc_fd.as_fd(), k, || Ok(fd.clone()), owned);
        assert_eq!(path(&b, kb).unwrap(), root.join("a/b"));
        // (Asked again: the thread is there; renamed above it: the new path.)
        std::fs::rename(root.join("a"), root.join("z")).unwrap();
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let p = dir_path(
            proc_fd.as_fd(),
            kb,
            || {
                opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(b.clone())
            },
            owned,
        );
        assert_eq!(p.unwrap(), root.join("z/b"));
        assert_eq!(
            opened.into_inner(),
            0,
            "the thread is there: nothing to open"
        );
        // Another thread, at another directory, at once.
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                (0..200)
                    .map(|_| path(&c, kc).unwrap())
                    .all(|p| p == root.join("c"))
            });
            for _ in 0..200 {
                assert_eq!(path(&b, kb).unwrap(), root.join("z/b"));
            }
            assert!(h.join().unwrap());
        });
        assert_eq!(std::fs::read_link("/proc/self/cwd").unwrap(), process_cwd);
        // Removed: no path, however asked.
        std::fs::remove_dir(root.join("z/b")).unwrap();
        let e = path(&b, kb).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        let e = path(&b, kb).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        // And the thread goes on to another directory.
        assert_eq!(path(&c, kc).unwrap(), root.join("c"));
    }

    /// A directory deeper than a page of path has none, at once (the kernel's answer, as
    /// through `/proc`), not one pieced together by walking up through `..`.
    #[test]
    fn a_path_past_a_page_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let proc_fd = open_proc_self_fd().unwrap();
        let name = "d".repeat(250);
        let mut fd = Arc::new(open_dir_nofollow(t.path()).unwrap());
        for _ in 0..20 {
            rustix::fs::mkdirat(&*fd, name.as_str(), rustix::fs::Mode::RWXU).unwrap();
            fd = Arc::new(open_path(fd.as_fd(), OsStr::new(&name)).unwrap());
        }
        let st = stat_fd(fd.as_fd()).unwrap();
        let key = (st.st_dev, st.st_ino);
        let e = dir_path(proc_fd.as_fd(), key, || Ok(fd.clone()), owned).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG), "{e}");
    }
}
