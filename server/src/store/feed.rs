//! The change feed of a shared store: what one replica changed in the cache that every other
//! replica must apply to what it keeps in memory (its vector index, its live settings, its
//! feedback), as a Redis Stream (`reprise:feed`) that every replica reads.
//!
//! Entries themselves are read from the store, never from the feed: a put carries only what the
//! vector index needs (id, partition, vector), so a replica that misses a change still serves the
//! entry as an exact hit and only lacks it as a semantic candidate until it resyncs. The feed is
//! trimmed to about [`KEEP`] changes; a replica that falls further behind, or finds the stream
//! gone (Redis restarted empty, or flushed by hand), is told so ([`FeedError::Lost`]) and rebuilds
//! from the store. Operator changes (config patches, verdicts) are also appended to lists that are
//! never trimmed, so a replica that starts later applies them all (see [`Feed::history`]).
//!
//! Only core stream commands (`XADD` with `MAXLEN ~`, `XREAD BLOCK`, `XRANGE`), one key, so it
//! runs on Redis 7+, Valkey and cluster mode alike; the other keys here are read and written one
//! command at a time, or in a batch split by slot ([`Conn::batch`]), never in one pipeline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::streams::{StreamId, StreamRangeReply, StreamReadOptions, StreamReadReply};
use ::redis::{Commands, RedisError, Value};

use super::connect::{Conn, Connector, Timeouts};
use super::StoreError;
use crate::entry::EntryId;

/// The stream every replica follows.
const FEED: &str = "reprise:feed";
/// Operator changes kept whole for replicas that start later (`RPUSH`, never trimmed: rare).
const CONFIG_HISTORY: &str = "reprise:history:config";
const VERDICT_HISTORY: &str = "reprise:history:verdicts";
/// The embedding model whose vectors the store holds ([`Feed::agree_model`]).
const MODEL: &str = "reprise:model";
/// What a request met, for a verdict sent to another replica: `reprise:req:<request id>`.
const REQUEST_PREFIX: &str = "reprise:req:";
/// How long a request can be judged on any replica (on the replica that served it, as long as it
/// is among its most recent requests).
const REQUEST_TTL_MS: u64 = 3_600_000;
/// Changes the stream keeps (approximately: `MAXLEN ~` trims whole nodes, which is cheap). At a
/// few hundred bytes to 2 kB each (a put carries its vector), about 100-200 MB of Redis memory at
/// most; a replica down for longer than it takes to write this many entries rebuilds instead.
pub const KEEP: usize = 100_000;
/// Changes read per `XREAD`.
const READ_BATCH: usize = 512;
/// A connection for a blocking read waits this much longer than the block itself.
const READ_SLACK: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const WRITE_TIMEOUT: Duration = Duration::from_millis(200);

/// One change to the shared cache, as every replica applies it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// An entry was stored (or given its vector): a semantic candidate when `vector` is set.
    Put {
        id: EntryId,
        partition: [u8; 32],
        vector: Option<Vec<f32>>,
    },
    /// An entry was deleted (invalidated, evicted, replaced).
    Delete(EntryId),
    /// Every entry was deleted (`/admin/flush`).
    Clear,
    /// A `PATCH /admin/config` body, as it was accepted.
    Config(serde_json::Value),
    /// An operator's verdict and what it applies to (see `feedback::SharedVerdict`).
    Verdict(serde_json::Value),
}

impl Change {
    fn op(&self) -> &'static str {
        match self {
            Change::Put { .. } => "put",
            Change::Delete(_) => "del",
            Change::Clear => "clear",
            Change::Config(_) => "config",
            Change::Verdict(_) => "verdict",
        }
    }
}

/// A position in the feed: changes after it are still to be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Cursor {
    pub ms: u64,
    pub seq: u64,
}

