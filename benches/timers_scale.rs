//! Timer scale benchmark: a consumer whose partitions hold many pending timers spread over a
//! long window (by default 1,000,000 over 24 h in slabs of 1 h) must start its partitions by
//! reading only the slabs near now, and stay small in memory.
//!
//! The store is wrapped in a counter of what the loaders read, so the run checks that no slab
//! beyond the one after now was read. Two stores:
//!
//! - `memory` (default): the in-memory backend, pre-populated in this process; the process RSS
//!   then includes the store itself (what mock mode costs);
//! - `external`: a synthetic store that computes each slab's timers on demand, standing in for
//!   a database outside the process (Cassandra): the RSS is the consumer's alone.
//!
//! Prints plain `name: value` lines and exits non-zero when a limit is missed (RSS under
//! `--max-rss-mib`, 300 by default; no far-future slab read).
//!
//! ```sh
//! eval "$(scripts/services up kafka)"
//! cargo bench -p prosody --bench timers_scale                      # memory store
//! cargo bench -p prosody --bench timers_scale -- --store external  # consumer-only RSS
//! ```

use std::collections::{BTreeSet, HashMap};
use std::env;
use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use parking_lot::Mutex;
use prosody::api::storage::{PartitionScope, StoredTimer, TimerStore};
use prosody::api::{
    EventContext, EventHandler, ExciseMessage, HandlerError, Key, Message, Partition, SlabId,
    SlabSize, StorageError, Timer, TimerKind, TimerTime,
};
use prosody::config::{ClientOptions, Config, ProbePort, StorageBackend};
use prosody::{AdminClient, ProsodyClient};
use serde_json::Value;
use storage_memory::MemoryTimerStore;

const USAGE: &str = "\
timers_scale: pending timers over a long window; start-up reads only near slabs

options:
  --timers N        pending timers (default 1000000)
  --hours H         window they are spread over, starting 2 minutes from now (default 24)
  --partitions P    topic partitions (default 8)
  --keys K          distinct keys (default 100000)
  --store S         memory | external (default memory)
  --max-rss-mib M   fail above this RSS (default 300)
";

#[derive(Clone, Copy, Debug, PartialEq)]
enum StoreKind {
    Memory,
    External,
}

#[derive(Clone, Copy, Debug)]
struct Args {
    timers: u64,
    hours: u64,
    partitions: i32,
    keys: u64,
    store: StoreKind,
    max_rss_mib: u64,
}

fn parse_args() -> Result<Option<Args>, Box<dyn Error>> {
    let mut args = Args {
        timers: 1_000_000,
        hours: 24,
        partitions: 8,
        keys: 100_000,
        store: StoreKind::Memory,
        max_rss_mib: 300,
    };
    let mut given = env::args().skip(1).filter(|arg| arg != "--bench");
    while let Some(name) = given.next() {
        if name == "--help" || name == "-h" {
            print!("{USAGE}");
            return Ok(None);
        }
        let value = given.next().ok_or(format!("{name} needs a value"))?;
        match name.as_str() {
            "--timers" => args.timers = value.parse()?,
            "--hours" => args.hours = value.parse()?,
            "--partitions" => args.partitions = value.parse()?,
            "--keys" => args.keys = value.parse()?,
            "--max-rss-mib" => args.max_rss_mib = value.parse()?,
            "--store" => {
                args.store = match value.as_str() {
                    "memory" => StoreKind::Memory,
                    "external" => StoreKind::External,
                    other => return Err(format!("--store: memory or external, got {other}").into()),
                }
            }
            other => return Err(format!("unknown option {other}\n{USAGE}").into()),
        }
    }
    Ok(Some(args))
}

/// Where the timers are: timer `i` belongs to partition `i % partitions` and key
/// `key-{i % keys}`, due at `start + i * span / count` (evenly spread).
#[derive(Clone, Copy, Debug)]
struct Layout {
    count: u64,
    start: u64,
    span: u64,
    partitions: u64,
    keys: u64,
}

