//! [`Payload`]: a record's JSON value, kept as the text that arrived and parsed into a
//! [`Value`] only when something reads it.
//!
//! Most events never need their payload as a tree: a no-op or forwarding handler, the Node.js
//! binding (which hands the text to `JSON.parse`) and the failure topic (which forwards the
//! bytes) all use the text. Building a `serde_json::Value` costs an allocation per string and
//! map node, and dropping it as much again, so a consumer that built one for every record spent
//! a fifth of its time on trees nobody looked at. The record is still checked to be JSON when it
//! is read, so a bad value is rejected and routed as before, never discovered later by a handler.
//!
//! The check walks the document through the same `serde_json` deserializer calls a `Value` is
//! built with (numbers parsed and range-checked, strings unescaped, the same nesting limit),
//! only without keeping anything; so a payload that passed it parses into a `Value` later.
//! (`serde::de::IgnoredAny` would be cheaper but is not the same check: it skips numbers without
//! range-checking them, so `1e400` would pass and then fail to parse.)
//! On the way it notes the two top-level fields Prosody itself reads, `id` (deduplication) and
//! `type` (the `allowedEvents` filter), so reading them does not parse the tree either.
//!
//! Most documents never reach that walk: [`scan`] decides the usual ones in one pass over the
//! bytes and leaves only the unusual (and the invalid, whose reason `serde_json` gives) to it.

mod scan;

use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

/// A record's JSON value: its text, checked to be JSON, and the [`Value`] parsed from it on
/// first use. Dereferences to the `Value`, so `payload["field"]` and `payload.get("field")`
/// work as on a `Value`; [`Payload::json`] gives the text without parsing.
#[derive(Clone)]
pub struct Payload {
    text: Box<str>,
    fields: KnownFields,
    // Boxed: a message is moved several times on its way to the handler, and most are never
    // parsed, so the tree's slot is kept to a pointer.
    value: OnceLock<Box<Value>>,
}

/// The top-level fields Prosody reads from a payload, noted while the text is checked.
#[derive(Clone, Debug, Default)]
struct KnownFields {
    id: Option<FieldText>,
    event_type: Option<FieldText>,
}

/// Where a known field's text is: a span of the payload's text (a string without escapes, the
/// usual case, which costs no allocation) or a copy (an unescaped string, a number's JSON form).
#[derive(Clone, Debug)]
enum FieldText {
    Within { start: u32, end: u32 },
    Copied(Box<str>),
}

impl FieldText {
    fn resolve<'a>(&'a self, text: &'a str) -> Option<&'a str> {
        match self {
            Self::Within { start, end } => text.get(*start as usize..*end as usize),
            Self::Copied(copy) => Some(copy),
        }
    }
}

/// A value that is not a JSON document, with the bytes given back so nothing is lost (a
/// rejected record's bytes go to the failure topic).
#[derive(Debug)]
pub struct InvalidPayload {
    error: serde_json::Error,
    bytes: Vec<u8>,
}

impl InvalidPayload {
    /// Why the bytes are not JSON (`serde_json`'s message, with line and column).
    #[must_use]
    pub fn error(&self) -> &serde_json::Error {
        &self.error
    }

    /// The reason and the rejected bytes.
    #[must_use]
    pub fn into_parts(self) -> (serde_json::Error, Vec<u8>) {
        (self.error, self.bytes)
    }
}

impl fmt::Display for InvalidPayload {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(formatter)
    }
}

impl std::error::Error for InvalidPayload {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Payload {
    /// Checks that `bytes` are one JSON document (UTF-8, any JSON type, surrounding whitespace
    /// allowed) and keeps them as the payload's text, without building a [`Value`].
    ///
    /// # Errors
    /// [`InvalidPayload`] with `serde_json`'s reason (or the UTF-8 problem) and the bytes.
    pub fn from_json_bytes(bytes: Vec<u8>) -> Result<Self, InvalidPayload> {
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(not_utf8) => {
                let error = de::Error::custom(format_args!(
                    "the value is not UTF-8: {}",
                    not_utf8.utf8_error()
                ));
                return Err(InvalidPayload {
                    error,
                    bytes: not_utf8.into_bytes(),
                });
            }
        };
        match scan::known_fields(&text).map_or_else(|| check(&text), Ok) {
            Ok(fields) => Ok(Self {
                text: text.into_boxed_str(),
                fields,
                value: OnceLock::new(),
            }),
            Err(error) => Err(InvalidPayload {
                error,
                bytes: text.into_bytes(),
            }),
        }
    }

