#!/usr/bin/env python3
"""One forward call of a peer (FA4-sm90, cuDNN or FA2) inside a CUDA profiler
range, for ncu with `--profile-from-start off` (scripts/ncu-compare.sh runs
it): the inputs and the call are bench_torch.py's for the same row of the
standard grid (16384 tokens, hidden 2048, [batch, seqlen, heads, d]), and
the call runs 200 times before the range (FA4 compiles on its first call).

usage: python3 peer_one.py fa4|cudnn|fa2 HEAD_DIM SEQLEN causal|non-causal f16|bf16
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402


def main():
    if len(sys.argv) != 6 or sys.argv[1] not in dict(bt.PEERS) or sys.argv[4] not in ("causal", "non-causal"):
        sys.exit(__doc__.strip().splitlines()[-1])
    key, d, s, causal, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "causal", sys.argv[5]
    import torch

    bt.torch = torch
    row = {"dtype": dtype, "head_dim": d, "seqlen": s, "batch": 16384 // s, "heads": 2048 // d, "causal": causal}
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
