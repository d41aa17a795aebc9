//! Release archive writers: `.tar.gz` (ustar + gzip) and `.zip` (deflate),
//! both with one top folder, plus SHA-256 for SHA256SUMS. Small and
//! dependency-light (flate2's pure-Rust backend, crc32fast).

use std::io::Write;

/// One file of an archive: its name inside the top folder, bytes, and
/// whether it is executable (mode 0755 rather than 0644).
pub struct Entry {
    pub name: String,
    pub data: Vec<u8>,
    pub executable: bool,
}

fn octal(field: &mut [u8], value: u64) {
    // NUL-terminated, zero-padded octal, as ustar wants.
    let s = format!("{:0width$o}", value, width = field.len() - 1);
    assert!(s.len() < field.len(), "tar field too small for {value}");
    field[..s.len()].copy_from_slice(s.as_bytes());
    field[s.len()] = 0;
}

fn tar_header(name: &str, size: u64, mode: u32, mtime: u64, typeflag: u8) -> [u8; 512] {
    assert!(name.len() < 100, "tar name too long: {name}");
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], 0); // uid
    octal(&mut h[116..124], 0); // gid
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[148..156].copy_from_slice(b"        "); // checksum counts as spaces while summing
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

/// `top/` and every entry under it, as a gzip-compressed ustar archive.
pub fn tar_gz(top: &str, entries: &[Entry], mtime: u64) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar_header(&format!("{top}/"), 0, 0o755, mtime, b'5'))?;
    for e in entries {
        let mode = if e.executable { 0o755 } else { 0o644 };
        gz.write_all(&tar_header(&format!("{top}/{}", e.name), e.data.len() as u64, mode, mtime, b'0'))?;
        gz.write_all(&e.data)?;
        let pad = (512 - e.data.len() % 512) % 512;
        gz.write_all(&vec![0u8; pad])?;
    }
    gz.write_all(&[0u8; 1024])?; // end of archive: two zero blocks
    gz.finish()
}

/// MS-DOS date and time of a Unix time (UTC), as zip stores it.
fn dos_time(unix: u64) -> (u16, u16) {
    let days = (unix / 86400) as i64;
    let secs = unix % 86400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let year = year.clamp(1980, 2107);
    let date = (((year - 1980) as u16) << 9) | ((month as u16) << 5) | day as u16;
    let time = (((secs / 3600) as u16) << 11) | ((((secs / 60) % 60) as u16) << 5) | ((secs % 60) / 2) as u16;
    (time, date)
}

/// `top/` and every entry under it, as a zip archive (deflate).
pub fn zip(top: &str, entries: &[Entry], mtime: u64) -> std::io::Result<Vec<u8>> {
    let (time, date) = dos_time(mtime);
    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut count: u16 = 0;
    let mut add = |out: &mut Vec<u8>, name: &str, data: &[u8], mode: u32, dir: bool| -> std::io::Result<()> {
        let (method, stored): (u16, Vec<u8>) = if dir {
            (0, Vec::new())
        } else {
            let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
            d.write_all(data)?;
            (8, d.finish()?)
        };
        let crc = crc32fast::hash(data);
        let offset = out.len() as u32;
        let u16le = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
        let u32le = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        // Local file header.
        u32le(out, 0x0403_4b50);
        u16le(out, 20); // version needed: 2.0 (deflate)
        u16le(out, 0x0800); // flags: UTF-8 names
        u16le(out, method);
        u16le(out, time);
        u16le(out, date);
        u32le(out, crc);
        u32le(out, stored.len() as u32);
        u32le(out, data.len() as u32);
        u16le(out, name.len() as u16);
        u16le(out, 0);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&stored);
        // Central directory entry.
        u32le(&mut central, 0x0201_4b50);
        u16le(&mut central, (3 << 8) | 20); // made by: Unix (permissions in the external attributes), 2.0
        u16le(&mut central, 20);
        u16le(&mut central, 0x0800);
        u16le(&mut central, method);
        u16le(&mut central, time);
        u16le(&mut central, date);
        u32le(&mut central, crc);
        u32le(&mut central, stored.len() as u32);
        u32le(&mut central, data.len() as u32);
        u16le(&mut central, name.len() as u16);
        u16le(&mut central, 0); // extra
        u16le(&mut central, 0); // comment
        u16le(&mut central, 0); // disk
        u16le(&mut central, 0); // internal attributes
        u32le(&mut central, (mode << 16) | if dir { 0x10 } else { 0 });
        u32le(&mut central, offset);
        central.extend_from_slice(name.as_bytes());
        count += 1;
        Ok(())
    };
    add(&mut out, &format!("{top}/"), &[], 0o40755, true)?;
    for e in entries {
        let mode = if e.executable { 0o100755 } else { 0o100644 };
        add(&mut out, &format!("{top}/{}", e.name), &e.data, mode, false)?;
    }
    let cd_offset = out.len() as u32;
    let cd_len = central.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // this disk, disk with the central directory
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // comment length
    Ok(out)
}

/// SHA-256 (FIPS 180-4) of `data`, as lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
        0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
        0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
        0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
        0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
        0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
        0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_vectors() {
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            sha256_hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let million_a = vec![b'a'; 1_000_000];
        assert_eq!(sha256_hex(&million_a), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }

    #[test]
    fn dos_dates() {
        // 2026-01-02 03:04:06 UTC
        let (time, date) = dos_time(1_767_323_046);
        assert_eq!(date >> 9, 2026 - 1980);
        assert_eq!((date >> 5) & 0xf, 1);
        assert_eq!(date & 0x1f, 2);
        assert_eq!((time >> 11, (time >> 5) & 0x3f, (time & 0x1f) * 2), (3, 4, 6));
    }

    #[test]
    fn tar_headers_checksum() {
        let h = tar_header("top/file", 5, 0o644, 0, b'0');
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let mut copy = h;
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|&b| u32::from(b)).sum::<u32>());
        assert_eq!(&h[124..136], b"00000000005\0");
    }
}
