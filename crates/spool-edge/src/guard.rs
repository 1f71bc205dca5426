//! What a browser may do to a local server: the origin, host and content
//! type rules every HTTP surface applies before it reads a request.
//!
//! A server on loopback is not private from the user's own browser. Any
//! page the user opens can send it a form POST or a `no-cors` `fetch`
//! (no preflight needed for `text/plain`), open a WebSocket to it, or,
//! through DNS rebinding, read its answers under a name it controls.
//! [`Guard::check`] closes each of those:
//!
//! - **Origin**: a request that carries `Origin` is served only when that
//!   origin is the server's own (`scheme://Host`) or on the allowlist;
//!   allowed foreign origins get CORS answers, preflight included.
//!   Requests without `Origin` (curl, SDKs, other servers) are unaffected:
//!   browsers send it on every cross-origin request that could do harm.
//! - **Host**: on a loopback listener only loopback names are served
//!   (`localhost`, `127.0.0.0/8`, `[::1]`, any port) plus the allowlist:
//!   a rebinding page's requests carry its own name.
//! - **Content type**: a request body must be declared JSON
//!   (`application/json` or `application/*+json`, UTF-8): what a form
//!   cannot send.
//!
//! The guard knows no route and no body; each surface renders a
//! [`Refusal`] in its own error shape.

use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};

use crate::body::{self, Body};

/// How the listener is reached, which decides the `Host` rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// A loopback TCP address: only loopback names, and the allowlist.
    Loopback,
    /// Another TCP address (it needs tokens): the allowlist, or any name
    /// when the allowlist is empty.
    Network,
    /// A Unix socket: no browser reaches it, and `Host` means nothing.
    Unix,
}

/// The origin, host and content-type policy of one listener.
#[derive(Clone, Debug)]
pub struct Guard {
    origins: Vec<String>,
    hosts: Vec<String>,
    reach: Reach,
    /// `https` on a TLS listener: part of the server's own origin.
    scheme: &'static str,
}

impl Default for Guard {
    /// The strictest policy: a loopback listener over plain HTTP, with no
    /// foreign origin and no other host allowed.
    fn default() -> Self {
        Self {
            origins: Vec::new(),
            hosts: Vec::new(),
            reach: Reach::Loopback,
            scheme: "http",
        }
    }
}

/// A value that cannot go on an allowlist.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// Not `scheme://host[:port]` with an `http` or `https` scheme.
    #[error(
        "`{0}` is not an origin: write scheme://host[:port] (http or https), with no path, e.g. http://localhost:3000"
    )]
    Origin(String),
    /// Not a host name or address, with no port.
    #[error(
        "`{0}` is not a host name: write a name or address without a port, e.g. spool.internal"
    )]
    Host(String),
}

/// Why a request was refused before any route saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `Origin` is neither the server's own nor allowed (403
    /// `origin_not_allowed`).
    Origin(String),
    /// `Host` is not served on this listener (403 `host_not_allowed`).
    Host(String),
    /// The body is not declared JSON in UTF-8 (415
    /// `unsupported_media_type`).
    MediaType(String),
    /// A `multipart/*` body: a file upload, which the surface answers in
    /// its own words (the HTTP channel's `files_unsupported`).
    Upload(String),
}

impl Refusal {
    /// The stable code, the same on every surface.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Origin(_) => "origin_not_allowed",
            Self::Host(_) => "host_not_allowed",
            Self::MediaType(_) | Self::Upload(_) => "unsupported_media_type",
        }
    }

    /// The HTTP status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Origin(_) | Self::Host(_) => StatusCode::FORBIDDEN,
            Self::MediaType(_) | Self::Upload(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    /// What the client is told.
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Self::Origin(origin) => format!(
                "requests from origin {origin} are not allowed; the server allows its own origin and those given with --allow-origin"
            ),
            Self::Host(host) => format!(
                "host `{host}` is not served here; the server answers loopback names and those given with --allow-host"
            ),
            Self::MediaType(kind) => format!(
                "a request body must be JSON (Content-Type: application/json, UTF-8), not `{kind}`"
            ),
            Self::Upload(_) => {
                "file uploads are not supported: send a JSON body (Content-Type: application/json)"
                    .to_owned()
            }
        }
    }
}

