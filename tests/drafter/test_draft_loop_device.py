"""The drafter's whole per-step path on a fake ``cuda`` device, with its host<->device
traffic counted (``tests/_device_traffic.py``): what an engine step costs in syncs and
copies on an accelerator, shown without one.

The engine is the real ``BatchDrafter`` on the real SmolLM2 -> Qwen tokenizer pair, for
every algorithm; its runtime is the real ``DraftModel`` forward path (input
staging, KV bookkeeping, the forward context) around a stand-in model on the fake
device (vLLM's model and attention kernels cannot run on fake tensors: that they run on
CUDA is vLLM's business). Three requests per batch (greedy, sampled, seeded), two
engine steps (new requests with their prompts, then one committed token each).
"""

from __future__ import annotations

from types import SimpleNamespace

import weakref

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from _device_traffic import DeviceTraffic, Traffic
from _graph_config import graph_config
from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter import batch_drafter as engine_module
from vllm_hetero_spec.drafter.runtime import input_staging
from vllm_hetero_spec.drafter.messages import RequestParams, StepBatch
from vllm_hetero_spec.drafter.runtime.cuda_graphs import DraftGraphs
from vllm_hetero_spec.drafter.runtime.draft_head import DraftHead
from vllm_hetero_spec.drafter.runtime.paged_kv import BlockPool
from vllm_hetero_spec.drafter.runtime.model import DraftModel, RuntimeConfig
from vllm_hetero_spec.vocab.bridge import VocabBridge, load_tokenizer

CUDA = torch.device("cuda")
DRAFT_V, TARGET_V, K = 49152, 151936, 4
PARAMS = [RequestParams(0.0), RequestParams(0.8, top_k=50), RequestParams(1.0, top_p=0.9, seed=7)]
CASES = {  # name: (algorithm, extra settings)
    "tli": ("tli", {}), "fsd": ("fsd", {}), "union": ("union", {}), "slem": ("slem", {}),
    "dtw": ("dtw", {}), "dtw-faithful": ("dtw", {"dtw_verify": "faithful"}), "slrs": ("slrs", {}),
    "tli-stop-prob": ("tli", {"draft_stop_prob": 0.2}),
    "tli-head": ("tli", {"draft_head_tokens": 1000}),  # the output layer over 1000 tokens
}


class _Event:
    """Stands in for ``torch.cuda.Event`` (not constructible on the CPU build): records
    whether every rewrite of the pinned inputs waited for the last upload."""

    log: list[str] = []

    def record(self) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("wait")


