"""How the trained fixture is built: on one torch thread, whatever the machine."""

from __future__ import annotations

import pytest
import torch

from spark2_5_dev import fixture


def test_training_runs_on_one_thread_and_restores_the_callers_count():
    """A 2-thread team on a busy 2-core machine made training 30 to 60 times
    slower, past the test timeout; the caller's setting comes back, also on error."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="stop"), fixture._one_intra_op_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("stop")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_train_runs_its_steps_inside_the_one_thread_setting(monkeypatch, tmp_path):
    """``train`` itself takes the one-thread setting, not only the helper."""
    seen = []
    monkeypatch.setattr(fixture, "_train", lambda out, log: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fixture.train(tmp_path)
        assert seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
