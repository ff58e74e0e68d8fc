"""The benchmarks' vLLM engines: the offline ``LLM`` every script builds
(:func:`offline_llm`), and for bench_model.py and its kin one engine per process,
its parent-side handle, and the benchmark-only patches a baseline engine applies
to itself.

A sample is one fresh process (the same engine runs within 2% of itself while two
processes of it can differ by 10% or more), so every engine lives in its own
spawned process that answers the parent's commands over a pipe.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import use_in_process_engine

# Far beyond any one command of the benchmark (an engine start, a run, a profile):
# a stuck engine ends the benchmark instead of holding the machine.
ANSWER_TIMEOUT_S = 900


@dataclass
class EngineSpec:
    """One vLLM engine to start in its own process."""

    model: str
    max_model_len: int
    dtype: str
    threads: int = 1
    # False: vLLM's default execution mode (torch.compile through Inductor on CPU).
    enforce_eager: bool = True
    # Baseline variant: in-tree Llama with Spark2_5's exact GELU in its MLP.
    exact_gelu_mlp: bool = False
    # Reproduce the seed: RoPE cos/sin cache over this many positions.
    rope_positions: int | None = None


def _engine_process(conn: Any, spec: EngineSpec) -> None:
    """Own one ``LLM`` and answer the parent's commands until told to stop."""
    use_in_process_engine(spec.threads)
    if spec.exact_gelu_mlp:
        use_exact_gelu_in_llama_mlp()
    if spec.rope_positions is not None:
        _build_rope_over(spec.rope_positions)
    started = time.perf_counter()
    llm = offline_llm(spec.model, spec.max_model_len, spec.dtype, spec.enforce_eager)
    conn.send({"init_s": time.perf_counter() - started})
    commands = {
        "generate": _generate,
        "profile": _profile,
        "memory": _memory_figures,
        "alternate additions": _alternate_additions,
        "forward times": _forward_times,
    }
    answer_commands(conn, {name: functools.partial(run, llm) for name, run in commands.items()})


def offline_llm(
    model: str, max_model_len: int, dtype: str, enforce_eager: bool, **settings: Any
) -> Any:
    """A benchmark's offline ``LLM``, in this process, with any further ``settings``."""
    from vllm import LLM

    return LLM(
        model=model,
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        # Every timed run must prefill its prompts, not find them cached.
        enable_prefix_caching=False,
        seed=0,
        **settings,
    )


def answer_commands(conn: Any, commands: dict[str, Callable[[Any], Any]]) -> None:
    """The engine process's side of ``Engine.ask``: answer each (command, payload)
    with ``commands[command](payload)`` until told to stop."""
    while True:
        command, payload = conn.recv()
        if command == "stop":
            conn.close()
            return
        conn.send(commands[command](payload))


