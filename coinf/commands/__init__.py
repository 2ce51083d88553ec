"""One module per ``coinf`` subcommand. Each defines ``register(subparsers)``.

Modules are imported lazily by :mod:`coinf.cli` so ``coinf --help`` stays fast and the wearable
never imports what it does not use (torch, matplotlib, bleak).
"""

# (subcommand, module, one-line help). Order is the order of ``coinf --help``.
COMMANDS: list[tuple[str, str, str]] = [
    ("split", "coinf.commands.split", "slice an ONNX model into a split bundle"),
    ("calibrate", "coinf.commands.calibrate", "measure packing size and accuracy per candidate"),
    ("models", "coinf.commands.models", "list or build the model zoo"),
    ("handheld", "coinf.commands.handheld", "run the handheld daemon (tail side)"),
    ("run", "coinf.commands.run", "run one inference through a Session"),
    ("demo", "coinf.commands.demo", "the main job: split, offload and compare every candidate"),
    ("bench", "coinf.commands.bench", "benchmarks printing JSON"),
    ("radio", "coinf.commands.radio", "host the emulated BLE radio"),
    ("wearable", "coinf.commands.wearable", "run the wearable BLE GATT server"),
]
