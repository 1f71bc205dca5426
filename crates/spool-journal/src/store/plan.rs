//! The part of an append every store shares: a run's head, the rows an
//! append encodes and chains, the index changes it makes, and a stored row
//! decoded and checked. Public, so a store in another crate (PostgreSQL's)
//! persists exactly what SQLite does.

use super::*;

/// Where a run's log ends: what an append needs to know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// The run's next position.
    pub next_seq: Seq,
    /// The hash of its last event ([`chain::GENESIS`] before the first).
    pub last_hash: Hash,
    /// Its public state after its last event.
    pub status: Status,
    /// Its title, from `run_created`.
    pub title: Option<String>,
    /// When it was created.
    pub created_at: OffsetDateTime,
    /// When its last event was recorded.
    pub updated_at: OffsetDateTime,
}

/// Orders a listing as every store lists runs: the most recently updated
/// first, then by run id.
pub(crate) fn newest_first(runs: &mut [RunSummary]) {
    runs.sort_by(|a, b| {
        b.updated_at
            .cmp(&a.updated_at)
            .then_with(|| a.run_id.cmp(&b.run_id))
    });
}

impl Head {
    /// A run's head before its first event, created at `at`.
    #[must_use]
    pub fn genesis(at: OffsetDateTime) -> Self {
        Head {
            next_seq: Seq(0),
            last_hash: chain::GENESIS,
            status: Status::Pending,
            title: None,
            created_at: at,
            updated_at: at,
        }
    }

    /// Moves the head past `event`, recorded at `at` with chain link
    /// `hash`: what an append does, and what a store that writes heads
    /// behind its log does to read a head from its row and the log's
    /// tail.
    pub fn advance(&mut self, event: &Event, hash: Hash, at: OffsetDateTime) {
        if let Event::RunCreated(created) = event {
            self.title.clone_from(&created.title);
        }
        self.status = transition(&self.status, event);
        self.last_hash = hash;
        self.next_seq = self.next_seq.next();
        self.updated_at = at;
    }

    /// What a listing says of run `run_id` at this head.
    #[must_use]
    pub fn into_summary(self, run_id: RunId) -> RunSummary {
        RunSummary {
            run_id,
            status: self.status,
            title: self.title,
            created_at: self.created_at,
            updated_at: self.updated_at,
            next_seq: self.next_seq,
        }
    }
}

/// A stored row: an envelope's exact bytes and its chain hash.
#[derive(Clone, Debug)]
pub struct Row {
    /// Its position.
    pub seq: Seq,
    /// The envelope's JSON, exactly as hashed.
    pub bytes: Vec<u8>,
    /// Its link in the run's hash chain.
    pub hash: Hash,
}

/// What an append changes besides the log.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexChange {
    /// The run takes the address (refused when another run holds it).
    Bind(Address),
    /// The run gives the address up, when it holds it.
    Unbind(Address),
    /// The run gives up every address it holds.
    UnbindAll,
    /// The run gives up its addresses in one namespace.
    UnbindNamespace(String),
    /// The run takes an operation id in a principal's scope (refused when
    /// another run has it).
    Operation {
        /// [`Principal::scope`].
        scope: String,
        /// The operation id.
        operation_id: String,
    },
    /// The run's claimed call completed: its claim, if any, is settled
    /// with this output.
    Settle {
        /// The call.
        call_id: String,
        /// Its output.
        output: std::sync::Arc<Value>,
        /// Where the completion is recorded.
        seq: Seq,
    },
    /// The run's claimed call was abandoned: its unsettled claim goes.
    Release {
        /// The call.
        call_id: String,
    },
}

/// An append, checked and laid out, ready to persist.
#[derive(Debug)]
pub struct Plan {
    /// What the caller is answered with.
    pub envelopes: Vec<Envelope>,
    /// What is stored, one row per envelope.
    pub rows: Vec<Row>,
    /// What changes in the indexes, in order.
    pub changes: Vec<IndexChange>,
    /// The run's head after the append.
    pub head: Head,
}

