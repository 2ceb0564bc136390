//! The store contract, written once and run against every backend: `SledStore`, `RedisStore` (a
//! real `redis-server` on a loopback port, found and started as `redis.rs` does: skipped locally
//! without one, a failure in CI) and `ResilientStore` over sled. Each test reads the store through
//! the `Store` trait alone, so a backend passes only by keeping what callers rely on. It must
//! assert only what every backend keeps: what one backend does beyond the contract (sled's caps at
//! every put, Redis's expiry by the server) is tested beside that backend.

use reprise_server::entry::{Entry, EntryId, HitEvent, HitKind, Replay};
use reprise_server::store::{RedisStore, ResilientStore, SledStore, Store};
use reprise_server::timing::unix_ms;

use crate::redis::{entry, key, RedisServer};

const HOUR: u64 = 3_600_000;

/// A store under test, with what must live as long as it (its directory, its server).
struct Fixture {
    store: Box<dyn Store>,
    _dir: Option<tempfile::TempDir>,
    _server: Option<RedisServer>,
}

fn sled() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open sled");
    Some(Fixture {
        store: Box::new(store),
        _dir: Some(dir),
        _server: None,
    })
}

/// `None` (the test skips) when there is no redis-server outside CI; in CI its absence fails.
fn redis() -> Option<Fixture> {
    // One server per test: the tests run in parallel, and each clears and counts the whole store.
    let server = RedisServer::start()?;
    let store = RedisStore::new(&server.url()).expect("url");
    store.refresh_counts().expect("reachable");
    Some(Fixture {
        store: Box::new(store),
        _dir: None,
        _server: Some(server),
    })
}

fn resilient() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sled = SledStore::open(dir.path()).expect("open sled");
    Some(Fixture {
        store: Box::new(ResilientStore::new(dir.path(), sled)),
        _dir: Some(dir),
        _server: None,
    })
}

/// One test function per contract clause, run on each backend in its own module
/// (`store_contract::on_redis::same_key_replaces_the_older_entry`, ...).
macro_rules! contract {
    ($($clause:ident),* $(,)?) => {
        mod on_sled {
            $(#[test]
            fn $clause() {
                super::run(super::sled, super::$clause);
            })*
        }
        mod on_redis {
            $(#[test]
            fn $clause() {
                super::run(super::redis, super::$clause);
            })*
        }
        mod on_resilient_sled {
            $(#[test]
            fn $clause() {
                super::run(super::resilient, super::$clause);
            })*
        }
    };
}

fn run(open: fn() -> Option<Fixture>, clause: fn(&dyn Store)) {
    let Some(fixture) = open() else {
        return;
    };
    clause(fixture.store.as_ref());
}

contract!(
    put_then_every_read_returns_the_entry,
    same_key_replaces_the_older_entry,
    delete_removes_the_entry_and_its_key_row,
    touch_adds_hits_and_moves_the_last_hit_forward_only,
    set_vector_fills_a_missing_vector_once,
    list_and_list_newest_page_in_id_order,
    ids_len_and_bytes_count_what_is_stored,
    cold_reads_entries_without_their_answers_in_the_order_asked,
    sweep_removes_expired_entries,
    caps_evict_the_least_recently_used,
    clear_removes_everything_and_ids_are_never_reused,
);

fn hit(at_ms: u64) -> HitEvent {
    HitEvent {
        at_ms,
        kind: HitKind::Hit,
        similarity: None,
        request_id: format!("req_{at_ms}"),
        ttft_ms: Some(0.5),
        ttft_saved_ms: Some(100.0),
    }
}

