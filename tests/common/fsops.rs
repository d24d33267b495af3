//! The operations the differential tests apply to a plain directory and to the mount, and
//! how each is run: the value on success (as a string) or the errno on failure.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use super::describe;

#[derive(Debug, Clone)]
pub enum Op {
    Create(String, Vec<u8>),
    CreateNew(String),
    WriteAt(String, u64, Vec<u8>),
    Append(String, Vec<u8>),
    TruncFh(String, u64),
    TruncPath(String, u64),
    Rename(String, String),
    RenameNoReplace(String, String),
    Exchange(String, String),
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Link(String, String),
    /// (number of `../`, target below the case directory, link).
    Symlink(usize, String, String),
    Readlink(String),
    Chmod(String, u32),
    Stat(String),
    StatFollow(String),
    ReadDir(String),
    Read(String),
}

pub type R = Result<String, i32>;

pub fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

pub fn io<T>(r: std::io::Result<T>, f: impl FnOnce(T) -> String) -> R {
    r.map(f).map_err(errno)
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn libc_res(ret: libc::c_int) -> R {
    if ret < 0 {
        Err(errno(std::io::Error::last_os_error()))
    } else {
        Ok(String::new())
    }
}

pub fn kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "link"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    }
}

pub fn stat_string(md: std::fs::Metadata) -> String {
    let k = kind(md.file_type());
    let size = if k == "dir" {
        String::new()
    } else {
        format!(" size={}", md.len())
    };
    format!(
        "{k}{size} mode={:o} nlink={}",
        md.permissions().mode() & 0o7777,
        md.nlink()
    )
}

pub fn renameat2(a: &Path, b: &Path, flags: u32) -> R {
    // SAFETY: valid C strings; AT_FDCWD with absolute paths.
    libc_res(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cpath(a).as_ptr(),
            libc::AT_FDCWD,
            cpath(b).as_ptr(),
            flags,
        )
    })
}

/// Run `op` with paths relative to `base`.
pub fn exec(base: &Path, op: &Op) -> R {
    let p = |s: &str| base.join(s);
    match op {
        Op::Create(f, data) => io(
            std::fs::File::create(p(f)).and_then(|mut h| h.write_all(data)),
            |_| String::new(),
        ),
        Op::CreateNew(f) => io(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p(f)),
            |_| String::new(),
        ),
        Op::WriteAt(f, off, data) => io(
            std::fs::OpenOptions::new()
                .write(true)
                .open(p(f))
                .and_then(|h| h.write_all_at(data, *off)),
            |_| String::new(),
        ),
        Op::Append(f, data) => io(
            std::fs::OpenOptions::new()
                .append(true)
                .open(p(f))
                .and_then(|mut h| h.write_all(data)),
            |_| String::new(),
        ),
        Op::TruncFh(f, len) => io(
            std::fs::OpenOptions::new()
                .write(true)
                .open(p(f))
                .and_then(|h| h.set_len(*len)),
            |_| String::new(),
        ),
        Op::TruncPath(f, len) => {
            let path = cpath(&p(f));
            // SAFETY: `path` is a valid C string that outlives the call.
            libc_res(unsafe { libc::truncate(path.as_ptr(), *len as libc::off_t) })
        }
        Op::Rename(a, b) => io(std::fs::rename(p(a), p(b)), |_| String::new()),
        Op::RenameNoReplace(a, b) => renameat2(&p(a), &p(b), libc::RENAME_NOREPLACE),
        Op::Exchange(a, b) => renameat2(&p(a), &p(b), libc::RENAME_EXCHANGE),
        Op::Mkdir(d) => io(std::fs::create_dir(p(d)), |_| String::new()),
        Op::Rmdir(d) => io(std::fs::remove_dir(p(d)), |_| String::new()),
        Op::Unlink(f) => io(std::fs::remove_file(p(f)), |_| String::new()),
        Op::Link(a, b) => io(std::fs::hard_link(p(a), p(b)), |_| String::new()),
        Op::Symlink(ups, target, l) => {
            // Never climb out of the case directory: at most one `../` per level of `l`.
            let ups = (*ups).min(l.matches('/').count());
            let t = format!("{}{target}", "../".repeat(ups));
            io(std::os::unix::fs::symlink(t, p(l)), |_| String::new())
        }
        Op::Readlink(l) => io(std::fs::read_link(p(l)), |t| {
            t.to_string_lossy().into_owned()
        }),
        Op::Chmod(f, mode) => io(
            std::fs::set_permissions(p(f), std::fs::Permissions::from_mode(*mode)),
            |_| String::new(),
        ),
        Op::Stat(f) => io(std::fs::symlink_metadata(p(f)), stat_string),
        Op::StatFollow(f) => io(std::fs::metadata(p(f)), stat_string),
        Op::ReadDir(d) => io(std::fs::read_dir(p(d)), |rd| {
            let mut v: Vec<String> = rd
                .map(|e| {
                    let e = e.unwrap();
                    format!(
                        "{}:{}",
                        e.file_name().to_string_lossy(),
                        kind(e.file_type().unwrap())
                    )
                })
                .collect();
            v.sort();
            v.join(",")
        }),
        Op::Read(f) => io(std::fs::read(p(f)), |b| describe(&b)),
    }
}

/// The paths an operation mutates (read through the mount first).
pub fn paths_of(op: &Op) -> Vec<&str> {
    match op {
        Op::Create(a, _)
        | Op::CreateNew(a)
        | Op::WriteAt(a, _, _)
        | Op::Append(a, _)
        | Op::TruncFh(a, _)
        | Op::TruncPath(a, _)
        | Op::Unlink(a)
        | Op::Chmod(a, _) => vec![a],
        Op::Rename(a, b) | Op::RenameNoReplace(a, b) | Op::Exchange(a, b) | Op::Link(a, b) => {
            vec![a, b]
        }
        _ => vec![],
    }
}
