//! `NativeClient`: [`ProsodyClient`] for JavaScript.
//!
//! Options arrive as the JSON text of the JavaScript options object (`JSON.stringify` drops
//! `undefined` members, which is exactly "not given"), and are read by
//! [`ClientOptions::from_json_value`]: unknown options and wrong JSON types are rejected there,
//! naming the option, and [`prosody::Config`] applies the environment fallback, the defaults
//! and the range checks. Nothing is validated twice.

use std::sync::Arc;

use napi::Env;
use napi::bindgen_prelude::{AsyncBlock, AsyncBlockBuilder, Function};
use napi_derive::napi;
use parking_lot::Mutex;
use prosody::api::{ErrorClass, Payload};
use prosody::{ClientOptions, Config, ConsumerState, ProsodyClient, SendOptions};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::cancel::CancelToken;
use crate::errors::{ErrorKind, cancelled, classified, with_class};
use crate::handler::{Batch, Bridge, JsHandler, complete_on_current_runtime};

/// A Prosody client. Created by [`create_client`].
#[napi]
pub struct NativeClient {
    client: ProsodyClient,
    bridge: Arc<Mutex<Option<Arc<Bridge>>>>,
}

fn config_error(error: &prosody::ConfigError) -> napi::Error {
    with_class(ErrorKind::Config, ErrorClass::Permanent, error)
}

fn client_error(error: &prosody::ClientError) -> napi::Error {
    match error {
        prosody::ClientError::Config(config) => config_error(config),
        prosody::ClientError::Producer(_) => classified(ErrorKind::Producer, error),
        // A collection's durable identity disagrees: `PermanentStateError` in JavaScript.
        prosody::ClientError::State(_) => classified(ErrorKind::State, error),
        _ => classified(ErrorKind::Client, error),
    }
}

/// Creates a client from the JSON text of the options object.
///
/// # Errors
/// A `config` error naming the first invalid option, or a `client` error when Kafka (or the
/// mock cluster) cannot be set up.
#[napi]
pub async fn create_client(options: String) -> napi::Result<NativeClient> {
    crate::logging::install();
    let value: Value = serde_json::from_str(&options).map_err(|error| {
        with_class(
            ErrorKind::Config,
            ErrorClass::Permanent,
            &format!("the options must be a JSON object: {error}"),
        )
    })?;
    let options = ClientOptions::from_json_value(value).map_err(|error| config_error(&error))?;
    let config = Config::from_options(options).map_err(|error| config_error(&error))?;
    let client = ProsodyClient::new(config)
        .await
        .map_err(|error| client_error(&error))?;
    Ok(NativeClient {
        client,
        bridge: Arc::new(Mutex::new(None)),
    })
}

/// Runs `operation` unless `cancel` fires first; dropping the operation cancels it.
async fn cancellable<T>(
    what: &str,
    cancel: Option<CancellationToken>,
    operation: impl Future<Output = napi::Result<T>>,
) -> napi::Result<T> {
    match cancel {
        None => operation.await,
        Some(token) => {
            if token.is_cancelled() {
                return Err(cancelled(what));
            }
            tokio::select! {
                result = operation => result,
                () = token.cancelled() => Err(cancelled(what)),
            }
        }
    }
}

#[napi]
impl NativeClient {
    /// The `source-system` header stamped on sent messages.
    #[napi(getter)]
    #[must_use]
    pub fn source_system(&self) -> String {
        self.client.source_system().to_owned()
    }

    /// Sends `payload` (JSON text) to `topic` under `key`; `cancel` aborts the wait.
    ///
    /// # Errors
    /// A `producer` error (classified), `client` after shutdown, or `cancelled`.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn send(
        &self,
        env: Env,
        topic: String,
        key: String,
        payload: String,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<AsyncBlock<()>> {
        let client = self.client.clone();
        let cancel = cancel.map(CancelToken::token);
        AsyncBlockBuilder::new(async move {
            // Checked, not parsed: the producer sends the text as it came from JavaScript.
            let payload = Payload::from_json(payload).map_err(|error| {
                with_class(
                    ErrorKind::Producer,
                    ErrorClass::Permanent,
                    &format!("the payload is not JSON: {error}"),
                )
            })?;
            let options = SendOptions {
                cancel: cancel.clone(),
                ..SendOptions::default()
            };
            cancellable("send", cancel, async {
                client
                    .send_with(&topic, &key, payload, options)
                    .await
                    .map(drop)
                    .map_err(|error| client_error(&error))
            })
            .await
        })
        .build(&env)
    }

