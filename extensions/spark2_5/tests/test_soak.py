"""Serving under load and faults: ``vllm serve`` of the trained Spark2_5 fixture
(carrier enabled, ``--enable-auto-tool-choice --tool-call-parser spark25``, loopback)
soaked with 240 requests at once, twice, by the ``openai`` async client and raw HTTP
(:mod:`spark2_5_dev.soak`): plain chats, tool calls streamed and not, forced tool
choices, clients that hang up mid-stream and malformed requests."""

from __future__ import annotations

import asyncio
import json
import statistics

import httpx
import pytest
import vllm
from packaging.version import Version

from spark2_5_dev import fixture, soak
from spark2_5_dev.soak_requests import forced_cases, malformed_cases, schema_problem


@pytest.fixture(scope="module")
def server(spark_chat_model, carrier_enabled_server):
    with carrier_enabled_server(spark_chat_model, fixture.SERVE_ARGS, **soak.SERVER_ENV) as running:
        yield running


# The first vLLM release whose server keeps its RSS within soak.RSS_GROWTH_LIMIT
# over the measured pass, and the growth tolerated on the ones before it.
STEADY_RSS_FROM = Version("0.28")
OLDER_VLLM_RSS_GROWTH_BOUND = 0.05

MALFORMED = [case.name for case in malformed_cases("model")]


@pytest.mark.serve
@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_request_alone_is_a_4xx_naming_the_problem(server, name):
    async def send() -> tuple[str, tuple[int, str]]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            model = (await http.get("/v1/models")).json()["data"][0]["id"]
            (case,) = [case for case in malformed_cases(model) if case.name == name]
            return case, await soak.refused(http, case)

    case, (status, message) = asyncio.run(send())
    assert httpx.get(f"{server.base_url}/health", timeout=60).status_code == 200
    if soak.host_bug_met(case, status, message):
        pytest.xfail(f"vLLM bug ({case.host_bug.seen_on}): {status} {message[:200]}")
    assert soak.refusal_problem(case, status, message) is None


@pytest.mark.slow
@pytest.mark.serve
def test_soak_under_load_and_faults(server, tmp_path):
    record = asyncio.run(soak.soak(server.base_url, server.process.pid))
    (tmp_path / "soak.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
    problems = soak.problems(record)
    figures = ("requests", "rss_bytes", "rss_growth", "health", "hung_up_but_finished")
    print(json.dumps({key: record[key] for key in figures}))
    only_rss = all(problem.startswith("RSS grew") for problem in problems)
    if Version(vllm.__version__) < STEADY_RSS_FROM and only_rss:
        # vLLM 0.23 to 0.27.1 grow 1.6 to 2.8% per pass here; 0.28.0 runs the same
        # carrier code (compat takes the same branches on both) and does not.
        assert record["rss_growth"] < OLDER_VLLM_RSS_GROWTH_BOUND, problems
        if problems:
            pytest.xfail(f"vLLM {vllm.__version__}: {problems[0]}")
    assert not problems, "\n".join(problems[:20])
    assert all(
        part["peak_in_flight"] >= 200 for name, part in record["passes"].items() if name != "alone"
    )


def passing_record() -> dict:
    measured = {"requests": {"plain": 3, "disconnect": 1, "malformed": 1}, "peak_in_flight": 200}
    return {
        "failures": [],
        "health": {"answers": {"200": 12}, "polls": 12},
        "passes": {"warm-up": measured, "measured-1": measured},
        "rss_bytes": {"at_start": 900, "after_each_pass": [1000, 1010]},
        "rss_growth_per_round": [0.01],
        "rss_growth": 0.01,
        "rss_growth_limit": soak.RSS_GROWTH_LIMIT,
        "finished_in_passes": 6,
    }


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (
            {"failures": [{"pass": "measured", "kind": "plain", "request": "p", "problem": "x"}]},
            "p: x",
        ),
        ({"health": {"answers": {"200": 11, "503": 1}, "polls": 12}}, "/health answered"),
        ({"health": {"answers": {"200": 4}, "polls": 4}}, "/health answered"),
        ({"rss_growth": soak.RSS_GROWTH_LIMIT + 0.001}, "RSS grew"),
        ({"finished_in_passes": 5}, "the engine finished 5 requests"),
        ({"finished_in_passes": 9}, "the engine finished 9 requests"),
    ],
)
def test_every_broken_expectation_is_a_problem(change, complaint):
    assert soak.problems(passing_record()) == []
    (problem,) = soak.problems({**passing_record(), **change})
    assert complaint in problem


