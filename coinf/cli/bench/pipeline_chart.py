"""The picture of ``coinf bench pipeline``: each stage's measured and predicted time with the
throughput bound, and the frames per second of K devices, two devices and the planner's choice,
every repeat shown."""

from __future__ import annotations

from itertools import pairwise
from typing import Any


def plot_pipeline(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (stages, fps) = plt.subplots(1, 2, figsize=(10, 3.8),
                                      gridspec_kw={"width_ratios": [3, 2]})
    devices = [s.split("@", 1)[-1].split("(", 1)[0] for s in result["stages"]]
    names = [devices[0]]  # compute, the link to the next device, its compute, ...
    for a, b in pairwise(devices):
        names += [f"{a} -> {b}", b]
    if len(names) != len(result["stage_ms"]):
        names = [str(i) for i in range(len(result["stage_ms"]))]
    xs = range(len(names))
    width = 0.4
    stages.bar([x - width / 2 for x in xs], result["stage_ms"], width, label="measured (mean)",
               color="#3182bd")
    predicted = result.get("predicted_stage_ms") or []
    if len(predicted) == len(names):
        stages.bar([x + width / 2 for x in xs], predicted, width, label="predicted",
                   color="#9ecae1")
    stages.set_xticks(list(xs), [n.replace(" -> ", "\n-> ") for n in names], fontsize=7)
    stages.set_ylabel("ms a frame")
    stages.set_title(f"{result['devices']} devices: stages (bound {result['bound_fps']:g} fps, "
                     f"efficiency {result['efficiency']})", fontsize=9)
    stages.legend(fontsize=7)
    stages.grid(alpha=0.3, axis="y")
    runs = result["runs_fps"]
    labels = [f"{result['devices']} devices", "two devices",
              f"planner ({result['planner']['devices']})"]
    for i, key in enumerate(("devices", "two_devices", "planner")):
        values = runs[key]
        fps.bar(i, sorted(values)[len(values) // 2], color="#a1d99b")
        fps.scatter([i] * len(values), values, s=12, color="black", zorder=3)
    fps.set_xticks(range(3), labels, fontsize=8)
    fps.set_ylabel("frames per second (median, each run a dot)")
    fps.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{result['model']}: cuts {result['cuts']}, first link {result['first_link']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
