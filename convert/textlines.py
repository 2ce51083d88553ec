"""Text lines in a text detector's mask, and how well they match others (``--metric lines@T``).

A DBNet-style detector (PaddleOCR's, ``--post mask:K``) answers with a mask of text pixels;
an app reads each connected region of it as one text line, grown back by DBNet's *unclip*
(the network marks a shrunk kernel of each line) to the line's box. :func:`line_boxes` does
that; :func:`f1` matches two sets of boxes one to one, best IoU first, and scores the matching
as F1 (the ICDAR hmean of one image). Boxes are ``(x0, y0, x1, y1)`` in fractions of the
image, so a mask of any stride compares with labels given for the input.
"""

from __future__ import annotations

import numpy as np

#: DBNet's unclip ratio: a region's box grows by area x ratio / perimeter on each side
UNCLIP = 1.5


def components(mask: np.ndarray) -> np.ndarray:
    """Labels of the 8-connected regions of a 2-D boolean mask: 0 off, 1..n on (not ordered).
    Repeated min-propagation with pointer jumping: a few dozen numpy passes for text lines."""
    on = np.asarray(mask, bool)
    h, w = on.shape
    lab = np.where(on, np.arange(1, h * w + 1).reshape(h, w), 0)
    big = h * w + 1
    while True:
        pad = np.pad(np.where(on, lab, big), 1, constant_values=big)
        low = np.min([pad[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                      for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)
        new = np.where(on, np.minimum(lab, low), 0)
        flat = new.reshape(-1)
        while True:  # pointer jumping: every label takes its label's label
            hop = np.where(flat > 0, flat[np.maximum(flat - 1, 0)], 0)
            hop = np.where(hop > 0, np.minimum(hop, flat), flat)
            if np.array_equal(hop, flat):
                break
            flat = hop
        new = flat.reshape(h, w)
        if np.array_equal(new, lab):
            return lab
        lab = new


def line_boxes(mask: np.ndarray, unclip: float = UNCLIP) -> np.ndarray:
    """The text lines of a detector's mask (``[..., H, W]``, text > 0): one box per region,
    its bounding box grown on each side by area x ``unclip`` / perimeter and clipped to the
    image, in fractions of the image: ``[n, 4]``."""
    m = np.asarray(mask)
    m = m.reshape(m.shape[-2:]) > 0
    h, w = m.shape
    lab = components(m)
    out = []
    for k in np.unique(lab[lab > 0]):
        ys, xs = np.nonzero(lab == k)
        x0, y0, x1, y1 = float(xs.min()), float(ys.min()), xs.max() + 1.0, ys.max() + 1.0
        bw, bh = x1 - x0, y1 - y0
        d = bw * bh * unclip / (2 * (bw + bh))
        out.append((max(x0 - d, 0) / w, max(y0 - d, 0) / h, min(x1 + d, w) / w,
                    min(y1 + d, h) / h))
    return np.array(out, np.float64).reshape(-1, 4)


def label_boxes(label: np.ndarray) -> np.ndarray:
    """A label's line boxes (rows of -1 dropped): ``[n, 4]``."""
    rows = np.asarray(label, np.float64).reshape(-1, 4)
    return rows[(rows >= 0).all(axis=1)]


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` ``[n, 4]`` with every box of ``b`` ``[m, 4]``: ``[n, m]``."""
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda z: (z[:, 2] - z[:, 0]) * (z[:, 3] - z[:, 1])  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def f1(want: np.ndarray, got: np.ndarray, threshold: float) -> float:
    """F1 of boxes ``got`` against ``want``, matched one to one, best IoU first, at IoU >=
    ``threshold``; both empty: 1."""
    if len(want) == 0 and len(got) == 0:
        return 1.0
    if len(want) == 0 or len(got) == 0:
        return 0.0
    m = iou(want, got)
    hits = 0
    while True:
        i, j = np.unravel_index(int(np.argmax(m)), m.shape)
        if m[i, j] < threshold:
            break
        hits += 1
        m[i, :] = -1.0
        m[:, j] = -1.0
    return 2.0 * hits / (len(want) + len(got))
