//! The fenced mutex: `with_lock` around work, and what a holder sees when it loses the lock.
//!
//! Four tasks (each with its own client, as if in separate processes) increment a plain Redis
//! counter under the lock with `with_lock`: read, think, write back. The counter ends exact.
//! Then a holder with the watchdog loses its lock on purpose (another process overwrites the
//! key, as an operator or an eviction could): the watchdog's next extension finds a foreign
//! token, the loss signal fires, and `with_lock` cancels the work and returns `LeaseLost`.
//!
//! ```text
//! cargo run --example mutex --features testing    # a private redis-server (on PATH)
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example mutex --features testing
//! ```

use std::time::Duration;

use baton::prelude::*;
use baton::{AcquireOptions, Client, ErrorKind};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TASKS: u64 = 4;
const ROUNDS: u64 = 25;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (url, _server) = baton::testing::url_from_env_or_start()?;
    demo(&url).await
}

/// The whole story against `url`; an error if the outcome is not the one described above.
async fn demo(url: &str) -> Result<(), BoxError> {
    let url = url.to_string();
    let name = format!("mutex-demo-{}", std::process::id());
    let counter = format!("baton:counter:{name}");
    let opts = AcquireOptions::builder()
        .wait(Duration::from_secs(30))
        .build()?;

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (url, name, counter, opts) = (url.clone(), name.clone(), counter.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::connect(&url).await?;
            let mut conn = redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?;
            for _ in 0..ROUNDS {
                client
                    .locks()
                    .with_lock(&name, Duration::from_secs(2), &opts, |_guard| async {
                        let v: Option<u64> = redis::cmd("GET")
                            .arg(&counter)
                            .query_async(&mut conn)
                            .await?;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(v.unwrap_or(0) + 1)
                            .query_async::<()>(&mut conn)
                            .await
                    })
                    .await??;
            }
            println!("task {t}: {ROUNDS} increments done");
            Ok::<(), BoxError>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await?;
    println!("counter = {total} (expected {})", TASKS * ROUNDS);
    if total != TASKS * ROUNDS {
        return Err("the counter is off: mutual exclusion failed".into());
    }

    // Loss: the lock key is overwritten under a holder (here by hand).
    let client = Client::connect(&url).await?;
    let lock_key = format!("baton:lock:{{{name}}}");
    let thief = {
        let mut conn = conn.clone();
        let key = lock_key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            redis::cmd("SET")
                .arg(&key)
                .arg("someone-else")
                .arg("PX")
                .arg(5_000)
                .query_async::<()>(&mut conn)
                .await
        })
    };
    let started = tokio::time::Instant::now();
    let outcome = client
        .locks()
        .with_lock(&name, Duration::from_millis(300), &opts, |guard| {
            let fence = guard.fencing_token();
            async move {
                println!("holder with fencing token {fence} starts 10 s of work");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
        .await;
    thief.await??;
    match outcome {
        Err(e) if e.kind() == ErrorKind::LeaseLost => {
            println!("after {:?} the work was cancelled: {e}", started.elapsed())
        }
        other => return Err(format!("expected LeaseLost, got {other:?}").into()),
    }
    let _: i64 = redis::cmd("DEL")
        .arg(&counter)
        .arg(&lock_key)
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