/// An append encoded before its run's head is known: each event as the
/// envelope it becomes at its expected position and time, and that
/// envelope's bytes as they will be stored and hashed. The caller encodes
/// ([`encode`]), so a store's one writer only links the append to the
/// run's head ([`link`]): encoding is most of what planning costs, and
/// callers are many where the writer is one.
#[derive(Debug)]
pub struct Encoded {
    expected: Seq,
    now: OffsetDateTime,
    envelopes: Vec<Envelope>,
    /// One per envelope, once encoded ([`Encoded::deferred`] leaves them
    /// to [`link`]); none when the append is `invalid`.
    bytes: Option<Vec<Vec<u8>>>,
    /// Why the append breaks the log's shape: what [`link`] refuses it
    /// with, once it is known not to conflict with the run's head.
    invalid: Option<&'static str>,
    /// The rows' chain hashes as linked after a row whose hash is the
    /// first ([`Encoded::chain_after`]): what [`link`] takes when the
    /// run's head turns out to end with that hash.
    chained: Option<(Hash, Vec<Hash>)>,
}

impl Encoded {
    /// The append as [`encode`] makes it, but with its bytes left to
    /// [`link`]: for a store whose writers are tasks on its callers' own
    /// threads (PostgreSQL's), where encoding in the caller takes no work
    /// off a thread of its own. Measured there, callers that encoded
    /// appended about 8 % fewer events per second than this.
    #[must_use]
    pub fn deferred(run: &RunId, expected: Seq, events: Vec<Event>, now: OffsetDateTime) -> Self {
        let mut invalid = events
            .is_empty()
            .then_some("an append holds at least one event");
        let mut seq = expected;
        let envelopes: Vec<Envelope> = events
            .into_iter()
            .map(|event| {
                let shape = match (&event, seq) {
                    (Event::RunCreated(_), Seq(0)) => None,
                    (Event::RunCreated(_), _) => {
                        Some("`run_created` may only be a run's first event")
                    }
                    (_, Seq(0)) => Some("a run's first event must be `run_created`"),
                    _ => None,
                };
                invalid = invalid.or(shape);
                let envelope = Envelope {
                    run_id: run.clone(),
                    seq,
                    recorded_at: now,
                    event,
                };
                seq = seq.next();
                envelope
            })
            .collect();
        Encoded {
            expected,
            now,
            envelopes,
            bytes: None,
            invalid,
            chained: None,
        }
    }

    /// Hashes the rows as they link after a row whose chain hash is
    /// `prev` (the run's head as the caller last knew it), so the store's
    /// one writer need not: [`link`] takes these hashes when the head it
    /// links to ends with `prev` and the run is the one encoded, and
    /// makes them again otherwise. Hashing was about a twelfth of the
    /// SQLite writer thread's time. Does nothing for an append left to be
    /// encoded ([`Encoded::deferred`]) or one [`link`] refuses.
    pub fn chain_after(&mut self, prev: Hash) {
        let Some(bytes) = &self.bytes else {
            return;
        };
        let mut last = prev;
        let hashes = self
            .envelopes
            .iter()
            .zip(bytes)
            .map(|(envelope, bytes)| {
                last = chain::link(&last, &envelope.run_id, envelope.seq, bytes);
                last
            })
            .collect();
        self.chained = Some((prev, hashes));
    }

    /// The run's next position the caller expects.
    #[must_use]
    pub fn expected(&self) -> Seq {
        self.expected
    }

    /// The events, in order.
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.envelopes.iter().map(|envelope| &envelope.event)
    }

    /// How many events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// Whether it holds no event (an append [`link`] refuses).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }
}

impl Plan {
    /// The append this plan was linked from, to link again to another
    /// head (a store whose head turned out stale). Its bytes are made
    /// again from the envelopes, not taken from the rows: a store may have
    /// moved the rows out to write them.
    #[must_use]
    pub fn into_encoded(self) -> Encoded {
        let expected = self.envelopes.first().map_or(self.head.next_seq, |e| e.seq);
        Encoded {
            expected,
            now: self.head.updated_at,
            envelopes: self.envelopes,
            bytes: None,
            invalid: None,
            chained: None,
        }
    }
}