    /// [`Payload::from_json_bytes`] for text.
    ///
    /// # Errors
    /// As for `from_json_bytes`.
    pub fn from_json(text: impl Into<String>) -> Result<Self, InvalidPayload> {
        Self::from_json_bytes(text.into().into_bytes())
    }

    /// The payload's JSON text, as it arrived (or as a `Value` given to [`Payload::from`]
    /// serializes, compactly).
    #[must_use]
    pub fn json(&self) -> &str {
        &self.text
    }

    /// The payload parsed into a [`Value`], parsed on the first call and kept.
    #[must_use]
    pub fn value(&self) -> &Value {
        self.value
            .get_or_init(|| Box::new(parse_checked(&self.text)))
    }

    /// The parsed [`Value`], taken out of the payload.
    #[must_use]
    pub fn into_value(self) -> Value {
        match self.value.into_inner() {
            Some(value) => *value,
            None => parse_checked(&self.text),
        }
    }

    /// The top-level `id` field as text: a string as it is, a number in its JSON form; `None`
    /// when the payload is not an object or its `id` is absent, null, a boolean, an array or an
    /// object. Read without parsing the payload.
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        self.fields.id.as_ref()?.resolve(&self.text)
    }

    /// The top-level `type` field when it is a string. Read without parsing the payload.
    #[must_use]
    pub fn event_type(&self) -> Option<&str> {
        self.fields.event_type.as_ref()?.resolve(&self.text)
    }
}

impl From<Value> for Payload {
    /// A payload holding `value`, with its compact JSON text.
    fn from(value: Value) -> Self {
        let payload = Self::from(&value);
        Self {
            value: OnceLock::from(Box::new(value)),
            ..payload
        }
    }
}

impl From<&Value> for Payload {
    /// A payload with `value`'s compact JSON text, without copying the tree (it is parsed
    /// again only if read): what a producer needs to send it.
    fn from(value: &Value) -> Self {
        Self {
            text: value.to_string().into_boxed_str(),
            fields: KnownFields::of(value),
            value: OnceLock::new(),
        }
    }
}

impl KnownFields {
    fn of(value: &Value) -> Self {
        Self {
            id: match value.get("id") {
                Some(Value::String(id)) => Some(FieldText::Copied(id.as_str().into())),
                Some(Value::Number(id)) => Some(FieldText::Copied(id.to_string().into())),
                _ => None,
            },
            event_type: value
                .get("type")
                .and_then(Value::as_str)
                .map(|event_type| FieldText::Copied(event_type.into())),
        }
    }
}

impl Deref for Payload {
    type Target = Value;

    fn deref(&self) -> &Value {
        self.value()
    }
}

impl PartialEq for Payload {
    /// Payloads are equal when their JSON values are (whitespace and key order aside).
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text || self.value() == other.value()
    }
}

impl PartialEq<Value> for Payload {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_tuple("Payload")
            .field(&self.json())
            .finish()
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.json())
    }
}

impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

/// Accepts every scalar a JSON deserializer reports, producing `$done`.
macro_rules! scalar_visits {
    ($done:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($done)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($done)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($done)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($done)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok($done)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($done)
        }
    };
}

/// Parses text that passed [`check`], which drives the deserializer exactly as building a
/// `Value` does, so this parse cannot fail; `Null` is only there so a broken invariant cannot
/// panic a consumer (the unit tests hold the two in step).
fn parse_checked(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Checks that `text` is one JSON document and notes the known fields of its top level.
fn check(text: &str) -> serde_json::Result<KnownFields> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let fields = TopLevel(Input::of(text)).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(fields)
}

/// The address range of the text being checked, to tell a string borrowed from it (its span
/// can be kept) from one the deserializer unescaped into its scratch buffer.
#[derive(Clone, Copy)]
struct Input {
    start: usize,
    len: usize,
}

impl Input {
    fn of(text: &str) -> Self {
        Self {
            start: text.as_ptr() as usize,
            len: text.len(),
        }
    }

    fn locate(self, part: &str) -> FieldText {
        let offset = (part.as_ptr() as usize).wrapping_sub(self.start);
        let inside = offset <= self.len && part.len() <= self.len - offset;
        match (
            u32::try_from(offset),
            u32::try_from(offset.saturating_add(part.len())),
        ) {
            (Ok(start), Ok(end)) if inside => FieldText::Within { start, end },
            _ => FieldText::Copied(part.into()),
        }
    }
}

/// Visits the document's top level: like [`AnyValue`], but an object's `id` and `type` are
/// noted (the last occurrence wins, as in a parsed `Value`).
struct TopLevel(Input);

