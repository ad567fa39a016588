"""The PyTorch + transformers reference for scripts/bench-trainer.sh: the same train step as
`trainer bench` (random Qwen3 from a config.json, SDPA, the clipped policy loss with per-token
advantages and truncated importance weights, token-mean, backward, AdamW), timed the same way.
Prints one JSON line."""

import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--lora-r", type=int, default=0)
    ap.add_argument("--grad-checkpoint", action="store_true")
    ap.add_argument("--device", default="auto")
    # On CUDA: "bf16" keeps bf16 parameters and AdamW state (no fp32 master copy, so at the
    # papers' lr most updates round away); "amp" keeps fp32 parameters (the master copy) under
    # bf16 autocast with the fused AdamW, as the Hugging Face Trainer runs bf16 by default. The
    # trainer keeps bf16 parameters with fp32 master weights and moments.
    ap.add_argument("--precision", choices=["bf16", "amp"], default="bf16")
    a = ap.parse_args()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dev = torch.device("cuda" if (a.device in ("auto", "cuda") and torch.cuda.is_available()) else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    amp = dev.type == "cuda" and a.precision == "amp"
    if amp:
        dtype = torch.float32
    cfg = Qwen3Config(**json.load(open(a.config)), attn_implementation="sdpa")
    torch.manual_seed(1)
    if dev.type == "cuda":
        # Built on the GPU in bf16: an 8B model initialised in fp32 on the CPU first would take
        # minutes and 32 GB of host memory before the first timed step.
        torch.set_default_dtype(dtype)
        with torch.device(dev):
            model = Qwen3ForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    else:
        model = Qwen3ForCausalLM(cfg).to(dev, dtype)
    if a.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=a.lora_r, lora_alpha=2 * a.lora_r, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.float()
    if a.grad_checkpoint:
        model.gradient_checkpointing_enable()
        if a.lora_r > 0:
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0, fused=True if amp else None)
    n, t = a.seqs, a.seq_len
    ids = (torch.arange(t).unsqueeze(0) * 7919 + torch.arange(n).unsqueeze(1) * 104729) % cfg.vocab_size
    ids = ids.to(dev)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    stage = (torch.arange(1, t) * 4 // t).to(dev)
    adv = torch.tensor([0.5, -0.2, 0.1, 0.3], device=dev)[stage].unsqueeze(0).expand(n, -1)
    behaviour = torch.full_like(adv, -2.0)
    mask = torch.ones_like(adv)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=inputs).logits.float()
        logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        old = logp.detach()
        ratio = torch.exp(logp - old)
        pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.28))
        tis = torch.clamp(torch.exp(old - behaviour), max=2.0)
        loss = (tis * pg * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        # The peak over the timed steps, as `trainer bench` reports it.
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / max(a.steps, 1)
    out = {"tokens_per_step": n * t, "seconds_per_step": secs,
           "tokens_per_second": n * t / secs, "torch": torch.__version__,
           "threads": torch.get_num_threads()}
    if dev.type == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    print(json.dumps(out))


if __name__ == "__main__":
    main()
