//! Telemetry out: the ledger as OpenTelemetry logs over OTLP/HTTP, one log record per
//! entry ([`record`]).
//!
//! Two ways, one pipeline: the daemon's [`Follower`] tails the ledger file from a thread of
//! its own (the FUSE reply path never sees it: the writer thread appends, the follower reads
//! what was appended, like the intent map does), and `intentfs ledger export --otlp` reads a
//! ledger after the fact ([`export_file`]). Records go through a bounded queue to an export
//! thread that sends batches with the `opentelemetry-otlp` exporter; when the queue is full
//! (a slow or dead collector) the follower drops records and counts them rather than wait,
//! and a batch the collector refuses or never answers is counted as failed. The counts are
//! in [`Stats`], which `.intentfs/status` shows.
//!
//! Configuration is the standard one: `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`, `..._HEADERS`, `..._TIMEOUT`, `..._PROTOCOL`
//! (`http/protobuf` or `http/json`), `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, and
//! the batch processor's `OTEL_BLRP_*` sizes. HTTP goes through ureq ([`http`]): blocking,
//! no async runtime to start in the daemon.

mod http;
pub mod record;

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use opentelemetry::logs::{LogRecord as _, Logger as _, LoggerProvider as _};
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use parking_lot::Mutex;

use crate::ledger::entry::Entry;
use crate::ledger::reader::{parse_line, Lines};

/// Where logs go when no endpoint is configured (the OTLP/HTTP default).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4318";
/// The path of the logs signal under a base endpoint.
pub const LOGS_PATH: &str = "/v1/logs";

/// A configuration the exporter cannot run with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}={value:?}: intentfs exports OTLP over HTTP only\nhint: set {var}=http/protobuf (or http/json) and point the endpoint at the collector's HTTP port (4318)")]
    Grpc { var: &'static str, value: String },
    #[error("{var}={value:?} is not a protocol\nhint: use http/protobuf or http/json")]
    Protocol { var: &'static str, value: String },
    #[error("OTLP endpoint {0:?} is not an http:// or https:// URL\nhint: e.g. http://localhost:4318 (the collector's OTLP/HTTP port)")]
    Endpoint(String),
    #[error("{var}={value:?} is not a number\nhint: {what}")]
    Number {
        var: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("building the OTLP exporter: {0}")]
    Build(String),
}

/// How the export is set up: from the environment, and `--otlp ENDPOINT`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The full URL records are POSTed to (`.../v1/logs`).
    pub url: String,
    pub protocol: Protocol,
    /// One request's time limit.
    pub timeout: Duration,
    /// The queue between the follower and the export thread (`OTEL_BLRP_MAX_QUEUE_SIZE`).
    pub queue: usize,
    /// Records per request at most (`OTEL_BLRP_MAX_EXPORT_BATCH_SIZE`).
    pub batch: usize,
    /// How long a record may wait for a fuller batch (`OTEL_BLRP_SCHEDULE_DELAY`).
    pub delay: Duration,
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

fn env_num(var: &'static str, default: u64, what: &'static str) -> Result<u64, ConfigError> {
    match env(var) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| ConfigError::Number {
            var,
            value: v,
            what,
        }),
    }
}

/// Whether the environment asks for live export (an endpoint is set, and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_LOGS_EXPORTER=none` says no).
pub fn wanted_by_env() -> bool {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_LOGS_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled
        && (env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
            || env("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT").is_some())
}

/// `BASE` + `/v1/logs` (once), as the specification builds a signal's URL from
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn logs_url(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with(LOGS_PATH) {
        base.to_owned()
    } else {
        format!("{base}{LOGS_PATH}")
    }
}

