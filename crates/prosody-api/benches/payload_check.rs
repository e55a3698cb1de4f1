//! Cost of accepting a record's value as a payload: [`Payload::from_json_bytes`] (the fast
//! scan, falling back to the `serde_json` walk) against `serde_json` on its own, parsing into a
//! `Value` (what a consumer that wants a tree pays) and into `IgnoredAny` (serde's cheapest
//! pass, which skips numbers without range-checking them, so it is a floor rather than the
//! same check). Ours also copies the bytes, as the consumer does: a payload owns its text.
//!
//! Each document is checked `ITERATIONS` times per subject per round; the subjects alternate
//! over several rounds and the summary prints each median per document and its ratio to ours.
//!
//! Run: `cargo bench -p prosody-api --bench payload_check [-- ROUNDS]` (default 5 rounds).

use std::hint::black_box;
use std::time::{Duration, Instant};

use prosody_api::Payload;
use serde::de::IgnoredAny;
use serde_json::Value;

const ITERATIONS: u32 = 200_000;

type Subject = (&'static str, fn(&[u8]) -> bool);

const SUBJECTS: [Subject; 3] = [
    ("payload", |bytes| {
        Payload::from_json_bytes(bytes.to_vec()).is_ok()
    }),
    ("serde value", |bytes| {
        serde_json::from_slice::<Value>(bytes).is_ok()
    }),
    ("serde ignored", |bytes| {
        serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
    }),
];

/// The documents: the throughput bench's record value, a larger nested event, an escaped one.
fn documents() -> Vec<(&'static str, Vec<u8>)> {
    let bench = br#"{"type":"bench.event","id":"123456","key":"key-4242","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
    let nested = serde_json::json!({
        "type": "order.created",
        "id": 981_273_412,
        "customer": {"name": "Ana Müller", "email": "ana@example.com", "tier": 3},
        "lines": (0..8).map(|line| serde_json::json!({
            "sku": format!("SKU-{line:05}"), "quantity": line + 1, "price": 19.99 + f64::from(line),
        })).collect::<Vec<_>>(),
        "note": "leave at the door, ring twice",
    });
    let escaped = br#"{"type":"note","id":"n-1","text":"line one\nline \"two\"\t\u00e9"}"#;
    vec![
        ("bench (100 B)", bench.to_vec()),
        ("nested", nested.to_string().into_bytes()),
        ("escaped", escaped.to_vec()),
    ]
}

fn time(check: fn(&[u8]) -> bool, document: &[u8]) -> Duration {
    let started = Instant::now();
    for _ in 0..ITERATIONS {
        assert!(check(black_box(document)), "the document is JSON");
    }
    started.elapsed() / ITERATIONS
}

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|argument| argument.parse::<usize>().ok())
        .unwrap_or(5);
    for (name, document) in documents() {
        let mut timings: Vec<Vec<Duration>> = vec![Vec::new(); SUBJECTS.len()];
        for _ in 0..rounds {
            for ((_, check), timings) in SUBJECTS.iter().zip(&mut timings) {
                timings.push(time(*check, &document));
            }
        }
        let medians: Vec<Duration> = timings
            .iter_mut()
            .map(|timings| {
                timings.sort();
                timings[timings.len() / 2]
            })
            .collect();
        println!("{name} ({} bytes):", document.len());
        for ((subject, _), median) in SUBJECTS.iter().zip(&medians) {
            println!(
                "  {subject:<14} median {:>6} ns per document ({:.2}x ours)",
                median.as_nanos(),
                median.as_secs_f64() / medians[0].as_secs_f64()
            );
        }
    }
}
