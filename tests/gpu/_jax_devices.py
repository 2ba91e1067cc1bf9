"""The jax devices the GPU tests compare (GPU against te's CPU backend) and the skip that says why
a machine cannot run them."""

from __future__ import annotations

import jax
import pytest
from te_core import _C


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


GPU = _gpu()
CPU = jax.devices("cpu")[0]
SKIP_WITHOUT_GPU = [
    pytest.mark.skipif(
        GPU is None,
        reason="no GPU visible to jax (jax.devices('gpu') failed): "
        "needs an NVIDIA GPU and jax with its CUDA plugin (jax[cuda12])",
    ),
    pytest.mark.skipif(
        not _C.BUILT_WITH_CUDA,
        reason="te-core was built without CUDA kernels (TE_CUDA_ARCHS empty); rebuild with TE_CUDA_ARCHS=90a",
    ),
]
