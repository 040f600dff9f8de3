//! Deserialization helpers for query strings and loose JSON values.
//!
//! Use with `#[serde(default, deserialize_with = "...")]`. Booleans accept
//! pydantic's set (case-insensitive): `true/false`, `1/0`, `yes/no`, `y/n`,
//! `on/off`, `t/f`, as strings, JSON booleans or the integers 0 and 1. A value
//! outside the set fails with "invalid value: ..., expected a boolean", which
//! [`crate::parse`] reports as pydantic's `bool_parsing`.

use std::fmt;

use serde::de::{self, Deserializer, Unexpected, Visitor};

/// Parses a boolean the way pydantic does (see the module docs).
pub fn deserialize_lenient_bool<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<bool, D::Error> {
    deserializer.deserialize_any(LenientBool)
}

/// Like [`deserialize_lenient_bool`], with JSON `null` as `None`.
pub fn deserialize_lenient_opt_bool<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<bool>, D::Error> {
    deserializer.deserialize_option(OptLenientBool)
}

/// Parses pydantic's boolean strings; `None` when `s` is not one of them.
pub fn parse_bool_str(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
        "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
        _ => None,
    }
}

struct LenientBool;

impl<'de> Visitor<'de> for LenientBool {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a boolean")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(E::invalid_value(Unexpected::Signed(v), &self)),
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        parse_bool_str(v).ok_or_else(|| E::invalid_value(Unexpected::Str(v), &self))
    }
}

struct OptLenientBool;

impl<'de> Visitor<'de> for OptLenientBool {
    type Value = Option<bool>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a boolean or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<bool>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<bool>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<bool>, D::Error> {
        deserialize_lenient_bool(d).map(Some)
    }
}

/// A field that may be absent (`None`), `null` (`Some(None)`) or a value
/// (`Some(Some(v))`), for patches where `null` clears a field; use with
/// `#[serde(default, deserialize_with = "double_option")]`.
pub fn double_option<'de, T, D>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    T: serde::Deserialize<'de>,
    D: Deserializer<'de>,
{
    serde::Deserialize::deserialize(deserializer).map(Some)
}
