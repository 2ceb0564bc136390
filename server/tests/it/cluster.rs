//! The shared store on a Redis Cluster (`redis+cluster://`) and behind Sentinel
//! (`redis+sentinel://`), against real servers on loopback ports: a 3-master cluster built by the
//! test, and a master (with a replica, for a failover) watched by one Sentinel. The same store
//! contract as on one server, entries spread over every node, gateways serving each other's
//! answers and a flush through one of them; behind Sentinel, a failover followed by the store.
//! Uses the same server binary as `redis.rs` (`REPRISE_TEST_REDIS_BINARY` or Debian's
//! redis-server): missing, these tests skip locally and fail in CI.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reprise_server::store::{Change, Feed, RedisStore, Store, Upkeep};

use crate::common::*;
use crate::redis::{ask, entry, flush, on_redis_url, redis_server_binary, round_trips};

/// A free loopback port.
/// `N` distinct free ports: every listener is held until all are chosen, so the kernel cannot
/// hand the same port out twice (a node and its bus on one port never start).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("free port").port())
}

/// A blocking connection to the server on `port` alone (no cluster routing).
fn direct(port: u16) -> ::redis::Connection {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    client
        .get_connection_with_timeout(Duration::from_secs(1))
        .expect("connect")
}

/// Waits until `ready` holds on the server on `port` (polled every 20 ms, for up to 20 s).
fn wait_until(port: u16, what: &str, ready: impl Fn(&mut ::redis::Connection) -> bool) {
    for _ in 0..1000 {
        let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
        if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(200)) {
            if ready(&mut c) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} (port {port}) never got ready");
}

/// Server processes, killed on drop.
struct Processes(Vec<Child>);

