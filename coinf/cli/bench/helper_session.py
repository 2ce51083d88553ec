"""The Session given helpers that the pipeline benches run (``bench pipeline``, its
``--bandwidth-kbps-schedule`` mode)."""

from __future__ import annotations

from typing import Any


def pipeline_session(bundle: Any, helpers: list[Any], slowdown: float,
                     profiles: list[Any] | None = None, input_fps: float | None = None,
                     connect_timeout: float = 5.0, **link: Any) -> Any:
    """The Session given ``helpers`` that the pipeline benches run (a stream: throughput), this
    process playing a ``slowdown`` x slower wearable. ``profiles``: the wearable's and the
    helpers' device profiles; without them every device is this machine ``slowdown`` x slower
    (:func:`emulated_profiles`), the priors until each device's speed is measured."""
    from coinf.wearable.core import AsyncSession
    from coinf.wearable.options import (
        EmulationOptions,
        LinkOptions,
        PlacementOptions,
        PlannerOptions,
        SessionOptions,
    )

    wear, hand = (profiles[0], profiles[1]) if profiles else emulated_profiles(bundle, slowdown)
    return AsyncSession(bundle, SessionOptions(
        placement=PlacementOptions(helpers=helpers),
        planner=PlannerOptions(objective="throughput", wearable_profile=wear,
                               handheld_profile=hand, input_fps=input_fps),
        link=LinkOptions(timeout=10.0, connect_timeout=connect_timeout, **link),
        emulation=EmulationOptions(slowdown=slowdown, threads=1)))



def emulated_profiles(bundle: Any, slowdown: float) -> tuple[Any, Any]:
    """(wearable, helper) profiles of this machine played ``slowdown`` x slower: every node's
    time in one profiled run of the whole model here (as slices run: fused), so each slice is
    weighed by its measured time, not its FLOPs."""
    from coinf.cli.bench import progress
    from coinf.device.profile import (
        LAPTOP_POWER,
        PI_ZERO_2W_POWER,
        DeviceProfile,
        ModelProfile,
        profile_nodes,
    )

    progress("profiling the model here (the emulated devices' priors) ...")
    mp = ModelProfile(nodes=profile_nodes(bundle.model_path, 1, 2, 5, "all"))
    models = {bundle.identity: mp}
    return (DeviceProfile("emulated", "wearable", PI_ZERO_2W_POWER, slowdown=slowdown,
                          models=models),
            DeviceProfile("emulated", "handheld", LAPTOP_POWER, slowdown=slowdown,
                          models=models))


__all__ = ["emulated_profiles", "pipeline_session"]