/// What a request that passed needs on its reply.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    /// The allowed foreign origin to name in `Access-Control-Allow-Origin`.
    cors: Option<HeaderValue>,
}

impl Pass {
    /// Adds the CORS headers an allowed foreign origin needs to read the
    /// reply; a same-origin or origin-less request's reply is unchanged.
    pub fn decorate(&self, response: &mut Response<Body>) {
        if let Some(origin) = &self.cors {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            headers.append(header::VARY, HeaderValue::from_static("Origin"));
            headers.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(EXPOSED),
            );
        }
    }
}

/// The request headers a browser may send on an allowed origin: a bearer
/// token, the body's type, and an SSE client's resume position.
const ALLOWED_HEADERS: &str = "authorization, content-type, last-event-id";
/// The reply headers a page on an allowed origin may read.
const EXPOSED: &str = "retry-after, www-authenticate, idempotent-replayed";
/// How long a browser may reuse a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// What [`Guard::check`] decided.
#[derive(Debug)]
pub enum Verdict {
    /// Serve the request; decorate its reply with the [`Pass`].
    Pass(Pass),
    /// A CORS preflight from this allowed origin: answer it with
    /// [`preflight`] and the route's methods, serve nothing.
    Preflight(HeaderValue),
    /// Refuse the request with this.
    Refuse(Refusal),
}

impl Guard {
    /// The strictest policy ([`Guard::default`]).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows requests from `origin` (`scheme://host[:port]`), with CORS
    /// answers a browser needs to read the replies.
    ///
    /// # Errors
    ///
    /// [`GuardError::Origin`] for anything but an http(s) origin.
    pub fn allow_origin(mut self, origin: &str) -> Result<Self, GuardError> {
        let normalized =
            normalize_origin(origin).ok_or_else(|| GuardError::Origin(origin.to_owned()))?;
        if !self.origins.contains(&normalized) {
            self.origins.push(normalized);
        }
        Ok(self)
    }

    /// Serves `host` (a name or address, no port) besides loopback names.
    ///
    /// # Errors
    ///
    /// [`GuardError::Host`] for an empty value or one with a port, path or
    /// scheme.
    pub fn allow_host(mut self, host: &str) -> Result<Self, GuardError> {
        let name = parse_host(host)
            .filter(|(_, port)| port.is_none())
            .map(|(name, _)| name.to_ascii_lowercase())
            .ok_or_else(|| GuardError::Host(host.to_owned()))?;
        if !self.hosts.contains(&name) {
            self.hosts.push(name);
        }
        Ok(self)
    }

    /// The same policy for a listener reached as `reach`, over `https`
    /// when `tls`.
    #[must_use]
    pub fn reached(mut self, reach: Reach, tls: bool) -> Self {
        self.reach = reach;
        self.scheme = if tls { "https" } else { "http" };
        self
    }

    /// The same policy for `listener`.
    #[must_use]
    pub fn for_listener(self, listener: &crate::Listener) -> Self {
        match listener {
            crate::Listener::Tcp(tcp) | crate::Listener::Tls(tcp, _) => {
                let tls = matches!(listener, crate::Listener::Tls(..));
                // An address that cannot be read is not assumed private.
                let loopback = tcp.local_addr().is_ok_and(|a| a.ip().is_loopback());
                let reach = if loopback {
                    Reach::Loopback
                } else {
                    Reach::Network
                };
                self.reached(reach, tls)
            }
            crate::Listener::Unix(..) => self.reached(Reach::Unix, false),
        }
    }

