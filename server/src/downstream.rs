//! Downstream: hands response bytes to the client and reports when the last byte was taken.
//!
//! `downstream` time (last upstream byte until the client has everything) and client disconnects can
//! only be seen from the body the server is polling, so every gateway response body goes through
//! [`Delivery`], which calls back exactly once: at the end, on a failure, or when dropped early.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

/// How delivery of a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// The server took the last byte at this instant.
    Complete(Instant),
    /// The source failed (e.g. a pass-through upstream broke mid-body).
    Failed,
    /// The body was dropped before its end: the client went away.
    Dropped,
}

pub enum Source {
    Once(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
    Upstream(BoxStream<'static, Result<Bytes, reqwest::Error>>),
    /// A paced replay.
    Replay(BoxStream<'static, Bytes>),
}

type Callback = Box<dyn FnOnce(Delivered) + Send>;

pub(crate) struct Delivery {
    source: Source,
    on_end: Option<Callback>,
}

impl Delivery {
    pub(crate) fn new(source: Source, on_end: impl FnOnce(Delivered) + Send + 'static) -> Self {
        Self {
            source,
            on_end: Some(Box::new(on_end)),
        }
    }

    pub(crate) fn into_body(self) -> Body {
        Body::from_stream(self)
    }

    fn finish(&mut self, how: Delivered) {
        if let Some(on_end) = self.on_end.take() {
            on_end(how);
        }
    }
}

impl Stream for Delivery {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = match &mut self.source {
            Source::Once(bytes) => Poll::Ready(bytes.take().map(Ok)),
            Source::Channel(rx) => rx.poll_recv(cx).map(|b| b.map(Ok)),
            Source::Upstream(stream) => stream.poll_next_unpin(cx),
            Source::Replay(stream) => stream.poll_next_unpin(cx).map(|b| b.map(Ok)),
        };
        match polled {
            Poll::Ready(None) => {
                self.finish(Delivered::Complete(Instant::now()));
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(err))) => {
                self.finish(Delivered::Failed);
                Poll::Ready(Some(Err(std::io::Error::other(err))))
            }
            Poll::Ready(Some(Ok(bytes))) => Poll::Ready(Some(Ok(bytes))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        self.finish(Delivered::Dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn reports_completion_once_and_drops_as_disconnects() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let mut delivery = Delivery::new(Source::Once(Some(Bytes::from_static(b"x"))), move |d| {
            s.lock().expect("lock").push(d)
        });
        assert_eq!(
            delivery.next().await.map(|r| r.ok()),
            Some(Some(Bytes::from_static(b"x")))
        );
        assert!(delivery.next().await.is_none());
        drop(delivery);
        let log = seen.lock().expect("lock").clone();
        assert_eq!(log.len(), 1);
        assert!(matches!(log[0], Delivered::Complete(_)));

        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let (_tx, rx) = mpsc::channel(1);
        let delivery = Delivery::new(Source::Channel(rx), move |d| {
            s.lock().expect("lock").push(d)
        });
        drop(delivery);
        assert_eq!(seen.lock().expect("lock").as_slice(), &[Delivered::Dropped]);
    }
}
