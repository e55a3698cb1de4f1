//! The macros that expand the suite into `#[test]`s. Each lists its trait's cases once; a case
//! missing here would simply not run, so the lists mirror the `pub async fn`s of each module.

/// Expands into `mod <name> { #[test] fn <case>() ... }` for each case given.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($name:ident, $module:ident, $factory:expr, $options:expr; $($case:ident),+ $(,)?) => {
        #[allow(unused_imports)]
        mod $name {
            use super::*;
            $(
                // `cfg_attr` rather than `#[test]`: outside test builds (a doc test) the case
                // is still an ordinary function, so the factory is type-checked there too.
                #[cfg_attr(test, test)]
                #[allow(dead_code)]
                fn $case() {
                    let factory = $crate::conformance::factory($factory);
                    let options: $crate::conformance::Options = $options;
                    $crate::conformance::block_on(
                        $crate::conformance::$module::$case(&factory, &options),
                    );
                }
            )+
        }
    };
}

/// Runs the [`TimerStore`](crate::storage::TimerStore) conformance cases as `timer_store::*`
/// tests. `factory: Fn(ManualClock) -> impl Future<Output = impl TimerStore + 'static>`;
/// optional second argument: [`Options`](crate::conformance::Options).
#[macro_export]
macro_rules! timer_store_conformance {
    ($factory:expr) => {
        $crate::timer_store_conformance!($factory, $crate::conformance::Options::default());
    };
    ($factory:expr, $options:expr) => {
        $crate::__conformance_tests!(timer_store, timer, $factory, $options;
            scheduled_lists_times_ascending_per_key,
            scheduling_the_same_second_twice_keeps_one_timer,
            unschedule_removes_only_that_timer,
            clear_removes_every_timer_of_the_kind_for_the_key,
            clear_and_schedule_replaces_the_keys_timers,
            kinds_coexist_and_stay_separate,
            slab_lists_its_timers_in_order_with_exclusive_end,
            slabs_lists_every_nonempty_slab_up_to_until,
            unscheduled_timers_leave_their_slab,
            times_at_the_extremes_round_trip,
            keys_are_isolated,
            partitions_topics_and_groups_are_isolated,
            model_based_operations_match_the_model,
        );
    };
}

/// Runs the [`DeferStore`](crate::storage::DeferStore) conformance cases as `defer_store::*`
/// tests.
#[macro_export]
macro_rules! defer_store_conformance {
    ($factory:expr) => {
        $crate::defer_store_conformance!($factory, $crate::conformance::Options::default());
    };
    ($factory:expr, $options:expr) => {
        $crate::__conformance_tests!(defer_store, defer, $factory, $options;
            unknown_key_has_nothing_deferred,
            deferred_messages_list_ascending_by_offset,
            deferring_a_message_again_updates_its_retry_count,
            remove_deferred_message_is_idempotent,
            clear_deferred_messages_only_touches_that_key,
            deferred_timers_list_ascending_by_time,
            deferring_a_timer_again_updates_its_retry_count,
            remove_and_clear_deferred_timers,
            messages_and_timers_are_independent,
            partitions_topics_and_groups_are_isolated,
            deferred_keys_lists_the_keys_with_work,
            model_based_operations_match_the_model,
        );
    };
}

/// Runs the [`DedupStore`](crate::storage::DedupStore) conformance cases as `dedup_store::*`
/// tests.
#[macro_export]
macro_rules! dedup_store_conformance {
    ($factory:expr) => {
        $crate::dedup_store_conformance!($factory, $crate::conformance::Options::default());
    };
    ($factory:expr, $options:expr) => {
        $crate::__conformance_tests!(dedup_store, dedup, $factory, $options;
            absent_until_inserted,
            insert_is_idempotent,
            record_expires_exactly_at_its_ttl,
            reinsert_restarts_the_ttl,
            key_id_and_version_all_distinguish,
            partitions_topics_and_groups_are_isolated,
            model_based_operations_match_the_model,
        );
    };
}

/// Runs the [`StateStore`](crate::storage::StateStore) conformance cases as `state_store::*`
/// tests.
#[macro_export]
macro_rules! state_store_conformance {
    ($factory:expr) => {
        $crate::state_store_conformance!($factory, $crate::conformance::Options::default());
    };
    ($factory:expr, $options:expr) => {
        $crate::__conformance_tests!(state_store, state, $factory, $options;
            value_absent_until_put,
            value_put_overwrites_and_delete_removes,
            every_json_shape_round_trips,
            value_expires_exactly_at_its_ttl,
            rewrite_restarts_ttl_and_no_ttl_never_expires,
            map_reads_present_and_absent_entries,
            map_scan_orders_keys_by_bytes_both_directions,
            map_scan_chunks_page_without_gaps_or_repeats,
            map_scan_cursor_need_not_be_present,
            map_entries_expire_individually,
            map_delete_and_clear,
            map_keyset_holds_up_to_the_limit,
            map_keyset_overflow_rejects_the_whole_batch,
            unbounded_map_exceeds_the_largest_keyset_limit,
            deque_absent_until_bounds_set,
            deque_items_at_negative_and_positive_positions,
            deque_scan_chunks_both_directions,
            deque_bounds_drop_items_outside,
            deque_capacity_evicts_the_oldest,
            deque_invalid_writes_reject_the_whole_batch,
            a_rejected_batch_reports_its_earliest_failing_write,
            deque_items_and_bounds_expire,
            deque_clear_removes_everything,
            batch_ops_apply_in_order,
            reapplying_a_batch_is_idempotent,
            empty_batch_is_a_no_op,
            keys_collections_and_namespaces_are_isolated,
            large_values_round_trip,
            model_based_values_match_the_model,
            model_based_maps_match_the_model,
            model_based_deques_match_the_model,
        );
    };
}

/// Runs the [`PublishedStateView`](crate::storage::PublishedStateView) conformance cases as
/// `published_state::*` tests. The factory returns `(impl StateStore, impl PublishedStateView)`
/// over the same data: the suite writes with the first and reads with the second.
#[macro_export]
macro_rules! published_state_conformance {
    ($factory:expr) => {
        $crate::published_state_conformance!($factory, $crate::conformance::Options::default());
    };
    ($factory:expr, $options:expr) => {
        $crate::__conformance_tests!(published_state, published, $factory, $options;
            reads_what_the_subsystem_namespace_holds,
            does_not_see_group_owned_state,
            subsystems_are_isolated,
            scans_page_in_both_directions,
            expired_entries_are_hidden,
            large_values_round_trip,
            model_based_reads_match_the_model,
        );
    };
}
