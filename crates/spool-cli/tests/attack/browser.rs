//! The browser section: what a page in the user's browser can send to a
//! `spool serve` on loopback, over raw sockets, byte for byte as a browser
//! sends it. Cross-origin POSTs in every content type a form or a `no-cors`
//! fetch can send, rebinding `Host` values on every surface, cross-origin
//! WebSocket upgrades, a token offered as a subprotocol, bytes that are not
//! UTF-8, over-long fields, and a revoked token's open streams.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;

use super::{PATIENCE, Reply, exchange, get, post};
use crate::server::{Running, serve, terminate};

/// A raw request with `headers` (each `Name: value`) and `body`.
fn raw(method: &str, path: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut raw = head.into_bytes();
    raw.extend_from_slice(body);
    raw
}

fn refused_with(reply: &Reply, status: u16, code: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.body);
    assert_eq!(reply.json()["code"], code, "{what}: {}", reply.body);
}

fn run_count(addr: &str) -> usize {
    let listed = get(addr, "/spool/v1/runs");
    assert_eq!(listed.status, 200, "{}", listed.body);
    listed.json()["runs"].as_array().unwrap().len()
}

/// A token made by `spool token new NAME` in `file`.
fn token(file: &std::path::Path, name: &str, admin: bool) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spool"));
    command
        .args(["token", "new", name, "--token-file"])
        .arg(file);
    if admin {
        command.arg("--admin");
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_cross_origin_post_in_every_content_type_a_page_can_send_starts_no_run() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let body = br#"{"text": "rm -rf"}"#;
    // What an HTML form (three enctypes) and a `no-cors` fetch send.
    for content_type in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=----x",
    ] {
        let content = format!("Content-Type: {content_type}");
        let reply = exchange(
            addr,
            &raw(
                "POST",
                "/spool/v1/runs",
                &[&host, "Origin: http://evil.example", &content],
                body,
            ),
        );
        refused_with(&reply, 403, "origin_not_allowed", content_type);
        // The same body with no Origin at all (a browser that leaves it
        // out, or a privacy extension that strips it) is refused on its
        // content type.
        let reply = exchange(
            addr,
            &raw("POST", "/spool/v1/runs", &[&host, &content], body),
        );
        assert!(
            matches!(reply.status, 415 | 501),
            "{content_type}: {} {}",
            reply.status,
            reply.body
        );
    }
    // A fetch in `cors` mode with a JSON body from another origin: its
    // preflight, and the request itself, are refused.
    let preflight = exchange(
        addr,
        &raw(
            "OPTIONS",
            "/spool/v1/runs",
            &[
                &host,
                "Origin: http://evil.example",
                "Access-Control-Request-Method: POST",
                "Access-Control-Request-Headers: content-type",
            ],
            b"",
        ),
    );
    refused_with(&preflight, 403, "origin_not_allowed", "preflight");
    let sent = exchange(
        addr,
        &raw(
            "POST",
            "/spool/v1/runs",
            &[&host, "Origin: null", "Content-Type: application/json"],
            body,
        ),
    );
    refused_with(
        &sent,
        403,
        "origin_not_allowed",
        "a sandboxed page's null origin",
    );
    assert_eq!(run_count(addr), 0, "no run was started");
    // The server's own origin (a page it serves) and curl are served.
    let own = exchange(
        addr,
        &raw(
            "POST",
            "/spool/v1/runs",
            &[
                &host,
                &format!("Origin: http://{addr}"),
                "Content-Type: application/json",
            ],
            body,
        ),
    );
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(
        post(addr, "/spool/v1/runs", r#"{"text": "hi"}"#).status,
        200
    );
    assert_eq!(run_count(addr), 2);
    terminate(running);
}

