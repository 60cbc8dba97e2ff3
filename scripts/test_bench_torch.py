#!/usr/bin/env python3
"""CPU tests of bench_torch.py, with stand-ins for torch, pynvml and FA4:
the hot timing against a simulated GPU in virtual time, the NVML monitor, the
table lines, and main() end to end from a JSONL (peers that are missing or
fail show as missing and are listed; the run goes on).

usage: python3 scripts/test_bench_torch.py   (scripts/test-bench-cpu.sh runs it)
"""
import contextlib
import enum
import io
import json
import os
import sys
import tempfile
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402


class SimGpu:
    """A GPU in virtual time (bench's hot.rs tests have the same): host actions
    advance the clock, calls run one after another, idle gaps are kept."""

    def __init__(self, call_ms, launch_us, hang_after=None):
        self.t, self.busy_until, self.call_s, self.launch_s = 0.0, 0.0, call_ms * 1e-3, launch_us * 1e-6
        self.hang_after, self.calls, self.gaps, self.starts = hang_after, 0, [], []

    def advance(self, s):
        self.t += s
        return self.t

    def call(self):
        now = self.advance(self.launch_s)
        if self.busy_until < now:
            self.gaps.append((self.busy_until, now, self.calls))
            self.busy_until = now
        self.starts.append(self.busy_until)
        hung = self.hang_after is not None and self.calls >= self.hang_after
        self.busy_until = float("inf") if hung else self.busy_until + self.call_s
        self.calls += 1

    # the Timeline interface
    def event(self):
        return [float("inf")]

    def record(self, e):
        e[0] = max(self.busy_until, self.advance(1e-6))

    def done(self, e):
        return self.advance(0.5e-6) >= e[0]

    def ms(self, a, b):
        assert self.t >= a[0] and self.t >= b[0], "elapsed time of an unfinished event"
        return (b[0] - a[0]) * 1e3

    def synchronize(self):
        assert self.busy_until != float("inf")
        self.t = max(self.t, self.busy_until)

    def now(self):
        return self.t

    def pause(self):
        self.advance(50e-6)


