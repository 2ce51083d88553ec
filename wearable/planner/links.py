"""The link as a decision: which of the wearable's radios carries a frame, with which cut and
packing.

A Pi Zero 2 W reaches its handheld over Bluetooth LE and over Wi-Fi (the same chip). Each link
is a :class:`~coinf.wearable.planner.adapt.LinkEstimate` of its ``kind``; the planner prices a
configuration on each (time from the link's throughput, round trip and wake-up; wearable energy
from the power model's figures for that radio, :meth:`~coinf.device.profile.PowerModel.radio`),
decides per link, then picks the link whose best configuration wins under the same objective
(:func:`decide_links`). ``wearable-only`` uses no link: when it wins everywhere, the answer is
"no link".

Named links (``coinf plan --links ble,wifi``)::

    ble       BLE 4.2, 1M PHY, no DLE: the pi-zero-2w radio preset (20.5 kB/s)
    ble-dle   BLE 4.2 with Data Length Extension (ble42-dle)
    ble-2m    BLE 5, 2M PHY with DLE (ble5-2m): not on a Pi Zero 2 W
    wifi      2.4 GHz 802.11n on a Pi Zero 2 W (pi-zero-2w-wifi, docs/PLANNER.md "Links")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from coinf.wearable.planner.adapt import LinkEstimate
from coinf.wearable.planner.costs import Decision
from coinf.wearable.planner.schedulers import coinf_schedule

from coinf.errors import InputError

#: the BLE round trip the demo and ``coinf plan`` assume (a request and its notification over a
#: few connection events)
BLE_RTT_MS = 30.0
#: link name -> (kind, preset)
NAMED: dict[str, tuple[str, str]] = {
    "ble": ("ble", "pi-zero-2w"),
    "ble-dle": ("ble", "ble42-dle"),
    "ble-2m": ("ble", "ble5-2m"),
    "wifi": ("wifi", "pi-zero-2w-wifi"),
}
#: the links a Pi Zero 2 W has
PI_ZERO_2W_LINKS = ("ble", "wifi")


def link_estimate(name: str) -> LinkEstimate:
    """The estimate of a named link (module docstring); :class:`InputError` naming the choices."""
    if name not in NAMED:
        raise InputError(f"unknown link {name!r}; expected one of {', '.join(NAMED)}")
    kind, preset = NAMED[name]
    est = preset_estimate(kind, preset)
    return dataclasses.replace(est, source=f"{name}: {est.source}")


def preset_estimate(kind: str, preset: str) -> LinkEstimate:
    """The estimate of a ``ble`` radio preset (its ATT capacity, :data:`BLE_RTT_MS`) or a
    ``wifi`` preset (its throughput, round trip and wake-up)."""
    if kind == "wifi":
        from coinf.ble_protocol.wifi_preset import wifi_preset

        w = wifi_preset(preset)
        return LinkEstimate(w.throughput_bps, w.throughput_bps, w.rtt_ms,
                            f"{w.name} Wi-Fi preset", kind="wifi", wake_ms=w.wake_ms)
    from coinf.ble_protocol.radio.params import preset as radio_preset

    bps = radio_preset(preset).capacity_bps()
    return LinkEstimate(bps, bps, BLE_RTT_MS, f"{preset} radio preset", kind="ble")


def parse_links(text: str) -> dict[str, LinkEstimate]:
    """``"ble,wifi"`` -> the named estimates, in that order."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError(f"--links {text!r}: expected link names, e.g. ble,wifi "
                         f"(known: {', '.join(NAMED)})")
    return {n: link_estimate(n) for n in dict.fromkeys(names)}


@dataclass
class LinkChoice:
    """The link chosen, its decision, and every link's decision."""

    link: str | None  # None: the winner runs on the wearable, no link carries anything
    decision: Decision
    per_link: dict[str, Decision]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"link": self.link, "why": self.why,
                "per_link": {k: {"winner": d.winner, "latency_ms": round(
                    d.row.latency_ms(d.streaming), 3),
                    "wearable_mj": round(d.row.wearable_energy_mj, 4)}
                    for k, d in self.per_link.items()}}


def decide_links(planner: Any, links: Mapping[str, LinkEstimate], objective: str | None = None,
                 latency_budget_ms: Any = None, budget_given: bool = False,
                 **decide: Any) -> LinkChoice:
    """Decide on each link, then choose among the links' winners with the objective's own rule
    (latency, throughput: fastest; energy: least weighted energy; auto: least weighted energy
    within the budget, else fastest). ``budget_given`` says whether ``latency_budget_ms`` was
    passed (``None`` is then "no budget"); otherwise the policy's budget applies."""
    if not links:
        raise InputError("no link to decide over")
    pol = planner.policy
    objective = objective or pol.objective
    budget = latency_budget_ms if budget_given else pol.latency_budget_ms
    per: dict[str, Decision] = {}
    for name, est in links.items():
        per[name] = planner.decide(est, objective=objective, latency_budget_ms=budget, **decide)
    ww, wh, _ = pol.weights(decide.get("wearable_status"), decide.get("handheld_status"))
    streaming = next(iter(per.values())).streaming
    rule = {"latency": 0, "throughput": 0, "neurosurgeon-latency": 0, "energy": None,
            "neurosurgeon-energy": None, "dyno": 0}.get(objective, budget)
    winners = [dataclasses.replace(d.row, id=name) for name, d in per.items()]
    best = coinf_schedule(winners, rule, w_wearable=ww, w_handheld=wh, streaming=streaming)
    chosen = per[best.winner]
    local = planner.bundle.candidate(chosen.winner.split("~", 1)[0]).is_wearable_only
    if local:
        return LinkChoice(None, chosen, per, f"{chosen.winner} runs on the wearable on every "
                          "link: no link carries anything")
    scores = "; ".join(
        f"{n}: {d.winner} {d.row.latency_ms(streaming):.0f} ms, "
        f"{d.row.wearable_energy_mj:.0f} mJ on the wearable" for n, d in per.items())
    return LinkChoice(best.winner, chosen, per, f"{best.winner} carries {chosen.winner}: "
                      f"{best.why} ({scores})")
