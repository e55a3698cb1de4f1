//! Shared machinery: fresh names, the async property runner, large values.

use std::fmt::Debug;
use std::future::Future;
use std::process;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

use crate::key::{ConsumerGroup, Partition, Subsystem, Topic};
use crate::storage::PartitionScope;

/// Shrinking stops after this many steps; a longer search rarely finds a smaller input and
/// would make a failing run on a slow backend take minutes.
const MAX_SHRINK_STEPS: u32 = 512;

pub fn block_on_impl<F: Future>(case: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime for the conformance case")
        .block_on(case)
}

/// A name no earlier case or run has used: process id, wall-clock nanos and a counter. The
/// wall clock is only a uniqueness source here, never a time the store sees.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{count}", process::id())
}

pub fn fresh_group() -> ConsumerGroup {
    ConsumerGroup::new(unique("conformance-group"))
}

pub fn fresh_subsystem() -> Subsystem {
    Subsystem::new(unique("conformance-subsystem"))
}

/// A partition scope of a fresh group.
pub fn fresh_partition() -> PartitionScope {
    PartitionScope {
        group: fresh_group(),
        topic: Topic::new("conformance-topic"),
        partition: Partition(0),
    }
}

/// The same group and topic, another partition; the same partition, another topic; another
/// group: the three neighbours a partition scope must be isolated from.
pub fn neighbours(scope: &PartitionScope) -> [PartitionScope; 3] {
    [
        PartitionScope {
            partition: Partition(scope.partition.0 + 1),
            ..scope.clone()
        },
        PartitionScope {
            topic: Topic::new(format!("{}-other", scope.topic)),
            ..scope.clone()
        },
        PartitionScope {
            group: fresh_group(),
            ..scope.clone()
        },
    ]
}

/// A JSON string value whose encoding is about `bytes` long, with varied content so a backend
/// that compresses or chunks cannot pass by accident.
pub fn large_value(bytes: usize) -> Value {
    let text: String = (0..bytes)
        .map(|index| char::from(b'a' + u8::try_from(index % 26).unwrap_or(0)))
        .collect();
    serde_json::json!({ "blob": text, "len": bytes })
}

/// Runs a model-based property: `options.cases` random inputs, each checked by `test`; on the
/// first failure, shrinks the input and panics with the minimal one.
///
/// proptest's own runner takes a synchronous closure; stores are async, so this drives
/// proptest's value trees directly (same generate/simplify/complicate protocol) inside the
/// case's runtime.
pub async fn check_property<S, F, Fut>(name: &str, cases: u32, strategy: S, mut test: F)
where
    S: Strategy,
    S::Value: Debug,
    F: FnMut(S::Value) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    for case in 0..cases {
        let mut tree = strategy
            .new_tree(&mut runner)
            .unwrap_or_else(|reason| panic!("{name}: cannot generate an input: {reason}"));
        let Err(first) = test(tree.current()).await else {
            continue;
        };
        let mut minimal = (tree.current(), first);
        let mut steps = 0;
        if tree.simplify() {
            while steps < MAX_SHRINK_STEPS {
                steps += 1;
                match test(tree.current()).await {
                    Err(failure) => {
                        minimal = (tree.current(), failure);
                        if !tree.simplify() {
                            break;
                        }
                    }
                    Ok(()) => {
                        if !tree.complicate() {
                            break;
                        }
                    }
                }
            }
        }
        panic!(
            "{name}: property failed on case {} of {cases} (shrunk in {steps} steps)\n\
             minimal input: {:#?}\nfailure: {}",
            case + 1,
            minimal.0,
            minimal.1
        );
    }
}

/// Returns `Err` with both sides when they differ, for use inside a property.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($context:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            return Err(format!(
                "{}\n  store: {:?}\n  model: {:?}",
                format!($($context)+),
                left,
                right
            ));
        }
    }};
}
pub(crate) use ensure_eq;

/// Unwraps a store result inside a property, turning an error into a property failure.
macro_rules! ok_or_fail {
    ($result:expr, $($context:tt)+) => {
        match $result {
            Ok(value) => value,
            Err(error) => return Err(format!("{}: {error}", format!($($context)+))),
        }
    };
}
pub(crate) use ok_or_fail;

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_passing_property_runs_every_case() {
        let runs = Cell::new(0_u32);
        block_on_impl(check_property("count", 300, 0..10_u32, |_| {
            runs.set(runs.get() + 1);
            async { Ok(()) }
        }));
        assert_eq!(runs.get(), 300);
    }

    #[test]
    fn a_failing_property_panics_with_a_shrunk_input() {
        let outcome = std::panic::catch_unwind(|| {
            block_on_impl(check_property(
                "shrink",
                256,
                proptest::collection::vec(0..1000_u32, 0..50),
                |input| async move {
                    if input.iter().any(|&n| n >= 500) {
                        Err("too big".to_owned())
                    } else {
                        Ok(())
                    }
                },
            ));
        });
        let message = *outcome
            .expect_err("the property fails")
            .downcast::<String>()
            .expect("a formatted panic");
        assert!(message.contains("too big"), "{message}");
        assert!(
            message.contains("minimal input: [\n    500,\n]"),
            "{message}"
        );
    }

    #[test]
    fn names_are_unique() {
        assert_ne!(unique("x"), unique("x"));
    }

    #[test]
    fn large_values_encode_to_about_the_requested_size() {
        let bytes = serde_json::to_vec(&large_value(4096)).unwrap().len();
        assert!((4096..4200).contains(&bytes), "{bytes}");
    }
}
