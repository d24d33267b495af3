//! Telemetry out: the ledger as OpenTelemetry logs over OTLP/HTTP, received by a real OTLP
//! receiver on loopback (an HTTP listener decoding each request with the official protos,
//! `opentelemetry-proto`), from the live daemon (a real mount, an agent's shell writing
//! files) and from `intentfs ledger export --otlp`; and a collector that never answers: the
//! mount keeps its pace and the records it could not send are counted in `.intentfs/status`
//! and the daemon log.

// Tests panic on what they did not expect: that is how they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message;
use serde_json::Value;

// ----- the receiver ---------------------------------------------------------------------

/// One log record as the receiver decoded it, with its resource and scope.
#[derive(Debug, Clone)]
struct Got {
    resource: Vec<KeyValue>,
    scope: String,
    record: opentelemetry_proto::tonic::logs::v1::LogRecord,
}

/// A request's path and headers (names in lower case).
type Request = (String, Vec<(String, String)>);

/// An OTLP/HTTP logs receiver on 127.0.0.1: every POST to /v1/logs is decoded as an
/// `ExportLogsServiceRequest` (protobuf) and answered with an empty success response.
struct Receiver {
    /// The base URL (`http://127.0.0.1:PORT`).
    base: String,
    got: Arc<Mutex<Vec<Got>>>,
    /// Each request's path and headers.
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Receiver {
    fn start() -> Receiver {
        Receiver::on("127.0.0.1:0")
    }

    fn on(addr: &str) -> Receiver {
        let server = tiny_http::Server::http(addr).unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (g, r) = (got.clone(), requests.clone());
        // The thread ends with the test's process.
        std::thread::spawn(move || {
            for mut rq in server.incoming_requests() {
                let mut body = Vec::new();
                std::io::Read::read_to_end(rq.as_reader(), &mut body).unwrap();
                let headers = rq
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.to_string().to_ascii_lowercase(),
                            h.value.to_string(),
                        )
                    })
                    .collect();
                r.lock().unwrap().push((rq.url().to_string(), headers));
                // OTLP/HTTP's two encodings, told apart by the content type.
                let json = rq.headers().iter().any(|h| {
                    h.field.equiv("Content-Type") && h.value.as_str() == "application/json"
                });
                let req: ExportLogsServiceRequest = if json {
                    serde_json::from_slice(&body)
                        .expect("the body is not an OTLP/JSON ExportLogsServiceRequest")
                } else {
                    ExportLogsServiceRequest::decode(body.as_slice())
                        .expect("the body is not an OTLP ExportLogsServiceRequest")
                };
                for rl in req.resource_logs {
                    let resource = rl.resource.map(|r| r.attributes).unwrap_or_default();
                    for sl in rl.scope_logs {
                        let scope = sl.scope.map(|s| s.name).unwrap_or_default();
                        for record in sl.log_records {
                            g.lock().unwrap().push(Got {
                                resource: resource.clone(),
                                scope: scope.clone(),
                                record,
                            });
                        }
                    }
                }
                let answer = ExportLogsServiceResponse::default().encode_to_vec();
                let _ = rq.respond(
                    tiny_http::Response::from_data(answer).with_header(
                        "Content-Type: application/x-protobuf"
                            .parse::<tiny_http::Header>()
                            .unwrap(),
                    ),
                );
            }
        });
        Receiver {
            base: format!("http://127.0.0.1:{port}"),
            got,
            requests,
        }
    }

    fn records(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }
}

