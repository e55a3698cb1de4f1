//! An order-preserving binary encoding of composite keys.
//!
//! `RocksDB` orders keys by their bytes, so every listing this crate needs (a key's timers by
//! time, a slab of timers, a map's entries, a deque's positions, a key's deferred offsets) is a
//! range scan only if the byte order of an encoded key equals the logical order of its
//! components, compared left to right. Each component type is encoded so that holds:
//!
//! - **strings** are escaped and terminated: `0x00` becomes `0x00 0xFF` and the string ends with
//!   `0x00 0x01`. Every other byte is copied. The terminator sorts below every escaped or plain
//!   byte, so a string sorts before its extensions (`"ab" < "ab\0" < "abc"`, like Rust `str`
//!   order), and no encoded string is a prefix of another: `"collectio"` and `"collection"`
//!   never share a range. Length prefixes would give prefix-freedom but break the order.
//! - **unsigned integers** are big-endian, so bytes compare like numbers.
//! - **signed integers** are big-endian with the sign bit flipped, which maps
//!   `i64::MIN..=i64::MAX` onto `0..=u64::MAX` monotonically (negative deque positions sort
//!   before positive ones).
//! - **tags** are single bytes that separate kinds of data under one prefix.

use std::fmt;

/// Escape byte and the two bytes that may follow it.
const ESCAPE: u8 = 0x00;
const ESCAPED_ZERO: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

/// Builds an encoded key component by component.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyBuf(Vec<u8>);

impl KeyBuf {
    /// An empty key with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Vec::with_capacity(capacity))
    }

    /// An escaped, terminated string.
    pub fn str(mut self, value: &str) -> Self {
        self.push_str(value);
        self
    }

    /// A big-endian `u64`.
    pub fn u64(mut self, value: u64) -> Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }

    /// A sign-flipped big-endian `i64`.
    pub fn i64(self, value: i64) -> Self {
        self.u64(flip_i64(value))
    }

    /// A sign-flipped big-endian `i32`.
    pub fn i32(mut self, value: i32) -> Self {
        self.0.extend_from_slice(&flip_i32(value).to_be_bytes());
        self
    }

    /// A one-byte tag.
    pub fn tag(mut self, tag: u8) -> Self {
        self.0.push(tag);
        self
    }

    /// Appends an escaped, terminated string in place.
    pub fn push_str(&mut self, value: &str) {
        self.0.reserve(value.len() + 2);
        for &byte in value.as_bytes() {
            if byte == ESCAPE {
                self.0.extend_from_slice(&[ESCAPE, ESCAPED_ZERO]);
            } else {
                self.0.push(byte);
            }
        }
        self.0.extend_from_slice(&[ESCAPE, TERMINATOR]);
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The encoded bytes, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl AsRef<[u8]> for KeyBuf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// The smallest key greater than every key starting with `prefix`: the exclusive upper bound of
/// a prefix scan. `None` when no such key exists (the prefix is all `0xFF`), in which case the
/// scan is unbounded above.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A malformed stored key: the database holds bytes this encoding never writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed stored key: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Reads components back from an encoded key, in the order they were written.
#[derive(Clone, Debug)]
pub struct KeyReader<'a>(&'a [u8]);

impl<'a> KeyReader<'a> {
    /// A reader over `bytes`.
    #[cfg(test)]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// A reader over what follows `prefix` in `key`.
    pub fn after(key: &'a [u8], prefix: &[u8]) -> Result<Self, DecodeError> {
        key.strip_prefix(prefix)
            .map(Self)
            .ok_or(DecodeError("key outside its scan prefix"))
    }