#[test]
fn a_rebinding_host_is_refused_on_every_surface_and_loopback_names_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.as_str();
    let port = addr.rsplit_once(':').unwrap().1;
    let rebound = format!("Host: evil.example:{port}");
    for path in [
        "/spool/v1/health",
        "/spool/v1/runs",
        "/spool/v1/info",
        "/version",
        "/events",
        "/stream",
        "/ws",
        "/mcp",
        "/a2a",
        "/a2a/tasks",
        "/.well-known/agent-card.json",
        "/",
        "/console/app.js",
    ] {
        let reply = exchange(addr, &raw("GET", path, &[&rebound], b""));
        refused_with(&reply, 403, "host_not_allowed", path);
    }
    let reply = exchange(
        addr,
        &raw(
            "POST",
            "/spool/v1/runs",
            &[&rebound, "Content-Type: application/json"],
            br#"{"text": "x"}"#,
        ),
    );
    refused_with(&reply, 403, "host_not_allowed", "POST /runs");
    for name in ["localhost", "127.0.0.1", "[::1]"] {
        let host = format!("Host: {name}:{port}");
        let reply = exchange(addr, &raw("GET", "/spool/v1/health", &[&host], b""));
        assert_eq!(reply.status, 200, "{name}: {}", reply.body);
    }
    terminate(running);

    // A name the operator allows is served too.
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &["--allow-host", "spool.test"]);
    let reply = exchange(
        &running.addr,
        &raw("GET", "/spool/v1/health", &["Host: spool.test"], b""),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    terminate(running);
}

/// The head of a WebSocket handshake's reply.
fn upgrade(addr: &str, headers: &[&str]) -> (u16, String) {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut head = String::from(
        "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    );
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    socket.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(socket);
    let mut reply = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        reply.push_str(&line);
    }
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    (status, reply.to_ascii_lowercase())
}

#[test]
fn a_cross_origin_websocket_upgrade_is_refused_before_it_upgrades() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let (status, head) = upgrade(addr, &[&host, "Origin: http://evil.example"]);
    assert_eq!(status, 403, "{head}");
    assert!(!head.contains("upgrade: websocket"), "{head}");
    let (status, head) = upgrade(addr, &[&host, &format!("Origin: http://{addr}")]);
    assert_eq!(status, 101, "the server's own page upgrades: {head}");
    terminate(running);
}

#[test]
fn a_token_offered_as_a_websocket_subprotocol_admits_and_is_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let secret = token(&tokens, "browser", false);
    let running = serve(dir.path(), &["--token-file", tokens.to_str().unwrap()]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let offer = format!("Sec-WebSocket-Protocol: spool.v1, spool.bearer.{secret}");
    let (status, head) = upgrade(addr, &[&host, &offer]);
    assert_eq!(status, 101, "{head}");
    assert!(
        head.contains("sec-websocket-protocol: spool.v1\r\n"),
        "{head}"
    );
    assert!(!head.contains(&secret), "the token is never echoed: {head}");
    let (status, head) = upgrade(
        addr,
        &[
            &host,
            "Sec-WebSocket-Protocol: spool.v1, spool.bearer.not-the-token",
        ],
    );
    assert_eq!(status, 401, "{head}");
    // Never from the URL: a token in the query admits nothing.
    let reply = exchange(
        addr,
        &raw(
            "GET",
            &format!("/spool/v1/runs?token={secret}"),
            &[&host],
            b"",
        ),
    );
    refused_with(&reply, 401, "unauthenticated", "a token in the query");
    terminate(running);
}

#[test]
fn a_body_that_is_not_utf8_and_fields_over_their_limits_are_refused_with_named_codes() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let json = "Content-Type: application/json";
    let mut latin1 = br#"{"text": "caf"#.to_vec();
    latin1.extend_from_slice(&[0xe9, b'"', b'}']);
    for path in ["/spool/v1/runs", "/spool/v1/addresses/a"] {
        let reply = exchange(addr, &raw("POST", path, &[&host, json], &latin1));
        refused_with(&reply, 400, "bad_request", path);
    }
    let fields = [
        ("address", "a".repeat(100_000), "address_too_long"),
        ("title", "t".repeat(1025), "title_too_long"),
    ];
    for (field, value, code) in fields {
        let body = serde_json::json!({"text": "x", field: value}).to_string();
        let reply = post(addr, "/spool/v1/runs", &body);
        refused_with(&reply, 400, code, field);
    }
    assert_eq!(run_count(addr), 0, "nothing was stored");
    terminate(running);
}