impl Config {
    /// The configuration the environment gives, `endpoint` (`--otlp`, a base URL like
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) taking precedence over the endpoint variables.
    pub fn from_env(endpoint: Option<&str>) -> Result<Config, ConfigError> {
        let url = match (endpoint, env("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")) {
            (Some(e), _) => logs_url(e),
            // The signal's own variable is the whole URL, used as it is.
            (None, Some(u)) => u.trim().to_owned(),
            (None, None) => logs_url(
                &env("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()),
            ),
        };
        match url.parse::<::http::Uri>() {
            Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {}
            _ => return Err(ConfigError::Endpoint(url)),
        }
        let (var, proto) = match env("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL") {
            Some(p) => ("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", Some(p)),
            None => (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                env("OTEL_EXPORTER_OTLP_PROTOCOL"),
            ),
        };
        let protocol = match proto.as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpBinary,
            Some("http/json") => Protocol::HttpJson,
            Some(v) if v.starts_with("grpc") => {
                return Err(ConfigError::Grpc {
                    var,
                    value: v.into(),
                })
            }
            Some(v) => {
                return Err(ConfigError::Protocol {
                    var,
                    value: v.into(),
                })
            }
        };
        let timeout_var = if env("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT").is_some() {
            "OTEL_EXPORTER_OTLP_LOGS_TIMEOUT"
        } else {
            "OTEL_EXPORTER_OTLP_TIMEOUT"
        };
        let timeout = env_num(timeout_var, 10_000, "milliseconds, e.g. 10000")?;
        let queue = env_num("OTEL_BLRP_MAX_QUEUE_SIZE", 2048, "records, e.g. 2048")?.max(1);
        let batch =
            env_num("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", 512, "records, e.g. 512")?.clamp(1, queue);
        let delay = env_num("OTEL_BLRP_SCHEDULE_DELAY", 1000, "milliseconds, e.g. 1000")?;
        Ok(Config {
            url,
            protocol,
            timeout: Duration::from_millis(timeout.max(1)),
            queue: queue as usize,
            batch: batch as usize,
            delay: Duration::from_millis(delay),
        })
    }
}

/// What the export did so far (shown in `.intentfs/status` under `counters.otlp`).
#[derive(Debug, Default)]
pub struct Stats {
    /// The URL records go to.
    pub url: String,
    /// Entries read from the ledger and handed to the queue.
    pub queued: AtomicU64,
    /// Records the collector accepted.
    pub exported: AtomicU64,
    /// Records dropped because the queue was full (the collector slow or unreachable).
    pub dropped: AtomicU64,
    /// Records in batches the collector refused, or did not answer in time.
    pub failed: AtomicU64,
    /// Requests that failed.
    pub failed_requests: AtomicU64,
    /// The last failure, for the status and the log.
    pub last_error: Mutex<Option<String>>,
}

impl Stats {
    /// The counters as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "endpoint": self.url,
            "queued": self.queued.load(Ordering::Relaxed),
            "exported": self.exported.load(Ordering::Relaxed),
            "dropped": self.dropped.load(Ordering::Relaxed),
            "failed": self.failed.load(Ordering::Relaxed),
            "failed_requests": self.failed_requests.load(Ordering::Relaxed),
            "last_error": *self.last_error.lock(),
        })
    }

    /// Records lost so far (dropped or failed).
    pub fn lost(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }
}

/// Makes SDK records (the logger of a provider with no processor: records are made with
/// it and queued by us, never emitted through it).
struct Maker {
    _provider: SdkLoggerProvider,
    logger: opentelemetry_sdk::logs::SdkLogger,
}

impl Maker {
    /// The SDK record of the entry on ledger line `seq`.
    fn record(&self, seq: u64, e: &Entry) -> SdkLogRecord {
        let p = record::parts(seq, e);
        let mut r = self.logger.create_log_record();
        r.set_event_name(record::EVENT_NAME);
        if let Some(t) = p.timestamp {
            r.set_timestamp(t);
        }
        r.set_observed_timestamp(SystemTime::now());
        r.set_severity_number(p.severity);
        r.set_severity_text(p.severity_text);
        r.set_body(p.body.into());
        r.add_attributes(p.attributes);
        r
    }
}

