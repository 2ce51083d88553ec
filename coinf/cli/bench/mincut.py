"""``coinf bench mincut``: time the exact min-cut cut search on a large synthetic DAG."""

from __future__ import annotations

import argparse
import random
import time

from coinf.cli import argtypes
from coinf.cli.bench import emit, median, options, progress
from coinf.wearable.planner.mincut import Dag, min_cut, transfer_costs


def synthetic_dag(n_nodes: int, seed: int = 0) -> Dag:
    """A ResNet/Inception-like DAG: a chain with skip connections and 2-4 way branches."""
    rng = random.Random(seed)
    dag = Dag()
    consumers: dict[str, list[str]] = {"input": []}
    producers: list[str] = ["input"]
    for i in range(n_nodes):
        name = f"n{i}"
        dag.add_node(name, rng.uniform(0.05, 2.0), rng.uniform(0.005, 0.1))
        srcs = {producers[-1]}
        if len(producers) > 3 and rng.random() < 0.3:
            srcs.add(producers[-rng.randint(2, min(4, len(producers)))])
        for s in srcs:
            consumers[s].append(name)
        out = f"t{i}"
        consumers[out] = []
        producers.append(out)
    for t in producers:
        producer = None if t == "input" else "n" + t[1:]
        # like a CNN: activations shrink with depth, so the best cut is somewhere inside
        depth = 0.0 if producer is None else int(t[1:]) / n_nodes
        nbytes = int(rng.uniform(0.5, 1.5) * 600_000 * (1 - depth) ** 4) + 200
        dag.add_tensor(t, producer, consumers[t], nbytes, is_output=not consumers[t])
    return dag


def run(args: argparse.Namespace) -> int:
    from coinf.wearable.planner import mincut

    mincut.FLOW_METHOD = args.method
    dag = synthetic_dag(args.nodes, args.seed)
    up, down = transfer_costs(dag, args.bandwidth_bps)
    times = []
    result = None
    for i in range(args.repeats):
        t0 = time.perf_counter()
        result = min_cut(dag, up, down)
        times.append((time.perf_counter() - t0) * 1000)
        progress(f"repeat {i + 1}/{args.repeats}: {times[-1]:.1f} ms")
    assert result is not None
    emit({"nodes": len(dag.nodes), "tensors": len(dag.tensors), "method": args.method,
          "bandwidth_bps": args.bandwidth_bps,
          "median_ms": median(times), "min_ms": min(times), "target_ms": 50,
          "wearable_nodes": len(result.wearable), "latency_ms": result.latency_ms})
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=argtypes.integer(2, 1_000_000), default=1700)
    options.add_repeats(parser, 7)
    options.add_seed(parser, 0)
    parser.add_argument("--bandwidth-bps", type=argtypes.positive, default=20_000.0)
    parser.add_argument("--method", choices=("edmonds_karp", "dinic"), default="edmonds_karp",
                        help="scipy max-flow algorithm")
    parser.set_defaults(func=run)
