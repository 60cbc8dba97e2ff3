#!/usr/bin/env python3
"""Adds torch's figures to our benchmark, measured in the same run.

usage: bench_torch.py OURS.jsonl [--markdown OUT.md]

For every prefill shape in OURS.jsonl (written by `bench --out`), times
torch's SDPA with the flash backend (FlashAttention-2) and the cuDNN backend
on the same GPU, with the same shapes and FLOP count, and prints one table
with our ratio to each. The variable-length rows (`"kind": "varlen"`)
follow, beside FlashAttention-2's varlen forward, then the decode rows
(`"kind": "decode"`) as a third table: our times (one call alone, and back to back) and K/V read
bandwidth beside the device-to-device copy bandwidth the bench measured in
the same run.
"""
import json
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


LAYOUTS = {"bshd": "[batch, seqlen, heads, d]", "bhsd": "[batch, heads, seqlen, d]"}


WARM_UP_SECONDS = 0.5


def median_ms(call, reps=30):
    """Median milliseconds per call of `reps` calls queued back to back, after
    WARM_UP_SECONDS of the same call back to back: an event between each two
    calls and one synchronization at the end. A first, untimed call keeps the
    GPU busy while the rest are queued, so each call's time is the GPU's
    alone; Python's and torch's time to queue a call hides behind the call
    before. The warm-up lets the timed calls see the clocks the GPU holds
    under this call's sustained load, whatever ran before. (The same method
    as our bench.)"""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP_SECONDS:
        for _ in range(4):
            call()
        torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    call()
    events[0].record()
    for event in events[1:]:
        call()
        event.record()
    events[-1].synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in zip(events, events[1:]))
    return times[len(times) // 2]


def tflops(row, ms):
    b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
    return 4 * b * h * s * s * d / (2 if row["causal"] else 1) / (ms * 1e-3) / 1e12


def time_sdpa(backend, row):
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[row["dtype"]]
    b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
    # The same memory as ours: [b, s, h, d] viewed as SDPA's [b, h, s, d]
    # (as a projection's output split into heads lies), or [b, h, s, d].
    if row.get("layout", "bshd") == "bshd":
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(3))
    else:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    try:
        with sdpa_kernel([backend]):
            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=row["causal"]))
    except RuntimeError as e:
        print(f"  {backend}: unavailable for {row}: {e}", file=sys.stderr)
        return float("nan")
    return tflops(row, ms)


