//! A batch the usual way: one transaction that locks and reads its runs'
//! heads, writes rows, index changes and heads, answers claims, and
//! commits fenced.

use super::*;

/// Why a batch did not commit.
pub(super) enum Failure {
    /// Before `COMMIT` was sent: nothing is recorded.
    Before(String),
    /// `COMMIT` itself failed: recorded or not, depending on whether the
    /// server got it (the caller tells by whether the connection lives).
    Commit(String),
}

/// Applies the batch in one transaction and commits it. Every operation
/// gets a `Done`, to be answered by the caller once the outcome is known.
pub(super) async fn transact(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    fence: Option<i64>,
    now: time::OffsetDateTime,
    batch: Vec<Op>,
) -> (Vec<Done>, Result<(), Failure>, HashMap<RunId, Head>) {
    let before = |e: tokio_postgres::Error| Failure::Before(e.to_string());
    let mut runs: Vec<&str> = batch
        .iter()
        .filter_map(|op| match op {
            Op::Append { run, .. } => Some(run.as_str()),
            _ => None,
        })
        .collect();
    runs.sort_unstable();
    runs.dedup();
    // One round trip: the statements are pipelined, and the server runs
    // them in order (the run locks, then the node, then the leases, as a
    // takeover locks them, then the heads).
    let started = async {
        if runs.is_empty() {
            client.batch_execute("BEGIN").await?;
            return Ok((Vec::new(), None));
        }
        let runs_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&runs];
        let Some(node) = fence else {
            let ((), _, heads) = tokio::try_join!(
                client.batch_execute("BEGIN"),
                client.execute(&st.lock, &runs_param),
                client.query(&st.heads, &runs_param),
            )?;
            return Ok((heads, None));
        };
        let node_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&node];
        let ((), _, alive, leases, heads) = tokio::try_join!(
            client.batch_execute("BEGIN"),
            client.execute(&st.lock, &runs_param),
            client.query_opt(&st.fence_node, &node_param),
            client.query(&st.fence_leases, &runs_param),
            client.query(&st.heads, &runs_param),
        )?;
        let alive = alive.is_some_and(|row| row.get::<_, bool>(0));
        let leases: HashMap<String, (i64, Option<String>)> = leases
            .iter()
            .map(|row| (row.get::<_, String>(0), (row.get(1), row.get(2))))
            .collect();
        Ok((
            heads,
            Some(Fenced {
                node,
                alive,
                leases,
            }),
        ))
    }
    .await;
    let (stored, fenced) = match started {
        Ok(rows) => rows,
        Err(error) => {
            let done = batch
                .into_iter()
                .map(|op| Done::refused(op, JournalError::Closed))
                .collect();
            return (done, Err(before(error)), HashMap::new());
        }
    };
    let mut heads: HashMap<RunId, Head> = HashMap::with_capacity(stored.len());
    let mut broken: Option<String> = None;
    for row in &stored {
        match stored_run_id(row.get(0)).and_then(|run| Ok((head_of(&run, row, 1)?, run))) {
            Ok((head, run)) => {
                heads.insert(run, head);
            }
            Err(error) => broken = Some(error.to_string()),
        }
    }
    // Runs with no head that are deleted ones: refused, their ids are
    // never used again. Asked only when some run has no head (a run
    // being created, nearly always).
    let headless: Vec<&str> = runs
        .iter()
        .copied()
        .filter(|run| !stored.iter().any(|row| row.get::<_, &str>(0) == *run))
        .collect();
    let mut deleted: Vec<String> = Vec::new();
    if broken.is_none() && !headless.is_empty() {
        match client
            .query(
                "SELECT run_id FROM spool_tombstones WHERE run_id = ANY($1::text[])",
                &[&headless],
            )
            .await
        {
            Ok(rows) => deleted = rows.iter().map(|row| row.get(0)).collect(),
            Err(error) => broken = Some(error.to_string()),
        }
    }
    // Heads this transaction changes, written once per run at the end.
    let mut changed: HashMap<RunId, Head> = HashMap::new();
    // Runs with no lease yet that this batch appends to: this node's now.
    let mut leased: Vec<String> = Vec::new();
    let mut columns = Columns::default();
    let mut done = Vec::with_capacity(batch.len());
    for op in batch {
        if let Some(reason) = &broken {
            done.push(Done::refused(op, JournalError::storage(reason.clone())));
            continue;
        }
        let entry = match op {
            Op::Append { run, append, reply } => {
                let head = changed.get(&run).or_else(|| heads.get(&run));
                if head.is_none() && deleted.iter().any(|gone| gone == run.as_str()) {
                    done.push(Done::Append(
                        reply,
                        Err(JournalError::RunDeleted { run: run.clone() }),
                    ));
                    continue;
                }
                // Whether the append takes the run's lease (nobody holds it).
                let mut takes_lease = false;
                if let Some(fenced) = &fenced {
                    match fenced.check(&run) {
                        Ok(held) => takes_lease = !held,
                        Err(lost) => {
                            done.push(Done::Append(reply, Err(lost)));
                            continue;
                        }
                    }
                }
                match link(&run, head, append) {
                    Err(refused) => Done::Append(reply, Err(refused)),
                    Ok(plan) => match write_changes(client, st, &run, &plan.changes).await {
                        Err(error) => {
                            broken = Some(error.to_string());
                            Done::Append(reply, Err(JournalError::storage(error.to_string())))
                        }
                        Ok(Some(refused)) => Done::Append(reply, Err(refused)),
                        Ok(None) => {
                            let next = plan.head.next_seq;
                            columns.push(&run, plan.rows);
                            if takes_lease && !leased.iter().any(|r| r == run.as_str()) {
                                leased.push(run.as_str().to_owned());
                            }
                            changed.insert(run.clone(), plan.head);
                            Done::Append(reply, Ok((run, plan.envelopes, next)))
                        }
                    },
                }
            }
            Op::Claim { key, holder, reply } => match claim(client, st, &key, &holder).await {
                Ok(answer) => Done::Claim(reply, answer),
                Err(error) => {
                    broken = Some(error.to_string());
                    Done::Claim(reply, Err(JournalError::storage(error.to_string())))
                }
            },
            Op::Delete { .. } => unreachable!("deletions are committed on their own"),
            Op::Define {
                digest,
                document,
                reply,
            } => {
                if let Err(error) = client
                    .execute(
                        "INSERT INTO spool_definitions (digest, document) VALUES ($1, $2)
                         ON CONFLICT (digest) DO NOTHING",
                        &[&digest, &document],
                    )
                    .await
                {
                    broken = Some(error.to_string());
                }
                Done::Probe(reply)
            }
            Op::Probe { reply } => {
                let probed_at = now
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default();
                if let Err(error) = client.execute(&st.probe, &[&probed_at]).await {
                    broken = Some(error.to_string());
                }
                Done::Probe(reply)
            }
        };
        done.push(entry);
    }
    if let Some(reason) = broken {
        return (done, Err(Failure::Before(reason)), changed);
    }
    let leases = fence
        .filter(|_| !leased.is_empty())
        .map(|node| (leased, node));
    let committed = write_and_commit(client, st, announce, &columns, &changed, leases).await;
    (done, committed, changed)
}

