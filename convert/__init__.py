"""Offline side: load an ONNX model, find where it can be cut, slice head/tail, write bundles."""
