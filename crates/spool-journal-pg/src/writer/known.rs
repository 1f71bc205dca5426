//! A batch planned from the heads this writer knows, written in one round
//! trip; a stale head or a fence that no longer holds sends it the usual
//! way.

use super::*;

/// A batch of plain appends planned from the heads the writer knows.
pub(super) struct Planned {
    /// The appends planned, in order: the caller, the run and its plan.
    pub(super) appends: Vec<(AppendReply, RunId, Plan)>,
    /// Appends their plan refused (an invalid append): so answered
    /// whatever becomes of the rest.
    pub(super) refused: Vec<Done>,
    /// Each run's head after the batch.
    pub(super) changed: HashMap<RunId, Head>,
    /// The runs the batch creates (their first append, from no head).
    pub(super) created: Vec<String>,
}

pub(super) type AppendReply = tokio::sync::oneshot::Sender<Result<Vec<Envelope>, JournalError>>;

/// The batch planned from `known` heads, or the batch as it came when
/// any operation needs more than those heads (a claim, a probe, a run
/// not known that the append does not create, an append not at its known
/// head, an event that changes an index), checked before anything is
/// taken apart. A run's first append (`run_created` at position 0, of a
/// run this writer does not know) is planned from no head: if the run
/// exists after all, its first row is there and the statement fails on
/// it.
pub(super) fn plan_known(known: &HashMap<RunId, Head>, batch: Vec<Op>) -> Result<Planned, Vec<Op>> {
    let plain = {
        let mut next: HashMap<&RunId, Seq> = HashMap::new();
        batch.iter().all(|op| {
            let Op::Append { run, append, .. } = op else {
                return false;
            };
            let expected = append.expected();
            let Some(at) = next
                .get(run)
                .copied()
                .or_else(|| known.get(run).map(|head| head.next_seq))
                .or_else(|| {
                    let creates = expected == Seq(0)
                        && matches!(
                            append.events().next(),
                            Some(spool_journal::Event::RunCreated(_))
                        );
                    creates.then_some(Seq(0))
                })
            else {
                return false;
            };
            if expected != at || append.events().any(changes_indexes) {
                return false;
            }
            next.insert(run, Seq(at.0 + append.len() as u64));
            true
        })
    };
    if !plain {
        return Err(batch);
    }
    let mut planned = Planned {
        appends: Vec::with_capacity(batch.len()),
        refused: Vec::new(),
        changed: HashMap::new(),
        created: Vec::new(),
    };
    for op in batch {
        let Op::Append { run, append, reply } = op else {
            unreachable!("only appends were let through");
        };
        let head = planned.changed.get(&run).or_else(|| known.get(&run));
        let creates = head.is_none();
        match link(&run, head, append) {
            Err(refused) => planned.refused.push(Done::Append(reply, Err(refused))),
            Ok(plan) => {
                if creates {
                    planned.created.push(run.as_str().to_owned());
                }
                planned.changed.insert(run.clone(), plan.head.clone());
                planned.appends.push((reply, run, plan));
            }
        }
    }
    Ok(planned)
}

/// What became of a batch written from known heads.
pub(super) enum Known {
    /// Committed: the callers' answers, and the heads now known.
    Committed(Vec<Done>, HashMap<RunId, Head>),
    /// Nothing recorded (a head was stale, the fence did not hold, a
    /// statement failed): the refusals to answer, and the rest of the
    /// batch, to be written the usual way.
    Again(Vec<Done>, Vec<Op>),
    /// The connection was lost with the `COMMIT` sent: recorded or not.
    Unknown(Vec<Done>, String),
}