    /// Whether the allowlists are empty (a policy nobody configured).
    #[must_use]
    pub fn is_default(&self) -> bool {
        self.origins.is_empty() && self.hosts.is_empty()
    }

    /// Checks a request's head.
    #[must_use]
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Verdict {
        // The host first: a rebinding page's request is refused whatever
        // it claims to be from.
        let host = match headers.get(header::HOST).map(HeaderValue::to_str) {
            None => None,
            Some(Ok(host)) => Some(host),
            Some(Err(_)) => return Verdict::Refuse(Refusal::Host("(not ASCII)".into())),
        };
        if let Some(host) = host
            && !self.serves_host(host)
        {
            return Verdict::Refuse(Refusal::Host(host.to_owned()));
        }
        let mut pass = Pass::default();
        if let Some(origin) = headers.get(header::ORIGIN) {
            let text = origin.to_str().unwrap_or("(not ASCII)");
            match self.origin_is(text, host) {
                Some(Foreign::No) => {}
                Some(Foreign::Allowed) => pass.cors = Some(origin.clone()),
                None => return Verdict::Refuse(Refusal::Origin(text.to_owned())),
            }
            if method == Method::OPTIONS
                && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
            {
                return Verdict::Preflight(origin.clone());
            }
        }
        if let Some(refusal) = media_type(method, headers) {
            return Verdict::Refuse(refusal);
        }
        Verdict::Pass(pass)
    }

    /// Whether a `Host` value is served on this listener.
    fn serves_host(&self, value: &str) -> bool {
        if self.reach == Reach::Unix {
            return true;
        }
        let Some((name, _)) = parse_host(value) else {
            return false;
        };
        if self
            .hosts
            .iter()
            .any(|host| host.eq_ignore_ascii_case(name))
        {
            return true;
        }
        match self.reach {
            Reach::Loopback => is_loopback_name(name),
            // Tokens guard a network listener; names narrow it only when
            // the operator gave some.
            Reach::Network => self.hosts.is_empty(),
            Reach::Unix => true,
        }
    }

    /// `Some(No)` for the server's own origin, `Some(Allowed)` for an
    /// allowed foreign one, `None` for any other.
    fn origin_is(&self, origin: &str, host: Option<&str>) -> Option<Foreign> {
        let normalized = normalize_origin(origin)?;
        let own = host.and_then(|host| normalize_origin(&format!("{}://{host}", self.scheme)));
        if own.as_deref() == Some(normalized.as_str()) {
            return Some(Foreign::No);
        }
        self.origins
            .contains(&normalized)
            .then_some(Foreign::Allowed)
    }
}

enum Foreign {
    No,
    Allowed,
}

/// The reply to a preflight from an allowed `origin` (what
/// [`Verdict::Preflight`] carries) for a route that takes `methods`.
#[must_use]
pub fn preflight(origin: &HeaderValue, methods: &[Method]) -> Response<Body> {
    let mut reply = body::empty(StatusCode::NO_CONTENT);
    let allowed: Vec<&str> = methods.iter().map(Method::as_str).collect();
    let headers = reply.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    if let Ok(methods) = HeaderValue::from_str(&allowed.join(", ")) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, methods);
    }
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOWED_HEADERS),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(PREFLIGHT_MAX_AGE),
    );
    reply
}

