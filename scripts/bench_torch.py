#!/usr/bin/env python3
"""Adds the peers' figures to our benchmark, measured in the same run.

usage: bench_torch.py OURS.jsonl [--markdown OUT.md] [--reps N] [--peers fa2,cudnn,fa4]

For every prefill shape in OURS.jsonl (written by `bench --out`), times on the
same GPU, with the same shapes, memory order and FLOP count:
  - FA2: torch's SDPA with the flash backend (FlashAttention-2);
  - cuDNN: torch's SDPA with the cuDNN backend;
  - FA4: FlashAttention-4's sm90 kernels (PyPI flash-attn-4,
    `flash_attn.cute.flash_attn_func`), where it can be imported
    (scripts/fa4-stage.sh says how to install it on a machine without network);
and prints one table with our ratio to each and to the fastest. The
variable-length rows (`"kind": "varlen"`) follow, beside FlashAttention-2's
varlen forward, then the backward rows (`"kind": "backward"`: dQ, dK and dV,
TFLOP/s at 2.5x the forward's FLOPs) beside the same three peers' backward
(torch autograd through each peer's forward, timed without the forward), then
the decode rows (`"kind": "decode"`, ours alone).

Every figure, ours (bench) and the peers' (here), is timed the same way
(`hot_time`, the twin of bench's `hot::hot_time`): the inputs drawn first,
then at least a second of the call back to back with no synchronization (the
host polls an event to keep a bounded queue ahead of the GPU), then the timed
calls queued right behind, one wait at the end; the median per-call time. The
SM clock and board power (NVML, sampled every 10 ms by a thread) are averaged
over the timed calls and printed beside each figure as MHz/W.

A peer that cannot be imported, or that fails on a shape, prints a line saying
so (on stderr, starting `bench_torch: `), shows as `missing` in the table, and the failures are
listed under the table: the run goes on.
"""
import collections
import contextlib
import datetime
import json
import os
import subprocess
import sys
import threading
import time

LAYOUTS = {"bshd": "[batch, seqlen, heads, d]", "bhsd": "[batch, heads, seqlen, d]"}

HotConfig = collections.namedtuple("HotConfig", "warm_up_ms lookahead_ms min_lookahead max_lookahead timeout_s")
# The same as bench's `hot::HOT`.
HOT = HotConfig(warm_up_ms=1000.0, lookahead_ms=25.0, min_lookahead=3, max_lookahead=64, timeout_s=120.0)

# The peers of the prefill table, in its order: (key, label).
PEERS = [("fa2", "FA2"), ("cudnn", "cuDNN"), ("fa4", "FA4")]

torch = None  # imported by main(), so that the tables can be tested without it


class TorchTimeline:
    """The current CUDA stream and its events (bench's `CudaTimeline`)."""

    def event(self):
        return torch.cuda.Event(enable_timing=True)

    def record(self, event):
        event.record()

    def done(self, event):
        return event.query()

    def ms(self, start, end):
        return start.elapsed_time(end)

    def synchronize(self):
        torch.cuda.synchronize()

    def now(self):
        return time.perf_counter()

    def pause(self):
        time.sleep(20e-6)


def _wait(timeline, event, deadline, poll=None):
    while not timeline.done(event):
        if poll:
            poll()
        if timeline.now() > deadline:
            raise TimeoutError("a benchmarked call did not finish within the timeout (hung kernel?)")
        timeline.pause()
    if poll:
        poll()


