//! Fencing: a holder that stalls past its lease writes late, and the resource refuses it.
//!
//! A lease cannot stop a process that was frozen mid-write (a GC pause, `SIGSTOP`, a stalled VM):
//! when it wakes it does not know that its lock expired and someone else took it. Every lock
//! grant carries a fencing token that only grows; a resource that keeps the highest token it has
//! accepted refuses the stale holder's write. Here the resource is a Redis hash written with
//! [`baton::Locks::write_fenced`]; docs/mutex.md has the same rule as one PostgreSQL statement.
//!
//! ```text
//! cargo run --example fencing --features testing    # a private redis-server (on PATH)
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example fencing --features testing
//! ```

use baton::prelude::*;
use std::time::Duration;

use baton::{Client, FencedWrite};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    demo(&url).await
}

/// The whole story against `url`; an error if the outcome is not the one described above.
async fn demo(url: &str) -> Result<(), BoxError> {
    let url = url.to_string();
    let (a, b) = (Client::connect(&url).await?, Client::connect(&url).await?);
    let name = format!("fencing-demo-{}", std::process::id());
    let resource = format!("baton:resource:{name}");
    let ttl = Duration::from_millis(300);

    // A takes the lock and writes once, then stalls past its lease (no watchdog).
    let stale = a
        .locks()
        .try_acquire(&name, ttl)
        .await?
        .ok_or("the lock is taken")?;
    println!(
        "A holds the lock with fencing token {}",
        stale.fencing_token()
    );
    let w = a
        .locks()
        .write_fenced(&resource, stale.fencing_token(), "A: first draft")
        .await?;
    println!("A writes \"first draft\": {w:?}");
    println!("A stalls for {:?} (its lease is {ttl:?})...", ttl * 2);
    tokio::time::sleep(ttl * 2).await;

    // Meanwhile the lock expired; B takes it and writes.
    let fresh = b
        .locks()
        .try_acquire(&name, ttl)
        .await?
        .ok_or("the lock should have expired")?;
    println!(
        "B holds the lock with fencing token {}",
        fresh.fencing_token()
    );
    let w = b
        .locks()
        .write_fenced(&resource, fresh.fencing_token(), "B: final")
        .await?;
    println!("B writes \"final\": {w:?}");

    // A wakes up and finishes its write, with its old token: refused.
    let late = a
        .locks()
        .write_fenced(&resource, stale.fencing_token(), "A: late overwrite")
        .await?;
    println!("A wakes up and writes \"late overwrite\": {late:?}");
    if !matches!(late, FencedWrite::Rejected { .. }) {
        return Err("the stale write was accepted".into());
    }
    println!(
        "A releases: {} (false: the lock was no longer A's)",
        stale.release().await?
    );
    fresh.release().await?;
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let stored: Option<String> = redis::cmd("HGET")
        .arg(&resource)
        .arg("value")
        .query_async(&mut conn)
        .await?;
    println!("the resource holds {stored:?}");
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
