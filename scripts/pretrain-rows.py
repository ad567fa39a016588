"""Pretraining rows for the smoke model, in `trainer sft`'s row format (issue 25).

The small model starts from random weights; the papers' policy starts from Qwen3-8B, which
already copies text it has seen in its context. This writes the stand-in for that
pretraining, from the world corpus alone (no task, no answer, no rubric):

  corpus    one lineage's documents in chain order (gene, protein, compound, institute),
            lineages shuffled and packed to about CHARS characters: each entity name comes
            back in the next document, so predicting it means copying it;
  repeat    a random list of the corpus's entity names written twice: the second half is
            predictable only by copying the first (the induction-head exercise).

Every row is one model segment after an empty system and user message, so the loss covers
all of it. Documents of held-out lineages are in the corpus too (they are searchable at
evaluation time), but no question about them and no chain through them beyond what their
documents say.

usage: python3 scripts/pretrain-rows.py CORPUS.jsonl OUT.jsonl [ROWS] [CHARS] [SEED]
"""

import json
import random
import re
import sys


def main():
    corpus, out = sys.argv[1], sys.argv[2]
    n_rows = int(sys.argv[3]) if len(sys.argv) > 3 else 2400
    chars = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 17)
    docs = [json.loads(line) for line in open(corpus)]
    lineages = {}
    for d in docs:
        m = re.match(r"(gene|protein|compound|institute)-(\d+)$", d["id"])
        if m:
            lineages.setdefault(m.group(2), {})[m.group(1)] = d
    order = ["gene", "protein", "compound", "institute"]
    chains = [
        "\n".join(f"{l[k]['title']}\n{l[k]['text']}" for k in order if k in l)
        for l in lineages.values()
    ]
    names = sorted({d["title"].replace(" (protein)", "").replace(" (compound)", "")
                    .replace(" (disambiguation)", "").replace("The ", "").replace(" gene", "")
                    for d in docs})
    rows = []
    while len(rows) < n_rows:
        if len(rows) % 2 == 0:
            text = ""
            while len(text) < chars:
                text += rng.choice(chains) + "\n\n"
        else:
            k = rng.randint(16, 48)
            pick = [rng.choice(names) for _ in range(k)]
            text = ", ".join(pick) + ".\nAgain: " + ", ".join(pick) + "."
        rows.append({
            "id": f"pretrain-{len(rows)}",
            "messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
            "segments": [{"kind": "model", "text": text}],
        })
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(json.dumps({"rows": len(rows), "lineages": len(chains), "names": len(names)}))


if __name__ == "__main__":
    main()
