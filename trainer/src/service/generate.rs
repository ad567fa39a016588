//! Generation for the embedded policy server: one worker thread owns every in-flight sequence
//! (its row of the batch KV cache, sampler and stop state) and advances all of them a token per
//! round in one batched forward (`Qwen3::decode_step`: batched projections and MLPs, per-row
//! RoPE positions, keys and values written in place into the batch cache, masked attention over
//! each row's own positions), taking the policy lock per round so a train
//! step can slip in between tokens. A sample ends at the model's position limit whatever
//! `max_tokens` says, and a forward pass that fails (a libtorch panic, caught) fails only the
//! requests it served. Logprobs are the
//! model's raw log-softmax of the sampled token (vLLM's default `raw_logprobs`), so they equal
//! the trainer's own log-probs of the same tokens. Sampling runs in Rust on a per-sequence
//! seeded generator, so a request with a seed is reproducible whatever else is in flight.

use std::sync::{Arc, Mutex};

use rand::SeedableRng;
use rand::rngs::StdRng;
use tch::{Kind, Tensor};
use tokio::sync::{mpsc, oneshot};

use super::Policy;
use crate::model::{BatchKv, Fwd, KvCache};

/// Sampling and stopping for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub n: usize,
    pub stop: Vec<String>,
    pub seed: Option<u64>,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
    /// vLLM's `repetition_detection` (>= 0.17): end a sample in a verbatim loop.
    pub repetition: Option<RepetitionDetection>,
}

/// A sample ends (finish reason `repetition`, stop reason `repetition_detected`, as vLLM
/// reports it) when its last `p x min_count` generated tokens are `min_count` copies of one
/// `p`-token block, for some `p` in `min_pattern_size..=max_pattern_size`. The prompt does not
/// count. `max_pattern_size` 0 turns it off; `min_pattern_size` 0 means 1 (vLLM's reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct RepetitionDetection {
    pub max_pattern_size: usize,
    #[serde(default)]
    pub min_pattern_size: usize,
    pub min_count: usize,
}

impl RepetitionDetection {
    /// Whether `ids` (the generated tokens so far) now end in such a loop
    /// ([`wire::repetition::loop_len`], the rule the orchestrator reads loops by).
    pub fn hit(&self, ids: &[u32]) -> bool {
        wire::repetition::loop_len(
            ids,
            self.min_pattern_size,
            self.max_pattern_size,
            self.min_count,
        )
        .is_some()
    }
}

/// One finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub text: String,
    /// `stop` (EOS or a stop string), `length` or `repetition`.
    pub finish_reason: &'static str,
    /// The stop string or EOS token id that ended it (`repetition_detected` for a loop).
    pub stop_reason: Option<serde_json::Value>,
}

pub struct GenJob {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub reply: oneshot::Sender<Result<Vec<Sample>, String>>,
}

struct Seq {
    job: usize,
    sample: usize,
    /// The request's prompt (shared by its samples): with `ids`, what the row's cache holds.
    prompt: Arc<Vec<u32>>,
    /// The weights its cache was computed under (`Policy::weights_epoch`); 0 once a round ran
    /// under other weights (a train step between tokens): such a cache is never kept.
    epoch: u64,
    next: Vec<f32>,
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    rng: StdRng,
    /// Tokens it may generate: the model's positions less its prompt.
    room: usize,
    done: Option<Done>,
}