    /// The next string component.
    pub fn str(&mut self) -> Result<String, DecodeError> {
        let mut out = Vec::new();
        let mut index = 0;
        loop {
            match self.0.get(index) {
                None => return Err(DecodeError("unterminated string")),
                Some(&ESCAPE) => match self.0.get(index + 1) {
                    Some(&ESCAPED_ZERO) => {
                        out.push(0);
                        index += 2;
                    }
                    Some(&TERMINATOR) => {
                        self.0 = &self.0[index + 2..];
                        return String::from_utf8(out)
                            .map_err(|_| DecodeError("string is not UTF-8"));
                    }
                    _ => return Err(DecodeError("bad escape in string")),
                },
                Some(&byte) => {
                    out.push(byte);
                    index += 1;
                }
            }
        }
    }

    /// The next `u64` component.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<8>()
            .ok_or(DecodeError("truncated integer"))?;
        self.0 = rest;
        Ok(u64::from_be_bytes(*head))
    }

    /// The next `i64` component.
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        self.u64().map(unflip_i64)
    }

    /// The next tag.
    pub fn tag(&mut self) -> Result<u8, DecodeError> {
        let (&tag, rest) = self.0.split_first().ok_or(DecodeError("missing tag"))?;
        self.0 = rest;
        Ok(tag)
    }

    /// Fails unless every byte was read, so a key of another shape is not misread.
    pub fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

fn flip_i64(value: i64) -> u64 {
    value.cast_unsigned() ^ (1 << 63)
}

fn unflip_i64(value: u64) -> i64 {
    (value ^ (1 << 63)).cast_signed()
}

fn flip_i32(value: i32) -> u32 {
    value.cast_unsigned() ^ (1 << 31)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn encode_str(value: &str) -> Vec<u8> {
        KeyBuf::default().str(value).into_bytes()
    }

    #[test]
    fn strings_round_trip_including_zero_bytes() {
        for value in ["", "a", "\0", "a\0b", "\u{1f389}", "\0\u{1}\u{ff}"] {
            let bytes = encode_str(value);
            let mut reader = KeyReader::new(&bytes);
            assert_eq!(reader.str().unwrap(), value);
            reader.end().unwrap();
        }
    }

    #[test]
    fn a_string_is_never_a_prefix_of_anothers_encoding() {
        let short = encode_str("collectio");
        let long = encode_str("collection");
        assert!(!long.starts_with(&short));
        assert!(short < long);
    }

    #[test]
    fn prefix_end_skips_trailing_max_bytes() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF, 0xFF]), None);
    }

    #[test]
    fn malformed_keys_are_errors_not_panics() {
        assert!(KeyReader::new(b"abc").str().is_err());
        assert!(KeyReader::new(&[b'a', 0, 7]).str().is_err());
        assert!(KeyReader::new(&[1, 2]).u64().is_err());
        assert!(KeyReader::new(&[]).tag().is_err());
        assert!(KeyReader::new(&[1]).end().is_err());
    }

    proptest! {
        #[test]
        fn string_order_is_byte_order(a in ".*", b in ".*") {
            prop_assert_eq!(a.cmp(&b), encode_str(&a).cmp(&encode_str(&b)));
        }

        #[test]
        fn composite_order_is_component_order(
            a in (".{0,4}", any::<i64>(), any::<u64>()),
            b in (".{0,4}", any::<i64>(), any::<u64>()),
        ) {
            let encode = |(s, i, u): &(String, i64, u64)| {
                KeyBuf::default().str(s).i64(*i).u64(*u).into_bytes()
            };
            prop_assert_eq!(a.cmp(&b), encode(&a).cmp(&encode(&b)));
            let bytes = encode(&a);
            let mut reader = KeyReader::new(&bytes);
            prop_assert_eq!(
                (reader.str().unwrap(), reader.i64().unwrap(), reader.u64().unwrap()),
                a.clone()
            );
        }

        #[test]
        fn i32_order_is_numeric(a in any::<i32>(), b in any::<i32>()) {
            let encode = |value| KeyBuf::default().i32(value).into_bytes();
            prop_assert_eq!(a.cmp(&b), encode(a).cmp(&encode(b)));
        }
    }
}