/// Encodes an append of `events` to `run` at `expected`, recorded at
/// `now`, for [`link`] to check against the run's head.
#[must_use]
pub fn encode(run: &RunId, expected: Seq, events: Vec<Event>, now: OffsetDateTime) -> Encoded {
    let mut append = Encoded::deferred(run, expected, events, now);
    if append.invalid.is_none() {
        append.bytes = Some(append.envelopes.iter().map(envelope_bytes).collect());
    }
    append
}

fn envelope_bytes(envelope: &Envelope) -> Vec<u8> {
    serde_json::to_vec(envelope).expect("envelopes are plain JSON values and always serialize")
}

/// Checks an encoded append against the run's head and lays out its rows
/// (chaining each to the one before), index changes and new head. Pure:
/// every store persists exactly this.
///
/// # Errors
///
/// [`JournalError::Conflict`] when the append's expected position is not
/// the run's next; [`JournalError::InvalidAppend`] for an append that
/// breaks the log's shape.
pub fn link(run: &RunId, head: Option<&Head>, encoded: Encoded) -> Result<Plan, JournalError> {
    let actual = head.map_or(Seq(0), |h| h.next_seq);
    if encoded.expected != actual {
        return Err(JournalError::Conflict {
            run: run.clone(),
            expected: encoded.expected,
            actual,
        });
    }
    if let Some(reason) = encoded.invalid {
        return Err(JournalError::InvalidAppend {
            run: run.clone(),
            reason: reason.to_owned(),
        });
    }
    let now = encoded.now;
    let mut head = head.cloned().unwrap_or_else(|| Head::genesis(now));
    let mut rows = Vec::with_capacity(encoded.envelopes.len());
    let mut changes = Vec::new();
    // One row per envelope, whatever the caller passed: bytes that do
    // not match the envelopes one for one are made again, and so are
    // hashes chained from another head than this one, over other bytes
    // or for another run.
    let count = encoded.envelopes.len();
    let (bytes, mut chained) = match encoded.bytes {
        Some(bytes) if bytes.len() == count => {
            let chained = encoded
                .chained
                .filter(|(prev, hashes)| {
                    *prev == head.last_hash
                        && hashes.len() == count
                        && encoded.envelopes.iter().all(|e| e.run_id == *run)
                })
                .map(|(_, hashes)| hashes.into_iter());
            (bytes, chained)
        }
        _ => (encoded.envelopes.iter().map(envelope_bytes).collect(), None),
    };
    for (envelope, bytes) in encoded.envelopes.iter().zip(bytes) {
        let seq = envelope.seq;
        changes.extend(index_changes(&envelope.event, seq));
        let hash = match chained.as_mut().and_then(Iterator::next) {
            Some(hash) => hash,
            None => chain::link(&head.last_hash, run, seq, &bytes),
        };
        head.advance(&envelope.event, hash, now);
        rows.push(Row { seq, bytes, hash });
    }
    Ok(Plan {
        envelopes: encoded.envelopes,
        rows,
        changes,
        head,
    })
}

/// Checks an append against the run's head and lays out its rows, index
/// changes and new head: [`encode`] then [`link`], for a store that does
/// both in one place.
///
/// # Errors
///
/// As [`link`].
pub fn plan(
    run: &RunId,
    head: Option<&Head>,
    expected: Seq,
    events: Vec<Event>,
    now: OffsetDateTime,
) -> Result<Plan, JournalError> {
    link(run, head, encode(run, expected, events, now))
}

/// Whether appending `event` changes an index (an address, an operation
/// id, a claim) besides the log and the run's head: a store that writes
/// plain appends a quicker way asks this before planning.
///
/// It builds nothing: building the changes would copy a tool's whole
/// output to learn that a completion settles a claim.
#[must_use]
pub fn changes_indexes(event: &Event) -> bool {
    match event {
        Event::RunCreated(created) => {
            created.address.is_some()
                || (created.operation_id.is_some() && created.principal.is_some())
        }
        Event::AddressBound(_)
        | Event::AddressUnbound(_)
        | Event::RunRetired(_)
        | Event::ToolCallCompleted(_)
        | Event::ToolCallResolved(_)
        | Event::ToolCallAbandoned(_) => true,
        _ => false,
    }
}

