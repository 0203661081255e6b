//! [`TcpRelay`]: a loopback TCP relay in front of a server, which a test can cut and restore,
//! as a network blip between one client and the server does.
//!
//! Threads and blocking sockets only (like the rest of this module), so it works from plain
//! `#[test]`s and beside a tokio runtime alike. Two threads per relayed connection: a test
//! relays a handful.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How often the accepting thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(10);

/// A TCP relay on a free loopback port to `127.0.0.1:upstream`.
///
/// While [cut](TcpRelay::cut), every relayed connection is closed and new ones are closed as
/// soon as they are accepted: the client sees its connections reset and its reconnections
/// fail, until [`restore`](TcpRelay::restore). Dropping the relay closes everything.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// let server = baton::testing::RedisServer::start()?;
/// let relay = baton::testing::TcpRelay::start(server.port())?;
/// let url = format!("redis://127.0.0.1:{}/", relay.port());
/// relay.cut(); // a blip: clients of `url` lose the server
/// relay.restore();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpRelay {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    down: AtomicBool,
    stop: AtomicBool,
    /// Both sockets of every relayed connection, to close them on a cut.
    open: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn close_all(&self) {
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(|e| e.into_inner()));
        for s in open {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl TcpRelay {
    /// Listens on `127.0.0.1:0` and relays each connection to `127.0.0.1:upstream`.
    ///
    /// # Errors
    /// When the listener cannot be opened or its thread started.
    pub fn start(upstream: u16) -> io::Result<TcpRelay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        let accepting = shared.clone();
        thread::Builder::new()
            .name("tcp-relay".into())
            .spawn(move || accept_loop(&listener, upstream, &accepting))?;
        Ok(TcpRelay { port, shared })
    }

    /// The relay's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every relayed connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }
}

fn accept_loop(listener: &TcpListener, upstream: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(POLL);
                continue;
            }
            Err(_) => {
                thread::sleep(POLL);
                continue;
            }
        };
        if shared.down.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let _ = relay(client, upstream, shared);
    }
}

/// Connects `client` to `upstream` and copies both ways on two threads.
fn relay(client: TcpStream, upstream: SocketAddr, shared: &Arc<Shared>) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect_timeout(&upstream, Duration::from_secs(2))?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    let (client_r, server_w) = (client.try_clone()?, server.try_clone()?);
    thread::Builder::new()
        .name("tcp-relay-up".into())
        .spawn(move || pump(client_r, server_w))?;
    thread::Builder::new()
        .name("tcp-relay-down".into())
        .spawn(move || pump(server, client))?;
    Ok(())
}

/// Copies `from` to `to` until either side closes, then closes both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