/// The refusal for a request whose body is not declared JSON in UTF-8.
/// A request with no body (no `Content-Length` above 0, not chunked) needs
/// no type: `POST /addresses/NAME` from curl sends none.
fn media_type(method: &Method, headers: &HeaderMap) -> Option<Refusal> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    // A multipart type is an upload whatever its length: the surface
    // answers it in its own words.
    if let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/")
        })
    {
        return Some(Refusal::Upload(value.to_owned()));
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let has_body = length.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return None;
    }
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Some(Refusal::MediaType("(none)".into()));
    };
    let Ok(value) = value.to_str() else {
        return Some(Refusal::MediaType("(not ASCII)".into()));
    };
    let mut parts = value.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    let json = essence.eq_ignore_ascii_case("application/json")
        || essence
            .get(..12)
            .is_some_and(|kind| kind.eq_ignore_ascii_case("application/"))
            && essence.len() > 17
            && essence[essence.len() - 5..].eq_ignore_ascii_case("+json")
            && !essence[12..].contains('/');
    // JSON is UTF-8 (RFC 8259): a charset that says otherwise means the
    // bytes would be read as something they are not.
    let utf8 = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, charset)) if name.trim().eq_ignore_ascii_case("charset") => {
            let charset = charset.trim().trim_matches('"');
            charset.eq_ignore_ascii_case("utf-8") || charset.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    });
    (!json || !utf8).then(|| Refusal::MediaType(value.to_owned()))
}

/// `scheme://host[:port]`, lowercased, with the scheme's default port
/// dropped; `None` for anything else (`null`, a path, another scheme).
fn normalize_origin(origin: &str) -> Option<String> {
    let (scheme, rest) = origin.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (name, port) = parse_host(rest)?;
    let name = name.to_ascii_lowercase();
    Some(match port {
        Some(port) if port != default_port => format!("{scheme}://{name}:{port}"),
        _ => format!("{scheme}://{name}"),
    })
}

/// A `Host` value (or an origin's authority) as its name, as written but
/// for a trailing dot (`localhost.` names `localhost`), and its port:
/// `[::1]:8080` is `("[::1]", 8080)`. `None` for an empty name, a port that
/// is not a number, or anything with a path, user or query. Nothing is
/// allocated: every request passes here.
fn parse_host(value: &str) -> Option<(&str, Option<u16>)> {
    let value = value.trim();
    if value.is_empty() || value.contains(['/', '@', '?', '#', ' ', '\\']) {
        return None;
    }
    let (name, port) = if value.starts_with('[') {
        let end = value.find(']')?;
        let (name, after) = value.split_at(end + 1);
        name[1..end].parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            after => Some(after.strip_prefix(':')?),
        };
        (name, port)
    } else {
        match value.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (value, None),
        }
    };
    if name.is_empty() || (!name.starts_with('[') && name.contains(':')) {
        return None;
    }
    let port = match port {
        None => None,
        Some(port) => Some(port.parse::<u16>().ok()?),
    };
    Some((name.strip_suffix('.').unwrap_or(name), port))
}