impl Layout {
    fn time(&self, index: u64) -> u64 {
        self.start + index * self.span / self.count
    }

    fn timer(&self, index: u64) -> StoredTimer {
        StoredTimer {
            time: TimerTime::from_secs(self.time(index)),
            key: Key::from(format!("key-{}", index % self.keys)),
            kind: TimerKind::Application,
        }
    }

    /// The first index due at or after `secs`.
    fn first_at(&self, secs: u64) -> u64 {
        let offset = secs.saturating_sub(self.start);
        (offset * self.count).div_ceil(self.span).min(self.count)
    }
}

/// A store outside the process, simulated: each slab's timers are computed when read, so the
/// process holds only what the consumer loaded. Writes are accepted and dropped (nothing fires
/// during the run).
#[derive(Debug)]
struct ExternalStore {
    layout: Layout,
    size: SlabSize,
}

#[async_trait]
impl TimerStore for ExternalStore {
    fn slab_size(&self) -> SlabSize {
        self.size
    }

    async fn schedule(
        &self,
        _: &PartitionScope,
        _: &Key,
        _: TimerKind,
        _: TimerTime,
    ) -> Result<(), StorageError> {
        Ok(())
    }

    async fn clear_and_schedule(
        &self,
        _: &PartitionScope,
        _: &Key,
        _: TimerKind,
        _: TimerTime,
    ) -> Result<(), StorageError> {
        Ok(())
    }

    async fn unschedule(
        &self,
        _: &PartitionScope,
        _: &Key,
        _: TimerKind,
        _: TimerTime,
    ) -> Result<(), StorageError> {
        Ok(())
    }

    async fn clear(&self, _: &PartitionScope, _: &Key, _: TimerKind) -> Result<(), StorageError> {
        Ok(())
    }

    async fn scheduled(
        &self,
        _: &PartitionScope,
        _: &Key,
        _: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        Ok(Vec::new())
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        let layout = self.layout;
        let partition = u64::try_from(scope.partition.0).unwrap_or(0);
        let from = layout.first_at(slab.start(self.size).as_secs());
        let to = layout.first_at(slab.end(self.size).as_secs());
        let mut timers: Vec<StoredTimer> = (from..to)
            .filter(|index| index % layout.partitions == partition)
            .map(|index| layout.timer(index))
            .collect();
        timers.sort();
        Ok(timers)
    }

    async fn slabs(&self, _: &PartitionScope, until: SlabId) -> Result<Vec<SlabId>, StorageError> {
        let first = TimerTime::from_secs(self.layout.start).slab(self.size);
        let last = TimerTime::from_secs(self.layout.start + self.layout.span).slab(self.size);
        Ok((first.0..=last.0.min(until.0)).map(SlabId).collect())
    }
}

/// Counts what the loaders read from the wrapped store, per partition.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn TimerStore>,
    read: Mutex<HashMap<i32, Reads>>,
    timers_read: AtomicUsize,
}

#[derive(Debug, Default)]
struct Reads {
    slabs: BTreeSet<SlabId>,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Counting {
    fn touch(&self, scope: &PartitionScope, slab: Option<SlabId>) {
        let mut read = self.read.lock();
        let reads = read.entry(scope.partition.0).or_default();
        let now = Instant::now();
        reads.first.get_or_insert(now);
        reads.last = Some(now);
        if let Some(slab) = slab {
            reads.slabs.insert(slab);
        }
    }
}

impl Counting {
    /// Far slabs read (beyond `near`), the slowest partition's load time, and slabs read per
    /// partition.
    fn summary(&self, near: SlabId) -> (Vec<(i32, SlabId)>, Duration, Vec<usize>) {
        let read = self.read.lock();
        let mut far = Vec::new();
        let mut slowest = Duration::ZERO;
        for (partition, reads) in read.iter() {
            far.extend(
                reads
                    .slabs
                    .iter()
                    .filter(|slab| **slab > near)
                    .map(|slab| (*partition, *slab)),
            );
            if let (Some(first), Some(last)) = (reads.first, reads.last) {
                slowest = slowest.max(last.duration_since(first));
            }
        }
        let per_partition = read.values().map(|reads| reads.slabs.len()).collect();
        (far, slowest, per_partition)
    }
}

#[async_trait]
impl TimerStore for Counting {
    fn slab_size(&self) -> SlabSize {
        self.inner.slab_size()
    }

