"""Parity fixture for chat templates: build a small BPE tokenizer directory with the project's
ChatML template (prompts/chat_template.jinja), render several conversations with Python
transformers, and write the expected strings and token ids to OUT/cases.json.

The Rust test (orchestrator/tests/chat_template.rs) runs this script and must reproduce every
rendering byte for byte and every token id. Usage: python chat_template.py --out DIR
"""
import argparse
import json
import os
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def corpus_lines(limit=1500):
    """Real text to train the toy BPE on: SciFact abstracts when present, else a fallback."""
    path = SHARED / "scifact" / "corpus.jsonl"
    if path.exists():
        with path.open() as f:
            for i, line in enumerate(f):
                if i >= limit:
                    break
                doc = json.loads(line)
                yield (doc.get("title", "") + " " + doc.get("text", "")).strip()
    else:
        for i in range(limit):
            yield f"document {i} about proteins, cells and the role of evidence in research number {i}"


def build_tokenizer(out: pathlib.Path, vocab: int):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    tok.add_tokens(ADDED)
    tok.save(str(out / "tokenizer.json"))
    template = (ROOT / "prompts" / "chat_template.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "chat_template": template,
    }, indent=2))


TOOLS = [
    {"type": "function", "function": {
        "name": "google_search",
        "description": "Search the web and return snippets with ids.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what to search for"},
            "num_results": {"type": "integer", "default": 5}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "browse_webpage",
        "description": "Fetch a page and return its readable text — «quoted» unicode.",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
]

CASES = [
    {"name": "system_user_generation_prompt", "add_generation_prompt": True, "messages": [
        {"role": "system", "content": "You are a careful research assistant."},
        {"role": "user", "content": "What limits CRISPR off-target effects?"}]},
    {"name": "multi_turn_with_reasoning", "add_generation_prompt": True, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nFirst answer."},
        {"role": "user", "content": "Second question?"},
        {"role": "assistant", "content": "<think>\nnew reasoning kept\n</think>\n\nSecond answer."},
        {"role": "user", "content": "Third?"}]},
    {"name": "tools_calls_and_results", "add_generation_prompt": True, "tools": TOOLS, "messages": [
        {"role": "system", "content": "Use tools when unsure."},
        {"role": "user", "content": "Find two sources on Tn5 transposase."},
        {"role": "assistant", "content": "Searching.", "tool_calls": [
            {"type": "function", "function": {"name": "google_search", "arguments": {"query": "Tn5 transposase", "num_results": 3}}},
            {"type": "function", "function": {"name": "browse_webpage", "arguments": "{\"url\": \"https://example.org/tn5\"}"}}]},
        {"role": "tool", "content": "<snippet id=\"a1\">Tn5 inserts adapters.</snippet>"},
        {"role": "tool", "content": "Page text: \"quoted\" & <tags>."},
        {"role": "assistant", "content": "Tn5 inserts adapters [a1]."},
        {"role": "user", "content": "Thanks — and ümlauts? 日本語"}]},
    {"name": "tools_without_system", "add_generation_prompt": False, "tools": TOOLS[:1], "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "google_search", "arguments": {"query": "x"}}}]},
        {"role": "tool", "content": "nothing"}]},
    {"name": "thinking_disabled", "add_generation_prompt": True, "extra": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "Plain question with\nnewlines\tand tabs."}]},
    {"name": "reasoning_content_field", "add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "reasoning_content": "\nstep one\nstep two\n", "content": "A"}]},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=1200)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out, args.vocab)
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    results = []
    for case in CASES:
        text = tok.apply_chat_template(
            case["messages"],
            tools=case.get("tools"),
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=False,
            **case.get("extra", {}),
        )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        results.append({**case, "expected_text": text, "expected_ids": ids})
    (out / "cases.json").write_text(json.dumps(results, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