    /// Sends an excise record for `key` to `topic`; `cancel` aborts the wait.
    ///
    /// # Errors
    /// As for [`NativeClient::send`].
    #[napi(ts_return_type = "Promise<void>")]
    pub fn excise(
        &self,
        env: Env,
        topic: String,
        key: String,
        cancel: Option<&CancelToken>,
    ) -> napi::Result<AsyncBlock<()>> {
        let client = self.client.clone();
        let cancel = cancel.map(CancelToken::token);
        AsyncBlockBuilder::new(async move {
            cancellable("excise", cancel, async {
                client
                    .excise(&topic, &key)
                    .await
                    .map(drop)
                    .map_err(|error| client_error(&error))
            })
            .await
        })
        .build(&env)
    }

    /// Starts consuming: batches of events go to `deliver(batchJson)` (see [`crate::handler`]);
    /// `abort(id)` aborts the signal of attempt `id`.
    ///
    /// # Errors
    /// A `client` error: already subscribed, no topics, shut down, or Kafka trouble.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn subscribe(
        &self,
        env: Env,
        deliver: Function<'_, String, ()>,
        abort: Function<'_, u32, ()>,
    ) -> napi::Result<AsyncBlock<()>> {
        let batch = Arc::new(Mutex::new(Batch::default()));
        let taken = batch.clone();
        let deliver = deliver
            .build_threadsafe_function::<()>()
            .build_callback(move |_| Ok(taken.lock().take()))?;
        let abort = abort
            .build_threadsafe_function::<u32>()
            .weak::<true>()
            .build()?;
        let bridge = Arc::new(Bridge::new(batch, deliver, abort));
        let client = self.client.clone();
        let slot = self.bridge.clone();
        AsyncBlockBuilder::new(async move {
            complete_on_current_runtime();
            match client.subscribe(JsHandler::new(bridge.clone())).await {
                Ok(()) => {
                    if let Some(previous) = slot.lock().replace(bridge) {
                        previous.release();
                    }
                    Ok(())
                }
                Err(error) => {
                    bridge.release();
                    Err(client_error(&error))
                }
            }
        })
        .build(&env)
    }

    /// Stops consuming; the client can subscribe again.
    ///
    /// # Errors
    /// A `client` error when not subscribed or shut down.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn unsubscribe(&self, env: Env) -> napi::Result<AsyncBlock<()>> {
        let client = self.client.clone();
        let slot = self.bridge.clone();
        AsyncBlockBuilder::new(async move {
            let result = client.unsubscribe().await;
            release(&slot);
            result.map_err(|error| client_error(&error))
        })
        .build(&env)
    }

    /// Shuts the client down; idempotent, concurrent calls await one shutdown.
    ///
    /// # Errors
    /// None today (the Rust client's shutdown cannot fail yet).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn shutdown(&self, env: Env) -> napi::Result<AsyncBlock<()>> {
        let client = self.client.clone();
        let slot = self.bridge.clone();
        AsyncBlockBuilder::new(async move {
            crate::mock_drain::drain(&client).await;
            let result = client.shutdown().await;
            release(&slot);
            result.map_err(|error| client_error(&error))
        })
        .build(&env)
    }

    /// `unconfigured`, `configured`, `running` or `shutdown`.
    #[napi]
    #[must_use]
    pub fn consumer_state(&self) -> String {
        match self.client.consumer_state() {
            ConsumerState::Unconfigured => "unconfigured",
            ConsumerState::Configured => "configured",
            ConsumerState::Running => "running",
            ConsumerState::ShutDown => "shutdown",
        }
        .to_owned()
    }

    /// Partitions assigned to this client now.
    #[napi]
    #[must_use]
    pub fn assigned_partition_count(&self) -> u32 {
        u32::try_from(self.client.assigned_partition_count()).unwrap_or(u32::MAX)
    }

    /// True when a partition made no progress for the stall threshold.
    #[napi]
    #[must_use]
    pub fn is_stalled(&self) -> bool {
        self.client.is_stalled()
    }

    /// The probe server's `host:port` while subscribed, if it runs.
    #[napi]
    #[must_use]
    pub fn probe_address(&self) -> Option<String> {
        self.client
            .probe_address()
            .map(|address| address.to_string())
    }

    /// The bootstrap servers in use (the in-process cluster's in mock mode).
    #[napi(getter)]
    #[must_use]
    pub fn bootstrap_servers(&self) -> String {
        self.client.bootstrap_servers().to_owned()
    }
}

fn release(slot: &Mutex<Option<Arc<Bridge>>>) {
    if let Some(bridge) = slot.lock().take() {
        bridge.release();
    }
}