def prompts_and_params(payload: dict[str, Any]) -> tuple[list[Any], Any]:
    """A run's token prompts and its greedy, fixed-length sampling."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in payload["prompts"]]
    params = SamplingParams(
        max_tokens=payload["output_len"], ignore_eos=True, temperature=0.0, detokenize=False
    )
    return prompts, params


def _generate(llm: Any, payload: dict[str, Any]) -> dict[str, Any]:
    prompts, params = prompts_and_params(payload)
    started, cpu_started = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return {
        "elapsed_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "output_tokens": sum(len(out.outputs[0].token_ids) for out in outputs),
        "token_ids": [list(out.outputs[0].token_ids) for out in outputs],
    }


def _profile(llm: Any, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    prompts, params = prompts_and_params(payload)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    return {
        event.key: {"self_cpu_ms": event.self_cpu_time_total / 1e3, "calls": event.count}
        for event in prof.key_averages()
    }


# Which model forwards run with the carrier's additions: on, off, off, on, ... so
# that a drift of the machine cancels within each pair of forwards.
ALTERNATION = (True, False, False, True)


def _alternate_additions(llm: Any, _payload: None = None) -> dict[str, int]:
    """From the next model forward on, switch the carrier's additions on and off by
    ``ALTERNATION`` and record each forward's token rows and process CPU seconds
    (benchmark-only hooks on the model)."""
    (layers,) = llm.apply_model(_hook_forwards)
    return {"layers": layers}


def _hook_forwards(model: Any) -> int:
    """Hook ``model``'s forward; returns how many attention layers the hooks switch."""
    # The work a Spark2_5 layer does beyond an in-tree Llama layer, per layer: the
    # head-wise output gate and the finite keys/values guard, as the model built them.
    additions = [
        (attn, attn.g_proj, attn.finite_kv_only)
        for attn in model.modules()
        if hasattr(attn, "gate_heads")
    ]
    model.bench_forwards = []
    count = itertools.count()
    started: list[tuple[bool, float]] = []

    def before(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        on = ALTERNATION[next(count) % len(ALTERNATION)]
        for attn, g_proj, finite_kv_only in additions:
            attn.g_proj = g_proj if on else None
            attn.finite_kv_only = finite_kv_only and on
        started.append((on, time.process_time()))

    def after(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        on, cpu_started = started.pop()
        rows = kwargs["positions"].shape[-1]
        module.bench_forwards.append((on, rows, time.process_time() - cpu_started))

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    return len(additions)


def _forward_times(llm: Any, _payload: None = None) -> dict[str, Any]:
    """The forwards recorded since the last call: (additions on, token rows, CPU s)."""
    (forwards,) = llm.apply_model(_take_forwards)
    return {"forwards": forwards}


def _take_forwards(model: Any) -> list[tuple[bool, int, float]]:
    forwards, model.bench_forwards = model.bench_forwards, []
    return forwards


def use_exact_gelu_in_llama_mlp() -> None:
    """Build in-tree Llama's MLP with exact GELU instead of SiLU.

    The same ``GeluAndMul`` as Spark2_5's MLP, so that the only work the
    carrier adds over this baseline is its output gate.
    """
    from vllm.model_executor.layers.activation import GeluAndMul
    from vllm.model_executor.models import llama

    build_mlp = llama.LlamaMLP.__init__

    def build_gelu_mlp(self, *args, **kwargs):
        build_mlp(self, *args, **kwargs)
        self.act_fn = GeluAndMul(approximate="none")

    llama.LlamaMLP.__init__ = build_gelu_mlp


def _build_rope_over(positions: int) -> None:
    """Make the carrier's RoPE cache cover ``positions`` rows, as the seed plugin did."""
    from vllm_spark2_5_plugin import compat

    build_rope = compat.get_rope

    def rope_over_max_positions(head_size, max_position, rope_theta, partial_rotary_factor):
        return build_rope(head_size, positions, rope_theta, partial_rotary_factor)

    compat.get_rope = rope_over_max_positions


def _rope_cache_bytes(model: Any) -> int:
    caches = {
        id(buf): buf.numel() * buf.element_size()
        for name, buf in model.named_buffers(remove_duplicate=False)
        if name.endswith("cos_sin_cache")
    }
    return sum(caches.values())


def _memory_figures(llm: Any, _payload: None = None) -> dict[str, Any]:
    status = Path("/proc/self/status").read_text().splitlines()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("Vm")}
    cache_config = llm.llm_engine.vllm_config.cache_config
    return {
        "peak_rss_mib": kib.get("VmHWM", 0) / 1024,
        "rss_mib": kib.get("VmRSS", 0) / 1024,
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rope_cache_mib": llm.apply_model(_rope_cache_bytes)[0] / 2**20,
        "kv_cache_blocks": cache_config.num_gpu_blocks,
        # Group-aware: what vLLM logs as "KV cache size: N tokens".
        "kv_cache_tokens": cache_config.kv_cache_size_tokens,
    }


class Engine:
    """Parent-side handle of an engine process. Creating one starts the process and
    returns at once, so that several engines start side by side; the first command
    waits until the engine is up."""

    def __init__(self, spec: Any, target: Callable[[Any, Any], None] = _engine_process) -> None:
        """``target(conn, spec)`` runs in the new process: it sends one message with
        ``init_s`` once up, then answers commands until "stop"."""
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=target, args=(child_conn, spec))
        self.process.start()
        child_conn.close()
        # Once up: the process's first message.
        self.startup: dict[str, Any] = {}

    @property
    def init_s(self) -> float | None:
        """Seconds the engine took to start, once it is up."""
        return self.startup.get("init_s")

    def up(self) -> None:
        """Wait until the engine has started."""
        if not self.startup:
            self.startup = self._receive()

    def _receive(self) -> dict[str, Any]:
        try:
            if not self.conn.poll(ANSWER_TIMEOUT_S):
                self.process.kill()
                raise RuntimeError(
                    f"the engine process (pid {self.process.pid}) did not answer within "
                    f"{ANSWER_TIMEOUT_S} s and was killed; its log is above"
                )
            return self.conn.recv()
        except EOFError:
            self.process.join()
            raise RuntimeError(
                f"the engine process exited with {self.process.exitcode}; its log is above"
            ) from None

    def ask(self, command: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        self.up()
        self.conn.send((command, payload))
        return self._receive()

    def stop(self) -> None:
        if self.process.is_alive():
            self.conn.send(("stop", None))
            self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
