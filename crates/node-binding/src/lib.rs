//! The napi-rs addon behind the `@prosody-events/prosody` Node.js package.
//!
//! All behaviour lives in the Rust crates; this addon only moves values across the boundary and
//! the package's `index.js` adapts them to JavaScript idioms (classes, `AbortSignal`, error
//! classes). The exported functions and classes are internal to the package: applications use
//! `index.js`.
//!
//! - [`client`]: `NativeClient` wraps [`prosody::ProsodyClient`]; `createClient` builds it from
//!   the JSON text of the options object, parsed by [`prosody::ClientOptions::from_json_value`].
//! - [`handler`]: the [`prosody::api::EventHandler`] that calls the JavaScript handler through
//!   a threadsafe function and awaits the promise it returns.
//! - [`encode`]: the JSON text of an event as JavaScript receives it.
//! - [`context`]: the per-event context requests JavaScript sends back while its handler runs
//!   (timers) and the attempt's keyed-state binder.
//! - [`state`]: keyed-state handles (`context.state()`) and their lazy, chunked scans.
//! - [`admin`]: `NativeAdminClient` wraps [`prosody::AdminClient`].
//! - [`cancel`]: `CancelToken`, the Rust side of an `AbortSignal` given to `send`/`excise`.
//! - [`logging`]: the `tracing` subscriber whose events go to the JavaScript logger.
//! - [`mock_drain`]: mock-mode shutdown waits until the in-process topics are consumed.
//! - [`errors`]: how Rust errors cross to JavaScript with their transient/permanent class.
//! - [`runtime`]: the tokio runtime the addon starts, with one worker fewer than the cores.
#![allow(
    clippy::needless_pass_by_value,
    reason = "napi-derive converts JavaScript arguments into owned values"
)]

/// The addon's Rust allocations go to mimalloc rather than glibc's malloc: glibc's allocator was
/// an eighth of the tokio worker's profile (`_int_free`, `_int_malloc`, `malloc_consolidate`,
/// `unlink_chunk`), and the worker is the busier side of an event's round trip. Node.js bench,
/// Prosody only: 3-7% more records per second in five of six alternations (one tie), peak RSS
/// 232-259 MB against 191-232 MB. mimalloc's `local_dynamic_tls` feature is what lets an addon
/// loaded with `dlopen` use it (without it, loading fails: "cannot allocate memory in static TLS
/// block"). An addon is its own binary, so the choice stays with the package; Rust applications
/// choose their allocator themselves.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod admin;
pub mod cancel;
pub mod client;
pub mod context;
pub mod encode;
pub mod errors;
pub mod handler;
pub mod logging;
pub mod mock_drain;
pub mod runtime;
pub mod state;