class _TinyModel(torch.nn.Module):
    """A stand-in draft model on the fake device: logits from the ids and positions.
    It records what each forward read: the inputs and vLLM's forward context."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.emb = torch.empty(DRAFT_V, hidden, device=CUDA)
        self.head = torch.empty(hidden, DRAFT_V, device=CUDA)
        self.lm_head = SimpleNamespace(weight=self.head.t())  # what DraftHead takes its rows from
        self.logits_processor = SimpleNamespace(soft_cap=None, scale=1.0)
        self.calls: list[tuple[torch.Tensor, torch.Tensor, object]] = []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        assert input_ids.device.type == "cuda" and positions.device.type == "cuda"
        self.calls.append((input_ids, positions, get_forward_context()))
        return self.emb.index_select(0, input_ids) + positions.unsqueeze(1).to(self.emb.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.head


def _runtime(graph_sizes: list[int] | None = None) -> DraftModel:
    """The real runtime's per-step code on the fake device (its model set later, under
    the fake mode; its graph buffers too, as they live on the device)."""
    from vllm.config import VllmConfig

    rt = DraftModel.__new__(DraftModel)
    rt.cfg = RuntimeConfig("stand-in", graph_sizes=tuple(graph_sizes or ()))
    rt.vllm_config = graph_config(graph_sizes) if graph_sizes else VllmConfig()
    rt.tp_group = None
    rt.device = CUDA
    rt.layer_names, rt.groups, rt.kv = [], [], []
    rt.vocab_size, rt.max_len = DRAFT_V, 1 << 15
    rt.pool = BlockPool(4096, 16, 0)
    rt.pool.copy_blocks = rt._copy_blocks
    rt.staging = input_staging.InputStaging(CUDA)
    rt.head = None
    return rt


@pytest.fixture(scope="module")
def bridge(smollm2: str, qwen05: str) -> VocabBridge:
    return VocabBridge.build(smollm2, qwen05, DRAFT_V, TARGET_V)


def _host_values(bridge: VocabBridge):
    """What a transfer back brings: every draft position sampled an ordinary shared
    token at probability 0.5 (confidence 0.9); a distribution row puts 0.9 on it."""
    tok = int(bridge.intersection.shared_draft_ids[500])
    target = int(bridge.intersection.draft_to_target[tok])

    def values(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(shape, dtype=dtype)
        if dtype == torch.float64 and len(shape) == 2 and shape[1] <= 5:  # the loop's packed records
            out[:, 0], out[:, 1] = tok, 0.5
            if shape[1] >= 4:
                out[:, 2] = target
            if shape[1] in (3, 5):
                out[:, -1] = 0.9
        elif len(shape) == 2 and shape[1] >= DRAFT_V:  # q rows (slrs reads them on the host)
            out.fill_(0.1 / shape[1])
            out[:, tok] += 0.9
        return out

    return values


def _run_steps(monkeypatch, bridge, smollm2, qwen05, algorithm, extra, graph_sizes: list[int] | None = None,
               after=None) -> tuple[list[Traffic], list[int], object]:
    """Two engine steps on the fake device, each one's traffic and forwards; then
    ``after(engine)``, whose traffic is appended too."""
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    _Event.log = []
    monkeypatch.setattr(engine_module, "new_generator", lambda device, seed: torch.Generator().manual_seed(seed))
    monkeypatch.setattr(engine_module.VocabBridge, "build", lambda *a: bridge)
    rt = _runtime(graph_sizes)
    monkeypatch.setattr(engine_module, "DraftModel", lambda cfg: rt)
    settings = HeteroSettings(algorithm=algorithm, draft_model=smollm2, draft_tokenizer=smollm2,
                              num_speculative_tokens=K, max_draft_tokens=K, draft_budget="fixed", **extra)
    prompt = load_tokenizer(qwen05).encode("def fibonacci(n):\n    return")
    traffic, forwards = [], []
    forwards_by_head = []
    values = _host_values(bridge)
    with FakeTensorMode(allow_non_fake_inputs=True), DeviceTraffic(values) as probe:
        rt.model = _TinyModel()
        if settings.draft_head_tokens:
            rt.head = DraftHead(rt.model, torch.arange(settings.draft_head_tokens, device=CUDA), DRAFT_V)
            rt.head.register_forward_hook(lambda module, args, out: forwards_by_head.append(out.shape))
        rt.graphs = DraftGraphs(rt.vllm_config, CUDA)
        engine = engine_module.BatchDrafter(settings, qwen05, TARGET_V)
        probe.reset()
        req_ids = ["greedy", "sampled", "seeded"]
        for n in range(2):
            before = engine.stats.draft_forwards
            tokens = [np.array(prompt + [220] * n)] * 3
            out = engine.step(StepBatch(req_ids, tokens, PARAMS, K))
            assert all(out.ready) and all(out.ids), out.ids
            traffic.append(probe.reset())
            forwards.append(engine.stats.draft_forwards - before)
        if after is not None:
            after(engine)
            traffic.append(probe.reset())
    # With a subset head, it made every forward's logits, at the vocabulary's full width.
    assert rt.head is None or forwards_by_head and {shape[1] for shape in forwards_by_head} == {DRAFT_V}
    return traffic, forwards, engine


@pytest.mark.parametrize("case", list(CASES))
def test_an_engine_step_syncs_once(monkeypatch, bridge, smollm2, qwen05, case) -> None:
    """Per engine step: one device-to-host read (the draft loop's records), two
    host-to-device copies per forward (the staged inputs) and one for the batch's
    sampling settings; the token-level algorithms add one index of the rows whose q is
    kept (the batch mixes greedy and sampled rows); dtw's faithful mode two for its
    transferred probabilities. One random launch per position for the unseeded rows and
    one per seeded row.

    ``slrs`` is the exception: its psi tree is planned on the host, which reads the root
    distribution, each tree level, the laws' totals and the draws back, each once per
    step for the whole batch (``docs/drafter.md``)."""
    algorithm, extra = CASES[case]
    traffic, forwards, engine = _run_steps(monkeypatch, bridge, smollm2, qwen05, algorithm, extra)
    assert engine.defer_reads
    for t, n in zip(traffic, forwards):
        if algorithm == "slrs":
            # The draft loop's records once; then psi's own reads, each once for the
            # whole batch: the sampled requests' root q, each tree level, the laws'
            # totals, the draws (5 here, where the trees have one level; it was 6 when
            # levels and totals were read per request).
            records = [w for w in t.where if w.startswith("to_host[") and not w.endswith(f", {DRAFT_V}]")]
            assert len(records) == 1 and t.d2h <= 5, t.where
            continue
        assert t.d2h == 1, t.where
        assert t.h2d == 2 * n
        expected_lists = 1 + (algorithm in ("tli", "union")) + 2 * (extra.get("dtw_verify") == "faithful")
        assert t.from_python == expected_lists
        assert t.draws == 2 * n  # the shared stream, and the seeded row's own
    assert engine.runtime.staging.device_allocations == 1  # the same device buffers every forward
    # Every rewrite of the pinned inputs first waits for the previous upload to leave.
    assert _Event.log and _Event.log == ["wait", "record"] * (len(_Event.log) // 2)


def test_the_harness_counts_what_it_should() -> None:
    """The probe can fail: a ``.cpu()``, an ``.item()``, a copy from a host buffer and a
    tensor from a Python list are each counted where they happen."""
    with FakeTensorMode(allow_non_fake_inputs=True), DeviceTraffic(lambda s, d: torch.zeros(s, dtype=d)) as probe:
        x = torch.zeros(4, device=CUDA)
        x.cpu()
        x.sum().item()
        x.copy_(torch.ones(4))
        torch.tensor([1.0, 2.0], device=CUDA)
        t = probe.reset()
    assert (t.d2h, t.h2d, t.from_python) == (2, 1, 1)


@pytest.mark.parametrize("case", ["tli", "slem", "slrs"])
def test_graphed_forwards_read_persistent_buffers(monkeypatch, bridge, smollm2, qwen05, case) -> None:
    """With CUDA graphs on (buckets 1, 2, 4, 8), every forward a bucket holds runs padded
    to it, in vLLM's ``PIECEWISE`` mode with that bucket's batch descriptor, and reads
    its ids and positions from the same two persistent buffers (the addresses a
    captured graph replays from); larger forwards (the prompts' catch-up) run eager and
    unpadded. Staging into the graph buffers copies on the device only: the step's
    host traffic is what it is without graphs."""
    from vllm.config import CUDAGraphMode

    algorithm, extra = CASES[case]
    sizes = [1, 2, 4, 8]
    traffic, forwards, engine = _run_steps(monkeypatch, bridge, smollm2, qwen05, algorithm, extra, sizes)
    rt = engine.runtime
    ids_storage, pos_storage = rt.graphs.input_ids.untyped_storage()._cdata, rt.graphs.positions.untyped_storage()._cdata
    graphed = eager = 0
    for input_ids, positions, ctx in rt.model.calls:
        n = input_ids.shape[0]
        if ctx.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE:
            graphed += 1
            assert n in sizes and ctx.batch_descriptor.num_tokens == n
            assert input_ids.untyped_storage()._cdata == ids_storage and input_ids.storage_offset() == 0
            assert positions.untyped_storage()._cdata == pos_storage and positions.storage_offset() == 0
        else:
            eager += 1
            assert ctx.cudagraph_runtime_mode == CUDAGraphMode.NONE and n > max(sizes)
    assert graphed >= sum(forwards) - 2 and eager >= 1  # the two catch-up forwards (step 1) are eager
    if algorithm != "slrs":
        for t, n in zip(traffic, forwards):
            assert (t.d2h, t.h2d) == (1, 2 * n), t.where
    assert rt.staging.device_allocations == 1


def test_capture_runs_each_bucket_on_the_persistent_buffers(monkeypatch) -> None:
    """``capture_graphs`` follows vLLM's runner: an eager run at the largest bucket
    outside the capture context (it compiles), then inside vLLM's ``graph_capture``
    context, largest bucket first, an eager warm-up then the ``PIECEWISE`` run per bucket
    (the run vLLM's ``CUDAGraphWrapper`` captures), all on the persistent buffers, with
    capturing allowed only for the duration."""
    import contextlib

    from vllm.compilation import monitor
    from vllm.config import CUDAGraphMode
    from vllm.distributed import parallel_state

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    entered = []
    monkeypatch.setattr(parallel_state, "graph_capture",
                        lambda device: entered.append(device) or contextlib.nullcontext())
    allowed = []
    monitor.set_cudagraph_capturing_enabled(False)
    rt = _runtime([1, 2, 4, 8])
    with FakeTensorMode(allow_non_fake_inputs=True):
        rt.model = _TinyModel()
        rt.model.forward = (lambda f: lambda **kw: allowed.append((monitor.cudagraph_capturing_enabled, len(entered)))
                            or f(**kw))(rt.model.forward)
        rt.graphs = DraftGraphs(rt.vllm_config, CUDA)
        assert rt.capture_graphs() == 4
    assert entered == [CUDA] and not monitor.cudagraph_capturing_enabled
    assert allowed == [(True, 0)] + [(True, 1)] * 8  # the compiling run outside the capture context
    runs = [(ids.shape[0], ctx.cudagraph_runtime_mode, ctx.batch_descriptor.num_tokens) for ids, _, ctx in rt.model.calls]
    assert runs == [(8, CUDAGraphMode.NONE, 8)] + [
        (n, mode, n) for n in (8, 4, 2, 1) for mode in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE)]
    for ids, positions, ctx in rt.model.calls:
        assert ids.untyped_storage()._cdata == rt.graphs.input_ids.untyped_storage()._cdata
        assert positions.untyped_storage()._cdata == rt.graphs.positions.untyped_storage()._cdata
        assert ctx.attn_metadata is None  # attention layers skip, as in vLLM's dummy runs
    monitor.set_cudagraph_capturing_enabled(True)


def test_the_profile_run_is_the_largest_forward_and_sampling(monkeypatch, bridge, smollm2, qwen05) -> None:
    """What vLLM's memory profile sees of the drafter (``BatchDrafter.profile``): one
    forward of ``max_forward_tokens`` (the cap of every forward), logits for the batch's
    rows and the costliest sampling path, on the device with no read-back and no KV
    write (no attention metadata)."""
    def profile(engine) -> None:
        engine.runtime.model.calls.clear()
        engine.profile(100_000, 64)

    traffic, _, engine = _run_steps(monkeypatch, bridge, smollm2, qwen05, "tli", {}, after=profile)
    (input_ids, _, ctx), = engine.runtime.model.calls
    assert input_ids.shape[0] == engine.runtime.cfg.max_forward_tokens and ctx.attn_metadata is None
    assert traffic[-1].d2h == 0, traffic[-1].where


@pytest.mark.parametrize("algorithm", ["tli", "slrs"])
def test_profile_covers_a_top_p_steps_peak(monkeypatch, bridge, smollm2, qwen05, algorithm) -> None:
    """``BatchDrafter.profile`` -- what vLLM's memory profile sees of the drafter -- peaks
    at least as high as a real engine step of the same rows: six top-p-only
    requests (the whole draft vocabulary sorted at each position) drafting ``K``
    positions with every position's q kept. Peaks are the fake device's bytes above
    what was allocated before and is still held after (``tests/_device_memory.py``)."""
    from _device_memory import DeviceMemory

    rows = 6
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(engine_module, "new_generator", lambda device, seed: torch.Generator().manual_seed(seed))
    monkeypatch.setattr(engine_module.VocabBridge, "build", lambda *a: bridge)
    rt = _runtime()
    monkeypatch.setattr(engine_module, "DraftModel", lambda cfg: rt)
    settings = HeteroSettings(algorithm=algorithm, draft_model=smollm2, draft_tokenizer=smollm2,
                              num_speculative_tokens=K, max_draft_tokens=K, draft_budget="fixed")
    prompt = load_tokenizer(qwen05).encode("def fibonacci(n):\n    return")
    top_p = [RequestParams(1.0, top_p=0.9)] * rows
    req_ids = [f"r{i}" for i in range(rows)]
    values = _host_values(bridge)
    with FakeTensorMode(allow_non_fake_inputs=True), DeviceTraffic(values):
        rt.model = _TinyModel()
        rt.graphs = DraftGraphs(rt.vllm_config, CUDA)
        engine = engine_module.BatchDrafter(settings, qwen05, TARGET_V)
        steps = []
        for n in range(2):  # the prompts' catch-up, then a step of K positions
            with DeviceMemory() as memory:
                out = engine.step(StepBatch(req_ids, [np.array(prompt + [220] * n)] * rows, top_p, K))
                assert all(out.ready)
                del out
            # What stays is persistent (the staging buffers' device side, allocated at the
            # first forward), not the step's transient.
            steps.append(memory.peak - memory.live)
        with DeviceMemory() as memory:
            engine.profile(rows * len(prompt), rows)
    profiled = memory.peak - memory.live
    assert profiled >= max(steps) > 0, (profiled, steps)


def test_graph_memory_is_measured_in_a_pool_of_its_own(monkeypatch) -> None:
    """``graph_memory`` measures the drafter's graphs as vLLM's runner measures its own
    before sizing the KV cache: every wrapper pointed at a temporary pool while the
    buckets are captured, the free memory compared around the capture, then every graph
    dropped, the pools and vLLM's capture counter restored. Eager, it measures nothing.
    (The device's memory queries are stand-ins: the CPU build has none.)"""
    from vllm.compilation.counter import compilation_counter
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.platforms import current_platform

    class Wrapper:
        graph_pool = "global pool"

    wrapper = Wrapper()
    monkeypatch.setattr(CUDAGraphWrapper, "_all_instances", weakref.WeakSet([wrapper]))
    cleared = []
    monkeypatch.setattr(CUDAGraphWrapper, "clear_all_graphs", classmethod(lambda cls: cleared.append(True)))
    free = iter([10 << 20, 7 << 20])
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (next(free), 80 << 30))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda *a: None)
    monkeypatch.setattr(current_platform, "graph_pool_handle", lambda: "profiling pool", raising=False)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    captured_before = compilation_counter.num_cudagraph_captured
    rt, eager = _runtime([1, 2, 4, 8]), _runtime()
    pools = []

    def capture(warmups: int = 1) -> int:
        pools.append(wrapper.graph_pool)
        compilation_counter.num_cudagraph_captured += 4
        return 4

    monkeypatch.setattr(rt, "capture_graphs", capture)
    with FakeTensorMode(allow_non_fake_inputs=True):
        rt.model = eager.model = _TinyModel()
        rt.graphs, eager.graphs = DraftGraphs(rt.vllm_config, CUDA), DraftGraphs(eager.vllm_config, CUDA)
        assert eager.graph_memory() == 0 and not cleared
        assert rt.graph_memory() == 3 << 20
    assert pools == ["profiling pool"] and wrapper.graph_pool == "global pool" and cleared == [True]
    assert compilation_counter.num_cudagraph_captured == captured_before
