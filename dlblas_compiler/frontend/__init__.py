"""FX graph capture and import into the `dl` dialect."""

from .capture import Captured, capture, source_line
from .converters import CONVERTERS, Unsupported, converts
from .importer import Imported, import_graph

__all__ = ["Captured", "capture", "source_line", "CONVERTERS", "Unsupported", "converts", "Imported", "import_graph"]