fn text(v: &Option<AnyValue>) -> Option<String> {
    match v.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a Option<AnyValue>> {
    kvs.iter().find(|kv| kv.key == key).map(|kv| &kv.value)
}

fn attr_str(kvs: &[KeyValue], key: &str) -> Option<String> {
    attr(kvs, key).and_then(text)
}

fn attr_int(kvs: &[KeyValue], key: &str) -> Option<i64> {
    match attr(kvs, key)?.as_ref()?.value.as_ref()? {
        any_value::Value::IntValue(i) => Some(*i),
        _ => None,
    }
}

/// The ledger's entries and the records received, one for one, in order: the same entry
/// (id, line number), time, type, intent, agent, path, outcome, code and hashes.
fn assert_records_match(got: &[Got], ledger: &[Value]) {
    assert_eq!(
        got.len(),
        ledger.len(),
        "one record per ledger entry: got {} records for {} entries\nrecords: {:#?}",
        got.len(),
        ledger.len(),
        got.iter().map(|g| text(&g.record.body)).collect::<Vec<_>>()
    );
    for (i, (g, e)) in got.iter().zip(ledger).enumerate() {
        let a = &g.record.attributes;
        let what = format!("record {i} for {e}");
        assert_eq!(
            attr_int(a, "intentfs.ledger.seq"),
            Some(i as i64 + 1),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.entry.id").as_deref(),
            e["id"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.mutation.type").as_deref(),
            e["mutation_type"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.outcome").as_deref(),
            e["outcome"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.intent.id").as_deref(),
            e["intent_id"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "file.path").as_deref(),
            e["path"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.code").as_deref(),
            e["code"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.content_hash").as_deref(),
            e["content_hash"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.agent.name").as_deref(),
            e["agent"]["name"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.agent.identity").as_deref(),
            e["agent"]["identity"].as_str(),
            "{what}"
        );
        assert_eq!(
            attr_str(a, "intentfs.ledger.prev").as_deref(),
            e["prev"].as_str(),
            "{what}"
        );
        // The entry's own time, to the microsecond it has.
        let ts = chrono::DateTime::parse_from_rfc3339(e["timestamp"].as_str().unwrap()).unwrap();
        assert_eq!(
            g.record.time_unix_nano,
            ts.timestamp_nanos_opt().unwrap() as u64,
            "{what}"
        );
        assert!(
            g.record.observed_time_unix_nano >= g.record.time_unix_nano,
            "{what}"
        );
        let body = text(&g.record.body).unwrap_or_default();
        assert!(
            body.starts_with(e["mutation_type"].as_str().unwrap()),
            "body {body:?} of {what}"
        );
        if let Some(p) = e["path"].as_str() {
            assert!(body.contains(p), "body {body:?} of {what}");
        }
        let failed = matches!(
            e["outcome"].as_str(),
            Some("denied" | "tripped" | "rejected" | "timeout")
        );
        assert_eq!(
            g.record.severity_text,
            if failed { "WARN" } else { "INFO" },
            "{what}"
        );
        assert_eq!(g.record.event_name, "intentfs.ledger.entry", "{what}");
        assert_eq!(g.scope, "intentfs", "{what}");
    }
}

/// `counters.otlp` of the mount's status once `until` holds of it (waiting up to 10 s), or a
/// failure saying `what`, with the last counters read.
fn otlp_counters(tm: &TestMount, what: &str, until: impl Fn(&Value) -> bool) -> Value {
    let mut otlp = Value::Null;
    assert!(
        wait_until(Duration::from_secs(10), || {
            otlp = tm.status()["counters"]["otlp"].clone();
            until(&otlp)
        }),
        "{what}: {otlp:#}"
    );
    otlp
}

/// The shell work of an agent under INT-002 (docs/, README.md): a create, an edit with
/// `sed -i`, a rename, a delete, and a refused write outside the scope.
fn agent_work(tm: &TestMount) {
    tm.sh_ok(
        "echo one > README.md && mkdir -p docs && printf 'a\\nb\\nc\\n' > docs/x.md \
         && sed -i 's/b/B/' docs/x.md && mv docs/x.md docs/y.md && echo t > docs/t.md && rm docs/t.md",
    );
    tm.assert_sh_denied("echo no > notes.txt", "SCOPE_VIOLATION");
}

// ----- live, from the daemon ------------------------------------------------------------

#[test]
fn live_export_sends_one_record_per_ledger_entry() {
    let rx = Receiver::start();
    let mut tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-002")
        .agent("writer")
        .arg("--otlp")
        .arg(&rx.base)
        .mount();
    agent_work(&tm);
    // Live: what the agent did arrives while the mount is up.
    let n = tm.ledger().len();
    assert!(
        wait_until(Duration::from_secs(15), || rx.records().len() >= n),
        "{} of {n} records arrived while mounted",
        rx.records().len()
    );
    // The collector has the records before the exporter has read its answer: the counter
    // follows within the request's round trip (CI: records there, `exported` still 0).
    let otlp = otlp_counters(
        &tm,
        "records arrived but fewer were counted as exported",
        |o| o["exported"].as_u64().unwrap_or(0) >= n as u64,
    );
    assert_eq!(otlp["endpoint"], format!("{}/v1/logs", rx.base), "{otlp:#}");
    assert_eq!(otlp["dropped"], 0, "{otlp:#}");
    assert_eq!(otlp["failed"], 0, "{otlp:#}");
    // The UNMOUNT entry is written last and sent at unmount.
    tm.stop();
    let ledger = tm.ledger();
    assert_eq!(ledger.last().unwrap()["mutation_type"], "UNMOUNT");
    let got = rx.records();
    assert_records_match(&got, &ledger);
    // What the agent did is there, refusal included.
    let types: Vec<String> = got
        .iter()
        .filter_map(|g| attr_str(&g.record.attributes, "intentfs.mutation.type"))
        .collect();
    for t in ["MOUNT", "WRITE", "RENAME", "DELETE", "DENIAL", "UNMOUNT"] {
        assert!(types.iter().any(|x| x == t), "no {t} record: {types:?}");
    }
    let denial = got
        .iter()
        .find(|g| {
            attr_str(&g.record.attributes, "intentfs.code").as_deref() == Some("SCOPE_VIOLATION")
        })
        .expect("the refusal's record");
    assert_eq!(
        text(&denial.record.body).unwrap(),
        "DENIAL notes.txt by writer (intent INT-002): denied (SCOPE_VIOLATION)"
    );
    // The resource says who sent it.
    let res = &got[0].resource;
    assert_eq!(attr_str(res, "service.name").as_deref(), Some("intentfs"));
    assert_eq!(
        attr_str(res, "intentfs.workspace").as_deref(),
        Some(tm.ws.to_str().unwrap())
    );
    for (path, headers) in rx.requests.lock().unwrap().iter() {
        assert_eq!(path, "/v1/logs");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "application/x-protobuf"),
            "{headers:?}"
        );
    }
}

// ----- after the fact, `ledger export --otlp` ---------------------------------------------

#[test]
fn ledger_export_otlp_sends_the_whole_ledger_with_the_standard_variables() {
    let mut tm = TestMount::builder()
        .policy(&example_deny())
        .intent("INT-002")
        .agent("writer")
        .mount();
    agent_work(&tm);
    tm.stop();
    let ledger = tm.ledger();
    let rx = Receiver::start();
    let out = intentfs()
        .args(["ledger", "export", "--otlp", "--json"])
        .arg(&tm.ws)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.base)
        .env("OTEL_SERVICE_NAME", "audit")
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=test,team=platform",
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k123")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["entries"], ledger.len(), "{report:#}");
    assert_eq!(report["exported"], ledger.len(), "{report:#}");
    assert_eq!(report["failed"], 0, "{report:#}");
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["protocol"], "http/protobuf", "{report:#}");
    let got = rx.records();
    assert_records_match(&got, &ledger);
    let res = &got[0].resource;
    assert_eq!(attr_str(res, "service.name").as_deref(), Some("audit"));
    assert_eq!(
        attr_str(res, "deployment.environment").as_deref(),
        Some("test")
    );
    assert_eq!(attr_str(res, "team").as_deref(), Some("platform"));
    assert!(
        rx.requests
            .lock()
            .unwrap()
            .iter()
            .all(|(_, h)| h.iter().any(|(k, v)| k == "x-api-key" && v == "k123")),
        "the OTEL_EXPORTER_OTLP_HEADERS header on every request: {:?}",
        rx.requests.lock().unwrap()
    );

    // OTLP/JSON, to a logs URL given whole (used as it is: no /v1/logs added).
    let rx_json = Receiver::start();
    let out = intentfs()
        .args(["ledger", "export", "--otlp", "--json"])
        .arg(&tm.ws)
        .env(
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            format!("{}/ingest/logs", rx_json.base),
        )
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["protocol"], "http/json", "{report:#}");
    assert_records_match(&rx_json.records(), &ledger);
    for (path, headers) in rx_json.requests.lock().unwrap().iter() {
        assert_eq!(path, "/ingest/logs");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "application/json"),
            "{headers:?}"
        );
    }

    // --since: nothing is that recent; then the last hour is everything.
    let rx2 = Receiver::start();
    let since = |t: &str| {
        let out = intentfs()
            .args([
                "ledger",
                "export",
                &format!("--otlp={}", rx2.base),
                "--since",
                t,
                "--json",
            ])
            .arg(&tm.ws)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(since("2099-01-01T00:00:00Z")["entries"], 0);
    assert!(rx2.records().is_empty());
    assert_eq!(since("1h")["exported"], ledger.len());
    assert_records_match(&rx2.records(), &ledger);

    // Nobody listening: exit 1, and what to check.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let out = intentfs()
        .args([
            "ledger",
            "export",
            &format!("--otlp=http://127.0.0.1:{port}"),
        ])
        .arg(&tm.ws)
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "2000")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(&format!("0 of {} entries exported", ledger.len())),
        "{stdout}"
    );
    assert!(
        stdout.contains("is a collector listening there?"),
        "{stdout}"
    );

    // gRPC is not what this exporter speaks: said before anything is sent.
    let out = intentfs()
        .args(["ledger", "export", "--otlp"])
        .arg(&tm.ws)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
        "{stderr}"
    );
    assert!(stderr.contains("http/protobuf"), "{stderr}");
}

