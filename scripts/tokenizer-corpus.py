#!/usr/bin/env python3
"""Assemble the smoke warm start's tokenizer corpus from the research world and the SFT data.

usage: tokenizer-corpus.py DIR [--names corpus|keep|drop]
Reads DIR/world/corpus.jsonl and DIR/sft.jsonl; writes DIR/tokenizer-corpus.txt (each document's
title and text, then each demonstration's system and user messages and its segments).

The world's entity names (every gene, protein, compound, institute, city and distractor name,
found from the documents themselves: their titles, and the city in each institute's text; in
any case, since URLs carry them lower-cased) are handled by --names:
- corpus (the default): names stay in the documents and are left out of the SFT text, so every
  name, of a training lineage or a held-out one, is as frequent as the world makes it;
- keep: the SFT text keeps them (the tokenizer corpus of sessions 14-26);
- drop: no names anywhere.
Why (issue 25, BENCHMARKS.md session 27): BPE merges what is frequent, and the SFT data repeats
the names of its own lineages. With `keep` (4,096 entries) a training name took 1.7 pieces, a
held-out name 2.5, and a third of the held-out names' pieces occur fewer than 20 times in the SFT
data, so the warm start never trains their embeddings. With `corpus` every name is spelled in
pieces shared across the world's names (2,048 entries: 3.0-3.2 pieces a name for held-out,
unseen and training lineages alike, 0.3-3% of them rare). `drop` spells names almost letter by
letter (6-9 pieces).
Standard library only.
"""
import argparse
import json
import re
import sys

WORD = re.compile(r"[A-Za-z0-9]+")
TITLE = [
    re.compile(r"^The (\S+) gene$"),
    re.compile(r"^(\S+) \((?:protein|compound|disambiguation)\)$"),
    re.compile(r"^(\S+) Institute$"),
]
CITY = re.compile(r"research institute located in (\S+?)\.")


def entity_names(docs):
    names = set()
    for d in docs:
        for pat in TITLE:
            m = pat.match(d.get("title", ""))
            if m:
                names.add(m.group(1).lower())
        m = CITY.search(d.get("text", ""))
        if m:
            names.add(m.group(1).lower())
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--names", choices=["corpus", "keep", "drop"], default="corpus")
    a = ap.parse_args()
    docs = []
    with open(f"{a.dir}/world/corpus.jsonl") as f:
        for n, line in enumerate(f, 1):
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{a.dir}/world/corpus.jsonl:{n}: not JSON ({e})")
    names = entity_names(docs) if a.names != "keep" else set()
    if a.names != "keep" and not names:
        raise SystemExit(f"{a.dir}/world/corpus.jsonl: no entity names found to drop")

    def clean(text: str) -> str:
        if not names:
            return text
        return WORD.sub(lambda m: "" if m.group(0).lower() in names else m.group(0), text)

    # The documents lose their names only with `drop`; the SFT text with `corpus` and `drop`.
    doc_clean = clean if a.names == "drop" else (lambda t: t)
    lines = 0
    with open(f"{a.dir}/tokenizer-corpus.txt", "w") as out:
        for d in docs:
            out.write(doc_clean(d["title"]) + "\n" + doc_clean(d["text"]) + "\n")
            lines += 2
        with open(f"{a.dir}/sft.jsonl") as f:
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{a.dir}/sft.jsonl:{n}: not JSON ({e})")
                for m in row["messages"][:2]:
                    out.write(clean(m["content"]) + "\n")
                    lines += 1
                for s in row["segments"]:
                    out.write(clean(s["text"]) + "\n")
                    lines += 1
    print(
        f"tokenizer-corpus: {lines} lines, entity names {a.names}"
        + (f" ({len(names)} names)" if names else ""),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
