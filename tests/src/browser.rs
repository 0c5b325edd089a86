//! A small W3C WebDriver client, to open rtrace's HTML and SVG pages in a
//! real headless Chromium and look at them as a reader would: what the
//! browser laid out, drew and fetched. It speaks HTTP/1.1 to chromedriver
//! over a plain TCP stream, one request a connection, which is all
//! chromedriver needs and keeps the tests free of an HTTP stack.
//!
//! These are test helpers: every failure panics with what WebDriver said.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// The key under which W3C WebDriver names an element in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long chromedriver may take to say it is ready: a cold start on a
/// loaded machine takes a few seconds.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one WebDriver command may take: far longer than any the
/// tests give (scripts stop at 30 s), to catch a chromedriver that
/// stopped answering rather than hang the suite.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether `chromium` and `chromedriver` are both on PATH. The VM guests
/// carry no browser: their callers skip, saying so.
pub fn browser_available() -> bool {
    ["chromium", "chromedriver"]
        .iter()
        .all(|name| on_path(name))
}

fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        dir.join(name)
            .metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// A headless Chromium driven through its own chromedriver, with a fresh
/// profile. Dropping it ends the session and both processes and removes
/// the profile.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    /// The profile, HOME and chromedriver's logs, all removed on drop.
    dir: PathBuf,
}

