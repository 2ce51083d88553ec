"""Post-processing appended to a model before it is split: only what the app needs comes back.

A classifier's 1,000 logits are 4 kB on a 20 kB/s link (about 0.2 s); its top-5 classes are
40 B. A detector's raw anchors are 185 kB; its best 100 boxes 2.4 kB. ``coinf split --post
SPEC`` appends the post-processing to the graph, so every candidate's tail ends with it (the
handheld runs it after the tail), the wearable-only candidate runs it too, the return path
shrinks for the planner like any output, and ``--verify`` checks it like the rest:

=================  =============================================================================
``topk:K``         TopK over the last axis of the first output ``o``: ``o_topk_values`` (float)
                   and ``o_topk_indices`` (int64), K each, best first
``argmax``         ArgMax over the last axis of ``o``: ``o_argmax`` (int64)
``mask:K``         a probability map ``[1, 1, H, W]`` (a text or segmentation net): ``o_mask``
                   ``[1, 1, H/K, W/K]`` uint8, 1 where the K x K block's highest score is >= 0.3
``boxes:K``        a YOLO-style detector output ``[1, 4 + C, N]`` (cx, cy, w, h, C class
                   scores per anchor): the K anchors with the best class score as ``o_boxes``
                   ``[1, K, 6]`` = (cx, cy, w, h, score, class), best first
``FILE.onnx``      your own graph: its inputs are named after model outputs, its outputs are
                   what the app receives (``onnx.compose.merge_models``)
=================  =============================================================================

``SPEC@OUTPUT`` applies a built-in one to another output than the first. The outputs it reads
are replaced by what it produces; other outputs stay.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from coinf.errors import InputError, ModelError

_SPEC = re.compile(r"^(?:(topk|boxes|mask):(\d{1,5})|(argmax))(?:@(.+))?$")
#: ``mask:K``: a probability map's pixels count from this score (DBNet's binarisation threshold)
MASK_THRESHOLD = 0.3
META_KEY = "post"


def check_spec(spec: str) -> str:
    """``spec`` if it is a valid post-processing (module docstring), else InputError."""
    text = spec.strip()
    if text.endswith(".onnx"):
        if not Path(text).is_file():
            raise InputError(f"--post {text}: no such file")
        return text
    m = _SPEC.match(text)
    if not m or (m.group(2) is not None and int(m.group(2)) < 1):
        raise InputError(f"--post {spec!r}: expected topk:K, argmax, boxes:K, mask:K (K >= 1), "
                         "optionally @OUTPUT, or a FILE.onnx")
    return text


def attach(model: ModelProto, spec: str) -> dict[str, Any]:
    """Append the post-processing ``spec`` to ``model`` in place; what the manifest records."""
    spec = check_spec(spec)
    if spec.endswith(".onnx"):
        _merge_file(model, Path(spec))
        return {"spec": Path(spec).name, "kind": "file"}
    m = _SPEC.match(spec)
    assert m is not None
    kind = m.group(1) or m.group(3)
    outs = [o.name for o in model.graph.output]
    target = m.group(4) or outs[0]
    if target not in outs:
        raise InputError(f"--post {spec}: {target!r} is not a model output ({', '.join(outs)})")
    k = int(m.group(2) or 0)
    g = model.graph
    pre = f"post_{target}"
    if kind == "argmax":
        new = [(f"{target}_argmax", TensorProto.INT64)]
        g.node.append(helper.make_node("ArgMax", [target], [new[0][0]], f"{pre}/argmax",
                                       axis=-1, keepdims=0))
    elif kind == "topk":
        new = [(f"{target}_topk_values", TensorProto.FLOAT),
               (f"{target}_topk_indices", TensorProto.INT64)]
        g.initializer.append(numpy_helper.from_array(np.array([k], np.int64), f"{pre}/k"))
        g.node.append(helper.make_node("TopK", [target, f"{pre}/k"], [n for n, _ in new],
                                       f"{pre}/topk", axis=-1))
    elif kind == "mask":
        new = [(f"{target}_mask", TensorProto.UINT8)]
        g.initializer.append(numpy_helper.from_array(np.array(MASK_THRESHOLD, np.float32),
                                                     f"{pre}/threshold"))
        g.node.extend([
            helper.make_node("MaxPool", [target], [f"{pre}/pooled"], f"{pre}/pool",
                             kernel_shape=[k, k], strides=[k, k]),
            helper.make_node("GreaterOrEqual", [f"{pre}/pooled", f"{pre}/threshold"],
                             [f"{pre}/on"], f"{pre}/on"),
            helper.make_node("Cast", [f"{pre}/on"], [new[0][0]], f"{pre}/cast",
                             to=TensorProto.UINT8)])
    else:
        new = [(f"{target}_boxes", TensorProto.FLOAT)]
        _boxes(model, target, k, pre, new[0][0])
    keep = [o for o in g.output if o.name != target]
    del g.output[:]
    g.output.extend(keep)
    g.output.extend(helper.make_tensor_value_info(n, t, None) for n, t in new)
    return {"spec": spec, "kind": kind, "output": target, "k": k}


def _boxes(model: ModelProto, target: str, k: int, pre: str, out: str) -> None:
    """[1, 4+C, N] -> the K anchors of best class score as [1, K, 6]."""
    g = model.graph

    def const(name: str, values: list[int]) -> str:
        g.initializer.append(numpy_helper.from_array(np.array(values, np.int64), f"{pre}/{name}"))
        return f"{pre}/{name}"

    def node(op: str, ins: list[str], name: str, **attrs: Any) -> str:
        g.node.append(helper.make_node(op, ins, [f"{pre}/{name}"], f"{pre}/{name}", **attrs))
        return f"{pre}/{name}"

    rows = node("Transpose", [target], "anchors", perm=[0, 2, 1])  # [1, N, 4+C]
    box = node("Slice", [rows, const("b0", [0]), const("b1", [4]), const("ax", [2])], "xywh")
    big = const("end", [2**62])
    scores = node("Slice", [rows, const("s0", [4]), big, const("ax2", [2])], "scores")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    best = node("ReduceMax", [scores, const("rax", [-1])], "best", keepdims=0) if opset >= 18 \
        else node("ReduceMax", [scores], "best", axes=[-1], keepdims=0)  # [1, N]
    cls = node("ArgMax", [scores], "class", axis=-1, keepdims=0)  # [1, N]
    g.node.append(helper.make_node("TopK", [best, const("k", [k])],
                                   [f"{pre}/top_score", f"{pre}/top_index"], f"{pre}/topk",
                                   axis=-1))
    idx = node("Squeeze", [f"{pre}/top_index", const("sq", [0])], "index")  # [K]
    picked = node("Gather", [box, idx], "picked", axis=1)  # [1, K, 4]
    klass = node("Cast", [node("Gather", [cls, idx], "picked_class", axis=1)], "class_f",
                 to=TensorProto.FLOAT)
    last = const("last", [-1])
    score = node("Unsqueeze", [f"{pre}/top_score", last], "score")
    g.node.append(helper.make_node("Concat", [picked, score,
                                              node("Unsqueeze", [klass, last], "klass")],
                                   [out], f"{pre}/concat", axis=-1))


def _merge_file(model: ModelProto, path: Path) -> None:
    """Append the graph of ``path`` (inputs named after model outputs) to ``model``."""
    import onnx

    try:
        post = onnx.load(str(path))
    except Exception as exc:  # a broken file: say which
        raise InputError(f"--post {path}: not an ONNX model ({exc})") from None
    g, pg = model.graph, post.graph
    outs = [o.name for o in g.output]
    inits = {t.name for t in pg.initializer}
    ins = [i.name for i in pg.input if i.name not in inits]
    if not ins or any(n not in outs for n in ins):
        raise InputError(f"--post {path}: its inputs {ins} must be model outputs "
                         f"({', '.join(outs)})")
    mine = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {
        i.name for i in g.input}
    theirs = {o for n in pg.node for o in n.output} | inits
    clash = sorted(theirs & mine)
    if clash:
        raise ModelError(f"--post {path}: names {clash[:3]} are the model's too; rename them")
    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for o in post.opset_import:
        if opset.get(o.domain or "ai.onnx", o.version) < o.version:
            raise ModelError(f"--post {path}: needs opset {o.version} of "
                             f"'{o.domain or 'ai.onnx'}'; the model has "
                             f"{opset[o.domain or 'ai.onnx']}")
        if (o.domain or "ai.onnx") not in opset:
            model.opset_import.append(o)
    g.node.extend(pg.node)
    g.initializer.extend(pg.initializer)
    g.value_info.extend(pg.value_info)
    keep = [o for o in g.output if o.name not in ins]
    del g.output[:]
    g.output.extend([*keep, *pg.output])
