//! How the sled store encodes what it writes: an entry's two halves (the cold half as checksummed
//! JSON, the replay as a checksummed binary record), and values longer than [`CHUNK`] split into
//! chunks behind a record. The Redis store writes the same encoded halves, unchunked. It must not
//! decide what is stored or when: that is the backends'; it only turns values into bytes and back,
//! and never hands back bytes whose checksum does not match.
//!
//! An encoded cold half is `[format tag = 1][blake3 of the payload: 32 bytes][payload]`, the
//! payload being the serde_json of the [`Entry`] without `events` and `body`; an encoded replay is
//! `[tag = 4][blake3 of the rest: 32][the record's length: u32 LE][the record, LZ4 block]`, or
//! `[tag = 3][blake3 of the record: 32][record]` (`reprise_migrations::replay`) when LZ4 would not
//! make it shorter (and for every record written before schema version 4). A value longer than
//! [`CHUNK`] is kept in its chunk tree, and its own tree holds `[tag = 2][blake3 of the encoded
//! value: 32][its length: u64 BE][chunk count: u32 BE]`.

use std::convert::Infallible;

use sled::transaction::ConflictableTransactionResult;

use super::StoreError;
use crate::entry::{Entry, EntryId, Replay};

/// Format tag of an encoded entry: serde_json payload with a blake3 checksum.
pub(super) const FORMAT_JSON: u8 = 1;
const HEADER_LEN: usize = 1 + blake3::OUT_LEN;
/// Longest value handed to sled; a longer encoded entry is split into chunks of this size.
pub const CHUNK: usize = 4096;
/// Tag of the record that stands for a chunked value.
const FORMAT_CHUNKED: u8 = 2;
/// Format tag of an encoded replay: a binary replay record with a blake3 checksum.
pub(super) const FORMAT_REPLAY: u8 = 3;
/// Format tag of an LZ4-compressed replay (schema version 4 on). A record's stream events are
/// JSON chunks alike but for their few bytes of text, so it shrinks 4-5x: a 40-token answer's
/// 8.8 KB record to 1.9 KB, about what sled writes to disk and Redis holds in memory per entry
/// beside a 3 KB cold half. The checksum covers the compressed bytes, so a hit checks fewer bytes
/// than before and decompresses only what is intact.
pub(super) const FORMAT_REPLAY_LZ4: u8 = 4;
/// LZ4 cannot expand a block by more than 255x: a stated length beyond that is corrupt, and is
/// refused before anything is allocated for it.
const LZ4_MAX_RATIO: usize = 255;
const CHUNKED_RECORD_LEN: usize = 1 + blake3::OUT_LEN + 8 + 4;
/// Reads of a chunked entry retried when a writer replaced it mid-read.
const READ_ATTEMPTS: usize = 3;

/// Our transactions never abort on their own; they only fail on storage errors.
pub(super) type TxResult<T> = ConflictableTransactionResult<T, Infallible>;

/// Key of chunk `n` of entry `id`: chunks of one entry are contiguous and in order.
pub(super) fn chunk_key(id: u64, n: u32) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&id.to_be_bytes());
    key[8..].copy_from_slice(&n.to_be_bytes());
    key
}

/// The `entries` record of a chunked entry.
pub(super) struct ChunkedRecord {
    pub(super) hash: [u8; blake3::OUT_LEN],
    pub(super) len: u64,
    pub(super) count: u32,
}

impl ChunkedRecord {
    pub(super) fn of(value: &[u8]) -> Self {
        Self {
            hash: *blake3::hash(value).as_bytes(),
            len: value.len() as u64,
            count: value.len().div_ceil(CHUNK) as u32,
        }
    }

    pub(super) fn parse(raw: &[u8]) -> Option<Self> {
        if raw.len() != CHUNKED_RECORD_LEN || raw[0] != FORMAT_CHUNKED {
            return None;
        }
        let (hash, rest) = raw[1..].split_at(blake3::OUT_LEN);
        let (len, count) = rest.split_at(8);
        Some(Self {
            hash: hash.try_into().ok()?,
            len: u64::from_be_bytes(len.try_into().ok()?),
            count: u32::from_be_bytes(count.try_into().ok()?),
        })
    }

    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHUNKED_RECORD_LEN);
        out.push(FORMAT_CHUNKED);
        out.extend_from_slice(&self.hash);
        out.extend_from_slice(&self.len.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out
    }
}

