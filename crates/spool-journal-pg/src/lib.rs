//! Spool's PostgreSQL store: the [`Journal`] the SQLite store is, kept in
//! a database that several processes share.
//!
//! It persists exactly what SQLite does (`spool_journal::store::link` lays
//! out every append; both stores only write it down), passes the same
//! conformance suite, and adds what sharing needs:
//!
//! - **Group commit**: a writer task turns the appends that arrive while
//!   its commit is in flight into one transaction, its rows written by one
//!   `INSERT … SELECT FROM unnest(…)` and its run heads by one upsert,
//!   pipelined on its connection. A store has [`Options::writers`] of them
//!   (two by default), each for its own share of the runs, so one's
//!   transaction is under way while another waits for its commit.
//! - **Writers in other processes** (and the other writers of this one): a transaction takes a
//!   transaction-scoped advisory lock per run it appends to (in one
//!   order, so two writers never deadlock on them) before it reads their
//!   heads, so a chain never forks; address and operation-id bindings and
//!   claims are decided by the database's unique keys.
//! - **Subscribers in other processes**: a store that subscribes to a run
//!   another store writes registers its watch in the run's row, and a
//!   commit changing watched runs sends one `NOTIFY` on the schema's
//!   channel, a line per such run; every open store listens on it and
//!   moves its subscribers' positions (a store's own commits reach its
//!   own subscribers in process). Commits to runs nobody watches
//!   elsewhere notify nobody, so they do not queue for the lock under
//!   which PostgreSQL commits notifying transactions one at a time. The
//!   log stays the source of truth: after the listening connection is
//!   lost and made again, every watched run's head is read back, so no
//!   append goes unannounced (`listen` says why none is missed in
//!   between).
//!
//! Methods must be called from within a Tokio runtime.
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

use std::sync::Arc;

use spool_journal::chain::{GENESIS, Hash, Verifier};
use spool_journal::fold::Status;
use spool_journal::store::queue::Op;
use spool_journal::store::sqlite::WriterStats;
use spool_journal::store::{
    BoxFuture, CallRef, Claim, ClaimKey, Clock, Head, Journal, JournalError, RunSummary, SeqWatch,
    Watchers, decode_row, system_clock,
};
use spool_journal::{Address, Envelope, Event, Principal, RunId, Seq};
use time::OffsetDateTime;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::{Client, Config, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use cluster::{Cluster, ClusterOptions, Fence, Member, Renewal};

pub mod cluster;
mod listen;
mod schema;
mod tls;
mod writer;

/// How to open a journal.
#[derive(Clone)]
pub struct Options {
    /// The schema its tables live in, created when missing; `None` keeps
    /// the connection's own `search_path` (by default `public`).
    pub schema: Option<String>,
    /// The most operations one transaction takes.
    pub max_batch: usize,
    /// How many operations may wait for each writer before callers wait.
    pub queue: usize,
    /// How many writers commit at once, each on a connection of its own
    /// and for its own share of the runs (all of one run's appends go
    /// through the same writer, in order): while one waits for its
    /// commit's round trips and flush, another's transaction is under
    /// way, and the server flushes them together.
    pub writers: usize,
    /// Where `recorded_at` comes from.
    pub clock: Clock,
    /// In a cluster, the node's fence ([`Cluster::fence`]): appends are
    /// refused for runs whose lease another node holds, and all of them
    /// once the node's own lease lapsed. `None` for a journal one process
    /// owns.
    pub fence: Option<Fence>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("schema", &self.schema)
            .field("max_batch", &self.max_batch)
            .field("queue", &self.queue)
            .field("writers", &self.writers)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            schema: None,
            max_batch: 512,
            queue: 4096,
            writers: 2,
            clock: system_clock(),
            fence: None,
        }
    }
}

/// Where the journal is: the server, and the schema within it.
#[derive(Clone)]
pub(crate) struct Target {
    config: Config,
    tls: MakeRustlsConnect,
    schema: Option<String>,
}

