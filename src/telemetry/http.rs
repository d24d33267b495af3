//! The OTLP exporter's HTTP client: ureq, blocking, on the export thread. The exporter's
//! `async` export is driven by `block_on` there, so a client that blocks is right, and no
//! async runtime (tokio) is started in the daemon or built into the binary.

use std::io::Read as _;
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// Responses larger than this are cut (an OTLP answer is a few bytes, or an error text).
const MAX_RESPONSE: u64 = 1024 * 1024;

/// A ureq agent with the export's time limit on every request.
#[derive(Debug, Clone)]
pub struct Ureq {
    agent: ureq::Agent,
}

impl Ureq {
    /// A client whose requests give up after `timeout` (connecting included).
    pub fn new(timeout: Duration) -> Ureq {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            // A 4xx/5xx is an answer the exporter classifies (retry or not), not an error.
            .http_status_as_error(false)
            .build()
            .into();
        Ureq { agent }
    }
}

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = request.map(|b| b.to_vec());
        let mut response = self.agent.run(request)?;
        let mut body = Vec::new();
        response
            .body_mut()
            .as_reader()
            .take(MAX_RESPONSE)
            .read_to_end(&mut body)?;
        let (parts, _) = response.into_parts();
        Ok(Response::from_parts(parts, Bytes::from(body)))
    }
}