/// Writes encoded entry `value` as entry `id`: in `entries` when it fits in [`CHUNK`] bytes, else
/// as chunks plus a record. The caller removes any older value of `id` first.
pub(super) fn write_value(
    entries: &sled::transaction::TransactionalTree,
    chunks: &sled::transaction::TransactionalTree,
    id: u64,
    value: &[u8],
) -> TxResult<()> {
    let id_bytes = id.to_be_bytes();
    if value.len() <= CHUNK {
        entries.insert(&id_bytes[..], value)?;
        return Ok(());
    }
    for (n, piece) in value.chunks(CHUNK).enumerate() {
        chunks.insert(&chunk_key(id, n as u32)[..], piece)?;
    }
    entries.insert(&id_bytes[..], ChunkedRecord::of(value).to_bytes())?;
    Ok(())
}

/// Removes entry `id` and its chunks; false when there was no such entry.
pub(super) fn remove_value(
    entries: &sled::transaction::TransactionalTree,
    chunks: &sled::transaction::TransactionalTree,
    id: u64,
) -> TxResult<bool> {
    let Some(old) = entries.remove(&id.to_be_bytes()[..])? else {
        return Ok(false);
    };
    if let Some(record) = ChunkedRecord::parse(&old) {
        for n in 0..record.count {
            chunks.remove(&chunk_key(id, n)[..])?;
        }
    }
    Ok(true)
}

/// What an `entries` (or `replays`) record stands for.
pub(super) enum Resolved {
    /// The encoded value, and whether its checksum was checked already (joined from chunks).
    Value(Vec<u8>, bool),
    /// Deleted while it was being read.
    Gone,
    /// Its chunks are missing or do not match its record.
    Corrupt(String),
}

/// Joins and checks the chunks of a chunked record; an inline record is its own value. A writer
/// may replace the entry between reading the record and reading its chunks, so a mismatch counts
/// as corruption only when the record is still the one that was read.
pub(super) fn resolve(
    entries: &sled::Tree,
    chunks: &sled::Tree,
    id: u64,
    mut raw: sled::IVec,
) -> Result<Resolved, StoreError> {
    for _ in 0..READ_ATTEMPTS {
        let Some(record) = ChunkedRecord::parse(&raw) else {
            return Ok(Resolved::Value(raw.to_vec(), false));
        };
        let why = match join_chunks(chunks, id, &record)? {
            Ok(value) => return Ok(Resolved::Value(value, true)),
            Err(why) => why,
        };
        match entries.get(id.to_be_bytes())? {
            None => return Ok(Resolved::Gone),
            Some(now) if now == raw => return Ok(Resolved::Corrupt(why)),
            Some(now) => raw = now,
        }
    }
    // Rewritten on every attempt: busy, not corrupt.
    Ok(Resolved::Gone)
}

/// The chunks of `record`, joined, or why they do not add up to it.
pub(super) fn join_chunks(
    chunks: &sled::Tree,
    id: u64,
    record: &ChunkedRecord,
) -> Result<Result<Vec<u8>, String>, StoreError> {
    let Ok(len) = usize::try_from(record.len) else {
        return Ok(Err(format!("chunked length {} too large", record.len)));
    };
    let mut value = Vec::with_capacity(len.min(1 << 30));
    let mut n = 0u32;
    for item in chunks.range(chunk_key(id, 0)..=chunk_key(id, u32::MAX)) {
        let (key, piece) = item?;
        if key[..] != chunk_key(id, n)[..] {
            return Ok(Err(format!("chunk {n} missing")));
        }
        value.extend_from_slice(&piece);
        n += 1;
    }
    if n != record.count || value.len() != len {
        return Ok(Err(format!(
            "{n} chunks of {} bytes, the record says {} of {len}",
            value.len(),
            record.count
        )));
    }
    if blake3::hash(&value).as_bytes() != &record.hash {
        return Ok(Err("chunk checksum mismatch".to_owned()));
    }
    Ok(Ok(value))
}

/// `[tag][blake3 of the payload][payload]`.
pub(super) fn tagged(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(tag);
    out.extend_from_slice(blake3::hash(payload).as_bytes());
    out.extend_from_slice(payload);
    out
}

/// The encoded cold half of an entry.
pub(super) fn encode_cold(entry: &Entry) -> Result<Vec<u8>, StoreError> {
    Ok(tagged(FORMAT_JSON, &entry.cold_json()?))
}

