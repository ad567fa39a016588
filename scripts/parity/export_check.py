"""Load `trainer export` directories the way users do and report how they behave, as JSON.

Usage:
  python export_check.py --check full DIR EXPECTED [--check adapter DIR EXPECTED ...]

Each EXPECTED is a safetensors file with `input_ids` [B, T] and `logits` [B, T, V] computed by
the Rust trainer. For `full`, DIR is loaded with AutoModelForCausalLM (in float32 for the
logits, and with dtype="auto" to report the stored dtype); for `adapter`, the base named by
DIR/adapter_config.json's base_model_name_or_path is loaded with AutoModelForCausalLM and DIR
with PeftModel.from_pretrained. Every DIR's tokenizer is loaded with AutoTokenizer and renders
one conversation with its chat template. Printed (stdout, one JSON object):
  results:  per check {dir, kind, max_abs_diff, auto_dtype, config_dtype, chat_text, chat_ids,
            template_ids}
  pairwise: max |logits_i - logits_j| between checks (same input ids)
"""

import argparse
import json
import sys

import torch
from safetensors.torch import load_file

CONVERSATION = [
    {"role": "system", "content": "You are a careful research assistant."},
    {"role": "user", "content": "Which gene encodes Tn5?"},
]


def load_full(path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def load_adapter(path):
    from peft import PeftModel

    with open(f"{path}/adapter_config.json") as f:
        base_path = json.load(f)["base_model_name_or_path"]
    base = load_full(base_path, torch.float32)
    return PeftModel.from_pretrained(base, path).eval(), base_path


def ids_of(x):
    """apply_chat_template(tokenize=True) returns a list or, in newer transformers, a mapping."""
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    if x and isinstance(x[0], list):
        x = x[0]
    return [int(i) for i in x]


def check(kind, path, expected):
    from transformers import AutoTokenizer

    exp = load_file(expected)
    ids = exp["input_ids"]
    out = {"dir": path, "kind": kind}
    if kind == "full":
        model = load_full(path, torch.float32)
        out["auto_dtype"] = str(load_full(path, "auto").dtype).replace("torch.", "")
        with open(f"{path}/config.json") as f:
            cfg = json.load(f)
        out["config_dtype"] = cfg.get("torch_dtype", cfg.get("dtype"))
    elif kind == "adapter":
        model, out["base"] = load_adapter(path)
    else:
        raise SystemExit(f"unknown kind {kind!r}; allowed: full, adapter")
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    out["max_abs_diff"] = (logits - exp["logits"].float()).abs().max().item()
    tok = AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    out["chat_text"] = text
    out["chat_ids"] = tok(text, add_special_tokens=False)["input_ids"]
    out["template_ids"] = ids_of(
        tok.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=True))
    out["eos_token"] = tok.eos_token
    return out, logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", nargs=3, action="append", required=True,
                    metavar=("KIND", "DIR", "EXPECTED"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    results, logits = [], []
    for kind, path, expected in args.check:
        r, lg = check(kind, path, expected)
        results.append(r)
        logits.append(lg)
    pairwise = [[(a - b).abs().max().item() if a.shape == b.shape else None for b in logits]
                for a in logits]
    print(json.dumps({"results": results, "pairwise": pairwise}))


if __name__ == "__main__":
    sys.exit(main())