#[test]
fn an_allowed_origin_gets_cors_answers_with_its_preflight_and_never_a_wildcard() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &["--allow-origin", "http://app.example:3000"]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let origin = "Origin: http://app.example:3000";
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    socket
        .write_all(&raw(
            "OPTIONS",
            "/spool/v1/runs/run_x/respond",
            &[
                &host,
                origin,
                "Access-Control-Request-Method: POST",
                "Access-Control-Request-Headers: authorization, content-type",
            ],
            b"",
        ))
        .unwrap();
    let mut head = String::new();
    socket.read_to_string(&mut head).unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 204"), "{head}");
    assert!(
        head.contains("access-control-allow-origin: http://app.example:3000\r\n"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-methods: post\r\n"),
        "{head}"
    );
    assert!(
        head.contains("access-control-allow-headers: authorization, content-type"),
        "{head}"
    );
    assert!(!head.contains("access-control-allow-origin: *"), "{head}");
    assert!(!head.contains("access-control-allow-credentials"), "{head}");
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    socket
        .write_all(&raw(
            "POST",
            "/spool/v1/runs",
            &[&host, origin, "Content-Type: application/json"],
            br#"{"text": "hi"}"#,
        ))
        .unwrap();
    let mut reply = String::new();
    socket.read_to_string(&mut reply).unwrap();
    let lower = reply.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 200"), "{reply}");
    assert!(
        lower.contains("access-control-allow-origin: http://app.example:3000\r\n"),
        "{reply}"
    );
    assert!(lower.contains("vary: origin"), "{reply}");
    terminate(running);
}

/// Reads an open stream until the server ends it; `false` if it is still
/// open after the patience runs out.
fn ends(mut socket: TcpStream) -> bool {
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buffer = [0_u8; 4096];
    loop {
        match socket.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

/// Opens `path` as a streaming GET with `token`, and reads its head.
fn open_stream(addr: &str, path: &str, token: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut first = [0_u8; 12];
    socket.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "{path}");
    socket
}

/// Opens `/ws` with `token` as a browser would offer it (a subprotocol),
/// and reads the handshake's head.
fn open_websocket(addr: &str, token: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        socket,
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: spool.v1, spool.bearer.{token}\r\n\r\n"
    )
    .unwrap();
    let mut first = [0_u8; 12];
    socket.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 101", "the WebSocket opens");
    socket
}

#[test]
fn a_revoked_token_is_refused_and_the_streams_it_opened_end() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let kept = token(&tokens, "kept", false);
    let revoked = token(&tokens, "revoked", false);
    let running = serve(dir.path(), &["--token-file", tokens.to_str().unwrap()]);
    let addr = running.addr.as_str();
    let auth = format!("Authorization: Bearer {kept}");
    let started = exchange(
        addr,
        &raw(
            "POST",
            "/spool/v1/runs",
            &[
                &format!("Host: {addr}"),
                &auth,
                "Content-Type: application/json",
            ],
            br#"{"text": "hi"}"#,
        ),
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let http = open_stream(
        addr,
        &format!("/spool/v1/runs/{run}/stream?cursor=0"),
        &revoked,
    );
    let sse = open_stream(addr, &format!("/events?run_id={run}"), &revoked);
    let still = open_stream(addr, &format!("/spool/v1/runs/{run}/stream"), &kept);
    let websocket = open_websocket(addr, &revoked);
    let output = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["token", "revoke", "revoked", "--token-file"])
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(ends(http), "the HTTP stream of a revoked token ends");
    assert!(ends(sse), "the SSE stream of a revoked token ends");
    assert!(ends(websocket), "the WebSocket of a revoked token ends");
    let reply = exchange(
        addr,
        format!("GET /spool/v1/runs HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {revoked}\r\n\r\n").as_bytes(),
    );
    refused_with(&reply, 401, "unauthenticated", "the revoked token");
    // The other token's stream is untouched: it is still open.
    still
        .set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let mut still = still;
    let mut buffer = [0_u8; 1];
    let open = match still.read(&mut buffer) {
        Ok(n) => n > 0,
        Err(error) => matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(open, "the kept token's stream stays open");
    let listed = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["token", "list", "--token-file"])
        .arg(&tokens)
        .output()
        .unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.starts_with("kept\tsha256:"), "{listed}");
    assert!(
        !listed.contains(&kept) && !listed.contains("revoked"),
        "{listed}"
    );
    terminate(running);
}

