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
//! - It names the length and modification time of every file sled keeps. A process that wrote
//!   to the directory without knowing of this file (an older Reprise, a restore from backup)
//!   changed them, so a file that no longer matches is ignored.
//! - A blake3 digest covers the whole file: a torn or damaged file is ignored.
//!
//! Layout (little-endian): magic, the fingerprint (a count, then per file its name, length and
//! modification time), the slot count, each slot (id, key, expiry, recency, size, has-vector), and
//! the blake3 digest of everything before it.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::time::UNIX_EPOCH;

use super::ledger::Slot;
use crate::key::CacheKey;

/// The file's name in the data directory.
pub(super) const FILE: &str = "ledger";
/// Format tag: a different layout gets a different tag, and an unknown one is ignored.
const MAGIC: &[u8; 8] = b"RPRLDG01";
/// Bytes of one slot in the file.
const SLOT_BYTES: usize = 8 + 32 + 8 + 8 + 8 + 1;

/// What identifies sled's files as they were when the ledger was written: each file's name,
/// length and modification time (ns since the epoch), in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fingerprint(Vec<(String, u64, u128)>);

/// sled's files in `dir` as they are now: `conf`, `db`, its snapshots (`snap.*`) and the files
/// under `blobs/`. Reprise's own files beside them (the index dump, this file) are not sled's.
pub(super) fn fingerprint(dir: &Path) -> io::Result<Fingerprint> {
    let mut files = Vec::new();
    let mut add = |path: &Path, name: String| -> io::Result<()> {
        let meta = fs::metadata(path)?;
        let mtime = meta
            .modified()?
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        files.push((name, meta.len(), mtime));
        Ok(())
    };
    for item in fs::read_dir(dir)? {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name == "conf" || name == "db" || name.starts_with("snap.") {
            add(&item.path(), name)?;
        }
    }
    if let Ok(blobs) = fs::read_dir(dir.join("blobs")) {
        for item in blobs {
            let item = item?;
            let name = format!("blobs/{}", item.file_name().to_string_lossy());
            add(&item.path(), name)?;
        }
    }
    files.sort();
    Ok(Fingerprint(files))
}

/// Writes the ledger's `slots` with the `fingerprint` of sled's files (taken after the final
/// flush) as `dir/ledger`: a temporary file, synced, renamed over, and the directory synced.
pub(super) fn write(dir: &Path, fingerprint: &Fingerprint, slots: &[Slot]) -> io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let file = File::create(&tmp)?;
    let mut out = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        hasher: blake3::Hasher::new(),
    };
    out.write_all(MAGIC)?;
    out.write_all(&(fingerprint.0.len() as u64).to_le_bytes())?;
    for (name, len, mtime) in &fingerprint.0 {
        out.write_all(&(name.len() as u64).to_le_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&mtime.to_le_bytes())?;
    }
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

/// Takes `dir/ledger` away and returns what it held, when it is whole: its fingerprint and slots.
/// `Ok(None)` when there is none or it is torn, damaged or of another format; `Err` only when the
/// file could not be removed (then it must not be used, and the store must not open: a later
/// open would trust it).
pub(super) fn take(dir: &Path) -> io::Result<Option<(Fingerprint, Vec<Slot>)>> {
    let bytes = match fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            remove(dir)?;
            return Ok(None);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the ledger file could not be read; scanning the store");
            remove(dir)?;
            return Ok(None);
        }
    };
    remove(dir)?;
    let parsed = parse(&bytes);
    if parsed.is_none() {
        tracing::warn!("the ledger file is damaged or of another version; scanning the store");
    }
    Ok(parsed)
}

fn parse(bytes: &[u8]) -> Option<(Fingerprint, Vec<Slot>)> {
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
    let files = u64_of(&mut r)?;
    let mut fingerprint = Vec::new();
    for _ in 0..files {
        let len = usize::try_from(u64_of(&mut r)?).ok()?;
        let name = String::from_utf8(r.get(..len)?.to_vec()).ok()?;
        r = &r[len..];
        let size = u64_of(&mut r)?;
        let mut mtime = [0u8; 16];
        r.read_exact(&mut mtime).ok()?;
        fingerprint.push((name, size, u128::from_le_bytes(mtime)));
    }
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
    Some((Fingerprint(fingerprint), slots))
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
        fs::write(dir.path().join("db"), b"sled").expect("db");
        let print = fingerprint(dir.path()).expect("fingerprint");
        assert_eq!(print.0.len(), 1, "{print:?}");
        write(dir.path(), &print, &slots()).expect("write");
        let (read, back) = take(dir.path()).expect("take").expect("whole");
        assert_eq!(read, print);
        assert!(same(&back, &slots()));
        assert!(
            take(dir.path()).expect("take").is_none(),
            "taken once: a second open scans"
        );
    }

    #[test]
    fn a_damaged_or_torn_ledger_is_ignored_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let print = fingerprint(dir.path()).expect("fingerprint");
        for damage in [
            |b: &mut Vec<u8>| b[20] ^= 1,
            |b: &mut Vec<u8>| b.truncate(b.len() - 1),
            |b: &mut Vec<u8>| b.clear(),
        ] {
            write(dir.path(), &print, &slots()).expect("write");
            let mut bytes = fs::read(dir.path().join(FILE)).expect("read");
            damage(&mut bytes);
            fs::write(dir.path().join(FILE), &bytes).expect("damage");
            assert!(take(dir.path()).expect("take").is_none());
            assert!(!dir.path().join(FILE).exists(), "removed");
        }
    }

    #[test]
    fn the_fingerprint_changes_when_sleds_files_do_and_only_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join("db"), b"sled").expect("db");
        fs::write(dir.path().join("conf"), b"conf").expect("conf");
        let before = fingerprint(dir.path()).expect("fingerprint");
        // Reprise's own files are not sled's.
        fs::create_dir(dir.path().join("index")).expect("index");
        fs::write(dir.path().join("embedding-model"), b"m").expect("model record");
        assert_eq!(fingerprint(dir.path()).expect("fingerprint"), before);
        // A write by anyone else: another length.
        fs::write(dir.path().join("db"), b"sled, written again").expect("db");
        assert_ne!(fingerprint(dir.path()).expect("fingerprint"), before);
    }
}
