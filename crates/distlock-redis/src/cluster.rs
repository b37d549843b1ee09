//! `redis+cluster://`: the same scripts on a Redis Cluster (docs/redis-cluster.md).
//!
//! Every key of one lock carries the hash tag `{NAME}`, so each lock script touches one slot:
//! redis-rs's cluster client sends it (or a pipeline of one lock's commands) to the master of
//! its first key's slot, following `MOVED` and `ASK`. What spans locks is routed here, by
//! master ([`Cluster::per_master`]): the watchdog's batched renewal, `inspect_many`, `list`'s
//! SCAN and `doctor`. One subscriber connection to any node hears every lock (classic PUBLISH
//! is broadcast).

use crate::address;
use crate::conn::Con;
use crate::error::{map, KIND};
use crate::renew::PER_SCRIPT;
use distlock_core::conn::{ConnectionString, Credentials, Host, TlsFiles};
use distlock_core::ClientOptions;
use distlock_core::{Error, Result};
use futures_util::future::{join_all, FutureExt};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The connection a call goes out on: one server, the cluster (routed by key), or one node of
/// the cluster (by address: SCAN, INFO, a batch of renewals).
#[derive(Clone)]
pub(crate) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    At(ClusterConnection, SingleNodeRoutingInfo),
}

/// A pipeline of `SCRIPT` commands only (the `SCRIPT LOAD`s of [`scripts::load`]): redis-rs
/// sends a lone `SCRIPT LOAD` to every master, but a keyless pipeline to one node at random,
/// so each is sent as a command of its own.
fn script_pipeline(pipeline: &Pipeline) -> bool {
    pipeline.cmd_iter().all(|c| {
        matches!(c.args_iter().next(), Some(redis::Arg::Simple(a)) if a.eq_ignore_ascii_case(b"SCRIPT"))
    })
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
            Link::At(c, at) => {
                let route = RoutingInfo::SingleNode(at.clone());
                c.route_command(cmd.clone(), route).boxed()
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let scripts_only = script_pipeline(pipeline);
        match self {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => async move {
                if !scripts_only {
                    return c.req_packed_commands(pipeline, offset, count).await;
                }
                let mut out = Vec::new();
                for cmd in pipeline.cmd_iter() {
                    out.push(c.req_packed_command(cmd).await?);
                }
                Ok(out.into_iter().skip(offset).take(count).collect())
            }
            .boxed(),
            Link::At(c, at) => {
                (c.route_pipeline(pipeline.clone(), offset, count, at.clone())).boxed()
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(c) => c.get_db(),
            _ => 0,
        }
    }
}

/// A master of the cluster and the slot ranges it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Master {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) slots: Vec<(u16, u16)>,
    /// Its replicas' `host:port`.
    pub(crate) replicas: Vec<String>,
}

impl Master {
    pub(crate) fn addr(&self) -> String {
        Host::new(self.host.clone(), Some(self.port)).to_string()
    }

    pub(crate) fn owns(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&slot))
    }
}

/// The cluster's command connection and the masters it last saw (`CLUSTER SLOTS`), for what
/// is sent by node.
pub(crate) struct Cluster {
    con: ClusterConnection,
    masters: Mutex<Option<Arc<Vec<Master>>>>,
    /// How long a batched renewal waits for one master (`crate::renew`): within the watchdog's
    /// bound for the whole call ([`ClientOptions::renew_timeout`]), so a master that does
    /// not answer leaves the others' outcomes standing.
    pub(crate) renew_budget: Duration,
}

impl Cluster {
    pub(crate) fn new(con: ClusterConnection, opts: &ClientOptions) -> Self {
        Cluster {
            con,
            masters: Mutex::new(None),
            renew_budget: opts.renew_timeout() * 3 / 4,
        }
    }

    pub(crate) fn link(&self) -> Link {
        Link::Cluster(self.con.clone())
    }

    /// A connection to the master at `m` only.
    pub(crate) fn at(&self, m: &Master) -> Link {
        let at = SingleNodeRoutingInfo::ByAddress {
            host: m.host.clone(),
            port: m.port,
        };
        Link::At(self.con.clone(), at)
    }

