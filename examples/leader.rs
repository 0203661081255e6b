//! Leader election: one leader at a time, a crash, a graceful handover, and fencing by term.
//!
//! A first candidate (an `Elector`) leads, then its process "crashes": its client shuts down
//! without resigning, so nothing renews or releases its lease. Two more candidates run the
//! worker form as standbys; one of them leads once the lease runs out, in a larger term, and
//! works (writing its term to a fenced resource) until told to stop. It resigns: the other
//! standby leads at once, woken by the resignation rather than the lease. An observer prints
//! every change. Finally a late write of the first term is refused by the resource.
//!
//! ```text
//! cargo run --example leader --features testing    # a private redis-server (on PATH)
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example leader --features testing
//! ```

use baton::prelude::*;
use std::time::{Duration, Instant};

use baton::{Client, ElectionOptions, FencedWrite, LeaderWorker, Observed};
use tokio_stream::StreamExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    demo(&url).await
}

/// The next leader the observer reports (skipping vacancies), within `within`.
async fn next_leader(
    seen: &mut baton::Observer,
    within: Duration,
) -> Result<(String, u64), BoxError> {
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, seen.next()).await {
            Ok(Some(Observed::Leader { name, term })) => return Ok((name, term)),
            Ok(Some(Observed::NoLeader)) => println!("  (no leader)"),
            Ok(Some(other)) => println!("  observer: {other:?}"),
            Ok(None) => return Err("the observer ended".into()),
            Err(_) => return Err(format!("no new leader within {within:?}").into()),
        }
    }
}

/// A standby in the worker form whose work writes its term to `resource` until told to stop.
fn standby(
    client: &Client,
    election: &str,
    name: &str,
    resource: &str,
    lease: Duration,
) -> Result<LeaderWorker, BoxError> {
    let opts = ElectionOptions::builder().lease(lease).name(name).build()?;
    let (writer, resource) = (client.locks(), resource.to_string());
    Ok(client.leaders().lead(election, &opts, move |term| {
        let (writer, resource) = (writer.clone(), resource.clone());
        async move {
            while !term.lost_token().is_cancelled() {
                let _ = writer
                    .write_fenced(&resource, term.fencing_token(), term.name())
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    })?)
}

/// The whole story against `url`; an error if the outcome is not the one described above.
async fn demo(url: &str) -> Result<(), BoxError> {
    let election = format!("leader-demo-{}", std::process::id());
    let resource = format!("baton:resource:{election}");
    let lease = Duration::from_secs(2);
    let observer = Client::connect(url).await?;
    let mut seen = observer.leaders().observe(&election)?;

    let first = Client::connect(url).await?;
    let opts = ElectionOptions::builder().lease(lease).name("a").build()?;
    let elector = first.leaders().elector(&election, &opts)?;
    let term1 = elector.campaign().await?.fencing_token();
    let (name, term) = next_leader(&mut seen, Duration::from_secs(5)).await?;
    println!("{name} leads in term {term}");

    let (b, c) = (Client::connect(url).await?, Client::connect(url).await?);
    let workers = [
        standby(&b, &election, "b", &resource, lease)?,
        standby(&c, &election, "c", &resource, lease)?,
    ];
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The crash: nothing renews or releases a's lease any more.
    let crashed = Instant::now();
    first.shutdown(Duration::from_secs(1)).await;
    let (name2, term2) = next_leader(&mut seen, lease * 3).await?;
    println!(
        "{name2} leads in term {term2}, {:?} after a crashed (lease {lease:?})",
        crashed.elapsed()
    );

    // A graceful handover: the leader resigns; the other standby leads at once.
    let resigned = Instant::now();
    let i = if name2 == "b" { 0 } else { 1 };
    workers[i].resign();
    // (Within a lease or two: a standby whose subscription failed falls back to the PTTL.)
    let (name3, term3) = next_leader(&mut seen, lease * 2).await?;
    println!(
        "{name3} leads in term {term3}, {:?} after {name2} resigned",
        resigned.elapsed()
    );
    if !(term1 < term2 && term2 < term3) || name3 == name2 {
        return Err(format!("unexpected terms or leaders: {term1}, {term2}, {term3}").into());
    }

    // Once the new leader's work has written...
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let wrote = Instant::now();
    loop {
        let seen: Option<u64> = redis::cmd("HGET")
            .arg(&resource)
            .arg("fencing_token")
            .query_async(&mut conn)
            .await?;
        if seen == Some(term3) {
            break;
        }
        if wrote.elapsed() > lease {
            return Err(format!("{name3}'s work did not write (the resource has {seen:?})").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...a, paused somewhere rather than dead, writes late with its old term: refused.
    match observer
        .locks()
        .write_fenced(&resource, term1, "late")
        .await?
    {
        FencedWrite::Rejected { highest } => {
            println!("a late write of term {term1} was refused (the resource has seen {highest})")
        }
        FencedWrite::Written => return Err("a stale term's write was accepted".into()),
    }
    workers[1 - i].resign();
    drop(elector);
    let _: i64 = redis::cmd("DEL")
        .arg(&resource)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_story_holds_on_a_private_server() {
        let server = baton::testing::RedisServer::start().expect("start redis-server");
        super::demo(&server.url())
            .await
            .expect("the demo's own checks");
    }
}