def time_fa2_varlen(row):
    """FlashAttention-2's variable-length forward (torch's `_flash_attention_forward`
    with cumulative sequence offsets), every sequence at the row's seqlen, packed."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[row["dtype"]]
    b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
    q, k, v = (torch.randn(b * s, h, d, device="cuda", dtype=dtype) for _ in range(3))
    offsets = torch.arange(0, b * s + 1, s, device="cuda", dtype=torch.int32)
    try:
        ms = median_ms(
            lambda: torch.ops.aten._flash_attention_forward(
                q, k, v, offsets, offsets, s, s, 0.0, row["causal"], False
            )
        )
    except (RuntimeError, TypeError, AttributeError) as e:
        print(f"  FA2 varlen: unavailable for {row}: {e}", file=sys.stderr)
        return float("nan")
    return tflops(row, ms)


def varlen_table(rows):
    """The variable-length rows as markdown lines."""
    lines = [
        "",
        f"Variable lengths: {rows[0]['dtype']}, every sequence of the batch at seqlen, packed "
        "[tokens, heads, d] with cu_seqlens (our general kernels); beside them our dense kernels on "
        "the same work and FlashAttention-2's varlen forward (torch `_flash_attention_forward` with "
        "cu_seqlens), same run.",
        "",
        "| d | causal | seqlen | ours varlen TFLOP/s | ours dense TFLOP/s | FA2 varlen TFLOP/s "
        "| varlen/FA2 varlen | varlen/dense |",
        "|" + "---|" * 8,
    ]
    for row in rows:
        fa2 = time_fa2_varlen(row)
        ours, dense = row["tflops"], row["dense_tflops"]
        lines.append(
            f"| {row['head_dim']} | {row['causal']} | {row['seqlen']} | {ours:.1f} | {dense:.1f} | {fa2:.1f} "
            f"| {ours / fa2:.2f}x | {ours / dense:.2f}x |"
        )
        print(lines[-1], flush=True)
    return lines


def decode_table(rows):
    """The decode rows as markdown lines."""
    first = rows[0]
    lines = [
        "",
        f"Decode: {first['dtype']}, one query token per sequence (causal) over a full KV cache, "
        f"heads {first['heads_q']}:{first['heads_kv']}, d {first['head_dim']}, automatic split-KV. "
        "KV read = bytes of K and V / time; copy = a 1 GiB device-to-device cuMemcpyDtoD, "
        "(bytes read + written) / time, same run. One call: a single call timed alone, L2 flushed "
        "before it, its launch included. Back to back: the steady state of a decode loop, calls "
        "queued while the GPU is busy, each over its own K and V (together several times L2), "
        "timed as a whole / calls; host = the host's time to queue one call. Target: KV / copy "
        ">= 80% for caches >= 8k. Same-bytes copy: the row's K regions copied onto its V regions "
        "back to back, as many bytes moved per copy as the call reads: what a copy reaches at "
        "this size.",
        "",
        "| batch | cache | KV MiB | one call us | one call KV / copy | back to back us | host us "
        "| KV read GB/s | copy GB/s | KV / copy | same-bytes copy GB/s | KV / same-bytes copy |",
        "|" + "---|" * 12,
    ]
    for row in rows:
        one_call = row["kv_bytes"] / (row["time_us"] * 1e-6) / 1e9 / row["copy_gbps"]
        lines.append(
            f"| {row['batch']} | {row['cache']} | {row['kv_bytes'] >> 20} | {row['time_us']:.1f} "
            f"| {one_call:.0%} | {row['back_to_back_us']:.1f} | {row['host_us']:.1f} "
            f"| {row['kv_gbps']:.0f} | {row['copy_gbps']:.0f} | {row['kv_gbps'] / row['copy_gbps']:.0%} "
            f"| {row['same_bytes_copy_gbps']:.0f} | {row['kv_gbps'] / row['same_bytes_copy_gbps']:.0%} |"
        )
    return lines


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    md_path = sys.argv[sys.argv.index("--markdown") + 1] if "--markdown" in sys.argv else None
    prefill = [row for row in rows if row.get("kind", "prefill") == "prefill"]
    decode = [row for row in rows if row.get("kind") == "decode"]
    varlen = [row for row in rows if row.get("kind") == "varlen"]
    gpu = torch.cuda.get_device_name()
    lines = [f"GPU: {gpu}, torch {torch.__version__}"]
    if prefill:
        ceiling = prefill[0]["ceiling_tflops"]
        lines = [
            f"GPU: {gpu}, torch {torch.__version__}; mma.sync f16 ceiling (registers only, same run): "
            f"{ceiling:.1f} TFLOP/s; q, k, v and o in "
            + " / ".join(sorted({LAYOUTS[row.get("layout", "bshd")] for row in prefill}))
            + " memory order, the same for ours and torch's",
            "",
            "| dtype | d | causal | seqlen | ours TFLOP/s | FA2 TFLOP/s | cuDNN TFLOP/s | ours/FA2 | ours/cuDNN "
            "| ours/ceiling |",
            "|" + "---|" * 10,
        ]
    for row in prefill:
        fa2 = time_sdpa(SDPBackend.FLASH_ATTENTION, row)
        cudnn = time_sdpa(SDPBackend.CUDNN_ATTENTION, row)
        ours = row["tflops"]
        lines.append(
            f"| {row['dtype']} | {row['head_dim']} | {row['causal']} | {row['seqlen']} | {ours:.1f} | {fa2:.1f} "
            f"| {cudnn:.1f} | {ours / fa2:.3f}x | {ours / cudnn:.2f}x | {ours / row['ceiling_tflops']:.0%} |"
        )
        print(lines[-1], flush=True)
    if varlen:
        lines += varlen_table(varlen)
    if decode:
        lines += decode_table(decode)
    if md_path:
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
