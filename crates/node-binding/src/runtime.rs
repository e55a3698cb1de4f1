//! The addon's tokio runtime: the consumer, the middleware and the producer run on it; the
//! JavaScript handlers run on the Node.js thread.
//!
//! napi-rs's default runtime has one worker per core. The runtime's work per record is small
//! and handed between tasks many times (partition reader, key runner, the call into JavaScript,
//! the answer), so on few cores more workers do not add throughput: they take the record's
//! state from one core's cache to another's at every hand-off and take the core the Node.js
//! thread needs. This runtime leaves that thread a core: one worker fewer than the cores, at
//! least one. `TOKIO_WORKER_THREADS`, tokio's own variable, still decides when it is set.

use std::num::NonZeroUsize;
use std::thread::available_parallelism;

use napi::bindgen_prelude::create_custom_tokio_runtime;

/// Workers when `TOKIO_WORKER_THREADS` is not set: the cores but one, at least one.
fn default_workers(cores: NonZeroUsize) -> usize {
    cores.get().saturating_sub(1).max(1)
}

/// Runs when the addon is loaded, before napi-rs starts its runtime.
#[napi_derive::module_init]
fn init() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        builder.worker_threads(default_workers(
            available_parallelism().unwrap_or(NonZeroUsize::MIN),
        ));
    }
    // Should the build fail, napi-rs builds its default runtime instead; it does so too when
    // this one was shut down with a Node.js environment and another environment starts one.
    if let Ok(runtime) = builder.build() {
        create_custom_tokio_runtime(runtime);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_the_nodejs_thread_a_core() {
        let workers = |cores| default_workers(NonZeroUsize::new(cores).unwrap());
        assert_eq!(workers(1), 1);
        assert_eq!(workers(2), 1);
        assert_eq!(workers(8), 7);
    }
}
