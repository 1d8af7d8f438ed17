"""Where a family's rocmflash bf16 model departs from eager fp32: rounding, or a wrong kernel?

For each family (the tiny random models of ``tests/test_hf_families_interp.FAMILIES``, the GPU test's seeds) it
prints, against eager fp32 on the same weights:

* the relative error of full-sequence logits for rocmflash bf16, eager bf16 and SDPA bf16 (the bf16 floor);
* greedy ``generate()`` agreement with eager fp32 (8 new tokens, 2 prompts of 16) for the same three;
* teacher forcing on eager fp32's generated tokens: each model's logits step by step through its KV cache, against
  eager fp32's, and against the same model's own one-pass (no cache) logits of that sequence -- a decode kernel
  that is right stays at its own prefill's rounding; and eager fp32's top-1/top-2 margin at each step (a near tie
  flips under any bf16 rounding).

Usage (repo root, GPU box): ``python benchmarks/hf_family_drift.py [--families mistral,gpt_oss,llama] [--out DIR]``
"""

import argparse
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import transformers  # noqa: E402

import rocmflash.integrations.hf as rf_hf  # noqa: E402
from test_hf_families_interp import COMMON, FAMILIES, VOCAB  # noqa: E402

SEQ, NEW, PROMPT = 64, 8, 16


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _models(family):
    config_name, model_name, extra = FAMILIES[family]
    cfg = getattr(transformers, config_name)(**COMMON, **extra)
    torch.manual_seed(sum(map(ord, family)))
    name = rf_hf.register()
    eager = getattr(transformers, model_name)._from_config(cfg, attn_implementation="eager").cuda().eval()
    out = {"eager-fp32": eager}
    for label, impl in (("rocmflash-bf16", name), ("eager-bf16", "eager"), ("sdpa-bf16", "sdpa")):
        if impl == "sdpa" and family == "gpt_oss":
            continue
        m = copy.deepcopy(eager).to(torch.bfloat16)
        m.set_attn_implementation(impl)
        out[label] = m
    return out


@torch.no_grad()
def _teacher_forced(model, seq):
    """Logits (B, NEW, V) of steps PROMPT..PROMPT+NEW-1 through the KV cache, and of one pass without cache."""
    full = model(input_ids=seq, use_cache=False).logits[:, PROMPT - 1:PROMPT - 1 + NEW].float()
    out = model(input_ids=seq[:, :PROMPT], use_cache=True)
    steps, pkv = [out.logits[:, -1].float()], out.past_key_values
    for t in range(PROMPT, PROMPT + NEW - 1):
        out = model(input_ids=seq[:, t:t + 1], past_key_values=pkv, use_cache=True)
        steps.append(out.logits[:, -1].float())
        pkv = out.past_key_values
    return torch.stack(steps, 1), full


def run_family(family):
    models = _models(family)
    torch.manual_seed(1)
    embeds = torch.randn(2, SEQ, COMMON["hidden_size"], device="cuda")
    with torch.no_grad():
        ref_logits = models["eager-fp32"](inputs_embeds=embeds, use_cache=False).logits.float()
    torch.manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, PROMPT), device="cuda")
    gen = {}
    with torch.no_grad():
        for label, m in models.items():
            gen[label] = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                    min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    seq = gen["eager-fp32"]
    ref_steps, _ = _teacher_forced(models["eager-fp32"], seq)
    top2 = ref_steps.topk(2, -1).values
    margin = (top2[..., 0] - top2[..., 1])
    rows = []
    for label, m in models.items():
        with torch.no_grad():
            logits = m(inputs_embeds=embeds.to(next(m.parameters()).dtype), use_cache=False).logits.float()
        steps, full = _teacher_forced(m, seq)
        rows.append(dict(family=family, model=label, logits_vs_fp32=_rel(logits, ref_logits),
                         generate_agree=(gen[label][:, PROMPT:] == seq[:, PROMPT:]).float().mean().item(),
                         tokens=gen[label][:, PROMPT:].tolist(),
                         steps_vs_fp32=[_rel(steps[:, i], ref_steps[:, i]) for i in range(NEW)],
                         steps_vs_own_prefill=[_rel(steps[:, i], full[:, i]) for i in range(NEW)],
                         fp32_margin=margin.tolist()))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="mistral,gpt_oss,llama")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    for family in args.families.split(","):
        rows += run_family(family)
    lines = ["| family | model | logits vs fp32 | generate agree | max step vs fp32 | max step vs own prefill |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['model']} | {r['logits_vs_fp32']:.4f} | {r['generate_agree']:.3f} | "
                     f"{max(r['steps_vs_fp32']):.4f} | {max(r['steps_vs_own_prefill']):.4f} |")
    text = "\n".join(lines)
    print(text)
    for r in rows:
        print(r["family"], r["model"], "tokens", r["tokens"])
        print("   steps vs fp32", [round(x, 4) for x in r["steps_vs_fp32"]])
        print("   steps vs own prefill", [round(x, 4) for x in r["steps_vs_own_prefill"]])
    print("fp32 margins", {r["family"]: [[round(x, 3) for x in row] for row in r["fp32_margin"]]
                           for r in rows if r["model"] == "eager-fp32"})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hf_family_drift.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "hf_family_drift.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