// ----- a collector that never answers ---------------------------------------------------

#[test]
fn a_dead_collector_neither_slows_nor_blocks_the_mount_and_the_loss_is_counted() {
    // Accepts connections and never answers: every export waits for its timeout.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in hole.incoming() {
            held.push(s);
        }
    });
    let mut tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .agent("busy")
        .arg("--otlp")
        .arg(format!("http://127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "3000")
        .env("OTEL_BLRP_MAX_QUEUE_SIZE", "4")
        .env("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "2")
        .mount();
    // 200 files: with an export in the way, each batch of 2 would wait 3 s.
    let t = Instant::now();
    tm.sh_ok("mkdir d && for i in $(seq 200); do echo $i > d/f$i; done");
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "200 writes took {took:?} with the collector hanging"
    );
    assert_eq!(std::fs::read_dir(tm.w("d")).unwrap().count(), 200);
    let writes = tm
        .ledger()
        .iter()
        .filter(|e| {
            e["mutation_type"] == "WRITE" && e["path"].as_str().unwrap_or("").starts_with("d/f")
        })
        .count();
    assert!(writes >= 200, "the ledger has {writes} WRITEs of d/f*");
    // The loss is visible: records dropped for a full queue, in the status and the log.
    let otlp = otlp_counters(&tm, "no drop counted", |o| {
        o["dropped"].as_u64().unwrap_or(0) > 0
    });
    assert_eq!(otlp["exported"], 0, "{otlp:#}");
    let log = std::fs::read_to_string(tm.stderr_path()).unwrap();
    assert!(log.contains("the export queue is full"), "{log}");
    // Still serving at full pace.
    let t = Instant::now();
    tm.sh_ok("for i in $(seq 50); do cat d/f$i > /dev/null; echo x >> d/f$i; done");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // The unmount waits for one request's timeout at most, not for the backlog.
    let t = Instant::now();
    tm.stop();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "unmount took {:?}",
        t.elapsed()
    );
    let log = std::fs::read_to_string(tm.stderr_path()).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("OTLP: 0 record(s) exported") && l.contains("dropped")),
        "no summary of the loss in the daemon log:\n{log}"
    );
}

