"""Wire protocol between wearable and handheld: messages, tensor encoding, links.

Layers, bottom up (see docs/PROTOCOL.md):

* ``link``      -- the :class:`Link` interface: an ordered, reliable pipe of :class:`Message`.
* ``loopback``  -- in-process and local-socket links (tests, demo, development).
* ``messages``  -- message types, payload layouts, protocol error codes.
* ``tensors``   -- tensors as dtype + shape + raw bytes (never pickle).
* ``rpc``       -- request/response over a link: request ids, timeouts, cancellation.
"""

from coinf.ble_protocol.link import Link, LinkClosed
from coinf.ble_protocol.messages import Message, MsgType, ProtocolError

__all__ = ["Link", "LinkClosed", "Message", "MsgType", "ProtocolError"]
