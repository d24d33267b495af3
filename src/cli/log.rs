//! `intentfs log`: ledger entries filtered by intent, agent, path, time and type, as
//! an aligned table for people or a JSON array for scripts. Parsing the filters
//! (times like `10m` or RFC 3339) happens here; the query is [`crate::ledger::query`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Utc};

use crate::ledger::entry::{Entry, MutationType};
use crate::ledger::reader::Filter;

/// `intentfs log [WORKSPACE] [filters] [--json]`
#[derive(Debug, clap::Args)]
pub struct LogArgs {
    /// The workspace (default: the current directory).
    pub workspace: Option<PathBuf>,
    /// The ledger file (default: WORKSPACE/.orchestration/agent_trace.jsonl).
    #[arg(long, value_name = "FILE")]
    pub ledger: Option<PathBuf>,
    /// Only entries of this intent id.
    #[arg(long, value_name = "ID")]
    pub intent: Option<String>,
    /// Only entries by this agent (name or identity).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Only entries whose path (or rename source, or another name of the same file: a
    /// hard link) matches this glob, e.g. 'src/**/*.rs'.
    #[arg(long, value_name = "GLOB")]
    pub path: Option<String>,
    /// Only entries at or after TIME: RFC 3339 or relative (30s, 10m, 2h, 3d, 1w ago).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only entries at or before TIME: RFC 3339 or relative (30s, 10m, 2h, 3d, 1w ago).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only entries of this type (write, delete, rename, denial, approval, ...).
    #[arg(long = "type", value_name = "TYPE")]
    pub mutation_type: Option<String>,
    /// Print the matching entries as a JSON array.
    #[arg(long)]
    pub json: bool,
}

pub use super::time::parse_time;

/// Builds the query filter from the arguments (validated here, once).
pub fn filter_of(a: &LogArgs, now: DateTime<Utc>) -> anyhow::Result<Filter> {
    let path = match &a.path {
        Some(g) => Some(
            globset::GlobBuilder::new(g)
                .literal_separator(true)
                .build()
                .with_context(|| format!("invalid glob {g:?}"))?
                .compile_matcher(),
        ),
        None => None,
    };
    let mutation_type = match &a.mutation_type {
        Some(t) => Some(MutationType::parse(t).ok_or_else(|| {
            let names: Vec<&str> = MutationType::ALL.iter().map(|t| t.as_str()).collect();
            anyhow::anyhow!(
                "unknown type {t:?} (one of: {})",
                names.join(", ").to_lowercase()
            )
        })?),
        None => None,
    };
    Ok(Filter {
        intent: a.intent.clone(),
        agent: a.agent.clone(),
        path,
        since: a.since.as_deref().map(|s| parse_time(s, now)).transpose()?,
        until: a.until.as_deref().map(|s| parse_time(s, now)).transpose()?,
        mutation_type,
    })
}

/// The table rows: ledger line, time, type, intent, agent, path, outcome.
fn row((line, e): &(u64, Entry)) -> [String; 7] {
    // "2025-01-31T14:00:00.123456Z" -> "2025-01-31 14:00:00"
    let time = e
        .timestamp
        .get(..19)
        .unwrap_or(&e.timestamp)
        .replace('T', " ");
    let path = match (&e.from, &e.path) {
        (Some(f), Some(p)) => format!("{} -> {}", super::visible(f), super::visible(p)),
        (None, Some(p)) => super::visible(p),
        _ => "-".to_owned(),
    };
    let outcome = match &e.code {
        Some(c) => format!("{} ({c})", e.outcome),
        None => e.outcome.clone(),
    };
    [
        format!("#{line}"),
        time,
        e.mutation_type.as_str().to_owned(),
        e.intent_id
            .as_deref()
            .map_or_else(|| "-".to_owned(), super::visible),
        e.agent
            .as_ref()
            .map_or_else(|| "-".to_owned(), |a| super::visible(&a.name)),
        path,
        outcome,
    ]
}

/// Formats rows as a table with aligned columns (the last column is not padded). The `#`
/// column is the entry's ledger line: `intentfs diff #N` and `restore --to #N` take it.
pub fn table(entries: &[(u64, Entry)]) -> String {
    let header = [
        "#",
        "TIME (UTC)",
        "TYPE",
        "INTENT",
        "AGENT",
        "PATH",
        "OUTCOME",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 7]> = std::iter::once(header)
        .chain(entries.iter().map(row))
        .collect();
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                s.push_str(c);
            } else {
                s.push_str(c);
                s.extend(std::iter::repeat_n(' ', widths[i] - c.chars().count() + 2));
            }
        }
        s.push('\n');
    }
    s
}

/// Runs `intentfs log`.
pub fn run(a: LogArgs) -> anyhow::Result<ExitCode> {
    let filter = filter_of(&a, Utc::now())?;
    let (_, ledger, _) = super::ledger::resolve(a.workspace.clone(), a.ledger.clone())?;
    let entries: Vec<(u64, Entry)> = super::ledger::read_ledger(&ledger)?
        .into_iter()
        .filter(|(_, e)| filter.matches(e))
        .collect();
    let mut out = std::io::stdout().lock();
    if a.json {
        let plain: Vec<&Entry> = entries.iter().map(|(_, e)| e).collect();
        serde_json::to_writer_pretty(&mut out, &plain)?;
        writeln!(out)?;
    } else if entries.is_empty() {
        writeln!(out, "no matching entries")?;
    } else {
        out.write_all(table(&entries).as_bytes())?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_absolute_and_relative() {
        let now = DateTime::parse_from_rfc3339("2025-01-31T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_time("10m", now).unwrap().to_rfc3339(),
            "2025-01-31T11:50:00+00:00"
        );
        assert_eq!(
            parse_time("2h", now).unwrap().to_rfc3339(),
            "2025-01-31T10:00:00+00:00"
        );
        assert_eq!(
            parse_time("3d", now).unwrap().to_rfc3339(),
            "2025-01-28T12:00:00+00:00"
        );
        assert_eq!(
            parse_time("2025-01-01T01:00:00+01:00", now)
                .unwrap()
                .to_rfc3339(),
            "2025-01-01T00:00:00+00:00"
        );
        for bad in ["", "m", "10x", "yesterday", "-3d"] {
            assert!(parse_time(bad, now).is_err(), "{bad:?} accepted");
        }
    }
}
