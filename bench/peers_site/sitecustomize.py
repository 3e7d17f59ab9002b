"""Run at the start of each Python process of ``cluster_peers.py mosaic``'s Spark (its
folder is put on their ``PYTHONPATH``): Mosaic Streaming without its dataset-specific
subpackages, as ``remote_peers.import_streaming`` does in the driver. A Spark task
unpickles Mosaic's ``MDSWriter``, which imports the ``streaming`` package, which imports
them, and they need torchvision (no build of it loads against a CPU torch here)."""

import sys
import types

for _name in ("vision", "text", "multimodal"):
    sys.modules.setdefault(f"streaming.{_name}", types.ModuleType(f"streaming.{_name}"))
