//! State that the layers serving an assignment keep for it, reached from the assignment's
//! [`CancelSignal`](super::CancelSignal), which every attempt borrows.
//!
//! A layer that knows something per assignment (the defer layer: which keys of the partition
//! have deferred work) used to find it per event in a process-wide map by topic and partition,
//! read through an `ArcSwap`: two hash lookups and the swap's locked instructions on every event,
//! on lines both workers share. Attached to the signal, it is one load away, made at the
//! assignment's first event and dropped with the assignment.
//!
//! The consumer knows nothing of what is attached: an attachment is any type, found by the
//! [`AttachmentOwner`] that attached it (each layer instance has its own, so two stacks never
//! read each other's state). A signal has room for a few owners; one stack serves an
//! assignment, so more never compete for it, and an owner that finds no room gets `None` and
//! keeps its state elsewhere.

use std::any::Any;
use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Owners that can attach to one signal.
const SLOTS: usize = 4;

/// Who attached a state: one per layer instance ([`AttachmentOwner::unique`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachmentOwner(u64);

impl AttachmentOwner {
    /// An owner no other has been or will be in this process.
    #[must_use]
    pub fn unique() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

struct Attached {
    owner: AttachmentOwner,
    state: Box<dyn Any + Send + Sync>,
}

/// The states attached to one assignment, each set once.
#[derive(Default)]
pub struct Attachments {
    slots: [OnceLock<Attached>; SLOTS],
}

impl fmt::Debug for Attachments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attached = self
            .slots
            .iter()
            .filter(|slot| slot.get().is_some())
            .count();
        f.debug_struct("Attachments")
            .field("attached", &attached)
            .finish()
    }
}

impl Attachments {
    /// The state `owner` attached, when it did and it is a `T`.
    #[must_use]
    pub fn get<T: Any>(&self, owner: AttachmentOwner) -> Option<&T> {
        // Slots fill in order and are never emptied: the first empty one ends the search.
        self.slots
            .iter()
            .map_while(OnceLock::get)
            .find(|attached| attached.owner == owner)
            .and_then(|attached| attached.state.downcast_ref())
    }

    /// The state `owner` attached, attaching `make()` first when it has none; `None` when the
    /// slots are taken by other owners (or `owner` attached a state of another type).
    pub fn get_or_attach<T: Any + Send + Sync>(
        &self,
        owner: AttachmentOwner,
        make: impl FnOnce() -> T,
    ) -> Option<&T> {
        let mut make = Some(make);
        let mut unplaced: Option<Attached> = None;
        for slot in &self.slots {
            if slot.get().is_none() {
                let attached = match unplaced.take() {
                    Some(attached) => attached,
                    None => Attached {
                        owner,
                        state: Box::new(make.take()?()),
                    },
                };
                // Another owner may fill the slot first: then try the next with the same state.
                if let Err(lost) = slot.set(attached) {
                    unplaced = Some(lost);
                }
            }
            if let Some(attached) = slot.get()
                && attached.owner == owner
            {
                return attached.state.downcast_ref();
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn each_owner_finds_its_own_state_once_attached() {
        let attachments = Attachments::default();
        let (first, second) = (AttachmentOwner::unique(), AttachmentOwner::unique());
        assert_ne!(first, second);
        assert_eq!(attachments.get::<u32>(first), None);
        assert_eq!(attachments.get_or_attach(first, || 1_u32), Some(&1));
        assert_eq!(
            attachments.get_or_attach(first, || 9_u32),
            Some(&1),
            "made once"
        );
        assert_eq!(attachments.get_or_attach(second, || 2_u32), Some(&2));
        assert_eq!(attachments.get::<u32>(first), Some(&1));
        assert_eq!(attachments.get::<u32>(second), Some(&2));
        assert_eq!(
            attachments.get::<String>(first),
            None,
            "a state of another type"
        );
    }

    #[test]
    fn an_owner_finds_no_room_once_others_took_every_slot() {
        let attachments = Attachments::default();
        for slot in 0..SLOTS {
            assert!(
                attachments
                    .get_or_attach(AttachmentOwner::unique(), || slot)
                    .is_some()
            );
        }
        let late = AttachmentOwner::unique();
        let mut made = false;
        assert_eq!(
            attachments.get_or_attach(late, || {
                made = true;
                0_usize
            }),
            None
        );
        assert!(!made, "nothing is made without room for it");
        assert_eq!(attachments.get::<usize>(late), None);
    }

    #[test]
    fn owners_racing_for_the_slots_each_get_one() {
        let attachments = Arc::new(Attachments::default());
        let owners: Vec<AttachmentOwner> = (0..SLOTS).map(|_| AttachmentOwner::unique()).collect();
        let threads: Vec<_> = owners
            .iter()
            .enumerate()
            .map(|(index, &owner)| {
                let attachments = attachments.clone();
                std::thread::spawn(move || attachments.get_or_attach(owner, || index).copied())
            })
            .collect();
        for (index, thread) in threads.into_iter().enumerate() {
            assert_eq!(thread.join().expect("no panic"), Some(index));
        }
        for (index, owner) in owners.into_iter().enumerate() {
            assert_eq!(attachments.get::<usize>(owner), Some(&index));
        }
    }
}
