//! How the shared store reaches Redis: one server, a Redis Cluster, or the master a set of Sentinels
//! names, all from one `--redis-url`, behind one connection type that the store and its change feed
//! use alike. It knows nothing of entries; what it must guarantee is the caller's: on a cluster a
//! pipeline or `MULTI` goes whole to the node of its first key, so every one sent through a [`Conn`]
//! must touch one hash slot (see `redis.rs` for how the store keeps to that).
//!
//! URL forms (the credentials, if any, once for all nodes):
//! - `redis://[user:password@]host:port[/db]`, `rediss://` (TLS): one server;
//! - `redis+cluster://[user:password@]host:port[,host:port...]`, `rediss+cluster://`: seed nodes of
//!   a cluster (any reachable one gives the slot map);
//! - `redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/<db>]`,
//!   `rediss+sentinel://`: Sentinels, asked for the master of that name; the credentials are the
//!   master's (Sentinels are asked without any). After a connection error the next connect asks the
//!   Sentinels again, so a failover is followed.

use std::sync::Mutex;
use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterConnection};
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{
    Client, Cmd, Connection, ConnectionLike, ErrorKind, IntoConnectionInfo, RedisError,
    RedisResult, TlsMode, Value,
};

/// Attempts per cluster command beyond the first (a `MOVED` after a resharding needs one; the
/// crate's default of 16 with backoff would hold a request for seconds on a dead node).
const CLUSTER_RETRIES: u32 = 2;
/// Waits between those attempts, in ms.
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (5, 50);

/// Where `--redis-url` points, parsed; the URL strings it keeps are for the redis crate's own parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Single(String),
    /// One URL per seed node (each with the credentials).
    Cluster(Vec<String>),
    Sentinel {
        /// One URL per Sentinel (no credentials).
        sentinels: Vec<String>,
        master: String,
        /// A URL whose credentials, database and TLS are the master's (its host is a placeholder).
        node: String,
    },
}

impl Target {
    /// Parses `url`; the message of an error never repeats the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<Self, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(SCHEMES.into());
        };
        let (tls, form) = match scheme {
            "redis" | "rediss" => {
                parse_node(url)?;
                return Ok(Target::Single(url.to_owned()));
            }
            "redis+cluster" => ("redis", Form::Cluster),
            "rediss+cluster" => ("rediss", Form::Cluster),
            "redis+sentinel" => ("redis", Form::Sentinel),
            "rediss+sentinel" => ("rediss", Form::Sentinel),
            _ => return Err(SCHEMES.into()),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
            None => (String::new(), authority),
        };
        let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err("an empty host in the host:port list".into());
        }
        match form {
            Form::Cluster => {
                if !path.trim_end_matches('/').is_empty() {
                    return Err(
                        "a cluster URL takes no path (a cluster has database 0 only)".into(),
                    );
                }
                let nodes: Vec<String> = hosts
                    .iter()
                    .map(|h| format!("{tls}://{credentials}{h}"))
                    .collect();
                for node in &nodes {
                    parse_node(node)?;
                }
                Ok(Target::Cluster(nodes))
            }
            Form::Sentinel => {
                let mut parts = path.trim_end_matches('/').splitn(2, '/');
                let master = parts.next().unwrap_or_default();
                if master.is_empty() {
                    return Err("a sentinel URL needs the master's name: .../<master-name>".into());
                }
                let db = parts.next().unwrap_or("0");
                if db.parse::<i64>().is_err() {
                    return Err("the database after the master's name must be a number".into());
                }
                let sentinels: Vec<String> = hosts.iter().map(|h| format!("{tls}://{h}")).collect();
                for sentinel in &sentinels {
                    parse_node(sentinel)?;
                }
                let node = format!("{tls}://{credentials}master.invalid/{db}");
                parse_node(&node)?;
                Ok(Target::Sentinel {
                    sentinels,
                    master: master.to_owned(),
                    node,
                })
            }
        }
    }
}

