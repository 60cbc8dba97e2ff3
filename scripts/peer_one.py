#!/usr/bin/env python3
"""One forward call of a peer (FA4-sm90, cuDNN or FA2) inside a CUDA profiler
range, for ncu with `--profile-from-start off` (scripts/ncu-compare.sh runs
it): the row is the first prefill row of our bench's JSONL with the mask
asked for, so its shape is the one our launch was profiled on; the inputs and
the call are bench_torch.py's, and the call runs 200 times before the range
(FA4 compiles on its first call).

usage: python3 peer_one.py fa4|cudnn|fa2 OURS.jsonl causal|non-causal
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in dict(bt.PEERS) or sys.argv[3] not in ("causal", "non-causal"):
        sys.exit(__doc__.strip().splitlines()[-1])
    key, ours, causal = sys.argv[1], sys.argv[2], sys.argv[3] == "causal"
    rows = [json.loads(line) for line in open(ours) if line.strip()]
    row = next((r for r in rows if r.get("kind", "prefill") == "prefill" and r["causal"] == causal), None)
    if row is None:
        sys.exit(f"peer_one: no {sys.argv[3]} prefill row in {ours}")
    import torch

    bt.torch = torch
    peers = bt.Peers([key])
    if key in peers.missing:
        sys.exit(f"peer_one: {key}: {peers.missing[key]}")
    q, k, v = bt.row_inputs(row)
    context, call = peers.call(key, row, q, k, v)
    with context:
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"peer_one: {key} {bt.shape_text(row)}: one call profiled")


if __name__ == "__main__":
    main()
