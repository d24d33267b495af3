//! Where a plan's steps land: [`Tree`] is a workspace seen as names to nodes. [`Disk`] is
//! the workspace itself, reached from a directory handle with `openat2` so that no symlink
//! and no `..` leads out of it (the daemon and the offline CLI both use it); [`Sim`] is a
//! copy-on-write view over a disk for `--dry-run`, which changes nothing.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat, openat2, renameat2, OFlag, OpenHow, RenameFlags, ResolveFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a path holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Node {
    /// Nothing.
    Absent,
    /// A regular file: its content hash (`sha256:<hex>`) and permission bits.
    File { hash: String, mode: u32 },
    /// A directory and its permission bits.
    Dir { mode: u32 },
    /// A symbolic link and its target.
    Symlink { target: PathBuf },
    /// A fifo, socket or device.
    Other,
}

impl Node {
    /// For messages: `a file (sha256:12ab…)`, `a directory`, `nothing`, ...
    pub fn describe(&self) -> String {
        match self {
            Node::Absent => "nothing".into(),
            Node::File { hash, .. } => format!("a file ({})", short_hash(hash)),
            Node::Dir { .. } => "a directory".into(),
            Node::Symlink { target } => format!("a symlink to {}", target.display()),
            Node::Other => "a special file".into(),
        }
    }

    /// Permission bits, for files and directories.
    pub fn mode(&self) -> Option<u32> {
        match self {
            Node::File { mode, .. } | Node::Dir { mode } => Some(*mode),
            _ => None,
        }
    }
}

/// `sha256:0123456789ab` (12 hex digits): enough to tell versions apart in a message.
pub fn short_hash(h: &str) -> &str {
    h.get(..19).unwrap_or(h)
}

/// A workspace as names to nodes. Paths are workspace-relative, plain components only.
pub trait Tree {
    /// What `p` holds now.
    fn node(&self, p: &Path) -> io::Result<Node>;
    /// The bytes of the regular file at `p`.
    fn read(&self, p: &Path) -> io::Result<Vec<u8>>;
    /// Put `data` at `p` as a regular file with `mode`, replacing a file there (atomically:
    /// readers see the old content or the new, never a part).
    fn put(&mut self, p: &Path, data: &[u8], mode: u32) -> io::Result<()>;
    /// Remove the file, symlink or special file at `p`.
    fn remove(&mut self, p: &Path) -> io::Result<()>;
    /// Remove the empty directory at `p`.
    fn rmdir(&mut self, p: &Path) -> io::Result<()>;
    /// Make a directory.
    fn mkdir(&mut self, p: &Path, mode: u32) -> io::Result<()>;
    /// Make a symlink.
    fn symlink(&mut self, p: &Path, target: &Path) -> io::Result<()>;
    /// Rename `from` to `to`, which must not exist.
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
    /// Swap two names.
    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()>;
    /// Set the permission bits.
    fn chmod(&mut self, p: &Path, mode: u32) -> io::Result<()>;
}

/// Refuses anything but plain components (no `/`, `..`, `.`): ledger paths are
/// workspace-relative, and one that is not was tampered with.
pub fn check_rel(p: &Path) -> io::Result<()> {
    if p.as_os_str().is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{:?} is not a workspace-relative path",
                p.display().to_string()
            ),
        ));
    }
    Ok(())
}

/// The workspace on disk, below a directory handle.
pub struct Disk {
    root: OwnedFd,
}

fn nix_err(e: nix::Error) -> io::Error {
    io::Error::from(e)
}

fn split(p: &Path) -> io::Result<(&Path, &OsStr)> {
    check_rel(p)?;
    let name = p
        .file_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok((p.parent().unwrap_or(Path::new("")), name))
}

impl Disk {
    /// The workspace at `dir`.
    pub fn open(dir: &Path) -> io::Result<Disk> {
        let root = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(nix_err)?;
        Ok(Disk { root })
    }

