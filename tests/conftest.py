"""Shared fixtures: the corpus location, generated JPEGs, the Pillow reference.

The corpus lives outside the repository (``../shared/corpus`` next to the checkout) and
is read in place; tests that need it skip when it is absent. Expectations for corpus
files are never hard-coded: Pillow, run at test time, is the oracle, and
``classify.tsv`` is only used to pick files by feature.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from jpegtools import gen, require_corpus

# Decoding times vary with the machine: no per-example deadline. Scale the number of
# fuzzing examples with DLBOOSTER_FUZZ_SCALE (e.g. 20 for a long local run).
settings.register_profile(
    "dlbooster", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dlbooster"))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "sweep: large generated-image sweep (also marked corpus; select with -m sweep)")


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The shared corpus folder; skips the test when it is absent."""
    return require_corpus()


@pytest.fixture
def jpeg_factory():
    """make_jpeg that skips combinations Pillow's encoder refuses."""
    return gen
