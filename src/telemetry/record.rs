//! One ledger entry as one OpenTelemetry log record: the body is a one-line summary, the
//! attributes are the entry's fields, the timestamp is the entry's. Pure: an entry in, the
//! record's parts out (the SDK record is filled in `mod.rs`).
//!
//! Attribute names follow the semantic conventions where one fits (`file.path`,
//! `process.pid`, `process.executable.name`, `process.user.id`, `vcs.ref.head.revision`)
//! and are under `intentfs.` otherwise; docs/telemetry.md lists them.

use std::time::SystemTime;

use opentelemetry::logs::{AnyValue, Severity};

use crate::ledger::entry::Entry;
use crate::ledger::reader::outcome_failed;

/// The record's event name (`LogRecord.event_name`): every ledger entry has it.
pub const EVENT_NAME: &str = "intentfs.ledger.entry";

/// What a log record made of one entry holds, before it goes into an SDK record.
#[derive(Debug, Clone, PartialEq)]
pub struct Parts {
    /// When the entry was written (None when its timestamp does not parse).
    pub timestamp: Option<SystemTime>,
    pub severity: Severity,
    pub severity_text: &'static str,
    /// The one-line summary.
    pub body: String,
    pub attributes: Vec<(&'static str, AnyValue)>,
}

/// The one-line summary of an entry: `WRITE src/a.rs by claude (intent INT-001): ok`.
pub fn summary(e: &Entry) -> String {
    let mut s = e.mutation_type.as_str().to_owned();
    match (&e.from, &e.path) {
        (Some(f), Some(p)) => s.push_str(&format!(" {f} -> {p}")),
        (None, Some(p)) => s.push_str(&format!(" {p}")),
        _ => {}
    }
    if let Some(a) = &e.agent {
        s.push_str(&format!(" by {}", a.name));
    }
    if let Some(i) = &e.intent_id {
        s.push_str(&format!(" (intent {i})"));
    }
    s.push_str(&format!(": {}", e.outcome));
    if let Some(c) = &e.code {
        s.push_str(&format!(" ({c})"));
    }
    s
}

/// The record for the entry on ledger line `seq` (1-based).
pub fn parts(seq: u64, e: &Entry) -> Parts {
    let timestamp = chrono::DateTime::parse_from_rfc3339(&e.timestamp)
        .ok()
        .map(SystemTime::from);
    // A refusal is what an operator watches for: WARN; everything else is INFO.
    let (severity, severity_text) = if outcome_failed(&e.outcome) {
        (Severity::Warn, "WARN")
    } else {
        (Severity::Info, "INFO")
    };
    let mut a: Vec<(&'static str, AnyValue)> = vec![
        ("intentfs.ledger.seq", AnyValue::Int(seq as i64)),
        ("intentfs.entry.id", e.id.clone().into()),
        ("intentfs.mutation.type", e.mutation_type.as_str().into()),
        ("intentfs.outcome", e.outcome.clone().into()),
    ];
    let mut opt = |k: &'static str, v: Option<AnyValue>| {
        if let Some(v) = v {
            a.push((k, v));
        }
    };
    opt("intentfs.intent.id", e.intent_id.clone().map(Into::into));
    if let Some(ag) = &e.agent {
        opt("intentfs.agent.name", Some(ag.name.clone().into()));
        opt("intentfs.agent.identity", Some(ag.identity.clone().into()));
        opt("process.pid", Some(AnyValue::Int(i64::from(ag.pid))));
        opt("process.user.id", Some(AnyValue::Int(i64::from(ag.uid))));
        opt("process.executable.name", Some(ag.process.clone().into()));
    }
    opt(
        "intentfs.mutation.class",
        e.mutation_class.map(|c| c.as_str().into()),
    );
    opt("file.path", e.path.clone().map(Into::into));
    opt("intentfs.path_b64", e.path_b64.clone().map(Into::into));
    opt("intentfs.from", e.from.clone().map(Into::into));
    opt("intentfs.from_b64", e.from_b64.clone().map(Into::into));
    opt("intentfs.code", e.code.clone().map(Into::into));
    opt("intentfs.rule", e.rule.clone().map(Into::into));
    opt(
        "intentfs.content_hash",
        e.content_hash.clone().map(Into::into),
    );
    opt(
        "intentfs.prev_content_hash",
        e.prev_content_hash.clone().map(Into::into),
    );
    opt(
        "intentfs.size",
        e.size
            .map(|s| AnyValue::Int(i64::try_from(s).unwrap_or(i64::MAX))),
    );
    if e.created {
        opt("intentfs.created", Some(AnyValue::Boolean(true)));
    }
    // `3-5,9-9`: the changed line ranges of the new version, as the ledger has them.
    opt(
        "intentfs.ranges",
        e.ranges.as_ref().map(|rs| {
            rs.iter()
                .map(|r| format!("{}-{}", r.start_line, r.end_line))
                .collect::<Vec<_>>()
                .join(",")
                .into()
        }),
    );
    opt(
        "vcs.ref.head.revision",
        e.vcs.as_ref().map(|v| v.revision.clone().into()),
    );
    opt(
        "intentfs.detail",
        e.detail
            .as_ref()
            .map(|d| serde_json::to_string(d).unwrap_or_default().into()),
    );
    opt("intentfs.ledger.prev", Some(e.prev.clone().into()));
    Parts {
        timestamp,
        severity,
        severity_text,
        body: summary(e),
        attributes: a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::{Agent, LineRange, MutationType};

    fn entry() -> Entry {
        Entry {
            id: "11111111-2222-4333-8444-555555555555".into(),
            timestamp: "2026-01-31T14:00:00.123456Z".into(),
            intent_id: Some("INT-001".into()),
            agent: Some(Agent {
                name: "claude".into(),
                identity: "s1".into(),
                pid: 42,
                uid: 1000,
                process: "sed".into(),
            }),
            mutation_type: MutationType::Write,
            mutation_class: None,
            path: Some("src/a.rs".into()),
            path_b64: None,
            from: None,
            from_b64: None,
            content_hash: Some("sha256:ab".into()),
            prev_content_hash: None,
            size: Some(7),
            created: false,
            ranges: Some(vec![
                LineRange {
                    start_line: 3,
                    end_line: 5,
                },
                LineRange {
                    start_line: 9,
                    end_line: 9,
                },
            ]),
            vcs: None,
            outcome: "ok".into(),
            code: None,
            rule: None,
            detail: None,
            prev: "00".into(),
        }
    }

    #[test]
    fn summary_and_attributes() {
        let mut e = entry();
        let p = parts(7, &e);
        assert_eq!(p.body, "WRITE src/a.rs by claude (intent INT-001): ok");
        assert_eq!(p.severity, Severity::Info);
        let get = |p: &Parts, k: &str| p.attributes.iter().find(|(n, _)| *n == k).cloned();
        assert_eq!(get(&p, "intentfs.ledger.seq").unwrap().1, AnyValue::Int(7));
        assert_eq!(
            get(&p, "intentfs.ranges").unwrap().1,
            AnyValue::from("3-5,9-9")
        );
        assert_eq!(get(&p, "process.pid").unwrap().1, AnyValue::Int(42));
        assert!(get(&p, "intentfs.code").is_none());
        assert_eq!(
            p.timestamp.unwrap(),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_769_868_000_123_456)
        );

        e.mutation_type = MutationType::Denial;
        e.outcome = "denied".into();
        e.code = Some("SCOPE_VIOLATION".into());
        e.from = Some("x".into());
        let p = parts(8, &e);
        assert_eq!(
            p.body,
            "DENIAL x -> src/a.rs by claude (intent INT-001): denied (SCOPE_VIOLATION)"
        );
        assert_eq!(p.severity, Severity::Warn);
        assert_eq!(
            get(&p, "intentfs.code").unwrap().1,
            AnyValue::from("SCOPE_VIOLATION")
        );
    }
}