@pytest.mark.parametrize(
    ("rss_after_each_pass", "leak"),
    [
        # The allocator settling once (+8.3% in one round, as seen on a 2-core EPYC).
        ([1000, 1083, 1083, 1084, 1082, 1083], False),
        ([1000, 1000, 1050, 1050, 1050, 1050], False),
        # A leak per request grows every round, by as much as the limit allows or more.
        ([1000, 1020, 1040, 1061, 1082, 1104], True),
        ([1000, 1011, 1022, 1034, 1045, 1057], True),
    ],
)
def test_the_memory_check_tells_a_leak_from_the_allocator_settling(rss_after_each_pass, leak):
    growth = soak.growth_per_round(rss_after_each_pass)
    record = {
        **passing_record(),
        "rss_growth_per_round": growth,
        "rss_growth": statistics.median(growth),
    }
    assert bool(soak.problems(record)) is leak


def test_streams_hung_up_on_but_finished_are_counted_not_judged():
    assert soak.hung_up_but_finished(passing_record()) == 0
    record = {**passing_record(), "finished_in_passes": 8}
    assert soak.problems(record) == [] and soak.hung_up_but_finished(record) == 2


def test_too_few_requests_in_flight_is_a_problem():
    record = passing_record()
    record["passes"] = {
        name: {**part, "peak_in_flight": 199} for name, part in record["passes"].items()
    }
    assert soak.problems(record) == [
        "only 199 requests were in flight at once (at least 200 expected)"
    ]


@pytest.mark.parametrize(
    "calls",
    [
        (),
        (("get_time", '{"timezone":"Europe/Paris"}'),),
        (("get_weather", '{"city":"Paris","days":"3"}'),),
        (("get_weather", '{"city":"Paris","days":true}'),),
        (("get_weather", '{"city":"Paris"}'),),
        (("get_weather", '{"city":"Paris","days":3}'),) * 2,
    ],
)
def test_a_forced_answer_is_one_call_of_the_named_tool_that_fits_its_schema(calls):
    (case,) = [case for case in forced_cases() if case.name == "named-weather-capital"]
    fitting = (("get_weather", '{"city":"Paris","days":3}'),)
    assert schema_problem(case, ("stop", "", fitting)) is None
    assert schema_problem(case, ("stop", "", calls))


def test_metrics_are_summed_over_their_samples():
    text = "\n".join(
        [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            'vllm:request_success_total{engine="0",finished_reason="stop"} 5.0',
            'vllm:request_success_total{engine="0",finished_reason="length"} 2.0',
            'vllm:request_success_created{engine="0",finished_reason="stop"} 1.7e+09',
            'vllm:num_requests_running{engine="0"} 3.0',
        ]
    )
    assert soak.metric(text, "vllm:request_success_total") == 7.0
    assert soak.metric(text, "vllm:request_success_total", 'finished_reason="length"') == 2.0
    assert soak.metric(text, "vllm:num_requests_running") == 3.0
    assert soak.metric(text, "vllm:num_requests_waiting") == 0.0


def test_group_rss_counts_this_process_group():
    import os

    assert soak.group_rss(os.getpgrp()) > 0
    assert soak.group_rss(-1) == 0


def test_the_evidence_report_has_a_row_for_the_soak():
    from spark2_5_dev.evidence import correctness_rows

    record = {
        "parity": {"exit_code": 0, "worst_fp32_logprob_diff": 1e-4},
        "end_to_end": {"exit_code": 0, "passed": 3, "failed": 0},
        "soak": {
            **passing_record(),
            "exit_code": 0,
            "requests": {"plain": 200, "malformed": 40},
            "rss_growth": 0.0002,
        },
    }
    row = correctness_rows(record)[-1]
    assert row.startswith("| serving soak via `vllm serve` | pass: 240 requests (200 at once)")
    assert "0 failures, RSS +0.02% per measured round (median of 1)" in row
    crashed = correctness_rows({**record, "soak": {"command": "c", "exit_code": 1}})[-1]
    assert "**FAIL**: 0 requests" in crashed
