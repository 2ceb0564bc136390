//! The tape: a streamed miss's events as they pass, kept as the very bytes relayed to the client
//! (shared with them, not copied) and read by the recorder and the flight's followers alike. It
//! must not parse an event into JSON while the stream runs, nor hold more than its cap.
//!
//! A parsed chunk (`serde_json::Value`, a B-tree node per object) costs about 2 KiB where its text
//! is 200 bytes; before the tape the recorder and the flight each kept one per event, and a
//! 100,000-token stream held about 400 MiB. The tape costs the event bytes and 40 bytes per event.
//!
//! Past `limit` bytes the answer will not be stored: the tape stops being a recording, frees what
//! it held and keeps only a short window for followers reading along (a follower that falls
//! further behind is cut, and says so).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

use crate::lock::lock;

/// What a follower still reading an over-cap tape may lag behind by: a client that reads at all
/// stays well inside it, and it bounds what an unstored flight holds.
pub const FOLLOWED_WINDOW: usize = 1 << 20;

/// The events of one streamed answer.
pub struct Tape {
    inner: Mutex<Inner>,
    /// Most bytes recorded; past it the tape is only a window.
    limit: usize,
    /// Bytes kept once over the limit (0 when nobody can follow).
    window: usize,
}

#[derive(Default)]
struct Inner {
    /// Events from `base` on: the bytes relayed, and when each arrived.
    events: VecDeque<(Bytes, Instant)>,
    /// Absolute index of `events[0]` (above 0 only once events were let go past the limit).
    base: usize,
    /// Bytes in `events`.
    bytes: usize,
    over: bool,
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Still within the limit: the answer may be stored.
    Recorded,
    /// This event took the tape past its limit: the answer will not be stored.
    WentOver,
    /// Already over.
    Over,
}

/// Events a follower reads from `from` on.
pub enum Read {
    Events(Vec<Bytes>),
    /// Events the follower had not read were let go (the tape went over its limit).
    Lagged,
}

impl Tape {
    /// A tape of at most `limit` recorded bytes, keeping `window` bytes for followers past it.
    pub fn new(limit: usize, window: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            limit,
            window,
        }
    }

    /// Appends one event (its bytes as relayed).
    pub fn push(&self, at: Instant, event: Bytes) -> Pushed {
        let mut inner = lock(&self.inner);
        inner.bytes += event.len();
        inner.events.push_back((event, at));
        let pushed = if inner.over {
            Pushed::Over
        } else if inner.bytes > self.limit {
            inner.over = true;
            Pushed::WentOver
        } else {
            return Pushed::Recorded;
        };
        while inner.bytes > self.window {
            let Some((gone, _)) = inner.events.pop_front() else {
                break;
            };
            inner.bytes -= gone.len();
            inner.base += 1;
        }
        if pushed == Pushed::WentOver {
            // Give the recording's memory back now, not when the stream ends.
            inner.events.shrink_to_fit();
        }
        pushed
    }

    pub fn is_over(&self) -> bool {
        lock(&self.inner).over
    }

    /// Events from absolute index `from` on.
    pub fn read(&self, from: usize) -> Read {
        let inner = lock(&self.inner);
        if from < inner.base {
            return Read::Lagged;
        }
        Read::Events(
            inner
                .events
                .iter()
                .skip(from - inner.base)
                .map(|(event, _)| event.clone())
                .collect(),
        )
    }

    /// The recorded events (offset ms after the first, bytes as relayed); `None` once the tape
    /// went over its limit. The tape keeps them (followers may still be reading).
    pub fn recorded(&self) -> Option<Vec<(f64, Bytes)>> {
        let inner = lock(&self.inner);
        if inner.over {
            return None;
        }
        let first = inner.events.front().map(|(_, at)| *at);
        Some(
            inner
                .events
                .iter()
                .map(|(event, at)| {
                    let offset_ms = first.map_or(0.0, |f| {
                        crate::timing::millis(at.saturating_duration_since(f))
                    });
                    (offset_ms, event.clone())
                })
                .collect(),
        )
    }
}

/// Recorded events as stored chunks (offset ms, parsed data); `None` when an event's data is not
/// a JSON chunk.
pub fn chunks(recorded: &[(f64, Bytes)]) -> Option<Vec<(f64, Value)>> {
    recorded
        .iter()
        .map(|(offset_ms, event)| Some((*offset_ms, chunk_of(event)?)))
        .collect()
}

/// The JSON data of a relayed chunk event.
pub fn chunk_of(event: &[u8]) -> Option<Value> {
    serde_json::from_str(&crate::sse::event_data(event)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize) -> Bytes {
        Bytes::from(format!("data: {{\"n\":{n}}}\n\n"))
    }

    #[test]
    fn within_the_limit_the_tape_gives_back_every_chunk_in_order() {
        let tape = Tape::new(1 << 20, FOLLOWED_WINDOW);
        let t0 = Instant::now();
        for n in 0..3 {
            assert_eq!(tape.push(t0, event(n)), Pushed::Recorded);
        }
        let Read::Events(read) = tape.read(1) else {
            panic!("lagged within the limit");
        };
        assert_eq!(read, vec![event(1), event(2)]);
        let chunks = chunks(&tape.recorded().expect("recorded")).expect("chunks");
        let ns: Vec<u64> = chunks.iter().filter_map(|(_, v)| v["n"].as_u64()).collect();
        assert_eq!(ns, [0, 1, 2]);
    }

    #[test]
    fn past_the_limit_the_recording_is_dropped_and_only_a_window_is_kept() {
        let one = event(0).len();
        let tape = Tape::new(3 * one, 3 * one);
        let t0 = Instant::now();
        let pushed: Vec<Pushed> = (0..6).map(|n| tape.push(t0, event(n))).collect();
        assert_eq!(pushed[..3], [Pushed::Recorded; 3]);
        assert_eq!(pushed[3], Pushed::WentOver);
        assert_eq!(pushed[4..], [Pushed::Over; 2]);
        assert!(tape.is_over());
        assert!(
            tape.recorded().is_none(),
            "an over-cap answer is never stored"
        );
        // The last three are kept for followers; the first three are gone.
        assert!(matches!(tape.read(2), Read::Lagged));
        let Read::Events(read) = tape.read(3) else {
            panic!("lagged inside the window");
        };
        assert_eq!(read, vec![event(3), event(4), event(5)]);
        // Unfollowed, nothing is kept at all.
        let alone = Tape::new(3 * one, 0);
        for n in 0..4 {
            alone.push(t0, event(n));
        }
        assert!(matches!(alone.read(3), Read::Lagged));
        assert!(matches!(alone.read(4), Read::Events(e) if e.is_empty()));
    }
}