enum Form {
    Cluster,
    Sentinel,
}

const SCHEMES: &str = "scheme must be redis://, rediss://, redis+cluster://, rediss+cluster://, \
                       redis+sentinel:// or rediss+sentinel://";

/// The redis crate's reading of one node's URL, its error without the URL.
fn parse_node(url: &str) -> Result<::redis::ConnectionInfo, String> {
    url.into_connection_info().map_err(|e| {
        format!(
            "{} ({})",
            e.category(),
            e.detail().unwrap_or("unparsable host, port or credentials")
        )
    })
}

/// Timeouts of the connections one user opens.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Duration,
    pub write: Duration,
}

/// Opens connections to the target of a `--redis-url`.
#[allow(
    clippy::large_enum_variant,
    reason = "one per store, built once and shared behind an Arc"
)]
pub enum Connector {
    Single(Client),
    /// Seed nodes: a client is built per connect, with that connect's timeouts.
    Cluster(Vec<::redis::ConnectionInfo>),
    Sentinel(Box<Sentinels>),
}

/// The Sentinels of a `redis+sentinel://` URL and what they said last.
pub struct Sentinels {
    client: Mutex<SentinelClient>,
    /// The master the Sentinels named last, until a connection to it fails.
    master: Mutex<Option<Client>>,
}

