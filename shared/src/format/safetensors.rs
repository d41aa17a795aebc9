//! `.safetensors` files (Hugging Face's weight format): a JSON header of
//! names, dtypes, shapes and byte ranges, then the raw little-endian data.
//! The `safetensors` crate parses and validates the header; this module
//! maps the file and gives each tensor as the importer reads it.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::gguf::GgmlType;
use super::mlb::Bytes;

/// A tensor's element type, as the importer reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// F32, F16 or BF16: read as GGML reads them.
    Ggml(GgmlType),
    /// F64: narrowed to f32 by the importer.
    F64,
}

/// One tensor of a file.
pub struct View<'a> {
    pub name: String,
    pub element: Element,
    /// Rows first.
    pub shape: Vec<u64>,
    pub bytes: &'a [u8],
}

/// A `.safetensors` file, mapped.
pub struct SafetensorsFile {
    pub path: String,
    map: Bytes,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<SafetensorsFile, String> {
        Ok(SafetensorsFile { path: path.display().to_string(), map: Bytes::map_file(path)? })
    }

    /// A file's bytes in memory (the fuzz target).
    pub fn from_bytes(bytes: Vec<u8>, path: &str) -> SafetensorsFile {
        SafetensorsFile { path: path.to_string(), map: Bytes::Owned(bytes) }
    }

    /// Its tensors, in the header's order; errors name the file.
    pub fn tensors(&self) -> Result<Vec<View<'_>>, String> {
        let path = &self.path;
        let parsed = SafeTensors::deserialize(&self.map).map_err(|e| format!("{path}: not a safetensors file: {e}"))?;
        let mut out = Vec::new();
        for (name, t) in parsed.iter() {
            let element = match t.dtype() {
                Dtype::F32 => Element::Ggml(GgmlType::F32),
                Dtype::F16 => Element::Ggml(GgmlType::F16),
                Dtype::BF16 => Element::Ggml(GgmlType::BF16),
                Dtype::F64 => Element::F64,
                other => return Err(format!("{path}: tensor {name:?} has dtype {other:?}, not F32, F16, BF16 or F64")),
            };
            let shape = t.shape().iter().map(|&d| d as u64).collect();
            out.push(View { name: name.to_string(), element, shape, bytes: t.data() });
        }
        Ok(out)
    }
}
