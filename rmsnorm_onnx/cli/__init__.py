"""The ``rmsnorm-onnx`` command line: one module per subcommand, the frame in ``main``.

Each subcommand module provides ``add_parser(subparsers) -> argparse.ArgumentParser`` (which
registers the subcommand with ``console.add_command``: its help, description, an epilog of
examples and ``run``) and ``run(args) -> int``. Modules import only the standard library at the
top and load the heavy packages (onnxruntime, torch, matplotlib) inside ``run``, so that
``--help`` is instant and only the subcommands that need torch import it.
"""