def hot_time(timeline, call, reps, edge=lambda: None, config=None):
    """Times `call` hot; returns a dict of median_ms, mean_ms, warm_up_ms,
    warm_up_calls, lookahead and window (host seconds when the first timed call
    was seen started and the last seen finished; `edge` is called at both).

    1. One untimed call (first-use costs: FA4 compiles, cuDNN builds its graph),
       then one call timed alone, whose time sizes the look-ahead: the calls
       kept queued ahead of the GPU (lookahead_ms of work, within
       [min_lookahead, max_lookahead] calls). The GPU may idle here.
    2. The warm-up: calls back to back, an event after each; once the
       look-ahead is queued, the host polls (never synchronizes) the event of
       the call that many back before queuing the next, and stops once the GPU
       has run the warm-up for warm_up_ms; the look-ahead's calls stay queued.
    3. The timed calls right behind, an event between each two, the same bound
       on the queue, one wait at the end."""
    config = config or HOT
    assert reps >= 1
    call()
    timeline.synchronize()
    before, after = timeline.event(), timeline.event()
    timeline.record(before)
    call()
    timeline.record(after)
    timeline.synchronize()
    probe_ms = max(timeline.ms(before, after), 1e-4)
    lookahead = min(max(-int(-config.lookahead_ms // probe_ms), config.min_lookahead), config.max_lookahead)
    deadline = timeline.now() + config.timeout_s

    start = timeline.event()
    ring = [timeline.event() for _ in range(lookahead)]
    timeline.record(start)
    warm_up_calls = 0
    while True:
        slot = ring[warm_up_calls % lookahead]
        if warm_up_calls >= lookahead:
            _wait(timeline, slot, deadline)
            if timeline.ms(start, slot) >= config.warm_up_ms:
                break
        call()
        timeline.record(slot)
        warm_up_calls += 1

    timed = [timeline.event() for _ in range(reps + 1)]
    timeline.record(timed[0])
    started = []

    def see_start():
        if not started and timeline.done(timed[0]):
            started.append(timeline.now())
            edge()

    for i in range(reps):
        if i >= lookahead:
            _wait(timeline, timed[i + 1 - lookahead], deadline, see_start)
        call()
        timeline.record(timed[i + 1])
        see_start()
    _wait(timeline, timed[0], deadline, see_start)
    _wait(timeline, timed[reps], deadline)
    edge()  # its sample falls inside the window
    finished = timeline.now()
    times = sorted(timeline.ms(a, b) for a, b in zip(timed, timed[1:]))
    return {
        "median_ms": times[len(times) // 2],
        "mean_ms": timeline.ms(timed[0], timed[reps]) / reps,
        "warm_up_ms": timeline.ms(start, timed[0]),
        "warm_up_calls": warm_up_calls,
        "lookahead": lookahead,
        "window": (started[0], finished),
    }


Reading = collections.namedtuple("Reading", "mhz watts samples")
NO_READING = Reading(None, None, 0)


def mean_reading(samples, window):
    """Mean SM MHz and W of the (t, mhz, watts) samples in window (both ends in)."""
    inside = [s for s in samples if window[0] <= s[0] <= window[1]]
    mhz = [s[1] for s in inside if s[1] is not None]
    watts = [s[2] for s in inside if s[2] is not None]
    return Reading(sum(mhz) / len(mhz) if mhz else None, sum(watts) / len(watts) if watts else None, len(inside))


class Monitor:
    """NVML (pynvml) sampled every 10 ms by a thread, as bench's `nvml::Monitor`.
    Without pynvml or NVML, `status` says why and every reading is n/a."""

    PERIOD_S = 0.01

    def __init__(self, pci_bus_id=None, nvml=None):
        self.samples = collections.deque(maxlen=6000)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.nvml, self.handle, self.thread, self.device = None, None, None, None
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            handle = None
            if pci_bus_id:
                try:
                    handle = nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id.encode())
                except Exception as e:
                    bus_error = f"no device at PCI bus id {pci_bus_id}: {e}"
            else:
                bus_error = "no PCI bus id from torch"
            if handle is None:
                count = nvml.nvmlDeviceGetCount()
                if count != 1:
                    raise RuntimeError(f"{bus_error}, and NVML sees {count} devices: cannot tell which is ours")
                handle = nvml.nvmlDeviceGetHandleByIndex(0)
            self.nvml, self.handle = nvml, handle
            if self.read() == (None, None):
                nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)  # raises with NVML's reason
                raise RuntimeError("NVML gives neither the SM clock nor the power")
            text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
            self.device = (text(nvml.nvmlDeviceGetName(handle)), text(nvml.nvmlSystemGetDriverVersion()))
            self.status = f"NVML: {self.device[0]}, driver {self.device[1]}"
        except Exception as e:
            self.nvml = None
            self.status = f"NVML: n/a, SM clock and power not measured: {type(e).__name__}: {e}"
            return
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def read(self):
        clock = power = None
        try:
            clock = float(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        except Exception:
            pass
        try:
            power = self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3
        except Exception:
            pass
        return clock, power

    def sample_now(self):
        if self.nvml is not None:
            mhz, watts = self.read()
            with self.lock:
                self.samples.append((time.perf_counter(), mhz, watts))

    def _run(self):
        while not self.stop.is_set():
            self.sample_now()
            self.stop.wait(self.PERIOD_S)

    def mean(self, window):
        with self.lock:
            return mean_reading(list(self.samples), window)

    def close(self):
        self.stop.set()
        if self.thread:
            self.thread.join()


class Result:
    """One implementation's figure on one row: TFLOP/s and reading, or why missing."""

    def __init__(self, tflops=None, mhz=None, watts=None, missing=None):
        self.tflops, self.mhz, self.watts, self.missing = tflops, mhz, watts, missing

    def figure(self):
        return f"{self.tflops:.1f}" if self.tflops is not None else "missing"

    def clock_power(self):
        if self.tflops is None:
            return "—"
        show = lambda v: f"{v:.0f}" if v is not None else "n/a"
        return f"{show(self.mhz)}/{show(self.watts)}"


def ours(row, prefix=""):
    """Our figure of a JSONL row (`prefix` "dense_" for the dense beside a varlen row)."""
    return Result(row[prefix + "tflops"], row.get(prefix + "mhz"), row.get(prefix + "watts"))


def ratio(ours_result, peer, digits=3):
    if ours_result.tflops is None or peer.tflops is None or peer.tflops <= 0:
        return "—"
    return f"{ours_result.tflops / peer.tflops:.{digits}f}x"


def fastest(peers):
    """(label, Result) of the fastest peer that has a figure, or None."""
    present = [(label, r) for label, r in peers if r.tflops is not None]
    return max(present, key=lambda p: p[1].tflops) if present else None


def flops(row):
    b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
    return 4 * b * h * s * s * d / (2 if row["causal"] else 1)


def backward_flops(row):
    """The backward's FLOPs: five matrix products to the forward's two."""
    return 2.5 * flops(row)


def shape_text(row):
    return (f"{row['dtype']} d={row['head_dim']} {'causal' if row['causal'] else 'non-causal'} "
            f"s={row['seqlen']} b={row['batch']} h={row['heads']} {row.get('layout', 'bshd')}")


def prefill_header(rows):
    return [
        "| dtype | d | causal | seqlen | ours TFLOP/s | ours MHz/W | FA2 TFLOP/s | FA2 MHz/W | cuDNN TFLOP/s "
        "| cuDNN MHz/W | FA4 TFLOP/s | FA4 MHz/W | ours/FA2 | ours/cuDNN | ours/FA4 | ours/fastest | ours/ceiling |",
        "|" + "---|" * 17,
    ]


def prefill_line(row, peers):
    """One table line: `peers` maps each label of PEERS to its Result."""
    mine = ours(row)
    best = fastest([(label, peers[label]) for _, label in PEERS])
    best_text = f"{ratio(mine, best[1])} ({best[0]})" if best else "—"
    cells = [row["dtype"], row["head_dim"], row["causal"], row["seqlen"], mine.figure(), mine.clock_power()]
    for _, label in PEERS:
        cells += [peers[label].figure(), peers[label].clock_power()]
    cells += [ratio(mine, peers[label]) for _, label in PEERS]
    cells += [best_text, f"{mine.tflops / row['ceiling_tflops']:.0%}"]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def backward_lines(rows, results):
    """The backward rows as markdown lines; results[i] maps each label of PEERS to row i's Result."""
    lines = [
        "",
        "Backward: dQ, dK and dV, TFLOP/s at 2.5x the forward's FLOPs, [batch, seqlen, heads, d]; the peers' "
        "backward through torch autograd after one forward, each timed hot without the forward.",
        "",
        "| dtype | d | causal | seqlen | ours TFLOP/s | ours MHz/W | FA2 TFLOP/s | FA2 MHz/W | cuDNN TFLOP/s "
        "| cuDNN MHz/W | FA4 TFLOP/s | FA4 MHz/W | ours/FA2 | ours/cuDNN | ours/FA4 | ours/fastest |",
        "|" + "---|" * 16,
    ]
    for row, peers in zip(rows, results):
        mine = ours(row)
        best = fastest([(label, peers[label]) for _, label in PEERS])
        cells = [row["dtype"], row["head_dim"], row["causal"], row["seqlen"], mine.figure(), mine.clock_power()]
        for _, label in PEERS:
            cells += [peers[label].figure(), peers[label].clock_power()]
        cells += [ratio(mine, peers[label]) for _, label in PEERS]
        cells.append(f"{ratio(mine, best[1])} ({best[0]})" if best else "—")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def varlen_lines(rows, fa2_results):
    """The variable-length rows as markdown lines; fa2_results[i] is row i's Result."""
    lines = [
        "",
        f"Variable lengths: {rows[0]['dtype']}, every sequence of the batch at seqlen, packed "
        "[tokens, heads, d] with cu_seqlens (our general kernels); beside them our dense kernels on "
        "the same work and FlashAttention-2's varlen forward (torch `_flash_attention_forward` with "
        "cu_seqlens), same run, each timed hot.",
        "",
        "| d | causal | seqlen | ours varlen TFLOP/s | ours varlen MHz/W | ours dense TFLOP/s | ours dense MHz/W "
        "| FA2 varlen TFLOP/s | FA2 varlen MHz/W | varlen/FA2 varlen | varlen/dense |",
        "|" + "---|" * 11,
    ]
    for row, fa2 in zip(rows, fa2_results):
        mine, dense = ours(row), ours(row, "dense_")
        lines.append(
            f"| {row['head_dim']} | {row['causal']} | {row['seqlen']} | {mine.figure()} | {mine.clock_power()} "
            f"| {dense.figure()} | {dense.clock_power()} | {fa2.figure()} | {fa2.clock_power()} "
            f"| {ratio(mine, fa2, 2)} | {ratio(mine, dense, 2)} |"
        )
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


def failure_lines(failures):
    """The failures, one line per (peer, reason), with the shapes it hit."""
    if not failures:
        return []
    grouped = collections.OrderedDict()
    for label, reason, shape in failures:
        grouped.setdefault((label, reason), []).append(shape)
    lines = ["", "Missing figures (the peer failed or is not installed):", ""]
    for (label, reason), shapes in grouped.items():
        more = f", ... ({len(shapes)} rows)" if len(shapes) > 4 else ""
        lines.append(f"- {label}: {reason} — {'; '.join(shapes[:4])}{more}")
    return lines


def header_line(gpu, driver, torch_text, fa4_text, date):
    return f"Benchmark: GPU {gpu}, driver {driver}, {torch_text}, FA4-sm90: {fa4_text}, {date}"


def method_line(reps, ours_meta, monitor_status):
    ours_nvml = ours_meta.get("nvml", "not recorded (an older bench)")
    return (
        f"Every figure (ours and the peers') is timed hot: inputs drawn first, then >= {HOT.warm_up_ms / 1e3:g} s "
        f"of the implementation's own call back to back with no synchronization, then {reps} calls queued right "
        "behind (median). MHz/W: mean NVML SM clock and board power over those timed calls (power: the driver's "
        f"~1 s average). NVML for ours: {ours_nvml}; for the peers: {monitor_status}."
    )


# ---- the GPU side: everything below needs torch ----


def first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


class Peers:
    """The peers' calls on torch tensors, and which could not be set up."""

    def __init__(self, wanted):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F

        self.wanted = wanted
        self.sdpa = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
        self.sdpa_kernel, self.F = sdpa_kernel, F
        self.missing = {key: "not asked for (--peers)" for key, _ in PEERS if key not in wanted}
        self.fa4, self.fa4_version = None, None
        if "fa4" in wanted:
            try:
                from flash_attn.cute import flash_attn_func

                self.fa4 = flash_attn_func
                try:
                    import importlib.metadata

                    self.fa4_version = "flash-attn-4 " + importlib.metadata.version("flash-attn-4")
                except Exception:
                    import flash_attn

                    self.fa4_version = "flash_attn " + str(getattr(flash_attn, "__version__", "(version unknown)"))
            except Exception as e:
                self.missing["fa4"] = f"not installed ({first_line(e)})"

    def fa4_text(self):
        return self.fa4_version or self.missing.get("fa4", "not installed")

    def call(self, key, row, q, k, v):
        """(context manager, call) of peer `key` on q, k, v as [b, s, h, d] views."""
        causal = row["causal"]
        if key in self.sdpa:
            # SDPA takes [b, h, s, d] views.
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            return self.sdpa_kernel([self.sdpa[key]]), lambda: self.F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=causal
            )
        return contextlib.nullcontext(), lambda: self.fa4(q, k, v, causal=causal)

    def backward_call(self, key, row, q, k, v, d_o):
        """(context manager, call) of peer `key`'s backward: its forward runs
        once here on q, k, v (leaves that require grad), in its backend's
        context, which the autograd graph then holds to; the call takes the
        gradients of that output for d_o, keeping the graph for the next."""
        context, forward = self.call(key, row, q, k, v)
        with context:
            out = forward()
        if isinstance(out, tuple):  # FA4 returns (out, lse)
            out = out[0]
        if key in self.sdpa:  # SDPA's output is [b, h, s, d]
            out = out.transpose(1, 2)
        return contextlib.nullcontext(), lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)


def measure(label, shape, make, row_flops, reps, monitor, failures):
    """Times hot the call that make() returns (with the context manager to run
    it in); a Result, or on any failure a printed line and a missing Result."""
    try:
        context, call = make()
        with context:
            t = hot_time(TorchTimeline(), call, reps, monitor.sample_now)
        r = monitor.mean(t["window"])
        tflops = row_flops / (t["median_ms"] * 1e-3) / 1e12
        print(f"  timing: {label} {shape}: {tflops:.1f} TFLOP/s (mean {row_flops / (t['mean_ms'] * 1e-3) / 1e12:.1f}), "
              f"warm-up {t['warm_up_ms'] / 1e3:.2f} s ({t['warm_up_calls']} calls), look-ahead {t['lookahead']}, "
              f"NVML samples {r.samples}", file=sys.stderr, flush=True)
        return Result(tflops, r.mhz, r.watts)
    except Exception as e:
        reason = first_line(e)
        print(f"bench_torch: {label} failed on {shape}: {reason}", file=sys.stderr, flush=True)
        failures.append((label, reason, shape))
        return Result(missing=reason)


def row_inputs(row):
    """q, k, v as [b, s, h, d] views of the row's memory order, random normals."""
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[row["dtype"]]
    b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
    if row.get("layout", "bshd") == "bshd":
        return [torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3)]
    return [torch.randn(b, h, s, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(3)]


def time_prefill_row(row, peers, reps, monitor, failures):
    """{label: Result} of every peer on `row`."""
    shape = shape_text(row)
    results = {}
    try:
        q, k, v = row_inputs(row)
    except Exception as e:
        reason = f"inputs: {first_line(e)}"
        print(f"bench_torch: cannot make the inputs of {shape}: {reason}", file=sys.stderr, flush=True)
        q = k = v = None
    for key, label in PEERS:
        if key in peers.missing:
            results[label] = Result(missing=peers.missing[key])
            failures.append((label, peers.missing[key], shape))
        elif q is None:
            results[label] = Result(missing=reason)
            failures.append((label, reason, shape))
        else:
            make = lambda: peers.call(key, row, q, k, v)
            results[label] = measure(label, shape, make, flops(row), reps, monitor, failures)
    return results


def time_backward_row(row, peers, reps, monitor, failures):
    """{label: Result} of every peer's backward on `row`."""
    shape = "backward " + shape_text(row)
    results = {}
    reason = None
    try:
        q, k, v = (x.requires_grad_() for x in row_inputs(row))
        d_o = row_inputs(row)[0]
    except Exception as e:
        reason = f"inputs: {first_line(e)}"
        print(f"bench_torch: cannot make the inputs of {shape}: {reason}", file=sys.stderr, flush=True)
    for key, label in PEERS:
        if key in peers.missing:
            results[label] = Result(missing=peers.missing[key])
            failures.append((label, peers.missing[key], shape))
        elif reason is not None:
            results[label] = Result(missing=reason)
            failures.append((label, reason, shape))
        else:
            make = lambda: peers.backward_call(key, row, q, k, v, d_o)
            results[label] = measure(label, shape, make, backward_flops(row), reps, monitor, failures)
    return results


def time_fa2_varlen(row, reps, monitor, failures):
    """FlashAttention-2's variable-length forward (torch's `_flash_attention_forward`
    with cumulative sequence offsets), every sequence at the row's seqlen, packed."""

    def make():
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[row["dtype"]]
        b, h, s, d = row["batch"], row["heads"], row["seqlen"], row["head_dim"]
        q, k, v = (torch.randn(b * s, h, d, device="cuda", dtype=dtype) for _ in range(3))
        offsets = torch.arange(0, b * s + 1, s, device="cuda", dtype=torch.int32)
        aten = torch.ops.aten
        return contextlib.nullcontext(), lambda: aten._flash_attention_forward(
            q, k, v, offsets, offsets, s, s, 0.0, row["causal"], False
        )

    return measure("FA2 varlen", shape_text(row), make, flops(row), reps, monitor, failures)


def pci_bus_id():
    try:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    except Exception:
        return None


def driver_version(monitor):
    if monitor.device:
        return monitor.device[1]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] or "unknown"
    except Exception as e:
        return f"unknown ({first_line(e)})"


