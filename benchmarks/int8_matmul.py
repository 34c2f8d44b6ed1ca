"""Can int8 weights make the drafter's matmuls cheaper on this CPU? Microseconds per product.

    python benchmarks/int8_matmul.py --output benchmarks/results/int8_matmul_cpu.json

A drafting pass multiplies a block of M = 16-32 rows by the drafter's matrices (576 x 1536 and
1536 x 576 in the SmolLM2 drafter) and by the 8,192-row draft head. bf16 streams 2 bytes per weight;
int8 would stream one. Compared, interleaved, median of ``--iters`` calls each:

- ``bf16``: ``F.linear`` on bf16 activations and weights (what the drafter runs);
- ``int8_weight_only``: ``torch._weight_int8pack_mm`` (bf16 activations, int8 weights, per-row scales);
- ``int8_dynamic``: activations quantised per row on the fly, then ``torch._int_mm`` (int8 x int8 -> int32)
  and the two scales applied (the whole product, as a drafter would run it);
- ``int8_dynamic_mm_only``: the ``torch._int_mm`` call alone (a lower bound for a fused kernel);
- ``ao_dynamic_quantized``: ``torch.ao.quantization.quantize_dynamic``'s Linear (deprecated in torch,
  measured for reference only), fp32 in and out.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import torch
import torch.nn.functional as F

from hf_jetspec.drafter.weight_storage import quantize_rows


def _median_us(fns: dict, iters: int) -> dict:
    for f in fns.values():
        for _ in range(10):
            f()
    samples = {k: [] for k in fns}
    for _ in range(iters):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            samples[k].append(time.perf_counter() - t)
    return {k: round(sorted(v)[len(v) // 2] * 1e6, 1) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,32")
    ap.add_argument("--shapes", default="1536x576,576x1536,8192x576", help="comma list of OUTxIN weight shapes")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    rows = []
    for m in [int(x) for x in args.rows.split(",")]:
        for shape in args.shapes.split(","):
            n, k = (int(x) for x in shape.split("x"))
            x = torch.randn(m, k, dtype=torch.bfloat16)
            w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
            wq, w_scale = quantize_rows(w)
            wq_t = wq.t().contiguous()
            xq_fixed = torch.randint(-127, 128, (m, k), dtype=torch.int8)

            def dynamic():
                xf = x.float()
                s = xf.abs().amax(1, keepdim=True).clamp_min(1e-8) / 127
                acc = torch._int_mm(torch.round(xf / s).to(torch.int8), wq_t)
                return (acc.float() * s * w_scale).to(torch.bfloat16)

            fns = {
                "bf16": lambda: F.linear(x, w),
                "int8_weight_only": lambda: torch._weight_int8pack_mm(x, wq, w_scale.to(torch.bfloat16)),
                "int8_dynamic": dynamic,
                "int8_dynamic_mm_only": lambda: torch._int_mm(xq_fixed, wq_t),
            }
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    from torch.ao.quantization import quantize_dynamic

                    lin = torch.nn.Linear(k, n, bias=False)
                    lin.weight.copy_(w.float())
                    ao = quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)
                    xf32 = x.float()
                    fns["ao_dynamic_quantized"] = lambda: ao(xf32)
                except Exception as err:  # removed in a later torch
                    print(f"ao dynamic quantisation unavailable: {err}")
                us = _median_us(fns, args.iters)
            err = (dynamic().float() - F.linear(x.float(), w.float())).abs().max().item()
            row = {"rows": m, "out": n, "in": k, "us": us, "int8_dynamic_max_abs_error": round(err, 5),
                   "ratio_vs_bf16": {name: round(us["bf16"] / v, 2) for name, v in us.items() if name != "bf16"}}
            rows.append(row)
            print(row, flush=True)
    result = {"config": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.machine(), "rows": rows}
    with open(args.output, "w") as fh:
        fh.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
