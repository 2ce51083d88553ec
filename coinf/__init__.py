"""coinf: cooperative DL inference between a wearable and its handheld over Bluetooth LE.

The public surface is small on purpose:

* :class:`wearable.Session` -- run a model, split between wearable and handheld
  (mirrors ``onnxruntime.InferenceSession``).
* ``coinf`` -- the command line (``coinf --help``).
"""

__version__ = "0.1.0"