def torch_text():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "n/a"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {cudnn})"


def option(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main():
    global torch
    import torch as torch_module

    torch = torch_module
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    md_path = option("--markdown")
    wanted = option("--peers", "fa2,cudnn,fa4").split(",")
    unknown = [p for p in wanted if p not in dict(PEERS)]
    if unknown:
        sys.exit(f"bench_torch: unknown peers {unknown}: take fa2, cudnn, fa4")
    meta = next((row for row in rows if row.get("kind") == "meta"), {})
    reps = int(option("--reps", meta.get("reps", 30)))
    prefill = [row for row in rows if row.get("kind", "prefill") == "prefill"]
    decode = [row for row in rows if row.get("kind") == "decode"]
    varlen = [row for row in rows if row.get("kind") == "varlen"]
    backward = [row for row in rows if row.get("kind") == "backward"]

    monitor = Monitor(pci_bus_id())
    print(f"bench_torch: {monitor.status}", file=sys.stderr, flush=True)
    peers = Peers(wanted)
    print(f"bench_torch: FA4-sm90: {peers.fa4_text()}", file=sys.stderr, flush=True)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        header_line(torch.cuda.get_device_name(), driver_version(monitor), torch_text(), peers.fa4_text(), date),
        "",
        method_line(reps, meta, monitor.status),
    ]
    failures = []
    if prefill:
        ceiling = prefill[0]["ceiling_tflops"]
        lines += [
            "",
            f"mma.sync f16 ceiling (registers only, same run): {ceiling:.1f} TFLOP/s; q, k, v and o in "
            + " / ".join(sorted({LAYOUTS[row.get("layout", "bshd")] for row in prefill}))
            + " memory order, the same for ours and the peers'",
            "",
        ] + prefill_header(prefill)
        for line in lines:
            print(line, flush=True)
        for row in prefill:
            lines.append(prefill_line(row, time_prefill_row(row, peers, reps, monitor, failures)))
            print(lines[-1], flush=True)
    if varlen:
        fa2 = []
        for row in varlen:
            if "fa2" in peers.missing:
                fa2.append(Result(missing=peers.missing["fa2"]))
            else:
                fa2.append(time_fa2_varlen(row, reps, monitor, failures))
        lines += varlen_lines(varlen, fa2)
    if backward:
        lines += backward_lines(backward, [time_backward_row(row, peers, reps, monitor, failures) for row in backward])
    if decode:
        lines += decode_table(decode)
    lines += failure_lines(failures)
    monitor.close()
    if md_path:
        with open(md_path, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
