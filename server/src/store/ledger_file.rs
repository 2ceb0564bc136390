//! The sled store's ledger written at a clean close (`<data dir>/ledger`) and read at the next
//! open instead of scanning every entry: at a million entries that scan reads the whole database
//! (each cold half and each answer, several GB) and took most of a restart.
//!
//! The file is only a shortcut, never the truth: it is trusted only when nothing can have written
//! to sled since it was made.
//! - It is written after the final flush, under the ledger lock, and the store then counts as
//!   closed: its next write (a late one in this process) deletes the file first.
//! - The next open takes the file away before it opens sled, so a process that crashes after
//!   the open leaves none behind (a crash always means a full scan, which also cleans up what a
//!   crash can leave).
//! - It carries a random token that the close also writes into sled (`meta`), so a file belongs to
//!   the database it was written with (not to a restored or copied one). The open removes it there.
//! - A process that wrote to the directory without knowing of this file (an older Reprise) gave
//!   every entry it stored a new id, above all others: the open compares the largest id in the
//!   `entries` tree with the largest in the file. What such a process can do without a new id
//!   (remove entries, record hits) leaves the ledger naming entries that are gone, which read as
//!   absent and leave it when eviction picks them. sled's files themselves are no guide: sled
//!   rewrites them on its own (it moves pages out of old segments) after the last flush.
//! - A blake3 digest covers the whole file: a torn or damaged file is ignored.
//!
//! Layout (little-endian): magic, the token, the slot count, each slot (id, key, expiry, recency,
//! size, has-vector), and the blake3 digest of everything before it.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::time::UNIX_EPOCH;

use super::ledger::Slot;
use crate::key::CacheKey;

/// The file's name in the data directory.
pub(super) const FILE: &str = "ledger";
/// Format tag: a different layout gets a different tag, and an unknown one is ignored.
const MAGIC: &[u8; 8] = b"RPRLDG02";
/// Bytes of one slot in the file.
const SLOT_BYTES: usize = 8 + 32 + 8 + 8 + 8 + 1;

/// The random token that ties a file to the database whose `meta` holds it.
pub(super) type Token = [u8; 16];

/// A token for a close: unique enough (time, process, and how much is being written).
pub(super) fn new_token(slots: usize) -> Token {
    let nanos = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hasher = blake3::Hasher::new();
    hasher.update(&nanos.to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&(slots as u64).to_le_bytes());
    let mut token = [0u8; 16];
    token.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    token
}

/// Writes the ledger's `slots` with `token` as `dir/ledger`: a temporary file, synced, renamed
/// over, and the directory synced.
pub(super) fn write(dir: &Path, token: &Token, slots: &[Slot]) -> io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let file = File::create(&tmp)?;
    let mut out = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        hasher: blake3::Hasher::new(),
    };
    out.write_all(MAGIC)?;
    out.write_all(token)?;
    out.write_all(&(slots.len() as u64).to_le_bytes())?;
    for slot in slots {
        let Slot {
            id,
            key,
            expires_at_ms,
            recency_ms,
            size,
            vector,
        } = *slot;
        out.write_all(&id.to_le_bytes())?;
        out.write_all(&key.0)?;
        out.write_all(&expires_at_ms.to_le_bytes())?;
        out.write_all(&recency_ms.to_le_bytes())?;
        out.write_all(&size.to_le_bytes())?;
        out.write_all(&[u8::from(vector)])?;
    }
    let digest = out.hasher.finalize();
    let mut inner = out.inner;
    inner.write_all(digest.as_bytes())?;
    let file = inner.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    fs::rename(&tmp, dir.join(FILE))?;
    File::open(dir)?.sync_all()
}

