//! The fault-injecting TCP proxy between the workers and the lock server.
//!
//! Each worker gets a listening port of its own, so a fault can target one
//! worker: its connections only. The proxy runs on a thread of its own (a
//! single-threaded runtime) inside the coordinator, so it dies with it.
//!
//! | fault | what the worker sees |
//! |---|---|
//! | delay D | every reply arrives D late (requests go through at once, so Redis executes them on time) |
//! | stall (blackhole) for N | nothing moves either way for N; the bytes are kept and delivered after, as TCP would retransmit them |
//! | swallow | the next reply (to a command Redis has executed) is dropped and the connection reset: an ambiguous outcome |
//! | reset | every connection is reset (RST) now |
//!
//! It also knows the upstream address of each of its connections, so
//! `CLIENT KILL ADDR` can target a worker's connections and nobody else's.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

#[derive(Debug)]
struct Faults {
    delay: Duration,
    delay_until: Option<Instant>,
    stall_until: Option<Instant>,
    swallow: bool,
    reset: CancellationToken,
}

impl Faults {
    fn new() -> Self {
        Faults {
            delay: Duration::ZERO,
            delay_until: None,
            stall_until: None,
            swallow: false,
            reset: CancellationToken::new(),
        }
    }
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    faults: Vec<Mutex<Faults>>,
    /// (worker, upstream local address) of the live connections.
    conns: Mutex<Vec<(usize, SocketAddr)>>,
}

impl Shared {
    fn faults(&self, w: usize) -> std::sync::MutexGuard<'_, Faults> {
        self.faults[w].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stalled(&self, w: usize) -> Option<Instant> {
        self.faults(w)
            .stall_until
            .filter(|until| *until > Instant::now())
    }

    fn delay_now(&self, w: usize) -> Duration {
        let f = self.faults(w);
        match f.delay_until {
            Some(until) if until > Instant::now() => f.delay,
            _ => Duration::ZERO,
        }
    }
}

/// A running proxy: one port per worker, all to one upstream.
#[derive(Debug)]
pub(crate) struct Proxy {
    shared: Arc<Shared>,
    ports: Vec<u16>,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listens on one loopback port per worker and forwards to `upstream`.
    pub(crate) fn start(upstream: SocketAddr, workers: usize) -> Result<Self> {
        let mut listeners = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..workers {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.set_nonblocking(true)?;
            ports.push(l.local_addr()?.port());
            listeners.push(l);
        }
        let shared = Arc::new(Shared {
            upstream,
            faults: (0..workers).map(|_| Mutex::new(Faults::new())).collect(),
            conns: Mutex::new(Vec::new()),
        });
        let stop = CancellationToken::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("torture-proxy".into())
                .spawn(move || {
                    runtime.block_on(async move {
                        for (w, l) in listeners.into_iter().enumerate() {
                            match TcpListener::from_std(l) {
                                Ok(l) => {
                                    tokio::spawn(accept(l, w, shared.clone(), stop.clone()));
                                }
                                Err(e) => tracing::warn!("proxy listener: {e}"),
                            }
                        }
                        stop.cancelled().await;
                    });
                })
                .map_err(|e| Error::failed(format!("cannot start the proxy thread: {e}")))?
        };
        Ok(Proxy {
            shared,
            ports,
            stop,
            thread: Some(thread),
        })
    }

    /// The port worker `w` connects to.
    pub(crate) fn port(&self, w: usize) -> u16 {
        self.ports[w]
    }

    /// Delays worker `w`'s replies by `by` for `length`.
    pub(crate) fn delay(&self, w: usize, by: Duration, length: Duration) {
        let mut f = self.shared.faults(w);
        f.delay = by;
        f.delay_until = Some(Instant::now() + length);
    }

    /// Stalls worker `w`'s traffic both ways for `length`.
    pub(crate) fn stall(&self, w: usize, length: Duration) {
        self.shared.faults(w).stall_until = Some(Instant::now() + length);
    }

    /// Arms the swallowing of worker `w`'s next reply; returns whether it
    /// is still armed (no reply came) after `within`.
    pub(crate) async fn swallow(&self, w: usize, within: Duration) -> bool {
        self.shared.faults(w).swallow = true;
        let give_up = Instant::now() + within;
        while Instant::now() < give_up {
            if !self.shared.faults(w).swallow {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut f = self.shared.faults(w);
        std::mem::replace(&mut f.swallow, false)
    }

    /// Resets every connection of worker `w`; returns how many there were.
    pub(crate) fn reset(&self, w: usize) -> usize {
        let n = self.upstream_addrs(w).len();
        let mut f = self.shared.faults(w);
        f.reset.cancel();
        f.reset = CancellationToken::new();
        n
    }

    /// The upstream (Redis-side) addresses of worker `w`'s connections.
    pub(crate) fn upstream_addrs(&self, w: usize) -> Vec<SocketAddr> {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(owner, _)| *owner == w)
            .map(|(_, a)| *a)
            .collect()
    }

    /// Clears every fault.
    pub(crate) fn heal(&self) {
        for w in 0..self.ports.len() {
            let mut f = self.shared.faults(w);
            f.delay_until = None;
            f.stall_until = None;
            f.swallow = false;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept(l: TcpListener, w: usize, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = l.accept() => match accepted {
                Ok((c, _)) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
        };
        tokio::spawn(connection(client, w, shared.clone(), stop.clone()));
    }
}

/// Waits while worker `w`'s traffic is stalled (bounded by the stall).
async fn wait_stall(shared: &Shared, w: usize) {
    while let Some(until) = shared.stalled(w) {
        tokio::time::sleep_until(until.min(Instant::now() + Duration::from_millis(20))).await;
    }
}

async fn connection(mut client: TcpStream, w: usize, shared: Arc<Shared>, stop: CancellationToken) {
    let mut upstream =
        match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(shared.upstream))
            .await
        {
            Ok(Ok(s)) => s,
            _ => {
                let _ = client.set_zero_linger();
                return;
            }
        };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let Ok(local) = upstream.local_addr() else {
        return;
    };
    shared
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((w, local));
    let reset = shared.faults(w).reset.clone();
    {
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = upstream.split();
        // Requests: through at once, unless stalled.
        let up = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                wait_stall(&shared, w).await;
                if uw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        // Replies: each chunk is due `delay` after it arrived.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let reader = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match ur.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let due = Instant::now() + shared.delay_now(w);
                        if tx.send((due, buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        };
        let writer = async {
            while let Some((due, bytes)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                wait_stall(&shared, w).await;
                {
                    let mut f = shared.faults(w);
                    if f.swallow {
                        // Redis executed the command; its reply is lost.
                        f.swallow = false;
                        return;
                    }
                }
                if cw.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = up => {}
            () = reader => {}
            () = writer => {}
            () = reset.cancelled() => {}
            () = stop.cancelled() => {}
        }
    }
    // Both sockets are reset (RST), as a broken network would.
    let _ = client.set_zero_linger();
    let _ = upstream.set_zero_linger();
    drop((client, upstream));
    shared
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(owner, a)| !(*owner == w && *a == local));
}