impl std::fmt::Debug for Target {
    // The settings, which `Config` prints with the password hidden; the
    // TLS connector has nothing to show.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("config", &self.config)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// What `url` names, in `schema` (or the connection's own).
    pub(crate) fn parse(url: &str, schema: Option<String>) -> Result<Self, JournalError> {
        let (config, tls) = tls::parse(url)?;
        Ok(Self {
            config,
            tls,
            schema,
        })
    }

    /// A new connection, with TLS as the URL's `sslmode` asks, and the
    /// driver the caller must spawn.
    pub(crate) async fn open(
        &self,
    ) -> Result<
        (
            Client,
            tokio_postgres::Connection<
                tokio_postgres::Socket,
                impl tokio_postgres::tls::TlsStream + Unpin + use<>,
            >,
        ),
        JournalError,
    > {
        self.config.connect(self.tls.clone()).await.map_err(storage)
    }

    /// A new connection, its driver spawned, in the journal's schema.
    pub(crate) async fn connect(&self) -> Result<Client, JournalError> {
        let (client, connection) = self.open().await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(target: "spool::journal", %error, "a PostgreSQL connection ended");
            }
        });
        self.enter(&client).await?;
        Ok(client)
    }

    /// A new connection for statements that find rows by key (the
    /// writers' and the readers'), on which the planner never scans a
    /// table. Their statements are prepared once per connection, and
    /// PostgreSQL keeps the generic plan it made at their first uses: on a
    /// fresh journal, made while the tables were empty, that plan scans
    /// the whole table, and goes on scanning it, at every commit, as the
    /// table grows, until new statistics replace the plan. Measured on a
    /// fresh schema under load: a batch's heads read took 2–5 ms (a scan
    /// of 11 k runs) instead of 0.09 ms by the primary key.
    pub(crate) async fn connect_by_key(&self) -> Result<Client, JournalError> {
        let client = self.connect().await?;
        client
            .batch_execute("SET enable_seqscan = off")
            .await
            .map_err(storage)?;
        Ok(client)
    }

    /// A new connection in the journal's schema, with the schema created
    /// and its tables created or migrated when needed.
    pub(crate) async fn migrated(&self) -> Result<Client, JournalError> {
        let (client, connection) = self.open().await?;
        tokio::spawn(connection);
        if let Some(schema) = &self.schema {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS {}",
                    quote_ident(schema)
                ))
                .await
                .map_err(storage)?;
        }
        self.enter(&client).await?;
        schema::migrate(&client).await?;
        Ok(client)
    }

    /// Puts `client` in the journal's schema.
    async fn enter(&self, client: &Client) -> Result<(), JournalError> {
        if let Some(schema) = &self.schema {
            client
                .batch_execute(&format!("SET search_path TO {}", quote_ident(schema)))
                .await
                .map_err(storage)?;
        }
        Ok(())
    }
}

/// A journal in PostgreSQL.
pub struct PgJournal {
    counters: Arc<writer::Counters>,
    /// The writers' queues; none when opened read-only.
    writers: Vec<mpsc::Sender<Op>>,
    readers: Arc<Readers>,
    watchers: Arc<Watchers>,
    /// The runs whose watch this process registered, and until when.
    watches: Arc<listen::Watches>,
    /// The listening task; stopped when the journal is dropped.
    listener: tokio::task::JoinHandle<()>,
    /// The schema the tables are in, as the server named it.
    schema: String,
    /// Whether the connections are encrypted (TLS), as the server saw the
    /// first.
    encrypted: bool,
    /// When callers' appends are recorded: the time is taken by the
    /// caller, the bytes are encoded by the writer
    /// ([`Encoded::deferred`](spool_journal::store::Encoded::deferred)).
    clock: Clock,
}

impl std::fmt::Debug for PgJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgJournal")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Drop for PgJournal {
    fn drop(&mut self) {
        // The writer ends by itself once its queue's last sender goes,
        // after committing what is queued.
        self.listener.abort();
    }
}

impl PgJournal {
    /// Connects to the database at `url` (a `postgres://` URL or a
    /// key=value connection string, as libpq reads them), creates or
    /// migrates the tables, and starts the writer and the listener.
    ///
    /// # Errors
    ///
    /// [`JournalError::Storage`] when the URL does not parse or the server
    /// cannot be reached; [`JournalError::NewerSchema`] for a database
    /// written by a newer Spool.
    pub async fn connect(url: &str, options: Options) -> Result<Self, JournalError> {
        Self::open(url, options, true).await
    }

