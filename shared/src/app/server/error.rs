//! The error answer in OpenAI's shape: a status, a type, a code, the field
//! at fault and a one-line message.

use serde_json::{json, Value};

use crate::fault::Fault;

/// An error answer in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        let kind = match status {
            401 => "authentication_error",
            404 => "not_found_error",
            500 => "server_error",
            503 => "overloaded_error",
            _ => "invalid_request_error",
        };
        ApiError { status, kind, code, param: None, message: message.into() }
    }

    /// A 400 about one field.
    pub fn field(code: &'static str, param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::new(400, code, message) }
    }

    /// The answer to a request that failed so: 400 when it was the
    /// request's fault, 503 when the machine ran out of something, 500 else.
    pub fn from_fault(f: &Fault) -> ApiError {
        let code = match f {
            Fault::Input(_) => "invalid_value",
            Fault::Resource(_) => "out_of_resources",
            Fault::Internal(_) => "server_error",
        };
        ApiError::new(f.http_status(), code, f.message())
    }

    pub fn to_json(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}
