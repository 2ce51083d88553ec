"""SessionOptions in four frozen groups: each checks its values when built, nothing mutates
afterwards, and an option given in the wrong place (or one that no longer exists) is one clear
InputError naming where it lives now."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest
from coinf.wearable.options import UNSET

from coinf import (
    AsyncSession,
    EmulationOptions,
    LinkOptions,
    PlacementOptions,
    PlannerOptions,
    Session,
    SessionOptions,
)
from coinf.errors import InputError
from tests.bundles import make_tiny_bundle, reference

GROUPS = {"placement": PlacementOptions, "link": LinkOptions, "planner": PlannerOptions,
          "emulation": EmulationOptions}
FIELDS = {
    "placement": ["split", "packing", "packings", "runtime", "handheld_runtime", "head_cache",
                  "plan", "helpers"],
    "link": ["transport", "transport_options", "helper_ble_options", "timeout",
             "connect_timeout", "reconnect_timeout", "fallback", "max_backoff_s", "stream_depth",
             "alternates"],
    "planner": ["objective", "latency_budget_ms", "policy", "wearable_profile",
                "handheld_profile", "input_fps"],
    "emulation": ["slowdown", "threads", "handheld_slowdown", "handheld_threads",
                  "compute_profile"],
}
#: every option with the group it belongs to (and that group's class)
EVERY = [(name, group, GROUPS[group]) for group, names in FIELDS.items() for name in names]


@pytest.fixture()
def bundle(tmp_path: Path):
    return make_tiny_bundle(tmp_path / "tiny")


def test_the_groups_hold_exactly_these_fields_with_these_defaults():
    for group, cls in GROUPS.items():
        assert [f.name for f in dataclasses.fields(cls)] == FIELDS[group]
    assert [f.name for f in dataclasses.fields(SessionOptions)] == list(GROUPS)
    opts = SessionOptions()
    assert opts.placement == PlacementOptions(split=None, packing="raw", packings=("auto",),
                                              runtime="onnxruntime",
                                              handheld_runtime="onnxruntime", head_cache=4,
                                              plan=None, helpers=())
    assert opts.link == LinkOptions(transport="inprocess", transport_options={},
                                    helper_ble_options={}, timeout=30.0,
                                    connect_timeout=None, reconnect_timeout=3.0, fallback=True,
                                    max_backoff_s=30.0, stream_depth=3, alternates={})
    assert opts.planner == PlannerOptions(objective=None, latency_budget_ms=UNSET, policy=None,
                                          wearable_profile=None, handheld_profile=None,
                                          input_fps=None)
    assert opts.emulation == EmulationOptions(slowdown=1.0, threads=0, handheld_slowdown=1.0,
                                              handheld_threads=0)
    assert opts.link.effective_connect_timeout == 30.0
    assert LinkOptions(timeout=9, connect_timeout=2).effective_connect_timeout == 2


@pytest.mark.parametrize(("cls", "field", "value"), [
    (PlacementOptions, "split", ""),
    (PlacementOptions, "split", 7),
    (PlacementOptions, "packing", "q99"),
    (PlacementOptions, "packing", "zip"),
    (PlacementOptions, "packings", "q8"),  # a string, not a sequence of packings
    (PlacementOptions, "packings", ()),
    (PlacementOptions, "packings", ("auto", "q0")),
    (PlacementOptions, "runtime", "tensorflow"),
    (PlacementOptions, "handheld_runtime", "tvm"),
    (PlacementOptions, "head_cache", 0),
    (PlacementOptions, "head_cache", 2.5),
    (PlacementOptions, "plan", 3),
    (PlacementOptions, "helpers", ["tcp:127.0.0.1:7878"]),  # HelperConfigs, not addresses
    (LinkOptions, "transport", ""),
    (LinkOptions, "transport_options", ["mtu", 247]),
    (LinkOptions, "helper_ble_options", "passkey=1234"),
    (LinkOptions, "timeout", 0),
    (LinkOptions, "timeout", -1.0),
    (LinkOptions, "timeout", "30"),
    (LinkOptions, "timeout", True),
    (LinkOptions, "connect_timeout", 0),
    (LinkOptions, "reconnect_timeout", -3.0),
    (LinkOptions, "max_backoff_s", 0),
    (LinkOptions, "fallback", "yes"),
    (LinkOptions, "stream_depth", 0),
    (PlannerOptions, "objective", "fastest"),
    (PlannerOptions, "latency_budget_ms", 0),
    (PlannerOptions, "latency_budget_ms", "200"),
    (PlannerOptions, "policy", 3),
    (PlannerOptions, "wearable_profile", 1.0),
    (PlannerOptions, "handheld_profile", ["pi"]),
    (PlannerOptions, "input_fps", 0),
    (PlannerOptions, "input_fps", "30"),
    (EmulationOptions, "slowdown", 0.5),
    (EmulationOptions, "handheld_slowdown", 0),
    (EmulationOptions, "threads", -1),
    (EmulationOptions, "threads", True),
    (EmulationOptions, "handheld_threads", 1.5),
])
def test_a_bad_value_is_an_input_error_naming_the_field(cls, field, value):
    with pytest.raises(InputError) as info:
        cls(**{field: value})
    text = str(info.value)
    assert f"{cls.__name__}.{field}" in text and "\n" not in text


@pytest.mark.parametrize(("cls", "field", "value"), [
    (PlacementOptions, "split", "handheld-only"),
    (PlacementOptions, "packing", "jpeg-q90"),
    (PlacementOptions, "packings", ["raw", "q8", "auto"]),
    (PlacementOptions, "runtime", "auto"),
    (LinkOptions, "transport", "tcp:127.0.0.1:7878"),
    (LinkOptions, "timeout", 1),
    (LinkOptions, "connect_timeout", 0.5),
    (PlannerOptions, "objective", "energy"),
    (PlannerOptions, "latency_budget_ms", None),
    (PlannerOptions, "policy", "policy.json"),
    (PlannerOptions, "input_fps", 30),
    (EmulationOptions, "slowdown", 8),
    (EmulationOptions, "threads", 1),
])
def test_a_good_value_is_kept(cls, field, value):
    got = getattr(cls(**{field: value}), field)
    assert got == (tuple(value) if isinstance(value, list) else value)


@pytest.mark.parametrize(("name", "group", "cls"), EVERY)
def test_an_option_outside_its_group_names_the_group(name, group, cls):
    where = f"{name} is a {group} option: SessionOptions({group}={cls.__name__}({name}=...))"
    with pytest.raises(InputError) as top:
        SessionOptions(**{name: None})
    assert str(top.value) == where
    other = next(c for g, c in GROUPS.items() if g != group)
    with pytest.raises(InputError) as wrong_group:
        other(**{name: None})
    assert str(wrong_group.value) == where
    with pytest.raises(InputError) as replaced:
        SessionOptions().replace(**{name: None})
    assert str(replaced.value) == where
    with pytest.raises(InputError) as group_replaced:
        other().replace(**{name: None})
    assert str(group_replaced.value) == where
    with pytest.raises(AttributeError) as read:
        getattr(SessionOptions(), name)
    assert f"{name} is a {group} option: read options.{group}.{name}" in str(read.value)


@pytest.mark.parametrize("make", [Session, AsyncSession])
def test_a_session_keyword_option_names_its_group(bundle, make):
    with pytest.raises(InputError, match=r"^split is a placement option: "
                       r"SessionOptions\(placement=PlacementOptions\(split=\.\.\.\)\)$"):
        make(bundle, split="c001")
    with pytest.raises(InputError, match=r"^timeout is a link option: "
                       r"SessionOptions\(link=LinkOptions\(timeout=\.\.\.\)\)$"):
        make(bundle, SessionOptions(), timeout=5.0)
    with pytest.raises(InputError, match=r"^link is a SessionOptions group: "
                       r"Session\(bundle, SessionOptions\(link=LinkOptions\(\.\.\.\)\)\)$"):
        make(bundle, link=LinkOptions())


def test_an_unknown_option_lists_the_groups_and_their_fields(bundle):
    for call in (lambda: SessionOptions(splitt="c001"), lambda: LinkOptions(splitt="c001"),
                 lambda: SessionOptions().replace(splitt="c001"),
                 lambda: Session(bundle, splitt="c001")):
        with pytest.raises(InputError) as info:
            call()
        text = str(info.value)
        assert text.startswith("unknown Session option 'splitt' (did you mean split?)")
        for group, names in FIELDS.items():
            assert f"{group}: {', '.join(names)}" in text
        assert "\n" not in text
    with pytest.raises(AttributeError, match="has no attribute 'splitt'"):
        SessionOptions().splitt  # noqa: B018


@pytest.mark.parametrize(("make", "replacement"), [
    (lambda: SessionOptions(handheld="tcp:1.2.3.4:7878"),
     'LinkOptions(transport="unix:/path" | "tcp:HOST:PORT")'),
    (lambda: LinkOptions(handheld="unix:/tmp/h.sock"),
     'LinkOptions(transport="unix:/path" | "tcp:HOST:PORT")'),
    (lambda: LinkOptions(transport="socket"),
     'LinkOptions(transport="unix:/path" | "tcp:HOST:PORT")'),
    (lambda: SessionOptions(hci="hci-socket:0"), 'LinkOptions(transport="ble:hci-socket:0")'),
    (lambda: LinkOptions(transport="ble"), 'LinkOptions(transport="ble:hci-socket:0")'),
    (lambda: LinkOptions(ble_options={"mtu": 247}), "LinkOptions(transport_options=...)"),
    (lambda: LinkOptions().replace(hci="usb:0"), 'LinkOptions(transport="ble:hci-socket:0")'),
])
def test_a_legacy_alias_is_gone_and_the_error_names_its_replacement(make, replacement):
    with pytest.raises(InputError) as info:
        make()
    assert str(info.value).endswith(f"is gone; use {replacement}")


def test_legacy_session_keywords_are_refused(bundle):
    with pytest.raises(InputError, match=r"^handheld= is gone; use LinkOptions\(transport="):
        Session(bundle, handheld="tcp:127.0.0.1:7878")
    with pytest.raises(InputError, match=r"^ble_options= is gone"):
        Session(bundle, ble_options={"mtu": 247})


def test_groups_and_sess_options_must_have_their_types(bundle):
    with pytest.raises(InputError, match=r"^SessionOptions\.link must be a LinkOptions, got "
                       "PlacementOptions$"):
        SessionOptions(link=PlacementOptions())
    with pytest.raises(InputError, match=r"SessionOptions\.placement must be a PlacementOptions, "
                       "got dict"):
        SessionOptions(placement={"split": "c001"})
    with pytest.raises(InputError, match=r"sess_options must be coinf\.SessionOptions, got "
                       r"builtins\.dict$"):
        Session(bundle, {"placement": PlacementOptions()})
    with pytest.raises(InputError, match=r"got .*PlacementOptions; wrap it: "
                       r"SessionOptions\(placement=PlacementOptions\(\.\.\.\)\)"):
        Session(bundle, PlacementOptions(split="c001"))


def test_options_are_frozen():
    opts = SessionOptions()
    for target, name, value in ((opts, "link", LinkOptions()),
                                (opts.placement, "split", "c001"),
                                (opts.link, "timeout", 1.0),
                                (opts.planner, "objective", "latency"),
                                (opts.emulation, "slowdown", 2.0)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(target, name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.split = "c001"  # type: ignore[attr-defined]


def test_replace_makes_a_copy_and_checks_it():
    opts = SessionOptions(placement=PlacementOptions(split="c001"))
    other = opts.replace(link=opts.link.replace(timeout=5.0))
    assert other.link.timeout == 5.0 and other.placement is opts.placement
    assert opts.link.timeout == 30.0 and opts == SessionOptions(
        placement=PlacementOptions(split="c001"))
    with pytest.raises(InputError, match=r"LinkOptions\.timeout must be"):
        opts.link.replace(timeout=-1)
    with pytest.raises(InputError, match=r"SessionOptions\.link must be a LinkOptions"):
        opts.replace(link=EmulationOptions())


def test_the_callers_containers_are_copied_so_later_changes_do_not_leak():
    extra = {"mtu": 247}
    packings = ["raw", "q8"]
    link, place = LinkOptions(transport_options=extra), PlacementOptions(packings=packings)
    extra["mtu"], packings[0] = 23, "q4"
    assert link.transport_options == {"mtu": 247} and place.packings == ("raw", "q8")


def test_copies_and_pickles_are_equal_and_keep_unset():
    opts = SessionOptions(placement=PlacementOptions(split="c001"),
                          link=LinkOptions(transport_options={"mtu": 247}))
    for twin in (copy.copy(opts), copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        assert twin == opts
        assert twin.planner.latency_budget_ms is UNSET  # "the policy's budget", not an object
    assert repr(UNSET) == "UNSET"


def test_a_session_changes_nothing_in_its_options(bundle):
    opts = SessionOptions(placement=PlacementOptions(split="c001", packings=["raw", "q8"]),
                          link=LinkOptions(transport_options={}, timeout=20.0),
                          emulation=EmulationOptions(handheld_threads=1))
    before = copy.deepcopy(opts)
    groups = {name: getattr(opts, name) for name in GROUPS}
    fields = {(g, f.name): getattr(getattr(opts, g), f.name)
              for g in GROUPS for f in dataclasses.fields(GROUPS[g])}
    x = np.ones((1, 16), np.float32)
    with Session(bundle, opts) as sess:
        (y,) = sess.run(None, {"x": x})
        assert sess.get_session_options() is opts
        sess.set_split("c000")
        sess.run(None, {"x": x})
    np.testing.assert_allclose(y, reference(bundle, x), rtol=1e-5, atol=1e-6)
    assert opts == before
    assert all(getattr(opts, name) is group for name, group in groups.items())
    assert all(getattr(getattr(opts, g), f) is value for (g, f), value in fields.items())
    assert opts.link.transport_options == {}  # the in-process handheld's settings went elsewhere
