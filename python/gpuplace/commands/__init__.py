"""The ``gpuplace`` CLI commands, one module each, registered in ``cli.py``; what they share
(the console, the cluster options, ``load_cluster``) is in ``commands.common``."""
