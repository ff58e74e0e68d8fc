"""Soak ``vllm serve`` of the trained Spark2_5 fixture under load and faults.

``python -m spark2_5_dev.soak --out FILE`` serves the fixture with
``--enable-auto-tool-choice --tool-call-parser spark25`` (carrier enabled) on
loopback and drives it with the ``openai`` async client and raw HTTP:

1. every well-formed request of the mix (:mod:`spark2_5_dev.soak_requests`)
   once, alone, in turn: the reference answers, each checked against what the
   fixture was trained to say (or, for forced tool choices, the tool's schema);
2. a warm-up pass: ``--requests`` requests at once (plain chats, tool calls,
   streamed tool calls, ``tool_choice="required"`` and named, clients that hang
   up after a few chunks, malformed requests), so the allocators reach the
   size this load needs before memory is measured;
3. ``--rounds`` measured passes (the same mix again), and after each the
   server's RSS (every process of its group: API server, engine core, worker)
   once it is idle; the median growth per round is judged (a leak grows it in
   every round, the allocator settling in some).

Every well-formed answer of a pass must equal its reference, every malformed
request must get its 4xx with a message naming the problem, ``/health`` is
polled throughout and must answer 200 every time, and the engine must finish
every well-formed request. Streams a client hung up on should be aborted; how
many vLLM generated to the end anyway is counted (``hung_up_but_finished``).
The JSON record has the counts, failures, latencies, memory and health figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import openai

from spark2_5_dev.soak_requests import (
    DISCONNECT_MAX_TOKENS,
    NO_ANSWER,
    WELL_FORMED_KINDS,
    Answer,
    Case,
    Malformed,
    disconnecting_cases,
    malformed_cases,
    schema_problem,
    well_formed_cases,
)
from spark2_5_dev.streamed import StreamedAnswer

REQUESTS_PER_PASS = 240
# Shares of a pass; the rest are well-formed requests.
DISCONNECT_SHARE = 0.1
MALFORMED_SHARE = 0.15
CHUNKS_BEFORE_HANGING_UP = 3
REQUEST_TIMEOUT_S = 180.0
PASS_TIMEOUT_S = 480.0
HEALTH_INTERVAL_S = 0.5
HEALTH_TIMEOUT_S = 10.0
# Under load a poll can take seconds (15 s of soak saw 14 polls): fewer than this
# means the watch did not run.
MIN_HEALTH_POLLS = 5
# Memory: after the warm-up pass, MEASURED_ROUNDS passes of the same load, the idle
# server's RSS after each. A leak that grows with the number of requests grows it
# in every round; the allocator settling (glibc arenas, oneDNN's primitive cache
# meeting new batch shapes) grows it in some rounds and not others. So the
# judged figure is the median of the per-round growths, each a fraction of the
# RSS before that round; RSS_GROWTH_LIMIT is about 125 KB per request of a
# 240-request round on a 3 GB server (docs/serving-soak.md).
MEASURED_ROUNDS = 5
# oneDNN keeps up to 1,024 compiled kernels, one per GEMM shape (each batch size
# is one). On CPUs where vLLM runs the linear layers through oneDNN (no AMX) that
# bounded cache grew the worker by about 330 MB over 2,600 requests of this mix
# before it was full; with it off the worker's RSS stays flat. The soak's server
# runs without it, so that any growth left is the carrier's or vLLM's.
SERVER_ENV = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}
RSS_GROWTH_LIMIT = 0.01
# An idle reading is the least of a few samples: the API server's RSS still moves
# for a moment after the last answer.
RSS_SAMPLES = 5
RSS_SAMPLE_INTERVAL_S = 0.4


# --- clients ---------------------------------------------------------------------------


async def answer(client: openai.AsyncOpenAI, model: str, case: Case) -> Answer:
    """What a client ends up with; a streamed call must come with its id and name first."""
    if not case.stream:
        response = await client.chat.completions.create(**case.arguments(model))
        choice = response.choices[0]
        calls = tuple(
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls or []
        )
        return choice.finish_reason, choice.message.content or "", calls
    streamed = StreamedAnswer()
    async for chunk in await client.chat.completions.create(**case.arguments(model)):
        streamed.add(chunk)
    return streamed.finish_reason, streamed.content, streamed.calls()


async def hang_up(client: openai.AsyncOpenAI, model: str, case: Case) -> int:
    """Read a few chunks of a long stream, then close the connection; chunks read."""
    stream = await client.chat.completions.create(
        **{**case.arguments(model), "max_tokens": DISCONNECT_MAX_TOKENS},
        extra_body={"ignore_eos": True},
    )
    chunks = 0
    async for _ in stream:
        chunks += 1
        if chunks == CHUNKS_BEFORE_HANGING_UP:
            break
    await stream.close()
    return chunks


async def refused(http: httpx.AsyncClient, case: Malformed) -> tuple[int, str]:
    """Status and error message of a malformed request (the whole body if not JSON)."""
    try:
        response = await http.post(
            "/v1/chat/completions", content=case.body, headers={"Content-Type": "application/json"}
        )
    except (httpx.ReadError, httpx.RemoteProtocolError) as error:
        return NO_ANSWER, f"connection closed without an answer ({type(error).__name__})"
    try:
        body = response.json()
    except ValueError:
        return response.status_code, response.text
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return response.status_code, str(error.get("message"))
    return response.status_code, str(body.get("detail", body) if isinstance(body, dict) else body)


def host_bug_met(case: Malformed, status: int, message: str) -> bool:
    """Whether the answer is exactly the known vLLM bug of ``case`` (see ``HostBug``)."""
    bug = case.host_bug
    return bug is not None and status == bug.status and all(w in message for w in bug.mentions)


def refusal_problem(case: Malformed, status: int, message: str) -> str | None:
    if status != case.status or not all(word in message for word in case.mentions):
        return f"expected {case.status} naming {case.mentions}, got {status}: {message[:300]}"
    return None


# --- the server's side -------------------------------------------------------------------


async def idle_rss(pgid: int) -> int:
    """The least of :data:`RSS_SAMPLES` readings of :func:`group_rss`."""
    readings = []
    for _ in range(RSS_SAMPLES):
        readings.append(group_rss(pgid))
        await asyncio.sleep(RSS_SAMPLE_INTERVAL_S)
    return min(readings)


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in process group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            resident_pages = int((entry / "statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        # Fields after the command name (which may hold spaces): state, ppid, pgrp.
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            total += resident_pages * os.sysconf("SC_PAGE_SIZE")
    return total


def metric(text: str, name: str, label: str = "") -> float:
    """Sum of a Prometheus metric's samples (those carrying ``label``, if given)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def engine_state(http: httpx.AsyncClient) -> dict[str, float]:
    """Requests the engine runs or queues, and has finished (a request a client
    hung up on is aborted, which vLLM does not count as finished)."""
    text = (await http.get("/metrics", timeout=HEALTH_TIMEOUT_S)).text
    return {
        "busy": metric(text, "vllm:num_requests_running")
        + metric(text, "vllm:num_requests_waiting"),
        "finished": metric(text, "vllm:request_success_total"),
    }