/// Writes a batch planned from known heads in one round trip: `BEGIN`,
/// the runs' locks (as every writer takes them), one statement writing
/// the rows, the heads and the notification when the node is alive and
/// holds every run's lease, and `COMMIT`, pipelined.
pub(super) async fn write_known(
    client: &Client,
    st: &Statements,
    announce: &Announce,
    fence: Option<i64>,
    planned: Planned,
) -> Known {
    let Planned {
        mut appends,
        refused,
        changed,
        created,
    } = planned;
    let mut columns = Columns::default();
    for (_, run, plan) in &mut appends {
        columns.push(run, std::mem::take(&mut plan.rows));
    }
    let heads = HeadColumns::of(&changed);
    let mut runs: Vec<&str> = heads.ids.clone();
    runs.sort_unstable();
    let runs_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&runs];
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &columns.run_ids,
        &columns.seqs,
        &columns.bodies,
        &columns.hashes,
    ];
    params.extend(heads.params());
    params.push(&announce.channel);
    params.push(&announce.store);
    let node;
    let statement = match fence {
        Some(fenced) => {
            node = fenced;
            params.push(&node);
            params.push(&created);
            &st.known_fenced
        }
        None => {
            params.push(&created);
            &st.known
        }
    };
    // Every result is awaited before any is judged, so none of the
    // pipelined statements is dropped unanswered.
    let (begun, locked, written, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        client.execute(&st.lock, &runs_param),
        client.query_one(statement, &params),
        client.batch_execute("COMMIT"),
    );
    let outcome = begun
        .and(locked.map(drop))
        .and(written)
        .and_then(|row| committed.map(|()| row));
    let again = |appends: Vec<(AppendReply, RunId, Plan)>, refused: Vec<Done>| {
        Known::Again(
            refused,
            appends
                .into_iter()
                .map(|(reply, run, plan)| Op::Append {
                    run,
                    append: plan.into_encoded(),
                    reply,
                })
                .collect(),
        )
    };
    match outcome {
        Ok(row) if row.get::<_, i64>(0) == columns.seqs.len() as i64 => {
            let mut done = refused;
            done.extend(appends.into_iter().map(|(reply, run, plan)| {
                Done::Append(reply, Ok((run, plan.envelopes, plan.head.next_seq)))
            }));
            Known::Committed(done, changed)
        }
        // The fence did not hold: nothing was written, and the usual way
        // tells each caller why.
        Ok(_) => again(appends, refused),
        Err(error) if client.is_closed() => {
            let mut done = refused;
            done.extend(
                appends
                    .into_iter()
                    .map(|(reply, ..)| Done::Append(reply, Err(JournalError::Closed))),
            );
            Known::Unknown(done, error.to_string())
        }
        Err(error) => {
            tracing::debug!(target: "spool::journal", %error, "a batch from known heads was not written; writing it again from the heads stored");
            again(appends, refused)
        }
    }
}

/// Heads as the columns the upserts take.
pub(super) struct HeadColumns<'a> {
    pub(super) ids: Vec<&'a str>,
    pub(super) next: Vec<i64>,
    pub(super) hashes: Vec<&'a [u8]>,
    pub(super) statuses: Vec<String>,
    pub(super) titles: Vec<Option<&'a str>>,
    pub(super) created: Vec<i64>,
    pub(super) updated: Vec<i64>,
}

impl<'a> HeadColumns<'a> {
    pub(super) fn of(changed: &'a HashMap<RunId, Head>) -> Self {
        let mut columns = Self {
            ids: Vec::with_capacity(changed.len()),
            next: Vec::with_capacity(changed.len()),
            hashes: Vec::with_capacity(changed.len()),
            statuses: Vec::with_capacity(changed.len()),
            titles: Vec::with_capacity(changed.len()),
            created: Vec::with_capacity(changed.len()),
            updated: Vec::with_capacity(changed.len()),
        };
        for (run, head) in changed {
            columns.ids.push(run.as_str());
            columns
                .next
                .push(seq_sql(head.next_seq).unwrap_or(i64::MAX));
            columns.hashes.push(&head.last_hash[..]);
            columns.statuses.push(head.status.encode());
            columns.titles.push(head.title.as_deref());
            columns.created.push(nanos(head.created_at));
            columns.updated.push(nanos(head.updated_at));
        }
        columns
    }

    pub(super) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 7] {
        [
            &self.ids,
            &self.next,
            &self.hashes,
            &self.statuses,
            &self.titles,
            &self.created,
            &self.updated,
        ]
    }
}
