"""Build FlashInfer's JIT sampling kernels ahead of the first engine, while the model's pieces still travel.

Run on the GPU machine by `scripts/gpu-visit early`, detached, as soon as the engine bundle is installed. Why:
flashinfer-python 0.6.14 ships no AOT kernels, so the baseline's first start spends 88-114 s compiling
`sampling.cu` with nvcc, silently (reports/evidence/2026-12-01-h200-flashinfer-cache). The build needs no model, so
it can overlap the 26 staging calls of a Qwen visit instead of delaying the first timed window. It calls vLLM's own
`flashinfer_sample` on every branch (top-k, top-p, both) so the same module lands in $FLASHINFER_WORKSPACE_BASE,
where the engines later load it. Nothing an engine reports depends on who built the module first.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sample

    started = time.monotonic()
    rows, vocab = 4, 151_936
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.float32)
    top_k = torch.full((rows,), 20, device="cuda", dtype=torch.int32)
    top_p = torch.full((rows,), 0.9, device="cuda", dtype=torch.float32)
    for k, p in ((top_k, top_p), (top_k, None), (None, top_p)):
        flashinfer_sample(logits, k, p, {})
    torch.cuda.synchronize()
    root = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    report = {"build_s": round(time.monotonic() - started, 1),
              "modules": sorted(str(p.relative_to(root)) for p in root.rglob("*.so")) if root.is_dir() else []}
    print(json.dumps(report), flush=True)
    out = Path(os.environ.get("RESULTS_DIR", "/tmp/results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "flashinfer-warm.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