impl Processes {
    fn spawn(&mut self, binary: &Path, args: &[String]) {
        let child = Command::new(binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server");
        self.0.push(child);
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The arguments of a server on `port` keeping nothing on disk (its files in `dir`).
fn server_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["--bind", "127.0.0.1", "--port"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.push(port.to_string());
    args.extend(["--save", "", "--appendonly", "no", "--dir"].map(str::to_owned));
    args.push(dir.display().to_string());
    args
}

/// Three masters on loopback ports sharing the 16384 slots, no replicas.
struct Cluster {
    ports: Vec<u16>,
    _processes: Processes,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Option<Self> {
        let binary = redis_server_binary()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut processes = Processes(Vec::new());
        // The bus ports explicitly: the default (port + 10000) may be past 65535 or taken.
        let [a, b, c, bus_a, bus_b, bus_c] = free_ports::<6>();
        let ports = vec![a, b, c];
        let bus = [bus_a, bus_b, bus_c];
        for (port, bus) in ports.iter().zip(&bus) {
            let mut args = server_args(*port, dir.path());
            args.extend([
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-port".into(),
                bus.to_string(),
                "--cluster-config-file".into(),
                dir.path()
                    .join(format!("nodes-{port}.conf"))
                    .display()
                    .to_string(),
            ]);
            processes.spawn(&binary, &args);
        }
        for port in &ports {
            wait_until(*port, "a cluster node", |c| {
                ::redis::cmd("PING").query::<String>(c).is_ok()
            });
        }
        // What `redis-cli --cluster create` does: a third of the slots each, distinct config
        // epochs, and every node introduced to the first.
        let per_node = 16384 / ports.len() as u16;
        for (i, port) in ports.iter().enumerate() {
            let first = i as u16 * per_node;
            let last = if i + 1 == ports.len() {
                16383
            } else {
                first + per_node - 1
            };
            let mut c = direct(*port);
            ::redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query::<()>(&mut c)
                .expect("ADDSLOTSRANGE");
            ::redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query::<()>(&mut c)
                .expect("SET-CONFIG-EPOCH");
        }
        let mut first = direct(ports[0]);
        for (port, bus) in ports.iter().zip(&bus).skip(1) {
            ::redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(*port)
                .arg(*bus)
                .query::<()>(&mut first)
                .expect("MEET");
        }
        for port in &ports {
            wait_until(*port, "the cluster", |c| {
                let info: String = ::redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
        }
        Some(Self {
            ports,
            _processes: processes,
            _dir: dir,
        })
    }

    /// Two of the three nodes as seeds: the client learns the third from them.
    fn url(&self) -> String {
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            self.ports[0], self.ports[1]
        )
    }

    /// How many keys each node holds.
    fn keys_per_node(&self) -> Vec<u64> {
        self.ports
            .iter()
            .map(|p| {
                ::redis::cmd("DBSIZE")
                    .query(&mut direct(*p))
                    .expect("DBSIZE")
            })
            .collect()
    }
}

#[test]
fn the_store_keeps_its_contract_on_a_redis_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let store = RedisStore::new(&cluster.url()).expect("url");
    round_trips(&store);

    // Entries land on every node (an entry's keys share the slot of its id's hash tag), and
    // listing, counting and clearing still see them all (no SCAN, which sees one node).
    let hour = 3_600_000;
    let before = store.ids().expect("ids").len();
    for n in 100..130 {
        store.put(entry(n, hour)).expect("put");
    }
    let spread = cluster.keys_per_node();
    assert!(spread.iter().all(|n| *n > 0), "keys per node: {spread:?}");
    assert_eq!(store.ids().expect("ids").len(), before + 30);
    assert_eq!(store.list(None, 1000).expect("list").len(), before + 30);
    store.refresh_counts().expect("count");
    assert_eq!(store.len(), before + 30);
    let evicted = store
        .sweep(reprise_server::timing::unix_ms(), before + 20, u64::MAX)
        .expect("sweep")
        .1;
    assert_eq!(evicted, 10);
    assert_eq!(store.clear().expect("clear"), before + 20);
    assert!(store.ids().expect("ids").is_empty());
    // Only the id counter, the feed and the registry's hash (gone once empty) remain anywhere.
    let left: u64 = cluster.keys_per_node().iter().sum();
    assert!(left <= 2, "keys left after a clear: {left}");
}

#[test]
fn the_change_feed_and_its_histories_work_on_a_redis_cluster() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let a = RedisStore::named(&cluster.url(), "replica-a").expect("url");
    let b = RedisStore::named(&cluster.url(), "replica-b").expect("url");
    let from = b.feed().tail().expect("tail");
    let id = a.put(entry(1, 3_600_000)).expect("put");
    let config = serde_json::json!({"similarity_threshold": 0.9});
    a.feed()
        .publish(&Change::Config(config.clone()))
        .expect("publish");
    assert!(a.delete(id).expect("delete"));
    // B reads A's changes (a blocking XREAD on the stream's node), in order.
    let batch = b
        .feed()
        .read(from, Duration::from_millis(500))
        .expect("read");
    assert_eq!(batch.changes.len(), 3, "{:?}", batch.changes);
    assert!(
        matches!(batch.changes[0], Change::Put { id: put, .. } if put == id),
        "{:?}",
        batch.changes
    );
    assert_eq!(batch.changes[1], Change::Config(config.clone()));
    assert_eq!(batch.changes[2], Change::Delete(id));
    // The histories are two lists in two slots: read one by one, not in one pipeline.
    let verdict = serde_json::json!({"verdict": "wrong"});
    b.feed()
        .publish(&Change::Verdict(verdict.clone()))
        .expect("publish");
    assert_eq!(
        a.feed().history().expect("history"),
        (vec![config], vec![verdict])
    );
    // Notes of many requests (keys on every node) in one batch split by slot.
    let notes: Vec<(String, Vec<u8>)> = (0..20)
        .map(|n| (format!("req_{n}"), format!("note {n}").into_bytes()))
        .collect();
    a.feed().remember(&notes).expect("remember");
    for (request_id, note) in &notes {
        assert_eq!(
            b.feed().recall(request_id).expect("recall").as_ref(),
            Some(note)
        );
    }
}

#[tokio::test]
async fn two_gateways_on_a_redis_cluster_serve_each_others_answers_and_a_flush() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis_url(cluster.url(), config_for(sim.base_url()))).await;
    let b = start(on_redis_url(cluster.url(), config_for(sim.base_url()))).await;
    let mut answers = Vec::new();
    for n in 0..6 {
        let question = format!("question number {n} for the cluster");
        let miss = ask(&a, &question).await;
        assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
        answers.push((question, content(miss, false).await));
    }
    wait_for_entries(&a, 6).await;
    for (question, answer) in &answers {
        let hit = ask(&b, question).await;
        assert_eq!(header(&hit, "x-reprise-cache").as_deref(), Some("hit"));
        assert_eq!(&content(hit, false).await, answer);
    }
    assert_eq!(upstream_calls(&sim), 6, "one upstream call per question");
    // And the other way round.
    let miss = ask(&b, "asked through B first").await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    wait_for_entries(&b, 7).await;
    let hit = ask(&a, "asked through B first").await;
    assert_eq!(header(&hit, "x-reprise-cache").as_deref(), Some("hit"));

    // A flush through A empties the shared store on every node: B misses at once.
    flush(&a).await;
    for (question, _) in &answers {
        let after = ask(&b, question).await;
        assert_eq!(header(&after, "x-reprise-cache").as_deref(), Some("miss"));
    }
}

/// A master and its replica, and one Sentinel watching the master as `reprise-master`.
struct Sentinel {
    master: u16,
    replica: u16,
    sentinel: u16,
    _processes: Processes,
    _dir: tempfile::TempDir,
}

const MASTER_NAME: &str = "reprise-master";

