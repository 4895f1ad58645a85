"""``python -m t5x_like.retrieval``: see ``cli``."""

import sys

from t5x_like.retrieval.cli import main

sys.exit(main())
