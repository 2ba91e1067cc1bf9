"""``python -m te_cpp_headers --cmakedir | --includedir``: paths for build systems."""

from __future__ import annotations

import argparse
import os

from te_cpp_headers import get_cmake_dir, get_include


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m te_cpp_headers", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmakedir", action="store_true", help="print the TECoreConfig.cmake directory")
    group.add_argument("--includedir", action="store_true", help="print the directory holding te/te.h")
    args = parser.parse_args()
    print(os.path.normpath(get_cmake_dir() if args.cmakedir else get_include()))


if __name__ == "__main__":
    main()
