//! The one bounds-checked reader both file formats parse with: little-endian
//! integers and floats, length-prefixed UTF-8 strings and counts, each read
//! naming what it reads so that an error says where a file goes wrong.
//! Nothing is read past the end and no count is trusted before it is checked
//! against the bytes that remain, so a hostile file cannot make a reader
//! allocate more than the file's own size.

/// A cursor over a file's bytes.
pub struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        ByteReader { bytes, pos: 0 }
    }

    /// Offset of the next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.pos..]
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {}, only {} left",
                self.pos,
                self.remaining()
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub fn i64(&mut self, what: &str) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    pub fn f32(&mut self, what: &str) -> Result<f32, String> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    pub fn f64(&mut self, what: &str) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// A `u32` length, at most `max`, followed by that many bytes of UTF-8.
    pub fn str(&mut self, max: u32, what: &str) -> Result<&'a str, String> {
        let len = self.u32(what)?;
        self.utf8(len.into(), max.into(), what)
    }

    /// A `u64` length, at most `max`, followed by that many bytes of UTF-8
    /// (GGUF's strings).
    pub fn str64(&mut self, max: u64, what: &str) -> Result<&'a str, String> {
        let len = self.u64(what)?;
        self.utf8(len, max, what)
    }

    /// `len` bytes of UTF-8, if `len` is at most `max`.
    fn utf8(&mut self, len: u64, max: u64, what: &str) -> Result<&'a str, String> {
        if len > max {
            return Err(format!("{what} length {len} exceeds the limit {max}"));
        }
        let bytes = self.take(len as usize, what)?;
        std::str::from_utf8(bytes).map_err(|e| format!("{what} is not valid UTF-8 ({e})"))
    }

    /// A `u64` count, as `count` (GGUF's counts).
    pub fn count64(&mut self, max: u64, entry_bytes: usize, what: &str) -> Result<usize, String> {
        let n = self.u64(what)?;
        self.check_count(n, max, entry_bytes, what)
    }

    /// A `u32` count, at most `max`, of entries that take at least
    /// `entry_bytes` each: checked against the bytes left before anyone
    /// allocates for it.
    pub fn count(&mut self, max: u32, entry_bytes: usize, what: &str) -> Result<usize, String> {
        let n = self.u32(what)?;
        self.check_count(n.into(), max.into(), entry_bytes, what)
    }

    fn check_count(&self, n: u64, max: u64, entry_bytes: usize, what: &str) -> Result<usize, String> {
        if n > max {
            return Err(format!("{what} {n} exceeds the limit {max}"));
        }
        let need = usize::try_from(n).unwrap_or(usize::MAX).saturating_mul(entry_bytes);
        if need > self.remaining() {
            return Err(format!(
                "truncated: {what} {n} needs at least {need} bytes at offset {}, only {} left",
                self.pos,
                self.remaining()
            ));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let bytes = [1, 0, 0, 0, 0xff, 3, 0, 0, 0, b'a', b'b', b'c', 2, 0, 0, 0];
        let mut r = ByteReader::new(&bytes);
        assert_eq!(r.u32("a").unwrap(), 1);
        assert_eq!(r.u8("b").unwrap(), 0xff);
        assert_eq!(r.str(8, "s").unwrap(), "abc");
        assert!(r.count(10, 4, "n").unwrap_err().contains("truncated: n 2 needs at least 8 bytes at offset 16"));
        assert_eq!(r.pos(), 16);
        assert!(r.u8("end").unwrap_err().starts_with("truncated: end needs 1 bytes at offset 16, only 0 left"));
        let mut r = ByteReader::new(&[5, 0, 0, 0, b'x']);
        assert!(r.str(4, "name").unwrap_err().contains("name length 5 exceeds the limit 4"));
        let mut r = ByteReader::new(&[2, 0, 0, 0, 0xc3, 0x28]);
        assert!(r.str(4, "name").unwrap_err().contains("not valid UTF-8"));
        let mut r = ByteReader::new(&[0xff, 0xff, 0xff, 0xff]);
        assert!(r.count(u32::MAX, usize::MAX, "huge").unwrap_err().contains("truncated"));
    }
}
