"""Errors a user can cause and fix. The CLI prints them as one line and exits with code 2."""


class CoinfError(Exception):
    """Base class of every error caused by input (files, flags, peers), not by a bug."""

    exit_code = 2


class ModelError(CoinfError):
    """The ONNX model cannot be loaded, checked or shaped."""


class BundleError(CoinfError):
    """A split bundle is missing, malformed, or does not have what was asked for."""


class InputError(CoinfError, ValueError):
    """A feed does not match the model's inputs (name, shape or dtype)."""
