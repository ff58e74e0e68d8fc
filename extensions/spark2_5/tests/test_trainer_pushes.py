"""Weight pushes as RL trainers send them, on real vLLM (CPU): direct ``load_weights``
calls where vLLM computes with the parameters (TRL, OpenRLHF, verl), and a gloo
broadcast that a refused tensor must not leave waiting. One subprocess
(``spark2_5_dev.trainer_pushes``) runs both; each test asserts on its part."""

from __future__ import annotations

import pytest

from spark2_5_dev.drivers import assert_matches_reference, run_driver
from spark2_5_dev.weight_updates import CASES, WRONG_SHAPE

pytestmark = pytest.mark.slow

DIRECT_STEPS = [
    "a_first_load",
    "b_trl_per_parameter",
    "a_openrlhf_per_tensor",
    "b_verl_buckets",
    "a_whole_state_dict",
    "a_after_wrong_shape_direct",
    "b_reload_iterator",
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = tmp_path_factory.mktemp("trainer-pushes")
    return run_driver("spark2_5_dev.trainer_pushes", [], workdir, timeout=1200, name="pushes")


@pytest.fixture
def broadcast(measured) -> dict:
    if not measured["engines_own_the_session"]:
        pytest.skip("this vLLM's weight-transfer engines have another API")
    return measured["broadcast"]


@pytest.mark.parametrize("case", [case.name for case in CASES])
@pytest.mark.parametrize("step", DIRECT_STEPS)
def test_where_vllm_reads_the_parameters_direct_pushes_serve_the_pushed_weights(
    measured, case, step
):
    """Greedy tokens equal to the reference on the weights the step's name says (a or
    b); the stand-in really computes from the parameters (vLLM packed none away) and
    without the CPU's finite keys/values guard."""
    assert measured["direct"][case]["nothing_packed"] is True
    assert measured["direct"][case]["finite_guard"] is False
    assert_matches_reference(measured["direct"][case][step])


@pytest.mark.parametrize("case", [case.name for case in CASES])
def test_a_refused_direct_push_raises_at_once_and_changes_nothing(measured, case):
    error = measured["direct"][case]["wrong_shape_direct_error"]
    assert error.startswith(f"Spark2_5CheckpointError: Checkpoint tensor {WRONG_SHAPE!r}")


def test_the_tied_head_needs_no_second_copy_where_vllm_reads_the_parameters(measured):
    """A reload of the embedding reaches the tied head (``b_reload_iterator`` above)
    with the head still the embedding's parameter."""
    assert measured["direct"]["tied-fused"]["b_head_still_tied"] is True


def test_a_refused_broadcast_update_is_received_to_its_end_and_raised_at_finish(broadcast):
    assert broadcast["sender_exit_code"] == 0  # it sent both updates, none timed out
    assert broadcast["refused_error"].startswith(
        f"RefusedUpdate: Spark2_5 refused this weight update: Checkpoint tensor {WRONG_SHAPE!r}"
    )
    assert_matches_reference(broadcast["a_after_refused"])  # nothing of it loaded


def test_after_a_refused_broadcast_the_next_update_serves(broadcast):
    """vLLM 0.32's worker keeps the refused update open (its finish raised): one more
    finish ends it, as the RL doc says; the next update then loads."""
    assert broadcast["second_finish_error"] is None
    assert broadcast["good_error"] is None
    assert_matches_reference(broadcast["b_after_good"])
