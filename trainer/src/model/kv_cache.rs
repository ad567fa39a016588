//! The caller-owned KV caches of incremental decoding: [`KvCache`], one sequence's keys and
//! values per layer, [B, kv_heads, T, d], grown by each forward step (a prompt's prefill); and
//! [`BatchKv`], the cache of a decoding batch, where every running sequence is a row of one
//! preallocated tensor per layer, written in place a token at a time.

use tch::{Kind, Tensor};

/// One layer's cached keys and values, [B, kv_heads, T, d].
#[derive(Debug, Default)]
pub struct LayerKv {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl LayerKv {
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let k = match &self.k {
            Some(p) => Tensor::cat(&[p, k], 2),
            None => k.shallow_clone(),
        };
        let v = match &self.v {
            Some(p) => Tensor::cat(&[p, v], 2),
            None => v.shallow_clone(),
        };
        self.k = Some(k.shallow_clone());
        self.v = Some(v.shallow_clone());
        (k, v)
    }

    pub fn seq_len(&self) -> i64 {
        self.k.as_ref().map_or(0, |k| k.size()[2])
    }

    /// The same positions seen by `rows` rows: a one-row cache expanded (views, no copy), so
    /// each row's next tokens attend to the shared positions. Under autograd the rows'
    /// gradients of the shared keys and values sum into the one row's.
    pub fn expand_rows(&self, rows: i64) -> Self {
        let grow = |t: &Option<Tensor>| {
            t.as_ref().map(|t| {
                let mut shape = t.size();
                shape[0] = rows;
                t.expand(&shape, false)
            })
        };
        Self {
            k: grow(&self.k),
            v: grow(&self.v),
        }
    }
}

/// The caller-owned KV cache: one entry per layer.
#[derive(Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: (0..n_layers).map(|_| LayerKv::default()).collect(),
        }
    }
    pub fn seq_len(&self) -> i64 {
        self.layers.first().map_or(0, LayerKv::seq_len)
    }

    /// The first `len` positions (views: the cache is not copied; appending to the prefix
    /// allocates anew and leaves this cache unchanged).
    pub fn prefix(&self, len: i64) -> Self {
        let cut = |t: &Option<Tensor>| t.as_ref().map(|t| t.narrow(2, 0, len.min(t.size()[2])));
        Self {
            layers: self
                .layers
                .iter()
                .map(|l| LayerKv {
                    k: cut(&l.k),
                    v: cut(&l.v),
                })
                .collect(),
        }
    }
}

/// Where one decode step of a [`BatchKv`] writes and reads: each row's index and next
/// position, the positions each row's attention reads (its own plus the new one), and the
/// positions a masked view of all rows spans (the longest row's plus the new one), and the
/// round's totals of both ([`BatchKv::round_positions`]).
#[derive(Debug)]
pub struct StepSlots {
    pub rows: Tensor,
    pub pos: Tensor,
    pub lens: Vec<usize>,
    pub span: i64,
    pub positions: (usize, usize),
}

impl StepSlots {
    /// Whether the CPU row kernel (`row_attention`), reading each row's own positions, costs
    /// less than libtorch's kernel over the masked view of every row up to the longest, given
    /// the row kernel's cost per position read against libtorch's as a fraction `(num, den)`
    /// (`row_attention::relative_cost`): it pays when the rows' own positions times that cost
    /// are under rows x span. At 6/5 (up to 1.20x libtorch's per position, BENCHMARKS.md
    /// issue 25 session 41) that is own positions under 5/6 of rows x span.
    pub fn rows_pay(&self, (num, den): (usize, usize)) -> bool {
        let (own, spanned) = self.positions;
        own.saturating_mul(num) < spanned.saturating_mul(den)
    }

    /// The mask of a masked view of all rows, [rows, 1, 1, span]: key j of row i is valid when
    /// j <= len_i (its past plus the new token at slot len_i).
    pub fn mask(&self) -> Tensor {
        let kj = Tensor::arange(self.span, (Kind::Int64, self.pos.device())).unsqueeze(0);
        kj.le_tensor(&self.pos.unsqueeze(1))
            .view([self.lens.len() as i64, 1, 1, self.span])
    }
}