impl<'de> DeserializeSeed<'de> for TopLevel {
    type Value = KnownFields;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<KnownFields, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel {
    type Value = KnownFields;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KnownFields, A::Error> {
        let mut fields = KnownFields::default();
        while let Some(name) = map.next_key::<FieldName>()? {
            match name {
                FieldName::Id => {
                    fields.id = map.next_value_seed(KnownField {
                        input: self.0,
                        numbers: true,
                    })?;
                }
                FieldName::Type => {
                    fields.event_type = map.next_value_seed(KnownField {
                        input: self.0,
                        numbers: false,
                    })?;
                }
                FieldName::Other => {
                    map.next_value::<AnyValue>()?;
                }
            }
        }
        Ok(fields)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<KnownFields, A::Error> {
        AnyValue::walk_seq(seq).map(|()| KnownFields::default())
    }

    scalar_visits!(KnownFields::default());
}

/// Any JSON value, walked through the deserializer the way a `Value` is built and dropped.
struct AnyValue;

impl AnyValue {
    fn walk_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<AnyValue>()?.is_some() {}
        Ok(())
    }

    fn walk_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
        while map.next_key::<FieldName>()?.is_some() {
            map.next_value::<AnyValue>()?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for AnyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(AnyValue)
    }
}

impl<'de> Visitor<'de> for AnyValue {
    type Value = AnyValue;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<AnyValue, A::Error> {
        Self::walk_seq(seq).map(|()| AnyValue)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<AnyValue, A::Error> {
        Self::walk_map(map).map(|()| AnyValue)
    }

    scalar_visits!(AnyValue);
}

/// An object key, read as a string the way a `Value`'s map keys are, and classified.
enum FieldName {
    Id,
    Type,
    Other,
}

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(FieldNameVisitor)
    }
}

struct FieldNameVisitor;

impl Visitor<'_> for FieldNameVisitor {
    type Value = FieldName;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<FieldName, E> {
        Ok(match name {
            "id" => FieldName::Id,
            "type" => FieldName::Type,
            _ => FieldName::Other,
        })
    }
}

/// The value of a known top-level field: its text when it is a string, or, with `numbers`,
/// a number's JSON form; `None` for anything else (still walked, so still checked).
struct KnownField {
    input: Input,
    numbers: bool,
}

