//! Model checking of baton's protocols: every interleaving of small fleets, run on the
//! library's own decisions.
//!
//! - `check`: an explicit-state checker (exhaustive breadth-first search with shortest
//!   counterexamples, an explicit liveness pass over the state graph, seeded random walks).
//! - `store`: Redis as the models see it (a linearizable key space with `WATCH`).
//! - `failover`: the failover protocol. Later primitives add their model beside it (a
//!   `Model` impl on the same store) and a line to `cases`: `mutex`, `leader`, `fair` (the fair
//!   lock and its reservation), `queue` (run-or-enqueue), `semaphore` (fenced permits),
//!   `rwlock` (the read-write lock with its writer-waiting mark and upgradeable reader).
//! - `pgrows`: PostgreSQL's lock table under its retention cleanup (row versions and what a
//!   waiting `DELETE` re-checks), where a statement is not atomic against an open transaction.
//!
//! A workspace member of its own (`baton-model`, not published), so that baton's `src/` is the
//! library alone: it reads the library's pure decisions through the hidden module
//! `baton::model_api` (baton's feature `model`). `src/main.rs` is the CI step (`.ci/test`,
//! step `model`) and the on-demand random walks.

use std::time::Duration;

mod check;
mod failover;
mod fair;
mod leader;
mod mutex;
mod pgrows;
mod queue;
mod rwlock;
mod semaphore;
mod store;
mod toy;

use check::{check_exhaustive, random_walks, Limits, Model, Outcome, WalkOutcome};
use failover::{Failover, Faults};

/// How many fault-free steps may separate any reachable state from one where every worker has
/// ended (the liveness bound).
const LIVENESS_STEPS: u32 = 64;

/// One exhaustive check of the suite.
struct Case {
    name: String,
    model: Subject,
    /// Part of CI's run; the others run with `check --all` (minutes each).
    ci: bool,
}

/// The model a case checks.
enum Subject {
    Failover(Failover),
    Mutex(mutex::MutexModel),
    Leader(leader::LeaderModel),
    Fair(fair::FairModel),
    Queue(queue::QueueModel),
    PgRows(pgrows::PgRowsModel),
    Semaphore(semaphore::SemaphoreModel),
    RwLock(rwlock::RwModel),
}

fn case(keepalive: bool, faults: Faults, ci: bool) -> Case {
    let mut parts = Vec::new();
    let mut part = |n: u8, what: &str| {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    };
    part(faults.lost_replies, "lost EXEC replies");
    part(faults.lost_messages, "lost messages");
    part(faults.pauses, "holder pauses");
    part(faults.crashes, "holder crashes");
    part(faults.stops, "stops");
    part(faults.refusals, "refused WATCHes");
    part(faults.restarts, "restarts with AOF");
    part(faults.wipes, "restarts losing every key");
    let name = format!(
        "failover 3 workers x 3 attempts, keepalive {}, {}",
        if keepalive { "on" } else { "off" },
        if parts.is_empty() {
            "no faults".into()
        } else {
            parts.join(", ")
        }
    );
    Case {
        name,
        model: Subject::Failover(Failover::new(3, 3, keepalive, faults)),
        ci,
    }
}

fn mutex_case(watchdog: bool, faults: mutex::Faults) -> Case {
    Case {
        name: format!(
            "mutex 3 clients x 3 rounds, watchdog {}, {} lost replies, {} pauses, {} crashes, {} restarts losing every key",
            if watchdog { "on" } else { "off" },
            faults.lost_replies,
            faults.pauses,
            faults.crashes,
            faults.wipes
        ),
        model: Subject::Mutex(mutex::MutexModel::new(3, 3, watchdog, faults)),
        ci: true,
    }
}

/// The mutex with its lock calls also going through the group commit (tasks of one client).
fn mutex_batching_case(rounds: u8, faults: mutex::Faults, ci: bool) -> Case {
    let mut model = mutex::MutexModel::new(3, rounds, true, faults);
    model.batching = true;
    Case {
        name: format!(
            "mutex batched 3 tasks x {rounds} rounds, watchdog on, {} lost replies, {} pauses, {} crashes, {} restarts losing every key",
            faults.lost_replies, faults.pauses, faults.crashes, faults.wipes
        ),
        model: Subject::Mutex(model),
        ci,
    }
}

fn leader_case(candidates: u8, terms: u8, faults: leader::Faults) -> Case {
    Case {
        name: format!(
            "leader {candidates} candidates x {terms} terms, {} lost replies, {} pauses, {} crashes, {} restarts losing every key",
            faults.lost_replies, faults.pauses, faults.crashes, faults.wipes
        ),
        model: Subject::Leader(leader::LeaderModel::new(candidates, terms, faults)),
        ci: true,
    }
}

