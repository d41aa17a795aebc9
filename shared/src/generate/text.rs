//! Text out of generated tokens: their bytes turned into deltas of whole
//! UTF-8 characters, cut at the first stop string, holding back anything
//! that could still become one.

/// Turns token bytes into text deltas: whole UTF-8 characters only (bytes
/// that can never be part of a character become U+FFFD; an unfinished
/// character is held back, and dropped if generation ends inside it), cut at
/// the first stop string, and holding back any tail that could be the start
/// of a stop string.
pub struct TextStream {
    stops: Vec<String>,
    pending: Vec<u8>,
    held: String,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: Vec::new(),
            held: String::new(),
        }
    }

    /// Adds bytes; returns the text that is now safe to send and whether a stop string was hit.
    pub fn push(&mut self, bytes: &[u8]) -> (String, bool) {
        self.pending.extend_from_slice(bytes);
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    match e.error_len() {
                        None => {
                            // An incomplete character at the end: keep its bytes for later.
                            self.held.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            let cut = valid + bad;
                            self.held.push_str(&String::from_utf8_lossy(&self.pending[..cut]));
                            self.pending.drain(..cut);
                        }
                    }
                }
            }
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.held.len() + 1))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The rest at the end of generation. The bytes of a character that
    /// generation stopped inside (the token limit fell between its tokens)
    /// are dropped, not shown as U+FFFD: they are not text yet.
    pub fn finish(&mut self) -> String {
        self.pending.clear();
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let mut t = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (s, hit) = t.push(p);
            out.push(s);
            if hit {
                return (out, true, String::new());
            }
        }
        let tail = t.finish();
        (out, false, tail)
    }

    #[test]
    fn utf8_characters_are_never_split() {
        let e = "é".as_bytes(); // 2 bytes
        let (out, hit, tail) = run(&[], &[b"a", &e[..1], &e[1..], b"b"]);
        assert_eq!(out, ["a", "", "é", "b"]);
        assert!(!hit && tail.is_empty());
        // Cut inside a character: its bytes are held back, and never become U+FFFD.
        let (out, _, tail) = run(&[], &[b"x", &e[..1]]);
        assert_eq!(out, ["x", ""]);
        assert_eq!(tail, "");
        let smile = "😀".as_bytes(); // 4 bytes
        let (out, _, tail) = run(&["zz"], &[b"a", &smile[..2], &smile[2..3]]);
        assert_eq!((out, tail.as_str()), (vec!["a".to_string(), String::new(), String::new()], ""));
        // Bytes that are invalid where they stand still become U+FFFD, also before an unfinished character.
        let (out, _, _) = run(&[], &[b"\xff", b"ok"]);
        assert_eq!(out, ["\u{FFFD}", "ok"]);
        let (out, _, tail) = run(&[], &[b"\xf0\x9f!", &smile[..1]]);
        assert_eq!((out, tail.as_str()), (vec!["\u{FFFD}!".to_string(), String::new()], ""));
    }

    #[test]
    fn stop_strings_split_across_tokens_never_leak() {
        let (out, hit, _) = run(&["END"], &[b"hello E", b"N", b"D more"]);
        assert_eq!(out, ["hello ", "", ""]);
        assert!(hit);
        // A false start is released once it cannot be a stop string any more.
        let (out, hit, tail) = run(&["END"], &[b"an E", b"NVY"]);
        assert_eq!(out, ["an ", "ENVY"]);
        assert!(!hit && tail.is_empty());
        // Held text comes out at the end.
        let (out, hit, tail) = run(&["END", "xyz"], &[b"we E"]);
        assert_eq!((out, hit, tail.as_str()), (vec!["we ".to_string()], false, "E"));
        // The earliest of several stops wins, also inside one piece.
        let (out, hit, _) = run(&["b", "a"], &[b"xxabyy"]);
        assert_eq!((out, hit), (vec!["xx".to_string()], true));
        // A multi-byte stop string split inside a character.
        let s = "→!".as_bytes();
        let (out, hit, _) = run(&["→!"], &[b"go", &s[..2], &s[2..]]);
        assert_eq!((out, hit), (vec!["go".to_string(), String::new(), String::new()], true));
    }
}
