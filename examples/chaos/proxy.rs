//! The fault proxy: one TCP listener per worker, forwarding to Redis, with a mode switchable at
//! run time (`Pass`, `Delay`, `Blackhole`, `Refuse`, `Slice`) and a `reset` action.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::util::{Jsonl, Rng};

/// What a link does with the bytes it reads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode")]
pub enum Mode {
    /// Forward as is.
    Pass,
    /// Forward each chunk after `ms` ± `jitter_pct` %.
    Delay { ms: u64, jitter_pct: u64 },
    /// Keep the sockets open and forward nothing (data waits in the kernel, as in a silent
    /// partition, and arrives late after heal).
    Blackhole,
    /// Accept new connections and close them at once; existing ones pass.
    Refuse,
    /// Forward 1..=max bytes per write.
    Slice { max: usize },
}

/// One worker's link to Redis.
pub struct Link {
    pub name: String,
    pub port: u16,
    mode: watch::Sender<Mode>,
    reset: watch::Sender<u64>,
    log: Arc<Jsonl>,
    conns: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Link {
    /// Listens on 127.0.0.1:0 and forwards to 127.0.0.1:`upstream`.
    pub async fn start(
        name: &str,
        upstream: u16,
        log: Arc<Jsonl>,
        seed: u64,
    ) -> std::io::Result<Arc<Link>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let (reset, reset_rx) = watch::channel(0u64);
        let conns = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            reset_rx,
            conns.clone(),
            seed,
        ));
        log.write(json!({"p":"proxy","type":"info","f":"listen","link":name,"port":port}));
        Ok(Arc::new(Link {
            name: name.to_string(),
            port,
            mode,
            reset,
            log,
            conns,
            task,
        }))
    }

    pub fn set_mode(&self, m: Mode) {
        let old = *self.mode.borrow();
        if old != m {
            self.mode.send_replace(m);
            self.log.write(
                json!({"p":"proxy","type":"info","f":"mode","link":self.name,
                "from":old,"to":m}),
            );
        }
    }

    /// Closes every current connection with an RST (`SO_LINGER 0` is set on every socket).
    pub fn reset_all(&self) {
        self.reset.send_modify(|g| *g += 1);
        self.log.write(
            json!({"p":"proxy","type":"info","f":"reset","link":self.name,
            "connections_total":self.conns.load(Ordering::Relaxed)}),
        );
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: u16,
    mode: watch::Receiver<Mode>,
    reset: watch::Receiver<u64>,
    conns: Arc<AtomicU64>,
    seed: u64,
) {
    let mut n = 0u64;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        n += 1;
        conns.fetch_add(1, Ordering::Relaxed);
        if matches!(*mode.borrow(), Mode::Refuse) {
            let _ = client.set_zero_linger();
            drop(client);
            continue;
        }
        tokio::spawn(connection(
            client,
            upstream,
            mode.clone(),
            reset.clone(),
            seed ^ n,
        ));
    }
}

async fn connection(
    client: TcpStream,
    upstream: u16,
    mode: watch::Receiver<Mode>,
    mut reset: watch::Receiver<u64>,
    seed: u64,
) {
    reset.mark_unchanged();
    let server = match tokio::time::timeout(
        Duration::from_secs(2),
        TcpStream::connect(("127.0.0.1", upstream)),
    )
    .await
    {
        Ok(Ok(s)) => s,
        // Redis down: the client sees its connection closed (reset).
        _ => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    // Every close of a proxied socket is an RST; a reset just drops both sides.
    let _ = client.set_zero_linger();
    let _ = server.set_zero_linger();
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut up = tokio::spawn(pump(cr, sw, mode.clone(), Rng::new(seed)));
    let mut down = tokio::spawn(pump(sr, cw, mode, Rng::new(seed.rotate_left(17))));
    tokio::select! {
        _ = &mut up => {}
        _ = &mut down => {}
        _ = reset.changed() => {}
    }
    up.abort();
    down.abort();
}

/// Copies `r` to `w` according to the link's mode until EOF or an error.
async fn pump(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    mut rng: Rng,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_while_blackholed(&mut mode).await?;
        let n = r.read(&mut buf).await?;
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        // The mode may have changed while the read was pending.
        wait_while_blackholed(&mut mode).await?;
        let m = *mode.borrow();
        match m {
            Mode::Pass | Mode::Refuse | Mode::Blackhole => w.write_all(&buf[..n]).await?,
            Mode::Delay { ms, jitter_pct } => {
                let j = ms as f64 * jitter_pct as f64 / 100.0;
                let d = (ms as f64 + rng.range(-j, j)).max(0.0);
                tokio::time::sleep(Duration::from_micros((d * 1000.0) as u64)).await;
                w.write_all(&buf[..n]).await?;
            }
            Mode::Slice { max } => {
                let mut off = 0;
                while off < n {
                    let k = (1 + rng.below(max.max(1))).min(n - off);
                    w.write_all(&buf[off..off + k]).await?;
                    w.flush().await?;
                    off += k;
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

async fn wait_while_blackholed(mode: &mut watch::Receiver<Mode>) -> std::io::Result<()> {
    while matches!(*mode.borrow_and_update(), Mode::Blackhole) {
        mode.changed()
            .await
            .map_err(|_| std::io::Error::other("proxy link closed"))?;
    }
    Ok(())
}