/// The resource: `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` as the SDK reads them,
/// `service.name=intentfs` unless they name the service, and the workspace.
fn resource(workspace: Option<&Path>) -> opentelemetry_sdk::Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
        });
    let mut b = opentelemetry_sdk::Resource::builder();
    if !named {
        b = b.with_service_name("intentfs");
    }
    b = b.with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if let Some(ws) = workspace {
        b = b.with_attribute(opentelemetry::KeyValue::new(
            "intentfs.workspace",
            ws.display().to_string(),
        ));
    }
    b.build()
}

/// The record maker, the scope, and the exporter (with its resource) for `cfg`.
fn sdk(
    cfg: &Config,
    workspace: Option<&Path>,
) -> Result<(Maker, InstrumentationScope, opentelemetry_otlp::LogExporter), ConfigError> {
    let mut exporter = opentelemetry_otlp::LogExporter::builder()
        .with_http()
        .with_http_client(http::Ureq::new(cfg.timeout))
        .with_endpoint(cfg.url.clone())
        .with_protocol(cfg.protocol)
        .with_timeout(cfg.timeout)
        .build()
        .map_err(|e| ConfigError::Build(e.to_string()))?;
    exporter.set_resource(&resource(workspace));
    let scope = InstrumentationScope::builder("intentfs")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let provider = SdkLoggerProvider::builder().build();
    let logger = provider.logger_with_scope(scope.clone());
    Ok((
        Maker {
            _provider: provider,
            logger,
        },
        scope,
        exporter,
    ))
}

