"""Does the smoke model's architecture form an induction (copying) circuit, and after how many
steps at which learning rate? (issue 25)

A textbook test, independent of the world and of the tokenizer: sequences of L random tokens
written twice; the second copy is predictable only by looking back L tokens. The model is a
Qwen3 built by transformers from a trainer config (trainer/configs/small.json), random weights,
AdamW, linear warm-up then constant. Every EVAL steps it prints the loss on the second copy and
the greedy copy accuracy there (fresh sequences); a model with an induction circuit drives the
loss towards 0 and the accuracy towards 1, one without stays at log(V) and 1/V.

usage: .venv/bin/python scripts/parity/induction_recipe.py CONFIG.json STEPS [LR] [BATCH] [L]
                                                           [VOCAB] [THREADS] [SEED] [GAP] [QK]
  GAP  the copy comes back after 0..=GAP random tokens (default 0: right after, a fixed
       distance, which a fixed-offset head solves without looking at content)
  QK   initial value of every q_norm / k_norm weight (default 1.0, transformers' init): the
       attention logits of a Qwen3 head are bounded by head_dim^0.5 times its square
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
    max_gap = int(sys.argv[9]) if len(sys.argv) > 9 else 0
    qk = float(sys.argv[10]) if len(sys.argv) > 10 else 1.0
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    raw = json.load(open(cfg_path))
    raw["vocab_size"] = vocab
    model = Qwen3ForCausalLM(Qwen3Config(**raw))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.fill_(qk)
            layer.self_attn.k_norm.weight.fill_(qk)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)

    def sample(n):
        # Token 0..15 are left out (special tokens of a real tokenizer live there). One gap
        # length per batch keeps the rows rectangular; it varies from batch to batch.
        x = torch.randint(16, vocab, (n, length), generator=gen)
        g = int(torch.randint(0, max_gap + 1, (1,), generator=gen))
        gap = torch.randint(16, vocab, (n, g), generator=gen)
        return torch.cat([x, gap, x], dim=1)

    def copy_stats(ids):
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -length - 1:-1]
        tgt = ids[:, -length:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tgt.reshape(-1))
        # The first token of the copy cannot be predicted; score the other L-1.
        acc = (logits.argmax(-1)[:, 1:] == tgt[:, 1:]).float().mean()
        return loss.item(), acc.item()

    # Held-out rows, 8 batches (so, with GAP, several distances), scored batch by batch.
    held = [sample(8) for _ in range(8)]
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
            stats = [copy_stats(h) for h in held]
            cl = sum(x[0] for x in stats) / len(stats)
            ca = sum(x[1] for x in stats) / len(stats)
            model.train()
            print(json.dumps({"step": k, "s": round(time.time() - t0), "loss": round(loss.item(), 3),
                              "copy_loss": round(cl, 3), "copy_acc": round(ca, 3)}), flush=True)


if __name__ == "__main__":
    main()