/// A collector that is down at first and comes back: what could not be sent is counted as
/// failed, and the export goes on with what is written after it returned.
#[test]
fn a_collector_that_comes_back_gets_the_later_records() {
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let tm = TestMount::builder()
        .policy(ALLOW_ALL)
        .intent("ALL")
        .agent("patient")
        .arg("--otlp")
        .arg(format!("http://127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")
        .env("OTEL_BLRP_SCHEDULE_DELAY", "100")
        .mount();
    tm.sh_ok("echo 1 > before.txt");
    let otlp = otlp_counters(
        &tm,
        "nothing counted as failed with nobody listening",
        |o| o["failed"].as_u64().unwrap_or(0) > 0,
    );
    assert!(otlp["last_error"].is_string(), "{otlp:#}");
    let rx = Receiver::on(&format!("127.0.0.1:{port}"));
    tm.sh_ok("echo 2 > after.txt");
    assert!(
        wait_until(Duration::from_secs(15), || rx.records().iter().any(|g| {
            attr_str(&g.record.attributes, "file.path").as_deref() == Some("after.txt")
        })),
        "the record of after.txt never arrived: {:#?}",
        tm.status()["counters"]["otlp"]
    );
    // The collector has the record before the exporter has read its answer: the counter
    // follows within the request's round trip.
    otlp_counters(
        &tm,
        "the record arrived but nothing was counted as exported",
        |o| o["exported"].as_u64().unwrap_or(0) > 0,
    );
}

/// A refused `--otlp` is refused before anything is mounted, with what to do.
#[test]
fn mount_refuses_a_bad_endpoint_before_mounting() {
    require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let (ws, mnt) = (dir.path().join("ws"), dir.path().join("mnt"));
    std::fs::create_dir_all(ws.join(".orchestration")).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::write(ws.join(POLICY_REL), ALLOW_ALL).unwrap();
    let out = Command::new(BIN)
        .args(["mount", "--otlp", "localhost:4318", "--approver", "deny"])
        .arg(&ws)
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not an http:// or https:// URL"),
        "{stderr}"
    );
    assert!(stderr.contains("hint:"), "{stderr}");
    assert!(!is_mounted(&mnt));
}