fn fair_case(clients: u8, rounds: u8, reserver: bool, faults: fair::Faults, ci: bool) -> Case {
    Case {
        name: format!(
            "fair {clients} clients x {rounds} rounds, reserver {}, {} lost replies, {} lost messages, {} pauses, {} crashes",
            if reserver { "on" } else { "off" },
            faults.lost_replies,
            faults.lost_messages,
            faults.pauses,
            faults.crashes
        ),
        model: Subject::Fair(fair::FairModel::new(clients, rounds, reserver, faults)),
        ci,
    }
}

fn queue_case(clients: u8, rounds: u8, faults: queue::Faults, ci: bool) -> Case {
    Case {
        name: format!(
            "queue {clients} clients x {rounds} items, {} lost replies, {} pauses, {} crashes",
            faults.lost_replies, faults.pauses, faults.crashes
        ),
        model: Subject::Queue(queue::QueueModel::new(clients, rounds, faults)),
        ci,
    }
}

fn semaphore_case(clients: u8, rounds: u8, faults: semaphore::Faults) -> Case {
    Case {
        name: format!(
            "semaphore 2 permits (lowered to 1 once) {clients} clients x {rounds} rounds, watchdog on, {} lost replies, {} pauses, {} crashes, {} restarts losing every key",
            faults.lost_replies, faults.pauses, faults.crashes, faults.wipes
        ),
        model: Subject::Semaphore(semaphore::SemaphoreModel::new(
            clients, rounds, 2, true, faults,
        )),
        ci: true,
    }
}

fn rwlock_case(readers: u8, writers: u8, rounds: u8, faults: rwlock::Faults) -> Case {
    Case {
        name: format!(
            "rwlock {readers} endless readers, {writers} writer x {rounds} writes, 1 upgradeable reader, watchdog on, {} lost replies, {} pauses, {} crashes, {} restarts losing every key",
            faults.lost_replies, faults.pauses, faults.crashes, faults.wipes
        ),
        model: Subject::RwLock(rwlock::RwModel::new(readers, writers, rounds, true, faults)),
        ci: true,
    }
}

fn pg_rows_case(clients: u8, rounds: u8, runs: u8) -> Case {
    Case {
        name: format!(
            "postgres lock rows {clients} clients x {rounds} rounds, {runs} retention cleanups racing grants in flight"
        ),
        model: Subject::PgRows(pgrows::PgRowsModel::new(clients, rounds, runs, true)),
        ci: true,
    }
}

