"""What both sides know about a device: how it runs slices and how fast it is.

Shared by the wearable and the handheld (neither imports the other):

* ``runtime``   -- :class:`SliceRunner`: onnxruntime sessions for a bundle's slices, an LRU cache.
* ``emulation`` -- play a K x slower device with the real model and data.
* ``status``    -- CPU load, clock, battery (what the planner adapts to).
* ``profile``   -- measured slice and layer latency of a device (``coinf profile``).
* ``predict``, ``features``, ``sweep`` -- layer-latency predictors for never-profiled slices.
* ``incontext``, ``slicepred``, ``boosted``, ``ortgraph`` -- in-context node times, and the
  evaluation of the trained slice predictor a profile stores (training and scoring it is
  ``coinf.research``, which nothing here imports).
* ``config``    -- where the per-user policy file and saved profiles live.
"""