/// What fencing found at the start of a batch.
pub(super) struct Fenced {
    pub(super) node: i64,
    pub(super) alive: bool,
    /// Each run's holder, with its address while it is a member.
    pub(super) leases: HashMap<String, (i64, Option<String>)>,
}

impl Fenced {
    /// Whether this node may append to `run`: `Ok(true)` when it holds
    /// the run's lease, `Ok(false)` when nobody does (it takes it).
    pub(super) fn check(&self, run: &RunId) -> Result<bool, JournalError> {
        let lost = |reason: String| JournalError::LeaseLost {
            run: run.clone(),
            reason,
        };
        if !self.alive {
            return Err(JournalError::Lapsed {
                run: run.clone(),
                node: self.node,
            });
        }
        match self.leases.get(run.as_str()) {
            Some((holder, _)) if *holder == self.node => Ok(true),
            Some((holder, Some(address))) => Err(lost(format!(
                "node {holder} at {address} holds its lease: send it there"
            ))),
            Some((holder, None)) => Err(lost(format!("node {holder} holds its lease"))),
            None => Ok(false),
        }
    }
}

/// The batch's rows, its heads, its notifications, the leases it takes
/// and the `COMMIT`, pipelined on the one connection: one round trip and
/// the server's fsync.
///
/// A statement that fails aborts the transaction, and the `COMMIT` behind
/// it then rolls back (the server answers it without an error), so any
/// failed statement means nothing was recorded, unless the connection
/// itself was lost, when the commit may have happened.
pub(super) async fn write_and_commit(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    columns: &Columns,
    changed: &HashMap<RunId, Head>,
    leases: Option<(Vec<String>, i64)>,
) -> Result<(), Failure> {
    let outcome = write_rows(client, st, announce, columns, changed, leases.as_ref()).await;
    match outcome {
        Ok(()) => Ok(()),
        Err(error) if client.is_closed() => Err(Failure::Commit(error.to_string())),
        Err(error) => Err(Failure::Before(error.to_string())),
    }
}

pub(super) async fn write_rows(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    columns: &Columns,
    changed: &HashMap<RunId, Head>,
    leases: Option<&(Vec<String>, i64)>,
) -> Result<(), tokio_postgres::Error> {
    if changed.is_empty() {
        // Claims and probes only.
        return client.batch_execute("COMMIT").await;
    }
    let rows: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [
        &columns.run_ids,
        &columns.seqs,
        &columns.bodies,
        &columns.hashes,
    ];
    let head_columns = HeadColumns::of(changed);
    let mut heads = Vec::from(head_columns.params());
    heads.push(&announce.channel);
    heads.push(&announce.store);
    let taken = async {
        match leases {
            Some((runs, node)) => client.execute(&st.lease_take, &[runs, node]).await,
            None => Ok(0),
        }
    };
    // Every result is awaited before any is judged, so none of the
    // pipelined statements is dropped unanswered.
    let (events, heads, taken, committed) = tokio::join!(
        client.execute(&st.events, &rows),
        client.execute(&st.heads_put, &heads),
        taken,
        client.batch_execute("COMMIT"),
    );
    events?;
    heads?;
    taken?;
    committed
}

