"""``python -m zfeed.recipes RECIPE [ARGS...]`` (what ``zfeed train`` runs): dispatch to a recipe's
``main(argv)``."""

from __future__ import annotations

import importlib
import sys

from . import RECIPES

USAGE = ("usage: zfeed train RECIPE [--help] [ARGS...]\n\nrecipes:\n"
         "  forecast   U-Net next-step forecast (the GPU-native Zarr hackathon's benchmark)\n"
         "  segment    extreme-weather segmentation (SC18 / MLPerf HPC DeepCAM)\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module_name = RECIPES.get(name)
    if module_name is None:
        print(f"zfeed train: unknown recipe {name!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            print(f"zfeed train: the {name} recipe is not available in this installation ({module_name})",
                  file=sys.stderr)
            return 2
        raise
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