/// The KV cache of a decoding batch: per layer one key and one value tensor [rows, kv_heads,
/// capacity, d], row i holding its sequence's positions `0..len(i)`. A decode step writes every
/// row's new key and value in place and attends over each row's own positions (on the CPU in
/// f32 or bf16 when the lengths differ enough, `row_attention`) or over a masked view of the first
/// `max len + 1` positions of every row (libtorch's kernel), so a round copies no cache whatever
/// the contexts hold (`Qwen3::decode_step`). Rows and capacity grow by doubling (one copy
/// each time) up to what the batch needs and are kept for the next sequences (on CPU with the
/// smoke model, 64 rows of 4,096 positions take 1 GiB); a finished sequence's row is refilled
/// by the last row (`swap_remove`, like `Vec::swap_remove`), so rows stay dense.
///
/// The cache holds its keys and values in the weights' dtype, or in the one
/// [`BatchKv::with_kind`] names (`trainer serve --kv-cache-dtype bf16` under f32 weights: half
/// the bytes a decode round reads, which bound the CPU row kernel on a CPU without AMX;
/// BENCHMARKS.md, issue 25 session 85). Rows are rounded to it as they are written and widened
/// back to the prefill's dtype by [`BatchKv::row_cache`].
#[derive(Debug, Default)]
pub struct BatchKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    lens: Vec<i64>,
    /// The storage dtype when it is not the weights' (`None`: theirs).
    kind: Option<Kind>,
    /// The dtype of the rows pushed (the prefill's), which `row_cache` gives back.
    row_kind: Option<Kind>,
}

impl BatchKv {
    /// An empty cache storing keys and values in `kind` whatever the weights' dtype (`None`:
    /// the weights', as [`BatchKv::default`]).
    pub fn with_kind(kind: Option<Kind>) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    /// The dtype the keys and values are stored in, once anything is allocated.
    pub fn kind(&self) -> Option<Kind> {
        self.k.first().map(Tensor::kind)
    }

    /// Running rows.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    /// Cached positions of each row.
    pub fn lens(&self) -> &[i64] {
        &self.lens
    }

    /// Allocated (rows, positions) per layer.
    pub fn allocated(&self) -> (i64, i64) {
        self.k
            .first()
            .map_or((0, 0), |t| (t.size()[0], t.size()[2]))
    }

    /// Add a row holding the prefill `cache` (one sequence: [1, kv_heads, T, d] per layer);
    /// returns its index. An empty cache adds nothing and returns `None`.
    pub fn push(&mut self, cache: &KvCache) -> Option<usize> {
        let first = cache.layers.first()?.k.as_ref()?;
        let len = first.size()[2];
        let rows = self.lens.len() as i64;
        self.row_kind = Some(first.kind());
        self.reserve_like(first, cache.layers.len(), rows + 1, len + 1);
        for (l, c) in cache.layers.iter().enumerate() {
            let (Some(k), Some(v)) = (&c.k, &c.v) else {
                return None;
            };
            self.k[l].get(rows).narrow(1, 0, len).copy_(&k.get(0));
            self.v[l].get(rows).narrow(1, 0, len).copy_(&v.get(0));
        }
        self.lens.push(len);
        Some(rows as usize)
    }

    /// A copy of row `i`'s cached positions as a one-sequence cache, in the dtype of the rows
    /// pushed (a bf16 cache under f32 weights gives its values widened back to f32).
    pub fn row_cache(&self, i: usize) -> KvCache {
        let n = self.lens.get(i).copied().unwrap_or(0);
        let row = |t: &Tensor| {
            let r = t.narrow(0, i as i64, 1).narrow(2, 0, n);
            Some(match self.row_kind {
                Some(k) if k != r.kind() => r.to_kind(k),
                _ => r.copy(),
            })
        };
        KvCache {
            layers: self
                .k
                .iter()
                .zip(&self.v)
                .map(|(k, v)| LayerKv {
                    k: row(k),
                    v: row(v),
                })
                .collect(),
        }
    }

