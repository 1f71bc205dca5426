//! The web console's files, served from the binary at `/` and under
//! `/console/`: plain ES modules and CSS, no build step (`docs/console.md`
//! says why). They hold no data, so they are served without credentials;
//! every call the page makes to `/spool/v1` carries the token it was
//! given, under the same origin, host and ownership rules as any client.

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use http_body_util::BodyExt;

use crate::body::{self, Body};
use spool_wire::http::ErrorCode;

/// The page's policy: its own scripts, styles and API only, no inline
/// script or style, no framing, no plugins, forms posting nowhere else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One file: its path, type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $file:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            bytes: include_bytes!(concat!("../console/", $file)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: &[Asset] = &[
    asset!("/", "index.html", "text/html; charset=utf-8"),
    asset!("/console/style.css", "style.css", "text/css; charset=utf-8"),
    asset!("/console/app.js", "app.js", JS),
    asset!("/console/api.js", "api.js", JS),
    asset!("/console/dom.js", "dom.js", JS),
    asset!("/console/runs.js", "runs.js", JS),
    asset!("/console/run.js", "run.js", JS),
    asset!("/console/inbox.js", "inbox.js", JS),
    asset!("/console/schedules.js", "schedules.js", JS),
    asset!("/console/icon.svg", "icon.svg", "image/svg+xml"),
];

/// The paths the console answers, each exactly.
pub fn paths() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|asset| asset.path)
}

/// The reply to `method` on `path`, one of [`paths`]: the file with its
/// type and the page's security headers, or 405 for anything but GET and
/// HEAD.
#[must_use]
pub fn reply(method: &Method, path: &str) -> Response<Body> {
    let Some(asset) = ASSETS.iter().find(|asset| asset.path == path) else {
        return body::error(ErrorCode::RunNotFound, format!("no route {path}"));
    };
    if method != Method::GET && method != Method::HEAD {
        let mut reply = body::error(
            ErrorCode::MethodNotAllowed,
            format!("{method} is not allowed on {path}"),
        );
        reply
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return reply;
    }
    let bytes = if method == Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from_static(asset.bytes)
    };
    let mut reply = Response::new(http_body_util::Full::new(bytes).boxed());
    *reply.status_mut() = StatusCode::OK;
    let headers = reply.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(asset.bytes.len()));
    // Revalidated on every load: an upgraded binary's page is never mixed
    // with an older one's modules.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    reply
}

/// The bytes the page's first load fetches: the page, its stylesheet,
/// its icon and every module.
#[must_use]
pub fn first_load_bytes() -> usize {
    ASSETS.iter().map(|asset| asset.bytes.len()).sum()
}
