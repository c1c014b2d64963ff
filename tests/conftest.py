import os

import pytest
import torch

os.environ.setdefault("DLBLAS_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "dlblas"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (python -m pytest -m gpu on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