/// How a sample ended.
enum Done {
    /// `stop`, `length` or `repetition`, and the stop string, EOS id or loop note.
    Finished(&'static str, Option<serde_json::Value>),
    /// Its request was dropped (the client left).
    Abort,
    /// The forward pass failed; the request gets this message.
    Failed(String),
}

struct Pending {
    params: GenParams,
    reply: oneshot::Sender<Result<Vec<Sample>, String>>,
    samples: Vec<Option<Sample>>,
}

/// Counters for `/metrics` (running and waiting sequences, tokens generated).
#[derive(Debug, Default)]
pub struct GenStats {
    pub running: std::sync::atomic::AtomicUsize,
    pub waiting: std::sync::atomic::AtomicUsize,
    pub generated_tokens: std::sync::atomic::AtomicU64,
    pub prompt_tokens: std::sync::atomic::AtomicU64,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub prefix_hit_tokens: std::sync::atomic::AtomicU64,
    /// Time in prompt forwards (prefills) and in batched decode rounds, microseconds.
    pub prefill_micros: std::sync::atomic::AtomicU64,
    pub decode_micros: std::sync::atomic::AtomicU64,
    pub decode_rounds: std::sync::atomic::AtomicU64,
    /// Over all decode rounds: the cached positions the rows' attention needs (each row's own
    /// length), and what a masked view of every row up to the longest spans (rows x span).
    pub decode_positions: std::sync::atomic::AtomicU64,
    pub decode_span_positions: std::sync::atomic::AtomicU64,
    /// Of `decode_positions`, those a row reads from another row's storage when the row kernel
    /// runs (a prompt the rows share, `BatchKv::push_shared`).
    pub decode_shared_positions: std::sync::atomic::AtomicU64,
}

/// Finished sequences' keys and values, kept for requests that extend them: a rollout's next
/// turn resends its whole context plus the tool's output, and only the new tokens need a
/// forward (vLLM's automatic prefix caching, kept per sequence rather than per block). An entry
/// serves only the weights that computed it (`Policy::weights_epoch`: a train step retires
/// every entry); the least recently used go first when the token budget is full.
struct PrefixStore {
    budget: usize,
    clock: u64,
    entries: Vec<PrefixEntry>,
}

struct PrefixEntry {
    /// The tokens whose keys and values `cache` holds, in order.
    tokens: Vec<u32>,
    cache: KvCache,
    epoch: u64,
    used_at: u64,
}

/// The shortest prefix worth reusing (shorter ones are computed anew).
const MIN_PREFIX: usize = 16;
/// The most entries kept (a lookup compares the prompt with each under the policy lock).
const MAX_ENTRIES: usize = 256;

impl PrefixStore {
    fn new(budget: usize) -> Self {
        Self {
            budget,
            clock: 0,
            entries: Vec::new(),
        }
    }

    fn used(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    /// The longest cached prefix of `prompt` computed under `epoch`, leaving at least the
    /// prompt's last token to compute (its logits start the sample): the tokens reused and a
    /// cache holding them. Entries of other weights are dropped.
    fn lookup(&mut self, prompt: &[u32], epoch: u64) -> Option<(usize, KvCache)> {
        self.entries.retain(|e| e.epoch == epoch);
        let most = prompt.len().checked_sub(1)?;
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let common = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b);
                (i, common.count().min(most))
            })
            .filter(|&(_, n)| n >= MIN_PREFIX)
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        self.clock += 1;
        self.entries[i].used_at = self.clock;
        Some((n, self.entries[i].cache.prefix(n as i64)))
    }

    /// Keep `cache` (the keys and values of `tokens`) for later requests under `epoch`; an
    /// entry it extends is dropped, and the least recently used make room.
    fn insert(&mut self, tokens: Vec<u32>, cache: KvCache, epoch: u64) {
        let n = tokens.len();
        if n < MIN_PREFIX || n > self.budget || cache.seq_len() != n as i64 {
            return;
        }
        self.entries
            .retain(|e| e.epoch == epoch && !tokens.starts_with(&e.tokens));
        let mut used = self.used();
        while used + n > self.budget || self.entries.len() >= MAX_ENTRIES {
            let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used_at) else {
                break;
            };
            used -= self.entries.swap_remove(lru).tokens.len();
        }
        self.clock += 1;
        self.entries.push(PrefixEntry {
            tokens,
            cache,
            epoch,
            used_at: self.clock,
        });
    }
}

