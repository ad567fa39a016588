"""Reference numbers for the trainer's parity tests, computed with PyTorch + transformers + PEFT.

Subcommands (all write safetensors files the Rust tests read):
  make  --out DIR [--tied] [--kv N] [--seed S]   tiny random Qwen3 saved with save_pretrained,
                                                 fixed input ids and their logits (expected.safetensors)
  peft  --base DIR --adapter DIR --out FILE      logits of base + our PEFT adapter on DIR's input ids
  loss  --base DIR --adapter DIR --batch FILE --out FILE
                                                 the policy loss (clipped ratio, per-token advantages,
                                                 KL3 to the adapter-disabled reference, truncated
                                                 importance weights, token-mean) and LoRA gradients
  merge --base DIR --adapter DIR --out FILE      logits of PEFT's merge_and_unload()
  check-dir --dir DIR --out FILE                 load a `trainer init` directory with Auto* classes,
                                                 render a chat with its template, save the logits
The loss here is written from the formulas in shared/spec/method.md A.5, independently of the
Rust code, so agreement checks both.
"""

import argparse
import json
import sys

import torch
from safetensors.torch import load_file, save_file


def make(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    cfg = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=args.kv,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=args.theta,
        tie_word_embeddings=args.tied,
        initializer_range=0.2,  # large enough that logits differ visibly between tokens
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(cfg).eval()
    # Non-trivial norm weights, so a missing or misplaced norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(args.out, safe_serialization=True)
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (3, 19), generator=g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()},
              f"{args.out}/expected.safetensors")


def peft_model(base, adapter):
    from peft import PeftModel
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(base, torch_dtype=torch.float32, attn_implementation="sdpa")
    return PeftModel.from_pretrained(model, adapter).eval()


def peft_logits(args):
    model = peft_model(args.base, args.adapter)
    ids = load_file(f"{args.base}/expected.safetensors")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    save_file({"logits": logits.contiguous()}, args.out)


def merged_logits(args):
    model = peft_model(args.base, args.adapter).merge_and_unload()
    ids = load_file(f"{args.base}/expected.safetensors")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    save_file({"logits": logits.contiguous()}, args.out)


def check_dir(args):
    """Load a model directory written by `trainer init` the way users would, render a chat with
    its template, and save the logits of the rendered ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.dir)
    model = AutoModelForCausalLM.from_pretrained(args.dir, torch_dtype=torch.float32).eval()
    text = tok.apply_chat_template([{"role": "user", "content": "Which gene encodes Tn5?"}],
                                   tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, args.out)
    print(text)


def token_logprobs(logits, targets):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def policy_loss(args):
    model = peft_model(args.base, args.adapter)
    model.train()  # dropout is 0 in the test adapter; train() only enables grads here
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    b = load_file(args.batch)
    cfg = json.loads(open(args.batch + ".json").read())
    ids, mask, adv, behaviour = b["ids"], b["mask"].float(), b["adv"].float(), b["behaviour"].float()
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad(), model.disable_adapter():
        ref = token_logprobs(model(input_ids=inputs).logits, targets)
    logp = token_logprobs(model(input_ids=inputs).logits, targets)
    old = logp.detach()
    ratio = torch.exp(logp - old)
    pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg["clip_low"], 1 + cfg["clip_high"]))
    tis = torch.clamp(torch.exp(old - behaviour), max=cfg["tis_clamp"])
    d = torch.clamp(logp - ref, -40, 40)
    kl3 = torch.exp(-d) - 1 + d
    per_token = tis * pg + cfg["kl_coef"] * kl3
    loss = (per_token * mask).sum() / mask.sum()
    loss.backward()
    out = {"loss": loss.detach().reshape(1), "kl": ((kl3 * mask).sum() / mask.sum()).detach().reshape(1)}
    for n, p in model.named_parameters():
        if p.grad is not None:
            # PEFT's in-memory names carry the adapter name; the file format does not.
            out["grad." + n.replace(".default", "")] = p.grad.detach().contiguous()
    save_file(out, args.out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--kv", type=int, default=2)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--theta", type=float, default=1000000.0)
    for name in ("peft", "merge"):
        p = sub.add_parser(name)
        p.add_argument("--base", required=True)
        p.add_argument("--adapter", required=True)
        p.add_argument("--out", required=True)
    c = sub.add_parser("check-dir")
    c.add_argument("--dir", required=True)
    c.add_argument("--out", required=True)
    lo = sub.add_parser("loss")
    lo.add_argument("--base", required=True)
    lo.add_argument("--adapter", required=True)
    lo.add_argument("--batch", required=True)
    lo.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    {"make": make, "peft": peft_logits, "merge": merged_logits, "loss": policy_loss,
     "check-dir": check_dir}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
