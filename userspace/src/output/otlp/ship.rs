//! Shipping OTLP requests: where to (the flags and the specification's
//! `OTEL_EXPORTER_OTLP_*` variables), and a bounded queue that a sender
//! task empties, retrying with backoff while the receiver is down, slow
//! or refusing. What the queue cannot hold is dropped, oldest first, and
//! counted; nothing grows without bound.
//!
//! OTLP/HTTP with binary protobuf on hyper's HTTP/1.1 client (already
//! the exporter's server), or OTLP/gRPC on its HTTP/2 client: gRPC's
//! framing of one unary call is five bytes and a trailer, written here
//! rather than bringing tonic's stack for it. One kept connection at a
//! time.

use std::{
    cell::RefCell,
    collections::VecDeque,
    io::Write as _,
    rc::Rc,
    time::{Duration, Instant},
};

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{
    Request, StatusCode, Uri,
    body::Bytes,
    header::{self, HeaderName, HeaderValue},
};
use prost::Message as _;
use tokio::sync::Notify;

/// The OTLP/HTTP path of profiles in the protocol version rtrace speaks
/// (the signal is not stable: `v1development`).
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// The gRPC method of profiles in that version.
pub const GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// How requests travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP, binary protobuf (the specification's default, port 4318).
    HttpProtobuf,
    /// OTLP/gRPC (port 4317).
    Grpc,
}

/// An endpoint setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The URL does not parse, or is not `http://`.
    #[error("{var}: {why}: {value:?}")]
    Url {
        /// The flag or variable it came from.
        var: String,
        /// What is wrong with it.
        why: &'static str,
        /// The value given.
        value: String,
    },
    /// A protocol rtrace does not speak.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0}: expected http/protobuf or grpc (http/json is not \
         supported)"
    )]
    Protocol(String),
    /// A compression other than gzip or none.
    #[error("OTEL_EXPORTER_OTLP_COMPRESSION={0}: expected gzip or none")]
    Compression(String),
    /// A header that does not parse.
    #[error("OTEL_EXPORTER_OTLP_HEADERS: {0:?} is not NAME=VALUE with a valid name and value")]
    Header(String),
    /// A certificate or key that cannot be read or used.
    #[error("{var}: {why}")]
    Tls {
        /// The variable that names it.
        var: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A timeout that is not a number of milliseconds.
    #[error("OTEL_EXPORTER_OTLP_TIMEOUT={0}: expected milliseconds")]
    Timeout(String),
}