async def watch_health(http: httpx.AsyncClient, stop: asyncio.Event) -> dict[str, Any]:
    """Poll ``/health`` (and the engine's queue) until ``stop``; every answer counts."""
    statuses: Counter[str] = Counter()
    slowest, peak_busy = 0.0, 0.0
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = await http.get("/health", timeout=HEALTH_TIMEOUT_S)
            statuses[str(response.status_code)] += 1
            peak_busy = max(peak_busy, (await engine_state(http))["busy"])
        except httpx.HTTPError as error:
            statuses[type(error).__name__] += 1
        slowest = max(slowest, time.monotonic() - started)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S)
    return {
        "polls": sum(statuses.values()),
        "answers": dict(statuses),
        "slowest_ms": round(slowest * 1000, 1),
        "peak_engine_requests": int(peak_busy),
    }


async def wait_idle(http: httpx.AsyncClient, timeout: float = 120.0) -> dict[str, float]:
    """The engine's state once it runs and queues nothing (aborts included)."""
    deadline = time.monotonic() + timeout
    while (state := await engine_state(http))["busy"] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # let freed memory settle before anyone measures it
    return state


# --- passes ------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class Tally:
    """What one pass saw: latencies and failures by kind, and the most requests that
    were in flight at once."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.latencies: defaultdict[str, list[float]] = defaultdict(list)
        self.failures: list[dict[str, str]] = []
        self.host_bugs: Counter[str] = Counter()
        self.in_flight = self.peak_in_flight = 0

    async def run(
        self, kind: str, name: str, work: Awaitable[Any], check: Callable[[Any], str | None]
    ) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        started = time.monotonic()
        try:
            problem = check(await asyncio.wait_for(work, REQUEST_TIMEOUT_S))
        except Exception as error:  # recorded with the rest: the pass goes on
            problem = f"{type(error).__name__}: {error}"[:500]
        finally:
            self.in_flight -= 1
        self.latencies[kind].append(time.monotonic() - started)
        if problem:
            self.failures.append(
                {"pass": self.label, "kind": kind, "request": name, "problem": problem}
            )

    def summary(self, seconds: float) -> dict[str, Any]:
        return {
            "requests": {kind: len(times) for kind, times in sorted(self.latencies.items())},
            "failures": len(self.failures),
            "vllm_bugs_met": dict(sorted(self.host_bugs.items())),
            "peak_in_flight": self.peak_in_flight,
            "seconds": round(seconds, 1),
            "latency_ms": {
                kind: {
                    "p50": round(percentile(times, 0.5) * 1000, 1),
                    "p99": round(percentile(times, 0.99) * 1000, 1),
                    "max": round(max(times) * 1000, 1),
                }
                for kind, times in sorted(self.latencies.items())
            },
        }


def mix(requests: int, model: str) -> list[Case | Malformed]:
    """``requests`` requests: the well-formed cases, clients that hang up and
    malformed requests, each cycled to its share, in a fixed shuffled order."""
    hanging_up = round(requests * DISCONNECT_SHARE)
    malformed = round(requests * MALFORMED_SHARE)
    shares = (
        (well_formed_cases(), requests - hanging_up - malformed),
        (disconnecting_cases(), hanging_up),
        (malformed_cases(model), malformed),
    )
    chosen = [cases[i % len(cases)] for cases, count in shares for i in range(count)]
    random.Random(0).shuffle(chosen)
    return chosen


def _job(
    tally: Tally,
    clients: tuple[openai.AsyncOpenAI, httpx.AsyncClient],
    model: str,
    reference: dict[str, Answer],
    case: Case | Malformed,
) -> Awaitable[None]:
    """One request of a pass, with the check of what comes back."""
    client, http = clients
    if isinstance(case, Malformed):

        def check(got: tuple[int, str]) -> str | None:
            if host_bug_met(case, *got):
                tally.host_bugs[case.name] += 1
                return None
            return refusal_problem(case, *got)

        return tally.run("malformed", case.name, refused(http, case), check)
    if case.kind == "disconnect":
        return tally.run(case.kind, case.name, hang_up(client, model, case), _hang_up_problem)
    alone = reference.get(case.name)
    return tally.run(
        case.kind,
        case.name,
        answer(client, model, case),
        lambda got: None if got == alone else f"got {got}; alone: {alone}",
    )


def _hang_up_problem(chunks: int) -> str | None:
    if chunks == CHUNKS_BEFORE_HANGING_UP:
        return None
    return f"the stream ended after {chunks} chunks"


@contextlib.asynccontextmanager
async def connections(
    base_url: str, requests: int
) -> AsyncIterator[tuple[openai.AsyncOpenAI, httpx.AsyncClient]]:
    """An ``openai`` client and a raw HTTP client with room for ``requests`` at once,
    new for each pass: a connection kept alive from the pass before may be closed
    by the server (after 5 s idle) just as it is reused, which the client would
    see as a dropped request."""
    limits = httpx.Limits(max_connections=2 * requests, max_keepalive_connections=requests)
    async with (
        openai.AsyncOpenAI(
            base_url=f"{base_url}/v1",
            api_key="unused",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
            http_client=httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S),
        ) as client,
        httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits) as http,
    ):
        yield client, http


async def run_pass(
    label: str, base_url: str, model: str, reference: dict[str, Answer], requests: int
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Send the whole mix at once and check every answer."""
    tally = Tally(label)
    async with connections(base_url, requests) as clients:
        jobs = [_job(tally, clients, model, reference, case) for case in mix(requests, model)]
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*jobs), PASS_TIMEOUT_S)
    return tally.summary(time.monotonic() - started), tally.failures


