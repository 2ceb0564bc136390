//! The client's socket and the request and response bodies, wrapped for the connection's timers:
//! reads pass through the head checks, stalled writes and bodies are timed. They must not judge a
//! head or close the connection: what a read means is `heads.rs`'s, when to close is the watcher's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::heads::STAND_IN;
use super::{InFlight, Track};
use crate::error::BodyTimeout;
use crate::lock::lock;

/// The client's socket, watched: reads feed the connection's [`Track`], which holds back
/// incomplete heads and replaces a refused one; stalled writes are timed.
pub(super) struct WatchedIo {
    inner: TcpStream,
    track: Arc<Track>,
    /// Bytes for hyper before any more are read: a head held back until complete, or the stand-in.
    out: Bytes,
    /// A head was refused: what the client sends next is read and dropped.
    refused: bool,
    /// The client closed its side (seen while refused).
    client_done: bool,
    shut: bool,
    /// The last write found the socket full.
    write_blocked: bool,
}

impl WatchedIo {
    pub(super) fn new(inner: TcpStream, track: Arc<Track>) -> Self {
        Self {
            inner,
            track,
            out: Bytes::new(),
            refused: false,
            client_done: false,
            shut: false,
            write_blocked: false,
        }
    }

    /// Reads and drops what the client sends, until it closes its side: closing with unread bytes
    /// would reset the connection and could destroy the reply in flight. A bounded number of reads
    /// per poll, so a client that keeps sending cannot hog a worker; the header timeout ends the
    /// connection if it never stops.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 2048];
        for _ in 0..16 {
            if self.client_done {
                return Poll::Ready(Ok(()));
            }
            let mut sink = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut sink))?;
            self.client_done = sink.filled().is_empty();
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Notes whether a write found the socket full: the send timeout runs from then until a write
    /// makes progress.
    fn note_write<T>(&mut self, polled: &Poll<T>) {
        let blocked = polled.is_pending();
        if blocked != self.write_blocked {
            self.write_blocked = blocked;
            lock(&self.track.state).write_blocked = blocked.then(Instant::now);
        }
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.refused {
                // Never end-of-file: hyper would drop the stand-in's answer (an HTTP/1.1
                // connection closes at once on end-of-file mid-request).
                ready!(this.poll_drain(cx))?;
                return Poll::Pending;
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let fresh = &buf.filled()[before..];
            if fresh.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let plan = this.track.on_read(fresh);
            let stand_in: &[u8] = if plan.refused {
                this.refused = true;
                this.track.pool.metrics.closed("bad_request");
                STAND_IN
            } else {
                &[]
            };
            match plan.before {
                None => {
                    buf.set_filled(before + plan.pass);
                    this.out = Bytes::from_static(stand_in);
                }
                Some(mut held) => {
                    held.extend_from_slice(&fresh[..plan.pass]);
                    held.extend_from_slice(stand_in);
                    buf.set_filled(before);
                    this.out = Bytes::from(held);
                }
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Everything read is held back or dropped: read on (or hand hyper `out`).
        }
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note_write(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    /// After a refusal's answer, half-closes and then waits for the client to close (see
    /// [`WatchedIo::poll_drain`]), bounded by the header timeout.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.shut = true;
        }
        if this.refused {
            ready!(this.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

/// The client's request body, failing with [`BodyTimeout`] when no part of it arrives for the
/// body timeout. The timer runs only while the body is read, and restarts with every frame.
pub(super) struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    /// Made on the first wait only: most bodies arrive whole and never need a timer.
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame arrived since the timer was set: restart it before the next wait.
    stale: bool,
    flight: Option<Arc<InFlight>>,
    timed_out: bool,
}

impl TimedBody {
    pub(super) fn new(inner: Incoming, timeout: Duration, flight: Arc<InFlight>) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
            stale: false,
            flight: Some(flight),
            timed_out: false,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.stale = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.flight = None;
                Poll::Ready(Some(Err(err.into())))
            }
            Poll::Ready(None) => {
                this.flight = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let deadline = Instant::now() + this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if std::mem::take(&mut this.stale) {
                    sleep.as_mut().reset(deadline);
                }
                ready!(sleep.as_mut().poll(cx));
                this.timed_out = true;
                if let Some(flight) = &this.flight {
                    flight.track.pool.metrics.closed("body_timeout");
                }
                let timeout_ms = u64::try_from(this.timeout.as_millis()).unwrap_or(u64::MAX);
                Poll::Ready(Some(Err(Box::new(BodyTimeout { timeout_ms }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body, holding its request in flight until the last frame is taken.
pub(super) struct TrackedBody {
    inner: Body,
    flight: Option<Arc<InFlight>>,
}

impl TrackedBody {
    pub(super) fn new(inner: Body, flight: Arc<InFlight>) -> Self {
        Self {
            inner,
            flight: Some(flight),
        }
    }
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            this.flight = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
