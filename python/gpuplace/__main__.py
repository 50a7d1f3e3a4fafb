"""``python -m gpuplace``: the ``gpuplace`` command."""

import sys

from gpuplace.cli import main

sys.exit(main())
