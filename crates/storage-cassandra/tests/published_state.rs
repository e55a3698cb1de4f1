//! The `PublishedStateView` conformance suite against the real Cassandra
//! (`scripts/services up`). The writer and the reader are two handles over one session; the
//! reader could as well be another client.

mod common;

use prosody_api::conformance::Options;

prosody_api::published_state_conformance!(
    {
        let shared = common::Shared::new();
        move |clock| {
            let shared = shared.clone();
            async move {
                let store = shared.store(clock).await;
                (store.clone(), store)
            }
        }
    },
    Options::default().with_cases(64)
);
