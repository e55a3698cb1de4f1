//! Cost of the middleware per event, without Kafka: the same events through the bare handler
//! service (what the throughput bench's `core` subject dispatches to) and through the full
//! pipeline-mode stack with the in-memory stores (what its `client` subject does), in one
//! process, alternating over several rounds.
//!
//! The throughput bench measures the middleware's share against real Kafka, but on a shared
//! two-core machine a single pass moves by 20% with other load, which hides changes of a few
//! percent. Here each event is admitted and dispatched as the engine does it (an admission
//! permit, then `dispatch_admitted`), on one thread, so the figure is the CPU the layers add per
//! event and the rounds' medians are stable enough to compare two builds.
//!
//! Run: `cargo bench -p prosody-pipeline --bench middleware [-- ROUNDS] [--only NAMES]` (default
//! 5 rounds of 200,000 events over 10,000 keys and 8 partitions, ~100-byte payloads with an
//! `id`; `--only NAMES`, comma-separated, runs those subjects, alternating: `core`, `pipeline`,
//! one of the pipeline's variants without a part, see `VARIANTS`, `core-suspending` and
//! `pipeline-suspending`, whose handler suspends once per event as an asynchronous one does, see
//! `SUSPENDING`, or `pipeline-telemetry`, which emits lifecycle events, see `TELEMETRY`).
//! `scripts/bench-instructions` runs it under callgrind for instruction counts, which do not move
//! between runs at all.
use std::time::{Duration, Instant};

use prosody_pipeline::Event;
use subjects::{
    EVENTS, KEYS, PARTITIONS, SUBJECTS, SUSPENDING, Subject, TELEMETRY, VARIANTS, dispatch_one,
    events, partition_watches,
};
use tokio::runtime::Runtime;

#[path = "common/subjects.rs"]
mod subjects;

/// CPU time this thread has run (without the time the hypervisor ran others: on a shared VM
/// the wall clock moves by 10% between identical rounds), to the nanosecond: the kernel adds the
/// running slice, where `/proc`'s scheduler statistics advance by whole ticks here (4 ms, 20 ns
/// per event of a round). `None` where the clock is not offered.
fn thread_cpu() -> Option<Duration> {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let seconds = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    Some(Duration::new(seconds, nanos))
}

/// Mean CPU time per event of `subject` over `events`, admitted and dispatched one at a time
/// (the wall clock when the CPU time is not available).
async fn run(subject: &Subject, events: Vec<(usize, Event)>) -> Duration {
    let cancel = partition_watches().await;
    let count = u32::try_from(events.len()).unwrap_or(u32::MAX).max(1);
    let started = Instant::now();
    let cpu_started = thread_cpu();
    for (partition, event) in events {
        dispatch_one(subject, event, &cancel[partition]).await;
    }
    match (cpu_started, thread_cpu()) {
        (Some(before), Some(after)) => after.saturating_sub(before) / count,
        _ => started.elapsed() / count,
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[(samples.len() - 1) / 2]
}

/// Runs one round of `subject` over `events` to completion and returns its CPU time per event.
/// Never inlined: `scripts/bench-instructions` counts the instructions executed inside this
/// function (callgrind's `--toggle-collect`), so the events' construction stays out of the count.
#[inline(never)]
fn measure(runtime: &Runtime, subject: &Subject, events: Vec<(usize, Event)>) -> Duration {
    runtime.block_on(run(subject, events))
}

/// The command line: `[ROUNDS] [--only NAMES]`.
struct Options {
    rounds: usize,
    only: Option<String>,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let mut options = Self {
            rounds: 5,
            only: None,
        };
        let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
        while let Some(arg) = args.next() {
            if arg == "--only" {
                options.only = Some(args.next().ok_or("--only needs subject names")?);
            } else {
                options.rounds = arg
                    .parse::<usize>()
                    .map_err(|_| format!("rounds must be a whole number, got {arg:?}"))?
                    .max(1);
            }
        }
        Ok(options)
    }
}

fn main() {
    let options = match Options::parse() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("middleware bench: {error}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("middleware bench: no runtime: {error}");
            std::process::exit(1);
        }
    };
    // By default the two subjects; `--only` picks some of them or of the other subjects, which
    // then alternate round by round as the default two do.
    let builds: Vec<fn() -> Subject> = match &options.only {
        None => SUBJECTS.to_vec(),
        Some(only) => {
            let all: Vec<fn() -> Subject> = SUBJECTS
                .into_iter()
                .chain(VARIANTS)
                .chain(SUSPENDING)
                .chain(TELEMETRY)
                .collect();
            let names: Vec<&str> = all
                .iter()
                .map(|build| runtime.block_on(async { build().name }))
                .collect();
            let mut picked = Vec::new();
            for wanted in only.split(',') {
                let Some(index) = names.iter().position(|name| *name == wanted) else {
                    eprintln!(
                        "middleware bench: --only names no subject {wanted:?} ({})",
                        names.join(", ")
                    );
                    std::process::exit(2);
                };
                picked.push(all[index]);
            }
            picked
        }
    };
    let rounds = options.rounds;
    // A fresh stack per round, as a fresh subscription has, so no round inherits a store grown
    // by the earlier ones; its caches warm up within the first of 20 events per key.
    let mut samples = vec![Vec::new(); builds.len()];
    let mut names = vec![""; builds.len()];
    println!(
        "{EVENTS} events, {KEYS} keys, {PARTITIONS} partitions, {rounds} rounds, CPU time per event"
    );
    for round in 0..rounds {
        for ((build, samples), name) in builds.iter().zip(&mut samples).zip(&mut names) {
            let subject = runtime.block_on(async { build() });
            *name = subject.name;
            let events = events(round, subject.ids);
            let per_event = measure(&runtime, &subject, events);
            println!(
                "round {round} {}: {} ns/event",
                subject.name,
                per_event.as_nanos()
            );
            samples.push(per_event);
        }
    }
    let medians: Vec<Duration> = samples.into_iter().map(median).collect();
    for (name, median) in names.iter().zip(&medians) {
        println!("{name} median: {} ns/event", median.as_nanos());
    }
    // Two subjects: what the second adds to the first (by default the pipeline to the core).
    if let ([first, second], [first_name, second_name]) = (&medians[..], &names[..]) {
        println!(
            "{second_name} - {first_name}: {} ns per event ({second_name}/{first_name} {:.2}x)",
            second.saturating_sub(*first).as_nanos(),
            second.as_secs_f64() / first.as_secs_f64()
        );
    }
}
