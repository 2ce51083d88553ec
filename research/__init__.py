"""Latency-prediction research: training and scoring the in-context slice predictor.

The runtime (``coinf.device``) only *evaluates* a trained predictor stored in a device profile
(:func:`coinf.device.incontext.incontext_node_times`, what the planner calls). Everything that
makes or judges one lives here, installed as ``coinf.research`` from the repository's
``research/`` folder:

* ``slicetrain``    -- fitting :class:`coinf.device.slicepred.SlicePredictor` (node power laws,
  boosted trees, slice constants) and leave-one-model-out scoring;
* ``context_data``  -- its training data: the zoo's slices timed in interleaved rounds (and how
  well those rounds repeat), the synthetic networks' labels, ``train_on_zoo`` (``coinf profile
  --train``) and ``zoo_leave_one_out`` (``coinf bench predict --zoo``);
* ``context_sweep`` -- the synthetic multi-layer networks (four families) profiled in context;
* ``partlabels``    -- node labels decomposed from unprofiled timings of a network's parts;
* ``ortkernels``    -- kernel and layout-reorder counts of onnxruntime's optimized graph;
* ``slicecheck``    -- two reference scores and the checks of a timings cache;
* ``planregret``    -- the goal: the plan chosen from predicted times against the measured best
  (``REGRET_TARGET``, 2 %); slice accuracy is reported next to the measurement's repeatability.

Layering (tests/test_layering.py): this package may import ``coinf.device`` and below; nothing in
the runtime packages imports it, only ``coinf.cli.bench`` and ``coinf profile --train``.
"""
