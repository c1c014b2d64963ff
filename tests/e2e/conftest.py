"""Fixtures shared by the end-to-end tests."""

import pytest
import torch

from dlblas_compiler import dynamo


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and this compiler's list of dynamo compilations, empty before and after the test."""
    torch._dynamo.reset()
    dynamo.COMPILATIONS.clear()
    yield
    torch._dynamo.reset()