impl Cursor {
    fn parse(id: &str) -> Option<Self> {
        let (ms, seq) = id.split_once('-')?;
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

/// As a stream id (`<ms>-<seq>`).
impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What one read of the feed gave.
#[derive(Debug, Default)]
pub struct Batch {
    /// Changes by other replicas, in order.
    pub changes: Vec<Change>,
    /// Where the next read starts (past this replica's own changes too).
    pub cursor: Cursor,
    /// Whether this read reached the end of the feed.
    pub caught_up: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The feed no longer holds the cursor (trimmed past it, or the stream is gone): changes were
    /// missed, rebuild from the store.
    #[error("the change feed no longer holds this replica's position: {0}")]
    Lost(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A shared store's change feed.
pub trait Feed: Send + Sync {
    /// This replica's name in the feed (its changes are not given back to it).
    fn replica(&self) -> &str;
    /// Appends `change`. Best effort: a change not published leaves other replicas without an
    /// entry as a semantic candidate (never with a wrong answer: entries are read from the store).
    fn publish(&self, change: &Change) -> Result<(), StoreError>;
    /// The end of the feed now: a replica takes it before it loads from the store, then follows
    /// from it, so no change falls between the load and the follow.
    fn tail(&self) -> Result<Cursor, StoreError>;
    /// Changes after `cursor`, waiting up to `wait` for one. Blocking.
    fn read(&self, cursor: Cursor, wait: Duration) -> Result<Batch, FeedError>;
    /// Every config patch (`Change::Config`) or verdict (`Change::Verdict`) ever published, oldest
    /// first, for a replica that starts or rebuilds.
    fn history(&self) -> Result<(Vec<serde_json::Value>, Vec<serde_json::Value>), StoreError>;
    /// Records `fingerprint` as the store's embedding model if none is; returns the recorded one
    /// when it differs (this replica's vectors cannot be compared with the stored ones).
    fn agree_model(&self, fingerprint: &str) -> Result<Option<String>, StoreError>;
    /// Keeps what requests met, for verdicts sent to another replica (see `feedback::Shared`).
    fn remember(&self, notes: &[(String, Vec<u8>)]) -> Result<(), StoreError>;
    fn recall(&self, request_id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Changes this replica published.
    fn published(&self) -> u64;
}

/// The feed on a Redis Stream.
pub struct RedisFeed {
    connector: Arc<Connector>,
    replica: String,
    /// The blocking reader's own connection (a block must not hold a pooled one).
    reader: std::sync::Mutex<Option<Conn>>,
    writer: std::sync::Mutex<Option<Conn>>,
    published: AtomicU64,
}

impl RedisFeed {
    pub fn new(connector: Arc<Connector>, replica: String) -> Self {
        Self {
            connector,
            replica,
            reader: std::sync::Mutex::new(None),
            writer: std::sync::Mutex::new(None),
            published: AtomicU64::new(0),
        }
    }

    /// Runs `op` on the connection in `slot` (opened with `read_timeout`), dropping it after an
    /// error (it may hold half a reply).
    fn on<T>(
        &self,
        slot: &std::sync::Mutex<Option<Conn>>,
        read_timeout: Duration,
        op: impl FnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, StoreError> {
        let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let c = self
                .connector
                .connect(Timeouts {
                    connect: CONNECT_TIMEOUT,
                    read: read_timeout,
                    write: WRITE_TIMEOUT,
                })
                .inspect_err(|_| self.connector.forget())?;
            *guard = Some(c);
        }
        let Some(c) = guard.as_mut() else {
            return Err(StoreError::Unavailable);
        };
        let result = op(c);
        if result.is_err() {
            *guard = None;
            // Behind Sentinels: ask them again which server is the master.
            self.connector.forget();
        }
        Ok(result?)
    }

    /// The id of the first change the stream holds, `None` when there is no stream.
    fn first(&self, c: &mut Conn) -> Result<Option<Cursor>, RedisError> {
        let range: StreamRangeReply = ::redis::cmd("XRANGE")
            .arg(FEED)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query(c)?;
        Ok(range.ids.first().and_then(|s| Cursor::parse(&s.id)))
    }
}

fn encode(change: &Change) -> Vec<(&'static str, Vec<u8>)> {
    let mut fields = vec![("op", change.op().as_bytes().to_vec())];
    match change {
        Change::Put {
            id,
            partition,
            vector,
        } => {
            fields.push(("id", id.0.to_string().into_bytes()));
            fields.push(("part", partition.to_vec()));
            if let Some(v) = vector {
                fields.push(("vec", v.iter().flat_map(|x| x.to_le_bytes()).collect()));
            }
        }
        Change::Delete(id) => fields.push(("id", id.0.to_string().into_bytes())),
        Change::Clear => {}
        Change::Config(body) | Change::Verdict(body) => {
            fields.push(("body", serde_json::to_vec(body).unwrap_or_default()))
        }
    }
    fields
}

fn bytes(map: &HashMap<String, Value>, field: &str) -> Option<Vec<u8>> {
    match map.get(field)? {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// The change in a stream entry; `None` for one this version does not know (a newer replica's),
/// which is skipped rather than misapplied.
fn decode(map: &HashMap<String, Value>) -> Option<Change> {
    let text = |field: &str| bytes(map, field).and_then(|b| String::from_utf8(b).ok());
    let id = || text("id")?.parse().ok().map(EntryId);
    let body = || serde_json::from_slice(&bytes(map, "body")?).ok();
    match text("op")?.as_str() {
        "put" => {
            let partition = bytes(map, "part")?.try_into().ok()?;
            let vector = match bytes(map, "vec") {
                Some(raw) if raw.len() % 4 == 0 => Some(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                ),
                Some(_) => return None,
                None => None,
            };
            Some(Change::Put {
                id: id()?,
                partition,
                vector,
            })
        }
        "del" => Some(Change::Delete(id()?)),
        "clear" => Some(Change::Clear),
        "config" => Some(Change::Config(body()?)),
        "verdict" => Some(Change::Verdict(body()?)),
        _ => None,
    }
}

impl Feed for RedisFeed {
    fn replica(&self) -> &str {
        &self.replica
    }

    fn publish(&self, change: &Change) -> Result<(), StoreError> {
        let mut fields = encode(change);
        fields.push(("from", self.replica.as_bytes().to_vec()));
        let history = match change {
            Change::Config(_) => Some(CONFIG_HISTORY),
            Change::Verdict(_) => Some(VERDICT_HISTORY),
            Change::Put { .. } | Change::Delete(_) | Change::Clear => None,
        };
        self.on(&self.writer, WRITE_TIMEOUT, |c| {
            if let (Some(list), Some((_, body))) =
                (history, fields.iter().find(|(f, _)| *f == "body"))
            {
                // The history first: a replica that reads the feed's change is sure to find it
                // there when it rebuilds.
                c.rpush::<_, _, ()>(list, body)?;
            }
            let mut cmd = ::redis::cmd("XADD");
            cmd.arg(FEED).arg("MAXLEN").arg("~").arg(KEEP).arg("*");
            for (field, value) in &fields {
                cmd.arg(*field).arg(value.as_slice());
            }
            cmd.query::<String>(c)
        })?;
        self.published.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn tail(&self) -> Result<Cursor, StoreError> {
        self.on(&self.writer, WRITE_TIMEOUT, |c| {
            let range: StreamRangeReply = ::redis::cmd("XREVRANGE")
                .arg(FEED)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1)
                .query(c)?;
            Ok(range
                .ids
                .first()
                .and_then(|s| Cursor::parse(&s.id))
                .unwrap_or_default())
        })
    }

    fn read(&self, cursor: Cursor, wait: Duration) -> Result<Batch, FeedError> {
        let (first, reply) = self.on(&self.reader, wait + READ_SLACK, |c| {
            // Checked before reading: a stream trimmed past the cursor or gone lost changes.
            let first = self.first(c)?;
            let options = StreamReadOptions::default()
                .count(READ_BATCH)
                .block(wait.as_millis().max(1) as usize);
            let reply: Option<StreamReadReply> =
                c.xread_options(&[FEED], &[cursor.to_string()], &options)?;
            Ok((first, reply))
        })?;
        match first {
            // A stream that is gone after the replica read from it: Redis restarted empty, or
            // someone deleted it. (A cursor at zero has seen nothing: nothing to lose.)
            None if cursor != Cursor::default() => return Err(FeedError::Lost("the feed is gone")),
            Some(first) if cursor != Cursor::default() && first > next(cursor) => {
                return Err(FeedError::Lost("the feed was trimmed past it"))
            }
            _ => {}
        }
        let mut batch = Batch {
            cursor,
            ..Batch::default()
        };
        let entries: Vec<StreamId> = reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default();
        batch.caught_up = entries.len() < READ_BATCH;
        for entry in &entries {
            if let Some(at) = Cursor::parse(&entry.id) {
                batch.cursor = batch.cursor.max(at);
            }
            let from = bytes(&entry.map, "from");
            if from.as_deref() == Some(self.replica.as_bytes()) {
                continue;
            }
            match decode(&entry.map) {
                Some(change) => batch.changes.push(change),
                None => {
                    tracing::debug!(id = %entry.id, "skipping a change this version cannot read")
                }
            }
        }
        Ok(batch)
    }

    fn history(&self) -> Result<(Vec<serde_json::Value>, Vec<serde_json::Value>), StoreError> {
        // Two reads, not one pipeline: the lists live in different slots of a cluster.
        let (configs, verdicts): (Vec<Vec<u8>>, Vec<Vec<u8>>) =
            self.on(&self.writer, WRITE_TIMEOUT, |c| {
                Ok((
                    c.lrange(CONFIG_HISTORY, 0, -1)?,
                    c.lrange(VERDICT_HISTORY, 0, -1)?,
                ))
            })?;
        let parse = |raw: Vec<Vec<u8>>| {
            raw.iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect()
        };
        Ok((parse(configs), parse(verdicts)))
    }

    fn agree_model(&self, fingerprint: &str) -> Result<Option<String>, StoreError> {
        let recorded: Option<String> = self.on(&self.writer, WRITE_TIMEOUT, |c| {
            ::redis::cmd("SET")
                .arg(MODEL)
                .arg(fingerprint)
                .arg("NX")
                .arg("GET")
                .query(c)
        })?;
        Ok(recorded.filter(|r| r != fingerprint))
    }

    fn remember(&self, notes: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        // One key per request: a batch split by slot on a cluster.
        let cmds = notes
            .iter()
            .map(|(request_id, note)| {
                let mut set = ::redis::cmd("SET");
                set.arg(format!("{REQUEST_PREFIX}{request_id}"))
                    .arg(note.as_slice())
                    .arg("PX")
                    .arg(REQUEST_TTL_MS);
                set
            })
            .collect();
        self.on(&self.writer, WRITE_TIMEOUT, |c| c.batch(cmds).map(drop))
    }

    fn recall(&self, request_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.on(&self.writer, WRITE_TIMEOUT, |c| {
            c.get(format!("{REQUEST_PREFIX}{request_id}"))
        })
    }

    fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
}

/// The smallest id after `c`.
fn next(c: Cursor) -> Cursor {
    Cursor {
        ms: c.ms,
        seq: c.seq + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_their_stream_encoding() {
        let changes = [
            Change::Put {
                id: EntryId(7),
                partition: [3; 32],
                vector: Some(vec![0.5, -0.25, 1.0]),
            },
            Change::Put {
                id: EntryId(8),
                partition: [4; 32],
                vector: None,
            },
            Change::Delete(EntryId(9)),
            Change::Clear,
            Change::Config(serde_json::json!({"similarity_threshold": 0.93})),
            Change::Verdict(serde_json::json!({"verdict": "wrong"})),
        ];
        for change in changes {
            let map = encode(&change)
                .into_iter()
                .map(|(f, v)| (f.to_owned(), Value::BulkString(v)))
                .collect();
            assert_eq!(decode(&map), Some(change));
        }
    }

    #[test]
    fn unknown_or_damaged_changes_are_skipped() {
        let entry = |fields: &[(&str, &[u8])]| -> HashMap<String, Value> {
            fields
                .iter()
                .map(|(f, v)| ((*f).to_owned(), Value::BulkString(v.to_vec())))
                .collect()
        };
        assert_eq!(decode(&entry(&[("op", b"rename")])), None);
        assert_eq!(decode(&entry(&[("op", b"del"), ("id", b"x")])), None);
        // A vector whose length is not a whole number of floats.
        assert_eq!(
            decode(&entry(&[
                ("op", b"put"),
                ("id", b"1"),
                ("part", &[0; 32]),
                ("vec", &[0; 5])
            ])),
            None
        );
    }

    #[test]
    fn cursors_order_as_stream_ids() {
        let a = Cursor::parse("1700000000000-5").expect("id");
        let b = Cursor::parse("1700000000001-0").expect("id");
        assert!(a < b && next(a) < b);
        assert_eq!(a.to_string(), "1700000000000-5");
        assert_eq!(Cursor::parse("x-1"), None);
    }
}
