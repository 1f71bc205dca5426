//! A `tracing` layer that keeps every span a test opens: its name, its
//! fields (recorded later ones too) and its parent's name. Shared by the
//! transports' span tests (`#[path]`-included).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// One span as the test saw it: its name, fields and parent's name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) name: String,
    pub(crate) fields: HashMap<String, String>,
    pub(crate) parent: Option<String>,
}

#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<HashMap<u64, Seen>>>);

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

impl Capture {
    /// Every span seen so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().values().cloned().collect()
    }

    /// A subscriber with this capture at debug level, for
    /// `tracing::subscriber::set_default`.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        use tracing_subscriber::layer::SubscriberExt;
        tracing_subscriber::registry()
            .with(self.clone())
            .with(tracing_subscriber::filter::LevelFilter::DEBUG)
    }
}
