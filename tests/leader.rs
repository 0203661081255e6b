//! Leader election against real servers (one deployment per test, from the fixture): terms,
//! handover, crash takeover, work once per term, loss before the lease can pass on, observers.

mod common;

use baton::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::{ElectionOptions, FencedWrite, LeaderEvent, Observed};
use common::{client, server, Deployment, Endpoint, WAKE};
use tokio::time::Instant;
use tokio_stream::StreamExt;

fn opts(lease_ms: u64, name: &str) -> ElectionOptions {
    ElectionOptions::builder()
        .lease(Duration::from_millis(lease_ms))
        .name(name)
        .build()
        .unwrap()
}

async fn next_event(w: &mut baton::LeaderWorker, within: Duration) -> LeaderEvent {
    tokio::time::timeout(within, w.next_event())
        .await
        .expect("no leader event in time")
        .expect("the stream ended")
}

/// The next event that is not a renewal or a retryable error.
async fn next_change(w: &mut baton::LeaderWorker, within: Duration) -> LeaderEvent {
    let until = Instant::now() + within;
    loop {
        match next_event(w, until.saturating_duration_since(Instant::now())).await {
            LeaderEvent::Renewed { .. } => {}
            LeaderEvent::Error {
                retryable: true, ..
            } => {}
            other => return other,
        }
    }
}

/// A resource that checks fencing tokens, in the form README.md gives for each backend:
/// `Locks::write_fenced` on Redis, the README's SQL statement on a PostgreSQL table.
enum Resource {
    Redis(baton::Client, common::Raw),
    #[cfg(feature = "postgres")]
    Pg(tokio_postgres::Client),
}

impl Resource {
    const NAME: &'static str = "baton:leader-resource";

    async fn open(server: &Deployment) -> Resource {
        #[cfg(feature = "postgres")]
        if let Deployment::Postgres(d) = server {
            let c = d.connect().await;
            c.batch_execute(
                "CREATE TABLE IF NOT EXISTS resource
                 (id text PRIMARY KEY, value text, fencing_token bigint NOT NULL)",
            )
            .await
            .unwrap();
            return Resource::Pg(c);
        }
        let url = server.url_for(common::TEST_USER, common::TEST_PASSWORD);
        Resource::Redis(
            baton::Client::connect(&url).await.unwrap(),
            common::raw(server).await,
        )
    }

    async fn write(&self, token: u64, value: &str) -> FencedWrite {
        match self {
            Resource::Redis(c, _) => c
                .locks()
                .write_fenced(Self::NAME, token, value)
                .await
                .unwrap(),
            #[cfg(feature = "postgres")]
            Resource::Pg(c) => {
                let token = i64::try_from(token).unwrap();
                let n = c
                    .execute(
                        "INSERT INTO resource (id, value, fencing_token) VALUES ($1, $2, $3)
                         ON CONFLICT (id) DO UPDATE
                         SET value = EXCLUDED.value, fencing_token = EXCLUDED.fencing_token
                         WHERE resource.fencing_token <= EXCLUDED.fencing_token",
                        &[&Self::NAME, &value, &token],
                    )
                    .await
                    .unwrap();
                if n == 1 {
                    FencedWrite::Written
                } else {
                    FencedWrite::Rejected {
                        highest: self.highest().await,
                    }
                }
            }
        }
    }

    /// The highest fencing token the resource accepted.
    async fn highest(&self) -> u64 {
        match self {
            Resource::Redis(_, raw) => {
                let highest: Option<String> = redis::cmd("HGET")
                    .arg(Self::NAME)
                    .arg("fencing_token")
                    .query_async(&mut raw.clone())
                    .await
                    .unwrap();
                highest.unwrap().parse().unwrap()
            }
            #[cfg(feature = "postgres")]
            Resource::Pg(c) => {
                let row = c
                    .query_one(
                        "SELECT fencing_token FROM resource WHERE id = $1",
                        &[&Self::NAME],
                    )
                    .await
                    .unwrap();
                u64::try_from(row.get::<_, i64>(0)).unwrap()
            }
        }
    }
}