impl<'de> DeserializeSeed<'de> for KnownField {
    type Value = Option<FieldText>;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<FieldText>, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl KnownField {
    fn number(&self, number: Option<Number>) -> Option<FieldText> {
        number
            .filter(|_| self.numbers)
            .map(|number| FieldText::Copied(number.to_string().into()))
    }
}

impl<'de> Visitor<'de> for KnownField {
    type Value = Option<FieldText>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Some(self.input.locate(text)))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Some(FieldText::Copied(text.into())))
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<Self::Value, E> {
        Ok(self.number(Some(Number::from(number))))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<Self::Value, E> {
        Ok(self.number(Some(Number::from(number))))
    }

    fn visit_f64<E: de::Error>(self, number: f64) -> Result<Self::Value, E> {
        // Not finite: a parsed `Value` holds null there.
        Ok(self.number(Number::from_f64(number)))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        AnyValue::walk_seq(seq).map(|()| None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        AnyValue::walk_map(map).map(|()| None)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Documents at the edges of what `serde_json` accepts into a `Value`.
    fn corpus() -> Vec<String> {
        let mut documents: Vec<String> = [
            r#"{"type":"order.created","id":"o-1","n":1}"#,
            "{}",
            "[]",
            "null",
            "true",
            " 12 ",
            "-0",
            "1e400",
            "-1e400",
            "1e-400",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775809",
            "[1e400]",
            r#"{"a":1e400}"#,
            r#"{"id":1e400}"#,
            r#""\ud800""#,
            r#""\ud83d\ude00""#,
            r#""\u00e9\n\t\\\"""#,
            r#""\x""#,
            "\"tab\there\"",
            r#"{"id":"a","id":"b"}"#,
            r#"{"id":1,"id":null}"#,
            r#"{"type":1}"#,
            r#"{"type":"x","type":"y"}"#,
            r#"{"id":{"id":"nested"},"type":["t"]}"#,
            r#"{"id":1.5}"#,
            r#"{"id":-7}"#,
            r#"{"id":1e2}"#,
            "{1:2}",
            r#"{"a":}"#,
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "NaN",
            "Infinity",
            "[1] [2]",
            "",
            "   ",
            r#"{"unterminated": "x"#,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        for depth in [126, 127, 128, 129, 200] {
            documents.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
            documents.push(format!(
                "{}1{}",
                r#"{"a":"#.repeat(depth),
                "}".repeat(depth)
            ));
        }
        documents
    }

    #[test]
    fn accepts_exactly_what_parses_into_a_value() {
        for document in corpus() {
            let parsed = serde_json::from_str::<Value>(&document);
            let checked = Payload::from_json(document.clone());
            assert_eq!(
                checked.is_ok(),
                parsed.is_ok(),
                "{document:.80}: check {checked:?}, parse {parsed:?}"
            );
            if let (Ok(payload), Ok(value)) = (checked, parsed) {
                assert_eq!(payload.value(), &value, "{document:.80}");
            }
        }
    }

    #[test]
    fn known_fields_match_the_parsed_value() {
        for document in corpus() {
            let Ok(payload) = Payload::from_json(document.clone()) else {
                continue;
            };
            let rebuilt = Payload::from(payload.value().clone());
            assert_eq!(payload.id(), rebuilt.id(), "{document:.80}");
            assert_eq!(payload.event_type(), rebuilt.event_type(), "{document:.80}");
        }
        let payload =
            Payload::from_json(r#"{"type":"a","id":"x","type":"b","id":12}"#).expect("json");
        assert_eq!(payload.event_type(), Some("b"));
        assert_eq!(payload.id(), Some("12"));
        let nested = Payload::from_json(r#"{"id":{"id":"inner"},"type":["t"]}"#).expect("json");
        assert_eq!((nested.id(), nested.event_type()), (None, None));
        assert_eq!(
            Payload::from_json(r#"{"id":1e2}"#).expect("json").id(),
            Some("100.0")
        );
        let plain = Payload::from_json(r#"{"id":"o-1","type":"t"}"#).expect("json");
        assert!(
            matches!(plain.fields.id, Some(FieldText::Within { .. })),
            "a plain string is a span of the text, not a copy: {:?}",
            plain.fields
        );
        let escaped = Payload::from_json(r#"{"id":"a\"b\u00e9","type":"\t"}"#).expect("json");
        assert_eq!(
            (escaped.id(), escaped.event_type()),
            (Some("a\"b\u{e9}"), Some("\t"))
        );
    }

    #[test]
    fn keeps_the_text_and_parses_only_when_read() {
        let text = r#"{ "type" : "x", "n" : [1, 2] }"#;
        let payload = Payload::from_json(text).expect("json");
        assert_eq!(payload.json(), text);
        assert!(
            payload.value.get().is_none(),
            "not parsed before it is read"
        );
        assert_eq!(payload["n"][1], json!(2));
        assert!(payload.value.get().is_some());
        assert_eq!(payload, json!({"type": "x", "n": [1, 2]}));
        assert_eq!(payload, Payload::from(json!({"n": [1, 2], "type": "x"})));
        assert_eq!(payload.to_string(), text);
    }

    #[test]
    fn a_payload_stays_small_to_move() {
        // A message is moved several times between its partition's reader and its handler.
        assert!(size_of::<Payload>() <= 80, "{} bytes", size_of::<Payload>());
    }

    #[test]
    fn rejected_bytes_come_back_with_the_reason() {
        let rejected = Payload::from_json_bytes(b"{not json".to_vec()).expect_err("not json");
        assert!(
            rejected.to_string().contains("line 1 column 2"),
            "{rejected}"
        );
        assert_eq!(rejected.into_parts().1, b"{not json");
        let not_utf8 = Payload::from_json_bytes(vec![b'"', 0xff, b'"']).expect_err("not utf8");
        assert!(not_utf8.to_string().contains("not UTF-8"), "{not_utf8}");
        assert_eq!(not_utf8.into_parts().1, [b'"', 0xff, b'"']);
    }

    #[test]
    fn a_payload_built_from_a_value_serializes_compactly() {
        let payload = Payload::from(json!({"id": 7, "type": "t"}));
        assert_eq!(payload.json(), r#"{"id":7,"type":"t"}"#);
        assert_eq!((payload.id(), payload.event_type()), (Some("7"), Some("t")));
        assert_eq!(payload.into_value(), json!({"id": 7, "type": "t"}));
        let borrowed = json!({"id": "b", "type": "t", "n": [1]});
        let sent = Payload::from(&borrowed);
        assert_eq!(sent.json(), r#"{"id":"b","n":[1],"type":"t"}"#);
        assert_eq!((sent.id(), sent.event_type()), (Some("b"), Some("t")));
        assert!(sent.value.get().is_none(), "the tree is not copied");
        assert_eq!(sent, borrowed);
    }
}