/// Raw log-softmax value of `tok` and a sample under temperature / top-p.
pub fn sample_token(logits: &[f32], temperature: f32, top_p: f32, rng: &mut StdRng) -> (u32, f32) {
    use rand::Rng;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let tok = if temperature <= 0.0 {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i)
    } else {
        let scaled: Vec<f32> = logits.iter().map(|x| (x - max) / temperature).collect();
        let mut probs: Vec<(usize, f32)> = scaled.iter().map(|x| x.exp()).enumerate().collect();
        let total: f32 = probs.iter().map(|p| p.1).sum();
        if top_p < 1.0 {
            probs.sort_by(|a, b| b.1.total_cmp(&a.1));
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p.1 / total;
                if acc >= top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep.max(1));
        }
        let mass: f32 = probs.iter().map(|p| p.1).sum();
        let mut u = rng.random::<f32>() * mass;
        let mut pick = probs.last().map_or(0, |p| p.0);
        for (i, p) in &probs {
            if u < *p {
                pick = *i;
                break;
            }
            u -= p;
        }
        pick
    };
    (
        tok as u32,
        logits.get(tok).copied().unwrap_or(f32::NEG_INFINITY) - lse,
    )
}

fn last_logits(t: &Tensor) -> Vec<f32> {
    let v = t.size()[1];
    Vec::<f32>::try_from(t.select(1, v - 1).view([-1]).to_kind(Kind::Float)).unwrap_or_default()
}

/// What a request gets while the policy lock is poisoned.
const POISONED: &str = "policy lock poisoned (POST /v1/restore or restart the trainer)";

/// Run `f` (a forward pass: reads the model, changes nothing), turning a panic from libtorch
/// into an error message so the worker and the policy lock outlive it.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|p| format!("{what} failed: {}", crate::error::panic_message(&*p)))
}

