"""The coinf model zoo: committed ONNX files in ``models/onnx/`` and the builders that made them.

``models.zoo`` (registry, paths, digits data) needs numpy and onnx only; building imports torch.
"""

from coinf.models.zoo import (
    ZOO,
    InputSpec,
    ModelSpec,
    build,
    committed_path,
    digits_data,
    random_feed,
)

__all__ = ["ZOO", "InputSpec", "ModelSpec", "build", "committed_path", "digits_data", "random_feed"]
