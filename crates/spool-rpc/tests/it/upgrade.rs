//! `submit.run`'s `upgrade`: a new run records whether it follows newer
//! agent definitions, as `POST /runs` does; a value it does not know is
//! refused as invalid params, naming the two it takes.

use std::sync::Arc;

use serde_json::json;
use spool_journal::store::memory::MemoryJournal;
use spool_journal::{Event, Journal, RunId, Seq};
use spool_rpc::Dispatcher;
use spool_runtime::Runtime;
use spool_wire::run::Upgrade;

use crate::access::{call, token};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_run_records_the_runs_upgrade_policy_and_refuses_one_it_does_not_know() {
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let dispatcher = Dispatcher::new(Runtime::builder(Arc::clone(&journal)).build());
    let alice = token("alice", false);
    let started = call(
        &dispatcher,
        &alice,
        "submit.run",
        json!({"text": "hi", "upgrade": "next_turn"}),
    )
    .await
    .unwrap();
    let run = RunId::new(started["run_id"].as_str().unwrap()).unwrap();
    let log = journal.read(&run, Seq(0)).await.unwrap();
    let Event::RunCreated(created) = &log[0].event else {
        panic!("a run starts with run_created");
    };
    assert_eq!(created.upgrade, Some(Upgrade::NextTurn));

    let refused = call(
        &dispatcher,
        &alice,
        "submit.run",
        json!({"text": "hi", "upgrade": "sometimes"}),
    )
    .await
    .unwrap_err();
    assert_eq!(refused["code"], -32602, "{refused}");
    assert!(
        refused["data"].as_str().unwrap().contains("next_turn"),
        "{refused}"
    );
}
