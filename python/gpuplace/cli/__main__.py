"""``python -m gpuplace.cli``: the ``gpuplace`` command."""

import sys

from gpuplace.cli import main

sys.exit(main())
