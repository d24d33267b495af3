use super::*;

/// What fuser 0.18 hands SETATTR for the kernel's `(sec, nsec)` (its
/// `system_time_from_time`, private to it): before the epoch it subtracts the
/// nanoseconds instead of adding them.
fn fuser_decoded(sec: i64, nsec: u32) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), nsec)
    }
}

fn set(sec: i64, nsec: u32) -> (i64, i64) {
    let t = timespec(Some(TimeOrNow::SpecificTime(fuser_decoded(sec, nsec))));
    t.flatten().expect("a specific time")
}

#[test]
fn setattr_times_reach_utimensat_as_the_kernel_sent_them() {
    for (s, ns) in [
        (0, 0),
        (1, 999_999_999),
        (1_700_000_000, 123_456_789),
        (-1, 0),
        (-1, 1),
        (-2, 500_000_000),
        (-3, 999_999_999),
        (i64::MIN + 1, 5),
        (i64::MAX, 999_999_999),
    ] {
        assert_eq!(set(s, ns), (s, ns.into()), "({s}, {ns})");
    }
    assert_eq!(timespec(Some(TimeOrNow::Now)), Some(None));
    assert_eq!(timespec(None), None);
}

#[test]
fn stat_times_before_the_epoch_keep_their_fraction() {
    assert_eq!(
        time(-2, 500_000_000),
        UNIX_EPOCH - Duration::from_millis(1500)
    );
    assert_eq!(time(-1, 1), UNIX_EPOCH - Duration::new(0, 999_999_999));
    assert_eq!(time(-1, 0), UNIX_EPOCH - Duration::from_secs(1));
    assert_eq!(time(0, 0), UNIX_EPOCH);
    assert_eq!(
        time(1_700_000_000, 123_456_789),
        UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789)
    );
}

#[test]
fn stat_times_at_the_ends_of_the_range_do_not_panic() {
    // tmpfs keeps `i64::MIN` seconds: its negation overflows an i64.
    assert_eq!(
        time(i64::MIN, 0),
        UNIX_EPOCH - Duration::from_secs(i64::MAX as u64 + 1)
    );
    assert_eq!(
        time(i64::MIN, 500_000_000),
        UNIX_EPOCH - Duration::new(i64::MAX as u64, 500_000_000)
    );
    assert_eq!(
        time(i64::MAX, 999_999_999),
        UNIX_EPOCH + Duration::new(i64::MAX as u64, 999_999_999)
    );
    // Nanoseconds out of 0..1e9 (never from the kernel) are clamped, not a panic.
    assert_eq!(time(0, -5), UNIX_EPOCH);
    assert_eq!(
        time(0, i64::MAX),
        UNIX_EPOCH + Duration::new(0, 999_999_999)
    );
}

#[test]
fn failures_are_classed_for_the_log() {
    for e in [
        libc::ENOENT,
        libc::EACCES,
        libc::ENOTTY,
        libc::ENODATA,
        libc::ENOSYS,
    ] {
        assert_eq!(failure(e), Failure::Answer, "{e}");
    }
    for e in [libc::EIO, libc::ENOSPC, libc::EROFS, libc::EDQUOT] {
        assert_eq!(failure(e), Failure::Trouble, "{e}");
    }
    assert_eq!(failure(libc::EPIPE), Failure::Unexpected);
}
