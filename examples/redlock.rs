//! Redlock over three independent masters, in five steps:
//!
//! 1. `a` takes the lock on all three masters and prints its validity.
//! 2. `b` tries the same lock: `Ok(None)`, contention, not an error.
//! 3. `a` releases (on all three), `b` takes it.
//! 4. One master is killed: `b` still extends by quorum (2 of 3) and releases on the two left.
//! 5. A second master is killed: an acquisition fails with `QuorumUnavailable`, naming the
//!    quorum, a different error from contention.
//!
//! Then it prints what Redlock does not give. Each step is printed to stdout as one line.
//!
//! It always starts its own three private `redis-server`s (they must be on `PATH`), since it
//! kills two of them:
//!
//! ```text
//! cargo run --example redlock --features testing
//! ```

use baton::prelude::*;
use std::time::Duration;

use baton::testing::RedisServer;
use baton::{Client, Error, Redlock};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(10);
const KEY: &str = "report";

const CAVEATS: &str = "\
What Redlock does not give:
- mutual exclusion only if the masters' clocks run at about the same rate and the holder stops
  before its validity deadline: a pause (GC, swap, SIGSTOP) or a network delay longer than the
  remaining validity lets a second holder in;
- no fencing token: a master restarted without persistence forgets its locks, so a second
  quorum can form while the first holder still believes it holds the lock, and no token can be
  made monotonic across that (baton lock --redlock leaves BATON_FENCING_TOKEN unset);
- when correctness matters, use the single-node fenced mutex (client.locks()) and check its
  fencing token at the resource.";

/// What the demo saw, for its test.
#[derive(Debug, Default)]
struct Summary {
    a_acquired: bool,
    b_contended: bool,
    a_released_on: usize,
    b_acquired: bool,
    b_extended_with_one_down: bool,
    b_released_on: usize,
    quorum_error: Option<(usize, usize)>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start()?);
    }
    let summary = demo(&mut servers).await?;
    println!();
    println!("{CAVEATS}");
    eprintln!("{summary:?}");
    Ok(())
}

async fn clients(servers: &[RedisServer]) -> Result<Vec<Client>, BoxError> {
    let mut out = Vec::new();
    for s in servers {
        out.push(Client::connect(s.url()).await?);
    }
    Ok(out)
}

async fn demo(servers: &mut [RedisServer]) -> Result<Summary, BoxError> {
    let mut summary = Summary::default();
    // `a` and `b` as if in two processes: each has its own clients.
    let a = Redlock::new(&clients(servers).await?)?;
    let b = Redlock::new(&clients(servers).await?)?;
    println!(
        "redlock over {} masters, quorum {}",
        a.masters(),
        a.quorum()
    );

    let started = tokio::time::Instant::now();
    let Some(guard_a) = a.try_acquire(KEY, TTL).await? else {
        return Err("a: the lock should be free".into());
    };
    summary.a_acquired = true;
    println!(
        "1. a acquired `{KEY}`: valid for {:?} of its {TTL:?} ttl",
        guard_a.lease_deadline().saturating_duration_since(started)
    );

    summary.b_contended = b.try_acquire(KEY, TTL).await?.is_none();
    println!("2. b tried: held elsewhere (Ok(None), not an error)");

    summary.a_released_on = guard_a.release_counted().await?;
    println!(
        "3. a released: it still held the lock on {} masters",
        summary.a_released_on
    );
    let Some(mut guard_b) = b.try_acquire(KEY, TTL).await? else {
        return Err("b: the lock should be free after a's release".into());
    };
    summary.b_acquired = true;
    println!("   b acquired it");

    if let Some(s) = servers.first_mut() {
        s.kill();
    }
    summary.b_extended_with_one_down = guard_b.extend(TTL).await?;
    println!(
        "4. master 0 killed: b extended by quorum (2 of 3): {}",
        summary.b_extended_with_one_down
    );
    summary.b_released_on = guard_b.release_counted().await?;
    println!(
        "   b released: held on the {} masters left",
        summary.b_released_on
    );

    if let Some(s) = servers.get_mut(1) {
        s.kill();
    }
    match a.try_acquire(KEY, TTL).await {
        Err(Error::QuorumUnavailable {
            needed, reachable, ..
        }) => {
            summary.quorum_error = Some((needed, reachable));
            println!(
                "5. master 1 killed too: acquisition failed, quorum unavailable ({reachable} \
                 reachable, {needed} needed), not contention"
            );
        }
        other => return Err(format!("5. expected QuorumUnavailable, got {other:?}").into()),
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_shows_contention_release_and_the_quorum_error() {
        let mut servers: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start().expect("start redis-server"))
            .collect();
        let s = demo(&mut servers).await.unwrap();
        assert!(s.a_acquired && s.b_contended && s.b_acquired);
        assert_eq!(s.a_released_on, 3);
        assert!(s.b_extended_with_one_down);
        assert_eq!(s.b_released_on, 2);
        assert_eq!(s.quorum_error, Some((2, 1)));
        assert!(CAVEATS.contains("no fencing token"));
    }
}
