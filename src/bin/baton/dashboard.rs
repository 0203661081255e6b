//! `baton dashboard`: one read-only page of every job, lock, leader, fair lock, queue and
//! schedule under the prefix, updated live.
//!
//! One task reads the whole listing (the same [`Inspector`] listing as `baton status`: `SCAN`
//! in bounded batches on every primary, keyset pages on PostgreSQL) every `--interval`, folds
//! each schedule's occurrences into one row showing its worst open occurrence (the same
//! [`ScheduleFold`] as `status`), reads each schedule's record (every key with an occurrence
//! or a record, [`baton::inspect::Inspector::schedules`], at most `--max-schedules`, 16 keys' reads
//! in flight on the shared connection) for its expression, its row's summary and the
//! store-computed `baton_schedule_*` series of `/metrics`, and publishes the result in a watch
//! channel. A schedule with only its record left (every occurrence expired) keeps a row
//! (state `recorded`) and its series. Every
//! open page is a server-sent-events stream of that channel, filtered by the page's own name
//! prefix and kind, at most [`MAX_SHOWN`] rows. However many pages are open, the server is read
//! once per interval, and a read that fails or hangs leaves the last good one on the page with
//! a banner saying since when it is stale, and the page's badge says `stale` instead of `live`
//! (each view says whether its read failed; an open event stream alone is not "live").
//!
//! The page is three static files compiled into the binary (`dashboard/`), with no JavaScript
//! build step and nothing fetched from elsewhere. It is read-only: every route is a `GET`, so
//! there is nothing to forge (no CSRF surface). It binds to loopback unless `--allow-remote`;
//! on loopback it also refuses a request whose `Host` is not a loopback name (a DNS-rebinding
//! page in the operator's browser cannot read it). It never shows a password: the server is
//! shown through [`baton::client::redacted_url`], and entries carry no credentials.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use baton::inspect::{Entry, EntryState, Kind, ScheduleFold};
use baton::{Client, Inspector};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use super::cli::DashboardArgs;
use super::exit::{usage, usage_config, EX_UNAVAILABLE};
use super::out;
use super::status::{entry_note, schedule_note, ScheduleView};
use super::text;

mod metrics;

/// The most rows one page shows: past it the page says how many more match and asks for a
/// narrower filter (a browser renders a thousand rows a second comfortably).
pub(crate) const MAX_SHOWN: usize = 1000;

/// The most rows one read keeps, whatever the filter: bounds the dashboard's memory (about
/// 200 bytes a row) on a prefix with millions of keys; the page says the listing was cut.
pub(crate) const MAX_ROWS: usize = 50_000;

/// The longest a read of the whole listing may take before the page calls it failed (a hung
/// server, not a dead one, must not freeze the page on data that looks current).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");
const SCHEDULE_HTML: &str = include_str!("dashboard/schedule.html");
const SCHEDULE_JS: &str = include_str!("dashboard/schedule.js");

/// What the page may load and do: its own script, style and event stream, nothing else (no
/// inline script, no frame around it, no form sent anywhere).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Checks the settings that need no server: a non-loopback `--listen` needs `--allow-remote`.
pub(crate) fn check(args: &DashboardArgs) -> Result<(), u8> {
    if !args.listen.ip().is_loopback() && !args.allow_remote {
        return Err(usage(format!(
            "--listen {}: not a loopback address; the page has no authentication of its own, \
             so serve it elsewhere only behind a proxy that authenticates, with --allow-remote",
            args.listen
        )));
    }
    Ok(())
}

/// One row of the page: an entry, or a schedule folded.
#[derive(Serialize, Clone, Debug)]
struct Row {
    kind: &'static str,
    name: String,
    state: &'static str,
    holder: Option<String>,
    remaining_ms: Option<u64>,
    fencing_token: Option<u64>,
    attempt: Option<u64>,
    /// An open job's waiting backups, an election's standbys (`None`: unknown, or none to
    /// count: see `can_standby`).
    standbys: Option<u64>,
    /// Whether the entry can have standbys at all (an open job, an election): the page says
    /// "unknown" where it can and `standbys` is `None`.
    can_standby: bool,
    /// A schedule's digest (its expression's hash, in each occurrence's name).
    digest: Option<String>,
    /// A schedule's key and expression, from its record (`None`: no record yet).
    schedule: Option<String>,
    expression: Option<String>,
    note: String,
    /// Exhausted, corrupt, or a job between attempts (its last attempt failed or its holder's
    /// lease ran out): what an operator looks at first.
    problem: bool,
}

