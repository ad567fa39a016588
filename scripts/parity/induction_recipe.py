"""Does the smoke model's architecture form an induction (copying) circuit, and after how many
steps at which learning rate? (issue 25)

A textbook test, independent of the world and of the tokenizer: sequences of L random tokens
written twice; the second copy is predictable only by looking back L tokens. The model is a
Qwen3 built by transformers from a trainer config (trainer/configs/small.json), random weights,
AdamW, linear warm-up then constant. Every EVAL steps it prints the loss on the second copy and
the greedy copy accuracy there (fresh sequences); a model with an induction circuit drives the
loss towards 0 and the accuracy towards 1, one without stays at log(V) and 1/V.

usage: .venv/bin/python scripts/parity/induction_recipe.py CONFIG.json STEPS [LR] [BATCH] [L]
                                                           [VOCAB] [THREADS] [SEED]
Prints one line per evaluation: step, seconds, train loss, copy loss, copy accuracy.
"""
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main():
    cfg_path, steps = sys.argv[1], int(sys.argv[2])
    lr = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    length = int(sys.argv[5]) if len(sys.argv) > 5 else 32
    vocab = int(sys.argv[6]) if len(sys.argv) > 6 else 4096
    threads = int(sys.argv[7]) if len(sys.argv) > 7 else 2
    seed = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    raw = json.load(open(cfg_path))
    raw["vocab_size"] = vocab
    model = Qwen3ForCausalLM(Qwen3Config(**raw))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)

    def sample(n):
        # Token 0..15 are left out (special tokens of a real tokenizer live there).
        x = torch.randint(16, vocab, (n, length), generator=gen)
        return torch.cat([x, x], dim=1)

    def copy_stats(ids):
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, length - 1:-1]
        tgt = ids[:, length:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1))
        # The first token of the copy cannot be predicted; score the other L-1.
        acc = (logits.argmax(-1)[:, 1:] == tgt[:, 1:]).float().mean()
        return loss.item(), acc.item()

    held = sample(64)
    t0 = time.time()
    every = max(1, steps // 20)
    for k in range(1, steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, k / 20)
        ids = sample(batch)
        logits = model(input_ids=ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if k % every == 0 or k == steps:
            model.eval()
            cl, ca = copy_stats(held)
            model.train()
            print(json.dumps({"step": k, "s": round(time.time() - t0), "loss": round(loss.item(), 3),
                              "copy_loss": round(cl, 3), "copy_acc": round(ca, 3)}), flush=True)


if __name__ == "__main__":
    main()