/// One MCP session's `tools/call` over raw HTTP (the handshake era's
/// initialize, then the call), as `token`'s holder: the reply's body.
fn mcp_call(addr: &str, token: &str, tool: &str, arguments: &str) -> String {
    let auth = format!("Authorization: Bearer {token}");
    let host = format!("Host: {addr}");
    let send = |headers: &[&str], body: &str| -> String {
        let mut all = vec![
            host.as_str(),
            auth.as_str(),
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
        ];
        all.extend_from_slice(headers);
        let mut socket = TcpStream::connect(addr).unwrap();
        socket.set_read_timeout(Some(PATIENCE)).unwrap();
        socket
            .write_all(&raw("POST", "/mcp", &all, body.as_bytes()))
            .unwrap();
        let mut reply = String::new();
        let _ = socket.read_to_string(&mut reply);
        reply
    };
    let initialized = send(
        &[],
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
    );
    let session = initialized
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("mcp-session-id: ")
                .map(|_| l[16..].trim().to_owned())
        })
        .unwrap_or_else(|| panic!("a session id: {initialized}"));
    let session = format!("Mcp-Session-Id: {session}");
    let version = "MCP-Protocol-Version: 2025-11-25";
    send(
        &[&session, version],
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    );
    send(
        &[&session, version],
        &format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
        ),
    )
}

/// `spool serve --run-access owner` in `dir`, with the tokens of two
/// principals, alice's and bob's.
fn owners(dir: &std::path::Path) -> (Running, String, String) {
    let tokens = dir.join("tokens");
    let alice = token(&tokens, "alice", false);
    let bob = token(&tokens, "bob", false);
    let running = serve(
        dir,
        &[
            "--token-file",
            tokens.to_str().unwrap(),
            "--run-access",
            "owner",
        ],
    );
    (running, alice, bob)
}

