//! Small-model tooling for tests and the embedded defaults: train a byte-level BPE tokenizer
//! on a corpus (the tokenizers crate), and write a random-init Qwen3 directory in Hugging Face
//! layout (config.json, model.safetensors, tokenizer files with the project's ChatML template).

use std::io::BufRead;
use std::path::Path;

use tch::{Device, Kind};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, TokenizerBuilder};

use crate::error::{Result, TrainerError};
use crate::model::{Qwen3, Qwen3Config};

/// Special tokens of the ChatML template, in id order after the BPE vocabulary.
pub const SPECIAL_TOKENS: [&str; 5] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
];

const CHAT_TEMPLATE: &str = include_str!("../../prompts/chat_template.jinja");

/// The text of each JSONL line's `text` (and `title`) field, or each line of a plain file.
fn corpus_texts(path: &Path) -> Result<Vec<String>> {
    let f = std::fs::File::open(path).map_err(TrainerError::io(path))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(TrainerError::io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        if line.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
                TrainerError::Tokenizer(format!("{}:{}: {e}", path.display(), i + 1))
            })?;
            for k in ["title", "text", "query", "answer"] {
                if let Some(s) = v.get(k).and_then(|x| x.as_str()) {
                    out.push(s.to_string());
                }
            }
        } else {
            out.push(line);
        }
    }
    if out.is_empty() {
        return Err(TrainerError::Tokenizer(format!(
            "{} holds no text",
            path.display()
        )));
    }
    Ok(out)
}

/// Train a byte-level BPE tokenizer with `vocab` entries (special tokens included) and write
/// `tokenizer.json` and `tokenizer_config.json` (ChatML template) into `out`.
pub fn train_tokenizer(corpus: &Path, vocab: usize, out: &Path) -> Result<usize> {
    train_tokenizer_with(corpus, vocab, out, false)
}

/// [`train_tokenizer`], and with `split_digits` every digit is a pre-token of its own (as
/// Llama 3's and Qwen2's pre-tokenizers split numbers), so no merge spans two digits and a
/// number is written one digit at a time. Without it the BPE learns whole ids seen often in
/// the corpus (`00741` is one token of the research world's 2,048), and an id it never saw
/// must be written from pieces the model rarely emitted (BENCHMARKS.md, issue 25 session 66).
pub fn train_tokenizer_with(
    corpus: &Path,
    vocab: usize,
    out: &Path,
    split_digits: bool,
) -> Result<usize> {
    let min = 256 + SPECIAL_TOKENS.len() + 1;
    if !(min..=1_000_000).contains(&vocab) {
        return Err(TrainerError::Tokenizer(format!(
            "--vocab = {vocab}; allowed: {min}..=1000000 (256 bytes + specials + merges)"
        )));
    }
    let texts = corpus_texts(corpus)?;
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|s| AddedToken::from(s.to_string(), true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let byte_level = ByteLevel::new(false, true, true);
    let pre: PreTokenizerWrapper = if split_digits {
        Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
    } else {
        byte_level.into()
    };
    let mut tok = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(pre))
        .with_decoder(Some(ByteLevel::default()))
        .with_post_processor(Some(ByteLevel::new(false, true, true)))
        .build()
        .map_err(|e| TrainerError::Tokenizer(e.to_string()))?;
    let tmp = tempdir_for(out)?;
    let corpus_file = tmp.join("corpus.txt");
    std::fs::write(&corpus_file, texts.join("\n")).map_err(TrainerError::io(&corpus_file))?;
    tok.train_from_files(
        &mut trainer,
        vec![corpus_file.to_string_lossy().into_owned()],
    )
    .map_err(|e| TrainerError::Tokenizer(e.to_string()))?;
    let _ = std::fs::remove_dir_all(&tmp);
    let mut tok: tokenizers::Tokenizer = tok.into();
    tok.add_special_tokens(&specials);
    std::fs::create_dir_all(out).map_err(TrainerError::io(out))?;
    let path = out.join("tokenizer.json");
    tok.save(&path, true)
        .map_err(|e| TrainerError::Tokenizer(format!("{}: {e}", path.display())))?;
    write_tokenizer_config(out)?;
    Ok(tok.get_vocab_size(true))
}

fn tempdir_for(out: &Path) -> Result<std::path::PathBuf> {
    let dir = out.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(TrainerError::io(&dir))?;
    Ok(dir)
}

