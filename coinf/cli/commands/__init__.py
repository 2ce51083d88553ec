"""One module per ``coinf`` subcommand. Each defines ``register(subparsers)``.

Modules are imported lazily by :mod:`coinf.cli` so ``coinf --help`` stays fast and the wearable
never imports what it does not use (torch, matplotlib, bleak).
"""

# (subcommand, module, one-line help). Order is the order of ``coinf --help``.
COMMANDS: list[tuple[str, str, str]] = [
    ("split", "split", "slice an ONNX model into a split bundle"),
    ("convert", "convert", "add verified TFLite slices to a bundle (convert tflite)"),
    ("calibrate", "calibrate", "measure packing size and accuracy per candidate"),
    ("compress", "compress", "train learned bottlenecks (encoder, entropy model, decoder) at a "
     "cut"),
    ("models", "models", "list or build the model zoo"),
    ("handheld", "handheld", "run the handheld daemon (tail side)"),
    ("serve", "serve", "the tail service for many wearables: batches on Ray Serve"),
    ("run", "run", "run one inference through a Session"),
    ("discover", "discover", "list the helpers announced on the network (DNS-SD)"),
    ("wifi", "wifi", "Wi-Fi links: pair devices (pinned TLS certificates), list and revoke"),
    ("demo", "demo", "the main job: split, offload and compare every candidate"),
    ("plan", "plan", "explain the split decision for a bundle (--png chart)"),
    ("profile", "profile", "measure this device: per-node and slice latency, "
     "layer predictors"),
    ("policy", "policy", "show or set the end-user offloading policy"),
    ("bench", "bench", "benchmarks printing JSON"),
    ("radio", "radio", "host the emulated BLE radio"),
    ("wearable", "wearable", "run the wearable BLE GATT server"),
    ("push", "push", "copy a bundle to the wearable, verify it, reload the service"),
    ("doctor", "doctor", "check this device: controller LE features, runtimes, memory, bonds"),
    ("status", "status", "what the running wearable service serves (bundle identity)"),
]