scenario! {
    postgres:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resignation_hands_over_without_waiting_out_the_lease() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let lease = Duration::from_secs(10);
        let leader = a.leaders().elector("handover", &opts(10_000, "a")).unwrap();
        let standby = b.leaders().elector("handover", &opts(10_000, "b")).unwrap();
        let t1 = leader.campaign().await.unwrap();
        assert!(leader.is_leader());
        assert_eq!(t1.name(), "a");
        let waiting = tokio::spawn(async move {
            let t = standby.campaign().await.unwrap();
            (t, Instant::now(), standby)
        });
        // The standby is parked on the lease (10 s) by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "two leaders at once");
        let resigned_at = Instant::now();
        assert!(leader.resign().await.unwrap());
        assert!(t1.lost_token().is_cancelled(), "resigning stops the term's work");
        assert!(!leader.is_leader());
        let (t2, led_at, standby) = tokio::time::timeout(WAKE, waiting)
            .await
            .expect("the standby was not woken by the resignation")
            .unwrap();
        assert!(led_at.duration_since(resigned_at) < lease / 2);
        assert!(t2.fencing_token() > t1.fencing_token(), "{} then {}", t1.fencing_token(), t2.fencing_token());
        assert!(standby.is_leader());
        assert!(standby.resign().await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_leaders_lease_runs_out_and_a_standby_leads() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let lease = Duration::from_millis(800);
        drop(a);
        // The leader runs on a runtime of its own, so that it can "die" (a `shutdown` would
        // resign, which is a handover, not a crash).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let url = server.user_url(common::TEST_USER, common::TEST_PASSWORD);
        let (a, leader, t1) = rt
            .spawn(async move {
                let a = baton::Client::connect(url).await.unwrap();
                let leader = a.leaders().elector("crash", &opts(800, "a")).unwrap();
                let t1 = leader.campaign().await.unwrap();
                (a, leader, t1)
            })
            .await
            .unwrap();
        // Renewals keep it past several leases.
        tokio::time::sleep(lease * 2).await;
        assert!(leader.is_leader());
        // The leader's process "dies": its runtime stops, and nothing renews or releases any
        // more.
        let crashed_at = Instant::now();
        rt.shutdown_background();
        std::mem::forget((a, leader));
        let standby = b.leaders().elector("crash", &opts(800, "b")).unwrap();
        let t2 = tokio::time::timeout(lease + WAKE, standby.campaign())
            .await
            .expect("no takeover")
            .unwrap();
        let took = crashed_at.elapsed();
        // Not before the lease could end (it was renewed at most a third of a lease before).
        assert!(took >= lease / 2, "took over after {took:?}");
        assert!(t2.fencing_token() > t1.fencing_token());
        assert!(standby.resign().await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_starts_once_per_term_and_stops_on_resign() {
        let server = server();
        let c = client(&server).await;
        let starts = Arc::new(AtomicU64::new(0));
        let stopped = Arc::new(AtomicU64::new(0));
        let (s1, s2) = (starts.clone(), stopped.clone());
        let mut w = c
            .leaders()
            .lead("once", &opts(300, "w"), move |term| {
                let (s1, s2) = (s1.clone(), s2.clone());
                async move {
                    s1.fetch_add(1, Ordering::SeqCst);
                    term.lost().await;
                    s2.fetch_add(1, Ordering::SeqCst);
                }
            })
            .unwrap();
        let LeaderEvent::Elected { term, .. } = next_change(&mut w, WAKE).await else {
            panic!("not elected first");
        };
        // Ten renewals (every 100 ms) and the work still started once.
        let mut renewals = 0;
        while renewals < 10 {
            match next_event(&mut w, WAKE).await {
                LeaderEvent::Renewed { term: t, .. } => {
                    assert_eq!(t, term);
                    renewals += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        assert!(w.is_leader());
        w.resign();
        match next_change(&mut w, WAKE).await {
            LeaderEvent::Resigned { term: t, reason } => {
                assert_eq!(t, term);
                assert_eq!(reason, "resign() was called");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(stopped.load(Ordering::SeqCst), 1, "the work stopped before the resignation");
        assert!(w.next_event().await.is_none());
        assert_eq!(common::holder(&server, "baton:leader:{once}").await, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn observers_see_each_leader_and_the_vacancy() {
        let server = server();
        let (a, o) = (client(&server).await, client(&server).await);
        let mut seen = o.leaders().observe("seen").unwrap();
        assert_eq!(
            tokio::time::timeout(WAKE, seen.next()).await.unwrap(),
            Some(Observed::NoLeader)
        );
        let e = a.leaders().elector("seen", &opts(10_000, "api-1")).unwrap();
        let t = e.campaign().await.unwrap();
        assert_eq!(
            tokio::time::timeout(WAKE, seen.next()).await.unwrap(),
            Some(Observed::Leader {
                name: "api-1".into(),
                term: t.fencing_token()
            })
        );
        e.resign().await.unwrap();
        assert_eq!(
            tokio::time::timeout(WAKE, seen.next()).await.unwrap(),
            Some(Observed::NoLeader)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_shutdown_resigns_its_electors_term_so_a_standby_leads_at_once() {
        let server = server();
        let (a, b) = (client(&server).await, client(&server).await);
        let leader = a.leaders().elector("bye", &opts(10_000, "a")).unwrap();
        let standby = b.leaders().elector("bye", &opts(10_000, "b")).unwrap();
        let t1 = leader.campaign().await.unwrap();
        let waiting = tokio::spawn(async move {
            let t = standby.campaign().await.unwrap();
            (t, Instant::now(), standby)
        });
        // The standby is parked on the 10 s lease by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "two leaders at once");
        assert!(a.shutdown(WAKE).await, "the shutdown did not finish in time");
        assert!(t1.is_lost(), "the shutdown ends the term's work");
        assert!(
            t1.loss_reason().unwrap_or_default().contains("shut down"),
            "{:?}",
            t1.loss_reason()
        );
        let (t2, led_at, standby) = tokio::time::timeout(WAKE, waiting)
            .await
            .expect("the standby was not woken by the shutdown")
            .unwrap();
        assert!(
            led_at < t1.lease_deadline(),
            "the standby led only {:?} after the old lease's deadline",
            led_at - t1.lease_deadline()
        );
        assert!(t2.fencing_token() > t1.fencing_token());
        assert!(standby.resign().await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_observer_reads_changes_with_next_event_tagged_event_in_json() {
        let server = server();
        let (a, o) = (client(&server).await, client(&server).await);
        let mut seen = o.leaders().observe("next").unwrap();
        let first = tokio::time::timeout(WAKE, seen.next_event()).await.unwrap();
        assert_eq!(first, Some(Observed::NoLeader));
        let e = a.leaders().elector("next", &opts(10_000, "api-2")).unwrap();
        let t = e.campaign().await.unwrap();
        let change = tokio::time::timeout(WAKE, seen.next_event())
            .await
            .unwrap()
            .expect("the stream goes on");
        assert_eq!(
            serde_json::to_value(&change).unwrap(),
            serde_json::json!({"event": "Leader", "name": "api-2", "term": t.fencing_token()})
        );
        e.resign().await.unwrap();
        // The shutdown ends the stream.
        o.shutdown(WAKE).await;
        let mut rest = Vec::new();
        while let Some(ev) = tokio::time::timeout(WAKE, seen.next_event()).await.unwrap() {
            rest.push(ev);
        }
        assert!(rest.len() <= 1, "{rest:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn five_electors_thirty_elections_with_kills_terms_grow_and_stale_writes_fail() {
        let server = server();
        let lease_ms = 250;
        // Opened (the table created) before the writers, which open it concurrently.
        let check = Resource::open(&server).await;
        let server = Arc::new(server);
        // Every grant: (term, who). A writer's last term, to replay a stale write later.
        let grants = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
        let elections = Arc::new(AtomicU64::new(0));
        let stale_rejected = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for who in 0..5usize {
            let server = server.clone();
            let server_url = server.url_for(common::TEST_USER, common::TEST_PASSWORD);
            let (grants, elections, rejected) =
                (grants.clone(), elections.clone(), stale_rejected.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (who as u64 + 1);
                let mut stale: Option<u64> = None;
                let resource = Resource::open(&server).await;
                while elections.load(Ordering::SeqCst) < 30 {
                    let c = baton::Client::connect(&server_url).await.unwrap();
                    let e = c.leaders().elector("thirty", &opts(lease_ms, &format!("e{who}"))).unwrap();
                    let campaign = tokio::time::timeout(Duration::from_secs(20), e.campaign());
                    let t = campaign.await.expect("campaign stalled").unwrap();
                    if elections.fetch_add(1, Ordering::SeqCst) >= 30 {
                        e.resign().await.unwrap();
                        break;
                    }
                    grants.lock().unwrap().push((t.fencing_token(), who));
                    let w = resource.write(t.fencing_token(), &format!("e{who}")).await;
                    assert_eq!(w, FencedWrite::Written, "the current leader's write");
                    // A deposed leader of an older term writes late: refused.
                    if let Some(old) = stale.take() {
                        match resource.write(old, "stale").await {
                            FencedWrite::Rejected { highest } => {
                                assert!(highest > old);
                                rejected.fetch_add(1, Ordering::SeqCst);
                            }
                            FencedWrite::Written => panic!("a write of term {old} was accepted"),
                        }
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    tokio::time::sleep(Duration::from_millis(rng % 100)).await;
                    if rng % 3 == 0 {
                        // Killed: the lease runs out.
                        c.shutdown(Duration::from_secs(1)).await;
                        std::mem::forget(e);
                    } else {
                        e.resign().await.unwrap();
                    }
                    stale = Some(t.fencing_token());
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t).await.unwrap().unwrap();
        }
        let grants = grants.lock().unwrap().clone();
        assert_eq!(grants.len(), 30);
        // Recorded in grant order per process but pushed concurrently: sort, then all distinct.
        let mut terms: Vec<u64> = grants.iter().map(|g| g.0).collect();
        terms.sort_unstable();
        terms.dedup();
        assert_eq!(terms.len(), 30, "two leaders shared a term");
        assert!(stale_rejected.load(Ordering::SeqCst) > 0, "no stale write was tried");
        let highest = check.highest().await;
        assert_eq!(highest, *terms.last().unwrap());
    }
}

// Single server only: pauses THE server (SIGSTOP) so renewals cannot be confirmed.
scenario! {
    single:
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_paused_server_the_work_stops_before_the_lease_can_end() {
        let server = server();
        let c = client(&server).await;
        let stopped_at = Arc::new(Mutex::new(None::<(Instant, Instant)>));
        let s = stopped_at.clone();
        let o = ElectionOptions::builder()
            .lease(Duration::from_millis(900))
            .stop_timeout(Duration::from_millis(300))
            .name("p")
            .build()
            .unwrap();
        let mut w = c
            .leaders()
            .lead("paused", &o, move |term| {
                let s = s.clone();
                async move {
                    term.lost().await;
                    *s.lock().unwrap() = Some((Instant::now(), term.lease_deadline()));
                }
            })
            .unwrap();
        let LeaderEvent::Elected { term, .. } = next_change(&mut w, WAKE).await else {
            panic!("not elected first");
        };
        server.pause().unwrap();
        let lost = next_change(&mut w, Duration::from_secs(5)).await;
        server.resume().unwrap();
        match lost {
            LeaderEvent::Lost { term: t, reason } => {
                assert_eq!(t, term);
                assert!(reason.contains("no renewal"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        let (at, deadline) = stopped_at.lock().unwrap().expect("the work was not stopped");
        assert!(at < deadline, "the work stopped {:?} after the lease could end", at - deadline);
        // It campaigns again, and the next term is larger.
        match next_change(&mut w, Duration::from_secs(10)).await {
            LeaderEvent::Elected { term: t2, .. } => assert!(t2 > term),
            other => panic!("unexpected {other:?}"),
        }
        w.resign();
        assert!(matches!(
            next_change(&mut w, WAKE).await,
            LeaderEvent::Resigned { .. }
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_ignores_the_stop_is_reported_overdue() {
        let server = server();
        let c = client(&server).await;
        let o = ElectionOptions::builder()
            .lease(Duration::from_millis(600))
            .stop_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let mut w = c
            .leaders()
            .lead("stubborn", &o, |_term| async {
                // Never looks at the stop token.
                tokio::time::sleep(Duration::from_secs(30)).await;
            })
            .unwrap();
        let LeaderEvent::Elected { term, .. } = next_change(&mut w, WAKE).await else {
            panic!("not elected first");
        };
        server.pause().unwrap();
        let ev = next_change(&mut w, Duration::from_secs(5)).await;
        server.resume().unwrap();
        match ev {
            LeaderEvent::StopOverdue { term: t, waited_ms } => {
                assert_eq!(t, term);
                assert!(waited_ms >= 100, "{waited_ms}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            next_change(&mut w, WAKE).await,
            LeaderEvent::Lost { .. }
        ));
    }
}

// ----- The bad-input catalogue (RELIABILITY.md §c) for leader election -----------------------

/// Two tasks campaigning on one elector at once get the same term: the second must not wait
/// behind the lease the first just took for the same candidate (a 30 s lease here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_campaigns_of_one_elector_share_its_term() {
    let server = server();
    let c = client(&server).await;
    let elector = c.leaders().elector("twice", &opts(30_000, "a")).unwrap();
    let (first, second) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(elector.campaign(), elector.campaign())
    })
    .await
    .expect("one campaign waited for the elector's own lease");
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(
        first.fencing_token(),
        second.fencing_token(),
        "two terms for one elector"
    );
    assert!(elector.is_leader());
    assert_eq!(
        elector.term().map(|t| t.fencing_token()),
        Some(first.fencing_token())
    );
    // The term both hold is the one the elector resigns.
    assert!(elector.resign().await.unwrap());
    assert!(first.lost_token().is_cancelled() && second.lost_token().is_cancelled());
    assert!(!elector.resign().await.unwrap(), "nothing left to resign");
}

#[test]
fn row_03_05_leader_options_and_names_are_rejected_before_any_io() {
    use baton::ConfigError;
    let field = |r: Result<ElectionOptions, ConfigError>| match r {
        Err(ConfigError::Invalid { field, .. }) => field,
        other => panic!("accepted: {other:?}"),
    };
    let b = ElectionOptions::builder;
    assert_eq!(field(b().lease(Duration::ZERO).build()), "lease");
    assert_eq!(
        field(b().lease(Duration::from_secs(86_401)).build()),
        "lease"
    );
    assert_eq!(
        field(
            b().lease(Duration::from_secs(1))
                .stop_timeout(Duration::from_millis(501))
                .build()
        ),
        "stop_timeout"
    );
    for name in ["", " \t", "a\u{0}b", "line\nbreak"] {
        assert_eq!(field(b().name(name).build()), "name", "{name:?}");
    }
    assert_eq!(field(b().name("n".repeat(257)).build()), "name");
    for bad in [
        r#"{"lease_ms":0}"#,
        r#"{"lease_ms":-1}"#,
        r#"{"stop_timeout_ms":9000}"#,
        r#"{"x":1}"#,
    ] {
        assert!(
            serde_json::from_str::<ElectionOptions>(bad).is_err(),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn row_05_bad_election_names_and_prefixes_are_config_errors() {
    let srv = server();
    let c = client(&srv).await;
    for key in ["", "  ", "a{b}", &"k".repeat(1025)] {
        let e = c
            .leaders()
            .elector(key, &ElectionOptions::default())
            .unwrap_err();
        assert_eq!(e.kind(), baton::ErrorKind::Config, "{key:?}");
        assert_eq!(
            c.leaders().observe(key).unwrap_err().kind(),
            baton::ErrorKind::Config
        );
    }
    assert!(c.leaders().with_prefix("no-colon").is_err());
    assert!(c.leaders().with_prefix("{x}:").is_err());
}

#[tokio::test]
async fn row_10_15_foreign_values_in_an_elections_keys_are_reported_and_left_untouched() {
    let srv = server();
    let c = client(&srv).await;
    let mut conn = common::raw(&srv).await;
    let set = |k: &'static str, v: &'static str| redis::cmd("SET").arg(k).arg(v).clone();
    // A fence baton never writes: the campaign fails at once (non-retryable), writes nothing.
    let _: () = set("baton:leader:{f}:fence", "-3")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = c.leaders().elector("f", &opts(1_000, "x")).unwrap();
    let err = tokio::time::timeout(WAKE, e.campaign())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), baton::ErrorKind::CorruptState);
    assert!(!err.is_retryable());
    assert_eq!(common::get(&mut conn, "baton:leader:{f}").await, None);
    assert_eq!(
        common::get(&mut conn, "baton:leader:{f}:fence")
            .await
            .as_deref(),
        Some("-3")
    );
    // A lease value baton never writes: observers report it, campaigns wait for it (it is held
    // by someone), nothing overwrites it.
    let _: () = redis::cmd("SET")
        .arg("baton:leader:{g}")
        .arg("not-a-baton-value")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut seen = c.leaders().observe("g").unwrap();
    match tokio::time::timeout(WAKE, seen.next()).await.unwrap() {
        Some(Observed::Error { kind, .. }) => assert_eq!(kind, baton::ErrorKind::CorruptState),
        other => panic!("{other:?}"),
    }
    let e = c.leaders().elector("g", &opts(1_000, "x")).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), e.campaign())
            .await
            .is_err()
    );
    assert_eq!(
        common::get(&mut conn, "baton:leader:{g}").await.as_deref(),
        Some("not-a-baton-value")
    );
    // A wrong type in the lease key: a typed, non-retryable error at once.
    let _: () = redis::cmd("HSET")
        .arg("baton:leader:{h}")
        .arg("a")
        .arg("b")
        .query_async(&mut conn)
        .await
        .unwrap();
    let e = c.leaders().elector("h", &opts(1_000, "x")).unwrap();
    let err = tokio::time::timeout(WAKE, e.campaign())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), baton::ErrorKind::WrongType, "{err}");
}

#[tokio::test]
async fn a_panicking_work_ends_the_leadership_and_says_why() {
    let srv = server();
    let c = client(&srv).await;
    let mut w = c
        .leaders()
        .lead("panics", &opts(1_000, "p"), |_term| async {
            panic!("boom in the leader's work");
        })
        .unwrap();
    let LeaderEvent::Elected { term, .. } = next_change(&mut w, WAKE).await else {
        panic!("not elected first");
    };
    match next_change(&mut w, WAKE).await {
        LeaderEvent::Resigned { term: t, reason } => {
            assert_eq!(t, term);
            assert!(reason.contains("boom in the leader's work"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Resigned: a standby could lead at once.
    let mut conn = common::raw(&srv).await;
    assert_eq!(common::get(&mut conn, "baton:leader:{panics}").await, None);
}

// A campaign dropped after its grant but before it returned (a worker resigned then, or a
// caller's timeout): the grant nobody knows of is let go at once, not renewed forever by its
// watchdog. Without it, the standby never led (found by examples/leader.rs, 1 run in ~15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_dropped_right_after_its_grant_lets_the_lease_go() {
    campaign_dropped_after_its_grant(server()).await;
}

/// The same on PostgreSQL, where the grant is a row and its release runs behind the grant on
/// the same pooled connection.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_campaign_dropped_right_after_its_grant_lets_the_lease_go() {
    campaign_dropped_after_its_grant(common::server_on(common::topology::Topology::Postgres)).await;
}

async fn campaign_dropped_after_its_grant(srv: Deployment) {
    let (a, b) = (client(&srv).await, client(&srv).await);
    let (granted_tx, granted_rx) = tokio::sync::oneshot::channel::<()>();
    let granted_tx = std::sync::Mutex::new(Some(granted_tx));
    baton::__seam::set_before_exec_hook(
        &a,
        Some(std::sync::Arc::new(move |what: &'static str| {
            if what == "leader: granted" {
                if let Some(tx) = granted_tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
            }
            // Holds every granted campaign here until it is dropped.
            Box::pin(std::future::pending::<()>())
                as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        })),
    );
    let mut w = a.leaders().start("dropped", &opts(10_000, "a")).unwrap();
    tokio::time::timeout(WAKE, granted_rx)
        .await
        .unwrap()
        .unwrap();
    assert!(common::holder(&srv, "baton:leader:{dropped}")
        .await
        .is_some());
    // Resigned while its campaign is granted but not returned: it never led as far as anyone
    // was told, and the lease must go.
    w.resign();
    assert!(matches!(
        next_change(&mut w, WAKE).await,
        LeaderEvent::Stopped
    ));
    let standby = b.leaders().elector("dropped", &opts(10_000, "b")).unwrap();
    let t = tokio::time::timeout(WAKE, standby.campaign())
        .await
        .expect("the dropped grant was kept alive (10 s lease, renewed)")
        .unwrap();
    assert_eq!(t.name(), "b");
}

#[tokio::test]
async fn row_16_a_lease_key_without_ttl_is_reported_never_waited_on_in_silence() {
    let srv = server();
    let c = client(&srv).await;
    let mut conn = common::raw(&srv).await;
    let _: () = redis::cmd("SET")
        .arg("baton:leader:{nottl}")
        .arg("0123456789abcdef0123456789abcdef:someone")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut w = c.leaders().start("nottl", &opts(1_000, "x")).unwrap();
    match next_event(&mut w, WAKE).await {
        LeaderEvent::Error {
            kind,
            retryable: true,
            message,
        } => {
            assert_eq!(kind, baton::ErrorKind::NoExpiry, "{message}");
            assert!(message.contains("baton:leader:{nottl}"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Never made to expire, never overwritten.
    assert_eq!(common::pttl(&mut conn, "baton:leader:{nottl}").await, -1);
    // Once the operator removes it, the candidate leads.
    let _: () = redis::cmd("DEL")
        .arg("baton:leader:{nottl}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(matches!(
        next_change(&mut w, WAKE).await,
        LeaderEvent::Elected { .. }
    ));
    w.resign();
}
