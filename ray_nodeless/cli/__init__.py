from ray_nodeless.cli.main import main

__all__ = ["main"]
