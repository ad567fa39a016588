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


def main():
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
        msgs = [{"role": m["role"], "content": m["content"]} for m in r["messages"][:2]]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
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
