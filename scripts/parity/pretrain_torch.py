"""The same pretraining run as `trainer sft` on scripts/pretrain-rows.py output, in PyTorch +
transformers (issue 25): same model directory, rows, prompt rendering, loss mask, AdamW, batch 8,
cosine 2e-3 with 10 warm-up steps and clip 1.0, so the induction probe can tell whether a failure
to copy is the trainer's or the recipe's.

usage: .venv/bin/python scripts/parity/pretrain_torch.py MODEL_DIR ROWS.jsonl OUT_DIR STEPS
"""
import json, math, random, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.manual_seed(0); torch.set_num_threads(2)
d, rows_path, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(d)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
m.train()
prompt = tok.apply_chat_template([{"role":"system","content":""},{"role":"user","content":""}], tokenize=False, add_generation_prompt=True)
p_ids = tok(prompt, add_special_tokens=False).input_ids
end = tok.convert_tokens_to_ids("<|im_end|>")
rows = [json.loads(l) for l in open(rows_path)]
seqs = []
for r in rows:
    s = tok(r["segments"][0]["text"], add_special_tokens=False).input_ids + [end]
    seqs.append((p_ids + s, [0]*len(p_ids) + [1]*len(s)))
opt = torch.optim.AdamW(m.parameters(), lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
def lr_at(k):
    if k <= 10: return k/10
    p = (k-10)/max(1, steps-10); return 0.1 + 0.9*0.5*(1+math.cos(math.pi*p))
rng = random.Random(17); order = list(range(len(seqs))); rng.shuffle(order)
t0 = time.time()
for k in range(1, steps+1):
    batch = [seqs[order[(k-1)*8 + i]] for i in range(8)]
    L = max(len(b[0]) for b in batch)
    ids = torch.tensor([b[0] + [0]*(L-len(b[0])) for b in batch])
    att = torch.tensor([[1]*len(b[0]) + [0]*(L-len(b[0])) for b in batch])
    lm = torch.tensor([b[1] + [0]*(L-len(b[1])) for b in batch], dtype=torch.float32)
    for g in opt.param_groups: g["lr"] = 2e-3*lr_at(k)
    logits = m(input_ids=ids, attention_mask=att).logits[:, :-1]
    tgt = ids[:, 1:]; mask = lm[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none").view_as(mask)
    loss = (nll*mask).sum()/mask.sum()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    if k % 50 == 0: print(k, round(loss.item(), 3), round(time.time()-t0), flush=True)
m.save_pretrained(out); tok.save_pretrained(out)
