//! Encoder for PostgreSQL's binary COPY format, so bulk writes (millions of token ids) stream in
//! one round trip with no text escaping.

use uuid::Uuid;

const INT2_OID: i32 = 21;
const INT4_OID: i32 = 23;
const FLOAT4_OID: i32 = 700;
const TEXT_OID: i32 = 25;

/// Builds one `COPY ... FROM STDIN (FORMAT binary)` payload.
pub struct CopyWriter {
    buf: Vec<u8>,
}

impl Default for CopyWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl CopyWriter {
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(1 << 16);
        buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
        buf.extend_from_slice(&0i32.to_be_bytes()); // flags
        buf.extend_from_slice(&0i32.to_be_bytes()); // header extension length
        Self { buf }
    }

    pub fn with_capacity(bytes: usize) -> Self {
        let mut w = Self::new();
        w.buf.reserve(bytes);
        w
    }

    pub fn row(&mut self, fields: i16) {
        self.buf.extend_from_slice(&fields.to_be_bytes());
    }

    fn len(&mut self, n: usize) {
        // Field lengths are i32; callers never pass >2 GiB in one field.
        self.buf
            .extend_from_slice(&(n.min(i32::MAX as usize) as i32).to_be_bytes());
    }

    pub fn null(&mut self) {
        self.buf.extend_from_slice(&(-1i32).to_be_bytes());
    }

    pub fn uuid(&mut self, v: Uuid) {
        self.len(16);
        self.buf.extend_from_slice(v.as_bytes());
    }

    pub fn i16(&mut self, v: i16) {
        self.len(2);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.len(4);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn opt_i16(&mut self, v: Option<i16>) {
        match v {
            Some(v) => self.i16(v),
            None => self.null(),
        }
    }

    pub fn opt_i32(&mut self, v: Option<i32>) {
        match v {
            Some(v) => self.i32(v),
            None => self.null(),
        }
    }

    pub fn bool(&mut self, v: bool) {
        self.len(1);
        self.buf.push(u8::from(v));
    }

    pub fn text(&mut self, v: &str) {
        let clean = super::pg_text(v);
        self.len(clean.len());
        self.buf.extend_from_slice(clean.as_bytes());
    }

    pub fn opt_text(&mut self, v: Option<&str>) {
        match v {
            Some(v) => self.text(v),
            None => self.null(),
        }
    }

    /// jsonb: a version byte (1) then the JSON text.
    pub fn jsonb(&mut self, v: &serde_json::Value) {
        let text = serde_json::to_string(&super::pg_json(v)).unwrap_or_else(|_| "null".into());
        self.len(1 + text.len());
        self.buf.push(1);
        self.buf.extend_from_slice(text.as_bytes());
    }

    fn array_header(&mut self, oid: i32, n: usize, elem_len: usize) {
        if n == 0 {
            self.len(12);
            self.buf.extend_from_slice(&0i32.to_be_bytes()); // ndim
            self.buf.extend_from_slice(&0i32.to_be_bytes()); // has nulls
            self.buf.extend_from_slice(&oid.to_be_bytes());
            return;
        }
        self.len(20 + n * (4 + elem_len));
        self.buf.extend_from_slice(&1i32.to_be_bytes()); // ndim
        self.buf.extend_from_slice(&0i32.to_be_bytes()); // has nulls
        self.buf.extend_from_slice(&oid.to_be_bytes());
        self.buf.extend_from_slice(&(n as i32).to_be_bytes()); // dim length
        self.buf.extend_from_slice(&1i32.to_be_bytes()); // lower bound
    }

    /// int4[] from token ids (ids above i32::MAX do not occur in real vocabularies; they wrap).
    pub fn int4_array(&mut self, v: &[u32]) {
        self.array_header(INT4_OID, v.len(), 4);
        self.buf.reserve(v.len() * 8);
        for x in v {
            self.buf.extend_from_slice(&4i32.to_be_bytes());
            self.buf.extend_from_slice(&(*x as i32).to_be_bytes());
        }
    }

    pub fn int2_array(&mut self, v: &[i16]) {
        self.array_header(INT2_OID, v.len(), 2);
        for x in v {
            self.buf.extend_from_slice(&2i32.to_be_bytes());
            self.buf.extend_from_slice(&x.to_be_bytes());
        }
    }

    pub fn float4_array(&mut self, v: &[f32]) {
        self.array_header(FLOAT4_OID, v.len(), 4);
        self.buf.reserve(v.len() * 8);
        for x in v {
            self.buf.extend_from_slice(&4i32.to_be_bytes());
            self.buf.extend_from_slice(&x.to_bits().to_be_bytes());
        }
    }

    pub fn opt_float4_array(&mut self, v: Option<&[f32]>) {
        match v {
            Some(v) => self.float4_array(v),
            None => self.null(),
        }
    }

    pub fn text_array(&mut self, v: &[String]) {
        if v.is_empty() {
            self.array_header(TEXT_OID, 0, 0);
            return;
        }
        let payload: usize = v.iter().map(|s| 4 + s.len()).sum();
        self.len(20 + payload);
        self.buf.extend_from_slice(&1i32.to_be_bytes());
        self.buf.extend_from_slice(&0i32.to_be_bytes());
        self.buf.extend_from_slice(&TEXT_OID.to_be_bytes());
        self.buf.extend_from_slice(&(v.len() as i32).to_be_bytes());
        self.buf.extend_from_slice(&1i32.to_be_bytes());
        for s in v {
            self.buf.extend_from_slice(&(s.len() as i32).to_be_bytes());
            self.buf.extend_from_slice(s.as_bytes());
        }
    }

    /// Finish with the trailer and hand over the bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(&(-1i16).to_be_bytes());
        self.buf
    }
}
