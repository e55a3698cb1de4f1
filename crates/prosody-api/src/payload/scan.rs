//! The fast path of the payload check: one pass over the bytes that decides the documents
//! events are usually made of, and hands everything else to the `serde_json` walk.
//!
//! The walk drives serde's deserializer through visitor calls for every key and value; for a
//! typical 100-byte event that was about 2,000 instructions, an eighth of everything the
//! consumer spends on a record. This scan is a plain loop over the bytes.
//!
//! It answers only when it is sure the walk would accept the document and note the same
//! fields, and gives up (`None`) on anything whose acceptance needs more than the grammar:
//! `\u` escapes (surrogate pairs), numbers with an exponent or very many digits (range),
//! nesting near serde's limit, an `id` number whose text a parsed number would not keep, and
//! every syntax error, so a rejection's reason (with line and column) always comes from
//! `serde_json`. Being unsure costs only the walk it replaces.

use super::{FieldText, KnownFields};

/// The deepest nesting decided here; `serde_json` refuses documents nested 128 deep, and
/// anything deeper than this goes to the walk.
const MAX_DEPTH: u32 = 64;

/// The most digits of a number decided here: a number without an exponent and with fewer than
/// 309 integer digits is below `f64::MAX`, so `serde_json` accepts it.
const MAX_NUMBER_DIGITS: usize = 300;

/// The most digits of an `id` number whose text is its parsed form: up to 19 digits always
/// fit a `u64` (18 after a minus sign, an `i64`), which prints back exactly as written.
const MAX_EXACT_DIGITS: usize = 18;

/// Bytes that end the plain run of a string: the closing quote, an escape, a control
/// character (not allowed raw in JSON strings).
const STRING_SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = true;
        byte += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// The known fields of `text` when it is certainly one JSON document that `serde_json` parses
/// into a `Value`; `None` when the scan cannot tell (the caller then walks it with
/// `serde_json`, which decides and gives the reason for a rejection).
pub(super) fn known_fields(text: &str) -> Option<KnownFields> {
    let mut scanner = Scanner {
        bytes: text.as_bytes(),
        at: 0,
    };
    scanner.skip_whitespace();
    let fields = if scanner.peek()? == b'{' {
        scanner.top_object()?
    } else {
        scanner.value(0)?;
        KnownFields::default()
    };
    scanner.skip_whitespace();
    (scanner.at == scanner.bytes.len()).then_some(fields)
}

