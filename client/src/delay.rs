//! A delaying TCP proxy for tests and benchmarks: every chunk read from either side is delivered to
//! the other `delay` after it arrived, in order, as a slow network link between the gateway and a
//! store (Redis) would. It is a delay line, not a bandwidth limit: chunks in flight overlap.
//!
//! `reprise-client delay-proxy --listen ADDR --target ADDR --delay-ms N` runs it as a process
//! (benches/slow-store.sh); [`DelayProxy::start`] runs it inside a test.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Chunks queued in one direction before the reader waits for the writer.
const IN_FLIGHT: usize = 1024;

/// A proxy running in the background of the current runtime; stopped when dropped.
pub struct DelayProxy {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `target`, `delay` later.
    pub async fn start(target: SocketAddr, delay: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, target, delay));
        Ok(Self { addr, task })
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections on `listener` until the task is dropped; each is connected to `target`.
pub async fn serve(listener: TcpListener, target: SocketAddr, delay: Duration) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, say: wait a little rather than spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        connections.spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::join!(
                pipe(client_read, server_write, delay),
                pipe(server_read, client_write, delay)
            );
        });
        // Reaps finished connections so a long run does not keep their handles.
        while connections.try_join_next().is_some() {}
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read; closes `to` after the last one.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Bytes)>(IN_FLIGHT);
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if tx.send((Instant::now() + delay, chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// `reprise-client delay-proxy`: the proxy as a process, until interrupted.
#[derive(Debug, clap::Args)]
pub struct DelayProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address every connection is forwarded to.
    #[arg(long)]
    pub target: SocketAddr,
    /// Added to every chunk, in each direction (a round trip gains twice this).
    #[arg(long)]
    pub delay_ms: u64,
}

pub async fn run(args: DelayProxyArgs) -> std::process::ExitCode {
    let listener = match TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "reprise-client delay-proxy: cannot listen on {}: {e}",
                args.listen
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("delay-proxy listening on {addr} -> {}", args.target),
        Err(e) => eprintln!("reprise-client delay-proxy: {e}"),
    }
    tokio::select! {
        () = serve(listener, args.target, Duration::from_millis(args.delay_ms)) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes arrive whole, in order, both ways, and not before the delay.
    #[tokio::test]
    async fn chunks_arrive_in_order_after_the_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.expect("write");
            }
        });
        let proxy = DelayProxy::start(target, Duration::from_millis(50))
            .await
            .expect("proxy");
        let mut c = TcpStream::connect(proxy.addr).await.expect("connect");
        let began = std::time::Instant::now();
        c.write_all(b"one,").await.expect("write");
        c.write_all(b"two").await.expect("write");
        let mut got = Vec::new();
        while got.len() < 7 {
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"one,two");
        // There and back: twice the delay at least.
        assert!(began.elapsed() >= Duration::from_millis(100));
    }
}
