//! `NativeAdminClient`: [`prosody::AdminClient`] for JavaScript (topic creation and deletion).

use napi_derive::napi;
use prosody::AdminClient;

use crate::errors::{ErrorKind, classified};

fn admin_error(error: &prosody::AdminError) -> napi::Error {
    classified(ErrorKind::Admin, error)
}

/// Creates and deletes Kafka topics.
#[napi]
pub struct NativeAdminClient {
    admin: AdminClient,
}

#[napi]
impl NativeAdminClient {
    /// An admin client for `bootstrap_servers` (comma-separated `host:port`).
    ///
    /// # Errors
    /// When librdkafka rejects the configuration.
    #[napi(constructor)]
    pub fn new(bootstrap_servers: String) -> napi::Result<Self> {
        crate::logging::install();
        AdminClient::new(&bootstrap_servers)
            .map(|admin| Self { admin })
            .map_err(|error| admin_error(&error))
    }

    /// Creates a topic and waits until every partition has a leader.
    ///
    /// # Errors
    /// An `admin` error: the topic exists, the counts are invalid, or the cluster is unreachable.
    #[napi]
    pub async fn create_topic(
        &self,
        name: String,
        partitions: i32,
        replication_factor: i32,
    ) -> napi::Result<()> {
        self.admin
            .create_topic(&name, partitions, replication_factor)
            .await
            .map_err(|error| admin_error(&error))
    }

    /// Deletes a topic.
    ///
    /// # Errors
    /// An `admin` error: the topic does not exist, or the cluster is unreachable.
    #[napi]
    pub async fn delete_topic(&self, name: String) -> napi::Result<()> {
        self.admin
            .delete_topic(&name)
            .await
            .map_err(|error| admin_error(&error))
    }
}