    /// Connects to an existing journal for reading only: nothing is
    /// created or migrated, and every write is refused with
    /// [`JournalError::ReadOnly`].
    ///
    /// # Errors
    ///
    /// As [`PgJournal::connect`], and [`JournalError::Storage`] when the
    /// schema holds no journal.
    pub async fn connect_read_only(url: &str, options: Options) -> Result<Self, JournalError> {
        Self::open(url, options, false).await
    }

    async fn open(url: &str, options: Options, write: bool) -> Result<Self, JournalError> {
        let target = Target::parse(url, options.schema.clone())?;
        let setup = if write {
            target.migrated().await?
        } else {
            let client = target.connect().await?;
            schema::check(&client).await?;
            client
        };
        // With the schema, whether the session is encrypted: what an
        // operator wants to know when `sslmode=prefer` may have fallen
        // back to plain TCP.
        let row = setup
            .query_one(
                "SELECT current_schema(),
                        coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
                &[],
            )
            .await
            .map_err(storage)?;
        let (schema, encrypted): (String, bool) = (row.get(0), row.get(1));
        // The store's number, unique in the database (nodes' numbers come
        // from the same sequence): its writers record it with each head,
        // so a subscriber knows whether another store writes a run.
        let store = if write {
            let row = setup
                .query_one("SELECT nextval('spool_node_ids')", &[])
                .await
                .map_err(storage)?;
            Some(row.get::<_, i64>(0))
        } else {
            None
        };
        drop(setup);
        let channel = channel(&schema);
        let watchers = Arc::new(Watchers::default());
        let readers = Arc::new(Readers::new(target.clone(), store));
        let watches = Arc::new(listen::Watches::default());
        let counters = Arc::new(writer::Counters::default());
        let mut writers = Vec::new();
        if write {
            for _ in 0..options.writers.max(1) {
                writers.push(
                    writer::Writer::start(writer::Setup {
                        counters: Arc::clone(&counters),
                        target: target.clone(),
                        fence: options.fence.clone(),
                        channel: channel.clone(),
                        store: store.unwrap_or_default(),
                        watchers: Arc::clone(&watchers),
                        clock: Arc::clone(&options.clock),
                        max_batch: options.max_batch,
                        queue: options.queue,
                    })
                    .await?,
                );
            }
        }
        let listener = listen::start(
            target,
            channel,
            Arc::clone(&watchers),
            Arc::clone(&watches),
            Arc::clone(&readers),
        )
        .await?;
        Ok(Self {
            counters,
            writers,
            readers,
            watchers,
            watches,
            listener,
            schema,
            encrypted,
            clock: options.clock,
        })
    }

    /// The schema the journal's tables are in.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Commits, operations and reads so far.
    #[must_use]
    pub fn stats(&self) -> WriterStats {
        use std::sync::atomic::Ordering::Relaxed;
        WriterStats {
            commits: self.counters.commits.load(Relaxed),
            operations: self.counters.operations.load(Relaxed),
            // Each commit is PostgreSQL's own durable commit.
            syncs: self.counters.commits.load(Relaxed),
            reads: self.readers.served.load(Relaxed),
            // PostgreSQL checkpoints on its own.
            checkpoints: 0,
        }
    }

    /// Whether the store's connections are encrypted, as the server saw
    /// the first one: with `sslmode=prefer` (the default) a server that
    /// offers no TLS is spoken to in plain TCP, which an operator should
    /// be told.
    #[must_use]
    pub fn encrypted(&self) -> bool {
        self.encrypted
    }