/// Writes an append's index changes; `Ok(Some(refusal))` when an index
/// refuses it, with everything it wrote undone.
pub(super) async fn write_changes(
    client: &Client,
    st: &Statements,
    run: &RunId,
    changes: &[IndexChange],
) -> Result<Option<JournalError>, tokio_postgres::Error> {
    if changes.is_empty() {
        return Ok(None);
    }
    let guarded = changes
        .iter()
        .any(|c| matches!(c, IndexChange::Bind(_) | IndexChange::Operation { .. }));
    if guarded {
        client.batch_execute("SAVEPOINT spool_append").await?;
    }
    let id = run.as_str();
    let mut refused = None;
    for change in changes {
        match change {
            IndexChange::Bind(address) => {
                let owner: String = client
                    .query_one(&st.bind, &[&address.namespace, &address.name, &id])
                    .await?
                    .get(0);
                if owner != id {
                    refused = Some(match stored_run_id(&owner) {
                        Ok(holder) => JournalError::AddressTaken {
                            address: address.clone(),
                            run: holder,
                        },
                        Err(error) => error,
                    });
                    break;
                }
            }
            IndexChange::Operation {
                scope,
                operation_id,
            } => {
                let owner: String = client
                    .query_one(&st.operation, &[scope, operation_id, &id])
                    .await?
                    .get(0);
                if owner != id {
                    refused = Some(match stored_run_id(&owner) {
                        Ok(holder) => JournalError::OperationTaken {
                            operation_id: operation_id.clone(),
                            run: holder,
                        },
                        Err(error) => error,
                    });
                    break;
                }
            }
            IndexChange::Unbind(address) => {
                client
                    .execute(&st.unbind, &[&address.namespace, &address.name, &id])
                    .await?;
            }
            IndexChange::UnbindAll => {
                client.execute(&st.unbind_all, &[&id]).await?;
            }
            IndexChange::UnbindNamespace(namespace) => {
                client
                    .execute(&st.unbind_namespace, &[&id, namespace])
                    .await?;
            }
            IndexChange::Settle {
                call_id,
                output,
                seq,
            } => {
                let seq = seq_sql(*seq).unwrap_or(i64::MAX);
                client
                    .execute(&st.settle, &[&output.to_string(), &seq, &id, call_id])
                    .await?;
            }
            IndexChange::Release { call_id } => {
                client.execute(&st.release, &[&id, call_id]).await?;
            }
        }
    }
    if guarded {
        if refused.is_some() {
            client
                .batch_execute("ROLLBACK TO SAVEPOINT spool_append")
                .await?;
        }
        client
            .batch_execute("RELEASE SAVEPOINT spool_append")
            .await?;
    }
    Ok(refused)
}

/// Decides a claim inside the transaction; the outer error breaks the
/// batch, the inner one answers this caller only.
pub(super) async fn claim(
    client: &Client,
    st: &Statements,
    key: &ClaimKey,
    holder: &CallRef,
) -> Result<Result<Claim, JournalError>, tokio_postgres::Error> {
    // Twice at most: a claim taken by another process between our read
    // and our insert is read back (the insert waited for it to commit).
    for _ in 0..2 {
        let row = client
            .query_opt(&st.claim_get, &[&key.tool, &key.key])
            .await?;
        let existing = match row.map(|row| stored_claim(&row)).transpose() {
            Ok(existing) => existing,
            Err(error) => return Ok(Err(error)),
        };
        match decide_claim(existing, holder) {
            ClaimDecision::Take => {
                let taken = client
                    .execute(
                        &st.claim_take,
                        &[&key.tool, &key.key, &holder.run.as_str(), &holder.call_id],
                    )
                    .await?;
                if taken == 1 {
                    return Ok(Ok(Claim::Won));
                }
            }
            ClaimDecision::Answer(answer) => {
                return Ok(answer.map_err(|by| JournalError::CallInFlight { by }));
            }
        }
    }
    Ok(Err(JournalError::storage(
        "a claim was taken and gone again while it was being decided",
    )))
}

pub(super) fn stored_claim(row: &tokio_postgres::Row) -> Result<ClaimRow, JournalError> {
    let output: Option<String> = row.get(2);
    let settled_seq: Option<i64> = row.get(3);
    let settled = match (output, settled_seq) {
        (Some(output), Some(seq)) => {
            let output: Value = serde_json::from_str(&output).map_err(|e| {
                JournalError::storage(format!("a settled claim's output is not JSON: {e}"))
            })?;
            Some((output, stored_seq(seq)))
        }
        _ => None,
    };
    Ok(ClaimRow {
        holder: CallRef {
            run: stored_run_id(row.get(0))?,
            call_id: row.get(1),
        },
        settled,
    })
}
