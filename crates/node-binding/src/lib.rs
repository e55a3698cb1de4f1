//! The napi-rs addon behind the `@prosody-events/prosody` Node.js package.
