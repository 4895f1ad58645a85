"""Serve a decoder checkpoint over the OpenAI API.

    python -m t5x_like.serve --checkpoint=runs/gpt --port=8000
    curl localhost:8000/v1/completions -d '{"model": "gpt", "prompt": "It is", "max_tokens": 8}'

``--checkpoint`` is a run's workdir (its newest step), a step folder, or a
``convert import`` folder; the model answers ``/v1/completions``,
``/v1/chat/completions`` (with its tokenizer's chat template) and ``/v1/models`` under
``--model_name`` (default: the checkpoint folder's name), streaming included, with
``logprobs`` and ``echo``. Any OpenAI client, or lm-evaluation-harness's
``local-completions`` model, talks to it. Requests are decoded together, continuously
batched over a paged cache (``--slots`` at a time, pages of ``--page_size`` positions;
``docs/serving.md``). Ctrl-C or SIGTERM stops it after the requests in flight.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

from t5x_like import cli_flags, errors
from t5x_like.errors import UserError

# Imports inside functions: keep JAX and the web server out of the command's start-up: a
# mistake in the flags is reported before either loads.


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m t5x_like.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_flags.add_module_flag(parser)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--host", default="127.0.0.1",
                        help="The address to listen on (0.0.0.0: every interface).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model_name", default="",
                        help="The model's name in requests (default: the checkpoint folder's).")
    parser.add_argument("--step", type=int, default=None,
                        help="The step of a run's workdir to serve (default: the newest).")
    parser.add_argument("--vocabulary", default="checkpoint",
                        help="The tokenizer: the checkpoint's own, or a path to one.")
    parser.add_argument("--max_length", type=int, default=0,
                        help="The context: prompt plus new tokens (default: model.max_length).")
    parser.add_argument("--weights", default="", choices=("", "int8"),
                        help="int8: attention and MLP kernels read in int8.")
    parser.add_argument("--slots", type=int, default=8,
                        help="Requests decoded together (one decoding step serves them all).")
    parser.add_argument("--page_size", type=int, default=16,
                        help="Positions per page of the key/value cache.")
    args = parser.parse_args(argv)
    if not 0 <= args.port < 65536:
        raise UserError(f"--port={args.port}: give a port from 0 to 65535.")
    for flag in ("slots", "page_size"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag}={getattr(args, flag)}: give 1 or more.")
    return args


def model_name(checkpoint: str) -> str:
    """The checkpoint folder's name, a step folder's run's (``runs/gpt/checkpoints/500``
    serves as ``gpt``)."""
    path = pathlib.PurePosixPath(checkpoint.rstrip("/"))
    if path.name.isdigit() and path.parent.name == "checkpoints":
        path = path.parent.parent
    return path.name or "model"


def run(args) -> int:
    if not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn")):
        raise UserError(f"serve runs on FastAPI and uvicorn: {errors.install_hint('serve')}.")
    from t5x_like.serving import server
    app, name = server.app_for(args.checkpoint, step=args.step, vocabulary=args.vocabulary,
                               max_length=args.max_length, weights=args.weights,
                               slots=args.slots, page_size=args.page_size,
                               model_name=args.model_name or model_name(args.checkpoint))
    print(f"serving {name} ({args.checkpoint}) at http://{args.host}:{args.port}/v1",
          flush=True)
    server.serve(app, args.host, args.port)
    return 0


@errors.command_line("serve")
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cli_flags.import_modules(args.module)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