    /// Remove row `i`: the last row moves into its place.
    pub fn swap_remove(&mut self, i: usize) {
        let last = self.lens.len().saturating_sub(1);
        if i > last || self.lens.is_empty() {
            return;
        }
        if i != last {
            let n = self.lens[last];
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                let src = t.get(last as i64).narrow(1, 0, n);
                t.get(i as i64).narrow(1, 0, n).copy_(&src);
            }
        }
        self.lens.swap_remove(i);
    }

    /// Room for `rows` rows of `positions` positions, allocated like `like` ([1, kv_heads, T,
    /// d]) for `layers` layers; existing rows are copied into a grown allocation, and converted
    /// when `like` has another dtype (weights rebuilt in another dtype while rows are held),
    /// unless the cache names its own dtype.
    fn reserve_like(&mut self, like: &Tensor, layers: usize, rows: i64, positions: i64) {
        let (have_rows, have_pos) = self.allocated();
        let kind = self.kind.unwrap_or(like.kind());
        let same_kind = self.k.first().is_none_or(|t| t.kind() == kind);
        if self.k.len() == layers && rows <= have_rows && positions <= have_pos && same_kind {
            return;
        }
        let grow = |need: i64, have: i64, floor: i64| {
            if need <= have {
                have
            } else {
                (need.max(floor) as u64).next_power_of_two() as i64
            }
        };
        let new_rows = grow(rows, have_rows, 8);
        let new_pos = grow(positions, have_pos, 256);
        let s = like.size();
        let (kv_heads, d) = (s[1], s[3]);
        let opts = (kind, like.device());
        let fresh = |old: Option<&Tensor>| {
            let t = Tensor::zeros([new_rows, kv_heads, new_pos, d], opts);
            if let Some(o) = old {
                let used = self.lens.len() as i64;
                if used > 0 {
                    t.narrow(0, 0, used)
                        .narrow(2, 0, have_pos)
                        .copy_(&o.narrow(0, 0, used));
                }
            }
            t
        };
        let same = self.k.len() == layers;
        let k: Vec<Tensor> = (0..layers)
            .map(|l| fresh(same.then(|| &self.k[l])))
            .collect();
        let v: Vec<Tensor> = (0..layers)
            .map(|l| fresh(same.then(|| &self.v[l])))
            .collect();
        if !same {
            self.lens.clear();
        }
        self.k = k;
        self.v = v;
    }

    /// The cached positions the next decode round's attention needs (each row's past plus its
    /// new token) and what a masked view of every row up to the longest spans (rows x span).
    pub fn round_positions(&self) -> (usize, usize) {
        let lens = self
            .lens
            .iter()
            .map(|&n| usize::try_from(n).unwrap_or(0) + 1);
        let span = lens.clone().max().unwrap_or(1);
        (lens.sum(), span.saturating_mul(self.lens.len()))
    }

    /// Before a decode step of a model holding `kind` weights: room for one more position in
    /// every row, in `kind` or the cache's own dtype (rows cached under weights of another
    /// dtype are converted), and where the step writes and reads (built once for all layers).
    pub(crate) fn begin_step(&mut self, device: tch::Device, kind: Kind) -> StepSlots {
        let kind = self.kind.unwrap_or(kind);
        if let Some(like) = self.k.first().map(|t| t.narrow(0, 0, 1).to_kind(kind)) {
            let need = self.lens.iter().copied().max().unwrap_or(0) + 1;
            let layers = self.k.len();
            self.reserve_like(&like, layers, self.lens.len() as i64, need);
        }
        StepSlots {
            rows: Tensor::arange(self.lens.len() as i64, (Kind::Int64, device)),
            pos: Tensor::from_slice(&self.lens).to_device(device),
            lens: self
                .lens
                .iter()
                .map(|&n| usize::try_from(n + 1).unwrap_or(1))
                .collect(),
            span: self.lens.iter().copied().max().unwrap_or(0) + 1,
            positions: self.round_positions(),
        }
    }

    /// Write layer `l`'s new keys and values ([rows, kv_heads, 1, d]) at each row's next
    /// position (`at`, from `begin_step`), rounded to the cache's dtype, and return views of
    /// the first `at.span` positions of every row (in the cache's dtype).
    pub(crate) fn write(
        &mut self,
        l: usize,
        k: &Tensor,
        v: &Tensor,
        at: &StepSlots,
    ) -> (Tensor, Tensor) {
        let b = self.lens.len() as i64;
        let idx = [Some(&at.rows), None, Some(&at.pos)];
        let kind = self.k[l].kind();
        let _ = self.k[l].index_put_(&idx, &k.squeeze_dim(2).to_kind(kind), false);
        let _ = self.v[l].index_put_(&idx, &v.squeeze_dim(2).to_kind(kind), false);
        (
            self.k[l].narrow(0, 0, b).narrow(2, 0, at.span),
            self.v[l].narrow(0, 0, b).narrow(2, 0, at.span),
        )
    }

    /// Layer `l`'s whole key and value allocations ([capacity rows, kv_heads, capacity, d]).
    pub(crate) fn layer(&self, l: usize) -> Option<(&Tensor, &Tensor)> {
        Some((self.k.get(l)?, self.v.get(l)?))
    }

    /// After a decode step: every row holds one more position.
    pub(crate) fn advance(&mut self) {
        for n in &mut self.lens {
            *n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_row(kind: Kind, len: i64, seed: f64) -> KvCache {
        let t = |s: f64| {
            (Tensor::arange(2 * len * 4, (Kind::Float, tch::Device::Cpu)) * s)
                .view([1, 2, len, 4])
                .to_kind(kind)
        };
        KvCache {
            layers: vec![LayerKv {
                k: Some(t(seed)),
                v: Some(t(-seed)),
            }],
        }
    }

    /// Row 0's keys (`keys`) or values of `kv`, widened, are `want`'s layer 0 to bf16's precision.
    fn row0_matches(kv: &BatchKv, want: &KvCache, keys: bool) -> bool {
        let pick = |l: &LayerKv| {
            if keys { l.k.as_ref() } else { l.v.as_ref() }
                .unwrap()
                .shallow_clone()
        };
        let got = pick(&kv.row_cache(0).layers[0]).to_kind(Kind::Float);
        got.allclose(&pick(&want.layers[0]), 1e-2, 1e-2, false)
    }

    /// A cache of its own dtype (`BatchKv::with_kind`, `--kv-cache-dtype bf16` under f32
    /// weights) stores it whatever the rows pushed and the decode step's weights are, rounds the
    /// step's writes to it, and gives a row back in the prefill's dtype (for the prefix store,
    /// whose entries extend f32 prefills).
    #[test]
    fn a_cache_of_its_own_dtype_keeps_it_and_gives_rows_back_widened() {
        let mut kv = BatchKv::with_kind(Some(Kind::BFloat16));
        assert_eq!(kv.kind(), None);
        let row = one_row(Kind::Float, 3, 0.3);
        kv.push(&row).unwrap();
        assert_eq!(kv.kind(), Some(Kind::BFloat16));
        let back = kv.row_cache(0);
        let k = back.layers[0].k.as_ref().unwrap();
        assert_eq!(k.kind(), Kind::Float);
        let want = row.layers[0].k.as_ref().unwrap();
        let rounded = want.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        assert!(
            k.equal(&rounded),
            "the stored values are bf16's rounding of the row's"
        );
        assert!(
            !k.equal(want),
            "and that rounding moved some (0.3 x n is not all bf16)"
        );
        let at = kv.begin_step(tch::Device::Cpu, Kind::Float);
        let new = Tensor::full([1, 2, 1, 4], 1.0 / 3.0, (Kind::Float, tch::Device::Cpu));
        let (kview, _) = kv.write(0, &new, &new, &at);
        assert_eq!(kview.kind(), Kind::BFloat16);
        kv.advance();
        assert!(kv.k.iter().chain(&kv.v).all(|t| t.kind() == Kind::BFloat16));
        let back = kv.row_cache(0);
        let last = back.layers[0].k.as_ref().unwrap().narrow(2, 3, 1);
        let third = new.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        assert!(
            last.equal(&third),
            "the step's write rounded to bf16: {last}"
        );
        assert!(!last.equal(&new));
    }

    /// Rows cached under f32 weights are converted, not refused, when weights of another dtype
    /// arrive (a policy rebuilt in bf16 while sequences run): the held rows keep their values
    /// (rounded), and a decode step of the new dtype reserves in it.
    #[test]
    fn rows_follow_the_weights_dtype() {
        let mut kv = BatchKv::default();
        kv.push(&one_row(Kind::Float, 3, 0.5)).unwrap();
        assert_eq!(kv.k[0].kind(), Kind::Float);
        kv.push(&one_row(Kind::BFloat16, 5, 0.25)).unwrap();
        assert!(kv.k.iter().chain(&kv.v).all(|t| t.kind() == Kind::BFloat16));
        assert_eq!(kv.lens(), &[3, 5]);
        assert!(row0_matches(&kv, &one_row(Kind::Float, 3, 0.5), true));

        let mut kv = BatchKv::default();
        kv.push(&one_row(Kind::Float, 3, 0.5)).unwrap();
        let at = kv.begin_step(tch::Device::Cpu, Kind::BFloat16);
        assert_eq!(at.span, 4);
        assert!(kv.k.iter().chain(&kv.v).all(|t| t.kind() == Kind::BFloat16));
        assert!(row0_matches(&kv, &one_row(Kind::Float, 3, 0.5), false));
    }
}
