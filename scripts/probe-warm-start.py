"""Does the SFT'd smoke model copy the question's entity into its research? (issue 25)

The research world's skill starts with one act: search for the entity the question names.
This probe measures it on tasks the model never trained on, before any RL, greedily (no
sampling noise), with the model served by transformers from its own directory:

  free     the model writes its plan from the chat prompt; the first <call_tool> query it
           writes names the question's entity (or not);
  forced   the model is given the offline teacher's own first segment up to the query
           (`sft-data` rows for the same tasks) and writes the query alone.

usage: .venv/bin/python scripts/probe-warm-start.py MODEL_DIR SFT_ROWS.jsonl [N]
       (SFT_ROWS: `orchestrator sft-data --set data.tasks=runs/smoke/world/heldout.jsonl ...`)
Prints one JSON object: tasks, free/forced hits, and the first few examples.

       .venv/bin/python scripts/probe-warm-start.py induction MODEL_DIR CORPUS.jsonl [N]
The plain copying test under both: eight random entity names, then "Again:" and the first
three; does the model continue with the fourth (greedy)? A model without an induction
circuit cannot, whatever its scaffold.

       .venv/bin/python scripts/probe-warm-start.py tokens MODEL_DIR SFT_ROWS.jsonl [N]
Teacher-forced, no sampling: given the offline teacher's first segment up to each mention of
the question's entity, is the entity's first token the model's top-1 prediction (in the plan,
whose checklist repeats the question's clauses, and in the search query)? Also the top-1
accuracy on random-token copy rows, with the copy at a fixed distance (32 back) and at a random
one (what `trainer sft --copy-rows` trains): a model that only reads a fixed offset back scores
on the first and not on the second. And the second hop: the first token of the entity the first
search's tool output names, where the teacher writes it next (its state evaluation and its second
query), which only copying from the tool output predicts.
"""

import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

OPEN = '<call_tool name="google_search">'


def entity(question):
    m = re.search(r"the (\S+) gene", question) or re.search(r"compound that (\S+) binds", question)
    return m.group(1) if m else None


def greedy(model, tok, text, new):
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:])


def names_of(corpus):
    out = []
    for line in open(corpus):
        t = json.loads(line)["title"]
        for cut in (" (protein)", " (compound)", " (disambiguation)", " gene"):
            t = t.replace(cut, "")
        out.append(t.replace("The ", ""))
    return out


def induction(model_dir, corpus, n):
    import random

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    names = names_of(corpus)
    rng = random.Random(5)
    prompt = tok.apply_chat_template([{"role": "system", "content": ""},
                                      {"role": "user", "content": ""}],
                                     tokenize=False, add_generation_prompt=True)
    hits, examples = 0, []
    for _ in range(n):
        pick = [rng.choice(names) for _ in range(8)]
        text = prompt + ", ".join(pick) + ".\nAgain: " + ", ".join(pick[:3]) + ","
        cont = greedy(model, tok, text, 12)
        hits += cont.strip().startswith(pick[3])
        if len(examples) < 3:
            examples.append({"want": pick[3], "got": cont.strip()[:40]})
    print(json.dumps({"model": model_dir, "trials": n, "copied": hits, "examples": examples},
                     indent=1))


SPAN = 32


def copy_rows(tok, fixed, n=16, span=SPAN):
    gen = torch.Generator().manual_seed(9)
    ordinary = [i for i in range(len(tok)) if i not in tok.added_tokens_decoder]
    pick = lambda k: [ordinary[j] for j in torch.randint(0, len(ordinary), (k,), generator=gen)]
    rows = []
    for _ in range(n):
        x = pick(span)
        gap = [] if fixed else pick(int(torch.randint(0, span + 1, (1,), generator=gen)))
        rows.append(x + gap + x)
    return rows