    /// The masters, as last read (read now if never, or after [`forget`](Self::forget)).
    pub(crate) async fn masters(&self) -> RedisResult<Arc<Vec<Master>>> {
        if let Some(m) = self.lock().clone() {
            return Ok(m);
        }
        let mut con = self.con.clone();
        let v: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut con)
            .await?;
        let m = Arc::new(parse_slots(&v).ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected CLUSTER SLOTS reply",
                format!("{v:?}"),
            ))
        })?);
        *self.lock() = Some(m.clone());
        Ok(m)
    }

    /// The topology changed (a failover, a resharding): read it again next time.
    pub(crate) fn forget(&self) {
        *self.lock() = None;
    }

    /// `part` run for every master at once ([`plan`]; `None`: no master known for the slots)
    /// with the items (indexes into `slots`) of its slots, in scripts of one slot, and its
    /// results (one per item, in the order of its scripts) put back in the order of `slots`
    /// (of a part that answered too few: an unexpected reply to `what`): one pipeline per
    /// master, not a round trip per lock, for the renewal and the reading of many locks.
    pub(crate) async fn per_master<T, Fut>(
        &self,
        b: &crate::RedisBackend,
        what: &str,
        slots: &[u16],
        part: impl Fn(Option<Master>, Vec<Vec<usize>>) -> Fut,
    ) -> Result<Vec<Result<T>>>
    where
        Fut: Future<Output = Vec<Result<T>>>,
    {
        let masters = self.masters().await.map_err(|e| b.err(e))?;
        let plan = plan(slots, &masters);
        let parts = (plan.iter()).map(|(m, idx)| part(m.map(|m| masters[m].clone()), idx.clone()));
        let mut out: Vec<Option<Result<T>>> = (0..slots.len()).map(|_| None).collect();
        for (idx, results) in plan.values().zip(join_all(parts).await) {
            for (&i, r) in idx.iter().flatten().zip(results) {
                out[i] = Some(r);
            }
        }
        let missing = || Err(crate::error::shape(what, &Value::Nil));
        Ok(out.into_iter().map(|o| o.unwrap_or_else(missing)).collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Vec<Master>>>> {
        crate::lock(&self.masters)
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, …], replica…], …]`, merged by master.
fn parse_slots(v: &Value) -> Option<Vec<Master>> {
    fn node(v: &Value) -> Option<(String, u16)> {
        let Value::Array(n) = v else { return None };
        let host: String = redis::from_redis_value_ref(n.first()?).ok()?;
        let port: u16 = redis::from_redis_value_ref(n.get(1)?).ok()?;
        Some((host, port))
    }
    let Value::Array(ranges) = v else { return None };
    let mut out: Vec<Master> = Vec::new();
    for r in ranges {
        let Value::Array(r) = r else { return None };
        let lo: u16 = redis::from_redis_value_ref(r.first()?).ok()?;
        let hi: u16 = redis::from_redis_value_ref(r.get(1)?).ok()?;
        let (host, port) = node(r.get(2)?)?;
        let replicas: Vec<String> = r[3..]
            .iter()
            .filter_map(node)
            .map(|(h, p)| Host::new(h, Some(p)).to_string())
            .collect();
        match out.iter_mut().find(|m| m.host == host && m.port == port) {
            Some(m) => m.slots.push((lo, hi)),
            None => out.push(Master {
                host,
                port,
                slots: vec![(lo, hi)],
                replicas,
            }),
        }
    }
    out.sort_by_key(Master::addr);
    Some(out)
}

/// The Redis Cluster hash tag of `key` (the part between its first `{` and the next `}`, when
/// not empty), as Redis reads it.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty) or of the whole key, modulo 16384, as Redis computes it.
pub(crate) fn slot(key: &str) -> u16 {
    let mut crc: u16 = 0;
    for &byte in hash_tag(key).unwrap_or(key).as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// How the watchdog's grants go out: the scripts (each a list of indexes into the holds, all
/// of one slot, at most [`PER_SCRIPT`]), grouped by the master that owns their slot
/// (`None`: no master known for it; such scripts go out routed by key).
pub(crate) fn plan(slots: &[u16], masters: &[Master]) -> BTreeMap<Option<usize>, Vec<Vec<usize>>> {
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, s) in slots.iter().enumerate() {
        by_slot.entry(*s).or_default().push(i);
    }
    let mut out: BTreeMap<Option<usize>, Vec<Vec<usize>>> = BTreeMap::new();
    for (slot, idx) in by_slot {
        let owner = masters.iter().position(|m| m.owns(slot));
        for chunk in idx.chunks(PER_SCRIPT) {
            out.entry(owner).or_default().push(chunk.to_vec());
        }
    }
    out
}

/// Whether the server behind `con` is a Redis Cluster node (`INFO cluster` says
/// `cluster_enabled:1`). A server that refuses INFO is taken for a standalone one.
pub(crate) async fn is_cluster_node(con: &mut ConnectionManager) -> bool {
    let info: RedisResult<String> = redis::cmd("INFO").arg("cluster").query_async(con).await;
    match info {
        Ok(i) => i.lines().any(|l| l.trim() == "cluster_enabled:1"),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read INFO cluster");
            false
        }
    }
}

/// The error for the items of slots no master is known for (they go out by key).
pub(crate) fn no_master(endpoint: &str) -> Error {
    Error::connection(KIND, endpoint.to_owned(), "no master known for the slot")
}

/// The error for a `redis://` URL that names a cluster node.
pub(crate) const NOT_STANDALONE: &str = "this server is a Redis Cluster node (cluster_enabled:1): redis:// talks to one server, and locks whose slot lives on another node would fail with MOVED; write redis+cluster://host:port[,host:port…] (rediss+cluster:// with TLS)";