fn ids_of(entries: &[Entry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

fn put_then_every_read_returns_the_entry(store: &dyn Store) {
    let original = entry(1, HOUR);
    let id = store.put(original.clone()).expect("put");
    // The store assigns the id; everything else reads back as written.
    let stored = Entry { id, ..original };
    assert_eq!(store.get(id).expect("get"), Some(stored.clone()));
    assert_eq!(
        store.get_by_key(&key(1)).expect("get_by_key"),
        Some(stored.clone())
    );
    let replay = Replay::of(&stored);
    assert_eq!(
        store.replay_by_key(&key(1)).expect("replay_by_key"),
        Some(replay.clone())
    );
    assert_eq!(store.replay(id).expect("replay"), Some(replay));
    assert_eq!(store.get_by_key(&key(2)).expect("other key"), None);
    assert_eq!(store.replay_by_key(&key(2)).expect("other key"), None);
    assert_eq!(store.get(EntryId(u64::MAX - 1)).expect("no such id"), None);
}

fn same_key_replaces_the_older_entry(store: &dyn Store) {
    let first = store.put(entry(1, HOUR)).expect("put");
    let second = store.put(entry(1, HOUR)).expect("put again");
    assert!(second > first, "ids only grow");
    assert_eq!(
        store.get(first).expect("old"),
        None,
        "the older entry is deleted"
    );
    assert_eq!(
        store.get_by_key(&key(1)).expect("get_by_key").map(|e| e.id),
        Some(second)
    );
    assert_eq!(
        store
            .replay_by_key(&key(1))
            .expect("replay")
            .map(|r| r.id()),
        Some(second)
    );
    assert_eq!(store.ids().expect("ids"), vec![second]);
    assert_eq!(store.len(), 1);
}

fn delete_removes_the_entry_and_its_key_row(store: &dyn Store) {
    let gone = store.put(entry(1, HOUR)).expect("put");
    let kept = store.put(entry(2, HOUR)).expect("put");
    assert!(store.delete(gone).expect("delete"));
    assert!(
        !store.delete(gone).expect("delete again"),
        "nothing left to delete"
    );
    assert_eq!(store.get(gone).expect("get"), None);
    assert_eq!(store.get_by_key(&key(1)).expect("get_by_key"), None);
    assert_eq!(store.replay_by_key(&key(1)).expect("replay_by_key"), None);
    assert_eq!(store.replay(gone).expect("replay"), None);
    assert_eq!(store.ids().expect("ids"), vec![kept]);
    assert_eq!(store.len(), 1);
    // The key is free for a new answer.
    let again = store.put(entry(1, HOUR)).expect("put");
    assert_eq!(
        store.get_by_key(&key(1)).expect("get_by_key").map(|e| e.id),
        Some(again)
    );
}

fn touch_adds_hits_and_moves_the_last_hit_forward_only(store: &dyn Store) {
    let id = store.put(entry(1, HOUR)).expect("put");
    store.touch(id, 2, &[hit(5_000)]).expect("touch");
    store.touch(id, 1, &[hit(4_000)]).expect("touch");
    // Nothing to record: nothing changes.
    store.touch(id, 0, &[]).expect("empty touch");
    let touched = store.get(id).expect("get").expect("there");
    assert_eq!(touched.hit_count, 3);
    assert_eq!(touched.last_hit_ms, 5_000, "never moved back");
    assert_eq!(touched.hit_history.len(), 2);
    assert_eq!(touched.hit_history[0].at_ms, 4_000, "history in time order");
    // A gone entry (evicted meanwhile) is not an error.
    store
        .touch(EntryId(u64::MAX - 1), 1, &[hit(6_000)])
        .expect("touch of a missing entry");
    // The replay (the answer) is untouched by the bookkeeping.
    assert_eq!(
        store.replay(id).expect("replay"),
        Some(Replay::of(&touched))
    );
}

fn set_vector_fills_a_missing_vector_once(store: &dyn Store) {
    let id = store.put(entry(1, HOUR)).expect("put");
    assert!(store.set_vector(id, &[0.5, 0.25]).expect("set_vector"));
    assert!(!store.set_vector(id, &[1.0, 0.0]).expect("set again"));
    assert_eq!(
        store.get(id).expect("get").expect("there").vector,
        Some(vec![0.5, 0.25])
    );
    assert!(!store
        .set_vector(EntryId(u64::MAX - 1), &[1.0])
        .expect("gone"));
    assert!(store.delete(id).expect("delete"));
    assert!(
        !store.set_vector(id, &[1.0]).expect("deleted"),
        "never revives a deleted entry"
    );
    assert_eq!(store.get(id).expect("get"), None);
}

fn list_and_list_newest_page_in_id_order(store: &dyn Store) {
    let ids: Vec<EntryId> = (1..=5)
        .map(|n| store.put(entry(n, HOUR)).expect("put"))
        .collect();
    let first = store.list(None, 2).expect("list");
    assert_eq!(ids_of(&first), ids[..2]);
    let next = store.list(Some(ids[1]), 2).expect("list");
    assert_eq!(ids_of(&next), ids[2..4]);
    let last = store.list(Some(ids[3]), 2).expect("list");
    assert_eq!(ids_of(&last), ids[4..]);
    assert!(store.list(Some(ids[4]), 2).expect("list").is_empty());
    assert!(store.list(None, 0).expect("list").is_empty());

    let newest = store.list_newest(None, 2).expect("newest");
    assert_eq!(ids_of(&newest), vec![ids[4], ids[3]]);
    let older = store.list_newest(Some(ids[3]), 10).expect("newest");
    assert_eq!(ids_of(&older), vec![ids[2], ids[1], ids[0]]);
    // Listed entries are whole.
    assert_eq!(first[0], store.get(ids[0]).expect("get").expect("there"));
}

fn ids_len_and_bytes_count_what_is_stored(store: &dyn Store) {
    assert!(store.is_empty());
    assert_eq!(store.bytes(), 0);
    let a = store.put(entry(1, HOUR)).expect("put");
    let one = store.bytes();
    assert!(one > 0, "an entry takes bytes");
    let b = store.put(entry(2, HOUR)).expect("put");
    assert!(store.bytes() > one);
    assert_eq!(store.len(), 2);
    assert!(!store.is_empty());
    assert_eq!(store.ids().expect("ids"), vec![a, b], "in id order");
    assert!(store.delete(a).expect("delete"));
    assert_eq!(store.len(), 1);
    assert_eq!(store.ids().expect("ids"), vec![b]);
}

fn cold_reads_entries_without_their_answers_in_the_order_asked(store: &dyn Store) {
    let a = store.put(entry(1, HOUR)).expect("put");
    let mut with_vector = entry(2, HOUR);
    with_vector.vector = Some(vec![0.6, 0.8]);
    let b = store.put(with_vector).expect("put");
    let c = store.put(entry(3, HOUR)).expect("put");
    assert!(store.delete(c).expect("delete"));
    let cold = store.cold(&[b, EntryId(u64::MAX - 1), a, c]).expect("cold");
    assert_eq!(
        ids_of(&cold),
        vec![b, a],
        "in the order asked, the missing skipped"
    );
    for read in &cold {
        let whole = store.get(read.id).expect("get").expect("there");
        assert!(read.events.is_empty() && read.body.is_null(), "no answer");
        assert!(!whole.events.is_empty(), "the entry has one");
        let answerless = Entry {
            events: Vec::new(),
            body: serde_json::Value::Null,
            ..whole
        };
        assert_eq!(*read, answerless, "the rest as stored");
    }
    assert_eq!(cold[0].vector, Some(vec![0.6, 0.8]));
    assert!(store.cold(&[]).expect("none").is_empty());
}

fn sweep_removes_expired_entries(store: &dyn Store) {
    let now = unix_ms();
    let live = store.put(entry(1, HOUR)).expect("put");
    // Created a minute ago to live a second: expired before it is written.
    let mut stale = entry(2, 1_000);
    stale.created_at_ms = now - 60_000;
    let stale = store.put(stale).expect("put");
    let (expired, evicted) = store.sweep(now, usize::MAX, u64::MAX).expect("sweep");
    // Sled counts what its sweep removed; Redis drops expired keys itself and reports 0.
    assert!(expired <= 1, "{expired}");
    assert_eq!(evicted, 0, "no cap exceeded");
    assert_eq!(store.get(stale).expect("get"), None);
    assert_eq!(store.get_by_key(&key(2)).expect("get_by_key"), None);
    assert_eq!(store.ids().expect("ids"), vec![live]);
    assert_eq!(store.len(), 1);
    assert!(
        store.get(live).expect("get").is_some(),
        "a live entry stays"
    );
}

fn caps_evict_the_least_recently_used(store: &dyn Store) {
    store.set_caps(2, u64::MAX).expect("caps");
    let now = unix_ms();
    let a = store.put(entry(1, HOUR)).expect("put");
    let b = store.put(entry(2, HOUR)).expect("put");
    // A hit makes the oldest entry the most recently used.
    store.touch(a, 1, &[hit(now + 60_000)]).expect("touch");
    let c = store.put(entry(3, HOUR)).expect("put");
    // A store that holds its caps at every put has evicted already; one that leaves them to the
    // sweep evicts now. Either way: at most the cap, and the least recently used went.
    let _ = store.sweep(unix_ms(), 2, u64::MAX).expect("sweep");
    assert_eq!(store.ids().expect("ids"), vec![a, c]);
    assert_eq!(store.len(), 2);
    assert_eq!(store.get(b).expect("get"), None);
    assert_eq!(store.get_by_key(&key(2)).expect("get_by_key"), None);
}

fn clear_removes_everything_and_ids_are_never_reused(store: &dyn Store) {
    assert_eq!(store.clear().expect("clear empty"), 0);
    store.put(entry(1, HOUR)).expect("put");
    let last = store.put(entry(2, HOUR)).expect("put");
    assert_eq!(store.clear().expect("clear"), 2);
    assert_eq!(store.len(), 0);
    assert_eq!(store.bytes(), 0);
    assert!(store.ids().expect("ids").is_empty());
    assert!(store.list(None, 10).expect("list").is_empty());
    assert_eq!(store.get_by_key(&key(1)).expect("get_by_key"), None);
    assert_eq!(store.replay_by_key(&key(2)).expect("replay_by_key"), None);
    assert!(store.put(entry(3, HOUR)).expect("put") > last);
    store.flush().expect("flush");
}
