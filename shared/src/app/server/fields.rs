//! Reading a request body field by field, so that each error names the
//! field: the body as a JSON object, typed and range-checked getters, and
//! the refusal of unknown fields.

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::sampler::SettingRange;

/// Parses a body as a JSON object.
pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(400, "invalid_json", "the request body is empty; send a JSON object"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::new(
            400,
            "invalid_json",
            format!("the request body must be a JSON object, not {}", type_name(&other)),
        )),
        Err(e) => Err(ApiError::new(400, "invalid_json", format!("the request body is not valid JSON: {e}"))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An integer too large for 64 bits (2^64, -2^63 - 1, 1e30): JSON has no
/// limit, and serde_json reads such a number as a float (-2^63 - 1 rounds to
/// -2^63, which as an integer would have fitted). Too large, not "not an
/// integer"; a float with a fraction is not an integer.
pub(super) fn beyond_64_bits(n: &serde_json::Number) -> bool {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    n.as_f64().is_some_and(|x| x.fract() == 0.0 && x.abs() >= TWO_63)
}

pub(super) fn wrong_type(key: &str, want: &str, got: &Value) -> ApiError {
    ApiError::field("invalid_type", key, format!("'{key}' must be {want}, not {}", type_name(got)))
}

pub(super) fn out_of_range(key: &str, range: &str) -> ApiError {
    ApiError::field("invalid_value", key, format!("'{key}' must be {range}"))
}

pub(super) fn unsupported(key: &str, what: &str) -> ApiError {
    ApiError::field("unsupported_value", key, format!("'{key}': {what} is not supported by this server"))
}

/// 400 naming the fields of `obj` in none of the `known` lists (the first
/// by name as the `param`).
pub(super) fn refuse_unknown(obj: &Map<String, Value>, known: &[&[&str]]) -> Result<(), ApiError> {
    let mut unknown: Vec<&str> =
        obj.keys().map(|k| k.as_str()).filter(|k| !known.iter().any(|list| list.contains(k))).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort();
    let names = unknown.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ");
    Err(ApiError::field(
        "unsupported_parameter",
        unknown[0],
        format!("unsupported field{} {names}", if unknown.len() > 1 { "s" } else { "" }),
    ))
}

/// Typed, range-checked access to the fields of a request object (null
/// counts as absent).
pub(super) struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// A sampling setting, checked by the same range as the CLI's option.
    pub(super) fn number(&self, range: &SettingRange) -> Result<Option<f64>, ApiError> {
        let key = range.name;
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => range
                .check(n.as_f64().unwrap_or(f64::NAN))
                .map(Some)
                .map_err(|msg| ApiError::field("invalid_value", key, msg)),
            Some(v) => Err(wrong_type(key, "a number", v)),
        }
    }

    pub(super) fn int(&self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let range = || out_of_range(key, &format!("an integer from {lo} to {hi}"));
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                Some(_) => Err(range()),
                None if n.is_u64() || beyond_64_bits(n) => Err(range()),
                None => Err(wrong_type(key, "an integer", &Value::Number(n.clone()))),
            },
            Some(v) => Err(wrong_type(key, "an integer", v)),
        }
    }

    pub(super) fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(key, "a boolean", v)),
        }
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<&str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "a string", v)),
        }
    }
}
