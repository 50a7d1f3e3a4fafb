"""Make ``gpuplace.io`` importable without the compiled extension.

On this branch ``python/gpuplace`` has no ``__init__.py``; once the real package exists its
``__init__`` may load the Rust extension. Either way the io tests only need the pure-Python
modules, so if ``gpuplace`` cannot be imported as is we register it as a namespace-style
package over ``python/gpuplace``. When the package imports fine this file does nothing.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "topologies"

try:
    import gpuplace.errors  # noqa: F401
except ImportError:
    for name in [
        m for m in sys.modules if m == "gpuplace" or m.startswith("gpuplace.")
    ]:
        del sys.modules[name]
    package = types.ModuleType("gpuplace")
    package.__path__ = [str(ROOT / "python" / "gpuplace")]
    sys.modules["gpuplace"] = package
