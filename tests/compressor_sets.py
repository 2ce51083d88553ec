"""Small compressor sets (the format of convert/compressors.py) on the committed LeNet, for tests
and the run-time-selection demonstration (docs/BENCHMARKS.md, "`bench pipeline`").

The backbone is the committed LeNet unchanged; each autoencoder (models/compressors.py's Table I
``make_autoencoder``) is trained for ``steps`` Adam steps to reconstruct the cut's activation
(MSE, backbone frozen; ``steps=0``: untrained). Accuracy per packing is measured on the digits
test split with the code really packed and unpacked.

    python -m tests.compressor_sets DIR [--steps N]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import warnings
from pathlib import Path

import numpy as np

#: LeNet layer -> (index in lenet_layers, the ONNX tensor after it)
CUTS = {"pool1": (3, "/pool1/MaxPool_output_0"), "relu2": (5, "/Relu_1_output_0"),
        "pool2": (6, "/pool2/MaxPool_output_0")}
PACKINGS = ("raw", "q8", "q4")


def _export(module: object, sample: object, inp: str, out: str) -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (sample,), buf,  # type: ignore[attr-defined]
                          opset_version=17, dynamo=False, input_names=[inp],
                          output_names=[out], training=torch.onnx.TrainingMode.EVAL)
    return buf.getvalue()


def make_set(out: str | Path, cuts: tuple[str, ...] = ("pool1",),
             gammas: tuple[int, ...] = (2, 4, 8), steps: int = 0, seed: int = 0,
             test_limit: int | None = None) -> Path:
    """Write a compressor set for LeNet at ``cuts`` x ``gammas`` to ``out``."""
    import torch
    from coinf.ble_protocol.packing import pack, unpack
    from coinf.models.compressors import (
        conv_flops,
        lenet_layers,
        load_lenet_onnx,
        make_autoencoder,
    )
    from coinf.models.digits import digits_data
    from coinf.models.zoo import committed_path

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src = committed_path("lenet_digits")
    shutil.copyfile(src, out / "backbone.onnx")
    data = digits_data()
    xt, yt = data.x_test, data.y_test
    if test_limit:
        xt, yt = xt[:test_limit], yt[:test_limit]
    model = load_lenet_onnx(src)
    layers = lenet_layers(model)
    full = torch.nn.Sequential(*layers)
    with torch.no_grad():
        base = float((full(torch.from_numpy(xt)).argmax(1).numpy() == yt).mean())
    entries = []
    for cut in cuts:
        k, name = CUTS[cut]
        head, tail = torch.nn.Sequential(*layers[:k]), torch.nn.Sequential(*layers[k:])
        with torch.no_grad():
            acts = head(torch.from_numpy(data.x_train))
            test_acts = head(torch.from_numpy(xt))
        for gamma in gammas:
            torch.manual_seed(seed)
            enc, dec = make_autoencoder(acts.shape[1], gamma)
            if steps:
                opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=3e-3)
                gen = torch.Generator().manual_seed(seed)
                enc.train()
                dec.train()
                for _ in range(steps):
                    batch = acts[torch.randint(len(acts), (64,), generator=gen)]
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(dec(enc(batch)), batch)
                    loss.backward()
                    opt.step()
            enc.eval()
            dec.eval()
            sample = acts[:1]
            with torch.no_grad():
                code = enc(sample)
                codes = enc(test_acts).numpy()
            accuracy = {}
            for spec in PACKINGS:
                if spec == "raw":
                    got = codes
                else:
                    got = np.stack([unpack(pack(c[None], spec))[0] for c in codes])
                with torch.no_grad():
                    pred = tail(dec(torch.from_numpy(np.ascontiguousarray(got)))).argmax(1)
                accuracy[spec] = float((pred.numpy() == yt).mean())
            stem = f"{cut}-g{gamma}"
            (out / f"{stem}.enc.onnx").write_bytes(_export(enc, sample, name, "code"))
            (out / f"{stem}.dec.onnx").write_bytes(_export(dec, code, "code", name))
            entries.append({"crossing": [name], "gamma": gamma, "encoder": f"{stem}.enc.onnx",
                            "decoder": f"{stem}.dec.onnx", "code_shape": list(code.shape),
                            "code_dtype": "float32",
                            "flops": conv_flops(enc, sample) + conv_flops(dec, code),
                            "model_flops": 0, "accuracy": accuracy})
    index = {"format": 1, "model": "backbone.onnx", "test_set": "sklearn digits, test split",
             "base_accuracy": {"raw": base}, "compressors": entries}
    (out / "index.json").write_text(json.dumps(index, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--cuts", default="pool1")
    args = ap.parse_args()
    make_set(args.out, tuple(args.cuts.split(",")), steps=args.steps)
    print(json.loads((Path(args.out) / "index.json").read_text()))


if __name__ == "__main__":
    main()
