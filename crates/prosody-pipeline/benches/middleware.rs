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
//! Run: `cargo bench -p prosody-pipeline --bench middleware [-- ROUNDS]` (default 5 rounds of
//! 200,000 events over 10,000 keys and 8 partitions, ~100-byte payloads with an `id`).
use std::time::{Duration, Instant};

use prosody_pipeline::Event;
use subjects::{EVENTS, KEYS, PARTITIONS, SUBJECTS, Subject, dispatch_one, events};
use tokio_util::sync::CancellationToken;

#[path = "common/subjects.rs"]
mod subjects;

/// CPU time this thread has run, from the kernel's scheduler statistics (nanoseconds, without
/// the time the hypervisor ran others: on a shared VM the wall clock moves by 10% between
/// identical rounds). `None` where `/proc` does not offer it.
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Mean CPU time per event of `subject` over `events`, admitted and dispatched one at a time
/// (the wall clock when the CPU time is not available).
async fn run(subject: &Subject, events: Vec<(usize, Event)>) -> Duration {
    let cancel: Vec<CancellationToken> =
        (0..PARTITIONS).map(|_| CancellationToken::new()).collect();
    let count = u32::try_from(events.len()).unwrap_or(u32::MAX).max(1);
    let started = Instant::now();
    let cpu_started = thread_cpu();
    for (partition, event) in events {
        dispatch_one(subject, event, cancel[partition].clone()).await;
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

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find(|arg| arg != "--bench")
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5)
        .max(1);
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
    runtime.block_on(async {
        // A fresh stack per round, as a fresh subscription has, so no round inherits a store
        // grown by the earlier ones; its caches warm up within the first of 20 events per key.
        let mut samples = vec![Vec::new(); SUBJECTS.len()];
        let mut names = ["", ""];
        println!(
            "{EVENTS} events, {KEYS} keys, {PARTITIONS} partitions, {rounds} rounds, CPU time per event"
        );
        for round in 0..rounds {
            for ((build, samples), name) in SUBJECTS.iter().zip(&mut samples).zip(&mut names) {
                let subject = build();
                *name = subject.name;
                let per_event = run(&subject, events(round)).await;
                println!("round {round} {}: {} ns/event", subject.name, per_event.as_nanos());
                samples.push(per_event);
            }
        }
        let medians: Vec<Duration> = samples.into_iter().map(median).collect();
        for (name, median) in names.iter().zip(&medians) {
            println!("{name} median: {} ns/event", median.as_nanos());
        }
        let (core, pipeline) = (medians[0].as_secs_f64(), medians[1].as_secs_f64());
        println!(
            "middleware per event: {} ns (pipeline/core {:.2}x)",
            medians[1].saturating_sub(medians[0]).as_nanos(),
            pipeline / core
        );
    });
}