async def reference_answers(
    base_url: str, model: str
) -> tuple[dict[str, Answer], dict[str, Any], list[dict[str, str]]]:
    """Each well-formed case answered alone, checked against the fixture's training
    (or the forced tool's schema)."""
    tally = Tally("alone")
    reference: dict[str, Answer] = {}

    def check(case: Case, got: Answer) -> str | None:
        reference[case.name] = got
        if case.expected is None:
            return schema_problem(case, got)
        return None if got == case.expected else f"got {got}; trained: {case.expected}"

    started = time.monotonic()
    async with connections(base_url, 1) as (client, _):
        for case in well_formed_cases():
            work = answer(client, model, case)
            await tally.run(case.kind, case.name, work, lambda got, c=case: check(c, got))
    return reference, tally.summary(time.monotonic() - started), tally.failures


# --- the soak ----------------------------------------------------------------------------


async def soak(
    base_url: str, pgid: int, requests: int = REQUESTS_PER_PASS, rounds: int = MEASURED_ROUNDS
) -> dict[str, Any]:
    """Reference answers, a warm-up pass and ``rounds`` measured passes against a
    running server whose processes form group ``pgid``; the figures, unjudged (see
    :func:`problems`)."""
    started = time.monotonic()
    # A new connection per poll: one kept alive can be closed by the server (5 s
    # idle) just as a poll reuses it, when the passes starve this client's loop.
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=fresh) as monitor:
        model = (await monitor.get("/v1/models")).json()["data"][0]["id"]
        rss_at_start = group_rss(pgid)
        stop = asyncio.Event()
        health = asyncio.create_task(watch_health(monitor, stop))
        reference, alone, failures = await reference_answers(base_url, model)
        # From here on, only the passes' requests reach the engine.
        finished_before = (await engine_state(monitor))["finished"]
        passes = {"alone": alone}
        rss_after: list[int] = []
        for label in ["warm-up", *(f"measured-{n}" for n in range(1, rounds + 1))]:
            passes[label], pass_failures = await run_pass(
                label, base_url, model, reference, requests
            )
            failures += pass_failures
            finished_after = (await wait_idle(monitor))["finished"]
            rss_after.append(await idle_rss(pgid))
        stop.set()
        growth = growth_per_round(rss_after)
        record = {
            "requests_per_pass": requests,
            "passes": passes,
            "requests": dict(sum((Counter(p["requests"]) for p in passes.values()), Counter())),
            "failures": failures,
            "health": await health,
            "rss_bytes": {"at_start": rss_at_start, "after_each_pass": rss_after},
            "rss_growth_per_round": growth,
            "rss_growth": statistics.median(growth),
            "rss_growth_limit": RSS_GROWTH_LIMIT,
            "finished_in_passes": int(finished_after - finished_before),
            "reference_answers": reference,
            "seconds": round(time.monotonic() - started, 1),
        }
    return {**record, "hung_up_but_finished": hung_up_but_finished(record)}


