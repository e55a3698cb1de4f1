//! In-memory implementation of every Prosody storage trait, used by mock mode and unit tests.
