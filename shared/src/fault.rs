//! Whose fault an error is: the input (a file, an option, a prompt, a
//! request), the machine (memory, disk), or Krafla itself. The one error
//! type of the applications: the CLI's exit code and the server's status
//! follow from it, and the message is one line either way. Errors below
//! `app` are mostly `String`s, which are the input's fault
//! (`From<String>`); the places that can run out of memory or disk, or
//! that check Krafla's own invariants, say so with `Resource` and
//! `Internal`. In the server the request is the input: what fails in the
//! model or the machine while answering it is the server's (500, 503).

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// What the user gave: exit 2, HTTP 400.
    Input(String),
    /// What the machine lacks (memory, disk space): exit 71 (sysexits'
    /// `EX_OSERR`), HTTP 503.
    Resource(String),
    /// A bug in Krafla: exit 70 (`EX_SOFTWARE`), HTTP 500.
    Internal(String),
}

impl Fault {
    pub fn message(&self) -> &str {
        match self {
            Fault::Input(m) | Fault::Resource(m) | Fault::Internal(m) => m,
        }
    }

    /// The same fault with `what: ` before its message.
    pub fn context(self, what: impl fmt::Display) -> Fault {
        let with = |m: String| format!("{what}: {m}");
        match self {
            Fault::Input(m) => Fault::Input(with(m)),
            Fault::Resource(m) => Fault::Resource(with(m)),
            Fault::Internal(m) => Fault::Internal(with(m)),
        }
    }

    /// The process exit code of a command that failed so.
    pub fn exit_code(&self) -> i32 {
        match self {
            Fault::Input(_) => 2,
            Fault::Resource(_) => 71,
            Fault::Internal(_) => 70,
        }
    }

    /// The HTTP status of a request that failed so.
    pub fn http_status(&self) -> u16 {
        match self {
            Fault::Input(_) => 400,
            Fault::Resource(_) => 503,
            Fault::Internal(_) => 500,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// A plain message is the input's fault.
impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault::Input(message)
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Fault {
        Fault::Input(message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_has_its_code_and_status() {
        let faults = [Fault::from("bad"), Fault::Resource("oom".into()), Fault::Internal("bug".into())];
        let codes: Vec<_> = faults.iter().map(|f| (f.exit_code(), f.http_status())).collect();
        assert_eq!(codes, [(2, 400), (71, 503), (70, 500)]);
        let f = Fault::Resource("cannot allocate".into()).context("--ctx 8");
        assert_eq!((f.to_string(), f.exit_code()), ("--ctx 8: cannot allocate".to_string(), 71));
    }
}
