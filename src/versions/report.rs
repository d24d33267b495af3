//! The audit report: for a person reviewing a session afterwards, everything the ledger and
//! the store say in one place — a timeline per identity and per intent, every file changed
//! with its diff, refusals, approvals and who decided them, lessons, restores, and whether
//! the chain verifies. [`build`] gathers it (the `--json` form); [`html`] renders one
//! self-contained page: inline CSS and a few lines of inline JavaScript (a filter box), no
//! external asset, no server.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::diff::{of_selection, FileDiff};
use super::history::is_change;
use crate::ledger::entry::{Entry, MutationType};
use crate::ledger::reader::{Drift, Filter, Finding};
use crate::store::Store;

/// One entry as the report lists it.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub line: u64,
    pub id: String,
    pub timestamp: String,
    pub mutation_type: MutationType,
    pub agent: String,
    pub identity: String,
    pub intent: Option<String>,
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

impl Row {
    fn of(line: u64, e: &Entry) -> Row {
        Row {
            line,
            id: e.id.clone(),
            timestamp: e.timestamp.clone(),
            mutation_type: e.mutation_type,
            agent: e
                .agent
                .as_ref()
                .map(|a| a.name.clone())
                .unwrap_or_else(|| "-".into()),
            identity: e
                .agent
                .as_ref()
                .map(|a| a.identity.clone())
                .unwrap_or_else(|| "-".into()),
            intent: e.intent_id.clone(),
            path: e.path.clone(),
            from: e.from.clone(),
            outcome: e.outcome.clone(),
            code: e.code.clone(),
            rule: e.rule.clone(),
            detail: e.detail.clone(),
        }
    }

    fn detail_str(&self, k: &str) -> Option<&str> {
        self.detail.as_ref()?.get(k)?.as_str()
    }
}

/// The entries of one identity or one intent, in ledger order.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    /// The identity key (`run:123`, `default`, `operator`) or the intent id.
    pub key: String,
    /// The agent names seen under it.
    pub names: Vec<String>,
    /// Changes, refusals, approvals... (not the ledger's own housekeeping).
    pub entries: Vec<Row>,
}

/// The chain's verification and the files changed outside the mount.
#[derive(Clone, Debug, Serialize)]
pub struct Verification {
    pub intact: bool,
    pub entries: u64,
    pub findings: Vec<Finding>,
    pub drift: Vec<Drift>,
}

/// Everything the page shows.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub workspace: String,
    pub ledger: String,
    pub generated: String,
    pub first: Option<String>,
    pub last: Option<String>,
    pub verification: Verification,
    pub identities: Vec<Group>,
    pub intents: Vec<Group>,
    pub files: Vec<FileDiff>,
    pub refusals: Vec<Row>,
    pub approvals: Vec<Row>,
    pub lessons: Vec<Row>,
    pub restores: Vec<Row>,
}

/// Whether an entry is worth a line of a timeline (not a WRITE_BEGIN, whose WRITE follows).
fn shown(e: &Entry) -> bool {
    e.mutation_type != MutationType::WriteBegin
}

/// Gathers the report of a workspace's ledger.
pub fn build(
    workspace: &Path,
    ledger: &Path,
    entries: &[(u64, Entry)],
    verification: Verification,
    store: Option<&Store>,
) -> Report {
    let mut by_ident: BTreeMap<String, Group> = BTreeMap::new();
    let mut by_intent: BTreeMap<String, Group> = BTreeMap::new();
    let (mut refusals, mut approvals, mut lessons, mut restores) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (line, e) in entries {
        if !shown(e) {
            continue;
        }
        let row = Row::of(*line, e);
        match e.mutation_type {
            MutationType::Denial => refusals.push(row.clone()),
            MutationType::Approval => approvals.push(row.clone()),
            MutationType::Lesson => lessons.push(row.clone()),
            _ => {}
        }
        if e.detail
            .as_ref()
            .is_some_and(|d| d.get("restore").is_some())
        {
            restores.push(row.clone());
        }
        if matches!(
            e.mutation_type,
            MutationType::Mount | MutationType::Unmount | MutationType::LedgerRepair
        ) {
            continue;
        }
        if e.agent.is_some() {
            let g = by_ident
                .entry(row.identity.clone())
                .or_insert_with(|| Group {
                    key: row.identity.clone(),
                    names: Vec::new(),
                    entries: Vec::new(),
                });
            if !g.names.contains(&row.agent) {
                g.names.push(row.agent.clone());
            }
            g.entries.push(row.clone());
        }
        if let Some(i) = &e.intent_id {
            let g = by_intent.entry(i.clone()).or_insert_with(|| Group {
                key: i.clone(),
                names: Vec::new(),
                entries: Vec::new(),
            });
            if !g.names.contains(&row.agent) {
                g.names.push(row.agent.clone());
            }
            g.entries.push(row);
        }
    }
    let changes = entries.iter().filter(|(_, e)| is_change(e));
    let files = of_selection(entries, &Filter::default(), store);
    Report {
        workspace: workspace.display().to_string(),
        ledger: ledger.display().to_string(),
        generated: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        first: changes.clone().next().map(|(_, e)| e.timestamp.clone()),
        last: changes
            .clone()
            .next_back()
            .map(|(_, e)| e.timestamp.clone()),
        verification,
        identities: by_ident.into_values().collect(),
        intents: by_intent.into_values().collect(),
        files,
        refusals,
        approvals,
        lessons,
        restores,
    }
}

