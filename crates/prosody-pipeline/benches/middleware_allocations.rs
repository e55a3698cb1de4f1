//! Heap allocations per event of the middleware bench's subjects: the bare handler service and
//! the pipeline-mode stack, dispatched one event at a time as the engine does.
//!
//! Allocation is the largest single cost in profiles of the consumer (malloc and free together
//! were a fifth to a quarter of the samples), and unlike CPU time on a shared machine the count
//! does not move between runs, so a change that saves one allocation per event shows as exactly
//! that. A separate binary from `middleware` because the counting allocator adds atomic updates
//! to every allocation, which would skew its timings.
//!
//! Run: `cargo bench -p prosody-pipeline --bench middleware_allocations`. The first round of
//! each subject warms its caches and maps up; the second is reported.

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use subjects::{
    EVENTS, KEYS, PARTITIONS, SUBJECTS, SUSPENDING, TELEMETRY, VARIANTS, dispatch_one, events,
    partition_watches,
};

#[path = "common/subjects.rs"]
mod subjects;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn main() {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("middleware_allocations bench: no runtime: {error}");
            std::process::exit(1);
        }
    };
    runtime.block_on(async {
        println!(
            "{EVENTS} events, {KEYS} keys, {PARTITIONS} partitions, heap allocations per event"
        );
        let mut per_event = Vec::new();
        // The pipeline's variants after the two subjects: what each part allocates per event;
        // then both subjects with a handler that suspends once, as an asynchronous one does;
        // last the pipeline emitting lifecycle events, whose count includes what the sink's
        // sender thread allocates (librdkafka's own allocations are not Rust's, not counted).
        for build in SUBJECTS
            .into_iter()
            .chain(VARIANTS)
            .chain(SUSPENDING)
            .chain(TELEMETRY)
        {
            let subject = build();
            let cancel = partition_watches().await;
            let mut measured = None;
            for round in 0..2 {
                let events = events(round, subject.ids);
                let region = Region::new(GLOBAL);
                for (partition, event) in events {
                    dispatch_one(&subject, event, &cancel[partition]).await;
                }
                measured = Some(region.change());
            }
            let Some(stats) = measured else { continue };
            #[allow(
                clippy::cast_precision_loss,
                reason = "counts far below 2^52 divided for a report"
            )]
            let (allocations, bytes) = (
                stats.allocations as f64 / EVENTS as f64,
                stats.bytes_allocated as f64 / EVENTS as f64,
            );
            println!(
                "{}: {allocations:.2} allocations, {bytes:.0} bytes allocated per event",
                subject.name
            );
            per_event.push(allocations);
        }
        if let [core, pipeline, ..] = per_event[..] {
            println!("middleware: {:.2} allocations per event", pipeline - core);
        }
    });
}
