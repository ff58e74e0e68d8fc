"""bench_model.py's tables: throughput, ratios and their spread, operators, memory."""

from __future__ import annotations

from typing import Any

from common import table

CLOCKS = {"wall": "per wall second", "cpu": "per engine CPU second"}


def print_report(results: dict[str, Any]) -> None:
    if "throughput" in results:
        print("\nOutput tok/s of each round's fastest run per engine, medians of rounds (min-max):")
        rows = []
        for item in results["throughput"]:
            for clock in ("wall", "cpu"):
                for name, rate in item["output_tok_s"][clock].items():
                    rows.append(
                        (
                            item["scenario"]["name"],
                            CLOCKS[clock],
                            name,
                            f"{rate['median']:.3g} ({rate['min']:.3g}-{rate['max']:.3g})",
                        )
                    )
        print(table(("scenario", "clock", "model", "output tok/s"), rows))
        print("\nRatios, geometric mean of rounds [95% interval]:")
        rows = [
            (
                item["scenario"]["name"],
                pair,
                *(ratio_cell(ratios[clock]) for clock in ("wall", "cpu")),
            )
            for item in results["throughput"]
            for pair, ratios in item["ratios"].items()
        ]
        print(table(("scenario", "ratio", CLOCKS["wall"], CLOCKS["cpu"]), rows))
        for item in results["throughput"]:
            print_op_profile(item["scenario"]["name"], item["op_self_cpu_ms"])
    if "memory" in results:
        print_memory(results["memory"])


def print_memory(memory: dict[str, Any]) -> None:
    print(f"\nMemory at max_model_len {memory['max_model_len']} (medians):")
    rows = [
        (
            name,
            f"{fig['peak_rss_mib']['median']:.0f}",
            f"{fig['peak_rss_delta_mib']:+.0f}",
            f"{fig['rss_mib']['median']:.0f}",
            f"{fig['rss_delta_mib']:+.0f}",
            f"{fig['rope_cache_mib']['median']:.2f}",
            f"{fig['kv_cache_tokens']['median']:,.0f}",
        )
        for name, fig in memory["variants"].items()
    ]
    print(
        table(
            (
                "variant",
                "peak RSS MiB",
                "Δ peak",
                "RSS MiB",
                "Δ RSS",
                "RoPE cache MiB",
                "KV tokens",
            ),
            rows,
        )
    )


def ratio_cell(ratio: dict[str, Any], digits: int = 3) -> str:
    low, high = ratio["ci95"]
    return f"{ratio['geomean']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def samples_cell(ratio: dict[str, Any], samples: str) -> str:
    """A ratio to four digits and how many ``samples`` (pairs, runs) it rests on."""
    return f"{ratio_cell(ratio, digits=4)} over {len(ratio['samples'])} {samples}"


def print_op_profile(scenario: str, profiles: dict[str, dict[str, Any]]) -> None:
    """Self CPU ms per operator of one profiled run per model, largest first."""
    models = list(profiles)
    ops = dict.fromkeys(op for profile in profiles.values() for op in profile["ops"])
    rows = [(op, *(_op_ms(profiles[model], op) for model in models)) for op in ops]
    rows.append(("all operators", *(f"{profiles[m]['total']:.0f}" for m in models)))
    print(f"\nOperator self CPU ms, one profiled run each: {scenario}")
    print(table(("operator", *models), rows))


def _op_ms(profile: dict[str, Any], op: str) -> str:
    event = profile["ops"].get(op)
    return f"{event['self_cpu_ms']:.0f} ({event['calls']})" if event else "-"
