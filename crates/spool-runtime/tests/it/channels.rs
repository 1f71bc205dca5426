//! Host channels and credentials.

use std::sync::Arc;

use spool_journal::fold::Status;
use spool_journal::store::memory::MemoryJournal;
use spool_runtime::ErrorKind;
use spool_runtime::{Accepted, Credentials, MessageRequest, Runtime};

use crate::support::*;

fn hello(text: &str) -> MessageRequest {
    MessageRequest {
        text: text.into(),
        ..MessageRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_channel_maps_its_conversations_to_runs_by_name() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let slack = runtime.channel("slack").unwrap();
    let Accepted::Started { run, turn } = slack
        .from("C042/thread-9", hello("hi"), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    settle(&runtime, &run, &turn).await;
    assert_eq!(
        slack.lookup("C042/thread-9").await.unwrap().run_id,
        run,
        "the conversation leads to its run"
    );
    let Accepted::Started { run: again, .. } = slack
        .from("C042/thread-9", hello("more"), None)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(again, run, "later messages go to the same run");
    let web = runtime.channel("web").unwrap();
    assert_eq!(
        web.lookup("C042/thread-9").await.unwrap_err().kind(),
        ErrorKind::AddressNotFound,
        "namespaces are separate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_binds_a_name_to_an_existing_run_and_refuses_a_taken_one() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    let web = runtime.channel("web").unwrap();
    let Accepted::Started { run, turn } = web.from("session-1", hello("hi"), None).await.unwrap()
    else {
        panic!()
    };
    settle(&runtime, &run, &turn).await;
    let view = web.attach("session-2", &run).await.unwrap();
    assert_eq!(view.status, Status::Completed);
    assert_eq!(web.lookup("session-2").await.unwrap().run_id, run);
    let Accepted::Started { run: other, .. } =
        web.from("session-3", hello("x"), None).await.unwrap()
    else {
        panic!()
    };
    assert!(
        web.attach("session-2", &other).await.is_err(),
        "a name leads to one run at a time"
    );
}

#[test]
fn a_channel_namespace_is_lowercase_letters_digits_and_dashes() {
    let runtime = Runtime::builder(Arc::new(MemoryJournal::new())).build();
    for good in ["slack", "web-2"] {
        assert!(runtime.channel(good).is_ok(), "{good}");
    }
    for bad in ["", "Slack", "a/b", "x y"] {
        assert_eq!(
            runtime.channel(bad).unwrap_err().kind(),
            ErrorKind::BadRequest,
            "{bad:?}"
        );
    }
}

#[test]
fn credentials_read_a_bearer_token_case_insensitively_and_nothing_else() {
    let with = |value: &str| Credentials {
        headers: vec![("authorization".into(), value.into())],
        peer: None,
    };
    assert_eq!(with("Bearer abc").bearer(), Some("abc"));
    assert_eq!(with("bearer  abc ").bearer(), Some("abc"));
    assert_eq!(with("Basic abc").bearer(), None);
    assert_eq!(with("Bearer").bearer(), None);
    assert_eq!(Credentials::default().bearer(), None);
}

#[test]
fn a_journal_moved_by_another_writer_is_owned_elsewhere_and_a_storage_failure_is_storage() {
    use spool_journal::{JournalError, RunId, Seq};
    use spool_runtime::ErrorKind;
    use spool_runtime::RuntimeError;
    let moved = RuntimeError::Journal(JournalError::Conflict {
        run: RunId::new("r").unwrap(),
        expected: Seq(3),
        actual: Seq(4),
    });
    assert_eq!(moved.kind(), ErrorKind::OwnedElsewhere);
    let held = RuntimeError::Journal(JournalError::InUse {
        dir: "j".into(),
        holder: Some(7),
    });
    assert_eq!(held.kind(), ErrorKind::OwnedElsewhere);
    let failed = RuntimeError::Journal(JournalError::storage("disk full"));
    assert_eq!(failed.kind(), ErrorKind::Storage);
}