#[test]
fn the_mcp_endpoint_applies_the_same_origin_host_token_and_ownership_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (running, alice, bob) = owners(dir.path());
    let addr = running.addr.as_str();
    let port = addr.rsplit_once(':').unwrap().1;
    let host = format!("Host: {addr}");
    let auth = format!("Authorization: Bearer {alice}");
    let initialize = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"page","version":"1"}}}"#;
    let json = "Content-Type: application/json";
    let reply = exchange(
        addr,
        &raw(
            "POST",
            "/mcp",
            &[&host, &auth, json, "Origin: http://evil.example"],
            initialize,
        ),
    );
    refused_with(&reply, 403, "origin_not_allowed", "a foreign origin");
    let rebound = format!("Host: evil.example:{port}");
    let reply = exchange(
        addr,
        &raw("POST", "/mcp", &[&rebound, &auth, json], initialize),
    );
    refused_with(&reply, 403, "host_not_allowed", "a rebound host");
    let reply = exchange(
        addr,
        &raw(
            "POST",
            "/mcp",
            &[&host, &auth, "Content-Type: text/plain"],
            initialize,
        ),
    );
    assert!(
        matches!(reply.status, 415 | 501),
        "a form's content type: {} {}",
        reply.status,
        reply.body
    );
    let reply = exchange(addr, &raw("POST", "/mcp", &[&host, json], initialize));
    assert_eq!(reply.status, 401, "no token: {}", reply.body);

    // Alice's run, through MCP, is hers alone.
    let started = mcp_call(addr, &alice, "start_run", r#"{"text":"mine"}"#);
    let run = started
        .split("\\\"run_id\\\":\\\"")
        .nth(1)
        .or_else(|| started.split("\"run_id\":\"").nth(1))
        .and_then(|rest| rest.split(['"', '\\']).next())
        .unwrap_or_else(|| panic!("a run id: {started}"))
        .to_owned();
    let hers = mcp_call(addr, &alice, "get_run", &format!(r#"{{"run_id":"{run}"}}"#));
    assert!(!hers.contains("run_not_found"), "{hers}");
    let his = mcp_call(addr, &bob, "get_run", &format!(r#"{{"run_id":"{run}"}}"#));
    assert!(
        his.contains("run_not_found"),
        "another's run does not exist for him: {his}"
    );
    let listed = mcp_call(addr, &bob, "list_runs", "{}");
    assert!(!listed.contains(&run), "nor is it listed: {listed}");
    terminate(running);
}

/// One A2A JSON-RPC call as `token`'s holder: the reply.
fn a2a_call(addr: &str, token: &str, method: &str, params: &str) -> Reply {
    exchange(
        addr,
        &raw(
            "POST",
            "/a2a",
            &[
                &format!("Host: {addr}"),
                &format!("Authorization: Bearer {token}"),
                "Content-Type: application/json",
            ],
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#)
                .as_bytes(),
        ),
    )
}

#[test]
fn the_a2a_endpoints_apply_the_same_origin_host_token_and_ownership_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (running, alice, bob) = owners(dir.path());
    let addr = running.addr.as_str();
    let port = addr.rsplit_once(':').unwrap().1;
    let host = format!("Host: {addr}");
    let auth = format!("Authorization: Bearer {alice}");
    let json = "Content-Type: application/json";
    let send = br#"{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"mine"}]}}"#;
    for path in ["/a2a/message:send", "/a2a"] {
        let reply = exchange(
            addr,
            &raw(
                "POST",
                path,
                &[&host, &auth, json, "Origin: http://evil.example"],
                send,
            ),
        );
        refused_with(&reply, 403, "origin_not_allowed", path);
        let reply = exchange(
            addr,
            &raw(
                "POST",
                path,
                &[&host, &auth, "Content-Type: text/plain"],
                send,
            ),
        );
        refused_with(&reply, 415, "unsupported_media_type", path);
        let reply = exchange(addr, &raw("POST", path, &[&host, json], send));
        assert_eq!(reply.status, 401, "{path} without a token: {}", reply.body);
    }
    let rebound = format!("Host: evil.example:{port}");
    let reply = exchange(
        addr,
        &raw("POST", "/a2a/message:send", &[&rebound, &auth, json], send),
    );
    refused_with(&reply, 403, "host_not_allowed", "a rebound host");

    // The card is public (discovery comes before credentials), and says
    // that calls need a bearer token.
    let card = exchange(
        addr,
        &raw("GET", "/.well-known/agent-card.json", &[&host], b""),
    );
    assert_eq!(card.status, 200, "{}", card.body);
    let card = card.json();
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer",
        "{card}"
    );
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    let extended = exchange(
        addr,
        &raw("GET", "/a2a/extendedAgentCard", &[&host, &auth], b""),
    );
    assert_eq!(extended.status, 200, "{}", extended.body);

    // Alice's task is hers alone.
    let sent = exchange(
        addr,
        &raw("POST", "/a2a/message:send", &[&host, &auth, json], send),
    );
    assert_eq!(sent.status, 200, "{}", sent.body);
    let task = sent.json()["task"].clone();
    let (id, context) = (
        task["id"].as_str().unwrap().to_owned(),
        task["contextId"].as_str().unwrap().to_owned(),
    );
    let hers = a2a_call(addr, &alice, "GetTask", &format!(r#"{{"id":"{id}"}}"#));
    assert_eq!(hers.json()["result"]["id"], id.as_str(), "{}", hers.body);
    for (method, params) in [
        ("GetTask", format!(r#"{{"id":"{id}"}}"#)),
        ("CancelTask", format!(r#"{{"id":"{id}"}}"#)),
        ("SubscribeToTask", format!(r#"{{"id":"{id}"}}"#)),
    ] {
        let his = a2a_call(addr, &bob, method, &params);
        assert_eq!(
            his.json()["error"]["code"],
            -32001,
            "{method}: {}",
            his.body
        );
    }
    let his = exchange(
        addr,
        &raw(
            "GET",
            &format!("/a2a/tasks/{id}"),
            &[&host, &format!("Authorization: Bearer {bob}")],
            b"",
        ),
    );
    assert_eq!(his.status, 404, "{}", his.body);
    let into = a2a_call(
        addr,
        &bob,
        "SendMessage",
        &format!(
            r#"{{"message":{{"messageId":"m2","contextId":"{context}","role":"ROLE_USER","parts":[{{"text":"yours?"}}]}}}}"#
        ),
    );
    assert_eq!(into.json()["error"]["code"], -32602, "{}", into.body);
    let listed = a2a_call(addr, &bob, "ListTasks", "{}");
    assert_eq!(
        listed.json()["result"]["tasks"],
        serde_json::json!([]),
        "{}",
        listed.body
    );
    // The same message id from him is a task of his own.
    let same = a2a_call(
        addr,
        &bob,
        "SendMessage",
        r#"{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"mine"}]}}"#,
    );
    assert_ne!(
        same.json()["result"]["task"]["id"],
        id.as_str(),
        "{}",
        same.body
    );
    terminate(running);
}

#[test]
fn the_console_applies_the_same_origin_host_token_and_ownership_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (running, alice, bob) = owners(dir.path());
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    // The page and its modules hold no data: served without a token, with
    // the policy that forbids inline script and framing.
    for path in ["/", "/console/app.js", "/console/api.js"] {
        let reply = exchange(addr, &raw("GET", path, &[&host], b""));
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    }
    let head = exchange(addr, &raw("GET", "/", &[&host], b""));
    assert!(!head.body.contains("<script>"), "no inline script");
    // A module a page on another site asks for is refused like any
    // cross-origin request (the modules are loaded in CORS mode).
    let foreign = exchange(
        addr,
        &raw(
            "GET",
            "/console/app.js",
            &[&host, "Origin: http://evil.example"],
            b"",
        ),
    );
    refused_with(&foreign, 403, "origin_not_allowed", "a foreign origin");
    // What the page reads needs the token, and shows a caller its own
    // runs only: the list, the inbox's count and a run's journal.
    let json = "Content-Type: application/json";
    let start = |token: &str, title: &str| {
        let auth = format!("Authorization: Bearer {token}");
        let body = format!(r#"{{"text": "x", "title": "{title}"}}"#);
        let reply = exchange(
            addr,
            &raw(
                "POST",
                "/spool/v1/runs",
                &[&host, &auth, json],
                body.as_bytes(),
            ),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["run_id"].as_str().unwrap().to_owned()
    };
    let hers = start(&alice, "hers");
    let his = start(&bob, "his");
    let unauthenticated = exchange(addr, &raw("GET", "/spool/v1/runs", &[&host], b""));
    assert_eq!(unauthenticated.status, 401, "{}", unauthenticated.body);
    let auth = format!("Authorization: Bearer {alice}");
    let listed = exchange(
        addr,
        &raw("GET", "/spool/v1/runs?q=h", &[&host, &auth], b""),
    );
    let listed = listed.json();
    assert_eq!(listed["total"], 1, "{listed}");
    assert_eq!(listed["runs"][0]["id"], hers.as_str(), "{listed}");
    let journal = exchange(
        addr,
        &raw(
            "GET",
            &format!("/spool/v1/runs/{his}/events"),
            &[&host, &auth],
            b"",
        ),
    );
    refused_with(&journal, 404, "run_not_found", "another's journal");
    terminate(running);

    // `--no-console` serves no page, and the API as before.
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &["--no-console"]);
    let host = format!("Host: {}", running.addr);
    let reply = exchange(&running.addr, &raw("GET", "/", &[&host], b""));
    refused_with(&reply, 404, "run_not_found", "no console");
    let reply = exchange(&running.addr, &raw("GET", "/spool/v1/runs", &[&host], b""));
    assert_eq!(reply.status, 200, "{}", reply.body);
    terminate(running);
}

#[test]
fn a_cross_origin_or_rebinding_delete_deletes_no_run_and_the_servers_own_page_may() {
    let dir = tempfile::tempdir().unwrap();
    let running = serve(dir.path(), &[]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let port = addr.rsplit_once(':').unwrap().1;
    let started = post(addr, "/spool/v1/runs", r#"{"text": "keep me"}"#);
    assert_eq!(started.status, 200, "{}", started.body);
    let run = serde_json::from_str::<serde_json::Value>(&started.body).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/spool/v1/runs/{run}");
    let foreign = exchange(
        addr,
        &raw(
            "DELETE",
            &path,
            &[&host, "Origin: http://evil.example"],
            b"",
        ),
    );
    refused_with(&foreign, 403, "origin_not_allowed", "a cross-origin DELETE");
    let preflight = exchange(
        addr,
        &raw(
            "OPTIONS",
            &path,
            &[
                &host,
                "Origin: http://evil.example",
                "Access-Control-Request-Method: DELETE",
            ],
            b"",
        ),
    );
    refused_with(
        &preflight,
        403,
        "origin_not_allowed",
        "a DELETE's preflight",
    );
    let rebound = exchange(
        addr,
        &raw(
            "DELETE",
            &path,
            &[&format!("Host: evil.example:{port}")],
            b"",
        ),
    );
    refused_with(
        &rebound,
        403,
        "host_not_allowed",
        "a DELETE on a rebound host",
    );
    assert_eq!(get(addr, &path).status, 200, "the run is still there");
    let own = exchange(
        addr,
        &raw(
            "DELETE",
            &path,
            &[&host, &format!("Origin: http://{addr}")],
            b"",
        ),
    );
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(get(addr, &path).status, 410);
    terminate(running);
}

#[test]
fn a_cross_origin_or_rebinding_reload_reloads_nothing_and_only_an_administrator_may() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let (admin, user) = (token(&tokens, "ops", true), token(&tokens, "user", false));
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nsystem_prompt = \"one\"\n",
    )
    .unwrap();
    let running = serve(dir.path(), &["--token-file", tokens.to_str().unwrap()]);
    let addr = running.addr.as_str();
    let host = format!("Host: {addr}");
    let port = addr.rsplit_once(':').unwrap().1;
    let path = "/spool/v1/agent/reload";
    std::fs::write(
        dir.path().join("spool.toml"),
        "[agent]\nsystem_prompt = \"two\"\n",
    )
    .unwrap();
    let as_admin = format!("Authorization: Bearer {admin}");
    let foreign = exchange(
        addr,
        &raw(
            "POST",
            path,
            &[&host, &as_admin, "Origin: http://evil.example"],
            b"",
        ),
    );
    refused_with(&foreign, 403, "origin_not_allowed", "a cross-origin reload");
    let rebound = exchange(
        addr,
        &raw(
            "POST",
            path,
            &[&format!("Host: evil.example:{port}"), &as_admin],
            b"",
        ),
    );
    refused_with(&rebound, 403, "host_not_allowed", "a rebinding reload");
    let anonymous = exchange(addr, &raw("POST", path, &[&host], b""));
    refused_with(
        &anonymous,
        401,
        "unauthenticated",
        "a reload without a token",
    );
    let as_user = format!("Authorization: Bearer {user}");
    let user_reply = exchange(addr, &raw("POST", path, &[&host, &as_user], b""));
    refused_with(
        &user_reply,
        403,
        "forbidden",
        "a reload with a user's token",
    );
    // None of them reloaded: the administrator's is the first to change it.
    let reloaded = exchange(addr, &raw("POST", path, &[&host, &as_admin], b""));
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);
    assert_eq!(reloaded.json()["changed"], true, "{}", reloaded.body);
    terminate(running);
}