/// HTML-escapes text.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

const CSS: &str = "
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header .meta{opacity:.8;font-size:13px}main{padding:12px 28px 40px;max-width:1300px}
section{background:#fff;border:1px solid #dde1e6;border-radius:8px;margin:16px 0;padding:12px 18px}
h2{font-size:17px;margin:6px 0 10px}h3{font-size:15px;margin:12px 0 6px}
.badge{display:inline-block;padding:2px 9px;border-radius:10px;font-weight:600;font-size:12px}
.ok{background:#d5f5df;color:#11632d}.bad{background:#fde0e0;color:#8d1a1a}.warn{background:#fff1cc;color:#7a5300}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{background:#f0f2f5;position:sticky;top:0}td.mono,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
tr.denied td,tr.rejected td,tr.timeout td,tr.tripped td{background:#fff5f5}
pre.diff{background:#fbfbfc;border:1px solid #e4e7eb;padding:8px;overflow:auto;font-size:12px;margin:6px 0}
pre.diff span{display:block;white-space:pre}.add{background:#e6ffec}.del{background:#ffebe9}.hunk{color:#6639ba}.hdr{color:#57606a}
details{margin:4px 0}summary{cursor:pointer}.counts span{margin-right:18px}
#filter{width:320px;padding:5px 8px;border:1px solid #c9ced6;border-radius:6px}.hidden{display:none}
";

const JS: &str = "
(function(){
  var box=document.getElementById('filter');
  function apply(){
    var q=box.value.toLowerCase();
    var rows=document.querySelectorAll('tr[data-row]');
    for(var i=0;i<rows.length;i++){
      var r=rows[i];
      r.classList.toggle('hidden', q!=='' && r.textContent.toLowerCase().indexOf(q)<0);
    }
  }
  box.addEventListener('input',apply);
  document.body.setAttribute('data-ready','1');
})();
";

fn rows_table(out: &mut String, rows: &[Row], with_who: bool) {
    out.push_str("<table><thead><tr><th>#</th><th>time (UTC)</th><th>type</th>");
    if with_who {
        out.push_str("<th>agent</th><th>intent</th>");
    }
    out.push_str("<th>path</th><th>outcome</th><th>detail</th></tr></thead><tbody>\n");
    for r in rows {
        let path = match (&r.from, &r.path) {
            (Some(f), Some(p)) => format!("{f} → {p}"),
            (None, Some(p)) => p.clone(),
            _ => "-".into(),
        };
        let outcome = match &r.code {
            Some(c) => format!("{} ({c})", r.outcome),
            None => r.outcome.clone(),
        };
        let mut detail = String::new();
        if let Some(by) = r.detail_str("decided_by") {
            let _ = write!(detail, "decided by {by}");
        }
        if let Some(rule) = &r.rule {
            if !detail.is_empty() {
                detail.push_str("; ");
            }
            let _ = write!(detail, "rule: {rule}");
        }
        if let Some(rs) = r.detail.as_ref().and_then(|d| d.get("restore")) {
            let _ = write!(
                detail,
                "{} of entry #{}",
                rs.get("command")
                    .and_then(|c| c.as_str())
                    .unwrap_or("restore"),
                rs.get("line").and_then(|l| l.as_u64()).unwrap_or(0)
            );
        }
        if r.mutation_type == MutationType::Lesson {
            if let Some(c) = r.detail_str("command") {
                let _ = write!(detail, "`{c}` failed");
            }
        }
        let _ = write!(
            out,
            "<tr data-row class=\"{}\"><td class=mono>#{}</td><td class=mono>{}</td><td>{}</td>",
            esc(&r.outcome),
            r.line,
            esc(r.timestamp.get(..19).unwrap_or(&r.timestamp)).replace('T', " "),
            r.mutation_type.as_str()
        );
        if with_who {
            let _ = write!(
                out,
                "<td>{}</td><td>{}</td>",
                esc(&r.agent),
                esc(r.intent.as_deref().unwrap_or("-"))
            );
        }
        let _ = writeln!(
            out,
            "<td class=mono>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&path),
            esc(&outcome),
            esc(&detail)
        );
    }
    out.push_str("</tbody></table>\n");
}

fn diff_block(out: &mut String, d: &FileDiff) {
    let name = match &d.from_path {
        Some(f) => format!("{f} → {}", d.path),
        None => d.path.clone(),
    };
    let what = if d.missing.is_some() {
        "not shown".to_owned()
    } else if d.binary {
        "binary".to_owned()
    } else if d.before.is_none() {
        format!("new, +{}", d.added)
    } else if d.after.is_none() {
        format!("deleted, −{}", d.removed)
    } else {
        format!("+{} −{}", d.added, d.removed)
    };
    let who: Vec<String> = d
        .entries
        .iter()
        .map(|e| format!("#{} {} by {}", e.line, e.mutation_type.as_str(), e.agent))
        .collect();
    let _ = write!(
        out,
        "<details class=file data-path=\"{}\"><summary><span class=mono>{}</span> <span class=badge>{}</span> <small>{}</small></summary>",
        esc(&d.path),
        esc(&name),
        esc(&what),
        esc(&who.join(", "))
    );
    if let Some(m) = &d.missing {
        let _ = write!(out, "<p class=\"badge warn\">{}</p>", esc(m));
    } else if let Some(text) = &d.diff {
        out.push_str("<pre class=diff>");
        for l in text.lines() {
            let class = if l.starts_with("+++") || l.starts_with("---") {
                "hdr"
            } else if l.starts_with('+') {
                "add"
            } else if l.starts_with('-') {
                "del"
            } else if l.starts_with("@@") {
                "hunk"
            } else {
                "ctx"
            };
            let _ = write!(out, "<span class={class}>{}</span>", esc(l));
        }
        out.push_str("</pre>");
    } else if d.binary {
        out.push_str("<p>Binary content differs.</p>");
    } else {
        out.push_str("<p>Content unchanged.</p>");
    }
    out.push_str("</details>\n");
}

/// The report as one self-contained HTML page.
pub fn html(r: &Report) -> String {
    let mut o = String::new();
    let v = &r.verification;
    let chain = if v.intact {
        "<span class=\"badge ok\">chain intact</span>".to_owned()
    } else {
        format!(
            "<span class=\"badge bad\">chain broken: {} finding(s)</span>",
            v.findings.len()
        )
    };
    let drift = if v.drift.is_empty() {
        "<span class=\"badge ok\">no change outside the mount</span>".to_owned()
    } else {
        format!(
            "<span class=\"badge warn\">{} file(s) changed outside the mount</span>",
            v.drift.len()
        )
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">\
         <title>intentfs audit report: {}</title><style>{CSS}</style></head><body>\n\
         <header><h1>intentfs audit report</h1><div class=meta>workspace <b class=mono>{}</b> · ledger <span class=mono>{}</span> · \
         from {} to {} · generated {}</div></header><main>\n",
        esc(&r.workspace),
        esc(&r.workspace),
        esc(&r.ledger),
        esc(r.first.as_deref().unwrap_or("-")),
        esc(r.last.as_deref().unwrap_or("-")),
        esc(&r.generated)
    );
    let _ = write!(
        o,
        "<section id=verification><h2>Verification</h2><p>{chain} {drift} <span class=mono>{} entries</span></p>",
        v.entries
    );
    if !v.findings.is_empty() {
        o.push_str("<ul>");
        for f in &v.findings {
            let _ = write!(o, "<li class=mono>{}</li>", esc(&f.message));
        }
        o.push_str("</ul>");
    }
    if !v.drift.is_empty() {
        o.push_str("<ul>");
        for d in &v.drift {
            let _ = write!(
                o,
                "<li class=mono>{} (last recorded on line {})</li>",
                esc(&d.path),
                d.line
            );
        }
        o.push_str("</ul>");
    }
    let _ = write!(
        o,
        "<p class=counts><span>{} identit(ies)</span><span>{} intent(s)</span><span>{} file(s) changed</span>\
         <span>{} refusal(s)</span><span>{} approval decision(s)</span><span>{} lesson(s)</span><span>{} restore step(s)</span></p>\
         <p><input id=filter type=search placeholder=\"filter the tables (agent, path, type...)\" aria-label=filter></p></section>",
        r.identities.len(),
        r.intents.len(),
        r.files.len(),
        r.refusals.len(),
        r.approvals.len(),
        r.lessons.len(),
        r.restores.len()
    );
    o.push_str("\n<section id=identities><h2>Timeline by identity</h2>\n");
    for g in &r.identities {
        let _ = write!(
            o,
            "<details open><summary><b>{}</b> <span class=mono>{}</span> — {} entr(ies)</summary>",
            esc(&g.names.join(", ")),
            esc(&g.key),
            g.entries.len()
        );
        rows_table(&mut o, &g.entries, false);
        o.push_str("</details>\n");
    }
    o.push_str("</section>\n<section id=intents><h2>Timeline by intent</h2>\n");
    for g in &r.intents {
        let _ = write!(
            o,
            "<details><summary><b>{}</b> — by {} — {} entr(ies)</summary>",
            esc(&g.key),
            esc(&g.names.join(", ")),
            g.entries.len()
        );
        rows_table(&mut o, &g.entries, true);
        o.push_str("</details>\n");
    }
    o.push_str("</section>\n<section id=files><h2>Files changed</h2>\n");
    if r.files.is_empty() {
        o.push_str("<p>No file content changed.</p>");
    }
    for d in &r.files {
        diff_block(&mut o, d);
    }
    o.push_str("</section>\n");
    for (id, title, rows, none) in [
        ("refusals", "Refusals", &r.refusals, "Nothing was refused."),
        (
            "approvals",
            "Approvals and their deciders",
            &r.approvals,
            "No approval was asked.",
        ),
        ("lessons", "Lessons", &r.lessons, "No lesson was recorded."),
        (
            "restores",
            "Restores and rewinds",
            &r.restores,
            "Nothing was restored.",
        ),
    ] {
        let _ = write!(o, "<section id={id}><h2>{title}</h2>");
        if rows.is_empty() {
            let _ = write!(o, "<p>{none}</p>");
        } else {
            rows_table(&mut o, rows, true);
        }
        o.push_str("</section>\n");
    }
    let _ = writeln!(o, "</main><script>{JS}</script></body></html>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_escapes_what_agents_wrote() {
        assert_eq!(esc("<script>&\"'"), "&lt;script&gt;&amp;&quot;&#39;");
        let r = Report {
            workspace: "/ws".into(),
            ledger: "/ws/l".into(),
            generated: "now".into(),
            first: None,
            last: None,
            verification: Verification {
                intact: true,
                entries: 0,
                findings: vec![],
                drift: vec![],
            },
            identities: vec![],
            intents: vec![],
            files: vec![FileDiff {
                path: "<img src=x onerror=alert(1)>".into(),
                from_path: None,
                entries: vec![],
                before: None,
                after: Some("h".into()),
                added: 1,
                removed: 0,
                binary: false,
                missing: None,
                diff: Some(
                    "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+</pre><script>alert(1)</script>\n"
                        .into(),
                ),
            }],
            refusals: vec![],
            approvals: vec![],
            lessons: vec![],
            restores: vec![],
        };
        let page = html(&r);
        assert!(!page.contains("<img src=x"), "{page}");
        assert!(!page.contains("<script>alert"), "{page}");
        assert_eq!(
            page.matches("<script>").count(),
            1,
            "only the page's own script"
        );
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no external asset"
        );
    }
}
