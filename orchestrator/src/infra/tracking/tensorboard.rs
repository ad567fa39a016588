//! TensorBoard event files, written without TensorFlow: a TFRecord stream (u64 LE length,
//! masked CRC-32C of the length, payload, masked CRC-32C of the payload) of hand-encoded
//! protobuf `Event`s: `wall_time` (1, double), `step` (2, int64), `file_version` (3, string,
//! `brain.Event:2` in the first record) and `summary` (5) with repeated `Summary.Value`
//! (`tag` 1, `simple_value` 2 float). Version 2 matters: TensorBoard then purges data only on
//! a restart marker, never because a step goes back (the follower writes late metrics of
//! earlier steps). One event per step and batch; every batch is written whole and flushed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::TrackingError;
use crate::domain::tracking::{Point, by_step};

/// The Castagnoli polynomial, reflected.
const CRC32C_POLY: u32 = 0x82f6_3b78;

const fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ CRC32C_POLY
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC32C_TABLE: [u32; 256] = crc32c_table();

/// CRC-32C (Castagnoli) of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c = CRC32C_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// TFRecord's masked CRC: rotate right by 15, add a constant.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Append one TFRecord holding `payload` to `out`.
pub fn frame(payload: &[u8], out: &mut Vec<u8>) {
    let len = (payload.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | 2), out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// `Event { wall_time, step, ... }` with the two fields every event carries.
fn event_head(wall_time: f64, step: i64, out: &mut Vec<u8>) {
    out.push(1 << 3 | 1); // wall_time: 64-bit
    out.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        out.push(2 << 3); // step: varint (int64: two's complement, 10 bytes when negative)
        varint(step as u64, out);
    }
}

/// The first record of every event file: `Event { wall_time, file_version: "brain.Event:2" }`.
pub fn encode_file_version(wall_time: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    event_head(wall_time, 0, &mut out);
    bytes_field(3, b"brain.Event:2", &mut out);
    out
}

/// `Event { wall_time, step, summary: Summary { value: [Value { tag, simple_value }, ...] } }`.
pub fn encode_scalars(wall_time: f64, step: i64, values: &[(&str, f32)]) -> Vec<u8> {
    let mut summary = Vec::with_capacity(values.len() * 40);
    let mut value = Vec::with_capacity(64);
    for (tag, x) in values {
        value.clear();
        bytes_field(1, tag.as_bytes(), &mut value);
        value.push(2 << 3 | 5); // simple_value: 32-bit
        value.extend_from_slice(&x.to_le_bytes());
        bytes_field(1, &value, &mut summary);
    }
    let mut out = Vec::with_capacity(summary.len() + 24);
    event_head(wall_time, step, &mut out);
    bytes_field(5, &summary, &mut out);
    out
}

/// This machine's name for the file name (letters, digits, `-`, `.` and `_` only).
fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let h: String = raw
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-._".contains(*c))
        .collect();
    if h.is_empty() { "localhost".into() } else { h }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One event file being appended to.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
}

impl EventWriter {
    /// Create `dir` (and parents) and a new `events.out.tfevents.<secs>.<hostname>` in it
    /// (`.<n>` appended if that name is taken), holding the file-version record.
    pub fn create(dir: &Path) -> Result<Self, TrackingError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TrackingError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let now = now_secs();
        let base = format!("events.out.tfevents.{}.{}", now as u64, hostname());
        let mut n = 0u32;
        let (path, file) = loop {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}.{n}")
            };
            let path = dir.join(name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io(&path)(e)),
            }
        };
        let mut w = Self {
            path,
            file,
            buf: Vec::with_capacity(4096),
        };
        frame(&encode_file_version(now), &mut w.buf);
        w.write_buffered()?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one event with `values` at `step` and flush.
    pub fn write_scalars(
        &mut self,
        step: i64,
        wall_time: f64,
        values: &[(&str, f32)],
    ) -> Result<(), TrackingError> {
        frame(&encode_scalars(wall_time, step, values), &mut self.buf);
        self.write_buffered()
    }

    /// Append `points` (one event per step, in step order) in one write, then flush. Returns
    /// the events written.
    pub fn write_points(&mut self, points: &[Point]) -> Result<usize, TrackingError> {
        let groups = by_step(points);
        let mut values: Vec<(&str, f32)> = Vec::new();
        for (step, wall_ms, ps) in &groups {
            values.clear();
            values.extend(ps.iter().map(|p| (p.tag.as_str(), p.value as f32)));
            frame(
                &encode_scalars(*wall_ms as f64 / 1000.0, *step, &values),
                &mut self.buf,
            );
        }
        self.write_buffered()?;
        Ok(groups.len())
    }

    /// The buffered records to the file, flushed; the buffer is emptied either way (a failed
    /// batch is the caller's to retry, into a new file).
    fn write_buffered(&mut self) -> Result<(), TrackingError> {
        let res = self
            .file
            .write_all(&self.buf)
            .and_then(|()| self.file.flush());
        self.buf.clear();
        res.map_err(|source| TrackingError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_values() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    }

    #[test]
    fn records_are_framed_with_masked_crcs() {
        let mut out = Vec::new();
        frame(b"abc", &mut out);
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(&out[..8], &3u64.to_le_bytes());
        let masked = |c: u32| c.rotate_right(15).wrapping_add(0xa282_ead8);
        assert_eq!(&out[8..12], &masked(crc32c(&out[..8])).to_le_bytes());
        assert_eq!(&out[15..], &masked(crc32c(b"abc")).to_le_bytes());
    }

    #[test]
    fn events_encode_as_protobuf() {
        let v = encode_file_version(1.5);
        assert_eq!(v[0], 0x09);
        assert_eq!(&v[1..9], &1.5f64.to_le_bytes());
        assert_eq!(&v[9..11], &[0x1a, 13]);
        assert_eq!(&v[11..], b"brain.Event:2");
        let e = encode_scalars(2.0, 300, &[("a/b", 0.5)]);
        // wall_time, step 300 = varint ac 02, summary { value { tag "a/b", simple_value 0.5 } }
        let mut want = vec![0x09];
        want.extend_from_slice(&2.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0xac, 0x02, 0x2a, 12, 0x0a, 10, 0x0a, 3]);
        want.extend_from_slice(b"a/b");
        want.push(0x15);
        want.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(e, want);
        let neg = encode_scalars(0.0, -1, &[]);
        assert_eq!(
            neg.len(),
            9 + 1 + 10 + 2,
            "negative int64 is a 10-byte varint"
        );
    }

    #[test]
    fn a_second_writer_in_the_same_second_gets_its_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = EventWriter::create(&dir.path().join("x/y")).unwrap();
        let b = EventWriter::create(&dir.path().join("x/y")).unwrap();
        assert_ne!(a.path(), b.path());
        assert!(
            a.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        );
        let len = std::fs::metadata(a.path()).unwrap().len();
        assert_eq!(len, 12 + 24 + 4, "the file-version record only");
    }
}