    /// Of the commits so far, how many were written from heads the writer
    /// knew, in one round trip (plain appends continuing runs it wrote
    /// last); the others read the heads first.
    #[must_use]
    pub fn commits_from_known_heads(&self) -> u64 {
        self.counters
            .known
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queues `op` for `run`'s writer and waits for its answer.
    async fn send<T>(
        &self,
        run: Option<&RunId>,
        op: impl FnOnce(oneshot::Sender<Result<T, JournalError>>) -> Op,
    ) -> Result<T, JournalError> {
        let lane = run.map_or(0, |run| {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            run.as_str().hash(&mut hasher);
            hasher.finish() as usize
        });
        let count = self.writers.len();
        let writer = self
            .writers
            .get(lane % count.max(1))
            .ok_or(JournalError::ReadOnly)?;
        let (reply, answer) = oneshot::channel();
        writer
            .send(op(reply))
            .await
            .map_err(|_| JournalError::Closed)?;
        answer.await.map_err(|_| JournalError::Closed)?
    }
}

/// The claim of one process to drive a journal's runs: a session advisory
/// lock on the journal's schema, held by a connection of its own until
/// dropped (or the process or connection dies, when the server lets it
/// go).
///
/// What it protects is the runtime above the store, as the SQLite store's
/// `Owner` does: two processes recovering the same journal would both
/// resume its interrupted turns. The store itself stays safe under many
/// writers.
#[derive(Debug)]
pub struct Owner {
    _client: Client,
    lost: tokio::sync::watch::Receiver<bool>,
}

/// The key class of the owner's lock: not [`schema::LOCK_CLASS`], whose
/// per-run keys it could otherwise meet.
const OWNER_CLASS: i32 = schema::LOCK_CLASS + 1;

impl Owner {
    /// Claims the journal at `url` (in `schema`, or the connection's own)
    /// for this process.
    ///
    /// # Errors
    ///
    /// [`JournalError::InUse`] when another process holds it, with that
    /// process's id when it recorded one; [`JournalError::Storage`] when
    /// the server cannot be reached.
    pub async fn claim(url: &str, schema: Option<&str>) -> Result<Self, JournalError> {
        let target = Target::parse(url, schema.map(str::to_owned))?;
        let (client, connection) = target.open().await?;
        let (lost_sender, lost) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(target: "spool::journal", %error, "the journal owner's connection ended");
            }
            let _ = lost_sender.send(true);
        });
        target.enter(&client).await?;
        let taken: bool = client
            .query_one(
                &format!("SELECT pg_try_advisory_lock({OWNER_CLASS}, hashtext(current_schema()))"),
                &[],
            )
            .await
            .map_err(storage)?
            .get(0);
        let holder_key = "owner_pid";
        if !taken {
            let holder = client
                .query_opt(
                    "SELECT value FROM spool_meta WHERE key = $1",
                    &[&holder_key],
                )
                .await
                .ok()
                .flatten()
                .and_then(|row| row.get::<_, String>(0).parse().ok());
            return Err(JournalError::InUse {
                dir: redact(url).into(),
                holder,
            });
        }
        // The holder's pid, for the message another process shows; a
        // journal not yet created has nowhere to keep it, and needs none.
        let pid = std::process::id().to_string();
        if let Err(error) = client
            .execute(
                "INSERT INTO spool_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&holder_key, &pid],
            )
            .await
        {
            tracing::debug!(%error, "recording the owner's pid");
        }
        Ok(Self {
            _client: client,
            lost,
        })
    }

    /// Resolves when the claim is lost: its connection ended (the server
    /// restarted or the network failed), so another process may take the
    /// journal. A process that drives runs must stop when it does.
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|lost| *lost).await;
    }
}

/// Whether `text` names a PostgreSQL journal rather than a directory: a
/// `postgres://` or `postgresql://` URL.
#[must_use]
pub fn is_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

/// `url` without its password, for messages.
#[must_use]
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match credentials.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// The notification channel of the journal in `schema`: one per schema,
/// so journals sharing a database do not hear each other.
fn channel(schema: &str) -> String {
    let mut channel = format!("spool_journal.{schema}");
    // Channel names are identifiers: at most 63 bytes.
    while channel.len() > 63 {
        channel.pop();
    }
    channel
}

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub(crate) fn storage(error: tokio_postgres::Error) -> JournalError {
    JournalError::storage_from(error)
}

