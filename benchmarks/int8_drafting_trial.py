"""Trial: the drafter's matmuls in dynamic int8, eager and compiled, against bf16 (a J1 round at budget 16).

    python benchmarks/int8_drafting_trial.py --drafter runs/smollm2-v1 --iters 30 --output benchmarks/results/int8_drafting_trial_smollm2.json

The int8 variants use the engine's int8 drafting (``drafter.set_int8_drafting``, what
``DraftingConfig(int8=True)`` switches on; :mod:`hf_jetspec.drafter.int8_drafting`): every ``nn.Linear`` of the
drafter's layers and its draft head multiply int8 activations (quantised per row on the fly) by int8
weights (per output channel) through ``torch._int_mm``. Timed with ``benchmarks/round_cost.py``'s helpers
(median of interleaved calls, each right after an untimed bf16 target step over a 256-token GSM8K
context): one J1 round (two drafter passes, no early stop) for bf16 and int8, eager and compiled
(``compile_drafting``), against one plain target step. ``int8_draft_token_agreement`` is the share
of draft tokens the int8 drafter drafts as the bf16 one does, over blocks along that context.
"""

import argparse
import json
import time

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.data import load_eval_prompts
from round_cost import _timed_interleaved, plain_target_step  # this folder is on sys.path when run as a script

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--drafter", default="hub_cards/jetspec-smollm2-135m")
ap.add_argument("--iters", type=int, default=30)
ap.add_argument("--output", required=True)
args = ap.parse_args()
torch.set_grad_enabled(False)
torch.manual_seed(0)


target, tok = load_target("smollm2-135m", dtype="bfloat16")
prompt = load_eval_prompts("gsm8k", limit=1)[0].turns[0]
ids = tok.apply_chat_template(
    [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
)["input_ids"]
n = 256
ids = target.generate(ids, max_new_tokens=n + 1 - ids.shape[1], min_new_tokens=n + 1 - ids.shape[1], do_sample=False)[
    :, : n + 1
]
out = target(ids[:, :-1], output_hidden_states=True)
step = plain_target_step(target, ids, n)

seq = ids[0]
anchor = seq[n : n + 1]
gen = torch.Generator().manual_seed(0)
block = torch.cat([anchor, seq[:n][torch.randint(0, n, (14,), generator=gen)]])
drafters = {}
for name in ["bf16", "int8", "bf16-compiled", "int8-compiled"]:
    d = JetSpecDrafter.from_pretrained(args.drafter)
    d.attach_target(target)
    if name.startswith("int8"):
        d.set_int8_drafting(True)
    if name.endswith("compiled"):
        d.compile_drafting()
    states = torch.cat([out.hidden_states[i + 1] for i in d.config.target_layer_ids], -1)
    c = d.new_cache()
    d.append_context(c, states, torch.arange(n))
    t0 = time.perf_counter()
    d.draft_block(c, block, n)
    drafters[name] = (d, c, round(time.perf_counter() - t0, 2))


def round_(d, c):
    dr = d.draft_block(c, block, n)
    return d.draft_block(c, torch.cat([anchor, dr[:-1]]), n)


fns = {"target_step": step, **{k: (lambda d=d, c=c: round_(d, c)) for k, (d, c, _) in drafters.items()}}
ms = _timed_interleaved(fns, args.iters, before=step)
res = {
    "ms": ms,
    "share_of_step": {k: round(v / ms["target_step"], 4) for k, v in ms.items() if k != "target_step"},
    "first_call_s": {k: v[2] for k, v in drafters.items()},
}
# agreement of draft tokens (int8 vs bf16) over blocks drawn from the context
agree = tot = 0
for s in range(16, n - 16, 8):
    b = torch.cat([seq[s : s + 1], seq[:n][torch.randint(0, n, (14,), generator=gen)]])
    a = drafters["bf16"][0].draft_block(drafters["bf16"][1], b, n)
    q = drafters["int8"][0].draft_block(drafters["int8"][1], b, n)
    agree += int((a == q).sum())
    tot += a.numel()
res["int8_draft_token_agreement"] = round(agree / tot, 4)
res = {"config": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(), **res}
print(json.dumps(res, indent=1))
with open(args.output, "w") as fh:
    fh.write(json.dumps(res, indent=2) + "\n")