    async fn schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        self.inner.schedule(scope, key, kind, time).await
    }

    async fn clear_and_schedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        self.inner.clear_and_schedule(scope, key, kind, time).await
    }

    async fn unschedule(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
        time: TimerTime,
    ) -> Result<(), StorageError> {
        self.inner.unschedule(scope, key, kind, time).await
    }

    async fn clear(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<(), StorageError> {
        self.inner.clear(scope, key, kind).await
    }

    async fn scheduled(
        &self,
        scope: &PartitionScope,
        key: &Key,
        kind: TimerKind,
    ) -> Result<Vec<TimerTime>, StorageError> {
        self.inner.scheduled(scope, key, kind).await
    }

    async fn slab(
        &self,
        scope: &PartitionScope,
        slab: SlabId,
    ) -> Result<Vec<StoredTimer>, StorageError> {
        let timers = self.inner.slab(scope, slab).await?;
        self.timers_read.fetch_add(timers.len(), Ordering::SeqCst);
        self.touch(scope, Some(slab));
        Ok(timers)
    }

    async fn slabs(
        &self,
        scope: &PartitionScope,
        until: SlabId,
    ) -> Result<Vec<SlabId>, StorageError> {
        self.touch(scope, None);
        self.inner.slabs(scope, until).await
    }
}

struct Idle;

#[async_trait]
impl EventHandler for Idle {
    type Error = HandlerError;

    async fn on_message(&self, _: &dyn EventContext, _: &Message) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_excise(
        &self,
        _: &dyn EventContext,
        _: &ExciseMessage,
    ) -> Result<Value, HandlerError> {
        Ok(Value::Null)
    }