/// Where and how requests are sent.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The full URL of profiles (for gRPC, of the method).
    pub url: Uri,
    /// How requests travel.
    pub protocol: Protocol,
    /// Headers added to every request (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether bodies are gzipped.
    pub gzip: bool,
    /// How long one request may take, connecting included.
    pub timeout: Duration,
    /// TLS, for an `https://` endpoint.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl Endpoint {
    /// The endpoint from `flag` (`--otlp-endpoint`, a base URL as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is) and the environment `var` reads,
    /// as the OTLP exporter specification has it: the signal's own
    /// `..._PROFILES_...` variable over the general one; a base URL gets
    /// the signal's path, a signal's URL is used as it is; by default
    /// `http://localhost:4318`.
    pub fn configure(
        flag: Option<&str>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, EndpointError> {
        let signal = |name: &str| {
            var(&format!("OTEL_EXPORTER_OTLP_PROFILES_{name}"))
                .or_else(|| var(&format!("OTEL_EXPORTER_OTLP_{name}")))
                .filter(|v| !v.trim().is_empty())
        };
        let protocol = match signal("PROTOCOL").as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") => Protocol::Grpc,
            Some(other) => return Err(EndpointError::Protocol(other.to_owned())),
        };
        // gRPC's endpoint names the server alone, whichever variable
        // gives it; OTLP/HTTP's signal variable is the whole URL.
        let path = match protocol {
            Protocol::HttpProtobuf => PROFILES_PATH,
            Protocol::Grpc => GRPC_PATH,
        };
        let base = |b: &str| {
            let b = b.trim().trim_end_matches('/');
            match protocol {
                Protocol::HttpProtobuf if b.ends_with(PROFILES_PATH) => b.to_owned(),
                _ => format!("{b}{path}"),
            }
        };
        let (url, source) = match (
            flag,
            var("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT").filter(|v| !v.is_empty()),
        ) {
            (Some(f), _) => (base(f), "--otlp-endpoint".to_owned()),
            (None, Some(full)) if protocol == Protocol::Grpc => (
                base(&full),
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT".to_owned(),
            ),
            (None, Some(full)) => (full, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT".to_owned()),
            (None, None) => match var("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.is_empty()) {
                Some(b) => (base(&b), "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned()),
                None => (
                    match protocol {
                        Protocol::HttpProtobuf => base("http://localhost:4318"),
                        Protocol::Grpc => base("http://localhost:4317"),
                    },
                    "default".to_owned(),
                ),
            },
        };
        let bad = |why| EndpointError::Url {
            var: source.clone(),
            why,
            value: url.clone(),
        };
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(bad("expected an http:// or https:// URL")),
        };
        if uri.host().is_none() {
            return Err(bad("no host"));
        }
        let gzip = match signal("COMPRESSION").as_deref().map(str::trim) {
            None | Some("none") => false,
            Some("gzip") => true,
            Some(other) => return Err(EndpointError::Compression(other.to_owned())),
        };
        let headers = match signal("HEADERS") {
            Some(h) => parse_headers(&h)?,
            None => Vec::new(),
        };
        let timeout = match signal("TIMEOUT") {
            Some(t) => Duration::from_millis(
                t.trim()
                    .parse()
                    .map_err(|_| EndpointError::Timeout(t.clone()))?,
            ),
            None => Duration::from_secs(10),
        };
        let tls = if https {
            Some(std::sync::Arc::new(tls_config(&signal, protocol)?))
        } else {
            None
        };
        Ok(Self {
            tls,
            url: uri,
            protocol,
            headers,
            gzip,
            timeout,
        })
    }
}