fn write_tokenizer_config(dir: &Path) -> Result<()> {
    let path = dir.join("tokenizer_config.json");
    let cfg = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": null,
        "model_max_length": 131072,
        "add_bos_token": false,
        "chat_template": CHAT_TEMPLATE,
    });
    let text = serde_json::to_string_pretty(&cfg).map_err(TrainerError::json(&path))?;
    std::fs::write(&path, text).map_err(TrainerError::io(&path))
}

/// Write a random-init model directory: the config (vocab_size taken from the tokenizer),
/// model.safetensors, generation_config.json and the tokenizer files.
pub fn init_model(
    config: &Path,
    tokenizer_dir: &Path,
    out: &Path,
    seed: i64,
) -> Result<Qwen3Config> {
    let text = std::fs::read_to_string(config).map_err(TrainerError::io(config))?;
    let mut cfg: Qwen3Config = serde_json::from_str(&text).map_err(TrainerError::json(config))?;
    let tok_path = tokenizer_dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| TrainerError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let id = |s: &str| tok.token_to_id(s);
    let (Some(eos), Some(pad)) = (id("<|im_end|>"), id("<|endoftext|>")) else {
        return Err(TrainerError::Tokenizer(format!(
            "{} lacks <|im_end|> or <|endoftext|>",
            tok_path.display()
        )));
    };
    cfg.vocab_size = tok.get_vocab_size(true) as i64;
    cfg.extra
        .insert("model_type".into(), serde_json::json!("qwen3"));
    cfg.extra.insert(
        "architectures".into(),
        serde_json::json!(["Qwen3ForCausalLM"]),
    );
    cfg.extra
        .insert("eos_token_id".into(), serde_json::json!(eos));
    cfg.extra
        .insert("pad_token_id".into(), serde_json::json!(pad));
    cfg.extra
        .entry("torch_dtype")
        .or_insert(serde_json::json!("float32"));
    let std = cfg
        .extra
        .get("initializer_range")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.02);
    let model = Qwen3::random(cfg.clone(), seed, std, Device::Cpu, Kind::Float)?;
    model.save(out)?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        let src = tokenizer_dir.join(f);
        if src.exists() {
            std::fs::copy(&src, out.join(f)).map_err(TrainerError::io(&src))?;
        }
    }
    if !out.join("tokenizer_config.json").exists() {
        write_tokenizer_config(out)?;
    }
    let gen_path = out.join("generation_config.json");
    let gen_cfg = serde_json::json!({"eos_token_id": eos, "pad_token_id": pad});
    std::fs::write(&gen_path, gen_cfg.to_string()).map_err(TrainerError::io(&gen_path))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A corpus in which a few ids recur often enough for BPE to merge them whole.
    fn corpus(dir: &Path) -> std::path::PathBuf {
        let mut text = String::new();
        for i in 0..400 {
            let id = 740 + i % 2;
            text.push_str(&format!(
                "{{\"title\": \"protein-{id:05}\", \"text\": \"see protein-{id:05} and gene-{:05}\"}}\n",
                i % 50
            ));
        }
        let path = dir.join("corpus.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn pieces(dir: &Path, text: &str) -> Vec<String> {
        let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        enc.get_tokens().to_vec()
    }

    #[test]
    fn split_digits_writes_every_digit_as_its_own_token() {
        let tmp = tempfile::tempdir().unwrap();
        let corpus = corpus(tmp.path());
        let (merged, split) = (tmp.path().join("merged"), tmp.path().join("split"));
        train_tokenizer(&corpus, 400, &merged).unwrap();
        train_tokenizer_with(&corpus, 400, &split, true).unwrap();

        // Without the split, an id the corpus repeats is one token, and an unseen neighbour
        // is cut into other pieces.
        assert!(
            pieces(&merged, "protein-00741")
                .iter()
                .any(|p| p == "00741")
        );
        assert!(
            !pieces(&merged, "protein-00743")
                .iter()
                .any(|p| p == "00743")
        );
        // With it, both are five one-digit tokens, and the text round-trips (checked in
        // `pieces`).
        for id in ["00741", "00743"] {
            let p = pieces(&split, &format!("protein-{id}"));
            let digits: Vec<&String> = p
                .iter()
                .filter(|t| t.chars().any(|c| c.is_ascii_digit()))
                .collect();
            assert_eq!(digits.len(), 5, "{p:?}");
            assert!(digits.iter().all(|t| t.len() == 1), "{p:?}");
        }
    }
}