/// The command connection of `redis+cluster://` at `seeds` (driver URLs, `redis://h:p` or
/// `rediss://h:p`), and a client for every node the subscriber may use: the seeds first, then
/// the masters and replicas the cluster names.
pub(crate) async fn open(
    cs: &ConnectionString,
    seeds: &[String],
    tls: Option<&TlsFiles>,
    creds: &Credentials,
    endpoint: &str,
    opts: &ClientOptions,
) -> Result<(Con, Vec<redis::Client>)> {
    let node = |url: &str| address::open_client(cs, url, tls, creds);
    // The seeds' clients first: this also checks the TLS files (and picks the TLS provider).
    let mut nodes = seeds.iter().map(|s| node(s)).collect::<Result<Vec<_>>>()?;
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(opts.get_connect_timeout())
        .response_timeout(opts.get_op_timeout())
        // A few redirects and reconnects within one call (a failover moves slots); past them
        // the error is a connection error, which the core retries within the caller's deadline.
        .retries(3)
        .min_retry_wait(20)
        .max_retry_wait(200);
    if let Some(u) = &creds.user {
        builder = builder.username(u);
    }
    if let Some(p) = &creds.password {
        builder = builder.password(p.expose());
    }
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        builder = builder.certs(address::tls_certificates(cs, tls)?);
    }
    let client = builder
        .build()
        .map_err(|e| Error::invalid(format!("redis+cluster seeds: {e}")))?;
    let con = crate::conn::in_time(opts, endpoint, "any seed", client.get_async_connection())
        .await?
        .map_err(|e| map(endpoint, e))?;
    let cluster = Cluster::new(con, opts);
    let masters = cluster.masters().await.map_err(|e| map(endpoint, e))?;
    let known: Vec<String> = nodes
        .iter()
        .map(|c| c.get_connection_info().addr().to_string())
        .collect();
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    for addr in masters
        .iter()
        .flat_map(|m| std::iter::once(m.addr()).chain(m.replicas.iter().cloned()))
    {
        if !known.contains(&addr) {
            nodes.push(node(&format!("{scheme}://{addr}"))?);
        }
    }
    Ok((Con::Cluster(cluster), nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(port: u16, slots: &[(u16, u16)]) -> Master {
        Master {
            host: "127.0.0.1".into(),
            port,
            slots: slots.to_vec(),
            replicas: vec![],
        }
    }

    #[test]
    fn slots_of_hash_tags() {
        // CLUSTER KEYSLOT values.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("dlock:{foo}:fence"), 12182);
        assert_eq!(slot("dlock:{foo}"), slot("other:{foo}:rw:exp"));
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("a{}b"), slot("a{}b"));
        assert_ne!(slot("{}x"), slot("{}y"));
    }

    #[test]
    fn plan_groups_by_slot_then_master() {
        let masters = [
            m(1, &[(0, 5460)]),
            m(2, &[(5461, 10922)]),
            m(3, &[(10923, 16383)]),
        ];
        // Two grants of slot 10, one of 6000, one of 12000, one more of 10.
        let p = plan(&[10, 6000, 12000, 10, 6001], &masters);
        assert_eq!(p.len(), 3, "one batch per master: {p:?}");
        assert_eq!(p[&Some(0)], vec![vec![0, 3]]);
        assert_eq!(p[&Some(1)], vec![vec![1], vec![4]]);
        assert_eq!(p[&Some(2)], vec![vec![2]]);
        // A slot nobody owns goes out by key.
        let p = plan(&[10], &masters[1..]);
        assert_eq!(p[&None], vec![vec![0]]);
        // Many grants of one slot: scripts of PER_SCRIPT.
        let p = plan(&vec![7; PER_SCRIPT + 1], &masters);
        assert_eq!(p[&Some(0)].len(), 2);
    }

    #[test]
    fn cluster_slots_reply() {
        let node_at = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let node = |p: i64| node_at("127.0.0.1", p);
        let v = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5), node(7000), node(7003)]),
            Value::Array(vec![Value::Int(6), Value::Int(9), node(7001)]),
            Value::Array(vec![
                Value::Int(10),
                Value::Int(16383),
                node(7000),
                node(7003),
            ]),
        ]);
        let ms = parse_slots(&v).expect("parsed");
        assert_eq!(ms.len(), 2);
        assert_eq!(ms[0].slots, vec![(0, 5), (10, 16383)]);
        assert_eq!(ms[0].replicas, vec!["127.0.0.1:7003".to_owned()]);
        assert!(ms[1].owns(7) && !ms[1].owns(10));
        // IPv6 replicas are written as their master is, in brackets.
        let v = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            node_at("::1", 7000),
            node_at("::1", 7003),
        ])]);
        let ms = parse_slots(&v).expect("parsed");
        assert_eq!(ms[0].addr(), "[::1]:7000");
        assert_eq!(ms[0].replicas, vec!["[::1]:7003".to_owned()]);
    }
}
