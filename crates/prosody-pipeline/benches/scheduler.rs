//! Cost of one admission grant under contention: the fair scheduler against a plain semaphore
//! (first come, first served), the engine's default and the reference the scheduler is held to.
//!
//! 128 workers on a two-thread runtime each admit (as the engine does) and release a permit
//! 2,000 times over 10,000 keys with `maxConcurrency` 32, yielding between grants, so most
//! admissions queue and every release hands its slot to a waiter (the scheduler's expensive path). The subjects
//! alternate over several rounds and the summary prints each median per grant and their ratio.
//!
//! Run: `cargo bench -p prosody-pipeline --bench scheduler [-- ROUNDS]` (default 5 rounds).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prosody_api::Key;
use prosody_pipeline::consumer::{Admission, SemaphoreAdmission, TaskClass, admit};
use prosody_pipeline::scheduler::{FairScheduler, SchedulerSettings};

const WORKERS: usize = 128;
const GRANTS_PER_WORKER: usize = 2_000;
const KEYS: usize = 10_000;
const MAX_CONCURRENCY: usize = 32;

/// Mean time per grant of `admission` while `WORKERS` tasks contend for it.
async fn churn(admission: Arc<dyn Admission>) -> Duration {
    // Keys are made up front so the measurement is the admission, not string formatting.
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..KEYS)
            .map(|index| Key::from(format!("k{index}")))
            .collect(),
    );
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let admission = admission.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                for round in 0..GRANTS_PER_WORKER {
                    let key = &keys[(worker * 7 + round) % KEYS];
                    drop(admit(&*admission, key, TaskClass::Normal).await);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for worker in workers {
        if let Err(error) = worker.await {
            eprintln!("scheduler bench: a worker failed: {error}");
        }
    }
    let grants = u32::try_from(WORKERS * GRANTS_PER_WORKER).unwrap_or(u32::MAX);
    started.elapsed() / grants
}

fn fair() -> Arc<dyn Admission> {
    // The configuration's defaults (FEATURES.md section 9), except the concurrency.
    Arc::new(FairScheduler::new(SchedulerSettings {
        max_concurrency: MAX_CONCURRENCY,
        failure_weight: 0.3,
        max_wait: Duration::from_secs(120),
        wait_weight: 200.0,
        cache_size: 8_192,
    }))
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .filter(|arg| arg != "--bench")
        .find_map(|arg| arg.parse::<usize>().ok())
        .unwrap_or(5)
        .max(1);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("scheduler bench: no runtime: {error}");
            std::process::exit(1);
        }
    };
    println!(
        "scheduler: {WORKERS} workers x {GRANTS_PER_WORKER} grants, {KEYS} keys, \
         maxConcurrency {MAX_CONCURRENCY}, {rounds} rounds"
    );
    let (mut fair_samples, mut fifo_samples) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        for round in 0..rounds {
            // Alternating who goes first spreads warm-up and allocator state evenly.
            let (fair_cost, fifo_cost) = if round % 2 == 0 {
                let fair_cost = churn(fair()).await;
                (
                    fair_cost,
                    churn(Arc::new(SemaphoreAdmission::new(MAX_CONCURRENCY))).await,
                )
            } else {
                let fifo_cost = churn(Arc::new(SemaphoreAdmission::new(MAX_CONCURRENCY))).await;
                (churn(fair()).await, fifo_cost)
            };
            println!("round {round}: fair {fair_cost:?} per grant, semaphore {fifo_cost:?}");
            fair_samples.push(fair_cost);
            fifo_samples.push(fifo_cost);
        }
    });
    let fair_median = median(&mut fair_samples);
    let fifo_median = median(&mut fifo_samples);
    println!("fair median: {fair_median:?} per grant");
    println!("semaphore median: {fifo_median:?} per grant");
    println!(
        "ratio fair/semaphore: {:.2}",
        fair_median.as_secs_f64() / fifo_median.as_secs_f64().max(f64::EPSILON)
    );
}
