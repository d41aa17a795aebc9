//! Krafla's file formats (docs/FORMAT.md): `.mlb` models and `.mlt`
//! tokenizers, both parsed with one bounds-checked byte reader. Readers
//! validate every count, length, shape and offset before use, so a
//! truncated or hostile file gives a one-line error, never a panic or an
//! allocation larger than the file.

pub mod bytes;
pub mod gguf;
pub mod mlb;
pub mod mlt;
pub mod safetensors;

use std::io::{BufWriter, ErrorKind, Write};
use std::path::Path;

use crate::fault::Fault;

/// Writes a file through `write` into a temporary file beside `path`,
/// synced and then renamed over `path`: a failure leaves nothing
/// half-written. Errors are one line naming `path`.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), Fault> {
    let tmp = path.with_file_name(format!(".{}.tmp", path.file_name().map_or("out".into(), |n| n.to_string_lossy())));
    let written = std::fs::File::create(&tmp).and_then(|file| {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()
    });
    written.and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        let message = format!("{}: cannot write: {e}", path.display());
        match e.kind() {
            // the disk, not the path
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::OutOfMemory => Fault::Resource(message),
            _ => Fault::Input(message),
        }
    })
}