fn index_changes(event: &Event, seq: Seq) -> Vec<IndexChange> {
    let changes = index_changes_of(event, seq);
    // The two lists of what changes an index stay one.
    debug_assert_eq!(!changes.is_empty(), changes_indexes(event), "{event:?}");
    changes
}

fn index_changes_of(event: &Event, seq: Seq) -> Vec<IndexChange> {
    match event {
        Event::RunCreated(created) => {
            let mut changes = Vec::new();
            if let Some(address) = &created.address {
                changes.push(IndexChange::Bind(address.clone()));
            }
            if let (Some(operation_id), Some(principal)) =
                (&created.operation_id, &created.principal)
            {
                changes.push(IndexChange::Operation {
                    scope: principal.scope(),
                    operation_id: operation_id.clone(),
                });
            }
            changes
        }
        Event::AddressBound(binding) => vec![IndexChange::Bind(binding.address.clone())],
        Event::AddressUnbound(binding) => vec![IndexChange::Unbind(binding.address.clone())],
        Event::RunRetired(retired) => match &retired.namespace {
            None => vec![IndexChange::UnbindAll],
            Some(namespace) => vec![IndexChange::UnbindNamespace(namespace.clone())],
        },
        Event::ToolCallCompleted(done) => vec![IndexChange::Settle {
            call_id: done.call_id.clone(),
            output: done.output.clone(),
            seq,
        }],
        Event::ToolCallResolved(resolved) => vec![IndexChange::Settle {
            call_id: resolved.call_id.clone(),
            output: resolved.output.clone(),
            seq,
        }],
        Event::ToolCallAbandoned(abandoned) => vec![IndexChange::Release {
            call_id: abandoned.call_id.clone(),
        }],
        _ => Vec::new(),
    }
}

