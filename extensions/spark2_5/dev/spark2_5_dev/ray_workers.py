"""vLLM's own Ray worker wrapper in Ray actors, on a Ray head started without the switch.

``python -m spark2_5_dev.ray_workers MODEL --switch NAME=VALUE ...`` starts a local
Ray head from this process while its environment holds no switch (the raylet, and
every actor it starts, keeps that environment), then sets the switch here as the
shell that launches vLLM would, and loads vLLM's general plugins: the carrier,
enabled, extends vLLM's copy list. For each rule by which the installed vLLM
hands the driver's environment to Ray actors it starts one ``RayWorkerWrapper``
actor (``WorkerWrapperBase`` on 0.33), gives it the environment by that rule,
runs ``init_worker`` (where a worker loads its plugins) and reports what the
worker saw: the carrier's variables and whether ``Spark2_5ForCausalLM``
resolves there. vLLM's CPU build refuses Ray executors, so the executors
themselves cannot run here; these are their calls. Prints one JSON object, rule -> report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from vllm_spark2_5_plugin._registration import ARCHITECTURE
from vllm_spark2_5_plugin._registration import RAY_EXTRA_ENV_VARS as COPY_LIST


def _report(wrapper: Any, names: list[str]) -> dict[str, Any]:
    """Runs inside the actor, after ``init_worker``."""
    from vllm.model_executor.models.registry import ModelRegistry

    try:
        ModelRegistry.resolve_model_cls([ARCHITECTURE], wrapper.vllm_config.model_config)
        resolved = None
    except Exception as exc:  # what vLLM says when the carrier is off there
        resolved = f"{type(exc).__name__}: {str(exc)[:200]}"
    return {
        "environment": {name: os.environ.get(name) for name in names},
        "resolve_error": resolved,
    }


def _fill_in(wrapper: Any, driver_env: dict[str, str]) -> None:
    """The V2 executor's rule (``RayWorkerProc.initialize_worker``): the driver's values
    fill in what the node lacks and never replace what it set."""
    for key, value in driver_env.items():
        os.environ.setdefault(key, value)


def has_older_ray_executor() -> bool:
    """vLLM 0.23 to 0.32 keep the Ray executor before V2 (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``);
    0.33 removed it."""
    import importlib.util

    return importlib.util.find_spec("vllm.v1.executor.ray_executor") is not None


def _rules() -> dict[str, Callable[[], tuple[dict, Callable]]]:
    """Each copy rule of the installed vLLM: actor options, then how the actor gets the
    environment before ``init_worker``. 0.23 to 0.32 have the three, 0.33 has no
    older executor."""
    import cloudpickle
    from ray.runtime_env import RuntimeEnv
    from vllm.platforms import current_platform
    from vllm.ray.ray_env import get_env_vars_to_copy
    from vllm.v1.executor.ray_env_utils import get_driver_env_vars
    from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS

    def present(names: set[str]) -> dict[str, str]:
        return {name: os.environ[name] for name in names if name in os.environ}

    def v2_executor() -> tuple[dict, Callable]:
        env = get_driver_env_vars(worker_specific_vars=WORKER_SPECIFIC_ENV_VARS)
        return {}, lambda actor: actor.execute_method.remote(cloudpickle.dumps(_fill_in), env)

    def ray_executor() -> tuple[dict, Callable]:
        names = get_env_vars_to_copy(
            exclude_vars=WORKER_SPECIFIC_ENV_VARS,
            additional_vars=set(current_platform.additional_env_vars),
            destination="workers",
        )
        env = present(names)
        return {}, lambda actor: actor.update_environment_variables.remote([env])

    def dp_engine_actor() -> tuple[dict, Callable]:
        names = get_env_vars_to_copy(
            destination="EngineCoreActor", exclude_vars=WORKER_SPECIFIC_ENV_VARS
        )
        return {"runtime_env": RuntimeEnv(env_vars=present(names))}, lambda actor: None

    rules = {"v2_executor": v2_executor, "dp_engine_actor": dp_engine_actor}
    if has_older_ray_executor():
        rules["ray_executor"] = ray_executor
    return rules


def _worker_class() -> type:
    """vLLM's ``RayWorkerWrapper`` (0.23 to 0.32); on 0.33, which removed it, its base
    ``WorkerWrapperBase`` (what the V2 executor's workers run) with the same
    ``execute_method``."""
    try:
        from vllm.v1.executor.ray_utils import RayWorkerWrapper
    except ImportError:
        from vllm.v1.serial_utils import run_method
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        class RayWorkerWrapper(WorkerWrapperBase):
            def execute_method(self, method: str | bytes, *args: Any, **kwargs: Any) -> Any:
                return run_method(self, method, args, kwargs)

    return RayWorkerWrapper


def _run_worker(rule: Callable, vllm_config: Any, names: list[str]) -> dict[str, Any]:
    import cloudpickle
    import ray

    options, hand_over = rule()
    actor = ray.remote(num_cpus=0, **options)(_worker_class()).remote(rpc_rank=0)
    try:
        pending = hand_over(actor)
        if pending is not None:
            ray.get(pending, timeout=120)
        kwargs = {
            "vllm_config": vllm_config,
            "local_rank": 0,
            "rank": 0,
            "distributed_init_method": "tcp://127.0.0.1:1",  # never used: no init_device
            "is_driver_worker": True,
        }
        ray.get(actor.init_worker.remote([kwargs]), timeout=300)
        method = cloudpickle.dumps(_report)
        return ray.get(actor.execute_method.remote(method, names), timeout=120)
    finally:
        ray.kill(actor)


def _workers(model: str, names: list[str], rules: list[str], control: bool) -> dict[str, Any]:
    """Load the plugins here (the switch is set by now), then one worker per rule."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins

    operators_list = os.environ.get(COPY_LIST)
    load_general_plugins()
    carriers_list = os.environ.get(COPY_LIST)
    engine_args = EngineArgs(
        model=model, max_model_len=256, enforce_eager=True, gpu_memory_utilization=0.1
    )
    vllm_config = engine_args.create_engine_config()
    by_name = _rules()
    report: dict[str, Any] = {"driver_copy_list": carriers_list, "rules": list(by_name)}
    if control:  # a copy-list rule with the list as the operator left it
        _set(COPY_LIST, operators_list)
        report["control_copy_list"] = _run_worker(by_name["dp_engine_actor"], vllm_config, names)
        _set(COPY_LIST, carriers_list)
    for name in rules or list(by_name):
        report[name] = _run_worker(by_name[name], vllm_config, names)
    return report


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument(
        "--switch", action="append", default=[], metavar="NAME=VALUE", help="set once the head runs"
    )
    parser.add_argument(
        "--node", action="append", default=[], metavar="NAME=VALUE", help="set on the Ray node"
    )
    parser.add_argument("--report", action="append", default=[], metavar="NAME")
    parser.add_argument("--rule", action="append", default=[], help="default: every rule")
    parser.add_argument(
        "--control", action="store_true", help="first, one worker without the carrier's list"
    )
    args = parser.parse_args()

    import ray

    os.environ.update(item.split("=", 1) for item in args.node)
    temp_dir = tempfile.mkdtemp(prefix="ray")  # short: Ray's socket paths have a length limit
    ray.init(
        num_cpus=1,
        object_store_memory=80 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp_dir,
    )
    try:
        os.environ.update(item.split("=", 1) for item in args.switch)
        print(json.dumps(_workers(args.model, args.report, args.rule, args.control)))
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