def growth_per_round(rss_after_each_pass: list[int]) -> list[float]:
    """Each measured round's RSS growth, a fraction of the RSS before it (the first
    reading is the one after the warm-up pass)."""
    return [round(after / before - 1, 4) for before, after in pairwise(rss_after_each_pass)]


def problems(record: dict[str, Any]) -> list[str]:
    """Everything in a soak record that breaks an expectation; empty when it passed."""
    found = [f"{f['pass']} {f['kind']} {f['request']}: {f['problem']}" for f in record["failures"]]
    health = record["health"]
    if set(health["answers"]) != {"200"} or health["polls"] < MIN_HEALTH_POLLS:
        found.append(
            f"/health answered {health['answers']} in {health['polls']} polls (every poll "
            f"must be 200, at least {MIN_HEALTH_POLLS} polls)"
        )
    peak = min(part["peak_in_flight"] for name, part in record["passes"].items() if name != "alone")
    if peak < 200:
        found.append(f"only {peak} requests were in flight at once (at least 200 expected)")
    if record["rss_growth"] > record["rss_growth_limit"]:
        found.append(
            f"RSS grew by {record['rss_growth']:.1%} per round (median of "
            f"{record['rss_growth_per_round']}): {record['rss_bytes']}"
        )
    # Every well-formed request of the passes finishes. A stream a client hung up
    # on ignores EOS and asks for more tokens than it had time for, so it finishes
    # only when vLLM fails to abort it (docs/serving-soak.md): counted, not judged.
    finished, well_formed, hung_up = _finished_counts(record)
    if not well_formed <= finished <= well_formed + hung_up:
        found.append(
            f"the engine finished {finished} requests in the passes: {well_formed} "
            f"well-formed ones, and at most the {hung_up} streams hung up on, were expected"
        )
    return found