/// Removes `dir/ledger` (and a temporary one), syncing the directory so the removal outlives a crash.
pub(super) fn remove(dir: &Path) -> io::Result<()> {
    let _ = fs::remove_file(dir.join(format!("{FILE}.tmp")));
    match fs::remove_file(dir.join(FILE)) {
        Ok(()) => File::open(dir)?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes `dir/ledger` away and returns what it held, when it is whole: its token and slots.
/// `Ok(None)` when there is none or it is torn, damaged or of another format; `Err` only when the
/// file could not be removed (then it must not be used, and the store must not open: a later
/// open would trust it).
pub(super) fn take(dir: &Path) -> io::Result<Option<(Token, Vec<Slot>)>> {
    let read = fs::read(dir.join(FILE));
    remove(dir)?;
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            tracing::warn!(error = %e, "the ledger file could not be read; scanning the store");
            return Ok(None);
        }
    };
    let parsed = parse(&bytes);
    if parsed.is_none() {
        tracing::warn!("the ledger file is damaged or of another version; scanning the store");
    }
    Ok(parsed)
}

fn parse(bytes: &[u8]) -> Option<(Token, Vec<Slot>)> {
    let body = bytes.get(..bytes.len().checked_sub(32)?)?;
    if blake3::hash(body).as_bytes()[..] != bytes[body.len()..] {
        return None;
    }
    let mut r = body;
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).ok()?;
    if &magic != MAGIC {
        return None;
    }
    let mut token = [0u8; 16];
    r.read_exact(&mut token).ok()?;
    let count = usize::try_from(u64_of(&mut r)?).ok()?;
    if r.len() != count.checked_mul(SLOT_BYTES)? {
        return None;
    }
    let slots = r
        .chunks_exact(SLOT_BYTES)
        .map(|s| {
            let u64_at = |at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
            Slot {
                id: u64_at(0),
                key: CacheKey(s[8..40].try_into().expect("32 bytes")),
                expires_at_ms: u64_at(40),
                recency_ms: u64_at(48),
                size: u64_at(56),
                vector: s[64] != 0,
            }
        })
        .collect();
    Some((token, slots))
}

fn u64_of(r: &mut &[u8]) -> Option<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Writes through to `inner` while hashing what it writes (the digest at the file's end).
struct HashingWriter<W> {
    inner: W,
    hasher: blake3::Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Vec<Slot> {
        (1..=3)
            .map(|n| Slot {
                id: n,
                key: CacheKey([n as u8; 32]),
                expires_at_ms: 1_000 + n,
                recency_ms: 500 + n,
                size: 100 * n,
                vector: n % 2 == 1,
            })
            .collect()
    }

    fn same(a: &[Slot], b: &[Slot]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                (x.id, x.key, x.expires_at_ms, x.recency_ms, x.size, x.vector)
                    == (y.id, y.key, y.expires_at_ms, y.recency_ms, y.size, y.vector)
            })
    }

    #[test]
    fn a_written_ledger_is_taken_back_whole_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = new_token(3);
        assert_ne!(token, new_token(3), "another close, another token");
        write(dir.path(), &token, &slots()).expect("write");
        let (read, back) = take(dir.path()).expect("take").expect("whole");
        assert_eq!(read, token);
        assert!(same(&back, &slots()));
        assert!(
            take(dir.path()).expect("take").is_none(),
            "taken once: a second open scans"
        );
    }

    #[test]
    fn a_damaged_or_torn_ledger_is_ignored_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        for damage in [
            |b: &mut Vec<u8>| b[20] ^= 1,
            |b: &mut Vec<u8>| b.truncate(b.len() - 1),
            |b: &mut Vec<u8>| b.clear(),
        ] {
            write(dir.path(), &new_token(3), &slots()).expect("write");
            let mut bytes = fs::read(dir.path().join(FILE)).expect("read");
            damage(&mut bytes);
            fs::write(dir.path().join(FILE), &bytes).expect("damage");
            assert!(take(dir.path()).expect("take").is_none());
            assert!(!dir.path().join(FILE).exists(), "removed");
        }
    }
}