/// The TLS client of an `https://` endpoint: the CAs of
/// `OTEL_EXPORTER_OTLP_CERTIFICATE` (PEM) or else the system's, and a
/// client certificate where `_CLIENT_CERTIFICATE` and `_CLIENT_KEY` give
/// one; ALPN offers HTTP/2 for gRPC, HTTP/1.1 otherwise.
fn tls_config(
    signal: &dyn Fn(&str) -> Option<String>,
    protocol: Protocol,
) -> Result<rustls::ClientConfig, EndpointError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
    let err = |var, why: String| EndpointError::Tls { var, why };
    if signal("CLIENT_CERTIFICATE").is_some() != signal("CLIENT_KEY").is_some() {
        return Err(err(
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "a client certificate and its key go together: set both or neither".to_owned(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    match signal("CERTIFICATE") {
        Some(path) => {
            let var = "OTEL_EXPORTER_OTLP_CERTIFICATE";
            let certs = CertificateDer::pem_file_iter(&path)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| err(var, format!("cannot read {path}: {e}")))?;
            if certs.is_empty() {
                return Err(err(var, format!("{path} holds no certificate")));
            }
            for c in certs {
                roots.add(c).map_err(|e| err(var, format!("{path}: {e}")))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(err(
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    "not set, and the system has no CA certificates to trust (the \
                     ca-certificates package)"
                        .to_owned(),
                ));
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("TLS", e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (signal("CLIENT_CERTIFICATE"), signal("CLIENT_KEY")) {
        (Some(cert), Some(key)) => {
            let var = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
            let chain = CertificateDer::pem_file_iter(&cert)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| err(var, format!("cannot read {cert}: {e}")))?;
            let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| {
                err(
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    format!("cannot read {key}: {e}"),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| err(var, e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![match protocol {
        Protocol::Grpc => b"h2".to_vec(),
        Protocol::HttpProtobuf => b"http/1.1".to_vec(),
    }];
    Ok(config)
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `name=value` pairs separated by commas,
/// values percent-encoded (W3C Baggage's format, as the specification
/// says).
fn parse_headers(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, EndpointError> {
    text.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let bad = || EndpointError::Header(pair.to_owned());
            let (k, v) = pair.split_once('=').ok_or_else(bad)?;
            let name = HeaderName::from_bytes(k.trim().as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_bytes(&percent_decode(v.trim()).ok_or_else(bad)?)
                .map_err(|_| bad())?;
            Ok((name, value))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Why something was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The queue was full: the oldest went.
    BufferFull,
    /// The receiver refused it for good (a status not to retry, or its
    /// partial success's rejections).
    Rejected,
    /// The exporter stopped before it could be delivered.
    Shutdown,
}

impl Dropped {
    /// Every reason, as the metric labels them.
    pub const ALL: [Self; 3] = [Self::BufferFull, Self::Rejected, Self::Shutdown];

    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Self::BufferFull => "buffer_full",
            Self::Rejected => "rejected",
            Self::Shutdown => "shutdown",
        }
    }
}

/// What was sent and dropped, since the start.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Requests delivered.
    pub requests_sent: u64,
    /// Samples delivered (sample counts, not distinct stacks).
    pub samples_sent: u64,
    /// Samples dropped, by [`Dropped`] in its order.
    pub samples_dropped: [u64; 3],
    /// Sends that failed and are retried.
    pub failures: u64,
    /// Bytes queued now.
    pub queued_bytes: u64,
    /// Requests queued now.
    pub queued: u64,
}

/// One request, encoded (and compressed) for the wire.
struct Queued {
    body: Bytes,
    samples: u64,
}

struct State {
    queue: VecDeque<Queued>,
    bytes: usize,
    cap: usize,
    stats: Stats,
    /// The first rejection's reason has been said on stderr.
    told: bool,
}

/// The queue and its sender: [`Shipper::push`] queues, [`Shipper::run`]
/// (a task on the same thread) sends.
#[derive(Clone)]
pub struct Shipper {
    state: Rc<RefCell<State>>,
    wake: Rc<Notify>,
    endpoint: Rc<Endpoint>,
    /// Longest wait between retries.
    backoff_cap: Duration,
}

impl Shipper {
    /// A shipper to `endpoint` holding at most `cap` bytes of requests,
    /// retrying no less often than `backoff_cap`.
    pub fn new(endpoint: Endpoint, cap: usize, backoff_cap: Duration) -> Self {
        Self {
            state: Rc::new(RefCell::new(State {
                queue: VecDeque::new(),
                bytes: 0,
                cap,
                stats: Stats::default(),
                told: false,
            })),
            wake: Rc::new(Notify::new()),
            endpoint: Rc::new(endpoint),
            backoff_cap: backoff_cap.max(Duration::from_secs(1)),
        }
    }

    /// Where requests go.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Queues a request of `samples` samples, encoded as `body`; the
    /// oldest requests make room, counted as dropped.
    pub fn push(&self, body: Vec<u8>, samples: u64) {
        let body = if self.endpoint.gzip {
            gzip(&body)
        } else {
            body
        };
        let body = match self.endpoint.protocol {
            Protocol::HttpProtobuf => body,
            Protocol::Grpc => grpc_frame(&body, self.endpoint.gzip),
        };
        let mut s = self.state.borrow_mut();
        if body.len() > s.cap {
            s.stats.samples_dropped[0] += samples;
            return;
        }
        while s.bytes + body.len() > s.cap {
            let Some(old) = s.queue.pop_front() else {
                break;
            };
            s.bytes -= old.body.len();
            s.stats.samples_dropped[0] += old.samples;
        }
        s.bytes += body.len();
        s.queue.push_back(Queued {
            body: Bytes::from(body),
            samples,
        });
        drop(s);
        self.wake.notify_one();
    }

    /// What was sent and dropped so far.
    pub fn stats(&self) -> Stats {
        let s = self.state.borrow();
        Stats {
            queued_bytes: s.bytes as u64,
            queued: s.queue.len() as u64,
            ..s.stats.clone()
        }
    }

    /// Sends what is queued, oldest first, for ever: run it as a task.
    pub async fn run(self) {
        let mut conn = None;
        let mut backoff = Duration::from_secs(1);
        // Failed sends since the last that went through: the first is
        // said on stderr, and the recovery after them.
        let mut failing = 0u64;
        loop {
            let next = self.state.borrow().queue.front().map(|q| q.body.clone());
            let Some(body) = next else {
                self.wake.notified().await;
                continue;
            };
            match self.send(&mut conn, body).await {
                Outcome::Delivered { rejected } => {
                    backoff = Duration::from_secs(1);
                    if failing > 0 {
                        eprintln!(
                            "rtrace: exporter: the OTLP receiver takes profiles again, after \
                             {failing} failed sends"
                        );
                        failing = 0;
                    }
                    let mut s = self.state.borrow_mut();
                    if let Some(q) = s.queue.pop_front() {
                        s.bytes -= q.body.len();
                        let rejected = rejected.min(q.samples);
                        s.stats.requests_sent += 1;
                        s.stats.samples_sent += q.samples - rejected;
                        s.stats.samples_dropped[1] += rejected;
                    }
                }
                Outcome::Refused(why) => {
                    let mut s = self.state.borrow_mut();
                    if let Some(q) = s.queue.pop_front() {
                        s.bytes -= q.body.len();
                        s.stats.samples_dropped[1] += q.samples;
                    }
                    if !s.told {
                        s.told = true;
                        eprintln!(
                            "rtrace: exporter: the OTLP receiver refused profiles ({why}); \
                             refused profiles are dropped and counted in \
                             rtrace_otlp_samples_dropped_total"
                        );
                    }
                }
                Outcome::Retry(after, why) => {
                    if failing == 0 {
                        eprintln!(
                            "rtrace: exporter: cannot send profiles to {} ({why}); retrying \
                             with backoff, up to --otlp-buffer held meanwhile",
                            self.endpoint.url
                        );
                    }
                    failing += 1;
                    conn = None;
                    self.state.borrow_mut().stats.failures += 1;
                    let wait = after.unwrap_or(backoff).min(self.backoff_cap);
                    backoff = (backoff * 2).min(self.backoff_cap);
                    tokio::time::sleep(jitter(wait)).await;
                }
            }
        }
    }

    /// Sends what is queued until the queue is empty or `deadline`
    /// passes; what is left is counted as dropped at shutdown.
    pub async fn flush(&self, deadline: Instant) {
        while !self.state.borrow().queue.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut s = self.state.borrow_mut();
        let left: u64 = s.queue.drain(..).map(|q| q.samples).sum();
        s.bytes = 0;
        s.stats.samples_dropped[2] += left;
    }

    /// One attempt to send `body`, on the kept connection or a new one.
    async fn send(&self, conn: &mut Option<Connection>, body: Bytes) -> Outcome {
        let e = &self.endpoint;
        let grpc = e.protocol == Protocol::Grpc;
        let attempt = async {
            if conn.as_ref().is_none_or(Connection::is_closed) {
                *conn = Some(connect(e).await?);
            }
            let c = conn.as_mut().expect("connected above");
            let mut req = Request::post(e.url.clone()).header(
                header::USER_AGENT,
                concat!("rtrace/", env!("CARGO_PKG_VERSION")),
            );
            if grpc {
                req = req
                    .header(header::CONTENT_TYPE, "application/grpc")
                    .header(header::TE, "trailers")
                    .header("grpc-timeout", format!("{}m", e.timeout.as_millis()));
                if e.gzip {
                    req = req.header("grpc-encoding", "gzip");
                }
            } else {
                req = req
                    .header(header::HOST, host_header(&e.url))
                    .header(header::CONTENT_TYPE, "application/x-protobuf");
                if e.gzip {
                    req = req.header(header::CONTENT_ENCODING, "gzip");
                }
            }
            for (k, v) in &e.headers {
                req = req.header(k, v);
            }
            let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
            let resp = c.send(req).await?;
            let status = resp.status();
            let head = resp.headers().clone();
            let collected = Limited::new(resp.into_body(), 1 << 20)
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            let trailers = collected.trailers().cloned();
            Ok::<_, String>((status, head, trailers, collected.to_bytes()))
        };
        match tokio::time::timeout(e.timeout, attempt).await {
            Err(_) => Outcome::Retry(None, format!("no answer within {:?}", e.timeout)),
            Ok(Err(why)) => Outcome::Retry(None, why),
            Ok(Ok((status, head, trailers, body))) if grpc => {
                grpc_outcome(status, &head, trailers.as_ref(), &body)
            }
            Ok(Ok((status, head, _, body))) => {
                let retry_after = head
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                outcome(status, retry_after, &body)
            }
        }
    }
}

/// What became of one attempt.
enum Outcome {
    /// Taken; the receiver's partial success rejected this many samples.
    Delivered { rejected: u64 },
    /// Refused for good, with the status.
    Refused(String),
    /// To be sent again, after the receiver's `Retry-After` if it gave
    /// one; why it failed.
    Retry(Option<Duration>, String),
}

/// The outcome of a response, as the OTLP/HTTP specification sorts its
/// statuses: 429, 502, 503 and 504 are retried, other failures are not.
fn outcome(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> Outcome {
    use crate::output::otlp::proto::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceResponse;
    if status.is_success() {
        let rejected = ExportProfilesServiceResponse::decode(body)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_profiles.max(0) as u64);
        return Outcome::Delivered { rejected };
    }
    match status.as_u16() {
        429 | 502 | 503 | 504 => Outcome::Retry(retry_after, format!("HTTP {status}")),
        _ => Outcome::Refused(format!("HTTP {status}")),
    }
}

/// The outcome of a gRPC call: its `grpc-status` (in the trailers, or
/// in the headers of a response that has no body), sorted as the OTLP
/// specification sorts gRPC's codes: UNAVAILABLE, RESOURCE_EXHAUSTED,
/// DEADLINE_EXCEEDED, ABORTED, CANCELLED, OUT_OF_RANGE and DATA_LOSS are
/// retried, other failures are not.
fn grpc_outcome(
    status: StatusCode,
    head: &hyper::HeaderMap,
    trailers: Option<&hyper::HeaderMap>,
    body: &[u8],
) -> Outcome {
    if !status.is_success() {
        // An HTTP failure before gRPC: a proxy's, or no gRPC server.
        return outcome(status, None, &[]);
    }
    let field = |name: &str| {
        trailers
            .and_then(|t| t.get(name))
            .or_else(|| head.get(name))
            .and_then(|v| v.to_str().ok())
    };
    let Some(code) = field("grpc-status").and_then(|c| c.trim().parse::<u32>().ok()) else {
        return Outcome::Retry(None, "a gRPC answer without grpc-status".to_owned());
    };
    match code {
        // The reply is one message, framed as the request was.
        0 => outcome(StatusCode::OK, None, body.get(5..).unwrap_or_default()),
        1 | 4 | 8 | 10 | 11 | 14 | 15 => Outcome::Retry(
            None,
            format!(
                "gRPC status {code}: {}",
                field("grpc-message").unwrap_or("")
            ),
        ),
        _ => Outcome::Refused(format!(
            "gRPC status {code}: {}",
            field("grpc-message").unwrap_or("")
        )),
    }
}

/// One gRPC message as it travels: a compressed flag, its length (big
/// endian) and its bytes.
fn grpc_frame(message: &[u8], compressed: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 5);
    out.push(u8::from(compressed));
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A wait of `d` less up to a fifth, so that a fleet's hosts do not
/// retry in step.
fn jitter(d: Duration) -> Duration {
    let spread = (crate::kernel::monotonic_ns() % 1000) as u32;
    d - d / 5 * spread / 1000
}

/// A kept connection: HTTP/1.1 for OTLP/HTTP, HTTP/2 for gRPC.
enum Connection {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Connection {
    fn is_closed(&self) -> bool {
        match self {
            Self::H1(c) => c.is_closed(),
            Self::H2(c) => c.is_closed(),
        }
    }

    async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        match self {
            Self::H1(c) => {
                c.ready().await.map_err(|e| e.to_string())?;
                c.send_request(req).await.map_err(|e| e.to_string())
            }
            Self::H2(c) => {
                c.ready().await.map_err(|e| e.to_string())?;
                c.send_request(req).await.map_err(|e| e.to_string())
            }
        }
    }
}

/// A new connection to the endpoint's host (through TLS for https),
/// driven by a task of its own.
async fn connect(e: &Endpoint) -> Result<Connection, String> {
    let url = &e.url;
    let host = url.host().unwrap_or("localhost");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url
        .port_u16()
        .unwrap_or(if e.tls.is_some() { 443 } else { 80 });
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    match &e.tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| e.to_string())?;
            let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::clone(config))
                .connect(name, stream)
                .await
                .map_err(|e| e.to_string())?;
            handshake(hyper_util::rt::TokioIo::new(tls), e.protocol).await
        }
        None => handshake(hyper_util::rt::TokioIo::new(stream), e.protocol).await,
    }
}

/// HTTP/1.1 or HTTP/2 on `io`.
async fn handshake<I>(io: I, protocol: Protocol) -> Result<Connection, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    match protocol {
        Protocol::HttpProtobuf => {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::task::spawn_local(async move {
                let _ = conn.await;
            });
            Ok(Connection::H1(send))
        }
        Protocol::Grpc => {
            let (send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::task::spawn_local(async move {
                let _ = conn.await;
            });
            Ok(Connection::H2(send))
        }
    }
}

fn host_header(url: &Uri) -> String {
    match (url.host(), url.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        _ => String::new(),
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing to a Vec does not fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn the_endpoint_is_read_as_the_specification_says() {
        let e = Endpoint::configure(None, env(&[])).unwrap();
        assert_eq!(e.url, "http://localhost:4318/v1development/profiles");
        assert!(!e.gzip);
        let e = Endpoint::configure(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "Authorization=Bearer%20abc,x-scope-orgid=team-1",
                ),
            ]),
        )
        .unwrap();
        assert_eq!(e.url, "http://collector:4318/v1development/profiles");
        assert!(e.gzip);
        assert_eq!(e.headers[0].0, "authorization");
        assert_eq!(e.headers[0].1, "Bearer abc");
        assert_eq!(e.headers[1].1, "team-1");
        // The signal's own variable is the whole URL, and wins.
        let e = Endpoint::configure(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://b:2/p"),
            ]),
        )
        .unwrap();
        assert_eq!(e.url, "http://b:2/p");
        // The flag over both.
        let e = Endpoint::configure(Some("http://c:3"), env(&[])).unwrap();
        assert_eq!(e.url, "http://c:3/v1development/profiles");
        // gRPC: the server's address, whichever variable gives it.
        let e = Endpoint::configure(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://d:4317"),
            ]),
        )
        .unwrap();
        assert_eq!(e.protocol, Protocol::Grpc);
        assert_eq!(e.url, format!("http://d:4317{GRPC_PATH}").as_str());
        let e = Endpoint::configure(None, env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).unwrap();
        assert_eq!(e.url, format!("http://localhost:4317{GRPC_PATH}").as_str());
        for bad in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://x"),
        ] {
            let err = Endpoint::configure(None, env(&[bad])).unwrap_err();
            assert!(err.to_string().contains(bad.1), "{err}");
        }
        // https: the CA file is read at once, and a half client identity
        // is refused.
        let err = Endpoint::configure(
            Some("https://e:4318"),
            env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        let err = Endpoint::configure(
            Some("https://e:4318"),
            env(&[("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("set both or neither"), "{err}");
    }

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let e = Endpoint::configure(None, env(&[])).unwrap();
        let s = Shipper::new(e, 100, Duration::from_secs(1));
        s.push(vec![0; 60], 6);
        s.push(vec![0; 30], 3);
        s.push(vec![0; 50], 5);
        let st = s.stats();
        assert_eq!(st.samples_dropped, [6, 0, 0]);
        assert_eq!((st.queued, st.queued_bytes), (2, 80));
        s.push(vec![0; 101], 9);
        assert_eq!(s.stats().samples_dropped, [15, 0, 0]);
    }
}
