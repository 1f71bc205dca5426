//! A deletion: one transaction of its own that takes the run's lock as
//! every append does, checks the lease (in a cluster, unless the deletion
//! is held to a head) and the head it was asked to find, removes the run's
//! rows and writes its tombstone.

use spool_journal::store::{Deletion, Tombstone};

use super::*;

/// Deletes `run`, answering its tombstone (and whether this transaction
/// wrote it) or why not. Nothing is left open: a refusal rolls back.
pub(super) async fn delete(
    client: &Client,
    fence: Option<i64>,
    run: &RunId,
    deletion: Deletion,
    now: time::OffsetDateTime,
) -> Result<Tombstone, JournalError> {
    client.batch_execute("BEGIN").await.map_err(storage)?;
    let result = delete_in(client, fence, run, deletion, now).await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    match client.batch_execute(end).await {
        Ok(()) => result,
        Err(error) if result.is_ok() => Err(storage(error)),
        Err(error) => {
            tracing::debug!(target: "spool::journal", %error, "rollback after a refused deletion");
            result
        }
    }
}

async fn delete_in(
    client: &Client,
    fence: Option<i64>,
    run: &RunId,
    deletion: Deletion,
    now: time::OffsetDateTime,
) -> Result<Tombstone, JournalError> {
    let id = run.as_str();
    // The lock every append takes first: none is under way for the run.
    client
        .execute(
            &format!("SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext($1))"),
            &[&id],
        )
        .await
        .map_err(storage)?;
    if let Some(row) = client
        .query_opt(
            "SELECT deleted_ns, deleted_by, reason, events FROM spool_tombstones WHERE run_id = $1",
            &[&id],
        )
        .await
        .map_err(storage)?
    {
        return Ok(tombstone_of(run, &row));
    }
    // A conditional deletion (`expected`: retention's, of a run listed as
    // ended) goes ahead whichever node holds the lease: the lock above
    // and the head checked below hold it to the run as listed, and the
    // holder's next append finds the tombstone. One without is a command
    // for the node that drives the run.
    if let Some(node) = fence.filter(|_| deletion.expected.is_none()) {
        // Leases before heads, in the order appends lock them.
        let lease = client
            .query_opt(
                "SELECT l.node, n.address, coalesce(n.expires_at > clock_timestamp(), false)
                 FROM spool_leases l LEFT JOIN spool_nodes n ON n.id = l.node
                 WHERE l.run_id = $1 FOR UPDATE OF l",
                &[&id],
            )
            .await
            .map_err(storage)?;
        if let Some(lease) = lease {
            let (holder, address, alive): (i64, Option<String>, bool) =
                (lease.get(0), lease.get(1), lease.get(2));
            if holder != node && alive {
                return Err(JournalError::LeaseLost {
                    run: run.clone(),
                    reason: match address {
                        Some(address) => {
                            format!("node {holder} at {address} holds its lease: send it there")
                        }
                        None => format!("node {holder} holds its lease"),
                    },
                });
            }
        }
    }
    let Some(head) = client
        .query_opt(
            "SELECT next_seq FROM spool_runs WHERE run_id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(storage)?
    else {
        return Err(JournalError::NoSuchRun { run: run.clone() });
    };
    let next = stored_seq(head.get(0));
    deletion.check(run, next)?;
    for statement in [
        "DELETE FROM spool_events WHERE run_id = $1",
        "DELETE FROM spool_addresses WHERE run_id = $1",
        "DELETE FROM spool_operations WHERE run_id = $1",
        "DELETE FROM spool_claims WHERE run_id = $1",
        "DELETE FROM spool_leases WHERE run_id = $1",
        "DELETE FROM spool_runs WHERE run_id = $1",
    ] {
        client.execute(statement, &[&id]).await.map_err(storage)?;
    }
    let tombstone = Tombstone {
        run_id: run.clone(),
        deleted_at: now,
        by: deletion.by,
        reason: deletion.reason,
        events: next.0,
    };
    client
        .execute(
            "INSERT INTO spool_tombstones (run_id, deleted_ns, deleted_by, reason, events)
             VALUES ($1, $2, $3, $4, $5)",
            &[
                &id,
                &nanos(now),
                &tombstone.by,
                &tombstone.reason,
                &i64::try_from(tombstone.events).unwrap_or(i64::MAX),
            ],
        )
        .await
        .map_err(storage)?;
    Ok(tombstone)
}

/// A tombstone from its row (`deleted_ns, deleted_by, reason, events`).
pub(crate) fn tombstone_of(run: &RunId, row: &tokio_postgres::Row) -> Tombstone {
    Tombstone {
        run_id: run.clone(),
        deleted_at: time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
            row.get::<_, i64>(0),
        ))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH),
        by: row.get(1),
        reason: row.get(2),
        events: u64::try_from(row.get::<_, i64>(3)).unwrap_or(0),
    }
}