/// The worker loop: runs until every sender is dropped. A failed forward pass fails the
/// requests it served and the loop goes on; a poisoned policy lock fails requests until a
/// restore repairs it. A sample never runs past the model's position limit (it ends with
/// `length` there), whatever `max_tokens` asks.
pub fn run_worker(
    policy: Arc<Mutex<Policy>>,
    tokenizer: Arc<tokenizers::Tokenizer>,
    eos: Vec<u32>,
    stats: Arc<GenStats>,
    mut rx: mpsc::Receiver<GenJob>,
    prefix_cache_tokens: usize,
    decode: crate::model::DecodeOptions,
) {
    let how = decode.attention;
    use std::sync::atomic::Ordering::Relaxed;
    // Requests in flight by id; a request leaves when its last sample ends or it is abandoned.
    let mut jobs: std::collections::HashMap<usize, Pending> = std::collections::HashMap::new();
    let mut next_job = 0usize;
    let mut seqs: Vec<Seq> = Vec::new();
    // Row i of the batch cache is seqs[i]'s (both remove by swapping in the last).
    let mut kv = BatchKv::with_kind(decode.kv_cache);
    let mut store = PrefixStore::new(prefix_cache_tokens);
    let mut seed_counter: u64 = 0x5eed;
    loop {
        // Admit new work: block when idle, otherwise take what is queued.
        let mut incoming = Vec::new();
        if seqs.is_empty() {
            match rx.blocking_recv() {
                Some(j) => incoming.push(j),
                None => return,
            }
        }
        while let Ok(j) = rx.try_recv() {
            incoming.push(j);
        }
        stats.waiting.store(incoming.len(), Relaxed);
        if !incoming.is_empty() {
            let Ok(p) = policy.lock() else {
                for job in incoming {
                    let _ = job.reply.send(Err(POISONED.into()));
                }
                continue;
            };
            let room = p.trainer.model.max_positions();
            for job in incoming {
                let n = job.params.n.max(1);
                if job.prompt.is_empty() || job.prompt.len() >= room {
                    let _ = job.reply.send(Err(format!(
                        "a prompt of {} tokens leaves no room in the model's {room} positions",
                        job.prompt.len()
                    )));
                    continue;
                }
                stats
                    .prompt_tokens
                    .fetch_add(job.prompt.len() as u64, Relaxed);
                let epoch = p.weights_epoch;
                let (reused, cached) = store
                    .lookup(&job.prompt, epoch)
                    .unwrap_or_else(|| (0, KvCache::new(p.trainer.model.layers.len())));
                stats.prefix_hit_tokens.fetch_add(reused as u64, Relaxed);
                let prompt: Vec<i64> = job.prompt[reused..].iter().map(|&t| i64::from(t)).collect();
                let t0 = std::time::Instant::now();
                let prefill = guarded("prefill", || {
                    tch::no_grad(|| {
                        let mut cache = cached;
                        let ids = Tensor::from_slice(&prompt)
                            .view([1, -1])
                            .to_device(p.trainer.model.device);
                        let logits = p
                            .trainer
                            .model
                            .forward_cached(&ids, &mut cache, Fwd::POLICY);
                        (cache, last_logits(&logits))
                    })
                });
                stats
                    .prefill_micros
                    .fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
                let (cache, next) = match prefill {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = job.reply.send(Err(e));
                        continue;
                    }
                };
                // The prompt's keys and values serve the requests queued behind it at once:
                // a group's samples sent as requests of one prompt each, and every task's
                // shared system prompt, which a step's first wave (and every request after a
                // weight update retired the store) would otherwise compute once per request.
                // A view: the rows below copy the cache, the entry shares its tensors.
                if store.budget > 0 {
                    store.insert(
                        job.prompt.clone(),
                        cache.prefix(job.prompt.len() as i64),
                        epoch,
                    );
                }
                let id = next_job;
                next_job += 1;
                let shared = Arc::new(job.prompt.clone());
                for s in 0..n {
                    let seed = job.params.seed.map_or_else(
                        || {
                            seed_counter = seed_counter
                                .wrapping_mul(6_364_136_223_846_793_005)
                                .wrapping_add(1_442_695_040_888_963_407);
                            seed_counter
                        },
                        |sd| sd.wrapping_add(s as u64),
                    );
                    // Samples of one request share the prompt's prefill: each gets a row of the
                    // batch cache holding a copy of it (a prefill of at least one token always
                    // gives a row; were rows and sequences ever to disagree, the next decode
                    // step refuses and fails the round). The rows read the prompt they share
                    // with earlier rows of these weights from one of them.
                    let _ = kv.push_shared(&cache, shared.clone(), epoch);
                    seqs.push(Seq {
                        job: id,
                        sample: s,
                        prompt: shared.clone(),
                        epoch,
                        next: next.clone(),
                        ids: Vec::new(),
                        logprobs: Vec::new(),
                        rng: StdRng::seed_from_u64(seed),
                        room: room - job.prompt.len(),
                        done: None,
                    });
                }
                jobs.insert(
                    id,
                    Pending {
                        samples: vec![None; n],
                        params: job.params,
                        reply: job.reply,
                    },
                );
            }
        }
        stats.running.store(seqs.len(), Relaxed);

        // One token for every running sequence: sample from its last logits; hand back what
        // ended; then advance all that continue in one batched forward.
        for s in &mut seqs {
            let Some(job) = jobs.get(&s.job) else {
                s.done = Some(Done::Abort);
                continue;
            };
            if job.reply.is_closed() {
                s.done = Some(Done::Abort);
                continue;
            }
            let prm = &job.params;
            let (tok, lp) = sample_token(&s.next, prm.temperature, prm.top_p, &mut s.rng);
            s.ids.push(tok);
            s.logprobs.push(lp);
            stats.generated_tokens.fetch_add(1, Relaxed);
            if !prm.ignore_eos && eos.contains(&tok) {
                s.done = Some(Done::Finished("stop", Some(serde_json::json!(tok))));
            } else if let Some(stop) = stop_hit(&tokenizer, &s.ids, &prm.stop) {
                s.done = Some(Done::Finished("stop", Some(serde_json::json!(stop))));
            } else if s.ids.len() >= prm.max_tokens || s.ids.len() >= s.room {
                s.done = Some(Done::Finished("length", None));
            } else if prm.repetition.is_some_and(|r| r.hit(&s.ids)) {
                s.done = Some(Done::Finished(
                    "repetition",
                    Some(serde_json::json!("repetition_detected")),
                ));
            }
        }
        hand_back(&mut seqs, &mut kv, &mut jobs, &tokenizer, &mut store);
        stats.running.store(seqs.len(), Relaxed);
        if seqs.is_empty() {
            continue;
        }
        let toks: Vec<i64> = seqs
            .iter()
            .map(|s| s.ids.last().map_or(0, |&t| i64::from(t)))
            .collect();
        // What this round's attention needs (each row's past plus its new token) and what a
        // masked view of every row spans; counted when the round succeeds.
        let (own, spanned) = kv.round_positions();
        let from_shared = kv.shared_positions();
        let mut t0 = std::time::Instant::now();
        let rows = match policy.lock() {
            Ok(p) => guarded("decode step", || {
                // The round's time starts once the policy is ours (a train step may hold it).
                t0 = std::time::Instant::now();
                // A row whose cache began under other weights now mixes two: never kept.
                for s in &mut seqs {
                    if s.epoch != p.weights_epoch {
                        s.epoch = 0;
                    }
                }
                tch::no_grad(|| {
                    let rows = p
                        .trainer
                        .model
                        .decode_step_with(&toks, &mut kv, Fwd::POLICY, how);
                    let v = rows.size()[1] as usize;
                    (v, Vec::<f32>::try_from(rows.view([-1])).unwrap_or_default())
                })
            }),
            Err(_) => Err(POISONED.to_string()),
        };
        match rows {
            Ok((v, flat)) => {
                stats
                    .decode_micros
                    .fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
                stats.decode_rounds.fetch_add(1, Relaxed);
                stats.decode_positions.fetch_add(own as u64, Relaxed);
                stats
                    .decode_span_positions
                    .fetch_add(spanned as u64, Relaxed);
                stats
                    .decode_shared_positions
                    .fetch_add(from_shared as u64, Relaxed);
                for (j, s) in seqs.iter_mut().enumerate() {
                    s.next = flat
                        .get(j * v..(j + 1) * v)
                        .map(<[f32]>::to_vec)
                        .unwrap_or_default();
                }
            }
            // The batch cache may be half-written: every sequence of the round ends.
            Err(e) => {
                for s in &mut seqs {
                    s.done = Some(Done::Failed(e.clone()));
                }
                // Every row leaves with its sequence: the batch cache is empty again.
                hand_back(&mut seqs, &mut kv, &mut jobs, &tokenizer, &mut store);
                stats.running.store(0, Relaxed);
            }
        }
    }
}