class HotTime(unittest.TestCase):
    def test_long_calls_warm_up_a_second_without_gaps(self):
        for call_ms in (0.2, 1.0, 6.5, 40.0):
            gpu = SimGpu(call_ms, 30.0)
            edges = []
            t = bt.hot_time(gpu, gpu.call, 30, lambda: edges.append(gpu.t))
            self.assertEqual(len(edges), 2)
            # The monitor samples at the edges: inside the window.
            self.assertTrue(all(t["window"][0] <= e <= t["window"][1] for e in edges), (edges, t))
            self.assertEqual([g[2] for g in gpu.gaps], [0, 1, 2], (call_ms, gpu.gaps))
            self.assertAlmostEqual(t["median_ms"], call_ms, places=6)
            self.assertAlmostEqual(t["mean_ms"], call_ms, places=6)
            self.assertGreaterEqual(t["warm_up_ms"], 1000.0)
            self.assertLessEqual(t["warm_up_ms"], 1000.0 + (t["lookahead"] + 1) * call_ms)
            self.assertEqual(t["lookahead"], min(max(-int(-25.0 // call_ms), 3), 64))
            self.assertEqual(gpu.calls, 2 + t["warm_up_calls"] + 30)
            first_timed = gpu.starts[2 + t["warm_up_calls"]]
            last_end = gpu.starts[-1] + call_ms * 1e-3
            self.assertTrue(first_timed <= t["window"][0] <= first_timed + 100e-6, t)
            self.assertTrue(last_end <= t["window"][1] <= last_end + 100e-6, t)

    def test_host_bound_and_one_rep(self):
        gpu = SimGpu(0.002, 40.0)
        t = bt.hot_time(gpu, gpu.call, 10)
        self.assertEqual(t["lookahead"], 64)
        self.assertGreaterEqual(t["warm_up_ms"], 1000.0)
        gpu = SimGpu(3.0, 30.0)
        self.assertAlmostEqual(bt.hot_time(gpu, gpu.call, 1)["median_ms"], 3.0, places=6)

    def test_a_hung_call_is_an_error(self):
        gpu = SimGpu(1.0, 30.0, hang_after=100)
        with self.assertRaisesRegex(TimeoutError, "did not finish"):
            bt.hot_time(gpu, gpu.call, 10)


class FakeNvml(types.SimpleNamespace):
    NVML_CLOCK_SM = 1

    def __init__(self, devices=1, bus="00000000:3B:00.0", fail_init=False):
        super().__init__(devices=devices, bus=bus, fail_init=fail_init)

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        assert isinstance(bus, bytes)
        if bus.decode() != self.bus:
            raise RuntimeError("Not Found")
        return "handle"

    def nvmlDeviceGetCount(self):
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i):
        return "handle"

    def nvmlDeviceGetClockInfo(self, handle, kind):
        assert handle == "handle" and kind == 1
        return 1837

    def nvmlDeviceGetPowerUsage(self, handle):
        return 478250

    def nvmlDeviceGetName(self, handle):
        return b"Fake H100"

    def nvmlSystemGetDriverVersion(self):
        return "999.1"


class MonitorTests(unittest.TestCase):
    def test_samples_and_means(self):
        m = bt.Monitor("00000000:3B:00.0", nvml=FakeNvml())
        self.assertEqual(m.status, "NVML: Fake H100, driver 999.1")
        start = time.perf_counter()
        time.sleep(0.06)
        m.sample_now()
        r = m.mean((start, time.perf_counter()))
        m.close()
        self.assertGreaterEqual(r.samples, 4)
        self.assertEqual((r.mhz, r.watts), (1837.0, 478.25))

    def test_fallbacks_and_failures(self):
        m = bt.Monitor("00000000:99:00.0", nvml=FakeNvml(devices=1))
        self.assertTrue(m.status.startswith("NVML: Fake H100"), m.status)
        m.close()
        m = bt.Monitor("00000000:99:00.0", nvml=FakeNvml(devices=2))
        self.assertIn("NVML: n/a", m.status)
        self.assertIn("cannot tell which is ours", m.status)
        self.assertEqual(m.mean((0, 1e9)), bt.NO_READING._replace())
        m = bt.Monitor(None, nvml=FakeNvml(fail_init=True))
        self.assertIn("NVML Shared Library Not Found", m.status)
        m.sample_now()
        self.assertEqual(m.mean((0, 1e9)), (None, None, 0))

    def test_mean_reading(self):
        samples = [(0.5, 1980.0, 100.0), (1.0, 1800.0, 480.0), (1.5, 1760.0, None), (2.0, None, 470.0), (2.5, 1, 1)]
        self.assertEqual(bt.mean_reading(samples, (1.0, 2.0)), (1780.0, 475.0, 3))


ROW = {"dtype": "f16", "layout": "bshd", "head_dim": 128, "causal": False, "seqlen": 1024, "batch": 16,
       "heads": 16, "tflops": 300.0, "ceiling_tflops": 600.0, "mhz": 1837.4, "watts": 478.6}


class Tables(unittest.TestCase):
    def test_prefill_line(self):
        peers = {"FA2": bt.Result(250.0, 1755.0, 470.0), "cuDNN": bt.Result(400.0, None, None),
                 "FA4": bt.Result(missing="not installed")}
        line = bt.prefill_line(ROW, peers)
        self.assertEqual(
            line,
            "| f16 | 128 | False | 1024 | 300.0 | 1837/479 | 250.0 | 1755/470 | 400.0 | n/a/n/a | missing | — "
            "| 1.200x | 0.750x | — | 0.750x (cuDNN) | 50% |",
        )
        self.assertEqual(len(line.split("|")), len(bt.prefill_header([ROW])[0].split("|")))
        none = {label: bt.Result(missing="x") for _, label in bt.PEERS}
        self.assertTrue(bt.prefill_line(dict(ROW, mhz=None), none).endswith("| — | — | — | — | 50% |"))
        # An older bench's row (no clock fields).
        old = {k: v for k, v in ROW.items() if k not in ("mhz", "watts")}
        self.assertIn("| 300.0 | n/a/n/a |", bt.prefill_line(old, peers))

    def test_backward_lines(self):
        peers = {"FA2": bt.Result(250.0, 1755.0, 470.0), "cuDNN": bt.Result(400.0, None, None),
                 "FA4": bt.Result(missing="not installed")}
        lines = bt.backward_lines([dict(ROW, kind="backward")], [peers])
        self.assertEqual(len(lines[3].split("|")), len(lines[5].split("|")))
        self.assertEqual(
            lines[5],
            "| f16 | 128 | False | 1024 | 300.0 | 1837/479 | 250.0 | 1755/470 | 400.0 | n/a/n/a | missing | — "
            "| 1.200x | 0.750x | — | 0.750x (cuDNN) |",
        )
        self.assertEqual(bt.backward_flops(ROW), 2.5 * bt.flops(ROW))

    def test_failure_lines_group(self):
        failures = [("FA4", "not installed (x)", f"s{i}") for i in range(6)] + [("cuDNN", "RuntimeError: y", "s1")]
        lines = bt.failure_lines(failures)
        self.assertEqual(lines[3], "- FA4: not installed (x) — s0; s1; s2; s3, ... (6 rows)")
        self.assertEqual(lines[4], "- cuDNN: RuntimeError: y — s1")
        self.assertEqual(bt.failure_lines([]), [])


def fake_torch(gpu_call_ms=0.05):
    """A torch with what bench_torch uses: tensors that only know their shape,
    events on a GPU simulated in real time, SDPA and aten's varlen forward."""
    state = types.SimpleNamespace(busy_until=0.0)

    def enqueue():
        state.busy_until = max(state.busy_until, time.perf_counter()) + gpu_call_ms * 1e-3

    class Tensor:
        def __init__(self, shape):
            self.shape = tuple(shape)

        def requires_grad_(self):
            return self

        def transpose(self, a, b):
            s = list(self.shape)
            s[a], s[b] = s[b], s[a]
            return Tensor(s)

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = max(state.busy_until, time.perf_counter())

        def query(self):
            return time.perf_counter() >= self.t

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    def synchronize():
        while time.perf_counter() < state.busy_until:
            time.sleep(1e-5)

    class SDPBackend(enum.Enum):
        FLASH_ATTENTION = 1
        CUDNN_ATTENTION = 2

    current = []

    @contextlib.contextmanager
    def sdpa_kernel(backends):
        current.append(backends[0])
        yield
        current.pop()

    def sdpa(q, k, v, is_causal=False):
        b, h, s, d = q.shape
        if current[-1] == SDPBackend.CUDNN_ATTENTION and d == 32:
            raise RuntimeError("No available kernel. Aborting execution.\nmore text")
        enqueue()
        return Tensor(q.shape)

    def varlen(q, k, v, *args):
        enqueue()
        return Tensor(q.shape)

    torch = types.ModuleType("torch")
    torch.__version__ = "9.9.0+fake"
    torch.float16, torch.bfloat16, torch.int32 = "float16", "bfloat16", "int32"
    torch.randn = lambda *shape, device=None, dtype=None: Tensor(shape)

    def grad(out, inputs, grad_out, retain_graph=False):
        assert retain_graph and out.shape == grad_out.shape, (out.shape, grad_out.shape)
        enqueue()
        return tuple(Tensor(x.shape) for x in inputs)

    torch.autograd = types.SimpleNamespace(grad=grad)
    torch.arange = lambda *a, **k: Tensor([1])
    torch.cuda = types.SimpleNamespace(
        Event=Event, synchronize=synchronize, get_device_name=lambda: "Fake H100", current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0),
    )
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(is_available=lambda: True, version=lambda: 91500))
    torch.ops = types.SimpleNamespace(aten=types.SimpleNamespace(_flash_attention_forward=varlen))
    nn = types.ModuleType("torch.nn")
    attention = types.ModuleType("torch.nn.attention")
    attention.SDPBackend, attention.sdpa_kernel = SDPBackend, sdpa_kernel
    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = sdpa
    torch.nn, nn.attention, nn.functional = nn, attention, functional
    modules = {"torch": torch, "torch.nn": nn, "torch.nn.attention": attention, "torch.nn.functional": functional}
    return modules, enqueue, Tensor


def fake_fa4(enqueue, Tensor):
    flash_attn = types.ModuleType("flash_attn")
    flash_attn.__version__ = "4.0.0b36-fake"
    cute = types.ModuleType("flash_attn.cute")

    def flash_attn_func(q, k, v, causal=False):
        if q.shape[-1] == 32:
            raise AssertionError("head_dim 32 not supported")
        enqueue()
        return Tensor(q.shape), Tensor(q.shape[:3])

    cute.flash_attn_func = flash_attn_func
    flash_attn.cute = cute
    return {"flash_attn": flash_attn, "flash_attn.cute": cute}


class EndToEnd(unittest.TestCase):
    def run_main(self, jsonl_rows, with_fa4, argv=()):
        modules, enqueue, Tensor = fake_torch()
        if with_fa4:
            modules.update(fake_fa4(enqueue, Tensor))
        else:
            modules.update({"flash_attn": None})  # import fails: ModuleNotFoundError
        modules["pynvml"] = FakeNvml()
        saved = {name: sys.modules.get(name) for name in modules}
        saved_hot, saved_argv = bt.HOT, sys.argv
        with tempfile.TemporaryDirectory() as tmp:
            ours, md = os.path.join(tmp, "ours.jsonl"), os.path.join(tmp, "bench.md")
            with open(ours, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in jsonl_rows))
            try:
                sys.modules.update(modules)
                bt.HOT = bt.HotConfig(warm_up_ms=5.0, lookahead_ms=1.0, min_lookahead=3, max_lookahead=64,
                                      timeout_s=30.0)
                sys.argv = ["bench_torch.py", ours, "--markdown", md, *argv]
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    bt.main()
            finally:
                bt.HOT, sys.argv = saved_hot, saved_argv
                for name, module in saved.items():
                    if module is None:
                        sys.modules.pop(name, None)
                    else:
                        sys.modules[name] = module
            with open(md) as f:
                return f.read().splitlines(), out.getvalue(), err.getvalue()

    ROWS = [
        {"kind": "meta", "nvml": "ok", "gpu": "Fake H100", "driver": "999.1", "warm_up_s": 1.0, "reps": 5},
        ROW,
        dict(ROW, head_dim=32, heads=64, causal=True),
        {"kind": "varlen", "dtype": "f16", "head_dim": 64, "causal": True, "seqlen": 1024, "batch": 16, "heads": 32,
         "tflops": 250.0, "dense_tflops": 260.0, "mhz": 1800.0, "watts": 470.0, "dense_mhz": 1790.0,
         "dense_watts": 471.0},
        dict(ROW, kind="backward", tflops=200.0, mhz=1800.0, watts=480.0),
        {"kind": "decode", "dtype": "f16", "head_dim": 128, "heads_q": 32, "heads_kv": 4, "batch": 1, "cache": 4096,
         "kv_bytes": 8388608, "time_us": 20.0, "back_to_back_us": 10.0, "host_us": 3.0, "kv_gbps": 838.0,
         "copy_gbps": 2800.0, "same_bytes_copy_gbps": 1500.0},
    ]

    def test_with_fa4(self):
        md, out, err = self.run_main(self.ROWS, with_fa4=True)
        self.assertTrue(md[0].startswith("Benchmark: GPU Fake H100, driver 999.1, torch 9.9.0+fake (CUDA 13.0, "
                                         "cuDNN 91500), FA4-sm90: flash_attn 4.0.0b36-fake, "), md[0])
        self.assertIn("then >= 0.005 s of the implementation's own call back to back with no synchronization, then 5 "
                      "calls queued right behind", md[2])
        self.assertIn("bench_torch: NVML: Fake H100, driver 999.1", err)
        self.assertIn("bench_torch: FA4-sm90: flash_attn 4.0.0b36-fake", err)
        timings = [line for line in err.splitlines() if line.startswith("  timing: ")]
        # d=128: all three; d=32: FA2; varlen: FA2; backward d=128: all three
        self.assertEqual(len(timings), 3 + 1 + 1 + 3)
        for line in timings:
            self.assertGreaterEqual(int(line.rsplit("NVML samples ", 1)[1]), 2, line)
        self.assertIn("NVML for ours: ok; for the peers: NVML: Fake H100, driver 999.1", md[2])
        prefill = md[: md.index(next(line for line in md if line.startswith("Backward: ")))]
        table = [line for line in prefill if line.startswith("| f16 |")]
        self.assertEqual(len(table), 2)
        d128, d32 = table
        cells = [c.strip() for c in d128.split("|")[1:-1]]
        self.assertEqual(cells[:6], ["f16", "128", "False", "1024", "300.0", "1837/479"])
        for i in (6, 8, 10):  # FA2, cuDNN, FA4 figures
            self.assertNotEqual(cells[i], "missing", d128)
            self.assertEqual(cells[i + 1], "1837/478")
        self.assertRegex(cells[15], r"^\d+\.\d{3}x \((FA2|cuDNN|FA4)\)$")
        cells = [c.strip() for c in d32.split("|")[1:-1]]
        self.assertEqual((cells[8], cells[9], cells[10], cells[11]), ("missing", "—", "missing", "—"), d32)
        self.assertEqual((cells[13], cells[14]), ("—", "—"))
        self.assertIn("bench_torch: cuDNN failed on f16 d=32 causal s=1024 b=16 h=64 bshd: RuntimeError: No "
                      "available kernel. Aborting execution.", err)
        self.assertIn("bench_torch: FA4 failed on f16 d=32", err)
        self.assertIn("- FA4: AssertionError: head_dim 32 not supported — f16 d=32 causal s=1024 b=16 h=64 bshd", md)
        varlen = [line for line in md if line.startswith("| 64 | True | 1024 |")]
        self.assertEqual(len(varlen), 1)
        self.assertIn("| 250.0 | 1800/470 | 260.0 | 1790/471 |", varlen[0])
        self.assertNotIn("missing", varlen[0])
        self.assertTrue(any(line.startswith("| 1 | 4096 | 8 |") for line in md))
        backward = md[md.index(next(line for line in md if line.startswith("Backward: "))) + 4]
        cells = [c.strip() for c in backward.split("|")[1:-1]]
        self.assertEqual(cells[:6], ["f16", "128", "False", "1024", "200.0", "1800/480"])
        for i in (6, 8, 10):
            self.assertNotEqual(cells[i], "missing", backward)
        self.assertRegex(cells[15], r"^\d+\.\d{3}x \((FA2|cuDNN|FA4)\)$")
        self.assertIn("backward f16 d=128 non-causal s=1024", err)

    def test_without_fa4_and_only_some_peers(self):
        md, out, err = self.run_main(self.ROWS[:3], with_fa4=False, argv=["--peers", "fa2,fa4", "--reps", "3"])
        self.assertIn("FA4-sm90: not installed (ModuleNotFoundError: ", md[0])
        self.assertIn("then 3 calls queued right behind", md[2])
        table = [line for line in md if line.startswith("| f16 |")]
        cells = [c.strip() for c in table[0].split("|")[1:-1]]
        self.assertNotEqual(cells[6], "missing")
        self.assertEqual((cells[8], cells[10]), ("missing", "missing"))
        self.assertRegex(cells[15], r"\(FA2\)$")
        self.assertIn("- cuDNN: not asked for (--peers) — ", "\n".join(md))
        self.assertTrue(any(line.startswith("- FA4: not installed (ModuleNotFoundError") for line in md))


if __name__ == "__main__":
    unittest.main(verbosity=2)