pub(crate) fn seq_sql(seq: Seq) -> Result<i64, JournalError> {
    i64::try_from(seq.0)
        .map_err(|_| JournalError::storage(format!("seq {seq} does not fit PostgreSQL's bigint")))
}

pub(crate) fn stored_seq(value: i64) -> Seq {
    Seq(u64::try_from(value).unwrap_or_default())
}

pub(crate) fn stored_run_id(text: &str) -> Result<RunId, JournalError> {
    RunId::new(text).map_err(|e| JournalError::storage(format!("a stored run id is invalid: {e}")))
}

pub(crate) fn nanos(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

fn from_nanos(nanos: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// A run's head from a `spool_runs` row (`next_seq, last_hash, status,
/// title, created_ns, updated_ns` from column `at` on).
pub(crate) fn head_of(
    run: &RunId,
    row: &tokio_postgres::Row,
    at: usize,
) -> Result<Head, JournalError> {
    let next_seq = stored_seq(row.get(at));
    let corrupt = |reason: &str| JournalError::Corrupt {
        run: run.clone(),
        seq: next_seq,
        reason: reason.to_owned(),
    };
    let hash: Vec<u8> = row.get(at + 1);
    let status: String = row.get(at + 2);
    Ok(Head {
        next_seq,
        last_hash: Hash::try_from(hash.as_slice())
            .map_err(|_| corrupt("a head hash is not 32 bytes"))?,
        status: Status::decode(&status).ok_or_else(|| corrupt("unknown run status"))?,
        title: row.get(at + 3),
        created_at: from_nanos(row.get(at + 4)),
        updated_at: from_nanos(row.get(at + 5)),
    })
}

/// The statements reads use, prepared once per connection.
struct ReadStatements {
    events: Statement,
    head: Statement,
    /// Registers this store's watch of some runs and reads their heads
    /// ([`listen`]); a plain read of the heads when opened read-only.
    watch: Statement,
    /// The same for one run.
    watch_one: Statement,
    runs: Statement,
    address: Statement,
    addresses: Statement,
    operation: Statement,
}

/// Runs' summaries from rows of `run_id` and a head's columns.
fn summaries(rows: &[tokio_postgres::Row]) -> Result<Vec<RunSummary>, JournalError> {
    rows.iter()
        .map(|row| {
            let run_id = stored_run_id(row.get(0))?;
            Ok(head_of(&run_id, row, 1)?.into_summary(run_id))
        })
        .collect()
}

/// One connection for reads, made again when it is lost: the client
/// pipelines the queries of every task that shares it.
pub(crate) struct Readers {
    target: Target,
    /// The store's number when it may write: only then does it register
    /// its watches, of the runs another store writes.
    store: Option<i64>,
    current: Mutex<Option<(Arc<Client>, Arc<ReadStatements>)>>,
    /// Reads served, for [`PgJournal::stats`].
    served: std::sync::atomic::AtomicU64,
}

impl Readers {
    /// `run`'s tombstone, when it was deleted.
    async fn tombstone(
        &self,
        run: &RunId,
    ) -> Result<Option<spool_journal::store::Tombstone>, JournalError> {
        let row = self
            .query(|client, _| async move {
                client
                    .query_opt(
                        "SELECT deleted_ns, deleted_by, reason, events FROM spool_tombstones WHERE run_id = $1",
                        &[&run.as_str()],
                    )
                    .await
            })
            .await?;
        Ok(row.map(|row| writer::tombstone_of(run, &row)))
    }

    fn new(target: Target, store: Option<i64>) -> Self {
        Self {
            target,
            store,
            current: Mutex::new(None),
            served: std::sync::atomic::AtomicU64::new(0),
        }
    }

    async fn get(&self) -> Result<(Arc<Client>, Arc<ReadStatements>), JournalError> {
        let mut current = self.current.lock().await;
        if let Some((client, statements)) = current.as_ref()
            && !client.is_closed()
        {
            return Ok((Arc::clone(client), Arc::clone(statements)));
        }
        let client = self.target.connect_by_key().await?;
        if self.store.is_some() {
            // A watch is a hint made again after a crash (`listen`), so
            // its commit need not wait for the disk.
            client
                .batch_execute("SET synchronous_commit TO off")
                .await
                .map_err(storage)?;
        }
        // Each asked run that exists, its next position, and whether a
        // watch was registered for it: only for runs another store wrote
        // last (decided on the row as the update locked it). The runs
        // this store writes are announced by its own writers. One run
        // (a subscriber's) by key, so the plan is made once; many (the
        // listener's ticks) as an array.
        let watch = |runs: &str| match self.store {
            Some(store) => format!(
                "WITH watched AS (
                     UPDATE spool_runs SET watched_until = clock_timestamp() + interval '{} seconds'
                     WHERE {runs} AND written_by IS DISTINCT FROM {store}
                     RETURNING run_id, next_seq)
                 SELECT run_id, next_seq, true FROM watched
                 UNION ALL
                 SELECT run_id, next_seq, false FROM spool_runs
                 WHERE {runs} AND run_id NOT IN (SELECT run_id FROM watched)",
                listen::WATCH_FOR.as_secs()
            ),
            None => format!("SELECT run_id, next_seq, false FROM spool_runs WHERE {runs}"),
        };
        let statements = ReadStatements {
            watch_one: client
                .prepare(&watch("run_id = $1"))
                .await
                .map_err(storage)?,
            watch: client
                .prepare(&watch("run_id = ANY($1::text[])"))
                .await
                .map_err(storage)?,
            events: client
                .prepare(
                    "SELECT seq, body, hash FROM spool_events
                     WHERE run_id = $1 AND seq >= $2 ORDER BY seq",
                )
                .await
                .map_err(storage)?,
            head: client
                .prepare(
                    "SELECT next_seq, last_hash, status, title, created_ns, updated_ns
                     FROM spool_runs WHERE run_id = $1",
                )
                .await
                .map_err(storage)?,
            runs: client
                .prepare(
                    "SELECT run_id, next_seq, last_hash, status, title, created_ns, updated_ns
                     FROM spool_runs ORDER BY updated_ns DESC, run_id",
                )
                .await
                .map_err(storage)?,
            address: client
                .prepare("SELECT run_id FROM spool_addresses WHERE namespace = $1 AND name = $2")
                .await
                .map_err(storage)?,
            addresses: client
                .prepare("SELECT namespace, name, run_id FROM spool_addresses")
                .await
                .map_err(storage)?,
            operation: client
                .prepare(
                    "SELECT run_id FROM spool_operations WHERE scope = $1 AND operation_id = $2",
                )
                .await
                .map_err(storage)?,
        };
        let fresh = (Arc::new(client), Arc::new(statements));
        *current = Some((Arc::clone(&fresh.0), Arc::clone(&fresh.1)));
        Ok(fresh)
    }

    /// Runs `query` on the read connection; when the connection turns out
    /// to have been lost (the database restarted), once more on a new one.
    async fn query<T, F, Fut>(&self, query: F) -> Result<T, JournalError>
    where
        F: Fn(Arc<Client>, Arc<ReadStatements>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (client, statements) = self.get().await?;
        match query(Arc::clone(&client), statements).await {
            Err(error) if client.is_closed() => {
                tracing::debug!(target: "spool::journal", %error, "the read connection was lost; reading again on a new one");
                let (client, statements) = self.get().await?;
                query(client, statements).await.map_err(storage)
            }
            result => result.map_err(storage),
        }
    }

    /// The run's next position (0 for an unknown run).
    pub(crate) async fn next_seq(&self, run: &RunId) -> Result<Seq, JournalError> {
        let row = self
            .query(|client, st| async move { client.query_opt(&st.head, &[&run.as_str()]).await })
            .await?;
        Ok(row.map_or(Seq(0), |row| stored_seq(row.get(0))))
    }

    /// Registers this store's watch of those of `runs` another store
    /// wrote last (renewing it), and returns the next position of each
    /// run that exists and whether its watch was registered; registers
    /// nothing when opened read-only.
    pub(crate) async fn watch(
        &self,
        runs: &[&str],
    ) -> Result<Vec<(RunId, Seq, bool)>, JournalError> {
        let rows = self
            .query(|client, st| async move {
                match runs {
                    [run] => client.query(&st.watch_one, &[run]).await,
                    _ => client.query(&st.watch, &[&runs]).await,
                }
            })
            .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    stored_run_id(row.get(0))?,
                    stored_seq(row.get(1)),
                    row.get(2),
                ))
            })
            .collect()
    }

    async fn read(&self, run: &RunId, from: Seq) -> Result<Vec<Envelope>, JournalError> {
        // One statement, one snapshot: the predecessor's row (for its
        // hash) comes with the rows after it.
        let start = Seq(from.0.saturating_sub(1));
        let first = seq_sql(start)?;
        let rows =
            self.query(|client, st| async move {
                client.query(&st.events, &[&run.as_str(), &first]).await
            })
            .await?;
        let mut rows = rows.iter().map(|row| {
            (
                stored_seq(row.get(0)),
                row.get::<_, Vec<u8>>(1),
                row.get::<_, Vec<u8>>(2),
            )
        });
        let prev =
            if from.0 == 0 {
                GENESIS
            } else {
                match rows.next() {
                    Some((seq, _, hash)) if seq == start => Hash::try_from(hash.as_slice())
                        .map_err(|_| spool_journal::chain::TamperEvident {
                            run: run.clone(),
                            seq,
                        })?,
                    // Nothing before `from`: the run is shorter than that,
                    // or was deleted since the caller read up to `from`
                    // (another node's retention sweep): said, so a node
                    // that cached the run learns it is gone.
                    _ => {
                        return match self.tombstone(run).await? {
                            Some(_) => Err(JournalError::RunDeleted { run: run.clone() }),
                            None => Ok(Vec::new()),
                        };
                    }
                }
            };
        let mut verifier = Verifier::new(run.clone(), from, prev);
        let mut envelopes = Vec::new();
        for (seq, bytes, hash) in rows {
            let hash = Hash::try_from(hash.as_slice()).map_err(|_| {
                spool_journal::chain::TamperEvident {
                    run: run.clone(),
                    seq,
                }
            })?;
            verifier.check(seq, &bytes, &hash)?;
            envelopes.push(decode_row(run, seq, &bytes)?);
        }
        Ok(envelopes)
    }

    async fn runs(&self) -> Result<Vec<RunSummary>, JournalError> {
        let rows = self
            .query(|client, st| async move { client.query(&st.runs, &[]).await })
            .await?;
        summaries(&rows)
    }

    /// The runs in one state, filtered in the database: a retention sweep
    /// asks for one state, and reads no other row.
    async fn runs_with_status(&self, status: &str) -> Result<Vec<RunSummary>, JournalError> {
        let rows = self
            .query(|client, _| async move {
                client
                    .query(
                        "SELECT run_id, next_seq, last_hash, status, title, created_ns, updated_ns
                         FROM spool_runs WHERE status = $1",
                        &[&status],
                    )
                    .await
            })
            .await?;
        summaries(&rows)
    }

    async fn addresses(&self) -> Result<Vec<(Address, RunId)>, JournalError> {
        let rows = self
            .query(|client, st| async move { client.query(&st.addresses, &[]).await })
            .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    Address::new(row.get::<_, String>(0), row.get::<_, String>(1)),
                    stored_run_id(row.get(2))?,
                ))
            })
            .collect()
    }

    async fn find(
        &self,
        pick: fn(&ReadStatements) -> &Statement,
        key: [&str; 2],
    ) -> Result<Option<RunId>, JournalError> {
        let row = self
            .query(
                |client, st| async move { client.query_opt(pick(&st), &[&key[0], &key[1]]).await },
            )
            .await?;
        row.map(|row| stored_run_id(row.get(0))).transpose()
    }
}