impl Row {
    fn of(e: &Entry) -> Row {
        Row {
            kind: e.kind.as_str(),
            name: e.name.clone(),
            state: e.state.as_str(),
            // A semaphore's or read-write lock's holders summed up (`2/3`, `read ×2`), each
            // listed in the note.
            holder: e.holders_summary().or_else(|| e.holder.clone()),
            remaining_ms: e.remaining_ms,
            fencing_token: e.fencing_token,
            attempt: e.attempt,
            standbys: e.standbys,
            can_standby: e.can_have_standbys(),
            digest: None,
            schedule: None,
            expression: None,
            note: {
                let mut note = entry_note(e);
                for h in &e.holders {
                    if !note.is_empty() {
                        note += "; ";
                    }
                    note += &super::status::holder_id(h);
                }
                note
            },
            problem: is_problem(e.state),
        }
    }
}

fn is_problem(state: EntryState) -> bool {
    matches!(
        state,
        EntryState::Exhausted | EntryState::Corrupt | EntryState::Waiting
    )
}

/// One read of the whole listing.
#[derive(Default, Debug)]
struct Listing {
    /// Problems first, then by kind and name.
    rows: Vec<Row>,
    /// Every entry read (schedules as one each), past [`MAX_ROWS`] too.
    total: u64,
    /// Rows by state, over `total`.
    counts: BTreeMap<&'static str, u64>,
    /// Rows by kind and state, over `total` (for `/metrics`).
    by_kind_state: BTreeMap<(&'static str, &'static str), u64>,
    /// Rows were left out past [`MAX_ROWS`].
    truncated: bool,
    /// Each schedule's record as `/metrics` gives it, at most `--max-schedules`.
    schedules: Vec<ScheduleStats>,
    /// Schedules left out of `schedules` past `--max-schedules`.
    schedules_dropped: u64,
}

/// What `/metrics` gives of one schedule, from its record: the digest a host saw last.
#[derive(Debug, Clone, Default)]
struct ScheduleStats {
    /// The schedule's key (the `schedule` label).
    schedule: String,
    /// When its last success ended (Unix ms, the server's clock).
    last_success_ms: Option<u64>,
    /// Occurrences in its history by outcome.
    outcomes: BTreeMap<&'static str, u64>,
    /// Ticks missed since the last success (recorded, or computed from the store).
    missed: u64,
    /// Paused now.
    paused: bool,
}

impl Listing {
    fn push(&mut self, row: Row) {
        self.total += 1;
        *self.counts.entry(row.state).or_default() += 1;
        *self.by_kind_state.entry((row.kind, row.state)).or_default() += 1;
        if self.rows.len() < MAX_ROWS {
            self.rows.push(row);
        } else if row.problem {
            // A problem is never the row left out: it replaces the last quiet one.
            if let Some(at) = self.rows.iter().rposition(|r| !r.problem) {
                self.rows[at] = row;
            }
            self.truncated = true;
        } else {
            self.truncated = true;
        }
    }
}

/// What the reading task publishes to every page.
#[derive(Clone, Debug, Default)]
struct Published {
    listing: Arc<Listing>,
    /// When the last good read ended (Unix ms; 0: none yet).
    read_at_ms: u64,
    /// The last read's failure, while reads fail.
    error: Option<String>,
    /// Since when reads fail (Unix ms).
    failing_since_ms: Option<u64>,
    /// Reads that failed since the start (for `/metrics`).
    failed_reads: u64,
}

/// The fixed facts every page shows.
struct Shared {
    server: String,
    prefix: String,
    interval_ms: u64,
    loopback: bool,
    port: u16,
    published: watch::Receiver<Published>,
}

/// A page's filter: `?prefix=…&kind=…`.
#[derive(Deserialize, Default, Debug)]
struct Filter {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    kind: String,
}

/// What one page receives: the published read, through its filter.
#[derive(Serialize)]
struct View<'a> {
    server: &'a str,
    prefix: &'a str,
    interval_ms: u64,
    read_at_ms: u64,
    error: Option<&'a str>,
    failing_since_ms: Option<u64>,
    total: u64,
    counts: &'a BTreeMap<&'static str, u64>,
    truncated: bool,
    /// Rows that pass the filter (of those kept).
    matching: usize,
    rows: Vec<&'a Row>,
    max_shown: usize,
}