    /// The workspace whose root directory `fd` is (the daemon's handle).
    pub fn from_fd(fd: BorrowedFd<'_>) -> io::Result<Disk> {
        Ok(Disk {
            root: fd.try_clone_to_owned()?,
        })
    }

    /// A handle on the directory `dir` (workspace-relative, "" for the root), resolved
    /// beneath the root without following any symlink.
    pub fn dir(&self, dir: &Path) -> io::Result<OwnedFd> {
        let rel: &Path = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        openat2(
            self.root.as_fd(),
            rel,
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
                .resolve(
                    ResolveFlag::RESOLVE_BENEATH
                        | ResolveFlag::RESOLVE_NO_SYMLINKS
                        | ResolveFlag::RESOLVE_NO_MAGICLINKS,
                ),
        )
        .map_err(nix_err)
    }

    /// The parent directory's handle and the name in it.
    pub fn parent<'p>(&self, p: &'p Path) -> io::Result<(OwnedFd, &'p OsStr)> {
        let (dir, name) = split(p)?;
        Ok((self.dir(dir)?, name))
    }

    /// The names in directory `dir`.
    pub fn children(&self, dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        use std::os::fd::AsRawFd;
        let d = self.dir(dir)?;
        // The directory as resolved above (no symlink on the way), listed through its
        // handle's /proc link.
        std::fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn open_file(&self, p: &Path, flags: OFlag) -> io::Result<std::fs::File> {
        let (d, name) = self.parent(p)?;
        let fd = openat(
            d.as_fd(),
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .map_err(nix_err)?;
        Ok(std::fs::File::from(fd))
    }
}

/// Hashes a reader as the ledger does.
fn hash_reader(mut r: impl Read) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

impl Tree for Disk {
    fn node(&self, p: &Path) -> io::Result<Node> {
        let (d, name) = match self.parent(p) {
            Ok(x) => x,
            // A parent that is gone, or is not a directory (or a symlink): nothing here.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                return Ok(Node::Absent)
            }
            Err(e) => return Err(e),
        };
        let st = match fstatat(d.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(nix::Error::ENOENT) => return Ok(Node::Absent),
            Err(e) => return Err(nix_err(e)),
        };
        let mode = st.st_mode & 0o7777;
        Ok(match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Node::File {
                hash: hash_reader(self.open_file(p, OFlag::O_RDONLY)?)?,
                mode,
            },
            libc::S_IFDIR => Node::Dir { mode },
            libc::S_IFLNK => Node::Symlink {
                target: PathBuf::from(nix::fcntl::readlinkat(d.as_fd(), name).map_err(nix_err)?),
            },
            _ => Node::Other,
        })
    }

    fn read(&self, p: &Path) -> io::Result<Vec<u8>> {
        let mut f = self.open_file(p, OFlag::O_RDONLY)?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    fn put(&mut self, p: &Path, data: &[u8], mode: u32) -> io::Result<()> {
        let (d, name) = self.parent(p)?;
        // Owned like what it replaces, or like its directory (the daemon runs as root; a
        // restored file must not become root's in a user's workspace).
        let owner = match fstatat(d.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => Some((st.st_uid, st.st_gid)),
            _ => nix::sys::stat::fstat(d.as_fd())
                .ok()
                .map(|st| (st.st_uid, st.st_gid)),
        };
        let tmp = {
            let mut t = b".intentfs-restore-".to_vec();
            t.extend_from_slice(uuid::Uuid::new_v4().simple().to_string().as_bytes());
            std::ffi::OsString::from_vec(t)
        };
        let fd = openat(
            d.as_fd(),
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(nix_err)?;
        let mut f = std::fs::File::from(fd);
        let done = (|| -> io::Result<()> {
            f.write_all(data)?;
            if let Some((uid, gid)) = owner {
                if nix::unistd::geteuid().is_root() {
                    fchown(&f, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                        .map_err(nix_err)?;
                }
            }
            // After the chown: it clears set-id bits.
            fchmod(&f, Mode::from_bits_truncate(mode as libc::mode_t)).map_err(nix_err)?;
            f.sync_all()?;
            renameat2(
                d.as_fd(),
                tmp.as_os_str(),
                d.as_fd(),
                name,
                RenameFlags::empty(),
            )
            .map_err(nix_err)
        })();
        if done.is_err() {
            let _ = unlinkat(d.as_fd(), tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        done
    }

    fn remove(&mut self, p: &Path) -> io::Result<()> {
        let (d, name) = self.parent(p)?;
        unlinkat(d.as_fd(), name, UnlinkatFlags::NoRemoveDir).map_err(nix_err)
    }

    fn rmdir(&mut self, p: &Path) -> io::Result<()> {
        let (d, name) = self.parent(p)?;
        unlinkat(d.as_fd(), name, UnlinkatFlags::RemoveDir).map_err(nix_err)
    }

    fn mkdir(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        let (d, name) = self.parent(p)?;
        mkdirat(d.as_fd(), name, Mode::from_bits_truncate(0o700)).map_err(nix_err)?;
        // The umask does not decide a restored mode.
        let f = self.open_file(p, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        if nix::unistd::geteuid().is_root() {
            if let Ok(st) = nix::sys::stat::fstat(d.as_fd()) {
                fchown(
                    &f,
                    Some(Uid::from_raw(st.st_uid)),
                    Some(Gid::from_raw(st.st_gid)),
                )
                .map_err(nix_err)?;
            }
        }
        fchmod(&f, Mode::from_bits_truncate(mode as libc::mode_t)).map_err(nix_err)
    }

    fn symlink(&mut self, p: &Path, target: &Path) -> io::Result<()> {
        let (d, name) = self.parent(p)?;
        nix::unistd::symlinkat(target, d.as_fd(), name).map_err(nix_err)?;
        if nix::unistd::geteuid().is_root() {
            if let Ok(st) = nix::sys::stat::fstat(d.as_fd()) {
                let _ = nix::unistd::fchownat(
                    d.as_fd(),
                    name,
                    Some(Uid::from_raw(st.st_uid)),
                    Some(Gid::from_raw(st.st_gid)),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                );
            }
        }
        Ok(())
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let (fd, fname) = self.parent(from)?;
        let (td, tname) = self.parent(to)?;
        renameat2(
            fd.as_fd(),
            fname,
            td.as_fd(),
            tname,
            RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(nix_err)
    }

    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()> {
        let (ad, an) = self.parent(a)?;
        let (bd, bn) = self.parent(b)?;
        renameat2(ad.as_fd(), an, bd.as_fd(), bn, RenameFlags::RENAME_EXCHANGE).map_err(nix_err)
    }

    fn chmod(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        let f = self.open_file(p, OFlag::O_RDONLY)?;
        fchmod(&f, Mode::from_bits_truncate(mode as libc::mode_t)).map_err(nix_err)
    }
}

use std::os::unix::ffi::OsStringExt;

/// What a dry run changed, by path.
#[derive(Clone, Debug)]
enum Over {
    /// `p` holds this now (its children, for a directory that was there, are the disk's).
    Set(Node, Option<Vec<u8>>),
    /// `p` and everything below it are gone.
    Gone,
    /// `p` and everything below it are what was at this path on disk.
    Moved(PathBuf),
}

/// A copy-on-write view over a [`Disk`]: `--dry-run` applies a plan here, so its conflicts
/// are the ones a real run would meet, and the disk is not touched.
pub struct Sim<'a> {
    disk: &'a Disk,
    over: HashMap<PathBuf, Over>,
}

impl<'a> Sim<'a> {
    pub fn new(disk: &'a Disk) -> Sim<'a> {
        Sim {
            disk,
            over: HashMap::new(),
        }
    }

    /// Where `p`'s node comes from: an overlay value, or a disk path.
    fn resolve(&self, p: &Path) -> Result<Over, PathBuf> {
        // The nearest overlay entry on `p` or an ancestor decides.
        let mut cur = Some(p);
        while let Some(q) = cur {
            if q.as_os_str().is_empty() {
                break;
            }
            if let Some(o) = self.over.get(q) {
                let rest = p.strip_prefix(q).unwrap_or(Path::new(""));
                return match o {
                    Over::Set(..) if rest.as_os_str().is_empty() => Ok(o.clone()),
                    // Below a node set here: a directory keeps the disk's children (there
                    // are none when it was made in the dry run), anything else has none.
                    Over::Set(Node::Dir { .. }, _) => Err(p.to_path_buf()),
                    Over::Set(..) | Over::Gone => Ok(Over::Gone),
                    // A disk path: what was there before the dry run.
                    Over::Moved(src) => Err(if rest.as_os_str().is_empty() {
                        src.clone()
                    } else {
                        src.join(rest)
                    }),
                };
            }
            cur = q.parent();
        }
        Err(p.to_path_buf())
    }
}

impl Tree for Sim<'_> {
    fn node(&self, p: &Path) -> io::Result<Node> {
        match self.resolve(p) {
            Ok(Over::Set(n, _)) => Ok(n),
            Ok(_) => Ok(Node::Absent),
            Err(disk) => self.disk.node(&disk),
        }
    }

    fn read(&self, p: &Path) -> io::Result<Vec<u8>> {
        match self.resolve(p) {
            Ok(Over::Set(_, Some(data))) => Ok(data),
            Ok(_) => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Err(disk) => self.disk.read(&disk),
        }
    }

    fn put(&mut self, p: &Path, data: &[u8], mode: u32) -> io::Result<()> {
        check_rel(p)?;
        let hash = crate::ledger::sha256_bytes(data);
        self.over.insert(
            p.to_path_buf(),
            Over::Set(Node::File { hash, mode }, Some(data.to_vec())),
        );
        Ok(())
    }

    fn remove(&mut self, p: &Path) -> io::Result<()> {
        match self.node(p)? {
            Node::Absent => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Node::Dir { .. } => Err(io::Error::from_raw_os_error(libc::EISDIR)),
            _ => {
                self.over.insert(p.to_path_buf(), Over::Gone);
                Ok(())
            }
        }
    }

    fn rmdir(&mut self, p: &Path) -> io::Result<()> {
        match self.node(p)? {
            Node::Dir { .. } => {
                // Empty as a real rmdir would find it: the disk's children not removed in
                // this dry run, and what it put below.
                let from_disk = match self.resolve(p) {
                    Err(disk) => self.disk.children(&disk)?,
                    Ok(_) => Vec::new(),
                };
                let mut names: Vec<PathBuf> = from_disk.into_iter().map(|n| p.join(n)).collect();
                names.extend(self.over.keys().filter(|k| k.parent() == Some(p)).cloned());
                for n in names {
                    if self.node(&n)? != Node::Absent {
                        return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
                    }
                }
                self.over.insert(p.to_path_buf(), Over::Gone);
                Ok(())
            }
            Node::Absent => Err(io::Error::from_raw_os_error(libc::ENOENT)),
            _ => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }

    fn mkdir(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        if self.node(p)? != Node::Absent {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        self.over
            .insert(p.to_path_buf(), Over::Set(Node::Dir { mode }, None));
        Ok(())
    }

    fn symlink(&mut self, p: &Path, target: &Path) -> io::Result<()> {
        if self.node(p)? != Node::Absent {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        self.over.insert(
            p.to_path_buf(),
            Over::Set(
                Node::Symlink {
                    target: target.to_path_buf(),
                },
                None,
            ),
        );
        Ok(())
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        if self.node(to)? != Node::Absent {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        let src = match self.resolve(from) {
            Ok(Over::Set(n, d)) => Over::Set(n, d),
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Err(disk) => {
                if self.disk.node(&disk)? == Node::Absent {
                    return Err(io::Error::from_raw_os_error(libc::ENOENT));
                }
                Over::Moved(disk)
            }
        };
        // Entries below `from` set in this dry run move with it.
        let below: Vec<(PathBuf, Over)> = self
            .over
            .iter()
            .filter(|(k, _)| k.starts_with(from) && k.as_path() != from)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.over.insert(to.to_path_buf(), src);
        for (k, v) in below {
            if let Ok(rest) = k.strip_prefix(from) {
                self.over.insert(to.join(rest), v);
            }
        }
        self.over.insert(from.to_path_buf(), Over::Gone);
        Ok(())
    }

    fn exchange(&mut self, a: &Path, b: &Path) -> io::Result<()> {
        let na = self.node(a)?;
        let nb = self.node(b)?;
        let da = self.read(a).ok();
        let db = self.read(b).ok();
        self.over.insert(a.to_path_buf(), Over::Set(nb, db));
        self.over.insert(b.to_path_buf(), Over::Set(na, da));
        Ok(())
    }

    fn chmod(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        let n = match self.node(p)? {
            Node::File { hash, .. } => Node::File { hash, mode },
            Node::Dir { .. } => Node::Dir { mode },
            Node::Absent => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
            other => other,
        };
        let data = self.read(p).ok();
        self.over.insert(p.to_path_buf(), Over::Set(n, data));
        Ok(())
    }
}

/// Names in `p` are plain bytes: for messages.
pub fn show(p: &Path) -> String {
    String::from_utf8_lossy(p.as_os_str().as_bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_refuses_escapes_and_symlinked_parents() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        let mut disk = Disk::open(t.path()).unwrap();
        assert!(disk.put(Path::new("../x"), b"x", 0o644).is_err());
        assert!(disk.put(Path::new("/etc/x"), b"x", 0o644).is_err());
        assert!(disk.put(Path::new("link/x"), b"x", 0o644).is_err());
        assert_eq!(disk.node(Path::new("link/passwd")).unwrap(), Node::Absent);
        disk.put(Path::new("d/f"), b"hi", 0o751).unwrap();
        assert_eq!(
            disk.node(Path::new("d/f")).unwrap(),
            Node::File {
                hash: crate::ledger::sha256_bytes(b"hi"),
                mode: 0o751
            }
        );
        disk.mkdir(Path::new("d/e"), 0o705).unwrap();
        assert_eq!(
            disk.node(Path::new("d/e")).unwrap(),
            Node::Dir { mode: 0o705 }
        );
        disk.rename(Path::new("d/f"), Path::new("d/e/f")).unwrap();
        assert!(disk.rename(Path::new("d/e/f"), Path::new("link")).is_err());
        assert_eq!(disk.read(Path::new("d/e/f")).unwrap(), b"hi");
    }

    #[test]
    fn a_dry_run_sees_its_own_changes_and_leaves_the_disk_alone() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/a"), "a").unwrap();
        let disk = Disk::open(t.path()).unwrap();
        let mut sim = Sim::new(&disk);
        sim.rename(Path::new("d"), Path::new("e")).unwrap();
        assert_eq!(sim.node(Path::new("d/a")).unwrap(), Node::Absent);
        assert!(matches!(
            sim.node(Path::new("e/a")).unwrap(),
            Node::File { .. }
        ));
        assert_eq!(sim.read(Path::new("e/a")).unwrap(), b"a");
        assert_eq!(
            sim.rmdir(Path::new("e")).unwrap_err().raw_os_error(),
            Some(libc::ENOTEMPTY)
        );
        sim.remove(Path::new("e/a")).unwrap();
        sim.rmdir(Path::new("e")).unwrap();
        sim.mkdir(Path::new("n"), 0o755).unwrap();
        sim.put(Path::new("n/x"), b"x", 0o600).unwrap();
        assert!(matches!(
            sim.node(Path::new("n/x")).unwrap(),
            Node::File { mode: 0o600, .. }
        ));
        assert!(t.path().join("d/a").exists() && !t.path().join("n").exists());
        std::fs::write(t.path().join("f"), "f").unwrap();
        sim.rename(Path::new("f"), Path::new("g")).unwrap();
        assert!(matches!(
            sim.node(Path::new("g")).unwrap(),
            Node::File { .. }
        ));
        assert_eq!(sim.node(Path::new("f")).unwrap(), Node::Absent);
    }
}
