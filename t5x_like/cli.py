"""``t5xl``: one command with subcommands, each the same as its ``python -m`` module.

    t5xl train --config=configs/quickstart.py --workdir=/tmp/run
    t5xl vocab --output=data/vocab/embedded_en_8k.model
"""

from __future__ import annotations

import sys

COMMANDS = {
    "train": ("t5x_like.train", "pretrain or continue a run"),
    "vocab": ("t5x_like.data.train_vocab", "train the embedded SentencePiece vocabulary"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = ["usage: t5xl COMMAND [ARGS...]", "", "commands:"]
        lines += [f"  {name:<8} {help_text}  (python -m {module})"
                  for name, (module, help_text) in COMMANDS.items()]
        if argv and argv[0] not in ("-h", "--help"):
            lines.insert(0, f"t5xl: unknown command {argv[0]!r}")
        print("\n".join(lines), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module_name, _ = COMMANDS[argv[0]]
    module = __import__(module_name, fromlist=["main"])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