/// Remove every ended sequence (and its row of the batch cache) and answer the requests whose
/// samples are all done, or that failed.
fn hand_back(
    seqs: &mut Vec<Seq>,
    kv: &mut BatchKv,
    jobs: &mut std::collections::HashMap<usize, Pending>,
    tokenizer: &tokenizers::Tokenizer,
    store: &mut PrefixStore,
) {
    let mut i = 0;
    while i < seqs.len() {
        if seqs[i].done.is_none() {
            i += 1;
            continue;
        }
        // A finished sample's row holds its prompt and every token but the last (never fed):
        // kept for a request that continues it.
        if let Some(Done::Finished(..)) = &seqs[i].done
            && seqs[i].epoch != 0
            && store.budget > 0
        {
            let s = &seqs[i];
            let mut tokens = Vec::with_capacity(s.prompt.len() + s.ids.len());
            tokens.extend_from_slice(&s.prompt);
            tokens.extend_from_slice(&s.ids[..s.ids.len().saturating_sub(1)]);
            let cache = kv.row_cache(i);
            store.insert(tokens, cache, s.epoch);
        }
        let s = seqs.swap_remove(i);
        kv.swap_remove(i);
        let Some(done) = s.done else {
            continue;
        };
        let (reason, stop) = match done {
            Done::Finished(reason, stop) => (reason, stop),
            Done::Abort => {
                jobs.remove(&s.job);
                continue;
            }
            Done::Failed(e) => {
                if let Some(job) = jobs.remove(&s.job) {
                    let _ = job.reply.send(Err(e));
                }
                continue;
            }
        };
        let Some(job) = jobs.get_mut(&s.job) else {
            continue;
        };
        let mut text = tokenizer
            .decode(&s.ids, job.params.skip_special_tokens)
            .unwrap_or_default();
        if reason == "stop"
            && !job.params.include_stop_str_in_output
            && let Some(st) = stop.as_ref().and_then(|v| v.as_str())
            && let Some(at) = text.find(st)
        {
            text.truncate(at);
        }
        job.samples[s.sample] = Some(Sample {
            token_ids: s.ids,
            logprobs: s.logprobs,
            text,
            finish_reason: reason,
            stop_reason: stop,
        });
        if job.samples.iter().all(Option::is_some)
            && let Some(done) = jobs.remove(&s.job)
        {
            let _ = done
                .reply
                .send(Ok(done.samples.into_iter().flatten().collect()));
        }
    }
}

