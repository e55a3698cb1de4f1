//! Stored values of the `state` family: the expiry header followed by JSON (values, map entries,
//! deque items) or by the two ends of a deque's bounds.

use prosody_api::StorageError;
use prosody_api::storage::DequeBounds;
use serde_json::Value;

use crate::error::corrupt;
use crate::ttl;

/// `header | JSON`.
pub fn encode_json(
    operation: &'static str,
    expiry: u64,
    value: &Value,
) -> Result<Vec<u8>, StorageError> {
    let json = serde_json::to_vec(value).map_err(|error| {
        StorageError::invalid_request(operation, format!("value cannot be encoded: {error}"))
    })?;
    Ok(ttl::encode(expiry, &json))
}

/// The JSON of a stored value, or `None` when it has expired at `now`.
pub fn decode_json(
    operation: &'static str,
    stored: &[u8],
    now: u64,
) -> Result<Option<Value>, StorageError> {
    let (expiry, json) = ttl::decode(stored).ok_or_else(|| corrupt(operation, "value header"))?;
    if !ttl::live(expiry, now) {
        return Ok(None);
    }
    serde_json::from_slice(json)
        .map(Some)
        .map_err(|error| corrupt(operation, format!("stored JSON: {error}")))
}

/// True when a stored value (of any kind) is live at `now`.
pub fn is_live(operation: &'static str, stored: &[u8], now: u64) -> Result<bool, StorageError> {
    let (expiry, _) = ttl::decode(stored).ok_or_else(|| corrupt(operation, "value header"))?;
    Ok(ttl::live(expiry, now))
}

/// `header | head | tail`.
pub fn encode_bounds(expiry: u64, bounds: DequeBounds) -> Vec<u8> {
    let mut payload = [0; 16];
    payload[..8].copy_from_slice(&bounds.head.to_be_bytes());
    payload[8..].copy_from_slice(&bounds.tail.to_be_bytes());
    ttl::encode(expiry, &payload)
}

/// Stored bounds, or `None` when they have expired at `now`.
pub fn decode_bounds(
    operation: &'static str,
    stored: &[u8],
    now: u64,
) -> Result<Option<DequeBounds>, StorageError> {
    let (expiry, payload) =
        ttl::decode(stored).ok_or_else(|| corrupt(operation, "deque bounds header"))?;
    let (head, tail) = payload
        .split_first_chunk::<8>()
        .and_then(|(head, rest)| Some((head, <&[u8; 8]>::try_from(rest).ok()?)))
        .ok_or_else(|| corrupt(operation, "deque bounds are not 16 bytes"))?;
    Ok(ttl::live(expiry, now)
        .then(|| DequeBounds::new(i64::from_be_bytes(*head), i64::from_be_bytes(*tail))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_and_bounds_round_trip_and_expire() {
        let stored = encode_json("t", 10, &json!({"a": [1, null]})).unwrap();
        assert_eq!(
            decode_json("t", &stored, 9).unwrap(),
            Some(json!({"a": [1, null]}))
        );
        assert_eq!(decode_json("t", &stored, 10).unwrap(), None);
        let bounds = DequeBounds::new(-3, i64::MAX);
        let stored = encode_bounds(ttl::NEVER, bounds);
        assert_eq!(
            decode_bounds("t", &stored, u64::MAX - 1).unwrap(),
            Some(bounds)
        );
        assert!(decode_bounds("t", &stored[..20], 0).is_err());
    }
}