/// The suite: 3 workers × 3 attempts, exhaustively, with the fault budgets split over several
/// searches so each one finishes (the state space grows about tenfold with every fault added
/// to one budget). Keepalive off is the library's default; with it off a lease may end at any
/// moment, so its searches are the larger ones.
fn cases() -> Vec<Case> {
    let none = Faults::default();
    let mut cases = vec![
        case(
            true,
            Faults {
                lost_messages: 1,
                pauses: 1,
                crashes: 1,
                stops: 1,
                ..none
            },
            true,
        ),
        case(
            true,
            Faults {
                lost_replies: 1,
                pauses: 1,
                ..none
            },
            true,
        ),
        case(
            true,
            Faults {
                refusals: 1,
                restarts: 1,
                ..none
            },
            true,
        ),
        case(
            true,
            Faults {
                wipes: 1,
                pauses: 1,
                crashes: 1,
                ..none
            },
            true,
        ),
        case(
            false,
            Faults {
                lost_replies: 1,
                ..none
            },
            true,
        ),
        case(
            false,
            Faults {
                lost_messages: 1,
                crashes: 1,
                stops: 1,
                refusals: 1,
                ..none
            },
            true,
        ),
        case(false, Faults { wipes: 1, ..none }, true),
        case(
            true,
            Faults {
                lost_replies: 2,
                ..none
            },
            false,
        ),
        case(
            false,
            Faults {
                restarts: 1,
                ..none
            },
            false,
        ),
        case(
            true,
            Faults {
                wipes: 1,
                lost_replies: 1,
                ..none
            },
            false,
        ),
    ];
    // A worker that failed waits as a backup again (after its head start, modelled as the
    // `retry_delay` served): more attempts per worker, a larger space.
    for (faults, ci) in [
        (Faults { crashes: 1, ..none }, true),
        (
            Faults {
                lost_replies: 1,
                ..none
            },
            false,
        ),
    ] {
        let mut rejoin = case(true, faults, ci);
        rejoin.name = format!("{} (retry_delay, rejoin_after_fail)", rejoin.name);
        if let Subject::Failover(m) = &mut rejoin.model {
            m.retry_delay = true;
            m.rejoin_after_fail = true;
        }
        cases.push(rejoin);
    }
    let faults = mutex::Faults {
        lost_replies: 2,
        pauses: 1,
        crashes: 1,
        wipes: 0,
    };
    let wipe = mutex::Faults {
        wipes: 1,
        lost_replies: 1,
        ..mutex::Faults::default()
    };
    for watchdog in [true, false] {
        cases.push(mutex_case(watchdog, faults));
        cases.push(mutex_case(watchdog, wipe));
    }
    // Batching multiplies the interleavings (any task may queue at any time): CI checks one
    // round of three tasks (batches of up to three, a handoff inside a batch needs a
    // release queued with an acquisition) here and two tasks × two rounds in the unit tests;
    // two rounds of three tasks take minutes (`check "mutex batched" --all`).
    let batched = mutex::Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
        wipes: 0,
    };
    cases.push(mutex_batching_case(1, batched, true));
    cases.push(mutex_batching_case(1, wipe, true));
    cases.push(mutex_batching_case(1, faults, false));
    cases.push(mutex_batching_case(2, wipe, false));
    cases.push(mutex_batching_case(2, faults, false));
    cases.push(leader_case(
        3,
        2,
        leader::Faults {
            lost_replies: 1,
            pauses: 1,
            crashes: 1,
            wipes: 0,
        },
    ));
    cases.push(leader_case(
        3,
        2,
        leader::Faults {
            lost_replies: 1,
            wipes: 1,
            ..leader::Faults::default()
        },
    ));
    let one = fair::Faults {
        lost_replies: 1,
        lost_messages: 1,
        pauses: 1,
        crashes: 1,
    };
    // CI: about 5 s of one core in all; 4 clients take ~20 s and 3 clients x 2 rounds a
    // minute each (`--all`).
    for reserver in [true, false] {
        cases.push(fair_case(2, 2, reserver, one, true));
        cases.push(fair_case(3, 1, reserver, one, true));
    }
    cases.push(fair_case(4, 1, true, one, false));
    cases.push(fair_case(
        3,
        1,
        true,
        fair::Faults {
            lost_replies: 2,
            lost_messages: 2,
            pauses: 2,
            crashes: 1,
        },
        true,
    ));
    cases.push(fair_case(3, 2, true, one, false));
    cases.push(fair_case(3, 2, false, one, false));
    let one = queue::Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
    };
    // CI: about 15 s of one core in all; 3 clients x 2 items take half a minute (`--all`).
    cases.push(queue_case(3, 1, one, true));
    cases.push(queue_case(
        2,
        3,
        queue::Faults {
            lost_replies: 2,
            ..one
        },
        true,
    ));
    cases.push(queue_case(3, 2, one, false));
    // The lock table's cleanup against grants in open transactions (well under a second).
    cases.push(pg_rows_case(3, 2, 3));
    // The semaphore (2 permits, lowered to 1 once while held) and the read-write lock (readers
    // that never stop, a writer, the upgradeable reader), each with the faults split over two
    // searches as the mutex's are.
    let sem = semaphore::Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
        wipes: 0,
    };
    let sem_wipe = semaphore::Faults {
        wipes: 1,
        lost_replies: 1,
        pauses: 1,
        ..semaphore::Faults::default()
    };
    for faults in [sem, sem_wipe] {
        cases.push(semaphore_case(3, 1, faults));
    }
    let rw = rwlock::Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
        wipes: 0,
    };
    let rw_wipe = rwlock::Faults {
        wipes: 1,
        lost_replies: 1,
        ..rwlock::Faults::default()
    };
    for faults in [rw, rw_wipe] {
        cases.push(rwlock_case(2, 1, 2, faults));
    }

    cases
}

