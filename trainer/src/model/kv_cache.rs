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
    /// Per row, the row whose storage it reads its shared prompt from and that prompt's
    /// positions (`(i, 0)`: none; [`BatchKv::push_shared`]).
    pub shared: Vec<(usize, usize)>,
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
///
/// Rows pushed with the tokens they hold and the weights that computed them
/// ([`BatchKv::push_shared`]) that begin with the same tokens under the same weights (every
/// task's system prompt, a group's samples of one prompt) read those positions from one row's
/// storage, their source, rather than each from its own copy: the CPU row kernel then reads the
/// shared prompt from memory once a layer while it stays in the core's cache (Hydragen, Juravsky
/// et al. 2024, and vLLM's cascade attention share such a prefix's reads the same way). Every
/// row still holds its own copy, so removing a source only moves its dependents to another.
/// Copies taken from one prefill (the prefix store's) are equal bit for bit; positions computed
/// apart (a prompt's last token, which the prefix store leaves to compute) hold the same
/// tokens' keys and values up to the prefill's rounding.
#[derive(Debug, Default)]
pub struct BatchKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    lens: Vec<i64>,
    /// The storage dtype when it is not the weights' (`None`: theirs).
    kind: Option<Kind>,
    /// The dtype of the rows pushed (the prefill's), which `row_cache` gives back.
    row_kind: Option<Kind>,
    /// Per row: the tokens and weights tag it was pushed with (`None`: pushed without them,
    /// shares nothing), and its source row and shared positions (`(i, 0)`: reads its own).
    origin: Vec<Option<Origin>>,
    shared: Vec<(usize, usize)>,
}

/// What a row's first positions hold: the keys and values of `tokens` under the weights `tag`
/// names.
#[derive(Debug, Clone)]
struct Origin {
    tokens: std::sync::Arc<Vec<u32>>,
    tag: u64,
}

