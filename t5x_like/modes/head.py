"""The fine-tuning head's record: a head is its structural half only (``structures/head.py``:
the head it puts on the family's model, its checks, its labels read from the task), with
no frozen model, start or batch source of its own."""

from t5x_like.modes.registry import Mode, register
from t5x_like.structures import head

MODE = register(Mode("head", head.MODE.active, structure=head.MODE))
