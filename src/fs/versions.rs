//! Version capture: the content before and after each change of a regular file's bytes
//! goes to the content store ([`crate::store`]) under the SHA-256 the ledger records,
//! before the entry naming it is written, so every `content_hash` and
//! `prev_content_hash` can be turned back into bytes.
//!
//! Where the bytes come from: the filesystem already reads small files whole (up to
//! [`RANGE_LIMIT`], for line ranges and hashes): those bytes are stored as they are, with
//! the hash already computed. A larger file (up to `versions.max_file_size`) is stored
//! from the file itself, hashed while it is compressed when its hash is not known yet,
//! so it is read once either way.
//!
//! When a version is not kept (over the size cap, excluded by a glob, versions off, the
//! store failing), the entry naming its hash says so: `detail.version = {"kept": false,
//! "reason": ..., "hashes": [...]}`. [`Fs::note_versions`] is the last check before
//! every entry: a hash the store does not have and no capture explained is reported the
//! same way, never silently dangling.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::Mutex;

use super::stale::{untracked, RANGE_LIMIT};
use super::{hash, sys, FileHandle, Fs};
use crate::guard::stale::Stamp;
use crate::ledger::Draft;
use crate::store::{Store, EMPTY};

/// Most hashes remembered with why they were (not) kept before the map starts over.
const MAX_RECENT: usize = 50_000;
/// A version this daemon stored (or found present, refreshing its mtime) this recently is
/// not looked for again: the store's gc removes no object used within
/// [`crate::store::gc::GRACE`] (10 minutes), so it is still there. (An edit loop stores or
/// re-references the same few versions again and again: a `statx` and a `utimensat` each.)
const FRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// The store of one mount and what was decided about recent versions.
#[derive(Default)]
pub struct Versions {
    store: OnceLock<Arc<Store>>,
    /// `(dev, ino)` of the store directory: never shown through the mount.
    store_id: OnceLock<(u64, u64)>,
    /// Hashes this daemon stored (None) or decided not to keep (Some(why)), recently, and
    /// when.
    recent: Mutex<HashMap<String, (Option<String>, Instant)>>,
}

impl Versions {
    fn note(&self, hash: &str, why_not: Option<String>) {
        let mut m = self.recent.lock();
        if m.len() >= MAX_RECENT {
            m.clear();
        }
        m.insert(hash.to_owned(), (why_not, Instant::now()));
    }

    /// What was decided about `hash` lately: `Some(None)` stored (or present) within
    /// [`FRESH`], `Some(Some(why))` not kept and why; None when nothing is known.
    fn lately(&self, hash: &str) -> Option<Option<String>> {
        match self.recent.lock().get(hash) {
            Some((None, at)) if at.elapsed() < FRESH => Some(None),
            Some((Some(why), _)) => Some(Some(why.clone())),
            _ => None,
        }
    }

    /// Whether `hash` was stored (or found present) within [`FRESH`].
    fn kept_lately(&self, hash: &str) -> bool {
        matches!(self.lately(hash), Some(None))
    }
}

impl Fs {
    /// Keep versions in `store` from now on (the mount opens it before serving).
    pub fn set_store(&self, store: Arc<Store>) -> std::io::Result<()> {
        let st = std::fs::metadata(store.dir())?;
        use std::os::unix::fs::MetadataExt;
        let _ = self.versions.store_id.set((st.dev(), st.ino()));
        let _ = self.versions.store.set(store);
        Ok(())
    }

