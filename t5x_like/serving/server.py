"""A checkpoint made ready to serve: loaded (and refused in one line if it is not a
decoder) before anything listens, its tokenizer's chat template found, the HTTP app built;
and the app run on uvicorn until Ctrl-C or SIGTERM, which stop it after the requests in
flight."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from t5x_like.data import chat
from t5x_like.errors import UserError
from t5x_like.evaluation import loaded_lm
from t5x_like.generation.engine import UnpagedModel
from t5x_like.serving.app import make_app
from t5x_like.serving.completions import Completer


def app_for(checkpoint: str, *, model_name: str, step: int | None = None,
            vocabulary: str = "checkpoint", max_length: int = 0,
            weights: str = "", slots: int = 8, page_size: int = 16) -> tuple[FastAPI, str]:
    """The app serving ``checkpoint`` as ``model_name``, and that name: ``slots`` requests
    decoded together over pages of ``page_size`` positions (``completions``)."""
    loaded = loaded_lm.load(checkpoint, step=step, vocabulary=vocabulary, batch_size=-1,
                            max_length=max_length, weights=weights,
                            check_family=loaded_lm.refuse_unless_language_model("serve"))
    template = None
    folder = getattr(loaded.vocabulary, "folder", None)
    if folder is not None:
        try:
            template = chat.template_of(folder)
        except UserError:
            template = None  # no chat template: /v1/chat/completions says so per request
    try:
        completer = Completer(loaded, slots=slots, page_size=page_size)
    except UnpagedModel as e:  # a plug-in family whose module reads no paged cache
        raise UserError(f"{checkpoint} cannot be served: {e}") from None
    return make_app(completer, model_name, template), model_name


def serve(app: FastAPI, host: str, port: int) -> None:
    uvicorn.run(app, host=host, port=port, log_level="warning")