/// An element of the current page, as WebDriver names it.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless Chromium
    /// session in a fresh profile, with the performance log on so that
    /// [`Browser::network_requests`] can list what pages fetched.
    pub fn start() -> Self {
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rtrace-browser-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The port is free when asked; chromedriver binds it an instant
        // later, and says so on its stderr if another process got there
        // first.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let log = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            // Chromium keeps its crash database and dconf's cache under
            // HOME whatever the profile: they go in the temporary
            // directory too, not in root's home.
            .env("HOME", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .stdin(Stdio::null())
            // Files, not pipes: nobody reads them while the tests run,
            // and a full pipe would stall chromedriver.
            .stdout(log("chromedriver.out"))
            .stderr(log("chromedriver.err"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start chromedriver (Debian package chromium-driver): {e}")
            });
        let mut browser = Self {
            driver,
            port,
            session: String::new(),
            dir,
        };
        browser.wait_ready();
        let profile = browser.dir.join("profile");
        let args: Vec<String> = [
            "--headless=new",
            // Root (the tests' user) cannot have Chromium's sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-sync",
            "--no-first-run",
            "--mute-audio",
            // The window; headless Chromium keeps room for its absent
            // toolbars, so pages and screenshots get 1400x857.
            "--window-size=1400,1000",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect();
        let caps = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "args": args },
                    "goog:loggingPrefs": { "performance": "ALL" },
                }
            }
        });
        let created = browser.command("POST", "/session", Some(&caps));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {created}"))
            .to_owned();
        // The first tab opens the new tab page (Debian's search engine's,
        // with its own scripts and images), which would show among the
        // tests' requests: leave it for a blank page before they begin.
        browser.session_command("POST", "/url", Some(&json!({ "url": "about:blank" })));
        browser.network_requests();
        browser
    }

    /// Polls `/status` until chromedriver is ready for a session.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!(
                    "chromedriver exited ({status}) before it was ready: {}",
                    self.driver_log()
                );
            }
            if let Ok((200, body)) = self.http("GET", "/status", None)
                && body["value"]["ready"] == true
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "chromedriver not ready on port {} after {START_TIMEOUT:?}: {}",
                    self.port,
                    self.driver_log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What chromedriver printed, for failure messages.
    fn driver_log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!(
            "stderr: {:?}; stdout: {:?}",
            read("chromedriver.err"),
            read("chromedriver.out")
        )
    }

    /// One HTTP exchange with chromedriver: the status code and the body
    /// as JSON (null when empty). Errors are the connection's.
    fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, Value)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        let body = body.map(Value::to_string).unwrap_or_default();
        // WebDriver's POSTs carry a JSON object even when they have
        // nothing to say (a click).
        let body = if body.is_empty() && method == "POST" {
            "{}".to_owned()
        } else {
            body
        };
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
             Content-Type: application/json; charset=utf-8\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )?;
        // chromedriver says `Connection: close` but keeps the connection
        // open: the answer ends where its length says, not at EOF.
        let mut raw = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        let (status, content) = loop {
            if let Some(answer) = parse_answer(&raw, false) {
                break answer;
            }
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break parse_answer(&raw, true).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "chromedriver's answer cut short: {:?}",
                        String::from_utf8_lossy(&raw)
                    ))
                })?;
            }
            raw.extend_from_slice(&buf[..n]);
        };
        if content.iter().all(u8::is_ascii_whitespace) {
            return Ok((status, Value::Null));
        }
        let value = serde_json::from_slice(&content).map_err(|e| {
            std::io::Error::other(format!(
                "{e} in chromedriver's answer: {:?}",
                String::from_utf8_lossy(&content)
            ))
        })?;
        Ok((status, value))
    }

    /// Sends a WebDriver command and returns its `value`; panics with
    /// WebDriver's error otherwise.
    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, mut answer) = self
            .http(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}; {}", self.driver_log()));
        let value = answer["value"].take();
        if status != 200 || value.get("error").is_some() {
            let mut error = value;
            // chromedriver's own native stack, of no use to a test's reader.
            if let Some(e) = error.as_object_mut() {
                e.remove("stacktrace");
            }
            panic!("WebDriver {method} {path} failed (HTTP {status}): {error}");
        }
        value
    }

    /// [`Browser::command`] on a path under this session.
    fn session_command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.command(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Opens local file `path` and waits for it to load.
    pub fn goto(&self, path: &Path) {
        let path = std::fs::canonicalize(path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        let url = format!("file://{}", percent_encode(&path.to_string_lossy()));
        self.session_command("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body: it `return`s its value) with
    /// `args` as `arguments`; returns what it returned. Pass elements as
    /// [`Element::to_json`].
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.session_command(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Runs `script` with `args` and a last argument, a callback, which it
    /// calls with its value; returns that value. Chromium allows 30 s.
    pub fn execute_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.session_command(
            "POST",
            "/execute/async",
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Polls JavaScript expression `script` until it is truthy; returns
    /// its value. Panics with the last value after `timeout`.
    pub fn wait_for(&self, script: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.execute(&format!("return ({script});"), Vec::new());
            if truthy(&value) {
                return value;
            }
            if Instant::now() > deadline {
                panic!("{script} still {value} after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The first element matching CSS selector `css`; panics when none does.
    pub fn find(&self, css: &str) -> Element<'_> {
        let found = self.session_command("POST", "/element", Some(&selector(css)));
        self.element(&found)
    }

    /// Every element matching CSS selector `css`, in document order.
    pub fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let found = self.session_command("POST", "/elements", Some(&selector(css)));
        found
            .as_array()
            .unwrap_or_else(|| panic!("elements {css:?}: {found}"))
            .iter()
            .map(|e| self.element(e))
            .collect()
    }

    fn element(&self, reference: &Value) -> Element<'_> {
        let id = reference[ELEMENT_KEY]
            .as_str()
            .unwrap_or_else(|| panic!("not an element: {reference}"));
        Element {
            browser: self,
            id: id.to_owned(),
        }
    }

    /// Drags `from` onto `to` with the mouse, as a hand would: presses on
    /// `from`'s centre, moves to `to`'s centre by way of the midpoint
    /// (pages that follow `mousemove` see the drag under way) and releases.
    pub fn drag(&self, from: &Element, to: &Element) {
        let (fx, fy, fw, fh) = from.rect();
        let (tx, ty, tw, th) = to.rect();
        // Offsets are from `to`'s centre; both centres are on screen, so
        // the midpoint between them is too.
        let half = |a: f64, b: f64| ((a - b) / 2.0).round() as i64;
        let (mx, my) = (
            half(fx + fw / 2.0, tx + tw / 2.0),
            half(fy + fh / 2.0, ty + th / 2.0),
        );
        let actions = json!({
            "actions": [{
                "type": "pointer",
                "id": "mouse",
                "parameters": { "pointerType": "mouse" },
                "actions": [
                    { "type": "pointerMove", "duration": 0, "origin": from.to_json(), "x": 0, "y": 0 },
                    { "type": "pointerDown", "button": 0 },
                    { "type": "pause", "duration": 100 },
                    { "type": "pointerMove", "duration": 100, "origin": to.to_json(), "x": mx, "y": my },
                    { "type": "pointerMove", "duration": 100, "origin": to.to_json(), "x": 0, "y": 0 },
                    { "type": "pointerUp", "button": 0 },
                ],
            }]
        });
        self.session_command("POST", "/actions", Some(&actions));
        // Leaves no button or key held for the next action.
        self.session_command("DELETE", "/actions", None);
    }

    /// Saves a PNG of the window's visible part to `path`.
    pub fn screenshot(&self, path: &Path) {
        let png = self.session_command("GET", "/screenshot", None);
        write_png(&png, path);
    }

    /// The URL of every request the browser sent since the last call (or
    /// since the session began): the page, its scripts, styles, images
    /// and fetches, from Chromium's performance log, which each call
    /// empties.
    pub fn network_requests(&self) -> Vec<String> {
        let entries =
            self.session_command("POST", "/se/log", Some(&json!({ "type": "performance" })));
        let mut urls = Vec::new();
        for entry in entries.as_array().into_iter().flatten() {
            let Some(message) = entry["message"].as_str() else {
                continue;
            };
            let message: Value = serde_json::from_str(message)
                .unwrap_or_else(|e| panic!("performance log entry not JSON ({e}): {message}"));
            // Each entry wraps a DevTools event: {"message": {"method", "params"}, "webview"}.
            let event = &message["message"];
            if event["method"] == "Network.requestWillBeSent"
                && let Some(url) = event["params"]["request"]["url"].as_str()
            {
                urls.push(url.to_owned());
            }
        }
        urls
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session quits Chromium; killing chromedriver alone
        // would leave it running.
        if !self.session.is_empty() {
            let _ = self.http("DELETE", &format!("/session/{}", self.session), None);
        }
        // The session ends a second or so before Chromium's processes
        // (zygotes, crash handlers) do: wait for them, so that the next
        // test starts on a quiet machine and nothing writes in the
        // directory as it is removed. Each names the directory (profile,
        // crash database) on its command line, and no other process does.
        let deadline = Instant::now() + Duration::from_secs(10);
        while using(&self.dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Element<'_> {
    /// The element as a script argument of [`Browser::execute`] (where it
    /// arrives as the DOM node).
    pub fn to_json(&self) -> Value {
        json!({ ELEMENT_KEY: self.id })
    }

    fn command(&self, method: &str, what: &str, body: Option<&Value>) -> Value {
        self.browser
            .session_command(method, &format!("/element/{}{what}", self.id), body)
    }

    /// Clicks the element's centre, scrolling it into view first.
    pub fn click(&self) {
        self.command("POST", "/click", None);
    }

    /// Attribute `name`, or None where the element has none.
    pub fn attr(&self, name: &str) -> Option<String> {
        let value = self.command("GET", &format!("/attribute/{}", percent_encode(name)), None);
        value.as_str().map(str::to_owned)
    }

    /// The element's text as rendered (what the reader sees, not hidden
    /// text).
    pub fn text(&self) -> String {
        let value = self.command("GET", "/text", None);
        value
            .as_str()
            .unwrap_or_else(|| panic!("text: {value}"))
            .to_owned()
    }

    /// Types `keys` into the element, focusing it first.
    pub fn send_keys(&self, keys: &str) {
        self.command("POST", "/value", Some(&json!({ "text": keys })));
    }

    /// The element's box in CSS pixels, relative to the document:
    /// (x, y, width, height).
    pub fn rect(&self) -> (f64, f64, f64, f64) {
        let r = self.command("GET", "/rect", None);
        let get = |k: &str| {
            r[k].as_f64()
                .unwrap_or_else(|| panic!("rect without {k}: {r}"))
        };
        (get("x"), get("y"), get("width"), get("height"))
    }

    /// Saves a PNG of the element alone to `path`.
    pub fn screenshot(&self, path: &Path) {
        let png = self.command("GET", "/screenshot", None);
        write_png(&png, path);
    }
}

/// Whether a running process names `dir` on its command line (a zombie's
/// is empty).
fn using(dir: &Path) -> bool {
    let needle = dir.to_string_lossy().into_owned().into_bytes();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
    })
}

fn selector(css: &str) -> Value {
    json!({ "using": "css selector", "value": css })
}

/// JavaScript's truthiness of a value as WebDriver returns it.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0 && !n.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

fn write_png(base64: &Value, path: &Path) {
    let text = base64
        .as_str()
        .unwrap_or_else(|| panic!("screenshot not base64 text: {base64}"));
    let png = decode_base64(text).unwrap_or_else(|| panic!("screenshot not base64: {text:.80}"));
    std::fs::write(path, png).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// Standard base64 (with or without padding); None on anything else.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let digits: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let digits = digits
        .strip_suffix(b"==")
        .or_else(|| digits.strip_suffix(b"="))
        .unwrap_or(&digits);
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        if group.len() == 1 {
            return None;
        }
        let mut bits = 0u32;
        for (i, &c) in group.iter().enumerate() {
            bits |= value(c)? << (18 - 6 * i);
        }
        out.extend_from_slice(&bits.to_be_bytes()[1..group.len()]);
    }
    Some(out)
}

/// The status and body of the HTTP answer `raw`, once it is whole: its
/// `Content-Length` bytes, its chunks up to the last, or else all there
/// is at the connection's end (`eof`). None while more is to come.
fn parse_answer(raw: &[u8], eof: bool) -> Option<(u16, Vec<u8>)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    if let Some(length) = header("content-length") {
        let length: usize = length.parse().ok()?;
        return Some((status, body.get(..length)?.to_vec()));
    }
    if header("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        return Some((status, dechunk(body)?));
    }
    eof.then(|| (status, body.to_vec()))
}

/// The body of a chunked HTTP answer; None until its last chunk.
fn dechunk(mut raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&raw[..end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        raw = &raw[end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(raw.get(..size)?);
        raw = raw.get(size + 2..)?;
    }
}

/// `text` with every byte but unreserved characters and `/` escaped, for
/// a URL's path.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