def chat_prompt(tok, row):
    """The chat prompt of an `sft-data` row (its system and user messages)."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in row["messages"][:2]]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def tally(counts, enc, pred, c):
    """Count whether the token holding character c (a leading space included) is the model's
    top-1 prediction from the position before it."""
    k = next(i for i, (a, b) in enumerate(enc.offset_mapping) if a <= c < b)
    counts[0] += int(pred[k - 1]) == enc.input_ids[k]
    counts[1] += 1


def tokens(model_dir, rows_path, limit):
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    report = {"model": model_dir}
    for name, fixed in (("copy_fixed_acc", True), ("copy_random_distance_acc", False)):
        hit = total = 0
        for ids in copy_rows(tok, fixed):
            with torch.no_grad():
                pred = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)
            # The second copy after its first token: predicted from position t-1.
            for t in range(len(ids) - SPAN + 1, len(ids)):
                hit += int(pred[t - 1]) == ids[t]
                total += 1
        report[name] = round(hit / total, 3)
    plan, query, hop = [0, 0], [0, 0], [0, 0]
    for r in [json.loads(line) for line in open(rows_path)][:limit]:
        prompt = chat_prompt(tok, r)
        ent = entity(r["messages"][1]["content"])
        segs = [s["text"] for s in r["segments"]]
        # The second hop: after the first search's tool output, the teacher names the entity
        # that output gives (its state evaluation, then its next query). Seen only in the
        # snippet, so the model predicts it only by copying from the tool output (or guesses it
        # from memory). Rows without one are scored on the first segment alone.
        nxt = None
        if len(segs) >= 3 and OPEN in segs[2]:
            q = segs[2].split(OPEN, 1)[1].split("</call_tool>", 1)[0]
            nxt = q.removeprefix("The ").split(" (", 1)[0].strip()
            if not nxt or nxt not in segs[1]:
                nxt = None
        seg = segs[0]
        head = prompt + seg + segs[1]
        # One forward pass per row: the model is causal, so the prediction at a position of
        # the first segment does not depend on what follows it.
        text = head + segs[2] if nxt else prompt + seg
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([enc.input_ids])).logits[0].argmax(-1)
        for m in re.finditer(re.escape(ent or "\0"), seg):
            where = query if seg.rfind(OPEN, 0, m.start()) > seg.rfind("</call_tool>", 0, m.start()) else plan
            tally(where, enc, pred, len(prompt) + m.start())
        if nxt:
            for m in re.finditer(re.escape(nxt), segs[2]):
                tally(hop, enc, pred, len(head) + m.start())
    report["entity_top1_plan"] = f"{plan[0]}/{plan[1]}"
    report["entity_top1_query"] = f"{query[0]}/{query[1]}"
    report["next_entity_top1_after_tool_output"] = f"{hop[0]}/{hop[1]}"
    print(json.dumps(report))


def main():
    if sys.argv[1] == "tokens":
        tokens(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 16)
        return
    if sys.argv[1] == "induction":
        induction(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 20)
        return
    model_dir, rows_path = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = [json.loads(line) for line in open(rows_path)][:limit]
    free = forced = 0
    examples = []
    for r in rows:
        prompt = chat_prompt(tok, r)
        ent = entity(r["messages"][1]["content"])
        text = greedy(model, tok, prompt, 400)
        q_free = text.split(OPEN, 1)[1].split("<", 1)[0] if OPEN in text else ""
        seg = r["segments"][0]["text"]
        cut = seg.index(OPEN) + len(OPEN)
        q_forced = greedy(model, tok, prompt + seg[:cut], 16).split("<", 1)[0]
        free += bool(ent) and ent.lower() in q_free.lower()
        forced += bool(ent) and ent.lower() in q_forced.lower()
        if len(examples) < 4:
            examples.append({"entity": ent, "free": q_free.strip(), "forced": q_forced.strip()})
    print(json.dumps({"model": model_dir, "tasks": len(rows), "free_hits": free,
                      "forced_hits": forced, "examples": examples}, indent=1))


if __name__ == "__main__":
    main()