fn view_json(shared: &Shared, p: &Published, f: &Filter) -> String {
    let l = &p.listing;
    let mut matching = 0;
    let mut rows = Vec::new();
    for r in &l.rows {
        if !r.name.starts_with(&f.prefix) || !(f.kind.is_empty() || f.kind == r.kind) {
            continue;
        }
        matching += 1;
        if rows.len() < MAX_SHOWN {
            rows.push(r);
        }
    }
    let view = View {
        server: &shared.server,
        prefix: &shared.prefix,
        interval_ms: shared.interval_ms,
        read_at_ms: p.read_at_ms,
        error: p.error.as_deref(),
        failing_since_ms: p.failing_since_ms,
        total: l.total,
        counts: &l.counts,
        truncated: l.truncated,
        matching,
        rows,
        max_shown: MAX_SHOWN,
    };
    // Strings, numbers and maps of strings: serializing them cannot fail.
    serde_json::to_string(&view).unwrap_or_else(|_| "{}".into())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What a read needs besides the listing: the schedules' records.
struct Reader {
    inspect: Inspector,
    failover: baton::Failover,
    prefix: String,
    /// `--max-schedules`.
    max_schedules: usize,
}

/// Reads everything under the prefix once, and each schedule's record (the first
/// `--max-schedules` keys, by name).
async fn read(reader: &Reader) -> Result<Listing, baton::Error> {
    let mut listing = Listing::default();
    let mut schedules = ScheduleFold::new();
    let mut entries = reader.inspect.list(None);
    while let Some(batch) = entries.next_batch().await? {
        for entry in batch {
            if let Some(entry) = schedules.fold(entry) {
                listing.push(Row::of(&entry));
            }
        }
    }
    let rows: Vec<_> = schedules.rows().collect();
    // Every schedule with an occurrence in the store or a record: one whose occurrences all
    // expired (every host dead longer than their retention) keeps its row and its series, so
    // its missed-run alert does not clear by itself.
    let mut keys: Vec<String> = rows.iter().map(|s| s.key.clone()).collect();
    keys.extend(reader.inspect.schedules().await?);
    keys.sort();
    keys.dedup();
    listing.schedules_dropped = keys.len().saturating_sub(reader.max_schedules) as u64;
    keys.truncate(reader.max_schedules);
    let mut records = BTreeMap::new();
    if let Some(first) = keys.first() {
        let now = reader.failover.server_time(first).await?;
        for (key, (stats, of_key)) in read_records(reader, keys, now).await? {
            if let Some(stats) = stats {
                listing.schedules.push(stats);
            }
            records.insert(key, of_key);
        }
    }
    let mut shown = std::collections::BTreeSet::new();
    // A schedule's row is its worst open occurrence's, as in `baton status`, with what its
    // record says.
    for s in rows {
        let mut row = Row::of(&s.shown.entry);
        row.kind = "schedule";
        row.name = format!("{}@{}", s.key, s.digest);
        row.note = schedule_note(&s);
        let record = records
            .get(&s.key)
            .and_then(|r: &Vec<(baton::ScheduleRecord, String)>| {
                r.iter().find(|(r, _)| r.digest == s.digest)
            });
        if let Some((record, note)) = record {
            row.expression = Some(record.spec.text.clone());
            row.note = format!("{note}; {}", row.note);
        }
        row.schedule = Some(s.key.clone());
        shown.insert((s.key.clone(), s.digest.clone()));
        row.digest = Some(s.digest);
        listing.push(row);
    }
    // Schedules with only their record left: a row from it, a problem when it has failed or
    // missed ticks (its note says which).
    for (record, note) in records.values().flatten() {
        if shown.contains(&(record.key.clone(), record.digest.clone())) {
            continue;
        }
        let stats = listing.schedules.iter().find(|s| s.schedule == record.key);
        listing.push(Row {
            kind: "schedule",
            name: format!("{}@{}", record.key, record.digest),
            state: super::status::RECORDED,
            holder: None,
            remaining_ms: None,
            fencing_token: None,
            attempt: None,
            standbys: None,
            can_standby: false,
            digest: Some(record.digest.clone()),
            schedule: Some(record.key.clone()),
            expression: Some(record.spec.text.clone()),
            note: format!("{note}; no occurrence in the store"),
            problem: stats.is_some_and(|s| s.missed > 0),
        });
    }
    listing.rows.sort_by(|a, b| {
        (!a.problem, kind_rank(a.kind), &a.name).cmp(&(!b.problem, kind_rank(b.kind), &b.name))
    });
    Ok(listing)
}

/// How many schedules' records are read at once: the reads of one schedule are a few round
/// trips in a row; many schedules' reads share the multiplexed connection (pipelined), so a
/// thousand schedules take about as many round trips' time as sixty-odd, not a thousand.
const RECORD_READS_IN_FLIGHT: usize = 16;

type RecordsOfKey = (Option<ScheduleStats>, Vec<(baton::ScheduleRecord, String)>);

/// [`record_of`] of each of `keys`, [`RECORD_READS_IN_FLIGHT`] at a time, by key.
async fn read_records(
    reader: &Reader,
    keys: Vec<String>,
    now: SystemTime,
) -> Result<BTreeMap<String, RecordsOfKey>, baton::Error> {
    let mut out = BTreeMap::new();
    let mut reads = tokio::task::JoinSet::new();
    let mut keys = keys.into_iter();
    loop {
        while reads.len() < RECORD_READS_IN_FLIGHT {
            let Some(key) = keys.next() else { break };
            let (failover, prefix) = (reader.failover.clone(), reader.prefix.clone());
            reads.spawn(async move {
                let read = record_of(&failover, &prefix, &key, now).await;
                (key, read)
            });
        }
        let Some(done) = reads.join_next().await else {
            break;
        };
        match done {
            Ok((key, read)) => {
                out.insert(key, read?);
            }
            // A read that panicked panics here, as it would have read in line; none is ever
            // cancelled (the set is only dropped with this read).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// The records of schedule `key`, each with its row's note, and what `/metrics` gives of the
/// digest a host saw last (its history read for the outcomes and the missed ticks).
async fn record_of(
    failover: &baton::Failover,
    prefix: &str,
    key: &str,
    now: SystemTime,
) -> Result<RecordsOfKey, baton::Error> {
    let Ok(config) = baton::FailoverConfig::builder(key)
        .prefix(prefix.to_string())
        .build()
    else {
        // A key the coordinator refuses has no record.
        return Ok((None, Vec::new()));
    };
    let records = failover.schedule_records(config.clone()).await?;
    let notes: Vec<(baton::ScheduleRecord, String)> = records
        .iter()
        .map(|r| (r.clone(), ScheduleView::of(r, &[], now).note()))
        .collect();
    let Some(current) = records.iter().max_by_key(|r| r.last_seen) else {
        return Ok((None, notes));
    };
    let history = failover
        .schedule_history(config, &current.digest, current.spec.history as usize)
        .await?;
    let mut outcomes = BTreeMap::new();
    for o in &history {
        *outcomes.entry(o.outcome.as_str()).or_default() += 1;
    }
    let check = current.check(&history, now, None);
    let stats = ScheduleStats {
        schedule: key.to_string(),
        last_success_ms: current.last_success.map(system_ms),
        outcomes,
        missed: check.missed.len() as u64,
        paused: ScheduleView::of(current, &[], now).paused.is_some(),
    };
    Ok((Some(stats), notes))
}

/// `t` in Unix ms (0 before the epoch).
fn system_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn kind_rank(kind: &str) -> usize {
    Kind::ALL
        .iter()
        .position(|k| k.as_str() == kind)
        .unwrap_or(Kind::ALL.len())
}

/// Reads the listing every `interval` (from the end of one read to the start of the next, so
/// a slow server is never asked twice at once) and publishes each result.
async fn keep_reading(reader: Reader, interval: Duration, tx: watch::Sender<Published>) {
    loop {
        let outcome = match tokio::time::timeout(READ_TIMEOUT, read(&reader)).await {
            Ok(Ok(listing)) => Ok(listing),
            Ok(Err(e)) => Err(text::error_message(&e)),
            Err(_) => Err(format!(
                "the server did not answer within {}",
                text::human(READ_TIMEOUT)
            )),
        };
        let now = unix_ms();
        tx.send_modify(|p| match outcome {
            Ok(listing) => {
                p.listing = Arc::new(listing);
                p.read_at_ms = now;
                p.error = None;
                p.failing_since_ms = None;
            }
            Err(e) => {
                p.error = Some(e);
                p.failed_reads += 1;
                p.failing_since_ms.get_or_insert(now);
            }
        });
        tokio::time::sleep(interval).await;
    }
}

/// Serves the page until the process is stopped (a signal ends it: 130 on Ctrl-C, 143 on
/// SIGTERM, as the shell counts).
pub(crate) async fn dashboard(
    client: &Client,
    args: &DashboardArgs,
    prefix: &str,
    url: &str,
) -> u8 {
    let inspect = match client.inspect().with_prefix(prefix) {
        Ok(i) => i,
        Err(e) => return usage_config(&e),
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            say!("baton: --listen {}: cannot listen: {e}", args.listen);
            return EX_UNAVAILABLE;
        }
    };
    let local: SocketAddr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            say!("baton: --listen {}: {e}", args.listen);
            return EX_UNAVAILABLE;
        }
    };
    let (tx, rx) = watch::channel(Published::default());
    let interval = args.interval;
    let reader = Reader {
        inspect,
        failover: client.failover(),
        prefix: prefix.to_string(),
        max_schedules: args.max_schedules,
    };
    tokio::spawn(keep_reading(reader, interval, tx));
    let shared = Arc::new(Shared {
        server: baton::client::redacted_url(url),
        prefix: prefix.to_string(),
        interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
        loopback: local.ip().is_loopback(),
        port: local.port(),
        published: rx,
    });
    let reads = Arc::new(HistoryReader {
        failover: client.failover(),
        prefix: prefix.to_string(),
    });
    let app = axum::Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/schedule",
            get(|| async { asset("text/html; charset=utf-8", SCHEDULE_HTML) }),
        )
        .route(
            "/schedule.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCHEDULE_JS) }),
        )
        .route("/events", get(events))
        .route("/api/entries", get(entries))
        .route(
            "/api/history",
            get(move |q: Query<HistoryQuery>| history(reads.clone(), q)),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::serve))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared.clone());
    say!(
        "baton: dashboard of {} (prefix {prefix}) at http://{local}/ (read-only; Ctrl-C stops it)",
        shared.server
    );
    match axum::serve(listener, app).await {
        Ok(()) => 0,
        Err(e) => {
            say!("baton: --listen {local}: the server stopped: {e}");
            EX_UNAVAILABLE
        }
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// `/events`: the page's view now, then again after each read, as server-sent events.
async fn events(State(shared): State<Arc<Shared>>, Query(filter): Query<Filter>) -> Response {
    let updates = WatchStream::new(shared.published.clone());
    let stream = updates.map(move |p| {
        Ok::<Event, std::convert::Infallible>(
            Event::default().data(view_json(&shared, &p, &filter)),
        )
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `/api/entries`: the same view once, as JSON (for `curl` and scripts).
async fn entries(State(shared): State<Arc<Shared>>, Query(filter): Query<Filter>) -> Response {
    let published = shared.published.borrow().clone();
    (
        [(header::CONTENT_TYPE, "application/json")],
        view_json(&shared, &published, &filter),
    )
        .into_response()
}

/// `/api/history?schedule=KEY`: each digest's record of the schedule, its history (newest
/// first), its check (`baton check`'s verdict, no --max-age) and its next tick, with the
/// server's time they were judged at: the schedule's page (`/schedule?key=KEY`). Read from
/// the server when asked: the pages that show it, not the listing's interval.
#[derive(Deserialize, Debug)]
struct HistoryQuery {
    schedule: String,
}

/// What `/api/history` reads with.
struct HistoryReader {
    failover: baton::Failover,
    prefix: String,
}

async fn history(shared: Arc<HistoryReader>, Query(q): Query<HistoryQuery>) -> Response {
    let read = async {
        let config = baton::FailoverConfig::builder(q.schedule.clone())
            .prefix(shared.prefix.clone())
            .build()
            .map_err(|e| text::config_message(&e))?;
        let failover = &shared.failover;
        let records = failover
            .schedule_records(config.clone())
            .await
            .map_err(|e| text::error_message(&e))?;
        let now = failover
            .server_time(&q.schedule)
            .await
            .map_err(|e| text::error_message(&e))?;
        let mut out = Vec::new();
        for r in records {
            let history = failover
                .schedule_history(config.clone(), &r.digest, r.spec.history as usize)
                .await
                .map_err(|e| text::error_message(&e))?;
            let check = r.check(&history, now, None);
            let next_tick = baton::Schedule::from_spec(&r.spec)
                .ok()
                .and_then(|s| s.next_after(now))
                .map(super::run::baton_time);
            out.push(serde_json::json!({
                "record": r,
                "history": history,
                "check": check,
                "next_tick": next_tick,
                "now": super::run::baton_time(now),
            }));
        }
        Ok::<_, String>(out)
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(out)) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::Value::Array(out).to_string(),
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the server did not answer in time\n",
        )
            .into_response(),
    }
}

/// `/healthz`: 200 while the listing can be read, 503 once reads fail.
async fn healthz(State(shared): State<Arc<Shared>>) -> Response {
    let failing = shared.published.borrow().error.is_some();
    if failing {
        (StatusCode::SERVICE_UNAVAILABLE, "unhealthy\n").into_response()
    } else {
        (StatusCode::OK, "ok\n").into_response()
    }
}

/// Refuses a foreign `Host` on loopback, and sets the headers that keep the page to itself.
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    if shared.loopback {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        if let Some(host) = host {
            if !loopback_host(host, shared.port) {
                return (
                    StatusCode::FORBIDDEN,
                    "baton dashboard: this page answers only to a loopback host name\n",
                )
                    .into_response();
            }
        }
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Whether `host` (a `Host` header) names this loopback listener: `localhost`, an address of
/// 127.0.0.0/8 or `[::1]`, with this port or none.
fn loopback_host(host: &str, port: u16) -> bool {
    let (name, given_port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(':') && (n.starts_with('[') == n.ends_with(']')) => {
            (n, Some(p))
        }
        _ => (host, None),
    };
    if let Some(p) = given_port {
        if p.parse::<u16>() != Ok(port) {
            return false;
        }
    }
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_host_names_with_this_port_pass() {
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
            "127.0.0.2:8080",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(loopback_host(ok, 8080), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "evil.example",
            "127.0.0.1:8081",
            "10.0.0.1:8080",
            "localhost.evil.example:8080",
            "[::2]:8080",
            "127.0.0.1:notaport",
        ] {
            assert!(!loopback_host(bad, 8080), "{bad}");
        }
    }

    fn row(name: &str, state: EntryState) -> Row {
        Row {
            kind: "job",
            name: name.into(),
            state: state.as_str(),
            holder: None,
            remaining_ms: None,
            fencing_token: None,
            attempt: None,
            standbys: None,
            can_standby: false,
            digest: None,
            schedule: None,
            expression: None,
            note: String::new(),
            problem: is_problem(state),
        }
    }

    #[test]
    fn a_full_listing_keeps_its_problems_and_counts_everything() {
        let mut l = Listing::default();
        for i in 0..MAX_ROWS {
            l.push(row(&format!("ok-{i}"), EntryState::Done));
        }
        l.push(row("late-quiet", EntryState::Done));
        l.push(row("late-problem", EntryState::Exhausted));
        assert_eq!(l.rows.len(), MAX_ROWS);
        assert_eq!(l.total, MAX_ROWS as u64 + 2);
        assert!(l.truncated);
        assert!(l.rows.iter().any(|r| r.name == "late-problem"));
        assert!(!l.rows.iter().any(|r| r.name == "late-quiet"));
        assert_eq!(l.counts.get("exhausted"), Some(&1));
        assert_eq!(l.counts.get("done"), Some(&(MAX_ROWS as u64 + 1)));
    }

    #[test]
    fn a_view_filters_by_name_prefix_and_kind_and_caps_its_rows() {
        let mut listing = Listing::default();
        for i in 0..(MAX_SHOWN + 5) {
            listing.push(row(&format!("report-{i}"), EntryState::Done));
        }
        let mut lock = row("report-lock", EntryState::Held);
        lock.kind = "lock";
        listing.push(lock);
        let (_tx, rx) = watch::channel(Published::default());
        let shared = Shared {
            server: "redis://<redacted>@127.0.0.1:6379/".into(),
            prefix: "baton:".into(),
            interval_ms: 1000,
            loopback: true,
            port: 8080,
            published: rx,
        };
        let p = Published {
            listing: Arc::new(listing),
            ..Published::default()
        };
        let view = |prefix: &str, kind: &str| -> serde_json::Value {
            let f = Filter {
                prefix: prefix.into(),
                kind: kind.into(),
            };
            serde_json::from_str(&view_json(&shared, &p, &f)).unwrap()
        };
        let all = view("", "");
        assert_eq!(all["matching"], MAX_SHOWN + 6);
        assert_eq!(all["rows"].as_array().unwrap().len(), MAX_SHOWN);
        let locks = view("report", "lock");
        assert_eq!(locks["matching"], 1);
        assert_eq!(locks["rows"][0]["name"], "report-lock");
        assert_eq!(view("report-10", "job")["matching"], 1 + 10 + 5);
        assert_eq!(view("nothing", "")["matching"], 0);
    }
}
