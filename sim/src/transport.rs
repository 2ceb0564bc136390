//! The simulator's connections, and the faults only a connection can make: closing before any
//! response (`close-early`) and a status line that is not HTTP (`garbage-status`).
//!
//! A handler cannot break HTTP itself (the server library frames every response), so each
//! connection watches the request bytes it reads for `x-sim-fault: close-early|garbage-status` and,
//! when the response is about to be written, breaks it instead. It must not change anything else.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How much of a request is searched for the fault header (the head comes first).
const SCAN_LIMIT: usize = 64 * 1024;

/// What a garbled response says: no HTTP version, no status code.
const GARBAGE: &[u8] = b"HELLO THIS IS NOT HTTP\r\n\r\n";

/// A TCP listener whose connections can break their responses on request.
pub struct FaultListener(TcpListener);

impl FaultListener {
    pub fn new(listener: TcpListener) -> Self {
        Self(listener)
    }
}

impl axum::serve::Listener for FaultListener {
    type Io = FaultIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.0).await;
        let _ = tcp.set_nodelay(true);
        (FaultIo::new(tcp), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    CloseEarly,
    /// How many garbage bytes have been written so far.
    Garbage(usize),
    /// The fault was applied: every further write fails, so the server drops the connection.
    Spent,
}

/// One connection: the socket, the request bytes read since the last response, and the fault
/// they asked for.
pub struct FaultIo {
    tcp: TcpStream,
    request: Vec<u8>,
    armed: Option<Armed>,
}

impl FaultIo {
    fn new(tcp: TcpStream) -> Self {
        Self {
            tcp,
            request: Vec::new(),
            armed: None,
        }
    }

    /// Looks for a transport fault header in the request read so far.
    fn scan(&mut self) {
        if self.armed.is_some() {
            return;
        }
        let lower = self.request.to_ascii_lowercase();
        let name = b"\r\nx-sim-fault:";
        let Some(at) = lower.windows(name.len()).position(|w| w == name) else {
            return;
        };
        let rest = &lower[at + name.len()..];
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .unwrap_or(rest.len());
        self.armed = match rest[..end].trim_ascii() {
            b"close-early" => Some(Armed::CloseEarly),
            b"garbage-status" => Some(Armed::Garbage(0)),
            _ => None,
        };
    }
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "injected transport fault")
}

impl AsyncRead for FaultIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = &buf.filled()[before..];
            let room = SCAN_LIMIT.saturating_sub(self.request.len());
            let take = new.len().min(room);
            if take > 0 {
                let new = new[..take].to_vec();
                self.request.extend_from_slice(&new);
                self.scan();
            }
        }
        polled
    }
}

impl AsyncWrite for FaultIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // The response starts: the next request is scanned from scratch.
        self.request.clear();
        match self.armed {
            None => Pin::new(&mut self.tcp).poll_write(cx, buf),
            Some(Armed::CloseEarly) | Some(Armed::Spent) => {
                self.armed = Some(Armed::Spent);
                Poll::Ready(Err(broken()))
            }
            Some(Armed::Garbage(mut written)) => {
                while written < GARBAGE.len() {
                    match Pin::new(&mut self.tcp).poll_write(cx, &GARBAGE[written..]) {
                        Poll::Ready(Ok(n)) => written += n,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            self.armed = Some(Armed::Garbage(written));
                            return Poll::Pending;
                        }
                    }
                }
                self.armed = Some(Armed::Spent);
                Poll::Ready(Err(broken()))
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
