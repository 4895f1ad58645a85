"""The configs the package carries, by the name ``--config`` takes.

    t5xl configs                  # every packaged config, with its first docstring line
    t5xl configs show quickstart  # where the file is, and its text

A packaged config runs by name from any directory (``t5xl train --config=quickstart``);
a config of one's own starts from one with ``config_lib.packaged_config("quickstart")``.
"""

from __future__ import annotations

import argparse
import ast
import sys

from t5x_like import errors, resources


def first_docstring_line(text: str) -> str:
    try:
        docstring = ast.get_docstring(ast.parse(text)) or ""
    except SyntaxError:
        return ""
    return docstring.strip().splitlines()[0] if docstring.strip() else ""


def cmd_list() -> None:
    folder = resources.configs_dir()
    for name in resources.config_names():
        print(f"{name:36s} {first_docstring_line((folder / f'{name}.py').read_text())[:80]}")


def cmd_show(name: str) -> None:
    file = resources.config_file(name)
    if file is None:
        raise errors.UserError(f"No packaged config is named {name!r}; `t5xl configs` lists them.")
    print(f"# {file}")
    print(file.read_text(), end="")


@errors.command_line("configs")
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="t5xl configs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("list", "show"), default="list")
    parser.add_argument("name", nargs="?")
    args = parser.parse_args(argv)
    if resources.configs_dir() is None:
        raise errors.UserError("This installation carries no configs (neither a clone's "
                               "configs/ nor the wheel's); reinstall the package.")
    if args.command == "show" and not args.name:
        parser.error("show needs a config NAME (see `t5xl configs`).")
    if args.command == "list":
        cmd_list()
    else:
        cmd_show(args.name)


if __name__ == "__main__":
    sys.exit(main())
