"""Fixtures of the learner tests (helpers: learner_support.py)."""

import pytest
from learner_support import tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model().save_pretrained(path)
    return path
