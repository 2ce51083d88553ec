"""Research kept out of the runtime: the in-context slice predictor's training and scoring,
and the spatial-partition benchmark's coordinator.

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
  (``REGRET_TARGET``, 2 %); slice accuracy is reported next to the measurement's repeatability;
* ``spatial_session`` -- ``SpatialSession``, MeDNN's spatial partition over helper daemons (TILE
  and REST requests), run only by ``coinf bench spatial``: on realistic device sets it never
  beats the plans the one executor runs (``coinf bench strategies``, docs/SPATIAL.md), so the
  runtime does not carry it.

Layering (tests/test_layering.py): this package may import ``coinf.device`` and below, and
``coinf.wearable`` (the coordinator's connections and result checks); nothing in the runtime
packages imports it, only ``coinf.cli.bench`` and ``coinf profile --train``.
"""
