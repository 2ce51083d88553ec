"""Issue 18: the first hour's errors are one line (exit 2), never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from coinf.convert.split import split_model
from coinf.models.zoo import committed_path

from coinf.bundle import Bundle
from coinf.cli import main


@pytest.fixture(scope="module")
def lenet(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return split_model(committed_path("lenet_digits"), tmp_path_factory.mktemp("b") / "lenet",
                       max_candidates=4)


def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str], *needles: str) -> str:
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_plan_png_into_a_missing_folder(lenet: Bundle, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "missing" / "dir" / "plan.png"
    one_line_error(capsys, ["plan", str(lenet.root), "--png", str(png)],
                   "--png", "does not exist", str(png.parent))
    one_line_error(capsys, ["plan", str(lenet.root), "--png", str(tmp_path)], "is a folder")
    assert not png.parent.exists()


def test_run_input_of_the_wrong_shape_or_dtype(lenet: Bundle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    spec = lenet.inputs[0]
    np.save(tmp_path / "wrong.npy", np.zeros((28, 28), np.float32))
    one_line_error(capsys, ["run", str(lenet.root), "--split", "c001", "--input",
                            f"{spec.name}=" + str(tmp_path / "wrong.npy")],
                   "shape [28, 28]", f"expects {list(spec.shape)}")
    np.save(tmp_path / "ints.npy", np.zeros(spec.shape, np.complex64))
    one_line_error(capsys, ["run", str(lenet.root), "--split", "c001", "--input",
                            f"{spec.name}=" + str(tmp_path / "ints.npy")], "complex64", "float32")
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    one_line_error(capsys, ["run", str(lenet.root), "--input",
                            f"{spec.name}=" + str(tmp_path / "junk.npy")], "not a .npy")
    # a float64 array of the right shape is fine (cast to the model's float32)
    np.save(tmp_path / "ok.npy", np.zeros(spec.shape, np.float64))
    assert main(["run", str(lenet.root), "--split", "c001", "--repeat", "1", "--input",
                 f"{spec.name}=" + str(tmp_path / "ok.npy")]) == 0


@pytest.mark.parametrize("which", ["model", "head", "tail"])
def test_damaged_bundle_file_is_named(lenet: Bundle, tmp_path: Path, which: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "b"
    shutil.copytree(lenet.root, root)
    cand = lenet.candidates[1]
    rel = {"model": lenet.model_file, "head": cand.head.file, "tail": cand.tail.file}[which]
    assert rel is not None
    data = (root / rel).read_bytes()
    (root / rel).write_bytes(data[: len(data) // 3])  # truncated, as by a failed copy
    rc = main(["run", str(root), "--split", cand.id, "--repeat", "1"])
    _, err = capsys.readouterr()
    # a damaged tail is found by the (here in-process) handheld first; the wearable then falls
    # back to its own copy of the tail, damaged too: the user's bundle is at fault, exit 2
    assert rc == 2, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert rel in err and "damaged" in err and "--force" in err


def test_outputs_that_cannot_be_written_are_refused_before_the_work(
        lenet: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    # a profile's --out and --context-cache, and bench predict's --cache, are checked before the
    # sweep or any timing (which take minutes to hours): no sweep line reaches stderr
    err = one_line_error(capsys, ["profile", "--train", "--quick", "--no-context", "--out",
                                  str(tmp_path)], "--out", "is a folder")
    assert "sweep" not in err
    one_line_error(capsys, ["profile", "--train", "--quick", "--no-context", "--out",
                            str(a_file / "p.json")], "--out", str(a_file), "not a directory")
    one_line_error(capsys, ["profile", "--train", "--quick", "--out", str(tmp_path / "p.json"),
                            "--context-cache", str(a_file)], "--context-cache",
                   "not a directory")
    one_line_error(capsys, ["profile", "--train", "--quick", "--no-context", "--out",
                            str(tmp_path / "p.json"), "--bundle", str(tmp_path / "nope")],
                   "not a bundle directory")
    one_line_error(capsys, ["bench", "predict", "--zoo", "--cache", str(a_file), "--json"],
                   "--cache", "not a directory")
    assert not (tmp_path / "p.json").exists()
    # a bundle's output under a file: the split's own error, not an OSError traceback
    one_line_error(capsys, ["split", str(lenet.root / lenet.model_file), "-o",
                            str(a_file / "bundle")], "cannot write next to it")
    assert a_file.read_text() == "not a directory"


def test_an_os_error_on_a_path_is_one_line_and_a_bug_keeps_its_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import coinf.cli.commands.status as status

    def denied(args: object) -> int:
        raise PermissionError(13, "Permission denied", "/var/lib/coinf/x.json")

    monkeypatch.setattr(status, "run", denied)
    rc = main(["status"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    assert err.strip() == "coinf status: error: /var/lib/coinf/x.json: Permission denied"

    def broken(args: object) -> int:
        raise OSError("no path in this one")

    monkeypatch.setattr(status, "run", broken)
    with pytest.raises(OSError, match="no path in this one"):
        main(["status"])


def test_bench_prune_checks_its_settings_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    # one line, the error: no "splitting" or "[1/3] strength" progress before it
    one_line_error(capsys, ["bench", "prune", "--epochs", "-1", "--json"], "epochs must be >= 0")
    one_line_error(capsys, ["bench", "prune", "--repeats", "0", "--json"], "--repeats")
    (tmp_path / "f").write_text("x")
    one_line_error(capsys, ["bench", "prune", "--out", str(tmp_path / "f"), "--json"], "--out")


def test_bench_stream_refuses_a_negative_rate_and_an_accuracy_in_per_cent(
        lenet: Bundle, capsys: pytest.CaptureFixture[str]) -> None:
    # a negative rate used to mean "no real-time source", silently; 98 is per cent, not a fraction
    one_line_error(capsys, ["bench", "stream", "--bundle", str(lenet.root), "--rate", "-1",
                            "--json"], "--rate", "-1.0")
    one_line_error(capsys, ["bench", "stream", "--bundle", str(lenet.root), "--rate", "5",
                            "--accuracy", "98", "--json"], "--accuracy", "[0, 1]")


def test_a_reader_that_leaves_early_is_no_traceback(lenet: Bundle) -> None:
    """``coinf plan B | head -1``: the pipe closes before coinf has written its report; coinf
    exits 141 (as a shell reports SIGPIPE) and prints nothing on stderr."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "coinf", "plan", str(lenet.root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