/// Runs the exhaustive suite (CI's cases, or `all` of them; those whose name contains
/// `filter`), printing one line per search with the states explored. Returns `false` if any
/// search found a counterexample or ended on a bound (state limit or timeout) instead of
/// exhausting the space.
pub fn check_suite(filter: &str, all: bool, max_states: usize, timeout: Duration) -> bool {
    let limits = Limits {
        max_states,
        timeout,
        liveness_steps: Some(LIVENESS_STEPS),
        fair_cycles: true,
    };
    let chosen: Vec<_> = cases()
        .into_iter()
        .filter(|c| (all || c.ci) && c.name.contains(filter))
        .collect();
    // The searches are independent: one per core at a time, each printing its line as it ends.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(chosen.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = chosen.get(i) else { break };
                let ok = match &case.model {
                    Subject::Failover(m) => report(&case.name, m, &limits),
                    Subject::Mutex(m) => report(&case.name, m, &limits),
                    Subject::Leader(m) => report(&case.name, m, &limits),
                    Subject::Fair(m) => report(&case.name, m, &limits),
                    Subject::Queue(m) => report(&case.name, m, &limits),
                    Subject::PgRows(m) => report(&case.name, m, &limits),
                    Subject::Semaphore(m) => report(&case.name, m, &limits),
                    Subject::RwLock(m) => report(&case.name, m, &limits),
                };
                if !ok {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    !failed.into_inner() & toy_livelock_found(&limits)
}

/// Runs the toy livelock ([`toy`]): its fair cycle must be found, or the checker's fair-cycle
/// check is broken and the searches' "no fair cycle" means nothing.
fn toy_livelock_found(limits: &Limits) -> bool {
    let r = check_exhaustive(&toy::Livelock, limits);
    match &r.outcome {
        Outcome::FairCycle(cx) => {
            let around = cx.steps.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>();
            println!(
                "model toy-livelock: fair cycle found (expected), {} states, steps {}",
                r.states,
                around.join(" ")
            );
            true
        }
        other => {
            println!("model toy-livelock: NO FAIR CYCLE FOUND, the check is broken: {other}");
            false
        }
    }
}

fn report<M: Model>(name: &str, model: &M, limits: &Limits) -> bool {
    let r = check_exhaustive(model, limits);
    let figures = format!(
        "{} states, {} transitions, depth {}, longest fault-free way to the end {} steps{}, {:.1} s",
        r.states,
        r.edges,
        r.max_depth,
        r.max_distance_to_terminal
            .map_or_else(|| "-".into(), |d| d.to_string()),
        match r.cyclic_components {
            Some(n) => format!(", no fair cycle among {n} cyclic components"),
            None => String::new(),
        },
        r.elapsed.as_secs_f64()
    );
    match &r.outcome {
        Outcome::Exhausted => {
            println!("model {name}: exhausted, {figures}");
            true
        }
        Outcome::Violation(cx) => {
            println!("model {name}: SAFETY VIOLATION after {figures}\n{cx}");
            false
        }
        Outcome::LivenessViolation(cx) => {
            println!("model {name}: LIVENESS VIOLATION after {figures}\n{cx}");
            false
        }
        Outcome::FairCycle(cx) => {
            println!("model {name}: FAIR CYCLE (a livelock) after {figures}\n{cx}");
            false
        }
        Outcome::Incomplete { reason } => {
            println!("model {name}: INCOMPLETE ({reason}) after {figures}");
            false
        }
    }
}

/// Seeded random walks over a fleet too large to exhaust: `workers` workers, `attempts`
/// attempts, every fault budget at 2 (1 for refused `WATCH`es and each kind of restart).
/// Returns `false` on a violation (printed with its trace).
pub fn walk(workers: u8, attempts: u64, seed: u64, walks: u32, steps: u32, time: Duration) -> bool {
    let faults = Faults {
        lost_replies: 2,
        lost_messages: 2,
        pauses: 2,
        crashes: 2,
        stops: 2,
        refusals: 1,
        restarts: 1,
        wipes: 1,
    };
    let mut ok = true;
    for keepalive in [true, false] {
        let model = Failover::new(workers.min(8), attempts.clamp(1, 10), keepalive, faults);
        let r = random_walks(&model, seed, walks, steps, time);
        let figures = format!(
            "{} walks, {} steps, {} distinct states, {:.1} s",
            r.walks,
            r.steps,
            r.distinct_states_seen,
            r.elapsed.as_secs_f64()
        );
        match &r.outcome {
            WalkOutcome::Ok => println!(
                "walk failover {workers}x{attempts} keepalive={keepalive} seed {seed}: ok, {figures}"
            ),
            WalkOutcome::Violation(cx) => {
                println!(
                    "walk failover {workers}x{attempts} keepalive={keepalive} seed {seed}: VIOLATION after {figures}\n{cx}"
                );
                ok = false;
            }
        }
    }
    ok
}

/// Checks one failover configuration (for sizing the suite by hand).
#[doc(hidden)]
pub fn check_one(
    workers: u8,
    attempts: u64,
    keepalive: bool,
    budget: [u8; 8],
    timeout: Duration,
) -> bool {
    let [lost_replies, lost_messages, pauses, crashes, stops, refusals, wipes, restarts] = budget;
    let model = Failover::new(
        workers,
        attempts,
        keepalive,
        Faults {
            lost_replies,
            lost_messages,
            pauses,
            crashes,
            stops,
            refusals,
            wipes,
            restarts,
        },
    );
    let limits = Limits {
        max_states: 100_000_000,
        timeout,
        liveness_steps: Some(LIVENESS_STEPS),
        fair_cycles: true,
    };
    report(
        &format!("{workers}x{attempts} keepalive={keepalive} {budget:?}"),
        &model,
        &limits,
    )
}
