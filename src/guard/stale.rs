//! Stale-write judgment: has a file changed since this identity last saw it?
//!
//! Pure: the caller supplies the file's stamp now and, only when the stamps differ, a way to
//! hash its content now. An unchanged stamp is never hashed (the common case costs one
//! comparison); a changed stamp with the same content (`touch`, a formatter that changed
//! nothing) is not stale.

/// What identifies a version of a file cheaply: device, inode, size, mtime, ctime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

/// What an identity saw of a file: the stamp and the SHA-256 of the content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub stamp: Stamp,
    pub hash: [u8; 32],
}

/// The judgment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead. `Some(seen)` refreshes what the identity saw (same content, new stamp).
    Fresh(Option<Seen>),
    /// The content changed since the identity saw it.
    Stale { seen: [u8; 32], now: [u8; 32] },
    /// `--require-read`: the identity never read this existing file.
    Unread,
}

/// Judge a mutation of an existing file whose stamp is `now`.
pub fn judge(
    seen: Option<&Seen>,
    now: Stamp,
    require_read: bool,
    hash_now: impl FnOnce() -> Option<[u8; 32]>,
) -> Verdict {
    judge_by(seen, now, require_read, true, hash_now)
}

/// [`judge`], with `trust_stamp` false when the stamp vouches for nothing: a write through
/// a page already mapped writable changes the bytes and leaves the stamp as it was, so
/// while such a mapping may exist the content is hashed even when the stamp is the one
/// seen.
pub fn judge_by(
    seen: Option<&Seen>,
    now: Stamp,
    require_read: bool,
    trust_stamp: bool,
    hash_now: impl FnOnce() -> Option<[u8; 32]>,
) -> Verdict {
    let Some(seen) = seen else {
        return if require_read {
            Verdict::Unread
        } else {
            Verdict::Fresh(None)
        };
    };
    if trust_stamp && seen.stamp == now {
        return Verdict::Fresh(None);
    }
    match hash_now() {
        Some(h) if h == seen.hash => Verdict::Fresh(Some(Seen {
            stamp: now,
            hash: h,
        })),
        Some(h) => Verdict::Stale {
            seen: seen.hash,
            now: h,
        },
        // The file cannot be read to compare: refuse rather than risk a lost update.
        None => Verdict::Stale {
            seen: seen.hash,
            now: [0; 32],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(size: u64, mtime: i64) -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            size,
            mtime: (mtime, 0),
            ctime: (mtime, 0),
        }
    }

    #[test]
    fn table() {
        let a = [1u8; 32];
        let b = [2u8; 32];
        let seen = Seen {
            stamp: stamp(10, 100),
            hash: a,
        };
        // (seen, now, require_read, hash now, expected)
        type Case = (Option<Seen>, Stamp, bool, Option<[u8; 32]>, Verdict);
        let cases: Vec<Case> = vec![
            (None, stamp(10, 100), false, None, Verdict::Fresh(None)),
            (None, stamp(10, 100), true, None, Verdict::Unread),
            (Some(seen), stamp(10, 100), true, None, Verdict::Fresh(None)),
            (
                Some(seen),
                stamp(10, 200),
                false,
                Some(a),
                Verdict::Fresh(Some(Seen {
                    stamp: stamp(10, 200),
                    hash: a,
                })),
            ),
            (
                Some(seen),
                stamp(11, 200),
                false,
                Some(b),
                Verdict::Stale { seen: a, now: b },
            ),
            (
                Some(seen),
                stamp(11, 200),
                false,
                None,
                Verdict::Stale {
                    seen: a,
                    now: [0; 32],
                },
            ),
        ];
        for (i, (s, now, rr, h, want)) in cases.into_iter().enumerate() {
            assert_eq!(judge(s.as_ref(), now, rr, || h), want, "case {i}");
        }
    }

    #[test]
    fn unchanged_stamp_never_hashes() {
        let seen = Seen {
            stamp: stamp(1, 1),
            hash: [0; 32],
        };
        let v = judge(Some(&seen), stamp(1, 1), false, || {
            panic!("hashed an unchanged file")
        });
        assert_eq!(v, Verdict::Fresh(None));
    }

    #[test]
    fn an_untrusted_stamp_is_hashed_and_judged_by_its_bytes() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let seen = Seen {
            stamp: stamp(1, 1),
            hash: a,
        };
        // Same stamp, other bytes (a write through a page mapped writable): stale.
        assert_eq!(
            judge_by(Some(&seen), stamp(1, 1), false, false, || Some(b)),
            Verdict::Stale { seen: a, now: b }
        );
        // Same stamp, same bytes: fresh (the view is refreshed with the same stamp).
        assert_eq!(
            judge_by(Some(&seen), stamp(1, 1), false, false, || Some(a)),
            Verdict::Fresh(Some(seen))
        );
    }
}