    async fn on_timer(&self, _: &dyn EventContext, _: &Timer) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Current and peak resident set size in MiB, from `/proc/self/status`.
fn rss_mib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map_or(0, |kib| kib / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

async fn populate(store: &MemoryTimerStore, layout: &Layout, group: &str, topic: &str) {
    let scopes: Vec<PartitionScope> = (0..layout.partitions)
        .map(|partition| {
            PartitionScope::new(
                group,
                topic,
                Partition(i32::try_from(partition).unwrap_or(0)),
            )
        })
        .collect();
    for index in 0..layout.count {
        let timer = layout.timer(index);
        let scope = &scopes[usize::try_from(index % layout.partitions).unwrap_or(0)];
        if let Err(error) = store
            .schedule(scope, &timer.key, timer.kind, timer.time)
            .await
        {
            eprintln!("populate: {error}");
            return;
        }
    }
}

/// Creates the topic, subscribes a client over `store`, and waits until every partition has
/// loaded its timers; returns the client and how long that took from subscribing.
async fn start(
    args: &Args,
    bootstrap: &str,
    topic: &str,
    group: &str,
    store: Arc<Counting>,
) -> Result<(ProsodyClient, Duration), Box<dyn Error>> {
    AdminClient::new(bootstrap)?
        .create_topic(topic, args.partitions, 1)
        .await?;
    let config = Config::from_options(ClientOptions {
        bootstrap_servers: Some(vec![bootstrap.to_owned()]),
        group_id: Some(group.to_owned()),
        subscribed_topics: Some(vec![topic.to_owned()]),
        // The real broker, memory storage, no telemetry topic.
        storage_backend: Some(StorageBackend::Memory),
        telemetry_enabled: Some(false),
        probe_port: Some(ProbePort::Disabled),
        ..ClientOptions::default()
    })?;
    let client = ProsodyClient::with_timer_store(config, store).await?;
    let subscribed = Instant::now();
    client.subscribe(Idle).await?;
    let partitions = usize::try_from(args.partitions)?;
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let stats = client.timer_stats();
            if stats.len() == partitions
                && stats
                    .iter()
                    .all(|(_, stats)| stats.frontier.is_some() && !stats.loading)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .map_err(|_| "partitions did not load within 120 s")?;
    Ok((client, subscribed.elapsed()))
}

async fn run(args: Args) -> Result<bool, Box<dyn Error>> {
    let bootstrap = env::var("PROSODY_BOOTSTRAP_SERVERS").map_err(
        |_| "PROSODY_BOOTSTRAP_SERVERS is not set: run `scripts/services up kafka` and export it",
    )?;
    let unique = format!("{}_{}", std::process::id(), now_secs());
    let topic = format!("timers_scale_{unique}");
    let group = format!("timers_scale_group_{unique}");
    let size = SlabSize::DEFAULT;
    let layout = Layout {
        count: args.timers,
        start: now_secs() + 120,
        span: args.hours * 3_600,
        partitions: u64::try_from(args.partitions)?,
        keys: args.keys.max(1),
    };
    println!(
        "setup: {} timers over {} h, {} partitions, {} keys, slab {} s, store {:?}",
        args.timers,
        args.hours,
        args.partitions,
        args.keys,
        size.as_secs(),
        args.store
    );
    let (rss_start, _) = rss_mib();
    let inner: Arc<dyn TimerStore> = match args.store {
        StoreKind::Memory => {
            let store = MemoryTimerStore::new(size);
            let started = Instant::now();
            populate(&store, &layout, &group, &topic).await;
            println!("populate: {:?}", started.elapsed());
            Arc::new(store)
        }
        StoreKind::External => Arc::new(ExternalStore { layout, size }),
    };
    let (rss_populated, _) = rss_mib();
    println!(
        "rss of the store: {} MiB",
        rss_populated.saturating_sub(rss_start)
    );

    let counting = Arc::new(Counting {
        inner,
        read: Mutex::default(),
        timers_read: AtomicUsize::new(0),
    });
    let (client, startup) = start(&args, &bootstrap, &topic, &group, counting.clone()).await?;
    let (rss_loaded, rss_peak) = rss_mib();

    let near = SlabId(TimerTime::from_secs(now_secs()).slab(size).0 + 1);
    let total_slabs = TimerTime::from_secs(layout.start + layout.span)
        .slab(size)
        .0
        - TimerTime::from_secs(layout.start).slab(size).0
        + 1;
    let (far_reads, slowest, slabs_per_partition) = counting.summary(near);
    let in_memory: usize = client
        .timer_stats()
        .iter()
        .map(|(_, stats)| stats.pending)
        .sum();
    println!("ready after subscribe (group join included): {startup:?}");
    println!("partition load time (slowest, store reads only): {slowest:?}");
    println!("slabs read per partition: {slabs_per_partition:?} of {total_slabs} holding timers");
    println!(
        "timers read: {} of {}; pending in memory: {in_memory}",
        counting.timers_read.load(Ordering::SeqCst),
        args.timers
    );
    println!("rss after start-up: {rss_loaded} MiB (peak {rss_peak} MiB)");
    println!(
        "rss of the consumer (above the store): {} MiB",
        rss_loaded.saturating_sub(rss_populated)
    );
    client.shutdown().await?;
    AdminClient::new(&bootstrap)?.delete_topic(&topic).await?;

    let rss_ok = rss_peak < args.max_rss_mib;
    let near_ok = far_reads.is_empty();
    println!(
        "check rss: {} (peak {rss_peak} MiB, limit {} MiB)",
        if rss_ok { "ok" } else { "FAIL" },
        args.max_rss_mib
    );
    println!(
        "check near slabs only: {}{}",
        if near_ok { "ok" } else { "FAIL" },
        if near_ok {
            String::new()
        } else {
            format!(" (far slabs read: {far_reads:?})")
        }
    );
    Ok(rss_ok && near_ok)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("timers_scale: {error}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("timers_scale: {error}");
            ExitCode::FAILURE
        }
    }
}
