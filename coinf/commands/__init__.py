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
    ("plan", "coinf.commands.plan", "explain the split decision for a bundle (--png chart)"),
    ("profile", "coinf.commands.profile", "measure this device: per-node and slice latency, "
     "layer predictors"),
    ("policy", "coinf.commands.policy", "show or set the end-user offloading policy"),
    ("bench", "coinf.commands.bench", "benchmarks printing JSON"),
    ("radio", "coinf.commands.radio", "host the emulated BLE radio"),
    ("wearable", "coinf.commands.wearable", "run the wearable BLE GATT server"),
]
