//! Tools' temporaries next to in-scope files (issue 17): `sed -i` writes `sedXXXXXX` and
//! renames it over the file, vim writes `.name.swp`, `name~` and `4913`, Python's
//! `tempfile` + `os.replace`, cargo makes `target7NaLVN` and renames it to `target`. Their
//! names are random and outside a scope that names one file (or one directory), so the
//! scope alone would refuse the edit.
//!
//! A *temporary* is a new entry that an identity makes in a companion directory of its
//! intent (`Intent::companion_dir`: where an in-scope file lives, or the parent of an
//! in-scope directory), or an in-scope file it renames to a free name there (vim's backup).
//! It may be written, changed, renamed onto an in-scope path (it then stops being a
//! temporary) or to another free companion name, and removed — and nothing else: it cannot
//! be renamed or linked anywhere else. What a tool leaves behind is cleaned up: when its
//! identity ends, or 30 s after the process that made it exited, a temporary still there
//! is removed (a renamed-away in-scope file whose original name is empty again is put back
//! instead), with a ledger entry. So nothing outside the scope stays changed.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use super::{sys, Caller, Fs};
use crate::guard::tracking::proc_parent;
use crate::guard::Identity;
use crate::ledger::{Draft, MutationType};

thread_local! {
    /// Set by `Fs::authorize_as` when it let a new entry be made as a temporary; the
    /// operation registers it once the entry exists (never before: a create that fails
    /// because the name is taken must not make someone else's file a temporary).
    pub(crate) static NEW_TEMP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long a temporary may outlive the process that made it.
pub const GRACE: Duration = Duration::from_secs(30);

/// One temporary.
#[derive(Clone, Debug)]
pub struct Temp {
    /// The identity it belongs to.
    pub identity: String,
    /// The process that made it: pid and start time.
    pub creator: (u32, u64),
    /// The in-scope path it was renamed away from, if it was one (vim's backup).
    pub origin: Option<PathBuf>,
    /// A directory (its whole subtree is temporary).
    pub is_dir: bool,
    /// When the sweep first found its creator gone.
    pub orphaned: Option<Instant>,
}

/// The temporaries of a mount, by workspace path.
#[derive(Default)]
pub struct Temps {
    map: parking_lot::Mutex<HashMap<PathBuf, Temp>>,
}

/// The process (thread group) of a thread, with its start time.
fn process_of(tid: u32) -> Option<(u32, u64)> {
    let tgid = crate::guard::identity::tgid(tid)?;
    Some((tgid, proc_parent(tgid)?.1))
}

impl Temps {
    /// Is `rel` (or a directory above it) a temporary of `identity`?
    pub fn covers(&self, identity: &str, rel: &Path) -> bool {
        let map = self.map.lock();
        if map.is_empty() {
            return false;
        }
        let mut p = Some(rel);
        let mut first = true;
        while let Some(q) = p {
            if let Some(t) = map.get(q) {
                if t.identity == identity && (first || t.is_dir) {
                    return true;
                }
            }
            first = false;
            p = q.parent().filter(|x| !x.as_os_str().is_empty());
        }
        false
    }

    /// Is `rel` itself a temporary (of anyone)?
    pub fn is_temp(&self, rel: &Path) -> bool {
        self.map.lock().contains_key(rel)
    }

    /// `rel` is now a temporary of `ident`, made by `caller`.
    pub fn add(
        &self,
        ident: &Identity,
        caller: &Caller,
        rel: &Path,
        is_dir: bool,
        origin: Option<PathBuf>,
    ) {
        let creator = process_of(caller.pid).unwrap_or((caller.pid, 0));
        self.map.lock().insert(
            rel.to_path_buf(),
            Temp {
                identity: ident.key.clone(),
                creator,
                origin,
                is_dir,
                orphaned: None,
            },
        );
    }

    /// `rel` is gone (removed, or renamed onto an in-scope path): it and what was below it.
    pub fn remove(&self, rel: &Path) {
        let mut map = self.map.lock();
        if !map.is_empty() {
            map.retain(|k, _| !k.starts_with(rel));
        }
    }

    /// A temporary moved to `to` (another free companion name).
    pub fn rename(&self, from: &Path, to: &Path) {
        crate::ledger::reader::rekey(&mut self.map.lock(), from, to);
    }

    /// How many temporaries there are (for `status`).
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The temporaries due for cleanup: their identity is gone (`alive` says no), or their
    /// creator exited more than [`GRACE`] ago. Taken out of the table.
    fn due(&self, alive: impl Fn(&str) -> bool) -> Vec<(PathBuf, Temp)> {
        let mut map = self.map.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        let keys: Vec<PathBuf> = map.keys().cloned().collect();
        for k in keys {
            let Some(t) = map.get_mut(&k) else { continue };
            let creator_alive = proc_parent(t.creator.0).is_some_and(|(_, s)| s == t.creator.1);
            if creator_alive {
                t.orphaned = None;
            } else if t.orphaned.is_none() {
                t.orphaned = Some(now);
            }
            let ended = !alive(&t.identity);
            let expired = t.orphaned.is_some_and(|o| now.duration_since(o) >= GRACE);
            if ended || expired {
                if let Some(t) = map.remove(&k) {
                    out.push((k, t));
                }
            }
        }
        // Parents after children are gone is not needed: a directory goes with its subtree.
        out.sort_by(|a, b| b.0.cmp(&a.0));
        out
    }
}

/// The directory `rel`'s parent, opened one component at a time from `root` without
/// following a symlink, and `rel`'s last name.
fn open_parent<'a>(
    root: std::os::fd::BorrowedFd<'_>,
    rel: &'a Path,
) -> std::io::Result<(OwnedFd, &'a OsStr)> {
    let comps: Vec<&OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        })
        .collect::<Result<_, _>>()?;
    let (last, dirs) = comps
        .split_last()
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut dir = sys::open_path(root, OsStr::new("."))?;
    for d in dirs {
        let next = sys::open_path(dir.as_fd(), d)?;
        if sys::stat_fd(next.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        dir = next;
    }
    Ok((dir, last))
}