impl Sentinel {
    fn start() -> Option<Self> {
        let binary = redis_server_binary()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut processes = Processes(Vec::new());
        let [master, replica, sentinel] = free_ports::<3>();
        let own_dir = |name: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).expect("mkdir");
            path
        };
        processes.spawn(&binary, &server_args(master, &own_dir("master")));
        let mut args = server_args(replica, &own_dir("replica"));
        args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        processes.spawn(&binary, &args);
        wait_until(master, "the master's replica", |c| {
            let info: String = ::redis::cmd("INFO")
                .arg("replication")
                .query(c)
                .unwrap_or_default();
            info.contains("connected_slaves:1") && info.contains("state=online")
        });
        // Sentinel rewrites its config file: one of its own, in the test's folder.
        let conf = own_dir("sentinel").join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n",
                own_dir("sentinel").display()
            ),
        )
        .expect("write sentinel.conf");
        processes.spawn(&binary, &[conf.display().to_string(), "--sentinel".into()]);
        // Ready once it has seen the replica (a failover needs one to promote).
        wait_until(sentinel, "the sentinel", |c| {
            ::redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(MASTER_NAME)
                .query::<Vec<::redis::Value>>(c)
                .is_ok_and(|r| r.len() == 1)
        });
        Some(Self {
            master,
            replica,
            sentinel,
            _processes: processes,
            _dir: dir,
        })
    }

    fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{MASTER_NAME}", self.sentinel)
    }

    /// The master's port as the Sentinel names it.
    fn named_master(&self) -> Option<u16> {
        let (_, port): (String, u16) = ::redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut direct(self.sentinel))
            .ok()?;
        Some(port)
    }
}

#[test]
fn the_store_keeps_its_contract_behind_sentinel_and_follows_a_failover() {
    let Some(sentinel) = Sentinel::start() else {
        return;
    };
    let store = RedisStore::new(&sentinel.url()).expect("url");
    round_trips(&store);
    // Written to the master the Sentinel names.
    let id = store.put(entry(200, 3_600_000)).expect("put");
    let on_master: u64 = ::redis::cmd("DBSIZE")
        .query(&mut direct(sentinel.master))
        .expect("DBSIZE");
    assert!(on_master > 0);

    // The Sentinel promotes the replica; the old master becomes its replica (read-only). The
    // store's next calls fail (refused writes), then it asks the Sentinel again and carries on
    // on the new master, with what was written before the failover.
    // A failover keeps what reached the replica: the test waits for all of it.
    let ids = |port: u16| {
        ::redis::cmd("GET")
            .arg("reprise:ids")
            .query::<Option<u64>>(&mut direct(port))
            .ok()
            .flatten()
    };
    wait_until(sentinel.replica, "the replica's copy", |_| {
        ids(sentinel.replica) == Some(id.0)
    });
    // Refused (`NOGOODSLAVE`) until the Sentinel has talked to the replica itself: asked again.
    wait_until(sentinel.sentinel, "a failover", |c| {
        ::redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query::<()>(c)
            .is_ok()
    });
    let mut promoted = false;
    for _ in 0..1000 {
        if sentinel.named_master() == Some(sentinel.replica) {
            promoted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(promoted, "the sentinel never promoted the replica");
    // Until the Sentinel turns the old master into a replica it still takes writes (and loses
    // them): a real client cannot tell either; the test waits for that to be over.
    wait_until(sentinel.master, "the old master's demotion", |c| {
        let info: String = ::redis::cmd("INFO")
            .arg("replication")
            .query(c)
            .unwrap_or_default();
        info.contains("role:slave")
    });
    // No reset between attempts: a refused write alone makes the store ask the Sentinel again.
    let mut written = None;
    let mut refused = 0;
    for _ in 0..500 {
        match store.put(entry(201, 3_600_000)) {
            Ok(id) => {
                written = Some(id);
                break;
            }
            Err(_) => refused += 1,
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(refused >= 1, "the old master never refused a write");
    let after = written.expect("the store never wrote to the new master");
    assert!(after > id, "the id counter moved over with the data");
    assert!(store.get(id).expect("get").is_some());
    let on_new_master: Option<Vec<u8>> = ::redis::cmd("GET")
        .arg(format!("reprise:{{{}}}:replay", after.0))
        .query(&mut direct(sentinel.replica))
        .expect("GET");
    assert!(on_new_master.is_some(), "written to the promoted replica");
}

#[tokio::test]
async fn a_gateway_behind_sentinel_serves_another_replicas_exact_hit() {
    let Some(sentinel) = Sentinel::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis_url(sentinel.url(), config_for(sim.base_url()))).await;
    let b = start(on_redis_url(sentinel.url(), config_for(sim.base_url()))).await;
    let miss = ask(&a, "what is the capital of portugal").await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let answer = content(miss, false).await;
    wait_for_entries(&a, 1).await;
    let hit = ask(&b, "what is the capital of portugal").await;
    assert_eq!(header(&hit, "x-reprise-cache").as_deref(), Some("hit"));
    assert_eq!(content(hit, false).await, answer);
    assert_eq!(upstream_calls(&sim), 1);
}