/// The stop string the generated text now contains, checking only a tail window (stop strings
/// are short) so the cost per token stays constant.
fn stop_hit(tok: &tokenizers::Tokenizer, ids: &[u32], stops: &[String]) -> Option<String> {
    if stops.is_empty() {
        return None;
    }
    let longest = stops.iter().map(String::len).max().unwrap_or(0);
    let window = (longest + 8).min(ids.len());
    let tail = tok.decode(&ids[ids.len() - window..], false).ok()?;
    stops.iter().find(|s| tail.contains(s.as_str())).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(min: usize, max: usize, count: usize) -> RepetitionDetection {
        RepetitionDetection {
            max_pattern_size: max,
            min_pattern_size: min,
            min_count: count,
        }
    }

    /// The first length at which the rule fires on `ids` grown a token at a time, as the
    /// worker checks it.
    fn fires_at(r: RepetitionDetection, ids: &[u32]) -> Option<usize> {
        (1..=ids.len()).find(|&n| r.hit(&ids[..n]))
    }

    #[test]
    fn the_repetition_rule_fires_at_the_token_that_completes_the_last_copy() {
        // A 3-token block, three times, after a lead-in: fires at its third copy's last token.
        let ids = [9, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7];
        assert_eq!(fires_at(rule(1, 4, 3), &ids), Some(11));
        // Two copies suffice at min_count 2, so the second copy ends it.
        assert_eq!(fires_at(rule(1, 4, 2), &ids), Some(8));
        // Block sizes outside the range do not count: only 3 repeats here.
        assert_eq!(fires_at(rule(4, 8, 2), &ids), None);
        assert_eq!(fires_at(rule(1, 2, 3), &ids), None);
        // One token three times is a block of size 1; min_pattern_size 0 reads as 1.
        assert_eq!(fires_at(rule(0, 1, 3), &[4, 5, 5, 5]), Some(4));
        // Off: max_pattern_size 0, or min_count under 2.
        assert_eq!(fires_at(rule(1, 0, 3), &[5; 10]), None);
        assert_eq!(fires_at(rule(1, 4, 1), &[5; 10]), None);
        // A near-loop (one token differs in the middle copy) does not fire.
        assert_eq!(fires_at(rule(1, 4, 3), &[1, 2, 3, 1, 9, 3, 1, 2, 3]), None);
    }

    /// A one-layer cache of `n` positions (values do not matter to the store).
    fn cache(n: i64) -> KvCache {
        let mut c = KvCache::new(1);
        let t = Tensor::zeros([1, 1, n, 2], (Kind::Float, tch::Device::Cpu));
        let _ = c.layers[0].append(&t, &t);
        c
    }

    fn toks(from: u32, n: u32) -> Vec<u32> {
        (from..from + n).collect()
    }

    #[test]
    fn the_prefix_store_reuses_the_longest_prefix_of_the_same_weights_within_its_budget() {
        let mut st = PrefixStore::new(100);
        st.insert(toks(0, 40), cache(40), 1);
        // Too short to keep; a cache of another length than its tokens is not kept either.
        st.insert(toks(500, 10), cache(10), 1);
        st.insert(toks(600, 30), cache(29), 1);
        assert_eq!(st.entries.len(), 1);
        // The longest common prefix, leaving the prompt's last token to compute.
        let mut p = toks(0, 30);
        p.push(999);
        let (n, c) = st.lookup(&p, 1).unwrap();
        assert_eq!((n, c.seq_len()), (30, 30));
        assert_eq!(st.lookup(&toks(0, 40), 1).unwrap().0, 39);
        assert!(st.lookup(&toks(0, 12), 1).is_none(), "under MIN_PREFIX");
        assert!(st.lookup(&toks(1, 40), 1).is_none(), "no common prefix");
        // An extension replaces the entry it extends.
        st.insert(toks(0, 60), cache(60), 1);
        assert_eq!(st.entries.len(), 1);
        assert_eq!(st.lookup(&toks(0, 70), 1).unwrap().0, 60);
        // The budget (100 tokens) evicts the least recently used: the 60-token entry goes.
        st.insert(toks(200, 50), cache(50), 1);
        assert_eq!(st.used(), 50);
        assert!(st.lookup(&toks(0, 70), 1).is_none());
        // Other weights: nothing is reused, and the stale entries are dropped.
        assert!(st.lookup(&toks(200, 60), 2).is_none());
        assert!(st.entries.is_empty());
        // A budget of 0 keeps nothing.
        let mut off = PrefixStore::new(0);
        off.insert(toks(0, 40), cache(40), 1);
        assert!(off.entries.is_empty());
    }

    /// A worker over a random tiny policy and a tokenizer trained on a small corpus, run until
    /// `jobs` (all queued before it starts, so one wave admits them) are answered: the samples
    /// per job, and the prompt tokens reused from the prefix cache. `kv_cache`: the batch
    /// cache's dtype (`None`: the weights', f32).
    fn serve_queued(
        jobs: &[Vec<u32>],
        prefix_cache_tokens: usize,
        kv_cache: Option<Kind>,
    ) -> (Vec<Sample>, u64) {
        let (samples, stats) = serve_queued_with(
            jobs,
            prefix_cache_tokens,
            crate::model::DecodeOptions {
                attention: crate::model::DecodeAttention::Masked,
                kv_cache,
            },
        );
        let hits = stats
            .prefix_hit_tokens
            .load(std::sync::atomic::Ordering::Relaxed);
        (samples, hits)
    }

    /// [`serve_queued`] with the decode options given: the samples and the worker's counters.
    fn serve_queued_with(
        jobs: &[Vec<u32>],
        prefix_cache_tokens: usize,
        decode: crate::model::DecodeOptions,
    ) -> (Vec<Sample>, Arc<GenStats>) {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.jsonl");
        let lines: Vec<String> = (0..50)
            .map(|i| serde_json::json!({"text": format!("gene TN{i} binds {i}")}).to_string())
            .collect();
        std::fs::write(&corpus, lines.join("\n")).unwrap();
        crate::smallmodel::train_tokenizer(&corpus, 300, dir.path()).unwrap();
        let tokenizer =
            tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        let cfg: crate::model::Qwen3Config = serde_json::from_value(serde_json::json!({
            "vocab_size": 64, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "max_position_embeddings": 96, "tie_word_embeddings": true
        }))
        .unwrap();
        let model =
            crate::model::Qwen3::random(cfg, 5, 0.3, tch::Device::Cpu, Kind::Float).unwrap();
        let mut train = crate::train::TrainConfig::default();
        train.loss.kl_coef = 0.0;
        let policy = Policy {
            trainer: crate::train::Trainer::new(model, train).unwrap(),
            version: 0,
            lora: None,
            base: "test".into(),
            seed: 1,
            settings: wire::TrainSettings::default(),
            weights_epoch: crate::service::next_weights_epoch(),
        };
        let (tx, rx) = mpsc::channel(16);
        let mut replies = Vec::new();
        for prompt in jobs {
            let (reply, got) = oneshot::channel();
            let params = GenParams {
                max_tokens: 6,
                temperature: 0.0,
                top_p: 1.0,
                n: 1,
                stop: vec![],
                seed: None,
                include_stop_str_in_output: false,
                skip_special_tokens: true,
                ignore_eos: true,
                repetition: None,
            };
            tx.try_send(GenJob {
                prompt: prompt.clone(),
                params,
                reply,
            })
            .unwrap();
            replies.push(got);
        }
        drop(tx);
        let stats = Arc::new(GenStats::default());
        run_worker(
            Arc::new(Mutex::new(policy)),
            Arc::new(tokenizer),
            vec![],
            stats.clone(),
            rx,
            prefix_cache_tokens,
            decode,
        );
        let samples = replies
            .into_iter()
            .map(|r| r.blocking_recv().unwrap().unwrap().remove(0))
            .collect();
        (samples, stats)
    }

    /// Three requests: a prompt of `len` tokens twice (a group's two samples), then one sharing
    /// its first `head` tokens and going on otherwise (another task after a shared system
    /// prompt).
    fn jobs_sharing(len: u32, head: usize) -> [Vec<u32>; 3] {
        let prompt: Vec<u32> = (0..len).map(|k| k * 7 % 60 + 3).collect();
        let mut other = prompt[..head].to_vec();
        other.extend((0..8).map(|k: u32| k * 11 % 60 + 2));
        assert_ne!(other[head], prompt[head]);
        [prompt.clone(), prompt, other]
    }

    /// The same tokens for every request, log-probs within 1e-4.
    fn same_answers(a: &[Sample], b: &[Sample]) {
        assert_eq!(a.len(), b.len());
        for (a, b) in a.iter().zip(b) {
            assert_eq!(a.token_ids, b.token_ids);
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "{x} vs {y}");
            }
        }
    }

    /// Requests admitted in one wave reuse the prefill of those before them: a second request
    /// of the same prompt (a group's next sample) all but its last token, one sharing a
    /// 20-token head (a shared system prompt) those 20; and they answer as without the cache.
    #[test]
    fn requests_admitted_together_reuse_each_others_prompt() {
        let jobs = jobs_sharing(30, 20);
        let (cached, hits) = serve_queued(&jobs, 1_000, None);
        assert_eq!(hits, 29 + 20);
        let (fresh, none) = serve_queued(&jobs, 0, None);
        assert_eq!(none, 0);
        same_answers(&cached, &fresh);
        assert_eq!(cached[0].token_ids, cached[1].token_ids);
    }

    /// The rows of a wave that share a prompt read it from one row (`BatchKv::push_shared`): a
    /// second request of a 50-token prompt its 50 positions, one sharing a 40-token head those
    /// 40, every decode round; and the worker answers as with libtorch's kernel over each row's
    /// own copy (the same tokens, log-probs within 1e-4).
    #[test]
    fn rows_sharing_a_prompt_read_it_from_one_row_and_answer_as_apart() {
        let jobs = jobs_sharing(50, 40);
        let with = |attention| crate::model::DecodeOptions {
            attention,
            kv_cache: None,
        };
        let (shared, stats) =
            serve_queued_with(&jobs, 1_000, with(crate::model::DecodeAttention::Rows));
        let (apart, _) =
            serve_queued_with(&jobs, 1_000, with(crate::model::DecodeAttention::Masked));
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let rounds = load(&stats.decode_rounds);
        assert!(rounds >= 5, "{rounds} rounds");
        // Every round the wave is whole: the second row reads 50 shared positions, the third 40.
        assert_eq!(load(&stats.decode_shared_positions), 90 * rounds);
        same_answers(&shared, &apart);
    }

    /// A worker with a bf16 batch cache under f32 weights (`--kv-cache-dtype bf16`) serves
    /// the same requests with log-probs within bf16's rounding of the f32 cache's, and not equal
    /// to them (the cache really is bf16).
    #[test]
    fn a_bf16_cache_serves_within_its_rounding() {
        let jobs = jobs_sharing(30, 20);
        let (f32s, _) = serve_queued(&jobs, 1_000, None);
        let (bf16s, hits) = serve_queued(&jobs, 1_000, Some(Kind::BFloat16));
        assert_eq!(hits, 29 + 20, "the prompt's prefill is shared as with f32");
        let mut worst = 0.0_f32;
        for (a, b) in f32s.iter().zip(&bf16s) {
            assert_eq!(a.logprobs.len(), b.logprobs.len());
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                worst = worst.max((x - y).abs());
            }
        }
        assert!(
            worst > 0.0 && worst < 0.05,
            "largest log-prob change {worst}"
        );
    }
}
