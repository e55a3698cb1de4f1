//! What the memory dedup store costs per handled record (a lookup, then an insert, as the dedup
//! layer asks), and how much of it is the two cores sharing the store.
//!
//! Three subjects, alternating over rounds, each inserting 1,000,000 new records (200,000 per
//! consumer group, 8 partitions, 10,000 keys) with the records made up front so only the store is
//! timed:
//! - `one thread`: one thread asks one store;
//! - `two threads, shared store`: two threads ask one store, as the runtime's two workers do;
//! - `two threads, a store each`: the same work with nothing shared between the threads, the
//!   figure the shared store would reach if sharing cost nothing.
//!
//! It prints the wall time per record of each (lower is better; two threads that share nothing
//! take half of one thread's). Run: `cargo bench -p storage-memory --bench dedup_store [-- ROUNDS]`
//! (default 3 rounds).

use std::error::Error;
use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use prosody_api::storage::{DedupRecord, ImmediateDedupStore, PartitionScope, Ttl};
use prosody_api::{Partition, StorageError, SystemClock};
use storage_memory::MemoryDedupStore;

const GROUPS: usize = 5;
const RECORDS_PER_GROUP: usize = 200_000;
const PARTITIONS: i32 = 8;
const KEYS: usize = 10_000;
/// An hour: no record expires during the bench.
const TTL: Ttl = Ttl::new(NonZeroU32::MIN.saturating_add(3_599));

/// How the threads of a subject reach the store.
#[derive(Clone, Copy, Debug)]
enum Subject {
    OneThread,
    SharedStore,
    StorePerThread,
}

impl Subject {
    const ALL: [Self; 3] = [Self::OneThread, Self::SharedStore, Self::StorePerThread];

    const fn name(self) -> &'static str {
        match self {
            Self::OneThread => "one thread",
            Self::SharedStore => "two threads, shared store",
            Self::StorePerThread => "two threads, a store each",
        }
    }

    const fn threads(self) -> usize {
        match self {
            Self::OneThread => 1,
            Self::SharedStore | Self::StorePerThread => 2,
        }
    }
}

/// A group's records and the scopes of its partitions.
struct Group {
    scopes: Vec<PartitionScope>,
    records: Vec<DedupRecord<'static>>,
}

fn group(run: usize, index: usize) -> Group {
    let name = format!("bench-{run}-{index}");
    Group {
        scopes: (0..PARTITIONS)
            .map(|partition| PartitionScope::new(name.as_str(), "topic", Partition(partition)))
            .collect(),
        records: (0..RECORDS_PER_GROUP)
            .map(|record| {
                DedupRecord::new(
                    format!("key-{}", record % KEYS),
                    format!("{index}-{record}"),
                    "1",
                )
            })
            .collect(),
    }
}

/// Looks up and inserts every `threads`-th record of `group` from `first`, as a handled record;
/// the number of records the store already held (none, for a correct store).
fn handle(
    store: &MemoryDedupStore,
    group: &Group,
    first: usize,
    threads: usize,
) -> Result<usize, StorageError> {
    let mut held = 0;
    for (index, record) in group
        .records
        .iter()
        .enumerate()
        .skip(first)
        .step_by(threads)
    {
        let scope = &group.scopes[index % group.scopes.len()];
        if store.contains_now(scope, record)? {
            held += 1;
        }
        store.insert_now(scope, record, TTL)?;
    }
    Ok(held)
}

/// Wall time of `subject` handling every record of `groups` on fresh stores.
fn measure(subject: Subject, groups: &[Group]) -> Result<Duration, Box<dyn Error>> {
    let threads = subject.threads();
    let stores: Vec<MemoryDedupStore> = match subject {
        Subject::OneThread | Subject::SharedStore => vec![MemoryDedupStore::new(SystemClock)],
        Subject::StorePerThread => (0..threads)
            .map(|_| MemoryDedupStore::new(SystemClock))
            .collect(),
    };
    let started = Instant::now();
    let held = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|first| {
                let store = &stores[first % stores.len()];
                scope.spawn(move || {
                    groups.iter().try_fold(0, |held, group| {
                        Ok::<_, StorageError>(held + handle(store, group, first, threads)?)
                    })
                })
            })
            .collect();
        workers.into_iter().try_fold(0, |total, worker| {
            let held = worker
                .join()
                .map_err(|_| "a bench thread panicked".to_owned())??;
            Ok::<_, Box<dyn Error>>(total + held)
        })
    })?;
    let elapsed = started.elapsed();
    if held > 0 {
        return Err(format!("{} found {held} new records already held", subject.name()).into());
    }
    Ok(elapsed)
}

fn main() -> Result<(), Box<dyn Error>> {
    // `cargo bench` passes `--bench`; the first other argument is the round count.
    let rounds: usize = match std::env::args()
        .skip(1)
        .find(|argument| !argument.starts_with('-'))
    {
        Some(rounds) => rounds
            .parse()
            .map_err(|_| format!("ROUNDS must be a whole number, got {rounds}"))?,
        None => 3,
    };
    let records = GROUPS * RECORDS_PER_GROUP;
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); Subject::ALL.len()];
    for round in 0..rounds {
        // New groups each round: a store meets every record once, as a consumer does.
        let groups: Vec<Group> = (0..GROUPS).map(|index| group(round, index)).collect();
        for (subject, times) in Subject::ALL.into_iter().zip(&mut results) {
            #[expect(clippy::cast_precision_loss, reason = "a record count, far below 2^52")]
            let per_record = measure(subject, &groups)?.as_secs_f64() * 1e9 / records as f64;
            println!(
                "round {round} {:26} {per_record:6.1} ns per record",
                subject.name()
            );
            times.push(per_record);
        }
    }
    println!("{records} records per round, {rounds} round(s); medians (wall time per record):");
    for (subject, times) in Subject::ALL.into_iter().zip(&mut results) {
        times.sort_by(f64::total_cmp);
        println!("{:26} {:6.1} ns", subject.name(), times[times.len() / 2]);
    }
    Ok(())
}