impl Journal for PgJournal {
    fn append<'a>(
        &'a self,
        run: &'a RunId,
        expected: Seq,
        events: Vec<Event>,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        let append = spool_journal::store::Encoded::deferred(run, expected, events, (self.clock)());
        Box::pin(self.send(Some(run), move |reply| Op::Append {
            run: run.clone(),
            append,
            reply,
        }))
    }

    fn read<'a>(
        &'a self,
        run: &'a RunId,
        from: Seq,
    ) -> BoxFuture<'a, Result<Vec<Envelope>, JournalError>> {
        Box::pin(self.readers.read(run, from))
    }

    fn runs(&self) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        Box::pin(self.readers.runs())
    }

    fn runs_with_status(
        &self,
        status: spool_journal::fold::Status,
    ) -> BoxFuture<'_, Result<Vec<RunSummary>, JournalError>> {
        Box::pin(async move { self.readers.runs_with_status(&status.encode()).await })
    }

    fn addresses(&self) -> BoxFuture<'_, Result<Vec<(Address, RunId)>, JournalError>> {
        Box::pin(self.readers.addresses())
    }

    fn find_address<'a>(
        &'a self,
        address: &'a Address,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        Box::pin(
            self.readers
                .find(|s| &s.address, [&address.namespace, &address.name]),
        )
    }

    fn find_operation<'a>(
        &'a self,
        principal: &'a Principal,
        operation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunId>, JournalError>> {
        Box::pin(async move {
            let scope = principal.scope();
            self.readers
                .find(|s| &s.operation, [&scope, operation_id])
                .await
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a ClaimKey,
        holder: &'a CallRef,
    ) -> BoxFuture<'a, Result<Claim, JournalError>> {
        Box::pin(self.send(Some(&holder.run), move |reply| Op::Claim {
            key: key.clone(),
            holder: holder.clone(),
            reply,
        }))
    }

    fn subscribe<'a>(&'a self, run: &'a RunId) -> BoxFuture<'a, Result<SeqWatch, JournalError>> {
        Box::pin(async move {
            let receiver = self.watchers.register(run);
            let next = self.watches.head(&self.readers, run).await?;
            self.watchers.advance(run, next);
            Ok(receiver)
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), JournalError>> {
        Box::pin(self.send(None, |reply| Op::Probe { reply }))
    }

    fn delete<'a>(
        &'a self,
        run: &'a RunId,
        deletion: spool_journal::store::Deletion,
    ) -> BoxFuture<'a, Result<spool_journal::store::Tombstone, JournalError>> {
        Box::pin(self.send(Some(run), move |reply| Op::Delete {
            run: run.clone(),
            deletion,
            reply,
        }))
    }

    fn keep_definition<'a>(
        &'a self,
        digest: &'a str,
        document: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), JournalError>> {
        let document = document.to_string();
        Box::pin(self.send(None, move |reply| Op::Define {
            digest: digest.to_owned(),
            document,
            reply,
        }))
    }

    fn definition<'a>(
        &'a self,
        digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<serde_json::Value>, JournalError>> {
        Box::pin(async move {
            let row = self
                .readers
                .query(|client, _| async move {
                    client
                        .query_opt(
                            "SELECT document FROM spool_definitions WHERE digest = $1",
                            &[&digest],
                        )
                        .await
                })
                .await?;
            row.map(|row| {
                serde_json::from_str(row.get::<_, &str>(0)).map_err(|e| {
                    JournalError::storage(format!("definition {digest} does not read: {e}"))
                })
            })
            .transpose()
        })
    }

    fn tombstone<'a>(
        &'a self,
        run: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<spool_journal::store::Tombstone>, JournalError>> {
        Box::pin(async move { self.readers.tombstone(run).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_told_from_a_directory_and_its_password_never_shown() {
        assert!(is_url("postgres://u:p@h/db"));
        assert!(is_url("postgresql://h/db"));
        assert!(!is_url(".spool"));
        assert!(!is_url("postgres:/x"));
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[tokio::test]
    async fn a_url_that_does_not_parse_is_refused_by_name_without_its_password() {
        let refused = PgJournal::connect("postgres://u:secret@h:notaport/db", Options::default())
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(message.contains("not a PostgreSQL URL"), "{message}");
        assert!(!message.contains("secret"), "{message}");
    }

    #[test]
    fn a_long_schema_name_still_gives_a_valid_channel() {
        assert!(channel(&"s".repeat(100)).len() <= 63);
        assert_eq!(channel("public"), "spool_journal.public");
    }
}