    /// The content store, when the mount keeps versions.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.versions.store.get()
    }

    /// Whether `st` is the store's directory (hidden from lookups and listings: the
    /// versions of every file, secrets included, must not be readable through the mount,
    /// nor the store writable). By inode, so no name, `..` or symlink reaches it.
    pub(crate) fn is_store_dir(&self, dev: u64, ino: u64) -> bool {
        self.versions.store_id.get() == Some(&(dev, ino))
    }

    /// The store directory's inode number (a listing compares it before a `stat`).
    pub(crate) fn store_ino(&self) -> Option<u64> {
        self.versions.store_id.get().map(|&(_, ino)| ino)
    }

    /// Why a version of `rel` (`size` bytes when known) is not kept, or None when it is.
    fn not_kept(&self, rel: &Path, size: Option<u64>) -> Option<String> {
        let rules = self.gate.guard.rules();
        if let Some(rule) = rules.policy.output_match(rel) {
            return Some(format!("build output ({rule})"));
        }
        rules.policy.versions().not_kept(rel, size)
    }

    /// Keep `bytes`, the whole content of `rel`, whose hash is `hash`.
    pub(crate) fn keep_bytes(&self, rel: &Path, bytes: &[u8], hash: &str) {
        let Some(store) = self.store() else { return };
        if hash == EMPTY || untracked(rel) {
            return;
        }
        if let Some(why) = self.not_kept(rel, Some(bytes.len() as u64)) {
            self.versions.note(hash, Some(why));
            return;
        }
        if self.versions.kept_lately(hash) {
            store.reused();
            return;
        }
        match store.put_bytes_hashed(bytes, hash) {
            Ok(_) => self.versions.note(hash, None),
            Err(e) => self.store_failed(rel, hash, &e),
        }
    }

    /// Keep the content of `f`, a regular file at `rel`, whose hash may be `known`:
    /// returns its hash (computed while storing when not known, or when `need_hash` asks
    /// for it even though the version is not kept) and the stamp the hash is valid for.
    /// None: no hash (not kept and not needed, or the file changed while it was read).
    pub(crate) fn keep_file(
        &self,
        rel: &Path,
        f: &File,
        known: Option<[u8; 32]>,
        need_hash: bool,
    ) -> Option<([u8; 32], Stamp)> {
        let st = sys::stat_fd(f.as_fd()).ok()?;
        let stamp = hash::stamp_of(&st);
        let known = known.or_else(|| self.hashes.cached(&stamp));
        let store = self.store().filter(|_| !untracked(rel));
        let why_not = store.and_then(|_| self.not_kept(rel, Some(stamp.size)));
        let (Some(store), None) = (store, &why_not) else {
            let h = match known {
                Some(h) => Some((h, stamp)),
                None if need_hash => self.hashes.hash(f).ok(),
                None => None,
            };
            if let (Some((h, _)), Some(why)) = (h, why_not) {
                self.versions.note(&hash::to_string(&h), Some(why));
            }
            return h;
        };
        match known {
            Some(h) => {
                let hs = hash::to_string(&h);
                if self.versions.kept_lately(&hs) {
                    store.reused();
                    return Some((h, stamp));
                }
                match store.put_file_counted(f, &hs) {
                    Ok(_) => self.versions.note(&hs, None),
                    Err(e) => self.store_failed(rel, &hs, &e),
                }
                Some((h, stamp))
            }
            None => match store.put_file_hashing(f) {
                Ok((hs, _)) => {
                    self.versions.note(&hs, None);
                    let after = hash::stamp_of(&sys::stat_fd(f.as_fd()).ok()?);
                    let h: [u8; 32] = hex::decode(&hs["sha256:".len()..]).ok()?.try_into().ok()?;
                    // The bytes stored are the file's at `stamp` only if it did not move.
                    if after != stamp {
                        return need_hash.then(|| self.hashes.hash(f).ok()).flatten();
                    }
                    self.hashes.insert(stamp, h);
                    Some((h, stamp))
                }
                Err(e) => {
                    tracing::warn!("content store: {}: {e}", rel.display());
                    let h = need_hash.then(|| self.hashes.hash(f).ok()).flatten()?;
                    self.store_failed(rel, &hash::to_string(&h.0), &e);
                    Some(h)
                }
            },
        }
    }

    fn store_failed(&self, rel: &Path, hash: &str, e: &std::io::Error) {
        tracing::warn!("content store: keeping {} ({hash}): {e}", rel.display());
        self.versions.note(
            hash,
            Some(format!("the content store could not keep it: {e}")),
        );
    }

    /// Keep the content of the regular file `f` at `rel` as it is now, before it changes
    /// (a truncate, an unlink of its last name, a rename over it): its hash, when known
    /// or kept. Small files are read once for both hash and store.
    pub(crate) fn keep_current(&self, rel: &Path, f: &File) -> Option<String> {
        let st = sys::stat_fd(f.as_fd()).ok()?;
        self.forget_if_mapped(&st);
        self.keep_known(rel, &st)
            .or_else(|| self.keep_read(rel, f, &st))
    }

    /// [`Fs::keep_current`] of the file `open` opens, whose stat (taken by the caller under
    /// its stale lock) is `st`: nothing is opened when its hash is known for that stamp (an
    /// `rm` of a file written through the mount).
    pub(crate) fn keep_current_at(
        &self,
        rel: &Path,
        st: &sys::Stat,
        open: impl FnOnce() -> Option<File>,
    ) -> Option<String> {
        self.store()?;
        // (`keep_known` trusts no remembered hash of a file that may be mapped;
        // `keep_current` forgets it before reading.)
        self.keep_known(rel, st).or_else(|| {
            let f = open()?;
            self.keep_current(rel, &f)
        })
    }

    /// A file that may be mapped writable ([`Fs::may_be_mapped`]): no hash remembered for
    /// its stamp is trusted, its bytes are read.
    fn forget_if_mapped(&self, st: &sys::Stat) {
        if self.may_be_mapped(st.st_dev, st.st_ino) {
            self.hashes.forget(st.st_dev, st.st_ino);
        }
    }

    /// The hash of the content of stamp `st` when it is known and its object is in the
    /// store (refreshed there): nothing to read.
    fn keep_known(&self, rel: &Path, st: &sys::Stat) -> Option<String> {
        let store = self.store()?;
        if self.may_be_mapped(st.st_dev, st.st_ino) {
            return None;
        }
        let h = self.hashes.cached(&hash::stamp_of(st))?;
        let hs = hash::to_string(&h);
        if untracked(rel) || self.not_kept(rel, Some(st.st_size as u64)).is_some() {
            return None;
        }
        // (Kept lately: not refreshed again, nor its time in the map, so the object's
        // mtime is never more than FRESH behind what the map trusts.)
        if self.versions.kept_lately(&hs) {
            return Some(hs);
        }
        store.touch(&hs).then(|| {
            self.versions.note(&hs, None);
            hs
        })
    }

    /// [`Fs::keep_current`] by reading `f` (of stat `st`).
    fn keep_read(&self, rel: &Path, f: &File, st: &sys::Stat) -> Option<String> {
        self.store()?;
        if st.st_size as u64 <= RANGE_LIMIT {
            let bytes = hash::read_small(f, RANGE_LIMIT)?;
            let stamp = hash::stamp_of(st);
            // (A file that may be mapped writable: its bytes are hashed, whatever was
            // remembered for the stamp.)
            let at = (stamp.size == bytes.len() as u64).then_some(stamp);
            let hs = hash::to_string(&self.hash_read(&bytes, at));
            self.keep_bytes(rel, &bytes, &hs);
            return Some(hs);
        }
        self.keep_file(rel, f, None, false)
            .map(|(h, _)| hash::to_string(&h))
    }

    /// The pre-image of a write handle, taken once, before its first change (the first
    /// write, a truncate through it, `fallocate`, `copy_file_range`; or at its open when
    /// writes bypass the daemon): kept in the store, its hash set as the handle's
    /// `prev_hash` (which its `WRITE_BEGIN` and `WRITE` name), and a small file's bytes
    /// kept in memory for the line ranges of its `WRITE`.
    pub(crate) fn keep_before(&self, h: &FileHandle) {
        let first = h
            .write_state()
            .is_some_and(|mut w| !std::mem::replace(&mut w.pre_captured, true));
        if !first {
            return;
        }
        let rel = self.display_rel(&h.node);
        if untracked(&rel) {
            return;
        }
        let Ok(fd) = self.fd(&h.node) else { return };
        let Ok(f) = sys::reopen_quiet(self.proc_fd.as_fd(), fd.as_fd()) else {
            return;
        };
        let Ok(st) = sys::stat_fd(f.as_fd()) else {
            return;
        };
        if let Some(bytes) = hash::read_small(&f, RANGE_LIMIT) {
            let stamp = hash::stamp_of(&st);
            let at = (stamp.size == bytes.len() as u64).then_some(stamp);
            let hs = hash::to_string(&self.hashes.of_bytes(at, &bytes));
            self.keep_bytes(&rel, &bytes, &hs);
            if let Some(mut w) = h.write_state() {
                if w.prev_hash.is_none() {
                    w.prev_hash = Some(hs);
                }
                w.pre_image = Some(bytes);
            }
            return;
        }
        let known = h
            .write_state()
            .and_then(|w| w.prev_hash.as_deref().and_then(parse_hash));
        if let Some((h32, _)) = self.keep_file(&rel, &f, known, false) {
            if let Some(mut w) = h.write_state() {
                if w.prev_hash.is_none() {
                    w.prev_hash = Some(hash::to_string(&h32));
                }
            }
        }
    }

    /// Before an entry is written: each content hash it names is in the store, or the
    /// entry says why not (`detail.version`). Nothing to say when the mount keeps no
    /// versions at all (no store).
    pub(crate) fn note_versions(&self, rel: &Path, draft: &mut Draft) {
        let Some(store) = self.store() else { return };
        if untracked(rel) {
            return;
        }
        let mut missing = Vec::new();
        let mut reasons: Vec<String> = Vec::new();
        let named = [
            (draft.content_hash.as_deref(), draft.size),
            (draft.prev_content_hash.as_deref(), None),
        ];
        for (h, size) in named {
            let Some(h) = h else { continue };
            if h == EMPTY || missing.iter().any(|m| m == h) {
                continue;
            }
            let why = match self.versions.lately(h) {
                // Stored (or found present) by this daemon just now: no need to look.
                Some(None) => continue,
                Some(Some(why)) => why,
                _ if store.has(h) => continue,
                _ => self
                    .not_kept(rel, size)
                    .unwrap_or_else(|| "not captured: the content changed or was replaced before the daemon could read it".into()),
            };
            missing.push(h.to_owned());
            if !reasons.contains(&why) {
                reasons.push(why);
            }
        }
        if missing.is_empty() {
            return;
        }
        let version = serde_json::json!({
            "kept": false,
            "reason": reasons.join("; "),
            "hashes": missing,
        });
        match draft.detail.as_mut().and_then(|d| d.as_object_mut()) {
            Some(m) => {
                m.insert("version".into(), version);
            }
            None => draft.detail = Some(serde_json::json!({ "version": version })),
        }
    }
}

/// `sha256:<hex>` -> the 32 bytes.
fn parse_hash(s: &str) -> Option<[u8; 32]> {
    hex::decode(s.strip_prefix("sha256:")?)
        .ok()?
        .try_into()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_trusted_kept_for_a_minute_and_a_refusal_until_told_otherwise() {
        let v = Versions::default();
        assert_eq!(v.lately("sha256:aa"), None);
        v.note("sha256:aa", None);
        assert!(v.kept_lately("sha256:aa"));
        v.note("sha256:bb", Some("over the size cap".into()));
        assert!(!v.kept_lately("sha256:bb"));
        assert_eq!(
            v.lately("sha256:bb"),
            Some(Some("over the size cap".into()))
        );
        // Stored longer ago than FRESH: looked up (and refreshed) again.
        let old = Instant::now()
            .checked_sub(FRESH + std::time::Duration::from_secs(1))
            .unwrap();
        v.recent.lock().insert("sha256:aa".into(), (None, old));
        assert!(!v.kept_lately("sha256:aa"));
        assert_eq!(v.lately("sha256:aa"), None);
    }
}