/// Remove `name` in `dir` and everything below it, following no symlink.
fn remove_tree(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
    let st = sys::stat_at(dir, name)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let sub = sys::open_path(dir, name)?;
        let mut names = Vec::new();
        {
            let mut ds = sys::DirStream::open(sub.as_fd())?;
            while let Some(e) = ds.next_entry()? {
                if e.name != b"." && e.name != b".." {
                    names.push(
                        <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&e.name).to_os_string(),
                    );
                }
            }
        }
        for n in names {
            remove_tree(sub.as_fd(), &n)?;
        }
        sys::unlink_at(dir, name, true)
    } else {
        sys::unlink_at(dir, name, false)
    }
}

impl Fs {
    /// Clean up temporaries their tools left behind (see the module doc). Returns how many.
    pub fn sweep_temps(&self) -> usize {
        if self.gate.temps.is_empty() {
            return 0;
        }
        let due = self
            .gate
            .temps
            .due(|key| self.gate.ids.by_key(key).is_some());
        let Ok(root) = self.fd(self.table.root()) else {
            return 0;
        };
        let mut n = 0;
        for (rel, t) in due {
            let Ok((dir, name)) = open_parent(root.as_fd(), &rel) else {
                continue;
            };
            let Ok(st) = sys::stat_at(dir.as_fd(), name) else {
                continue;
            };
            let ident = self
                .gate
                .ids
                .by_key(&t.identity)
                .unwrap_or_else(|| self.gate.ids.default_identity().clone());
            let caller = Caller {
                uid: 0,
                gid: 0,
                pid: 0,
            };
            // A renamed-away in-scope file whose name is free again goes back there.
            if let Some(origin) = &t.origin {
                if let Ok((odir, oname)) = open_parent(root.as_fd(), origin) {
                    if sys::stat_at(odir.as_fd(), oname).is_err()
                        && sys::rename_at(
                            dir.as_fd(),
                            name,
                            odir.as_fd(),
                            oname,
                            libc::RENAME_NOREPLACE,
                        )
                        .is_ok()
                    {
                        n += 1;
                        self.cleanup_entry(
                            &ident,
                            &caller,
                            MutationType::Rename,
                            origin,
                            Some(&rel),
                        );
                        continue;
                    }
                }
            }
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if remove_tree(dir.as_fd(), name).is_ok() {
                n += 1;
                if !is_dir && st.st_nlink <= 1 {
                    self.hashes.forget(st.st_dev, st.st_ino);
                }
                let mt = if is_dir {
                    MutationType::Rmdir
                } else {
                    MutationType::Delete
                };
                self.cleanup_entry(&ident, &caller, mt, &rel, None);
            }
        }
        n
    }

    fn cleanup_entry(
        &self,
        ident: &Identity,
        caller: &Caller,
        mt: MutationType,
        rel: &Path,
        from: Option<&Path>,
    ) {
        tracing::info!(agent = %ident.name, path = %rel.display(), "a tool's temporary left behind: cleaned up ({mt:?})");
        let Some(l) = &self.gate.ledger else { return };
        let draft = Draft {
            intent_id: ident.intent(),
            agent: Some(self.gate.agent(ident, caller)),
            mutation_type: Some(mt),
            path: Some(rel.to_path_buf()),
            from: from.map(Path::to_path_buf),
            detail: Some(serde_json::json!({
                "cleanup": "a tool's temporary outside the scope, left behind when its process or identity ended",
            })),
            ..Default::default()
        };
        if let Err(e) = l.record(draft) {
            tracing::error!("ledger: cannot record a temporary's cleanup: {e}");
        }
    }
}