/// Decodes a verified row into its envelope, checking it is the row it
/// claims to be.
///
/// # Errors
///
/// [`JournalError::Corrupt`] when the bytes are not an envelope of this
/// run at this position.
pub fn decode_row(run: &RunId, seq: Seq, bytes: &[u8]) -> Result<Envelope, JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        run: run.clone(),
        seq,
        reason,
    };
    // Checked as UTF-8 once, whole: parsing from a `str` then skips the
    // check serde_json makes on every string it reads from bytes (13 %
    // of decoding a typical row).
    let text = std::str::from_utf8(bytes).map_err(|e| corrupt(e.to_string()))?;
    let envelope: Envelope = serde_json::from_str(text).map_err(|e| corrupt(e.to_string()))?;
    if &envelope.run_id != run || envelope.seq != seq {
        return Err(corrupt(format!(
            "the row holds run {} seq {}",
            envelope.run_id, envelope.seq
        )));
    }
    Ok(envelope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    fn at(n: u64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(n as i64)
    }

    fn started(n: u64) -> Event {
        Event::TurnStarted(crate::event::TurnStarted {
            turn_id: crate::TurnId::new(format!("turn-{n}")).unwrap(),
            input: "go".into(),
            context: Vec::new(),
            policy: spool_wire::run::TurnPolicy::Steer,
            from_queue: None,
            operation_id: None,
        })
    }

    /// The plan that creates `run`, at time 1.
    fn created(run: &RunId) -> Plan {
        plan(
            run,
            None,
            Seq(0),
            vec![Event::RunCreated(crate::event::RunCreated::default())],
            at(1),
        )
        .unwrap()
    }

    #[test]
    fn an_append_encoded_before_its_head_is_known_links_as_a_plan_made_with_it_would() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        let encoded = encode(&run, Seq(1), vec![started(1), started(2)], at(2));
        let linked = link(&run, Some(&created.head), encoded).unwrap();
        let planned = plan(
            &run,
            Some(&created.head),
            Seq(1),
            vec![started(1), started(2)],
            at(2),
        )
        .unwrap();
        assert_eq!(linked.envelopes, planned.envelopes);
        // Each row is its envelope's JSON, chained to the row before.
        let mut last = created.head.last_hash;
        for (row, envelope) in planned.rows.iter().zip(&planned.envelopes) {
            assert_eq!(row.bytes, serde_json::to_vec(envelope).unwrap());
            assert_eq!(row.hash, chain::link(&last, &run, row.seq, &row.bytes));
            last = row.hash;
        }
        let hashes = |p: &Plan| {
            p.rows
                .iter()
                .map(|r| (r.seq, r.bytes.clone(), r.hash))
                .collect::<Vec<_>>()
        };
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // Left to the writer to encode, the same rows.
        let deferred = Encoded::deferred(&run, Seq(1), vec![started(1), started(2)], at(2));
        let linked_later = link(&run, Some(&created.head), deferred).unwrap();
        assert_eq!(hashes(&linked_later), hashes(&planned));
        // Turned back (a store whose head was stale) after its rows were
        // moved out to be written, as PostgreSQL's writer does, it links
        // again to the same rows.
        let mut linked = linked;
        drop(std::mem::take(&mut linked.rows));
        let again = link(&run, Some(&created.head), linked.into_encoded()).unwrap();
        assert_eq!(hashes(&again), hashes(&planned));
        assert_eq!(again.head, planned.head);
    }

    #[test]
    fn hashes_a_caller_chained_are_kept_only_when_linked_after_the_head_they_assumed() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        let events = || vec![started(1), started(2)];
        let planned = plan(&run, Some(&created.head), Seq(1), events(), at(2)).unwrap();
        let hashes = |p: &Plan| p.rows.iter().map(|r| r.hash).collect::<Vec<_>>();
        // Chained after the head the run has: the same hashes.
        let mut right = encode(&run, Seq(1), events(), at(2));
        right.chain_after(created.head.last_hash);
        let linked = link(&run, Some(&created.head), right).unwrap();
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // Chained after a head the run no longer has (another append got
        // there first with the same position): made again from the head.
        let mut stale = encode(&run, Seq(1), events(), at(2));
        stale.chain_after([7; 32]);
        let linked = link(&run, Some(&created.head), stale).unwrap();
        assert_eq!(hashes(&linked), hashes(&planned));
        assert_eq!(linked.head, planned.head);
        // A first append chained after the genesis hash.
        let mut first = encode(
            &run,
            Seq(0),
            vec![Event::RunCreated(crate::event::RunCreated::default())],
            at(1),
        );
        first.chain_after(chain::GENESIS);
        assert_eq!(link(&run, None, first).unwrap().head, created.head);
        // Encoded for one run and linked for another: hashed for the run
        // it is linked to.
        let other = RunId::new("run-2").unwrap();
        let mut elsewhere = encode(&other, Seq(1), events(), at(2));
        elsewhere.chain_after(created.head.last_hash);
        let linked = link(&run, Some(&created.head), elsewhere).unwrap();
        let mut last = created.head.last_hash;
        for row in &linked.rows {
            assert_eq!(row.hash, chain::link(&last, &run, row.seq, &row.bytes));
            last = row.hash;
        }
    }

    #[test]
    fn a_stale_expected_position_is_a_conflict_before_the_appends_shape_is_judged() {
        let run = RunId::new("run-1").unwrap();
        let created = created(&run);
        // A second `run_created`, expected at a position the run is not at.
        let misplaced = || {
            encode(
                &run,
                Seq(4),
                vec![Event::RunCreated(crate::event::RunCreated::default())],
                at(2),
            )
        };
        assert!(matches!(
            link(&run, Some(&created.head), misplaced()),
            Err(JournalError::Conflict {
                expected: Seq(4),
                actual: Seq(1),
                ..
            })
        ));
        let mut head = created.head.clone();
        head.next_seq = Seq(4);
        assert!(matches!(
            link(&run, Some(&head), misplaced()),
            Err(JournalError::InvalidAppend { .. })
        ));
        assert!(matches!(
            link(
                &run,
                Some(&created.head),
                encode(&run, Seq(1), Vec::new(), at(2))
            ),
            Err(JournalError::InvalidAppend { .. })
        ));
    }
}