impl Connector {
    /// Whether keys live in several slots of several nodes (a script may touch only its own).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Connector::Cluster(_))
    }

    pub fn open(url: &str) -> Result<Self, RedisError> {
        let invalid = |reason: String| {
            RedisError::from((ErrorKind::InvalidClientConfig, "invalid redis_url", reason))
        };
        match Target::parse(url).map_err(invalid)? {
            Target::Single(url) => Ok(Connector::Single(Client::open(url)?)),
            Target::Cluster(nodes) => {
                let nodes = nodes
                    .iter()
                    .map(|n| n.as_str().into_connection_info())
                    .collect::<RedisResult<Vec<_>>>()?;
                // Checks what it can without connecting (same credentials and TLS on every seed).
                ClusterClient::new(nodes.clone())?;
                Ok(Connector::Cluster(nodes))
            }
            Target::Sentinel {
                sentinels,
                master,
                node,
            } => {
                let tls = node.starts_with("rediss:");
                let node = node.as_str().into_connection_info()?;
                let mut info = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(node.redis_settings().clone());
                if tls {
                    info = info.set_tls_mode(TlsMode::Secure);
                }
                let client = SentinelClient::build(
                    sentinels,
                    master,
                    Some(info),
                    SentinelServerType::Master,
                )?;
                Ok(Connector::Sentinel(Box::new(Sentinels {
                    client: Mutex::new(client),
                    master: Mutex::new(None),
                })))
            }
        }
    }

    /// A new connection with `timeouts`.
    pub fn connect(&self, timeouts: Timeouts) -> RedisResult<Conn> {
        match self {
            Connector::Single(client) => single(client, timeouts),
            Connector::Cluster(nodes) => {
                let (min_wait, max_wait) = CLUSTER_RETRY_WAIT_MS;
                let c = ClusterClient::builder(nodes.clone())
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.read)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(min_wait)
                    .max_retry_wait(max_wait)
                    .build()?
                    .get_connection()?;
                c.set_read_timeout(Some(timeouts.read))?;
                c.set_write_timeout(Some(timeouts.write))?;
                Ok(Conn::Cluster(Box::new(c)))
            }
            Connector::Sentinel(sentinels) => {
                let master = &sentinels.master;
                let known = master.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let client = match known {
                    Some(client) => client,
                    None => {
                        // Asks the Sentinels (which check the master they name says it is one).
                        let client = sentinels
                            .client
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_client()?;
                        *master.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
                        client
                    }
                };
                single(&client, timeouts).inspect_err(|_| self.forget())
            }
        }
    }

    /// After a failure: a Sentinel target asks the Sentinels again at the next connect (the master
    /// may have failed over; a demoted one answers writes with `READONLY`).
    pub fn forget(&self) {
        if let Connector::Sentinel(sentinels) = self {
            *sentinels.master.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

fn single(client: &Client, timeouts: Timeouts) -> RedisResult<Conn> {
    let c = client.get_connection_with_timeout(timeouts.connect)?;
    c.set_read_timeout(Some(timeouts.read))?;
    c.set_write_timeout(Some(timeouts.write))?;
    Ok(Conn::Single(c))
}

/// A connection to one server (a single one or a Sentinel's master) or to a cluster.
pub enum Conn {
    Single(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    /// Changes the read timeout (a blocking `XREAD` needs longer than its block).
    pub fn set_read_timeout(&self, timeout: Duration) -> RedisResult<()> {
        match self {
            Conn::Single(c) => c.set_read_timeout(Some(timeout)),
            Conn::Cluster(c) => c.set_read_timeout(Some(timeout)),
        }
    }
}

impl Conn {
    /// Runs `cmds` in one round trip per node, not atomically, whatever slots they touch (a
    /// pipeline on one server; on a cluster, split by slot): batches of independent per-entry work.
    pub fn batch(&mut self, cmds: Vec<Cmd>) -> RedisResult<Vec<Value>> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Conn::Single(c) => {
                let mut pipe = ::redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query(c)
            }
            Conn::Cluster(c) => {
                let mut pipe = ::redis::cluster::cluster_pipe();
                for cmd in cmds {
                    pipe.add_command(cmd);
                }
                pipe.query(c)
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => c.req_command(cmd),
            Conn::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }

    /// True on a cluster too, where the crate says false because a pipeline goes whole to the node
    /// of its first key: every pipeline the store sends touches one slot (see the module doc), and
    /// the node answers `CROSSSLOT` to one that does not, rather than half-applying it.
    fn supports_pipelining(&self) -> bool {
        true
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Single(c) => c.check_connection(),
            Conn::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Single(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_url_form_parses_into_its_target() {
        assert_eq!(
            Target::parse("redis://:pw@127.0.0.1:6379/2"),
            Ok(Target::Single("redis://:pw@127.0.0.1:6379/2".into()))
        );
        assert_eq!(
            Target::parse("rediss+cluster://u:p%40ss@10.0.0.1:7000, 10.0.0.2:7001"),
            Ok(Target::Cluster(vec![
                "rediss://u:p%40ss@10.0.0.1:7000".into(),
                "rediss://u:p%40ss@10.0.0.2:7001".into()
            ]))
        );
        assert_eq!(
            Target::parse("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/3"),
            Ok(Target::Sentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26380".into()],
                master: "mymaster".into(),
                node: "redis://:pw@master.invalid/3".into(),
            })
        );
        let Ok(Target::Sentinel { node, .. }) = Target::parse("rediss+sentinel://s1:26379/m")
        else {
            panic!("a sentinel URL without credentials or database");
        };
        assert_eq!(node, "rediss://master.invalid/0");
        // Every form opens a connector without connecting.
        for url in [
            "redis://127.0.0.1:1",
            "redis+cluster://127.0.0.1:1,127.0.0.1:2",
            "redis+sentinel://127.0.0.1:1/m",
        ] {
            assert!(Connector::open(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn malformed_urls_are_refused_without_repeating_them() {
        for (url, why) in [
            ("http://h:1", "scheme"),
            ("h:6379", "scheme"),
            ("redis+cluster://:secret@h:1,,h:2", "empty host"),
            ("redis+cluster://:secret@h:1/0", "no path"),
            ("redis+cluster://:secret@h:notaport", "invalid"),
            ("redis+sentinel://:secret@s:26379", "master's name"),
            ("redis+sentinel://:secret@s:26379/", "master's name"),
            ("redis+sentinel://:secret@s:26379/m/x", "number"),
        ] {
            let err = Target::parse(url).expect_err(url);
            assert!(err.to_lowercase().contains(why), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