/// What a scanned value was, as far as the known fields care; where it was is known to the
/// caller (the scanner's position before and after), so the answer stays in a register.
#[derive(Clone, Copy)]
enum Kind {
    /// A string; `escaped` when its text (between the quotes) differs from its value.
    String { escaped: bool },
    /// A number; `exact` when a parsed number prints back as this same text (an integer of at
    /// most [`MAX_EXACT_DIGITS`] digits).
    Number { exact: bool },
    /// Anything else: `true`, `false`, `null`, an array, an object.
    Other,
}

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// The top level when it is an object: every member checked, `id` and `type` noted (the
    /// last occurrence wins, as in a parsed `Value`).
    fn top_object(&mut self) -> Option<KnownFields> {
        let mut fields = KnownFields::default();
        self.members(|scanner, name| {
            let slot = match name {
                b"id" => &mut fields.id,
                b"type" => &mut fields.event_type,
                _ => {
                    scanner.value(1)?;
                    return Some(());
                }
            };
            let numbers = name == b"id";
            let start = scanner.at;
            *slot = match scanner.value(1)? {
                Kind::String { escaped: false } => Some(within(start + 1, scanner.at - 1)?),
                Kind::Number { exact } if numbers => {
                    // A number the parse would print differently (`1.50`, `-0`, `1e2`): the
                    // walk copies its printed form.
                    exact.then_some(())?;
                    Some(within(start, scanner.at)?)
                }
                // An escaped string's value is not its text: the walk unescapes it.
                Kind::String { escaped: true } => return None,
                Kind::Number { .. } | Kind::Other => None,
            };
            Some(())
        })?;
        Some(fields)
    }

    /// One value at nesting `depth` (0 for the top level).
    fn value(&mut self, depth: u32) -> Option<Kind> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => {
                (depth < MAX_DEPTH).then_some(())?;
                self.members(|scanner, _| scanner.value(depth + 1).map(|_| ()))?;
                Some(Kind::Other)
            }
            b'[' => {
                (depth < MAX_DEPTH).then_some(())?;
                self.elements(depth + 1)?;
                Some(Kind::Other)
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object's members from its `{` through its `}`; `member` scans each value, given the
    /// key's raw text (a key with an escape is never `id` or `type`: the escapes accepted here
    /// stand for characters no such name has).
    fn members(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.items(b'}', |scanner| {
            if scanner.peek()? != b'"' {
                return None;
            }
            let start = scanner.at + 1;
            scanner.string()?;
            let (bytes, end) = (scanner.bytes, scanner.at - 1);
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            member(scanner, &bytes[start..end])
        })
    }

    /// An array's elements from its `[` through its `]`.
    fn elements(&mut self, depth: u32) -> Option<()> {
        self.items(b']', |scanner| scanner.value(depth).map(|_| ()))
    }

    /// Comma-separated items from an opening bracket through the `close` one.
    fn items(&mut self, close: u8, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.at += 1;
        self.skip_whitespace();
        if self.peek()? == close {
            self.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            self.skip_whitespace();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.skip_whitespace();
                }
                byte if byte == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string from its opening quote through its closing one. The text is UTF-8 already
    /// (the caller checked), so only escapes and control characters need a look.
    #[inline]
    fn string(&mut self) -> Option<Kind> {
        self.at += 1;
        let mut escaped = false;
        loop {
            self.at = plain_run_end(self.bytes, self.at);
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(Kind::String { escaped });
                }
                b'\\' => match self.bytes.get(self.at + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                        escaped = true;
                        self.at += 2;
                    }
                    // `\u` (surrogates need pairing) and invalid escapes: the walk decides.
                    _ => return None,
                },
                // A raw control character: invalid, and the walk says where.
                _ => return None,
            }
        }
    }

    /// A number without an exponent: `-`? (`0` | `[1-9][0-9]*`) (`.` `[0-9]+`)?.
    fn number(&mut self) -> Option<Kind> {
        let negative = self.peek()? == b'-';
        if negative {
            self.at += 1;
        }
        let zero = self.peek()? == b'0';
        let integer_digits = match self.peek()? {
            b'0' => {
                self.at += 1;
                // A leading zero followed by a digit is invalid.
                if self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
                    return None;
                }
                1
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        let mut fraction_digits = 0;
        if self.peek() == Some(b'.') {
            self.at += 1;
            fraction_digits = self.digits();
            if fraction_digits == 0 {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E'))
            || integer_digits + fraction_digits > MAX_NUMBER_DIGITS
        {
            return None;
        }
        // `-0` parses to a float and prints as `-0.0`.
        let exact = fraction_digits == 0
            && if negative {
                integer_digits <= MAX_EXACT_DIGITS && !zero
            } else {
                integer_digits <= MAX_EXACT_DIGITS + 1
            };
        Some(Kind::Number { exact })
    }

    fn digits(&mut self) -> usize {
        let from = self.at;
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - from
    }

    fn literal(&mut self, word: &[u8]) -> Option<Kind> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then_some(())?;
        self.at = end;
        Some(Kind::Other)
    }
}

/// The index of the first byte at or after `at` that ends a string's plain run (see
/// [`STRING_SPECIAL`]), or the length of `bytes`. Eight bytes at a time: a typical event is
/// mostly string text, and a byte at a time was most of the scan's cost.
#[inline]
fn plain_run_end(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    while let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let word = u64::from_le_bytes(*chunk);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set in a term when that byte is zero (the first two terms: the
        // quote or the backslash) or below 0x20 (the third). A borrow can also flag a byte
        // above a real one, never below, so the lowest flag is the first special byte.
        let special = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | word.wrapping_sub(ONES * 0x20) & !word)
            & HIGHS;
        if special != 0 {
            return at + (special.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while bytes
        .get(at)
        .is_some_and(|&byte| !STRING_SPECIAL[usize::from(byte)])
    {
        at += 1;
    }
    at
}

/// A span of the payload's text, when its ends fit the span's width.
fn within(start: usize, end: usize) -> Option<FieldText> {
    Some(FieldText::Within {
        start: u32::try_from(start).ok()?,
        end: u32::try_from(end).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::super::check;
    use super::*;

    /// The scan's answer next to the walk's, as resolved text; panics when the scan accepted
    /// what the walk refuses or noted different fields.
    fn agree(text: &str) -> Option<(Option<String>, Option<String>)> {
        let fields = known_fields(text)?;
        let walked = check(text).unwrap_or_else(|error| panic!("{text:?}: walk refused: {error}"));
        assert!(
            serde_json::from_str::<Value>(text).is_ok(),
            "{text:?} does not parse"
        );
        let resolve = |field: &Option<FieldText>| {
            field
                .as_ref()
                .map(|field| field.resolve(text).map(str::to_owned))
        };
        let scanned = (resolve(&fields.id), resolve(&fields.event_type));
        assert_eq!(
            scanned,
            (resolve(&walked.id), resolve(&walked.event_type)),
            "{text:?}"
        );
        Some((scanned.0.flatten(), scanned.1.flatten()))
    }

    #[test]
    fn decides_the_documents_events_are_made_of() {
        let bench = r#"{"type":"bench.event","id":"17","key":"key-3","pad":"xxxxxxxxxxxx"}"#;
        assert_eq!(
            agree(bench),
            Some((Some("17".to_owned()), Some("bench.event".to_owned())))
        );
        for (text, id, event_type) in [
            (r#"{"id":42,"type":"t"}"#, Some("42"), Some("t")),
            (r#"{"id":-42}"#, Some("-42"), None),
            (r#"{"id":0}"#, Some("0"), None),
            (r#"{"id":18446744073709551615}"#, None, None),
            (r#"{"id":"a","id":null}"#, None, None),
            (r#"{"type":3,"id":true}"#, None, None),
            (r#"{"id":{"id":"x"},"type":["t"]}"#, None, None),
            (
                " {\n  \"type\" : \"caf\u{e9}\",\n  \"n\" : [1, -2.5, 0.0, true, false, null, {}, []]\n} ",
                None,
                Some("caf\u{e9}"),
            ),
            (
                r#"{"a\n\"b":"x\ty\\z\/","id":"plain"}"#,
                Some("plain"),
                None,
            ),
            (r#"[1,{"id":"not top level"}]"#, None, None),
            ("\"just a string\"", None, None),
            ("12.75", None, None),
            ("-0", None, None),
        ] {
            // `18446744073709551615` needs 20 digits: the walk prints it, so the scan defers.
            if text.contains("18446744073709551615") {
                assert!(known_fields(text).is_none(), "{text}");
                continue;
            }
            assert_eq!(
                agree(text),
                Some((id.map(str::to_owned), event_type.map(str::to_owned))),
                "{text}"
            );
        }
    }

    #[test]
    fn leaves_the_unusual_and_the_invalid_to_the_walk() {
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        let long_number = format!("[{}]", "9".repeat(301));
        for text in [
            r#""\u00e9""#,
            r#"{"a":"\ud800"}"#,
            "[1e5]",
            "[1E400]",
            r#"{"id":1.5}"#,
            r#"{"id":-0}"#,
            r#"{"id":"a\"b"}"#,
            r#"{"type":"\t"}"#,
            deep.as_str(),
            long_number.as_str(),
            "",
            " ",
            "{",
            r#"{"a":1,}"#,
            "[1,]",
            "{1:2}",
            "01",
            "-",
            "1.",
            ".5",
            "tru",
            "nul",
            "[1] [2]",
            "\"raw\ttab\"",
            "\"unterminated",
            "\u{feff}{}",
        ] {
            assert!(known_fields(text).is_none(), "{text:?}");
        }
        let nested_64 = format!("{}{}", "[".repeat(64), "]".repeat(64));
        assert!(agree(&nested_64).is_some(), "64 deep is decided here");
    }

    proptest! {
        /// The word-at-a-time search finds the same byte as a byte-at-a-time one.
        #[test]
        fn the_plain_run_ends_at_the_first_special_byte(
            bytes in prop::collection::vec(
                prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20, 0x20u8..=0xff, Just(b'x')], 0..40),
            from in 0usize..8,
        ) {
            let from = from.min(bytes.len());
            let expected = bytes[from..]
                .iter()
                .position(|&byte| STRING_SPECIAL[usize::from(byte)])
                .map_or(bytes.len(), |position| from + position);
            prop_assert_eq!(plain_run_end(&bytes, from), expected);
        }
    }

    fn values() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z\"\\\\/\t\n\u{e9}\u{1F600} -]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![Just("id".to_owned()), Just("type".to_owned()), "[a-z]{1,3}"],
                        inner
                    ),
                    0..6
                )
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    proptest! {
        /// Whatever the scan decides, the walk decides the same way with the same fields; and
        /// a generated document the scan gives up on is one with an escape or a number it
        /// leaves to the walk.
        #[test]
        fn never_disagrees_with_the_walk(
            value in values(),
            pretty in any::<bool>(),
            mutation in prop::option::of((any::<prop::sample::Index>(), prop::sample::select(
                b"{}[]\":,0123456789.eE-+ \\ut\n".to_vec()), any::<bool>())),
        ) {
            let mut text = if pretty {
                serde_json::to_string_pretty(&value).expect("serializes")
            } else {
                value.to_string()
            };
            let decided = agree(&text).is_some();
            if !decided {
                let printed_differently = value.get("id").is_some_and(|id| match id {
                    Value::Number(number) => {
                        number.is_f64() || number.to_string().len() > MAX_EXACT_DIGITS + 1
                    }
                    _ => false,
                });
                let exponent = text.as_bytes().windows(2).any(|pair| {
                    pair[0].is_ascii_digit() && matches!(pair[1], b'e' | b'E')
                });
                let escaped_field = ["id", "type"].into_iter().any(|name| {
                    value.get(name).and_then(Value::as_str).is_some_and(|field| {
                        field.chars().any(|c| c == '"' || c == '\\' || c < ' ')
                    })
                });
                prop_assert!(
                    text.contains("\\u") || exponent || printed_differently || escaped_field,
                    "gave up on a plain document: {text}"
                );
            }
            if let Some((at, byte, replace)) = mutation {
                let boundaries: Vec<usize> =
                    text.char_indices().map(|(at, _)| at).chain([text.len()]).collect();
                let at = boundaries[at.index(boundaries.len())];
                if replace && at < text.len() {
                    let end = at + text[at..].chars().next().map_or(0, char::len_utf8);
                    text.replace_range(at..end, &char::from(byte).to_string());
                } else {
                    text.insert(at, char::from(byte));
                }
                agree(&text);
            }
        }
    }
}