/// `localhost`, an IPv4 address in 127.0.0.0/8, or `[::1]`. A rebinding
/// page can only send a name it controls, never these.
fn is_loopback_name(name: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    }
    name.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn refusal(verdict: Verdict) -> Option<&'static str> {
        match verdict {
            Verdict::Refuse(refusal) => Some(refusal.code()),
            Verdict::Pass(_) | Verdict::Preflight(_) => None,
        }
    }

    #[test]
    fn loopback_names_on_any_port_are_served_and_rebinding_names_are_not() {
        let guard = Guard::new();
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.:1",
            "127.0.0.1",
            "127.1.2.3:9",
            "[::1]:8080",
            "[::1]",
        ] {
            let verdict = guard.check(&Method::GET, &headers(&[("host", host)]));
            assert_eq!(refusal(verdict), None, "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "[::2]:8080",
            "127.0.0.1.nip.io",
            "",
            "localhost:port",
        ] {
            let verdict = guard.check(&Method::GET, &headers(&[("host", host)]));
            assert_eq!(refusal(verdict), Some("host_not_allowed"), "{host}");
        }
    }

    #[test]
    fn an_allowed_host_is_served_on_loopback_and_narrows_a_network_listener() {
        let guard = Guard::new().allow_host("spool.internal").unwrap();
        let get = |guard: &Guard, host: &str| {
            refusal(guard.check(&Method::GET, &headers(&[("host", host)])))
        };
        assert_eq!(get(&guard, "spool.internal:8080"), None);
        let network = guard.clone().reached(Reach::Network, false);
        assert_eq!(get(&network, "spool.internal"), None);
        assert_eq!(get(&network, "other.example"), Some("host_not_allowed"));
        let open = Guard::new().reached(Reach::Network, false);
        assert_eq!(get(&open, "other.example"), None);
        let unix = Guard::new().reached(Reach::Unix, false);
        assert_eq!(get(&unix, "anything"), None);
        assert!(Guard::new().allow_host("a.example:80").is_err());
        assert!(Guard::new().allow_host("http://a.example").is_err());
    }

    #[test]
    fn a_foreign_origin_is_refused_and_the_own_and_allowed_ones_pass() {
        let guard = Guard::new().allow_origin("HTTP://App.Example:80").unwrap();
        let check = |origin: &str| {
            guard.check(
                &Method::GET,
                &headers(&[("host", "127.0.0.1:8080"), ("origin", origin)]),
            )
        };
        assert_eq!(
            refusal(check("http://evil.example")),
            Some("origin_not_allowed")
        );
        assert_eq!(refusal(check("null")), Some("origin_not_allowed"));
        assert_eq!(
            refusal(check("https://127.0.0.1:8080")),
            Some("origin_not_allowed")
        );
        assert_eq!(
            refusal(check("http://127.0.0.1:8081")),
            Some("origin_not_allowed")
        );
        let Verdict::Pass(own) = check("http://127.0.0.1:8080") else {
            panic!("the server's own origin is served");
        };
        assert!(own.cors.is_none());
        let Verdict::Pass(allowed) = check("http://app.example") else {
            panic!("an allowed origin is served");
        };
        assert_eq!(allowed.cors.unwrap(), "http://app.example");
    }

    #[test]
    fn a_preflight_from_an_allowed_origin_names_the_routes_methods_and_never_a_wildcard() {
        let guard = Guard::new().allow_origin("http://app.example").unwrap();
        let verdict = guard.check(
            &Method::OPTIONS,
            &headers(&[
                ("host", "localhost:8080"),
                ("origin", "http://app.example"),
                ("access-control-request-method", "POST"),
            ]),
        );
        let Verdict::Preflight(origin) = verdict else {
            panic!("a preflight is answered");
        };
        let reply = preflight(&origin, &[Method::GET, Method::POST]);
        let h = reply.headers();
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_ORIGIN], "http://app.example");
        assert_eq!(h[header::ACCESS_CONTROL_ALLOW_METHODS], "GET, POST");
        assert!(
            h[header::ACCESS_CONTROL_ALLOW_HEADERS]
                .to_str()
                .unwrap()
                .contains("authorization")
        );
        assert!(!h.contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
    }

    #[test]
    fn every_body_a_form_or_no_cors_fetch_can_send_is_refused_as_not_json() {
        let guard = Guard::new();
        let post = |content_type: Option<&str>, length: &str| {
            let mut pairs = vec![("host", "127.0.0.1"), ("content-length", length)];
            if let Some(t) = content_type {
                pairs.push(("content-type", t));
            }
            refusal(guard.check(&Method::POST, &headers(&pairs)))
        };
        for kind in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin1",
            "application/jsonx",
            "text/json",
        ] {
            assert_eq!(
                post(Some(kind), "9"),
                Some("unsupported_media_type"),
                "{kind}"
            );
        }
        assert_eq!(post(None, "9"), Some("unsupported_media_type"));
        assert_eq!(
            post(Some("multipart/form-data; boundary=x"), "9"),
            Some("unsupported_media_type")
        );
        for kind in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
            "application/json; charset=\"UTF-8\"",
        ] {
            assert_eq!(post(Some(kind), "9"), None, "{kind}");
        }
        // No body, no type needed.
        assert_eq!(post(None, "0"), None);
        assert_eq!(post(Some("text/plain"), "0"), None);
    }
}
