//! Times on the command line (`--since`, `--until`): RFC 3339, or relative (`10m`, `2h`).

use chrono::{DateTime, Duration, Utc};

/// Parses `--since`/`--until`: RFC 3339, or `N` followed by s, m, h, d or w meaning
/// that long before `now`.
pub fn parse_time(s: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    let t = s.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(t) {
        return Ok(dt.with_timezone(&Utc));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: i64 = num.parse().map_err(|_| bad_time(s))?;
    let d = match unit {
        "s" => Duration::try_seconds(n),
        "m" => Duration::try_minutes(n),
        "h" => Duration::try_hours(n),
        "d" => Duration::try_days(n),
        "w" => Duration::try_weeks(n),
        _ => None,
    };
    d.and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| bad_time(s))
}

fn bad_time(s: &str) -> anyhow::Error {
    anyhow::anyhow!("invalid time {s:?} (use RFC 3339 like 2025-01-31T14:00:00Z, or a relative time like 10m, 2h, 3d)")
}
