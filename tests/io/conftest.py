"""Make ``gpuplace.io`` of *this* tree importable without the compiled extension.

On this branch ``python/gpuplace`` has no ``__init__.py``, and another checkout of gpuplace
may be installed (an editable install shadows a namespace package); once the real package
exists its ``__init__`` may load the Rust extension. The io tests need only the pure-Python
modules of this tree, so unless ``gpuplace`` already imports from this tree we register a bare
package over ``python/gpuplace``. When it does, this file does nothing.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "topologies"
OURS = (ROOT / "python" / "gpuplace").resolve()


def _uses_this_tree() -> bool:
    try:
        import gpuplace
        import gpuplace.errors
    except ImportError:
        return False
    return any(Path(p).resolve() == OURS for p in getattr(gpuplace, "__path__", []))


if not _uses_this_tree():
    for name in [
        m for m in sys.modules if m == "gpuplace" or m.startswith("gpuplace.")
    ]:
        # Keep in-memory stand-ins (no __file__); drop modules loaded from another tree.
        if name == "gpuplace" or getattr(sys.modules[name], "__file__", None):
            del sys.modules[name]
    package = types.ModuleType("gpuplace")
    package.__path__ = [str(OURS)]
    sys.modules["gpuplace"] = package
