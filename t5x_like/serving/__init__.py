"""Services: a checkpoint served over the OpenAI API. ``protocol`` reads and checks the
request bodies, ``completions`` answers one prompt with the loaded decoder (tokens,
stop sequences, log-probabilities), ``app`` is the HTTP API (FastAPI) over them.
``python -m t5x_like.serve`` (``t5xl serve``) is the command.
"""