/// The export thread: batches from the queue to the collector until the queue is closed
/// and empty.
fn export_loop(
    exporter: opentelemetry_otlp::LogExporter,
    scope: InstrumentationScope,
    rx: Receiver<SdkLogRecord>,
    cfg: Config,
    stats: Arc<Stats>,
    give_up: bool,
) {
    let mut last_warn: Option<Instant> = None;
    // The first record of a batch, then more until the batch is full or has waited the
    // schedule delay; until the queue is closed and empty.
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let deadline = Instant::now() + cfg.delay;
        while batch.len() < cfg.batch {
            match rx.recv_deadline(deadline) {
                Ok(r) => batch.push(r),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            batch.iter().map(|r| (r, &scope)).collect();
        let n = batch.len() as u64;
        match futures_lite::future::block_on(exporter.export(LogBatch::new(&refs))) {
            Ok(()) => {
                stats.exported.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                let msg = format!("{e}");
                // The reason first: a status read that sees the failure sees why.
                *stats.last_error.lock() = Some(msg.clone());
                stats.failed.fetch_add(n, Ordering::Relaxed);
                stats.failed_requests.fetch_add(1, Ordering::Relaxed);
                // At most one warning every 10 s: a dead collector must not flood the log.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    last_warn = Some(Instant::now());
                    tracing::warn!(
                        "OTLP export to {}: {n} record(s) lost: {msg} (lost so far: {} dropped, {} failed)",
                        cfg.url,
                        stats.dropped.load(Ordering::Relaxed),
                        stats.failed.load(Ordering::Relaxed)
                    );
                }
                // An export of a whole ledger stops at the first refusal rather than wait a
                // timeout for each of its batches; the rest is counted as not sent.
                if give_up {
                    let rest = rx.iter().count() as u64;
                    stats.failed.fetch_add(rest, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
    let _ = exporter.shutdown();
}

/// Reads complete ledger lines appended after `offset`, calling `f(seq, entry)` for each
/// one that parses; returns the new offset and seq (a line being written is left for the
/// next call).
fn read_new(
    ledger: &Path,
    offset: u64,
    seq: u64,
    f: &mut dyn FnMut(u64, Entry),
) -> io::Result<(u64, u64)> {
    let mut file = match File::open(ledger) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((offset, seq)),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    // Shorter than what was read: a torn tail was cut at a restart. Nothing is re-sent.
    if len <= offset {
        return Ok((len.min(offset), seq));
    }
    file.seek(SeekFrom::Start(offset))?;
    let (mut off, mut seq) = (offset, seq);
    for line in Lines::new(BufReader::with_capacity(256 * 1024, file)) {
        let line = line?;
        if !line.terminated {
            break;
        }
        off = offset + line.offset + line.bytes.len() as u64;
        seq += 1;
        if let Ok(e) = parse_line(line.content()) {
            f(seq, e);
        }
    }
    Ok((off, seq))
}

/// Lines in the first `upto` bytes of the ledger (the seq of the line before `upto`).
fn count_lines(ledger: &Path, upto: u64) -> io::Result<u64> {
    let f = File::open(ledger)?;
    let mut r = BufReader::with_capacity(256 * 1024, f.take(upto));
    let mut n = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(n);
        }
        n += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        let l = buf.len();
        r.consume(l);
    }
}

/// The daemon's live export: follows the ledger from where it was at mount.
pub struct Follower {
    stats: Arc<Stats>,
    /// The queue's receiving end, to count what is left in it when the export gives up.
    pending: Receiver<SdkLogRecord>,
    stop: Arc<AtomicBool>,
    wake: Option<Sender<()>>,
    follow: Option<JoinHandle<()>>,
    export: Option<JoinHandle<()>>,
    flush_limit: Duration,
}

impl Follower {
    /// Starts following `ledger` from byte `offset` (its length when the daemon opened
    /// it): every entry appended from then on is exported. Fails only on configuration.
    pub fn start(
        cfg: Config,
        ledger: &Path,
        offset: u64,
        workspace: &Path,
    ) -> Result<Follower, ConfigError> {
        let (maker, scope, exporter) = sdk(&cfg, Some(workspace))?;
        let stats = Arc::new(Stats {
            url: cfg.url.clone(),
            ..Stats::default()
        });
        let (tx, rx) = crossbeam_channel::bounded::<SdkLogRecord>(cfg.queue);
        let pending = rx.clone();
        let export = {
            let (cfg, stats) = (cfg.clone(), stats.clone());
            std::thread::Builder::new()
                .name("intentfs-otlp-export".into())
                .spawn(move || export_loop(exporter, scope, rx, cfg, stats, false))
                .map_err(|e| ConfigError::Build(format!("starting the export thread: {e}")))?
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (wake_tx, wake_rx) = crossbeam_channel::bounded::<()>(0);
        let follow = {
            let (stop, stats, ledger) = (stop.clone(), stats.clone(), ledger.to_path_buf());
            std::thread::Builder::new()
                .name("intentfs-otlp-follow".into())
                .spawn(move || follow_loop(maker, tx, &ledger, offset, &stop, &wake_rx, &stats))
                .map_err(|e| ConfigError::Build(format!("starting the follower thread: {e}")))?
        };
        tracing::info!(
            "OTLP: exporting ledger entries to {} ({})",
            cfg.url,
            cfg.protocol_name()
        );
        Ok(Follower {
            stats,
            pending,
            stop,
            wake: Some(wake_tx),
            follow: Some(follow),
            export: Some(export),
            // At most 5 s: `intentfs umount` waits 15 s for the daemon to finish.
            flush_limit: (cfg.timeout + Duration::from_secs(1)).min(Duration::from_secs(5)),
        })
    }

    /// The counters, for `.intentfs/status`.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Exports what was appended since the last look (the UNMOUNT entry, say), waits for
    /// the queue to drain (one request timeout and a second, 5 s at most: a dead collector does
    /// not hold the unmount), and logs the totals.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.wake.take());
        if let Some(h) = self.follow.take() {
            let _ = h.join();
        }
        let deadline = Instant::now() + self.flush_limit;
        if let Some(h) = self.export.take() {
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                let left = self.pending.len() as u64;
                self.stats.dropped.fetch_add(left, Ordering::Relaxed);
                tracing::warn!(
                    "OTLP: the collector at {} did not take the last records in time: {left} left unsent",
                    self.stats.url
                );
            }
        }
        let s = &self.stats;
        let msg = format!(
            "OTLP: {} record(s) exported to {}, {} dropped (queue full), {} failed",
            s.exported.load(Ordering::Relaxed),
            s.url,
            s.dropped.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed)
        );
        if s.lost() > 0 {
            tracing::warn!("{msg}");
        } else {
            tracing::info!("{msg}");
        }
    }
}

impl Config {
    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` name of the protocol.
    pub fn protocol_name(&self) -> &'static str {
        match self.protocol {
            Protocol::HttpJson => "http/json",
            _ => "http/protobuf",
        }
    }
}

/// The follower thread: every 200 ms (or when woken), the new complete lines become records
/// in the queue; a full queue drops the record (counted), never waits.
fn follow_loop(
    sdk: Maker,
    tx: Sender<SdkLogRecord>,
    ledger: &Path,
    offset: u64,
    stop: &AtomicBool,
    wake: &Receiver<()>,
    stats: &Stats,
) {
    let mut seq = match count_lines(ledger, offset) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("OTLP: cannot read {}: {e}", ledger.display());
            0
        }
    };
    let mut offset = offset;
    let mut warned = false;
    loop {
        let last = stop.load(Ordering::Relaxed);
        let mut push = |seq: u64, e: Entry| {
            stats.queued.fetch_add(1, Ordering::Relaxed);
            match tx.try_send(sdk.record(seq, &e)) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    stats.queued.fetch_sub(1, Ordering::Relaxed);
                    let n = stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                    if !warned {
                        warned = true;
                        tracing::warn!(
                            "OTLP: the export queue is full (collector at {} slow or down): dropping records ({n} so far; see .intentfs/status)",
                            stats.url
                        );
                    }
                }
                Err(TrySendError::Disconnected(_)) => {}
            }
        };
        match read_new(ledger, offset, seq, &mut push) {
            Ok((o, s)) => (offset, seq) = (o, s),
            Err(e) => tracing::warn!("OTLP: reading {}: {e}", ledger.display()),
        }
        if last {
            break;
        }
        let _ = wake.recv_timeout(Duration::from_millis(200));
    }
}

/// What [`export_file`] did.
#[derive(Debug, serde::Serialize)]
pub struct ExportReport {
    pub endpoint: String,
    pub protocol: &'static str,
    /// Entries in the ledger that matched (`--since`).
    pub entries: u64,
    pub exported: u64,
    pub failed: u64,
    pub last_error: Option<String>,
}

/// `intentfs ledger export --otlp`: every entry of `ledger` at or after `since` as a log
/// record, nothing dropped (the reader waits for the queue); returns the counts.
pub fn export_file(
    cfg: &Config,
    ledger: &Path,
    workspace: Option<&Path>,
    since: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<ExportReport, ConfigError> {
    let (maker, scope, exporter) = sdk(cfg, workspace)?;
    let stats = Arc::new(Stats {
        url: cfg.url.clone(),
        ..Stats::default()
    });
    let (tx, rx) = crossbeam_channel::bounded::<SdkLogRecord>(cfg.queue);
    let h = {
        let (cfg, stats, scope) = (cfg.clone(), stats.clone(), scope.clone());
        // No reason to linger for fuller batches: the whole file is there.
        let cfg = Config {
            delay: Duration::ZERO,
            ..cfg
        };
        std::thread::Builder::new()
            .name("intentfs-otlp-export".into())
            .spawn(move || export_loop(exporter, scope, rx, cfg, stats, true))
            .map_err(|e| ConfigError::Build(format!("starting the export thread: {e}")))?
    };
    let mut entries = 0u64;
    let mut push = |seq: u64, e: Entry| {
        let recent = since.is_none_or(|s| {
            chrono::DateTime::parse_from_rfc3339(&e.timestamp).is_ok_and(|t| t >= s)
        });
        if recent {
            entries += 1;
            let _ = tx.send(maker.record(seq, &e));
        }
    };
    let read = read_new(ledger, 0, 0, &mut push);
    drop(tx);
    let _ = h.join();
    read.map_err(|e| ConfigError::Build(format!("reading {}: {e}", ledger.display())))?;
    let last_error = stats.last_error.lock().clone();
    Ok(ExportReport {
        endpoint: cfg.url.clone(),
        protocol: cfg.protocol_name(),
        entries,
        exported: stats.exported.load(Ordering::Relaxed),
        failed: stats.failed.load(Ordering::Relaxed),
        last_error,
    })
}
