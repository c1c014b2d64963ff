"""FX graph capture and import into the `dl` dialect."""

from .capture import Captured, capture, dynamo_call, sizes_unseen, source_line
from .converters import CONVERTERS, Unsupported, converts
from .importer import Imported, TorchCall, import_graph, unread_ints

__all__ = ["Captured", "capture", "dynamo_call", "sizes_unseen", "source_line", "CONVERTERS", "Unsupported", "converts", "Imported", "TorchCall", "import_graph", "unread_ints"]