def _finished_counts(record: dict[str, Any]) -> tuple[int, int, int]:
    """Requests the engine finished in the passes, the well-formed ones sent, and
    the streams hung up on."""
    sent: Counter[str] = Counter()
    for name, part in record["passes"].items():
        if name != "alone":
            sent.update(part["requests"])
    well_formed = sum(count for kind, count in sent.items() if kind in WELL_FORMED_KINDS)
    return record["finished_in_passes"], well_formed, sent["disconnect"]


def hung_up_but_finished(record: dict[str, Any]) -> int:
    """Streams a client hung up on that the engine generated to the end anyway."""
    finished, well_formed, _ = _finished_counts(record)
    return finished - well_formed


def main(argv: list[str] | None = None) -> int:
    from carrier_harness.evidence import environment
    from carrier_harness.server import VllmServer, serve_args
    from spark2_5_dev import fixture
    from spark2_5_dev.carrier import clean_env

    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the record")
    parser.add_argument("--requests", type=int, default=REQUESTS_PER_PASS, help="requests per pass")
    parser.add_argument("--rounds", type=int, default=MEASURED_ROUNDS, help="measured passes")
    args = parser.parse_args(argv)
    log = args.out.with_name(args.out.stem + ".serve.log")
    env = clean_env(SPARK2_5_PLUGIN_ENABLE="1", **SERVER_ENV)
    scope = "serving soak of the trained Spark2_5 fixture through vllm serve on loopback"
    record: dict[str, Any] = {
        "command": f"python -m {__spec__.name} --requests {args.requests} --rounds {args.rounds}",
        "environment": environment(scope),
        "server_args": serve_args(fixture.SERVE_ARGS),
    }
    with VllmServer(fixture.build_fixture(), fixture.SERVE_ARGS, env=env, log_path=log) as server:
        pgid = server.process.pid
        record.update(asyncio.run(soak(server.base_url, pgid, args.requests, args.rounds)))
    record["loadavg_at_end"] = os.getloadavg()
    record["problems"] = problems(record)
    record["exit_code"] = 1 if record["problems"] else 0
    args.out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("requests", "rss_growth", "problems", "seconds")}))
    return record["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