/// The encoded replay of an entry.
pub(super) fn encode_replay(replay: &Replay) -> Vec<u8> {
    pack(replay.encode())
}

/// An encoded replay record: compressed, unless LZ4 finds nothing to save. A record's fixed-width
/// integers alone give it runs of zeros to match, so in practice every one is compressed.
pub(super) fn pack(record: Vec<u8>) -> Vec<u8> {
    // Records are far below 4 GiB (an entry is capped long before); one that is not stays whole.
    if let Ok(len) = u32::try_from(record.len()) {
        let block = lz4_flex::block::compress(&record);
        if 4 + block.len() < record.len() {
            return tagged(
                FORMAT_REPLAY_LZ4,
                &[&len.to_le_bytes()[..], &block].concat(),
            );
        }
    }
    tagged(FORMAT_REPLAY, &record)
}

/// An encoded replay's payload, checked as [`payload`] checks, in whichever of its two formats
/// it was written: the store's open reads this much of every entry, and decompresses nothing.
pub(super) fn replay_payload(
    id: EntryId,
    raw: &[u8],
    checked: bool,
) -> Result<Packed<'_>, StoreError> {
    Ok(match raw.first() {
        Some(&FORMAT_REPLAY_LZ4) => Packed::Lz4(payload(id, raw, FORMAT_REPLAY_LZ4, checked)?),
        _ => Packed::Plain(payload(id, raw, FORMAT_REPLAY, checked)?),
    })
}

/// A replay record as stored.
pub(super) enum Packed<'a> {
    Plain(&'a [u8]),
    /// Its length (u32 LE), then the LZ4 block.
    Lz4(&'a [u8]),
}

impl Packed<'_> {
    /// The record's bytes; a compressed one that does not decompress to its stated length is
    /// corrupt.
    fn record(&self, id: EntryId) -> Result<std::borrow::Cow<'_, [u8]>, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt { id, reason };
        let packed = match *self {
            Packed::Plain(record) => return Ok(std::borrow::Cow::Borrowed(record)),
            Packed::Lz4(packed) => packed,
        };
        let (len, block) = packed
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt("compressed replay shorter than its length".to_owned()))?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > block.len().saturating_mul(LZ4_MAX_RATIO) {
            return Err(corrupt(format!(
                "compressed replay of {} bytes states {len}",
                block.len()
            )));
        }
        let record = lz4_flex::block::decompress(block, len)
            .map_err(|e| corrupt(format!("compressed replay: {e}")))?;
        if record.len() != len {
            return Err(corrupt(format!(
                "compressed replay decompressed to {} bytes, states {len}",
                record.len()
            )));
        }
        Ok(std::borrow::Cow::Owned(record))
    }
}

/// The payload of an encoded value with format `tag`, its checksum verified unless `checked`
/// already (a chunked value's record holds the checksum of the whole, verified when joined).
pub(super) fn payload(
    id: EntryId,
    raw: &[u8],
    tag: u8,
    checked: bool,
) -> Result<&[u8], StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt {
        id,
        reason: reason.to_owned(),
    };
    if raw.len() < HEADER_LEN {
        return Err(corrupt("shorter than its header"));
    }
    let (header, payload) = raw.split_at(HEADER_LEN);
    if header[0] != tag {
        return Err(corrupt(&format!("unknown format tag {}", header[0])));
    }
    if !checked && blake3::hash(payload).as_bytes() != &header[1..] {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(payload)
}

pub(super) fn decode_replay(id: EntryId, raw: &[u8], checked: bool) -> Result<Replay, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { id, reason };
    let packed = replay_payload(id, raw, checked)?;
    let replay = Replay::decode(&packed.record(id)?).map_err(corrupt)?;
    if replay.id() != id {
        return Err(corrupt(format!("replay names entry {}", replay.id())));
    }
    Ok(replay)
}

/// The cold half of an entry (its `events` and `body` empty).
pub(super) fn decode(id: EntryId, raw: &[u8], checked: bool) -> Result<Entry, StoreError> {
    let entry: Entry =
        serde_json::from_slice(payload(id, raw, FORMAT_JSON, checked)?).map_err(|e| {
            StoreError::Corrupt {
                id,
                reason: e.to_string(),
            }
        })?;
    if entry.id != id {
        return Err(StoreError::Corrupt {
            id,
            reason: format!("payload names entry {}", entry.id),
        });
    }
    Ok(entry)
}
