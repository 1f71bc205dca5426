//! Tracing at the edge: a span per connection, a span per request inside
//! it carrying the run it names, and a span per run's driver, so a slow
//! request can be followed from its socket to the run's turn
//! (`RUST_LOG=spool=debug` shows them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::client::*;

/// One span as the test saw it: its name, fields and parent's name.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    fields: HashMap<String, String>,
    parent: Option<String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<HashMap<u64, Seen>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            parent: ctx
                .span(id)
                .and_then(|span| span.parent())
                .map(|parent| parent.name().to_owned()),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_runs_in_a_span_inside_its_connections_naming_its_run_and_the_run_has_its_own() {
    // Every task of this test runs on this thread, under this subscriber.
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone())
        .with(tracing_subscriber::filter::LevelFilter::DEBUG);
    let _default = tracing::subscriber::set_default(subscriber);
    let server = Server::start(echo_runtime()).await;
    let started = server.post("/spool/v1/runs", r#"{"text": "hi"}"#).await;
    assert_eq!(started.status, 200);
    let run = started.json()["run_id"].as_str().unwrap().to_owned();
    let reply = server.get(&format!("/spool/v1/runs/{run}")).await;
    assert_eq!(reply.status, 200);
    server.stop().await;
    let seen: Vec<Seen> = capture.0.lock().unwrap().values().cloned().collect();
    let named = |name: &str| -> Vec<&Seen> { seen.iter().filter(|s| s.name == name).collect() };
    let requests = named("request");
    let read = requests
        .iter()
        .find(|s| s.fields.get("path").is_some_and(|p| p.ends_with(&run)))
        .unwrap_or_else(|| panic!("the GET's span among {requests:?}"));
    assert_eq!(read.fields.get("method").map(String::as_str), Some("GET"));
    assert_eq!(read.fields.get("run_id"), Some(&run), "{read:?}");
    assert_eq!(read.parent.as_deref(), Some("connection"), "{read:?}");
    let connections = named("connection");
    assert!(
        connections.iter().all(
            |c| c.fields.get("transport").map(String::as_str) == Some("tcp")
                && c.fields.contains_key("peer")
        ),
        "{connections:?}"
    );
    let runs = named("run");
    assert!(
        runs.iter().any(|r| r.fields.get("run_id") == Some(&run)),
        "the run's driver has a span naming it: {runs:?}"
    );
}