/// The fewest positions worth reading from another row (fewer are read from the row's own).
pub const MIN_SHARED: usize = 32;

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

    /// Add a row holding the prefill `cache` of `tokens` computed by the weights `tag` names
    /// (a version: rows of other weights never share), reading the positions it shares with a
    /// source row from that row ([`BatchKv`]); returns its index. The source is the row, itself
    /// reading its own storage, whose pushed tokens share the longest prefix with `tokens` (at
    /// least [`MIN_SHARED`]); with none the row is a source for the rows pushed after it.
    /// `tokens` must be the tokens whose keys and values `cache` holds, in order.
    pub fn push_shared(
        &mut self,
        cache: &KvCache,
        tokens: std::sync::Arc<Vec<u32>>,
        tag: u64,
    ) -> Option<usize> {
        let i = self.push(cache)?;
        let len = usize::try_from(self.lens[i]).unwrap_or(0);
        let best = (0..i)
            .filter(|&r| self.shared[r].1 == 0)
            .filter_map(|r| {
                let o = self.origin[r].as_ref().filter(|o| o.tag == tag)?;
                let common = o.tokens.iter().zip(tokens.iter());
                let m = common.take_while(|(a, b)| a == b).count();
                Some((r, m.min(len).min(o.tokens.len())))
            })
            .filter(|&(_, m)| m >= MIN_SHARED)
            .max_by_key(|&(r, m)| (m, std::cmp::Reverse(r)));
        if let Some(src) = best {
            self.shared[i] = src;
        }
        self.origin[i] = Some(Origin { tokens, tag });
        Some(i)
    }

    /// Per row, the row it reads its shared positions from and how many (`(i, 0)`: none).
    pub fn shared(&self) -> &[(usize, usize)] {
        &self.shared
    }

    /// Add a row holding the prefill `cache` (one sequence: [1, kv_heads, T, d] per layer);
    /// returns its index. An empty cache adds nothing and returns `None`. The row shares
    /// nothing ([`BatchKv::push_shared`] says what it holds).
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
        self.origin.push(None);
        self.shared.push((rows as usize, 0));
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

    /// Remove row `i`: the last row moves into its place. Rows that read their shared positions
    /// from row `i` read them from the one of them sharing the most (which reads its own from
    /// then on: every row holds its own copy, and the others share with it at least what they
    /// shared with row `i`).
    pub fn swap_remove(&mut self, i: usize) {
        let last = self.lens.len().saturating_sub(1);
        if i > last || self.lens.is_empty() {
            return;
        }
        let dependents: Vec<usize> = (0..self.lens.len())
            .filter(|&r| r != i && self.shared[r].1 > 0 && self.shared[r].0 == i)
            .collect();
        let heir = dependents
            .iter()
            .copied()
            .max_by_key(|&r| (self.shared[r].1, std::cmp::Reverse(r)));
        if let Some(heir) = heir {
            for &r in &dependents {
                self.shared[r].0 = heir;
            }
            self.shared[heir] = (heir, 0);
        }
        if i != last {
            let n = self.lens[last];
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                let src = t.get(last as i64).narrow(1, 0, n);
                t.get(i as i64).narrow(1, 0, n).copy_(&src);
            }
        }
        self.lens.swap_remove(i);
        self.origin.swap_remove(i);
        self.shared.swap_remove(i);
        // The last row is row i now, for itself and for the rows that read from it.
        for (r, s) in self.shared.iter_mut().enumerate() {
            if s.0 == last || s.1 == 0 {
                s.0 = if s.1 == 0 { r } else { i };
            }
        }
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
            self.origin.clear();
            self.shared.clear();
        }
        self.k = k;
        self.v = v;
    }

    /// The positions the next decode round's rows read from a source row's storage rather than
    /// their own ([`BatchKv::push_shared`]).
    pub fn shared_positions(&self) -> usize {
        self.shared.iter().map(|&(_, m)| m).sum()
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
            shared: self.shared.clone(),
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

    /// `push_shared` points a row at the earlier row (itself reading its own) whose tokens under
    /// the same weights share the longest prefix with its own, when that is at least
    /// `MIN_SHARED`; `swap_remove` keeps every row's source valid through removals of sources,
    /// dependents and the last row: a source always reads its own, holds the shared positions,
    /// and holds the same tokens there (checked after every operation of a long random run).
    #[test]
    fn rows_read_a_shared_prompt_from_one_source_through_removals() {
        use std::sync::Arc;
        let system: Vec<u32> = (0..40).collect();
        let prompt = |task: u32, extra: u32| -> Arc<Vec<u32>> {
            let mut t = system.clone();
            t.extend((0..extra).map(|k| 1000 + task * 100 + k));
            Arc::new(t)
        };
        let row = |n: usize| one_row(Kind::Float, n as i64, 0.5);
        let mut kv = BatchKv::default();
        let a = prompt(1, 10);
        assert_eq!(kv.push_shared(&row(a.len()), a.clone(), 7), Some(0));
        assert_eq!(kv.push_shared(&row(a.len()), a.clone(), 7), Some(1));
        let b = prompt(2, 5);
        assert_eq!(kv.push_shared(&row(b.len()), b.clone(), 7), Some(2));
        assert_eq!(kv.push_shared(&row(b.len()), b.clone(), 8), Some(3));
        let short: Arc<Vec<u32>> = Arc::new(system[..MIN_SHARED - 1].to_vec());
        assert_eq!(kv.push_shared(&row(short.len()), short, 7), Some(4));
        assert_eq!(kv.push(&row(20)), Some(5));
        assert_eq!(
            kv.shared(),
            &[(0, 0), (0, 50), (0, 40), (3, 0), (4, 0), (5, 0)],
            "a sibling shares its whole prompt, another task the system prompt; other weights, \
             fewer than MIN_SHARED tokens and a row pushed without tokens share nothing"
        );
        assert_eq!(kv.shared_positions(), 90);
        // The source leaves: the sibling sharing the most reads its own, the other reads it.
        kv.swap_remove(0);
        assert_eq!(kv.lens(), &[20, 50, 45, 45, 31]);
        assert_eq!(kv.shared(), &[(0, 0), (1, 0), (1, 40), (3, 0), (4, 0)]);
        let at = kv.begin_step(tch::Device::Cpu, Kind::Float);
        assert_eq!(at.shared, kv.shared());

        // A long random run of pushes and removals keeps every source valid.
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut kv = BatchKv::default();
        let mut held: Vec<Arc<Vec<u32>>> = Vec::new();
        for _ in 0..400 {
            if held.len() < 12 && next() % 3 != 0 || held.is_empty() {
                let t = prompt((next() % 4) as u32, (next() % 30) as u32);
                let t = if next() % 5 == 0 {
                    Arc::new(t[..(next() % t.len() as u64) as usize + 1].to_vec())
                } else {
                    t
                };
                kv.push_shared(&row(t.len()), t.clone(), next() % 2)
                    .unwrap();
                held.push(t);
            } else {
                let i = (next() % held.len() as u64) as usize;
                held.swap_remove(i);
                kv.swap_remove(i);
            }
            assert_eq!(kv.rows(), held.len());
            for (i, &(src, m)) in kv.shared().iter().enumerate() {
                if m == 0 {
                    assert_eq!(src, i, "a row reading its own names itself");
                    continue;
                }
                assert!(m >= MIN_SHARED && src < kv.rows() && src != i);
                assert_eq!(kv.shared()[src].1, 0, "a source reads its own");
                assert!(m as i64 <= kv.lens()[src] && m as i64 <= kv.lens()[i]);
                let (o, s) = (&kv.origin[i], &kv.origin[src]);
                let (o, s) = (o.as_ref().unwrap(), s.as_ref().unwrap());
                assert_eq!(o.tag, s.tag, "the same weights");
                assert_eq!(o.tokens[..m], s.tokens[..m], "the same tokens");
                assert_eq!(o.tokens[..], held[i][..], "each row's own tokens");
            }
        }
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
