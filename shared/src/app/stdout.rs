//! Standard output of the applications. A reader that has gone away
//! (`ml_run ... | head -1`) ends the program quietly with exit 0, as `head`
//! expects of the programs it reads; any other write error (a full disk) is
//! a one-line error.

use std::io::{ErrorKind, Write};

/// Writes `bytes` to stdout and flushes them, so a streamed piece shows at once.
pub fn write(bytes: &[u8]) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::BrokenPipe => reader_gone(),
        Err(e) => Err(format!("cannot write to standard output: {e}")),
    }
}

/// Writes `text` and a newline.
pub fn line(text: &str) -> Result<(), String> {
    write(format!("{text}\n").as_bytes())
}

/// The reader of stdout has closed it: nothing more can be shown, and
/// nothing is lost by stopping (files are written before output starts).
fn reader_gone() -> ! {
    std::process::exit(0)
}
